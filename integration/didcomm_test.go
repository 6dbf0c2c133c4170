package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/didcomm"
	"github.com/jetorder/jetorder/internal/testutil"
)

// bid is a DIDComm plaintext message of an auction thread.
func bid(t *testing.T, thread, from string, order, sentCount uint64) []byte {
	t.Helper()
	data := fmt.Appendf(nil, `{"id":"%s-%s-%d","type":"https://example.org/auction/1.0/bid","thid":%q,"from":%q,"body":{"amount":%d}}`, thread, from, order, thread, from, order)
	h, err := didcomm.ReadPlaintext(data)
	if err != nil {
		t.Fatal(err)
	}
	h.SenderOrder, h.SentCount = order, sentCount
	if data, err = didcomm.WritePlaintext(data, h); err != nil {
		t.Fatal(err)
	}
	return data
}

// handedOver is what a didcomm handler saw of one message.
type handedOver struct {
	thread, from string
	order, sent  uint64
	events       []didcomm.EventKind
	err          error
	receiver     int
	pos          uint64
	attempt      int
}

func (h handedOver) String() string {
	return fmt.Sprintf("%s/%s/%d(sent %d)", h.thread, h.from, h.order, h.sent)
}

// handoverLog records what handlers were given and acks it.
type handoverLog struct {
	mu  sync.Mutex
	all []handedOver
}

func (l *handoverLog) handler(receiver int) didcomm.Handler {
	return func(ctx context.Context, d *didcomm.Delivery) {
		ho := handedOver{thread: d.Headers.ThreadID(), from: d.Headers.From, order: d.Headers.SenderOrder, sent: max(d.Headers.SentCount, 1), err: d.Err, receiver: receiver, pos: d.Message.StreamSequence, attempt: d.Message.DeliveryAttempt}
		for _, e := range d.Events {
			ho.events = append(ho.events, e.Kind)
		}
		l.mu.Lock()
		l.all = append(l.all, ho)
		l.mu.Unlock()
		d.Ack()
	}
}

func (l *handoverLog) snapshot() []handedOver {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.all)
}

func (l *handoverLog) count() int { return len(l.snapshot()) }

func receiveDIDComm(t *testing.T, sub *adapter.Subscription, l *handoverLog, receiver int) *receiving {
	t.Helper()
	tr, err := didcomm.OpenSubscriptionTracker(context.Background(), sub)
	if err != nil {
		t.Fatal(err)
	}
	return startReceiving(t, func(ctx context.Context) error { return didcomm.Receive(ctx, sub, tr, l.handler(receiver)) })
}

func publishData(t *testing.T, topic *adapter.Topic, data []byte, key string) {
	t.Helper()
	if _, err := topic.Publish(context.Background(), &adapter.Message{Data: data, OrderingKey: key}).Get(context.Background()); err != nil {
		t.Fatalf("Publish: %v", err)
	}
}

func receivedOrdersJSON(t *testing.T, tr *didcomm.Tracker, thread string) string {
	t.Helper()
	ros, err := tr.ReceivedOrders(context.Background(), thread)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(ros)
	return string(b)
}

