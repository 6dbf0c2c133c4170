package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/faultproxy"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// Partitioned delivery's owner fail-over: a partition's new owner must not
// start a key's next message while its predecessor may still be in the
// previous owner's handler. The shared suite, which make test runs in both
// modes (JETORDER_TEST_DELIVERY), covers the rest of the guarantees.

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
func newFailover(t *testing.T) *failover { return newFailoverWith(t, 2*time.Second, 3*time.Second) }

// newFailoverWith is newFailover with the subscription's ack deadline and
// the clients' failover timeout.
func newFailoverWith(t *testing.T, ackDeadline, failoverTimeout time.Duration) *failover {
	return newFailoverIn(t, adapter.DeliveryPartitioned, ackDeadline, failoverTimeout)
}

// newFailoverIn is newFailoverWith in the given delivery mode.
func newFailoverIn(t *testing.T, delivery adapter.DeliveryMode, ackDeadline, failoverTimeout time.Duration) *failover {
	opts := []adapter.Option{adapter.WithFailoverTimeout(failoverTimeout)}
	f := &failover{e: newEnv(t, opts...), log: &partLog{}, release: make(chan struct{}, 1)}
	f.topic = f.e.createTopic("failover")
	f.e.createSub("failover-sub", adapter.SubscriptionConfig{Topic: f.topic, EnableMessageOrdering: true, AckDeadline: ackDeadline,
		Delivery: delivery, Partitions: partitionsOf(delivery)})
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

// partitionsOf is the partition count a test subscription in the given
// delivery mode is created with: one, or none outside partitioned delivery.
func partitionsOf(delivery adapter.DeliveryMode) int {
	if delivery == adapter.DeliveryPartitioned {
		return 1
	}
	return 0
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
	if !one.at.After(ackedZero) {
		t.Fatalf("held|1 started at B at %v, before held|0 was acked (at %v; zero if never):\n%s", one.at, ackedZero, f.log)
	}
	if ok {
		t.Logf("held|0 back at B after %v (attempt %d)", zero.at.Sub(since).Round(time.Millisecond), zero.attempt)
	}
	t.Logf("held|1 at B after %v", one.at.Sub(since).Round(time.Millisecond))
}

// TestPartitionOwnerDiesWithMessageInHandler: A's connection closes (the
// process is gone, as far as NATS can tell) while its handler still holds
// held|0. B takes the partition over; held|1 must not start before held|0
// has come back to B and been acked.
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

// TestTakeOverFromGone: as above, with a long ack deadline (60 s) and
// failover timeout (10 s), in both delivery modes. A receiver that is gone
// (no responder on its presence subject) is taken over at once: held|0
// comes back to B within a second or two, not after the pin's TTL or
// held|0's ack deadline, and held|1 still waits for it.
//   - partitioned: B sees that A, the partition's recorded owner, is gone,
//     unpins the partition and nacks A's unacked messages; the fence keeps
//     held|1 behind held|0.
//   - per-key: A holds the discovery lease; B takes the lease over and,
//     finding A's member record without a presence, hands back what no
//     live receiver holds; the key's consumer keeps held|1 behind held|0.
func TestTakeOverFromGone(t *testing.T) {
	for _, tc := range []struct {
		delivery adapter.DeliveryMode
		waits    string // what A's death would otherwise wait for
	}{
		{adapter.DeliveryPartitioned, "pin TTL 10 s, ack deadline 60 s"},
		{adapter.DeliveryPerKey, "lease TTL 6 s, ack deadline 60 s"},
	} {
		t.Run(string(tc.delivery), func(t *testing.T) {
			f := newFailoverIn(t, tc.delivery, time.Minute, 10*time.Second)
			killed := time.Now()
			f.ncA.Close()
			f.publishOthers(t, 3)
			testutil.Eventually(t, 5*time.Second, func() bool { _, ok := f.log.ackedAt("held", 1); return ok },
				"held|1 not acked within 5 s of A's death (%s): %s", tc.waits, f.log.String)
			f.checkHeldOrder(t, killed)
			if zero, ok := f.log.first("B", "held", 0); !ok || zero.attempt < 2 {
				t.Fatalf("B did not get held|0 back (got it: %v, attempt %d):\n%s", ok, zero.attempt, f.log)
			}
		})
	}
}

// TestTakeOverFromUnrecorded: a receiver pulls a partition's messages and
// dies before it records itself as the partition's owner (its fence had not
// lifted: no handler started), and no receiver ever recorded itself for the
// partition. Another receiver must take the partition over within seconds,
// not at the pin's TTL (10 s) or the messages' ack deadline (60 s): so a
// sidecar killed while its first fences were up, or a NATS server restart
// that cleared the pins right after, cost an ack deadline (the pipelined
// chaos test's 8-9 s outliers).
//   - pinned: the dead receiver still holds the pin, which is taken away
//     after unrecordedPinGrace;
//   - unpinned: the pin is gone already, as after a NATS server restart.
func TestTakeOverFromUnrecorded(t *testing.T) {
	for _, unpin := range []bool{false, true} {
		name := "pinned"
		if unpin {
			name = "unpinned"
		}
		t.Run(name, func(t *testing.T) {
			opts := []adapter.Option{adapter.WithFailoverTimeout(10 * time.Second)}
			e := newEnv(t, opts...)
			topic := e.createTopic("unrec")
			e.createSub("unrec-sub", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, AckDeadline: time.Minute,
				Delivery: adapter.DeliveryPartitioned, Partitions: 1})
			const n = 5
			for i := range n {
				publish(t, topic, string(ordercheck.Encode("k", i)), "k")
			}
			// The dead receiver: pinned by its pull, it takes every message
			// and goes away without a word.
			ctx := context.Background()
			ncX := testutil.Connect(t, e.srv.ClientURL())
			jsX, err := jetstream.New(ncX)
			if err != nil {
				t.Fatal(err)
			}
			stream, consName := keyrouter.StreamName(project, "unrec"), keyrouter.PartitionConsumer(project, "unrec-sub", 0)
			cons, err := jsX.Consumer(ctx, stream, consName)
			if err != nil {
				t.Fatal(err)
			}
			batch, err := cons.Fetch(n, jetstream.FetchPriorityGroup("jetorder"), jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			got := 0
			for range batch.Messages() {
				got++
			}
			if got != n {
				t.Fatalf("the dead receiver pulled %d messages, want %d (err %v)", got, n, batch.Error())
			}
			ncX.Close()
			js := jetstreamOf(t, e)
			if unpin {
				s, err := js.Stream(ctx, stream)
				if err != nil {
					t.Fatal(err)
				}
				if err := s.UnpinConsumer(ctx, consName, "jetorder"); err != nil {
					t.Fatal(err)
				}
			} else if pinnedClient(t, js, stream, consName) == "" {
				t.Fatal("the dead receiver's pull did not pin the partition")
			}
			died := time.Now()
			check, log := ordercheck.New(), &partLog{}
			for i := range n {
				check.Published("k", i)
			}
			_, cB := e.connect(opts...)
			startReceive(t, cB.Subscription("unrec-sub"), func(ctx context.Context, m *adapter.Message) {
				ev := log.add("B", m)
				check.Delivered("unrec-sub", ev.key, ev.index)
				check.Acked("unrec-sub", ev.key, ev.index)
				log.ack(m)
			})
			testutil.Eventually(t, 6*time.Second, func() bool { return check.Complete("unrec-sub") },
				"not every message acked within 6 s of the receiver's death (pin TTL 10 s, ack deadline 60 s): %s; deliveries:\n%s",
				func() string { return check.Missing("unrec-sub") }, log.String)
			if v := check.Violations(); len(v) > 0 {
				t.Fatalf("ordering violations:\n%s\ndeliveries:\n%s", strings.Join(v, "\n"), log)
			}
			first, _ := log.first("B", "k", 0)
			t.Logf("k|0 at B %v after the receiver died (attempt %d)", first.at.Sub(died).Round(time.Millisecond), first.attempt)
		})
	}
}

// TestPartitionOwnerLosesPinWhileHandlerRuns: A is alive and connected but
// loses a partition while a handler of it runs: B joins, and the partition
// moves to B (two partitions, one each). A hands back what no handler
// started and keeps extending h|0, whose handler runs on. B, the new
// owner, must start nothing of the partition until A acks h|0: without
// the take-over fence it would start h|1 at once, beside h|0.
func TestPartitionOwnerLosesPinWhileHandlerRuns(t *testing.T) {
	// Keys of partitions 1 and 0 of 2: A keeps the first partition it owns
	// (the assignment keeps owners in partition order) and yields the
	// second to B.
	const held, stays = "other", "k"
	if keyrouter.Slot(held)%2 != 1 || keyrouter.Slot(stays)%2 != 0 {
		t.Fatalf("keys %q and %q are not of partitions 1 and 0 of 2", held, stays)
	}
	e := newEnv(t)
	topic := e.createTopic("moves")
	e.createSub("moves-sub", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, AckDeadline: 2 * time.Second,
		Delivery: adapter.DeliveryPartitioned, Partitions: 2})
	log, release := &partLog{}, make(chan struct{})
	_, cA := e.connect()
	_, cB := e.connect()
	startReceive(t, cA.Subscription("moves-sub"), func(ctx context.Context, m *adapter.Message) {
		ev := log.add("A", m)
		if ev.key == held && ev.index == 0 {
			<-release // a handler still running, whatever happens to the partition
		}
		log.ack(m)
	})
	publish(t, topic, string(ordercheck.Encode(stays, 0)), stays)
	publish(t, topic, string(ordercheck.Encode(held, 0)), held)
	testutil.Eventually(t, 10*time.Second, func() bool {
		_, ok := log.first("A", held, 0)
		_, acked := log.ackedAt(stays, 0)
		return ok && acked
	}, "A never got both partitions' messages: %s", log.String)
	publish(t, topic, string(ordercheck.Encode(held, 1)), held)
	js := jetstreamOf(t, e)
	stream, cons := keyrouter.StreamName(project, "moves"), keyrouter.PartitionConsumer(project, "moves-sub", 1)
	pinA := pinnedClient(t, js, stream, cons)
	startReceive(t, cB.Subscription("moves-sub"), func(ctx context.Context, m *adapter.Message) {
		log.add("B", m)
		log.ack(m)
	})
	t.Cleanup(sync.OnceFunc(func() { close(release) })) // registered last, so it runs first: Receive's stop waits for handlers

	// B takes partition 1 over: the server pins it to B.
	testutil.Eventually(t, 10*time.Second, func() bool { p := pinnedClient(t, js, stream, cons); return p != "" && p != pinA }, "partition 1 never moved from A")
	moved := time.Now()
	// Three ack deadlines with h|0 in A's handler, extended by A: nothing
	// of the key may start meanwhile, at B or back at A.
	for time.Since(moved) < 3*2*time.Second {
		if ev, ok := log.first("", held, 1); ok {
			t.Fatalf("%s started %s|1 %v after the move, while %s|0 was in A's handler:\n%s", ev.who, held, ev.at.Sub(moved), held, log)
		}
		if ev, ok := log.first("B", held, 0); ok {
			t.Fatalf("B got %s|0 %v after the move, while A's handler held it and extended its deadline:\n%s", held, ev.at.Sub(moved), log)
		}
		time.Sleep(50 * time.Millisecond) // watching for a start that must not come
	}
	release <- struct{}{}
	testutil.Eventually(t, 30*time.Second, func() bool { _, ok := log.ackedAt(held, 1); return ok }, "%s|1 never acked: %s", held, log.String)
	one, _ := log.first("", held, 1)
	ackedZero, _ := log.ackedAt(held, 0)
	if one.who != "B" || !one.at.After(ackedZero) {
		t.Fatalf("%s|1 started at %s at %v, want at B after %s|0 was acked (at %v):\n%s", held, one.who, one.at, held, ackedZero, log)
	}
	if _, ok := log.first("B", held, 0); ok {
		t.Fatalf("%s|0 was delivered again although A acked it:\n%s", held, log)
	}
}

