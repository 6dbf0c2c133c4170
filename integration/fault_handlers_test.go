package integration

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
)

// Three subscriptions of one topic, each with a misbehaving handler, all
// checked by the ordering checker:
//   - slow: the handler of key "hot" takes longer than the ack deadline.
//     Receive extends the deadline while it runs, so nothing is
//     redelivered, and the other keys finish while "hot" is still busy;
//   - nacker: the handler nacks its first 200 deliveries, then acks.
//     Every nacked message comes back before anything newer of its key;
//   - stuck: the handler never acks "hot" (it returns without acking, so
//     the message comes back after each deadline). The other keys finish;
//     "hot" gets only its first message, again and again, until the
//     handler starts acking it, and then the rest in order.
func TestFaultMisbehavingHandlers(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("handlers")
	const deadline = 2 * time.Second
	for _, s := range []string{"slow", "nacker", "stuck"} {
		e.createSub(s, adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, AckDeadline: deadline})
	}
	chk := ordercheck.New()
	const keys, msgs, hotMsgs = 8, 20, 4
	for i := range msgs {
		for k := range keys {
			key := fmt.Sprintf("k%d", k)
			publish(t, topic, string(ordercheck.Encode(key, i)), key)
			chk.Published(key, i)
		}
		if i < hotMsgs {
			publish(t, topic, string(ordercheck.Encode("hot", i)), "hot")
			chk.Published("hot", i)
		}
	}

	// decode feeds a delivery to the checker; false means it was bad (and
	// has been acked out of the way).
	decode := func(sub string, m *adapter.Message) (string, int, bool) {
		key, idx, err := ordercheck.Decode(m.Data)
		if err != nil || key != m.OrderingKey {
			chk.Fail("%s: undecodable delivery %q (key %q): %v", sub, m.Data, m.OrderingKey, err)
			m.Ack()
			return "", 0, false
		}
		chk.Delivered(sub, key, idx)
		return key, idx, true
	}
	ack := func(sub, key string, idx int, m *adapter.Message) {
		chk.Acked(sub, key, idx)
		m.Ack()
	}

	startReceive(t, e.client.Subscription("slow"), func(ctx context.Context, m *adapter.Message) {
		key, idx, ok := decode("slow", m)
		if !ok {
			return
		}
		if key == "hot" {
			select { // the slow work: 1.5 ack deadlines
			case <-time.After(deadline * 3 / 2):
			case <-ctx.Done():
				chk.Released("slow", key, idx)
				return
			}
		}
		ack("slow", key, idx, m)
	})
	var nacks atomic.Int64
	startReceive(t, e.client.Subscription("nacker"), func(_ context.Context, m *adapter.Message) {
		key, idx, ok := decode("nacker", m)
		if !ok {
			return
		}
		if nacks.Add(1) <= 200 {
			chk.Released("nacker", key, idx)
			m.Nack()
			return
		}
		ack("nacker", key, idx, m)
	})
	var hotDeliveries atomic.Int64
	var fixed atomic.Bool
	startReceive(t, e.client.Subscription("stuck"), func(_ context.Context, m *adapter.Message) {
		key, idx, ok := decode("stuck", m)
		if !ok {
			return
		}
		if key == "hot" && !fixed.Load() {
			hotDeliveries.Add(1)
			chk.Released("stuck", key, idx) // returns without ack: back after the deadline
			return
		}
		ack("stuck", key, idx, m)
	})

	othersDone := func(sub string) bool {
		missing := chk.Missing(sub)
		return missing == "" || (strings.HasPrefix(missing, `key "hot"`) && !strings.Contains(missing, ";"))
	}
	testutil.Eventually(t, 60*time.Second, func() bool { return othersDone("slow") && othersDone("stuck") },
		"other keys held up: slow: %s; stuck: %s", func() string { return chk.Missing("slow") }, func() string { return chk.Missing("stuck") })
	if m := chk.Missing("slow"); !strings.Contains(m, `key "hot"`) {
		t.Errorf("slow: every key finished before the other keys were checked (%q): the slow handler did not hold its key up", m)
	}
	// The stuck key's first message comes back after each deadline, and
	// nothing after it is delivered meanwhile (the checker would report it).
	testutil.Eventually(t, 30*time.Second, func() bool { return hotDeliveries.Load() >= 3 },
		"the unacked message of the stuck key came %d times, want 3", hotDeliveries.Load)
	if m := chk.Missing("stuck"); !strings.Contains(m, `key "hot": 0 of 4 acked`) {
		t.Fatalf("stuck: %q, want hot with nothing acked", m)
	}
	fixed.Store(true)

	for _, s := range []string{"slow", "nacker", "stuck"} {
		testutil.Eventually(t, 60*time.Second, func() bool { return chk.Complete(s) }, "%s: not acked: %s", s, func() string { return chk.Missing(s) })
	}
	if v := chk.Violations(); len(v) > 0 {
		t.Fatalf("%d ordering violations, first: %s", len(v), strings.Join(v, "\n"))
	}
	if st := chk.Stats("slow"); st.Redeliveries != 0 {
		t.Errorf("slow: %d redeliveries, want 0: Receive extends the deadline while a handler runs", st.Redeliveries)
	}
	if st := chk.Stats("nacker"); st.Redeliveries < 200 {
		t.Errorf("nacker: %d redeliveries, want at least the 200 nacks", st.Redeliveries)
	}
	for _, s := range []string{"slow", "nacker", "stuck"} {
		st := chk.Stats(s)
		t.Logf("%s: %d messages, %d deliveries, %d redeliveries", s, keys*msgs+hotMsgs, st.Deliveries, st.Redeliveries)
	}
}

