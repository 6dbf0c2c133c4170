package integration

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// Two clients receive one subscription; the one that owns key discovery
// stops half-way and the other takes over. The checker sees every delivery.
func TestTwoReceiversOwnerHandOver(t *testing.T) {
	opts := []adapter.Option{adapter.WithKeyConsumerIdleTimeout(300 * time.Millisecond), adapter.WithFailoverTimeout(2 * time.Second)}
	e := newEnv(t, opts...)
	topic := e.createTopic("handover")
	e.createSub("shared", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, AckDeadline: time.Second})
	c := ordercheck.New()
	ch := chaos{nackPct: 5}
	_, c1 := e.connect(opts...)
	_, c2 := e.connect(opts...)
	first := startReceive(t, c1.Subscription("shared"), checkedHandler(c, "shared", ch))
	// The first client takes ownership before the second starts, so
	// stopping it really hands ownership over. (A partition gets its owner
	// with its first message.)
	for k := range 64 {
		key := fmt.Sprintf("prime-%d", k)
		publish(t, topic, string(ordercheck.Encode(key, 0)), key)
		c.Published(key, 0)
	}
	testutil.Eventually(t, 30*time.Second, func() bool { return c.Complete("shared") }, "first messages: %s", func() string { return c.Missing("shared") })
	var firstOwner string
	testutil.Eventually(t, 10*time.Second, func() bool {
		firstOwner = ownerOf(t, e, "shared")
		return firstOwner != ""
	}, "first client never took ownership")
	startReceive(t, c2.Subscription("shared"), checkedHandler(c, "shared", ch))

	publishChecked(t, topic, c, 20, 20, 1, 0)
	testutil.Eventually(t, 30*time.Second, func() bool { return c.Complete("shared") }, "first half: %s", func() string { return c.Missing("shared") })
	if err := first.stop(); err != nil {
		t.Fatalf("Receive returned %v on cancel, want nil", err)
	}
	// New keys after the hand-over need the remaining client (and, for
	// partitions, give it their pins).
	for k := range 20 {
		key := fmt.Sprintf("later-%d", k)
		for i := range 5 {
			publish(t, topic, string(ordercheck.Encode(key, i)), key)
			c.Published(key, i)
		}
	}
	testutil.Eventually(t, 30*time.Second, func() bool { return c.Complete("shared") }, "after hand-over: %s", func() string { return c.Missing("shared") })
	testutil.Eventually(t, 10*time.Second, func() bool {
		o := ownerOf(t, e, "shared")
		return o != "" && !sharesOwner(o, firstOwner)
	}, "the second client never took ownership over")
	if v := c.Violations(); len(v) > 0 {
		t.Fatalf("ordering violations: %s", strings.Join(v, "\n"))
	}
}

