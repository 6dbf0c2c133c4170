package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
)

// pipelinedLabels ask for pipelined ordering; pipelining needs partitioned
// delivery, whatever the suite's default.
var pipelinedLabels = map[string]string{"jetorder-ordering": "pipelined", "jetorder-delivery": "partitioned"}

// publishRaw publishes data as messages of key, in one request.
func publishRaw(t *testing.T, pubc pb.PublisherClient, topic, key string, data ...string) {
	t.Helper()
	var msgs []*pb.PubsubMessage
	for _, d := range data {
		msgs = append(msgs, &pb.PubsubMessage{Data: []byte(d), OrderingKey: key})
	}
	if _, err := pubc.Publish(context.Background(), &pb.PublishRequest{Topic: topicPath(topic), Messages: msgs}); err != nil {
		t.Fatal(err)
	}
}

// nextData is the data of the next n messages of rs.
func (r *rawStream) nextData(n int) ([]string, []string) {
	r.t.Helper()
	var data, ids []string
	for range n {
		m := r.next()
		data, ids = append(data, string(m.GetMessage().GetData())), append(ids, m.GetAckId())
	}
	return data, ids
}

// With pipelined ordering a key's messages reach the stream without
// waiting for acks. A nack mid-window brings back the nacked message and
// every later one, acked or not, in order; the earlier ones stay acked.
func TestPipelinedNackMidWindow(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{})
	c := sc.GoClient()
	mustCreateTopic(t, c, "pipe")
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("pipe-sub"), Topic: topicPath("pipe"), EnableMessageOrdering: true,
		AckDeadlineSeconds: 60, Labels: pipelinedLabels})
	pubc, subc := sc.RawClients()
	publishRaw(t, pubc, "pipe", "k", "m0", "m1", "m2", "m3", "m4")
	rs := openRawStream(t, subc, &pb.StreamingPullRequest{Subscription: subPath("pipe-sub"), StreamAckDeadlineSeconds: 60, ProtocolVersion: 1})
	data, ids := rs.nextData(5) // all five, none acked
	if got := strings.Join(data, " "); got != "m0 m1 m2 m3 m4" {
		t.Fatalf("first deliveries %q, want m0 m1 m2 m3 m4", got)
	}
	ack := func(ids ...string) {
		t.Helper()
		if _, err := subc.Acknowledge(context.Background(), &pb.AcknowledgeRequest{Subscription: subPath("pipe-sub"), AckIds: ids}); err != nil {
			t.Fatal(err)
		}
	}
	ack(ids[3]) // m3's ack waits for m0..m2's
	ack(ids[0])
	if _, err := subc.ModifyAckDeadline(context.Background(), &pb.ModifyAckDeadlineRequest{Subscription: subPath("pipe-sub"), AckIds: ids[1:2]}); err != nil {
		t.Fatal(err)
	}
	data, ids = rs.nextData(4)
	if got := strings.Join(data, " "); got != "m1 m2 m3 m4" {
		t.Fatalf("after nacking m1: %q, want m1 m2 m3 m4 (m3 too: its ack came after m1's nack was due)", got)
	}
	ack(ids...)
	rs.quiet(500*time.Millisecond, "a message after every one was acked")
}

