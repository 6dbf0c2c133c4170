package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// Partitioned delivery's owner fail-over: a partition's new owner must not
// start a key's next message while its predecessor may still be in the
// previous owner's handler. The shared suite (JETORDER_TEST_DELIVERY)
// covers the rest of the guarantees.

// partEvent is one handler call of a fail-over test.
type partEvent struct {
	who     string // "A" or "B"
	key     string
	index   int
	attempt int
	at      time.Time
}

// partLog records handler calls in the order they happen.
type partLog struct {
	mu     sync.Mutex
	events []partEvent
	acked  map[string]time.Time // "key|index" -> when its ack was sent
}

func (l *partLog) add(who string, m *adapter.Message) partEvent {
	key, idx, _ := ordercheck.Decode(m.Data)
	ev := partEvent{who: who, key: key, index: idx, attempt: m.DeliveryAttempt, at: time.Now()}
	l.mu.Lock()
	l.events = append(l.events, ev)
	l.mu.Unlock()
	return ev
}

func (l *partLog) ack(m *adapter.Message) {
	key, idx, _ := ordercheck.Decode(m.Data)
	l.mu.Lock()
	if l.acked == nil {
		l.acked = map[string]time.Time{}
	}
	l.acked[fmt.Sprintf("%s|%d", key, idx)] = time.Now()
	l.mu.Unlock()
	m.Ack()
}

// first returns the first call for key's message index by who ("" for
// anyone).
func (l *partLog) first(who, key string, index int) (partEvent, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ev := range l.events {
		if ev.key == key && ev.index == index && (who == "" || ev.who == who) {
			return ev, true
		}
	}
	return partEvent{}, false
}

func (l *partLog) ackedAt(key string, index int) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	at, ok := l.acked[fmt.Sprintf("%s|%d", key, index)]
	return at, ok
}

func (l *partLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, ev := range l.events {
		fmt.Fprintf(&b, "%s %s|%d attempt %d\n", ev.who, ev.key, ev.index, ev.attempt)
	}
	return b.String()
}

// failover is one partition owned by receiver A, whose handler holds
// "held|0" until release is signalled, while "held|1" waits behind it and
// key "other" flows; B receives too.
type failover struct {
	e       *env
	topic   *adapter.Topic
	log     *partLog
	ncA     *nats.Conn
	release chan struct{}
	others  int // "other" messages published so far
}

// newFailover returns once A holds held|0 and has acked every "other"
// message, with B receiving.
func newFailover(t *testing.T) *failover {
	opts := []adapter.Option{adapter.WithOwnerLease(3 * time.Second)}
	f := &failover{e: newEnv(t, opts...), log: &partLog{}, release: make(chan struct{}, 1)}
	f.topic = f.e.createTopic("failover")
	f.e.createSub("failover-sub", adapter.SubscriptionConfig{Topic: f.topic, EnableMessageOrdering: true, AckDeadline: 2 * time.Second,
		Delivery: adapter.DeliveryPartitioned, Partitions: 1})
	var cA, cB *adapter.Client
	f.ncA, cA = f.e.connect(opts...)
	_, cB = f.e.connect(opts...)
	startReceive(t, cA.Subscription("failover-sub"), func(ctx context.Context, m *adapter.Message) {
		ev := f.log.add("A", m)
		if ev.key == "held" && ev.index == 0 {
			<-f.release // a handler still running, whatever happens to its process
		}
		f.log.ack(m)
	})
	publish(t, f.topic, string(ordercheck.Encode("held", 0)), "held")
	testutil.Eventually(t, 10*time.Second, func() bool { _, ok := f.log.first("A", "held", 0); return ok }, "A never got held|0")
	publish(t, f.topic, string(ordercheck.Encode("held", 1)), "held")
	f.publishOthers(t, 3)
	testutil.Eventually(t, 10*time.Second, func() bool { _, ok := f.log.ackedAt("other", f.others-1); return ok }, "A never acked the others: %s", f.log.String)
	startReceive(t, cB.Subscription("failover-sub"), func(ctx context.Context, m *adapter.Message) {
		f.log.add("B", m)
		f.log.ack(m)
	})
	// Registered last, so it runs first: Receive's stop waits for handlers.
	t.Cleanup(func() { close(f.release) })
	return f
}

func (f *failover) publishOthers(t *testing.T, n int) {
	t.Helper()
	for range n {
		publish(t, f.topic, string(ordercheck.Encode("other", f.others)), "other")
		f.others++
	}
}

