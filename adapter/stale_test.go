package adapter

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// perKeySubscription is topic "tpc" of project "p" on a server of its own,
// and its ordered subscription "sub" with per-key delivery.
func perKeySubscription(t *testing.T) (*nats.Conn, *Client, *Topic, *Subscription) {
	t.Helper()
	srv := testutil.Server(t)
	nc := testutil.Connect(t, srv.ClientURL())
	c, err := NewClient(nc, "p")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	topic, err := c.CreateTopic(ctx, "tpc")
	if err != nil {
		t.Fatal(err)
	}
	sub, err := c.CreateSubscription(ctx, "sub", SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, Delivery: DeliveryPerKey})
	if err != nil {
		t.Fatal(err)
	}
	return nc, c, topic, sub
}

// A key consumer's delivery that is no longer the key's to deliver is
// found stale by asking the consumer; its current delivery is not. On a
// cluster, a paused server hands stale ones on late: the first delivery
// of a message whose redelivery went elsewhere and was acked while the key
// went on, or the redelivery of a message whose ack the server lost after
// delivering past it. (A client may not publish with a $JS.ACK reply, so
// they are made here as the receiver would have been handed them.)
func TestKeyDeliveryDue(t *testing.T) {
	nc, c, topic, sub := perKeySubscription(t)
	ctx := context.Background()
	got := make(chan *Message, 3)
	release := make(chan struct{})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- sub.Receive(rctx, func(_ context.Context, m *Message) {
			got <- m
			if string(m.Data) == "m1" {
				<-release // m1 stays out while the deliveries are looked at
			}
			m.Ack()
		})
	}()
	t.Cleanup(func() {
		stop()
		<-done
	})
	for _, data := range []string{"m0", "m1"} {
		if _, err := topic.Publish(ctx, &Message{Data: []byte(data), OrderingKey: "k"}).Get(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-got:
			if string(m.Data) != data {
				t.Fatalf("handled %q, want %q", m.Data, data)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s not handled", data)
		}
	}
	defer close(release)

	// The key consumer, with m0 acked and m1 out.
	stream := keyrouter.StreamName("p", "tpc")
	var info *jetstream.ConsumerInfo
	testutil.Eventually(t, 10*time.Second, func() bool {
		s, err := c.js.Stream(ctx, stream)
		if err != nil {
			return false
		}
		for i := range s.ListConsumers(ctx).Info() {
			if strings.HasPrefix(i.Name, keyrouter.KeyConsumerPrefix("p", "sub")) && i.AckFloor.Stream == 1 && i.Delivered.Stream == 2 {
				info = i
			}
		}
		return info != nil
	}, "no key consumer with m0 acked and m1 out")
	rec, err := sub.load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The receiver asking is another member of the subscription, beside
	// the Receive call above, which holds m1.
	r := &receiver{c: c, sub: sub, rec: rec, hctx: ctx, presence: newPresence(nc)}
	pk := &perKeyMode{r: r, peers: make(map[string]bool), peersKnown: true}
	r.mode = pk
	kv, err := c.stateBucket(ctx)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.ListKeysFiltered(ctx, sub.memberPrefix()+"*")
	if err != nil {
		t.Fatal(err)
	}
	for k := range keys.Keys() {
		pk.peers[strings.TrimPrefix(k, sub.memberPrefix())] = true
	}
	if len(pk.peers) != 1 {
		t.Fatalf("members %v, want the one Receive call", pk.peers)
	}
	delivery := func(attempt, seq, dseq uint64, stored time.Time) (*nats.Msg, *nats.MsgMetadata) {
		m := &nats.Msg{Subject: "deliver", Sub: &nats.Subscription{}, Reply: fmt.Sprintf("$JS.ACK.%s.%s.%d.%d.%d.%d.0", stream, info.Name, attempt, seq, dseq, stored.UnixNano())}
		meta, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		return m, meta
	}
	cur := info.Delivered.Consumer
	for _, d := range []struct {
		what               string
		attempt, seq, dseq uint64
		stored             time.Time
		due                bool
	}{
		{"m0's first delivery, late", 1, 1, 1, time.Now().Add(-time.Minute), false},
		{"a redelivery of m0, acked and passed", 2, 1, cur + 1, time.Now(), false},
		{"an earlier delivery of m1, delivered again since", 1, 2, cur - 1, time.Now().Add(-time.Minute), false},
		{"m1's current delivery", 1, 2, cur, time.Now().Add(-time.Minute), true},
		{"a deposed leader's delivery of another message under m1's number", 1, 3, cur, time.Now().Add(-time.Minute), false},
		{"a redelivery of m1 the consumer's state does not show yet, while another receiver holds m1", 2, 2, cur + 1, time.Now(), false},
	} {
		m, meta := delivery(d.attempt, d.seq, d.dseq, d.stored)
		if due := r.keyDeliveryDue(m, meta); due != d.due {
			t.Errorf("%s: due %v, want %v", d.what, due, d.due)
		}
	}
	// A leader was elected for the consumer lately: a first delivery, of
	// a message stored just now, may be a deposed leader's twin of one
	// another receiver holds.
	m, meta := delivery(1, 2, cur, time.Now())
	if !r.keyDeliveryDue(m, meta) {
		t.Error("m1's current delivery, stored just now: not due")
	}
	r.elected = map[string]election{}
	// nats-server announces a new consumer's first leader too: nobody was
	// deposed, and the delivery is due without asking the others.
	r.leaderElected(info.Name, info.Created.Add(time.Second))
	if !r.keyDeliveryDue(m, meta) {
		t.Error("m1's current delivery, its consumer's first leader elected lately: not due")
	}
	r.leaderElected(info.Name, info.Created.Add(time.Minute))
	if r.keyDeliveryDue(m, meta) {
		t.Error("m1's current delivery, its consumer's leader elected lately, while another receiver holds m1: due")
	}
	// With no other member to hold it, the redelivery is due, and so is
	// the first delivery.
	clear(pk.peers)
	if !r.keyDeliveryDue(m, meta) {
		t.Error("m1's current delivery, its consumer's leader elected lately, no other receiver holding m1: not due")
	}
	m, meta = delivery(2, 2, cur+1, time.Now())
	if !r.keyDeliveryDue(m, meta) {
		t.Error("a redelivery of m1 no other receiver holds: not due")
	}
}