// A lease that runs out mid-window brings back its message and every later
// one of the key, in order.
func TestPipelinedExpiryMidWindow(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{Ordering: "pipelined"}) // the sidecar's default, no label
	c := sc.GoClient()
	mustCreateTopic(t, c, "pipe-exp")
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("pipe-exp-sub"), Topic: topicPath("pipe-exp"), EnableMessageOrdering: true,
		AckDeadlineSeconds: 60, Labels: map[string]string{"jetorder-delivery": "partitioned"}})
	pubc, subc := sc.RawClients()
	publishRaw(t, pubc, "pipe-exp", "k", "m0", "m1", "m2")
	rs := openRawStream(t, subc, &pb.StreamingPullRequest{Subscription: subPath("pipe-exp-sub"), StreamAckDeadlineSeconds: 60, ProtocolVersion: 1})
	data, ids := rs.nextData(3)
	if got := strings.Join(data, " "); got != "m0 m1 m2" {
		t.Fatalf("first deliveries %q", got)
	}
	if _, err := subc.Acknowledge(context.Background(), &pb.AcknowledgeRequest{Subscription: subPath("pipe-exp-sub"), AckIds: ids[:1]}); err != nil {
		t.Fatal(err)
	}
	// m1's lease runs out in a second; m2's stays.
	if _, err := subc.ModifyAckDeadline(context.Background(), &pb.ModifyAckDeadlineRequest{Subscription: subPath("pipe-exp-sub"), AckIds: ids[1:2], AckDeadlineSeconds: 1}); err != nil {
		t.Fatal(err)
	}
	data, ids = rs.nextData(2)
	if got := strings.Join(data, " "); got != "m1 m2" {
		t.Fatalf("after m1's lease ran out: %q, want m1 m2", got)
	}
	if _, err := subc.Acknowledge(context.Background(), &pb.AcknowledgeRequest{Subscription: subPath("pipe-exp-sub"), AckIds: ids}); err != nil {
		t.Fatal(err)
	}
	rs.quiet(500*time.Millisecond, "a message after every one was acked")
}

// Bad values of the label are refused, and it needs message ordering.
func TestPipelinedLabelChecked(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{})
	c := sc.GoClient()
	mustCreateTopic(t, c, "pipe-bad")
	for _, s := range []*pb.Subscription{
		{Name: subPath("bad-1"), Topic: topicPath("pipe-bad"), EnableMessageOrdering: true, Labels: map[string]string{"jetorder-ordering": "fast"}},
		{Name: subPath("bad-2"), Topic: topicPath("pipe-bad"), Labels: map[string]string{"jetorder-ordering": "pipelined"}},
	} {
		_, err := c.SubscriptionAdminClient.CreateSubscription(context.Background(), s)
		if err == nil || !strings.Contains(err.Error(), "InvalidArgument") || !strings.Contains(err.Error(), "jetorder-ordering") {
			t.Fatalf("CreateSubscription(%v): %v, want InvalidArgument naming jetorder-ordering", s.Labels, err)
		}
	}
}

// The ordering checker over many keys through Google's Go client with
// pipelined ordering: two clients with two streams each, random nacks.
// Every delivery is checked against pipelined ordering.
func TestPipelinedOrderingCheckerGoClient(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{})
	c := sc.GoClient()
	mustCreateTopic(t, c, "pipe-checked")
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("pipe-checked-sub"), Topic: topicPath("pipe-checked"), EnableMessageOrdering: true,
		Labels: pipelinedLabels})
	chk := ordercheck.NewPipelined()
	const sub = "pipe-checked-sub"
	var stops []func()
	for _, cl := range []*pubsub.Client{c, sc.GoClient()} {
		s := cl.Subscriber(sub)
		s.ReceiveSettings.NumGoroutines = 2
		// Leases of 10 s, not the client's 60: the messages the stopped
		// client leaves unsettled come back when their leases run out.
		s.ReceiveSettings.MaxDurationPerAckExtension = 10 * time.Second
		stops = append(stops, receiveGo(t, s, itest.CheckedHandler(chk, sub, 23)))
	}
	pub := c.Publisher("pipe-checked")
	pub.EnableMessageOrdering = true
	defer pub.Stop()
	var names []string // 16 keys and unkeyed
	for k := range 16 {
		names = append(names, fmt.Sprintf("key-%d", k))
	}
	names = append(names, "")
	itest.PublishChecked(t, pub, chk, names, 0, 60)
	// The second client stops mid-run: its streams end with keys' windows
	// out on them, which wait for those leases before going to the first.
	testutil.Eventually(t, 60*time.Second, func() bool { return chk.Stats(sub).Acks >= len(names)*60/3 },
		"a third never acked: %s", func() string { return chk.Missing(sub) })
	stops[1]()
	testutil.Eventually(t, 90*time.Second, func() bool { return chk.Complete(sub) },
		"not everything acked: %s", func() string { return chk.Missing(sub) })
	if v := chk.Violations(); len(v) > 0 {
		t.Fatalf("%d ordering violations, first: %s", len(v), strings.Join(v, "\n"))
	}
	st := chk.Stats(sub)
	t.Logf("%d deliveries, %d redeliveries, %d acks", st.Deliveries, st.Redeliveries, st.Acks)
}