// The specification's auction, through a topic: each bidder publishes on
// its own ordering key, so the thread spans keys. Gaps open and fill,
// resends are dropped before the handler, and received_orders is exactly
// the specification's example.
func TestDIDCommGapDetectionOnSubscription(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("auction")
	sub := e.createSub("auctioneer", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	var log handoverLog
	receiveDIDComm(t, sub, &log, 0)

	publishData(t, topic, bid(t, "a-1", "did:ex:bob", 1, 0), "did:ex:bob")
	publishData(t, topic, bid(t, "a-1", "did:ex:bob", 2, 0), "did:ex:bob")
	// Keys flow concurrently and received_orders lists senders in the order
	// the thread first saw them: Bob's bids are handed over before Alice's
	// are published, as in the specification's example.
	testutil.Eventually(t, 10*time.Second, func() bool { return log.count() == 2 }, "handed over %v, want 2", log.snapshot)
	publishData(t, topic, bid(t, "a-1", "did:ex:alice", 1, 0), "did:ex:alice")
	publishData(t, topic, bid(t, "a-1", "did:ex:alice", 4, 0), "did:ex:alice")
	testutil.Eventually(t, 10*time.Second, func() bool { return log.count() == 4 }, "handed over %v, want 4", log.snapshot)

	view, err := didcomm.OpenSubscriptionTracker(context.Background(), sub)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := receivedOrdersJSON(t, view, "a-1"), `[{"id":"did:ex:bob","last":2,"gaps":[]},{"id":"did:ex:alice","last":4,"gaps":[2,3]}]`; got != want {
		t.Fatalf("received_orders\n got %s\nwant %s", got, want)
	}
	opened := log.snapshot()[3]
	if opened.from != "did:ex:alice" || !slices.Equal(opened.events, []didcomm.EventKind{didcomm.GapOpened, didcomm.OutOfOrder}) {
		t.Fatalf("alice's bid 4: %+v", opened)
	}

	// Alice resends 4 twice and sends 3 late; the resends never reach the
	// handler. Her next message on the same key comes after them, so once
	// it is handed over the resends were dealt with.
	publishData(t, topic, bid(t, "a-1", "did:ex:alice", 4, 2), "did:ex:alice")
	publishData(t, topic, bid(t, "a-1", "did:ex:alice", 3, 0), "did:ex:alice")
	publishData(t, topic, bid(t, "a-1", "did:ex:alice", 4, 3), "did:ex:alice")
	publishData(t, topic, bid(t, "a-1", "did:ex:alice", 5, 0), "did:ex:alice")
	testutil.Eventually(t, 10*time.Second, func() bool { return log.count() >= 6 }, "handed over %v, want 6", log.snapshot)
	all := log.snapshot()
	if len(all) != 6 || all[4].order != 3 || all[5].order != 5 {
		t.Fatalf("handed over %v, want bids 3 and 5 after the first four", all)
	}
	if !slices.Equal(all[4].events, []didcomm.EventKind{didcomm.GapFilled, didcomm.OutOfOrder}) || len(all[5].events) != 0 {
		t.Fatalf("events: 3 %v, 5 %v", all[4].events, all[5].events)
	}
	if got, want := receivedOrdersJSON(t, view, "a-1"), `[{"id":"did:ex:bob","last":2,"gaps":[]},{"id":"did:ex:alice","last":5,"gaps":[2]}]`; got != want {
		t.Fatalf("received_orders\n got %s\nwant %s", got, want)
	}
}

// A message the handler nacks comes back and is handed over again: the
// tracker tells a redelivery from a resend.
func TestDIDCommNackedMessageIsHandedOverAgain(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("nack")
	sub := e.createSub("nack", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	tr, err := didcomm.OpenSubscriptionTracker(context.Background(), sub)
	if err != nil {
		t.Fatal(err)
	}
	attempts := make(chan int, 10)
	startReceiving(t, func(ctx context.Context) error {
		return didcomm.Receive(ctx, sub, tr, func(ctx context.Context, d *didcomm.Delivery) {
			attempts <- d.Message.DeliveryAttempt
			if d.Headers.SenderOrder == 1 && d.Message.DeliveryAttempt < 3 {
				d.Nack()
				d.Ack() // ignored: Nack came first
				return
			}
			d.Ack()
		})
	})
	publishData(t, topic, bid(t, "n", "did:ex:a", 1, 0), "k")
	for want := 1; want <= 3; want++ {
		select {
		case got := <-attempts:
			if got != want {
				t.Fatalf("delivery attempt %d, want %d", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("attempt %d never handed over", want)
		}
	}
	// After the ack, a resend is a copy.
	publishData(t, topic, bid(t, "n", "did:ex:a", 1, 2), "k")
	publishData(t, topic, bid(t, "n", "did:ex:a", 2, 0), "k")
	select {
	case got := <-attempts:
		if got != 1 {
			t.Fatalf("unexpected attempt %d", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("order 2 never handed over")
	}
	if got := receivedOrdersJSON(t, tr, "n"); got != `[{"id":"did:ex:a","last":2,"gaps":[]}]` {
		t.Fatalf("received_orders %s", got)
	}
	select {
	case got := <-attempts:
		t.Fatalf("extra hand-over (attempt %d): the resend was not dropped", got)
	default:
	}
}

// A subscriber stops; resends and new messages arrive meanwhile; a new
// process with a new tracker goes on with the same view.
func TestDIDCommStateSurvivesSubscriberRestart(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("restart")
	sub := e.createSub("restart", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	var first handoverLog
	r := receiveDIDComm(t, sub, &first, 0)
	for order := uint64(1); order <= 3; order++ {
		publishData(t, topic, bid(t, "r", "did:ex:a", order, 0), "did:ex:a")
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return first.count() == 3 }, "handed over %v", first.snapshot)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	publishData(t, topic, bid(t, "r", "did:ex:a", 2, 2), "did:ex:a")
	publishData(t, topic, bid(t, "r", "did:ex:a", 5, 0), "did:ex:a")
	publishData(t, topic, bid(t, "r", "did:ex:a", 3, 2), "did:ex:a")
	publishData(t, topic, bid(t, "r", "did:ex:a", 6, 0), "did:ex:a")

	_, client2 := e.connect()
	sub2 := client2.Subscription(sub.ID())
	var second handoverLog
	receiveDIDComm(t, sub2, &second, 1)
	testutil.Eventually(t, 10*time.Second, func() bool { return second.count() >= 2 }, "handed over %v", second.snapshot)
	got := second.snapshot()
	if len(got) != 2 || got[0].order != 5 || got[1].order != 6 || !slices.Contains(got[0].events, didcomm.GapOpened) {
		t.Fatalf("after restart handed over %v, want 5 (gap opened) and 6", got)
	}
	view, err := didcomm.OpenSubscriptionTracker(context.Background(), sub2)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := receivedOrdersJSON(t, view, "r"), `[{"id":"did:ex:a","last":6,"gaps":[4]}]`; got != want {
		t.Fatalf("received_orders %s, want %s", got, want)
	}
}

// Two processes receive from one subscription at once. Every message is
// published twice, the resend on another ordering key, so the two copies
// are often handed to different processes at the same time: the shared
// state hands each message over exactly once.
func TestDIDCommTwoSubscribersShareState(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("shared")
	sub := e.createSub("shared", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	_, client2 := e.connect()
	var log handoverLog
	receiveDIDComm(t, sub, &log, 0)
	receiveDIDComm(t, client2.Subscription(sub.ID()), &log, 1)

	const threads, senders, orders = 10, 3, 8
	var results []*adapter.PublishResult
	for o := uint64(1); o <= orders; o++ {
		for th := range threads {
			for s := range senders {
				thread, from := fmt.Sprint("th-", th), fmt.Sprint("did:ex:s", s)
				results = append(results,
					topic.Publish(context.Background(), &adapter.Message{Data: bid(t, thread, from, o, 0), OrderingKey: thread + "/" + from}),
					topic.Publish(context.Background(), &adapter.Message{Data: bid(t, thread, from, o, 2), OrderingKey: thread + "/" + from + "/resends"}))
			}
		}
	}
	for _, r := range results {
		if _, err := r.Get(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// A last message per sender on the resend key: once all are handed
	// over, every copy before them was dealt with.
	for th := range threads {
		for s := range senders {
			thread, from := fmt.Sprint("th-", th), fmt.Sprint("did:ex:s", s)
			publishData(t, topic, bid(t, thread, from, orders+1, 0), thread+"/"+from+"/resends")
		}
	}
	want := threads * senders * (orders + 1)
	testutil.Eventually(t, 30*time.Second, func() bool { return log.count() >= want }, "handed over %d of %d", log.count, want)

	seen := make(map[string]int)
	byReceiver := [2]int{}
	for _, h := range log.snapshot() {
		seen[h.String()[:len(h.String())-len(fmt.Sprintf("(sent %d)", h.sent))]]++
		byReceiver[h.receiver]++
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("%s handed over %d times", k, n)
			for _, h := range log.snapshot() {
				if strings.HasPrefix(h.String(), k+"(") {
					t.Logf("  %v receiver %d pos %d attempt %d", h, h.receiver, h.pos, h.attempt)
				}
			}
		}
	}
	if len(seen) != want {
		t.Fatalf("%d distinct messages handed over, want %d", len(seen), want)
	}
	t.Logf("handed over by receiver: %v", byReceiver)
}

// A message with broken sequencing headers is handed over with the error,
// untracked; a plain payload with Didcomm- NATS headers is tracked.
func TestDIDCommBadHeadersAndNATSHeaderWire(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("wire")
	sub := e.createSub("wire", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	var log handoverLog
	receiveDIDComm(t, sub, &log, 0)

	publishData(t, topic, []byte(`{"id":"x","type":"t","from":"did:ex:a","sender_order":1.5}`), "k")
	publishData(t, topic, []byte(`{"id":"y","type":"t","sender_order":1}`), "k")
	publishData(t, topic, []byte("not DIDComm"), "k")
	for _, order := range []uint64{1, 3, 3} {
		m := &adapter.Message{Data: []byte("binary payload"), OrderingKey: "k", Header: nats.Header{}}
		didcomm.WriteHeader(m.Header, didcomm.Headers{ID: fmt.Sprint("h-", order), Thread: "wire thread", From: "did:ex:b", SenderOrder: order})
		if _, err := topic.Publish(context.Background(), m).Get(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	publishData(t, topic, []byte("last"), "k")
	testutil.Eventually(t, 10*time.Second, func() bool { return log.count() >= 6 }, "handed over %v", log.snapshot)
	got := log.snapshot()
	if len(got) != 6 {
		t.Fatalf("handed over %v, want 6 (the copy of order 3 dropped)", got)
	}
	if !errors.Is(got[0].err, didcomm.ErrInvalidSenderOrder) || !errors.Is(got[1].err, didcomm.ErrMissingSender) {
		t.Fatalf("errors %v, %v", got[0].err, got[1].err)
	}
	if got[2].err != nil || got[2].order != 0 || got[5].err != nil {
		t.Fatalf("plain payloads: %+v, %+v", got[2], got[5])
	}
	if got[3].thread != "wire thread" || got[4].order != 3 || !slices.Contains(got[4].events, didcomm.GapOpened) {
		t.Fatalf("header wire: %+v, %+v", got[3], got[4])
	}
}

// Deleting a subscription removes its tracker state: a subscription
// created again with the same id starts afresh.
func TestDIDCommStateGoesWithTheSubscription(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	topic := e.createTopic("gone")
	sub := e.createSub("gone", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	tr, err := didcomm.OpenSubscriptionTracker(ctx, sub)
	if err != nil {
		t.Fatal(err)
	}
	h := didcomm.Headers{ID: "m", Thread: "th", From: "did:ex:a", SenderOrder: 1}
	if _, err := tr.Observe(ctx, h, 0); err != nil {
		t.Fatal(err)
	}
	if err := sub.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	sub = e.createSub("gone", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	tr, err = didcomm.OpenSubscriptionTracker(ctx, sub)
	if err != nil {
		t.Fatal(err)
	}
	if got := receivedOrdersJSON(t, tr, "th"); got != "[]" {
		t.Fatalf("new subscription inherited %s", got)
	}
	requireNoState(t, sub)
}

// A tracker opened before the subscription was deleted and created again
// is refused; state saved by a straggler after Delete is gone once the id
// is created again.
func TestDIDCommTrackerBelongsToOneIncarnation(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	topic := e.createTopic("incarnation")
	sub := e.createSub("incarnation", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	old, err := didcomm.OpenSubscriptionTracker(ctx, sub)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	// A receiver that has not noticed the delete saves once more.
	if _, err := old.Observe(ctx, didcomm.Headers{ID: "m", Thread: "th", From: "did:ex:a", SenderOrder: 1}, 1); err != nil {
		t.Fatal(err)
	}
	sub = e.createSub("incarnation", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	err = didcomm.Receive(ctx, sub, old, func(context.Context, *didcomm.Delivery) {})
	if !errors.Is(err, adapter.ErrInvalidConfig) {
		t.Fatalf("Receive with the old incarnation's tracker: %v", err)
	}
	requireNoState(t, sub)
}

// requireNoState fails the test if the state bucket holds any key: the
// only subscription there is sub, created afresh.
func requireNoState(t *testing.T, sub *adapter.Subscription) {
	t.Helper()
	ctx := context.Background()
	kv, prefix, err := sub.LayerState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for k := range keys.Keys() {
		t.Errorf("key %s left by an earlier subscription (now %s)", k, prefix)
	}
}