// A key consumer's delivery of a message this receiver's handler acked,
// or of an earlier one (its ack late or lost on the way, the consumer
// delivered it again), is acked again and dropped, whatever its attempt
// or age: the key's next message may already be in another receiver's
// handler. A message stored well after the one acked (a topic created
// again) is not taken for a copy, nor is anything once the receiver is
// ending; an ack AckWithResult had confirmed counts, one it had not does
// not, and a late ack of an earlier message does not take a later one
// back.
func TestKeyDeliveryOfMessageAckedHere(t *testing.T) {
	nc, c, _, sub := perKeySubscription(t)
	ctx := context.Background()
	rec, err := sub.load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	consumer := keyrouter.KeyConsumer("p", "sub", "k")
	r := &receiver{c: c, sub: sub, rec: rec, hctx: ctx, held: make(map[heldKey]*delivery), lastAcks: make(map[string]lastAck), checking: make(map[heldKey]uint64), fatalSet: make(chan struct{})}
	r.mode = &perKeyMode{r: r}
	stored := time.Now()
	delivery := func(seq uint64, stored time.Time) *delivery {
		return &delivery{r: r, key: heldKey{consumer: consumer, seq: seq}, msg: &Message{PublishTime: stored}}
	}
	r.noteAck(delivery(7, stored))
	r.noteAck(delivery(5, stored.Add(-time.Second))) // a late ack of an earlier one
	ackedHere := func(consumer string, seq uint64, at time.Time) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.ackedHereLocked(consumer, seq, at)
	}
	for _, c := range []struct {
		seq  uint64
		at   time.Time
		want bool
	}{
		{6, stored.Add(-time.Millisecond), true},
		{7, stored, true},
		{7, time.Time{}, true}, // a hold check's question: no timestamp
		{8, stored.Add(time.Millisecond), false},
		{3, stored.Add(time.Minute), false}, // the topic created again
	} {
		if got := ackedHere(consumer, c.seq, c.at); got != c.want {
			t.Errorf("acked here (seq %d stored %v) = %v, want %v", c.seq, c.at.Sub(stored), got, c.want)
		}
		if ackedHere(keyrouter.KeyConsumer("p", "sub", "other"), c.seq, c.at) {
			t.Errorf("acked here (another consumer, seq %d) = true", c.seq)
		}
	}

	acks, err := nc.SubscribeSync("$JS.ACK.>")
	if err != nil {
		t.Fatal(err)
	}
	// On arrival, and in arrive itself (a copy whose checks were under
	// way when the ack was sent).
	for _, attempt := range []uint64{1, 2, 3} {
		reply := fmt.Sprintf("$JS.ACK.%s.%s.%d.7.%d.%d.0", rec.stream(), consumer, attempt, 10+attempt, stored.UnixNano())
		m := &nats.Msg{Subject: "deliver", Sub: &nats.Subscription{}, Reply: reply}
		if attempt < 3 {
			r.onMsg(m)
		} else {
			meta, err := m.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			r.arrive(m, meta)
		}
		a, err := acks.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("attempt %d: no ack again: %v", attempt, err)
		}
		if a.Subject != reply || string(a.Data) != "+ACK" {
			t.Fatalf("attempt %d: sent %q to %s, want +ACK to %s", attempt, a.Data, a.Subject, reply)
		}
		r.mu.Lock()
		held := len(r.held)
		r.mu.Unlock()
		if held != 0 {
			t.Fatalf("attempt %d: the copy is held", attempt)
		}
	}

	// AckWithResult: recorded once the server confirmed the ack.
	r.release(delivery(9, stored), false)
	if ackedHere(consumer, 9, stored) {
		t.Error("an ack not confirmed counts")
	}
	r.release(delivery(9, stored), true)
	if !ackedHere(consumer, 9, stored) {
		t.Error("a confirmed ack does not count")
	}

	// A receiver that is ending (its subscription deleted, perhaps
	// created again under its name) takes nothing for a copy.
	r.fail(ErrSubscriptionNotFound)
	if ackedHere(consumer, 7, stored) {
		t.Error("acked here after the receiver failed")
	}
}