func TestNackRedeliversBeforeNewer(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("nacks")
	sub := e.createSub("sub-1", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	var got recorder
	var mu sync.Mutex
	seen := map[string]bool{}
	startReceive(t, sub, func(_ context.Context, m *adapter.Message) {
		s := string(m.Data)
		got.add(fmt.Sprintf("%s#%d", s, m.DeliveryAttempt))
		mu.Lock()
		first := !seen[s]
		seen[s] = true
		mu.Unlock()
		if first {
			m.Nack()
			return
		}
		m.Ack()
	})
	for i := range 4 {
		publish(t, topic, fmt.Sprint(i), "k")
	}
	want := []string{"0#1", "0#2", "1#1", "1#2", "2#1", "2#2", "3#1", "3#2"}
	testutil.Eventually(t, 10*time.Second, func() bool { return got.count() >= len(want) }, "got %v", got.snapshot)
	if !slices.Equal(got.snapshot(), want) {
		t.Fatalf("deliveries %v, want %v", got.snapshot(), want)
	}
}

func TestFlowControlBoundsOutstandingMessages(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("flow")
	sub := e.createSub("sub-1", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	sub.ReceiveSettings.MaxOutstandingMessages = 3
	var conc concurrency
	var done atomic.Int32
	startReceive(t, sub, func(_ context.Context, m *adapter.Message) {
		conc.enter()
		time.Sleep(20 * time.Millisecond) // the handler's own work
		conc.leave()
		done.Add(1)
		m.Ack()
	})
	for k := range 10 {
		for i := range 3 {
			publish(t, topic, fmt.Sprint(i), fmt.Sprint("key-", k))
		}
	}
	testutil.Eventually(t, 20*time.Second, func() bool { return done.Load() == 30 }, "%d of 30 handled", done.Load)
	if m := conc.max.Load(); m > 3 || m < 2 {
		t.Fatalf("max handlers at once = %d, want 2..3 (MaxOutstandingMessages 3)", m)
	}
}

func TestHandlerPanicNacksAndEndsReceive(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("panics")
	sub := e.createSub("sub-1", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	publish(t, topic, "boom", "k")
	publish(t, topic, "after", "k")
	r := startReceive(t, sub, func(_ context.Context, m *adapter.Message) {
		if string(m.Data) == "boom" {
			panic("handler failure")
		}
		m.Ack()
	})
	err, ended := r.wait(10 * time.Second)
	if !ended || !errors.Is(err, adapter.ErrHandlerPanic) || !strings.Contains(err.Error(), "handler failure") {
		t.Fatalf("Receive ended=%v with %v, want ErrHandlerPanic", ended, err)
	}
	var got recorder
	startReceive(t, sub, func(_ context.Context, m *adapter.Message) { got.add(string(m.Data)); m.Ack() })
	testutil.Eventually(t, 10*time.Second, func() bool { return got.count() >= 2 }, "got %v", got.snapshot)
	if want := []string{"boom", "after"}; !slices.Equal(got.snapshot(), want) {
		t.Fatalf("after the panic got %v, want %v", got.snapshot(), want)
	}
}

func TestDeleteTopicWhileReceiving(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("doomed")
	sub := e.createSub("sub-1", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	var got recorder
	r := startReceive(t, sub, func(_ context.Context, m *adapter.Message) { got.add(string(m.Data)); m.Ack() })
	publish(t, topic, "one", "k")
	testutil.Eventually(t, 10*time.Second, func() bool { return got.count() == 1 }, "got %v", got.snapshot)
	if err := topic.Delete(context.Background()); err != nil {
		t.Fatal(err)
	}
	err, ended := r.wait(10 * time.Second)
	if !ended || !errors.Is(err, adapter.ErrTopicDeleted) {
		t.Fatalf("Receive ended=%v with %v, want ErrTopicDeleted", ended, err)
	}
	// A new topic of the same name does not revive the old subscription.
	e.createTopic("doomed")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sub.Receive(ctx, func(context.Context, *adapter.Message) {}); !errors.Is(err, adapter.ErrTopicDeleted) {
		t.Fatalf("Receive on a detached subscription = %v, want ErrTopicDeleted", err)
	}
}

// Deleting a subscription ends its Receive calls, delivers nothing of it
// again (its key consumers, gone with it, are not taken for vanished ones
// and created anew) and leaves no consumer behind.
func TestDeleteSubscriptionWhileReceiving(t *testing.T) {
	// Idle key consumers are retired quickly: the clean-up that would
	// find them gone runs while Receive is still ending.
	e := newEnv(t, adapter.WithKeyConsumerIdleTimeout(100*time.Millisecond))
	topic := e.createTopic("topic-1")
	sub := e.createSub("sub-1", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	var mu sync.Mutex
	deliveries := map[string]int{}
	count := func() (n, most int) {
		mu.Lock()
		defer mu.Unlock()
		for _, d := range deliveries {
			n, most = n+1, max(most, d)
		}
		return n, most
	}
	r := startReceive(t, sub, func(_ context.Context, m *adapter.Message) {
		mu.Lock()
		deliveries[string(m.Data)]++
		mu.Unlock()
		m.Ack()
	})
	for k := range 5 {
		for i := range 4 {
			publish(t, topic, fmt.Sprintf("k%d-%d", k, i), fmt.Sprintf("k%d", k))
		}
	}
	testutil.Eventually(t, 10*time.Second, func() bool { n, _ := count(); return n == 20 }, "not every message delivered")
	if err := sub.Delete(context.Background()); err != nil {
		t.Fatal(err)
	}
	err, ended := r.wait(10 * time.Second)
	if !ended || !errors.Is(err, adapter.ErrSubscriptionNotFound) {
		t.Fatalf("Receive ended=%v with %v, want ErrSubscriptionNotFound", ended, err)
	}
	if _, most := count(); most > 1 {
		t.Errorf("a message of the deleted subscription was delivered %d times", most)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return keyConsumers(t, e, "topic-1", "sub-1") == 0 }, "consumers left behind")
}

func TestUnorderedSubscriptionDeliversEverything(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("plain")
	sub := e.createSub("sub-1", adapter.SubscriptionConfig{Topic: topic})
	c := ordercheck.New()
	var mu sync.Mutex
	acked := map[string]bool{} // distinct messages: a duplicate cannot hide a loss
	startReceive(t, sub, func(_ context.Context, m *adapter.Message) {
		mu.Lock()
		acked[string(m.Data)] = true
		mu.Unlock()
		m.Ack()
	})
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }
	publishChecked(t, topic, c, 5, 20, 1, 0)
	testutil.Eventually(t, 10*time.Second, func() bool { return count() == 6*20 }, "%d of 120 distinct messages delivered", count)
}

func TestMessageFieldsRoundTrip(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("fields")
	sub := e.createSub("sub-1", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	attrs := map[string]string{"plain": "v", "with space": "ünïcode: value\r\nnext", "a.b*c>": "%41"}
	key := "tenant/42 é.*>"
	before := time.Now().Add(-time.Second)
	id, err := topic.Publish(context.Background(), &adapter.Message{Data: []byte{0, 1, 2}, Attributes: attrs, OrderingKey: key}).Get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *adapter.Message, 1)
	startReceive(t, sub, func(_ context.Context, m *adapter.Message) { m.Ack(); got <- m })
	var m *adapter.Message
	select {
	case m = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery")
	}
	if m.ID != id || m.OrderingKey != key || !slices.Equal(m.Data, []byte{0, 1, 2}) || m.DeliveryAttempt != 1 {
		t.Fatalf("delivered id %q key %q data %v attempt %d", m.ID, m.OrderingKey, m.Data, m.DeliveryAttempt)
	}
	if m.PublishTime.Before(before) || m.PublishTime.After(time.Now()) {
		t.Fatalf("publish time %v", m.PublishTime)
	}
	if len(m.Attributes) != len(attrs) {
		t.Fatalf("attributes %v, want %v", m.Attributes, attrs)
	}
	for k, v := range attrs {
		if m.Attributes[k] != v {
			t.Fatalf("attribute %q = %q, want %q", k, m.Attributes[k], v)
		}
	}
}

// Receive stops every goroutine it starts: start and stop it many times and
// the process's goroutine count comes back.
func TestReceiveStopsItsGoroutines(t *testing.T) {
	e := newEnv(t, adapter.WithKeyConsumerIdleTimeout(100*time.Millisecond))
	topic := e.createTopic("cycles")
	sub := e.createSub("sub-1", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	cycle := func(i int) {
		got := make(chan struct{}, 1)
		r := startReceive(t, sub, func(_ context.Context, m *adapter.Message) {
			m.Ack()
			select {
			case got <- struct{}{}:
			default:
			}
		})
		publish(t, topic, fmt.Sprint(i), fmt.Sprint("key-", i))
		select {
		case <-got:
		case <-time.After(10 * time.Second):
			t.Fatalf("cycle %d: no delivery", i)
		}
		if err := r.stop(); err != nil {
			t.Fatalf("cycle %d: Receive returned %v", i, err)
		}
	}
	cycle(0) // warm up: buckets and connections
	base := clientGoroutines()
	for i := 1; i <= 10; i++ {
		cycle(i)
	}
	testutil.Eventually(t, 20*time.Second, func() bool { return clientGoroutines() <= base },
		"client goroutines grew from %d to %d over 10 Receive cycles", base, clientGoroutines)
	// Each owner's discovery consumer goes with it; the key consumers wait
	// for the next owner to retire them.
	stream, err := jetstreamOf(t, e).Stream(context.Background(), keyrouter.StreamName(project, "cycles"))
	if err != nil {
		t.Fatal(err)
	}
	if n := stream.CachedInfo().State.Consumers; n > 11+1 {
		t.Fatalf("%d consumers left: more than the 11 key consumers and the unkeyed one", n)
	}
}

// clientGoroutines counts the goroutines running adapter or nats.go client
// code (the embedded server's own come and go with its consumers).
func clientGoroutines() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "jetorder/adapter.") || strings.Contains(g, "nats-io/nats.go") {
			n++
		}
	}
	return n
}

// ownerOf names who owns an ordered subscription's delivery: the holder of
// its key discovery lease (per-key delivery), or the pinned client of each
// partition (partitioned); "" while some part has no owner.
func ownerOf(t *testing.T, e *env, sub string) string {
	t.Helper()
	ctx := context.Background()
	js := jetstreamOf(t, e)
	cfg, err := e.client.Subscription(sub).Config(ctx)
	if err != nil {
		t.Fatalf("subscription %s: %v", sub, err)
	}
	if cfg.Delivery != adapter.DeliveryPartitioned {
		leases, err := js.KeyValue(ctx, "JO_LEASES")
		if err != nil {
			return ""
		}
		entry, err := leases.Get(ctx, keyrouter.KVKey(project, sub))
		if err != nil {
			return ""
		}
		return string(entry.Value())
	}
	var pins []string
	for i := range cfg.Partitions {
		pin := pinnedClient(t, js, keyrouter.StreamName(project, cfg.Topic.ID()), keyrouter.PartitionConsumer(project, sub, i))
		if pin == "" {
			return ""
		}
		pins = append(pins, pin)
	}
	return strings.Join(pins, ",")
}

// sharesOwner reports whether two ownerOf answers name a common owner.
func sharesOwner(a, b string) bool {
	for _, x := range strings.Split(a, ",") {
		if slices.Contains(strings.Split(b, ","), x) {
			return true
		}
	}
	return false
}