// checkHeldOrder fails unless B started held|1 only after held|0 came back
// to it and was acked.
func (f *failover) checkHeldOrder(t *testing.T, since time.Time) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, func() bool { _, ok := f.log.ackedAt("held", 1); return ok }, "held|1 never acked: %s", f.log.String)
	testutil.Eventually(t, 10*time.Second, func() bool { _, ok := f.log.ackedAt("other", f.others-1); return ok }, "the others were not all acked: %s", f.log.String)
	zero, ok := f.log.first("B", "held", 0)
	one, _ := f.log.first("B", "held", 1)
	ackedZero, _ := f.log.ackedAt("held", 0)
	if ok && !one.at.After(ackedZero) {
		t.Fatalf("held|1 started at B at %v, before held|0 was acked at %v:\n%s", one.at, ackedZero, f.log)
	}
	if !one.at.After(ackedZero) {
		t.Fatalf("held|1 started at B before held|0 was acked anywhere:\n%s", f.log)
	}
	if ok {
		t.Logf("held|0 back at B after %v (attempt %d)", zero.at.Sub(since).Round(time.Millisecond), zero.attempt)
	}
	t.Logf("held|1 at B after %v", one.at.Sub(since).Round(time.Millisecond))
}

// TestPartitionOwnerDiesWithMessageInHandler: A's connection closes (the
// process is gone, as far as NATS can tell) while its handler still holds
// held|0. B takes the partition over once A's pin times out; held|1 must
// not start before held|0 has come back to B (after its ack deadline) and
// been acked.
func TestPartitionOwnerDiesWithMessageInHandler(t *testing.T) {
	f := newFailover(t)
	killed := time.Now()
	f.ncA.Close()
	f.publishOthers(t, 3)
	f.checkHeldOrder(t, killed)
	if zero, ok := f.log.first("B", "held", 0); !ok || zero.attempt < 2 {
		t.Fatalf("B did not get held|0 back (got it: %v, attempt %d):\n%s", ok, zero.attempt, f.log)
	}
}

// TestPartitionOwnerLosesPinWhileHandlerRuns: A is alive and connected but
// loses the partition (an operator unpins it); A hands held|1 back at once
// and keeps extending held|0, whose handler runs on. B, the new owner,
// must start nothing of the partition until A acks held|0: without the
// take-over fence it would start held|1 at once, beside held|0.
func TestPartitionOwnerLosesPinWhileHandlerRuns(t *testing.T) {
	f := newFailover(t)
	ctx := context.Background()
	js := jetstreamOf(t, f.e)
	stream := keyrouter.StreamName(project, "failover")
	cons := keyrouter.PartitionConsumer(project, "failover-sub", 0)
	// Unpin until B wins the partition: the next message pins whoever pulls
	// first. While B is fenced it delivers nothing; A, pinned again,
	// delivers the new message at once.
	var unpinned time.Time
	for try := 0; ; try++ {
		if try == 20 {
			t.Fatalf("B never won the partition in 20 unpins:\n%s", f.log)
		}
		st, err := js.Stream(ctx, stream)
		if err == nil {
			err = st.UnpinConsumer(ctx, cons, "jetorder")
		}
		if err != nil {
			t.Fatalf("unpin: %v", err)
		}
		unpinned = time.Now()
		f.publishOthers(t, 1)
		last := f.others - 1
		testutil.Eventually(t, 10*time.Second, func() bool { return pinnedClient(t, js, stream, cons) != "" }, "nobody pinned after the unpin")
		if !deliveredWithin(f.log, "A", "other", last, time.Second) {
			break
		}
	}
	// Absence window: three ack deadlines with held|0 in A's handler,
	// extended by A. Nothing of the partition may start at B meanwhile.
	window := 3 * 2 * time.Second
	for time.Since(unpinned) < window {
		if ev, ok := f.log.first("B", "held", 1); ok {
			t.Fatalf("B started held|1 %v after the unpin, while held|0 was in A's handler:\n%s", ev.at.Sub(unpinned), f.log)
		}
		if ev, ok := f.log.first("B", "held", 0); ok {
			t.Fatalf("B got held|0 %v after the unpin, while A's handler held it and extended its deadline:\n%s", ev.at.Sub(unpinned), f.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
	released := time.Now()
	f.release <- struct{}{}
	f.checkHeldOrder(t, released)
	if _, ok := f.log.first("B", "held", 0); ok {
		t.Fatalf("held|0 was delivered again although A acked it:\n%s", f.log)
	}
}

// deliveredWithin reports whether who gets key's message index within d.
func deliveredWithin(l *partLog, who, key string, index int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if _, ok := l.first(who, key, index); ok {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

func pinnedClient(t *testing.T, js jetstream.JetStream, stream, consumer string) string {
	t.Helper()
	c, err := js.Consumer(context.Background(), stream, consumer)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range c.CachedInfo().PriorityGroups {
		return g.PinnedClientID
	}
	return ""
}