// TestPartitionDeliveryLostOnTheWay: the server delivers a key's message
// to the partition's owner and the network loses it (the connection is cut
// with the message on its way). The owner reconnects, keeps its pin, and
// is sent the key's next message: it must not start that one before the
// lost message comes back, at its ack deadline, and is acked.
func TestPartitionDeliveryLostOnTheWay(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("lossy")
	e.createSub("lossy-sub", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, AckDeadline: 2 * time.Second,
		Delivery: adapter.DeliveryPartitioned, Partitions: 1})
	proxy, err := faultproxy.Start(e.srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close) // after the receiver stops: cleanups run last first
	client, err := adapter.NewClient(testutil.Connect(t, proxy.URL()), project, testLogger()...)
	if err != nil {
		t.Fatal(err)
	}
	check, log := ordercheck.New(), &partLog{}
	startReceive(t, client.Subscription("lossy-sub"), func(ctx context.Context, m *adapter.Message) {
		ev := log.add("R", m)
		check.Delivered("lossy-sub", ev.key, ev.index)
		check.Acked("lossy-sub", ev.key, ev.index)
		log.ack(m)
	})
	js := jetstreamOf(t, e)
	stream, cons := keyrouter.StreamName(project, "lossy"), keyrouter.PartitionConsumer(project, "lossy-sub", 0)
	unacked := func() int {
		c, err := js.Consumer(context.Background(), stream, cons)
		if err != nil {
			t.Fatal(err)
		}
		return c.CachedInfo().NumAckPending
	}
	send := func(i int) {
		publish(t, topic, string(ordercheck.Encode("k", i)), "k")
		check.Published("k", i)
	}

	send(0)
	testutil.Eventually(t, 10*time.Second, func() bool { _, ok := log.ackedAt("k", 0); return ok && unacked() == 0 }, "k|0 never acked")
	pin := pinnedClient(t, js, stream, cons)
	proxy.HoldReplies()
	send(1)
	testutil.Eventually(t, 10*time.Second, func() bool { return unacked() == 1 }, "the server never delivered k|1")
	proxy.Cut() // k|1 is lost with the connection
	send(2)
	testutil.Eventually(t, 20*time.Second, func() bool { return check.Complete("lossy-sub") }, "not every message acked: %s; violations: %q; deliveries:\n%s",
		func() string { return check.Missing("lossy-sub") }, check.Violations, log.String)
	if v := check.Violations(); len(v) > 0 {
		t.Fatalf("ordering violations:\n%s\ndeliveries:\n%s", strings.Join(v, "\n"), log)
	}
	if after := pinnedClient(t, js, stream, cons); after != pin {
		// A new pin is a take-over, fenced anyway: this test is about the
		// same owner losing a delivery.
		t.Fatalf("the owner's pin changed across the reconnect (%q, then %q)", pin, after)
	}
	if one, _ := log.first("R", "k", 1); one.attempt < 2 {
		t.Fatalf("k|1 was handled at attempt %d, want its redelivery after the loss:\n%s", one.attempt, log)
	}
}