// Without a dead-letter policy a message that keeps failing holds its key:
// the key's next message is not delivered, other keys flow, and the
// sidecar's metrics show the growing delivery attempt with nothing dead
// lettered.
func TestFaultPoisonKeyWaitsVisibleInMetrics(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{})
	c := sc.GoClient()
	mustCreateTopic(t, c, "poisoned")
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("poisoned-sub"), Topic: topicPath("poisoned"), EnableMessageOrdering: true, AckDeadlineSeconds: 60})
	pubc, subc := sc.RawClients()
	if _, err := pubc.Publish(context.Background(), &pb.PublishRequest{Topic: topicPath("poisoned"), Messages: []*pb.PubsubMessage{
		{Data: []byte("poison"), OrderingKey: "k"}, {Data: []byte("next"), OrderingKey: "k"}, {Data: []byte("other"), OrderingKey: "o"}}}); err != nil {
		t.Fatal(err)
	}
	rs := openRawStream(t, subc, &pb.StreamingPullRequest{Subscription: subPath("poisoned-sub"), StreamAckDeadlineSeconds: 60})
	const attempts = 8
	sawOther := false
	for attempt := 1; attempt <= attempts; {
		m := rs.next()
		switch data := string(m.GetMessage().GetData()); {
		case data == "other" && !sawOther:
			sawOther = true
			if _, err := subc.Acknowledge(context.Background(), &pb.AcknowledgeRequest{Subscription: subPath("poisoned-sub"), AckIds: []string{m.AckId}}); err != nil {
				t.Fatal(err)
			}
			continue
		case data != "poison" || m.GetDeliveryAttempt() != 0:
			// Without a dead-letter policy no attempt is reported (the
			// service's rule); the metric below counts them.
			t.Fatalf("delivery %d: %q attempt %d, want poison without an attempt", attempt, data, m.GetDeliveryAttempt())
		}
		if attempt < attempts { // nack; the last attempt stays out, as with a client that keeps failing
			if _, err := subc.ModifyAckDeadline(context.Background(), &pb.ModifyAckDeadlineRequest{Subscription: subPath("poisoned-sub"), AckIds: []string{m.AckId}}); err != nil {
				t.Fatal(err)
			}
		}
		attempt++
	}
	if !sawOther {
		m := rs.next()
		if string(m.GetMessage().GetData()) != "other" {
			t.Fatalf("got %q, want the other key's message", m.GetMessage().GetData())
		}
		// Acked like the one in the loop: the metrics below count one key.
		if _, err := subc.Acknowledge(context.Background(), &pb.AcknowledgeRequest{Subscription: subPath("poisoned-sub"), AckIds: []string{m.AckId}}); err != nil {
			t.Fatal(err)
		}
	}
	rs.quiet(time.Second, "the poisoned key's next message came while the poison was out")

	m := testutil.Scrape(t, "http://"+sc.HTTP+"/metrics")
	sub := []string{"subscription", subPath("poisoned-sub")}
	for name, want := range map[string]float64{
		"jetorder_max_delivery_attempt": attempts,
		"jetorder_redelivered_total":    attempts - 1,
		"jetorder_dead_lettered_total":  0,
		"jetorder_keys_in_flight":       1,
		"jetorder_paused_keys":          1,
	} {
		if v, ok := m.Value(name, sub...); !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", name, v, ok, want)
		}
	}
}