// A library receiver with pipelined ordering dies with a window of a key
// out: its handlers returned without acking most of them, and one later
// ack waits behind an earlier unacked message. The receiver that takes
// over delivers the key again from its first unacked message, in order,
// the held-back ack's message included; every delivery is checked.
func TestPipelinedReceiverCrashMidWindow(t *testing.T) {
	opts := []adapter.Option{adapter.WithFailoverTimeout(3 * time.Second)}
	e := newEnv(t, opts...)
	topic := e.createTopic("pipe-crash")
	e.createSub("pipe-crash-sub", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, AckDeadline: 10 * time.Second,
		Delivery: adapter.DeliveryPartitioned, Partitions: 1})
	const sub, n = "pipe-crash-sub", 10
	chk := ordercheck.NewPipelined()
	ncA, cA := e.connect(opts...)
	_, cB := e.connect(opts...)

	out := make(chan *adapter.Message, n)
	subA := cA.Subscription(sub)
	subA.ReceiveSettings.Ordering = adapter.PipelinedOrdering
	startReceive(t, subA, func(ctx context.Context, m *adapter.Message) {
		key, idx, err := ordercheck.Decode(m.Data)
		if err != nil {
			chk.Fail("A: undecodable delivery %q: %v", m.Data, err)
			return
		}
		chk.Delivered(sub, key, idx)
		chk.Released(sub, key, idx) // returns unacked: the key's next may start
		select {
		case out <- m:
		case <-ctx.Done(): // a copy beyond the ten, as Receive ends
		}
	})
	for i := range n {
		chk.Published("k", i)
		publish(t, topic, string(ordercheck.Encode("k", i)), "k")
	}
	var got []*adapter.Message
	for len(got) < n { // all ten out at once: none was acked
		select {
		case m := <-out:
			got = append(got, m)
		case <-time.After(15 * time.Second):
			t.Fatalf("A got %d of %d messages without acking any", len(got), n)
		}
	}
	for _, i := range []int{0, 1, 4} { // 4's ack waits for 2 and 3
		chk.Acked(sub, "k", i)
		got[i].Ack()
	}
	ncA.Close() // A is gone, as far as NATS can tell
	chk.AcksMayBeLost()

	subB := cB.Subscription(sub)
	subB.ReceiveSettings.Ordering = adapter.PipelinedOrdering
	var mu sync.Mutex
	var atB []int
	startReceive(t, subB, func(_ context.Context, m *adapter.Message) {
		key, idx, _ := ordercheck.Decode(m.Data)
		chk.Delivered(sub, key, idx)
		mu.Lock()
		atB = append(atB, idx)
		mu.Unlock()
		chk.Acked(sub, key, idx)
		m.Ack()
	})
	testutil.Eventually(t, 30*time.Second, func() bool { return chk.Complete(sub) }, "not everything acked: %s", func() string { return chk.Missing(sub) })
	if v := chk.Violations(); len(v) > 0 {
		t.Fatalf("%d ordering violations, first: %s", len(v), strings.Join(v, "\n"))
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(atB, 4) {
		t.Fatalf("B got %v: message 4, acked at A behind unacked 2 and 3, must come again", atB)
	}
	t.Logf("B got %v", atB)
}