// A key whose nacked message the stream no longer has (removed by the
// topic's retention, or deleted) would wait for it for ever: the owner
// finds it gone, at the stream's leader, and lets the key move on.
func TestPartitionKeyMovesOnWhenItsMessageIsGone(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("gone")
	sub := e.createSub("gone-sub", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, AckDeadline: time.Second,
		Delivery: adapter.DeliveryPartitioned, Partitions: 1})
	stream, err := jetstreamOf(t, e).Stream(context.Background(), keyrouter.StreamName(project, "gone"))
	if err != nil {
		t.Fatal(err)
	}
	log := &partLog{}
	deleted := make(chan handedBack, 1)
	startReceive(t, sub, func(ctx context.Context, m *adapter.Message) {
		if ev := log.add("R", m); ev.index == 0 {
			// Gone from the stream while it is in the handler; then handed
			// back, so the key waits for it to come again.
			deleted <- handedBack{stream.DeleteMsg(ctx, m.StreamSequence), time.Now()}
			m.Nack()
			return
		}
		log.ack(m)
	})
	publish(t, topic, string(ordercheck.Encode("k", 0)), "k")
	publish(t, topic, string(ordercheck.Encode("k", 1)), "k")
	select {
	case d := <-deleted:
		if d.err != nil {
			t.Fatalf("delete k|0: %v", d.err)
		}
		keyMovesOnAfterWaiting(t, log, d.at, "gone from the stream")
	case <-time.After(10 * time.Second):
		t.Fatal("k|0 never delivered")
	}
}

// handedBack is what a handler reports before it nacks k|0: err from its
// work, and the time, taken before the nack (the test goroutine may wake
// after the nack, and would measure too short a wait).
type handedBack struct {
	err error
	at  time.Time
}

// keyMovesOnAfterWaiting checks, for a test whose handler nacked k|0 at
// nacked with ack deadlines of 1 s, that k|1 is acked, started no sooner
// than the owner checks keys that waited over two ack deadlines, and
// that k|0 was delivered once (why: it will not come back).
func keyMovesOnAfterWaiting(t *testing.T, log *partLog, nacked time.Time, why string) {
	t.Helper()
	testutil.Eventually(t, 15*time.Second, func() bool { _, ok := log.ackedAt("k", 1); return ok }, "k|1 never delivered after k|0 was %s: %s", why, log.String)
	one, _ := log.first("R", "k", 1)
	if waited := one.at.Sub(nacked); waited < 2*time.Second {
		t.Fatalf("k|1 started %v after k|0 was nacked, before the owner could know k|0 was %s:\n%s", waited, why, log)
	}
	if n := strings.Count(log.String(), "k|0"); n != 1 {
		t.Fatalf("k|0 delivered %d times, once expected (it was %s):\n%s", n, why, log)
	}
}

// A key whose nacked message the server has acked meanwhile (an earlier
// owner's ack that arrived late) would wait for it for ever: it never
// comes back. After two ack deadlines the owner fences; the consumer then
// counts nothing unacked that the owner does not hold, and the key moves
// on.
func TestPartitionKeyMovesOnWhenItsMessageIsAckedElsewhere(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("acked-elsewhere")
	sub := e.createSub("acked-elsewhere-sub", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, AckDeadline: time.Second,
		Delivery: adapter.DeliveryPartitioned, Partitions: 1})
	// The ack an earlier owner would send: to the delivery's reply
	// subject, seen here on its way to the receiver.
	spy := testutil.Connect(t, e.srv.ClientURL())
	first := string(ordercheck.Encode("k", 0))
	replies := make(chan string, 4)
	if _, err := spy.Subscribe("_INBOX.>", func(m *nats.Msg) {
		if string(m.Data) == first && strings.HasPrefix(m.Reply, "$JS.ACK.") {
			replies <- m.Reply
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	log := &partLog{}
	acked := make(chan handedBack, 1)
	startReceive(t, sub, func(ctx context.Context, m *adapter.Message) {
		if ev := log.add("R", m); ev.index == 0 {
			var err error
			select {
			case reply := <-replies:
				err = errors.Join(spy.Publish(reply, []byte("+ACK")), spy.Flush())
			case <-time.After(5 * time.Second):
				err = errors.New("the delivery of k|0 was not seen on its way")
			}
			acked <- handedBack{err, time.Now()}
			m.Nack()
			return
		}
		log.ack(m)
	})
	publish(t, topic, first, "k")
	publish(t, topic, string(ordercheck.Encode("k", 1)), "k")
	select {
	case a := <-acked:
		if a.err != nil {
			t.Fatalf("ack k|0 elsewhere: %v", a.err)
		}
		keyMovesOnAfterWaiting(t, log, a.at, "acked elsewhere")
	case <-time.After(10 * time.Second):
		t.Fatal("k|0 never delivered")
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

// The sidecar chooses an ordered subscription's delivery from its labels,
// or its --delivery default; bad labels are refused and create nothing.
func TestSidecarDeliveryLabels(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{NATSListen: "127.0.0.1:0", Delivery: adapter.DeliveryPerKey})
	js := sc.JetStream()
	pubc, subc := sc.RawClients()
	ctx := context.Background()
	if _, err := pubc.CreateTopic(ctx, &pb.Topic{Name: topicPath("labelled")}); err != nil {
		t.Fatal(err)
	}
	partitionConsumers := func(sub string) int {
		st, err := js.Stream(ctx, keyrouter.StreamName(project, "labelled"))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for name := range st.ConsumerNames(ctx).Name() {
			if strings.HasPrefix(name, keyrouter.PartitionConsumerPrefix(project, sub)) {
				n++
			}
		}
		return n
	}
	for _, tc := range []struct {
		name     string
		ordered  bool
		labels   map[string]string
		wantCode codes.Code
		wantText string
		mode     string
		parts    int
	}{
		{"default", true, nil, codes.OK, "", "per-key", 0},
		{"partitioned", true, map[string]string{"jetorder-delivery": "partitioned", "jetorder-partitions": "4", "team": "a"}, codes.OK, "", "partitioned", 4},
		{"partitioned-default-count", true, map[string]string{"jetorder-delivery": "partitioned"}, codes.OK, "", "partitioned", 8},
		{"per-key", true, map[string]string{"jetorder-delivery": "per-key"}, codes.OK, "", "per-key", 0},
		{"bad-mode", true, map[string]string{"jetorder-delivery": "fast"}, codes.InvalidArgument, `delivery "fast"`, "", 0},
		{"bad-count", true, map[string]string{"jetorder-delivery": "partitioned", "jetorder-partitions": "3"}, codes.InvalidArgument, "3 partitions", "", 0},
		{"bad-number", true, map[string]string{"jetorder-delivery": "partitioned", "jetorder-partitions": "x"}, codes.InvalidArgument, "want a positive integer", "", 0},
		{"bad-buffer", true, map[string]string{"jetorder-delivery": "partitioned", "jetorder-partition-buffer": "1000000"}, codes.InvalidArgument, "partition buffer", "", 0},
		{"count-without-mode", true, map[string]string{"jetorder-partitions": "4"}, codes.InvalidArgument, "apply to jetorder-delivery=partitioned", "", 0},
		{"unordered", false, map[string]string{"jetorder-delivery": "partitioned"}, codes.InvalidArgument, "message ordering", "", 0},
	} {
		id := "labelled-" + tc.name
		got, err := subc.CreateSubscription(ctx, &pb.Subscription{Name: subPath(id), Topic: topicPath("labelled"),
			EnableMessageOrdering: tc.ordered, Labels: tc.labels})
		if status.Code(err) != tc.wantCode || !strings.Contains(status.Convert(err).Message(), tc.wantText) {
			t.Errorf("%s: got %v, want %v containing %q", tc.name, err, tc.wantCode, tc.wantText)
			continue
		}
		if err != nil {
			if _, gerr := subc.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: subPath(id)}); status.Code(gerr) != codes.NotFound {
				t.Errorf("%s: refused, yet GetSubscription says %v", tc.name, gerr)
			}
			continue
		}
		if got.GetLabels()["jetorder-delivery"] != tc.mode {
			t.Errorf("%s: labels %v, want jetorder-delivery=%s", tc.name, got.GetLabels(), tc.mode)
		}
		if n := partitionConsumers(id); n != tc.parts {
			t.Errorf("%s: %d partition consumers, want %d", tc.name, n, tc.parts)
		}
	}
}

// A key that never acks holds back only its own messages until its
// partition's buffer is full; then the partition stops, for every key, and
// the Hooks say so. Once the key acks, everything flows again.
func TestPartitionBufferFullStopsPartition(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("stuck")
	sub := e.createSub("stuck-sub", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, AckDeadline: 10 * time.Second,
		Delivery: adapter.DeliveryPartitioned, Partitions: 1, PartitionBuffer: 10})
	stats := &partitionGauges{}
	sub.ReceiveSettings.Hooks = stats
	log := &partLog{}
	var stuck sync.Mutex // held while key "stuck" must not ack
	stuck.Lock()
	unstuck := sync.OnceFunc(stuck.Unlock)
	t.Cleanup(unstuck)
	startReceive(t, sub, func(ctx context.Context, m *adapter.Message) {
		if ev := log.add("R", m); ev.key == "stuck" {
			stuck.Lock()
			defer stuck.Unlock()
		}
		log.ack(m)
	})
	publish(t, topic, string(ordercheck.Encode("stuck", 0)), "stuck")
	testutil.Eventually(t, 10*time.Second, func() bool { _, ok := log.first("R", "stuck", 0); return ok }, "stuck|0 never delivered")
	// Below the limit, other keys flow past the stuck one.
	for i := range 3 {
		publish(t, topic, string(ordercheck.Encode("other", i)), "other")
	}
	testutil.Eventually(t, 10*time.Second, func() bool { _, ok := log.ackedAt("other", 2); return ok }, "other key held back below the limit: %s", log.String)
	// Fill the buffer: stuck|0 in the handler and stuck|1..9 waiting.
	for i := 1; i < 10; i++ {
		publish(t, topic, string(ordercheck.Encode("stuck", i)), "stuck")
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return stats.full.Load() == 1 },
		"partition never reported full (buffered %d)", stats.buffered.Load)
	if got := stats.buffered.Load(); got != 10 {
		t.Fatalf("buffered %d, want the limit, 10", got)
	}
	publish(t, topic, string(ordercheck.Encode("other", 3)), "other")
	// Absence window: JetStream delivers nothing more of a full partition.
	window := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(window) {
		if _, ok := log.first("R", "other", 3); ok {
			t.Fatalf("other|3 delivered although the partition's buffer was full")
		}
		time.Sleep(20 * time.Millisecond)
	}
	unstuck()
	testutil.Eventually(t, 10*time.Second, func() bool { _, ok := log.ackedAt("other", 3); return ok }, "other|3 never delivered after the stuck key acked: %s", log.String)
	testutil.Eventually(t, 10*time.Second, func() bool { _, ok := log.ackedAt("stuck", 9); return ok }, "stuck key did not finish: %s", log.String)
	testutil.Eventually(t, 10*time.Second, func() bool { return stats.full.Load() == 0 && stats.buffered.Load() == 0 },
		"gauges did not return to 0: full %d, buffered %d", stats.full.Load, stats.buffered.Load)
	if stats.owned.Load() != 1 {
		t.Fatalf("owned %d partitions, want 1", stats.owned.Load())
	}
	for i := range 10 {
		ev, _ := log.first("R", "stuck", i)
		if i > 0 {
			prev, _ := log.ackedAt("stuck", i-1)
			if ev.at.Before(prev) {
				t.Fatalf("stuck|%d started before stuck|%d was acked", i, i-1)
			}
		}
	}
}

// partitionGauges add up what Receive's hooks report of partitions.
type partitionGauges struct {
	adapter.NoHooks
	owned, buffered, full atomic.Int64
}

func (g *partitionGauges) PartitionChanged(_ *adapter.Subscription, c adapter.PartitionChange) {
	g.owned.Add(int64(c.Owned))
	g.buffered.Add(int64(c.Buffered))
	g.full.Add(int64(c.Full))
}
