package integration

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
)

// Google's Go client, configured only by PUBSUB_EMULATOR_HOST, creates a
// topic and an ordered subscription, publishes and receives in order.
func TestSidecarEmulatorHost(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{})
	t.Setenv("PUBSUB_EMULATOR_HOST", sc.GRPC)
	c, err := pubsub.NewClient(context.Background(), project)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() }) // after Receive ends: cleanups run last-registered first
	mustCreateTopic(t, c, "orders")
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("orders-sub"), Topic: topicPath("orders"), EnableMessageOrdering: true})

	pub := c.Publisher("orders")
	pub.EnableMessageOrdering = true
	defer pub.Stop()
	var want []string
	for i := range 5 {
		want = append(want, fmt.Sprintf("event-%d", i))
		publishGo(t, pub, want[i], "user-123")
	}
	var got recorder
	receiveGo(t, c.Subscriber("orders-sub"), func(_ context.Context, m *pubsub.Message) {
		if m.OrderingKey == "user-123" {
			got.add(string(m.Data))
		}
		m.Ack()
	})
	testutil.Eventually(t, 20*time.Second, func() bool { return got.count() >= 5 }, "received %v", got.snapshot)
	if !slices.Equal(got.snapshot(), want) {
		t.Fatalf("received %v, want %v", got.snapshot(), want)
	}
	sub, err := c.SubscriptionAdminClient.GetSubscription(context.Background(), &pb.GetSubscriptionRequest{Subscription: subPath("orders-sub")})
	if err != nil || !sub.EnableMessageOrdering || sub.Topic != topicPath("orders") || sub.AckDeadlineSeconds != 10 {
		t.Fatalf("GetSubscription = %v, %v", sub, err)
	}
}

// The ordering checker over many keys through Google's Go client: two
// subscriptions, one of them received by two clients with two streams
// each, with random nacks. Every delivery is checked.
func TestSidecarOrderingCheckerGoClient(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{})
	c := sc.GoClient()
	mustCreateTopic(t, c, "checked")
	for _, s := range []string{"sub-a", "sub-b"} {
		mustCreateSub(t, c, &pb.Subscription{Name: subPath(s), Topic: topicPath("checked"), EnableMessageOrdering: true})
	}
	chk := ordercheck.New()
	for _, cl := range []*pubsub.Client{c, sc.GoClient()} {
		s := cl.Subscriber("sub-a")
		s.ReceiveSettings.NumGoroutines = 2
		receiveGo(t, s, itest.CheckedHandler(chk, "sub-a", 17))
	}
	receiveGo(t, c.Subscriber("sub-b"), itest.CheckedHandler(chk, "sub-b", 17))

	pub := c.Publisher("checked")
	pub.EnableMessageOrdering = true
	defer pub.Stop()
	const keys, msgs = 32, 30
	var names []string // 32 keys, some with bytes a NATS subject cannot hold as they are, and unkeyed
	for k := range keys {
		names = append(names, fmt.Sprintf("key-%d.%s", k, strings.Repeat(">", k%3)))
	}
	names = append(names, "")
	itest.PublishChecked(t, pub, chk, names, 0, msgs)
	testutil.Eventually(t, 90*time.Second, func() bool { return chk.Complete("sub-a") && chk.Complete("sub-b") },
		"not everything acked: sub-a: %s; sub-b: %s", func() string { return chk.Missing("sub-a") }, func() string { return chk.Missing("sub-b") })
	if v := chk.Violations(); len(v) > 0 {
		t.Fatalf("%d ordering violations, first: %s", len(v), strings.Join(v, "\n"))
	}
	for _, s := range []string{"sub-a", "sub-b"} {
		st := chk.Stats(s)
		t.Logf("%s: %d deliveries, %d redeliveries, %d acks", s, st.Deliveries, st.Redeliveries, st.Acks)
	}
}

// rawStream is a StreamingPull stream driven by hand.
type rawStream struct {
	t      *testing.T
	stream pb.Subscriber_StreamingPullClient
	msgs   chan *pb.ReceivedMessage
	props  chan *pb.StreamingPullResponse_SubscriptionProperties
	errc   chan error
}

func openRawStream(t *testing.T, sub pb.SubscriberClient, first *pb.StreamingPullRequest) *rawStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := sub.StreamingPull(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(first); err != nil {
		t.Fatal(err)
	}
	r := &rawStream{t: t, stream: stream, msgs: make(chan *pb.ReceivedMessage, 10000),
		props: make(chan *pb.StreamingPullResponse_SubscriptionProperties, 100), errc: make(chan error, 1)}
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				r.errc <- err
				return
			}
			select {
			case r.props <- resp.GetSubscriptionProperties():
			default:
			}
			for _, m := range resp.GetReceivedMessages() {
				r.msgs <- m
			}
		}
	}()
	return r
}

// next returns the next delivered message, failing after 15s.
func (r *rawStream) next() *pb.ReceivedMessage {
	r.t.Helper()
	select {
	case m := <-r.msgs:
		return m
	case err := <-r.errc:
		r.t.Fatalf("stream ended: %v", err)
	case <-time.After(15 * time.Second):
		r.t.Fatal("no message within 15s")
	}
	return nil
}

// quiet asserts that nothing is delivered for d: the one place these tests
// wait out a period, because what they assert is an absence.
func (r *rawStream) quiet(d time.Duration, why string) {
	r.t.Helper()
	select {
	case m := <-r.msgs:
		r.t.Fatalf("%s: got %q (key %q)", why, m.GetMessage().GetData(), m.GetMessage().GetOrderingKey())
	case <-time.After(d):
	}
}

// The sidecar itself holds a key's next message until the previous one is
// acked: a raw client that takes everything it is given gets one message
// per key; an ack lets that key's next one come, a nack brings the same
// message again, and unkeyed messages are not held back.
func TestSidecarHoldsEachKeyUntilAck(t *testing.T) {
	pubc, subc := startCountingAttempts(t, "held", 60)
	var msgs []*pb.PubsubMessage
	for i := range 3 {
		msgs = append(msgs, &pb.PubsubMessage{Data: []byte(fmt.Sprintf("a%d", i)), OrderingKey: "a"},
			&pb.PubsubMessage{Data: []byte(fmt.Sprintf("b%d", i)), OrderingKey: "b"},
			&pb.PubsubMessage{Data: []byte(fmt.Sprintf("u%d", i))})
	}
	if _, err := pubc.Publish(context.Background(), &pb.PublishRequest{Topic: topicPath("held"), Messages: msgs}); err != nil {
		t.Fatal(err)
	}
	rs := openRawStream(t, subc, &pb.StreamingPullRequest{Subscription: subPath("held-sub"), StreamAckDeadlineSeconds: 60, ProtocolVersion: 1})
	first := map[string]*pb.ReceivedMessage{}
	var unkeyed []string
	for len(first) < 2 || len(unkeyed) < 3 {
		m := rs.next()
		k := m.GetMessage().GetOrderingKey()
		if k == "" {
			unkeyed = append(unkeyed, string(m.GetMessage().GetData()))
			continue
		}
		if prev, ok := first[k]; ok {
			t.Fatalf("key %s: got %q while %q is unacked", k, m.GetMessage().GetData(), prev.GetMessage().GetData())
		}
		first[k] = m
	}
	if string(first["a"].GetMessage().GetData()) != "a0" || string(first["b"].GetMessage().GetData()) != "b0" {
		t.Fatalf("first deliveries %q, %q", first["a"].GetMessage().GetData(), first["b"].GetMessage().GetData())
	}
	if p := <-rs.props; !p.GetMessageOrderingEnabled() {
		t.Fatal("subscription_properties.message_ordering_enabled not set")
	}
	rs.quiet(300*time.Millisecond, "a key's second message while its first is unacked")

	// Ack a0: a1 comes. Nack b0: b0 comes again, attempt 2.
	if _, err := subc.Acknowledge(context.Background(), &pb.AcknowledgeRequest{Subscription: subPath("held-sub"), AckIds: []string{first["a"].AckId}}); err != nil {
		t.Fatal(err)
	}
	if m := rs.next(); string(m.GetMessage().GetData()) != "a1" {
		t.Fatalf("after acking a0 got %q, want a1", m.GetMessage().GetData())
	}
	if _, err := subc.ModifyAckDeadline(context.Background(), &pb.ModifyAckDeadlineRequest{Subscription: subPath("held-sub"), AckIds: []string{first["b"].AckId}}); err != nil {
		t.Fatal(err)
	}
	if m := rs.next(); string(m.GetMessage().GetData()) != "b0" || m.GetDeliveryAttempt() != 2 {
		t.Fatalf("after nacking b0 got %q attempt %d, want b0 attempt 2", m.GetMessage().GetData(), m.GetDeliveryAttempt())
	}
}

// A lease runs out after the stream's ack deadline and the message comes
// again before the next of its key; ModifyAckDeadline extends a lease past
// the subscription's ack deadline (JetStream's AckWait).
func TestSidecarLeaseExpiryAndExtension(t *testing.T) {
	pubc, subc := startCountingAttempts(t, "leases", 1)
	if _, err := pubc.Publish(context.Background(), &pb.PublishRequest{Topic: topicPath("leases"), Messages: []*pb.PubsubMessage{
		{Data: []byte("m0"), OrderingKey: "k"}, {Data: []byte("m1"), OrderingKey: "k"}}}); err != nil {
		t.Fatal(err)
	}
	rs := openRawStream(t, subc, &pb.StreamingPullRequest{Subscription: subPath("leases-sub"), StreamAckDeadlineSeconds: 1})
	m := rs.next()
	if string(m.GetMessage().GetData()) != "m0" {
		t.Fatalf("got %q, want m0", m.GetMessage().GetData())
	}
	// Not acked: after about a second it comes again, attempt 2.
	m = rs.next()
	if string(m.GetMessage().GetData()) != "m0" || m.GetDeliveryAttempt() != 2 {
		t.Fatalf("after expiry got %q attempt %d, want m0 attempt 2", m.GetMessage().GetData(), m.GetDeliveryAttempt())
	}
	// Extend to 3s, three times the subscription's deadline.
	extended := time.Now()
	if _, err := subc.ModifyAckDeadline(context.Background(), &pb.ModifyAckDeadlineRequest{Subscription: subPath("leases-sub"), AckIds: []string{m.AckId}, AckDeadlineSeconds: 3}); err != nil {
		t.Fatal(err)
	}
	m = rs.next()
	if waited := time.Since(extended); waited < 2500*time.Millisecond {
		t.Fatalf("redelivered %v after a 3s extension", waited)
	}
	if string(m.GetMessage().GetData()) != "m0" || m.GetDeliveryAttempt() != 3 {
		t.Fatalf("after the extension ran out got %q attempt %d, want m0 attempt 3", m.GetMessage().GetData(), m.GetDeliveryAttempt())
	}
	if _, err := subc.Acknowledge(context.Background(), &pb.AcknowledgeRequest{Subscription: subPath("leases-sub"), AckIds: []string{m.AckId}}); err != nil {
		t.Fatal(err)
	}
	if m = rs.next(); string(m.GetMessage().GetData()) != "m1" || m.GetDeliveryAttempt() != 1 {
		t.Fatalf("after the ack got %q attempt %d, want m1 attempt 1", m.GetMessage().GetData(), m.GetDeliveryAttempt())
	}
}

// A stream's max_outstanding_messages bounds what it is handed: more comes
// only as messages are acked.
func TestSidecarStreamFlowControl(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{})
	c := sc.GoClient()
	mustCreateTopic(t, c, "flow")
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("flow-sub"), Topic: topicPath("flow"), AckDeadlineSeconds: 60})
	pubc, subc := sc.RawClients()
	var msgs []*pb.PubsubMessage
	for i := range 10 {
		msgs = append(msgs, &pb.PubsubMessage{Data: []byte(fmt.Sprint(i))})
	}
	if _, err := pubc.Publish(context.Background(), &pb.PublishRequest{Topic: topicPath("flow"), Messages: msgs}); err != nil {
		t.Fatal(err)
	}
	rs := openRawStream(t, subc, &pb.StreamingPullRequest{Subscription: subPath("flow-sub"), StreamAckDeadlineSeconds: 60, MaxOutstandingMessages: 3})
	var held []string
	for range 3 {
		held = append(held, rs.next().AckId)
	}
	rs.quiet(300*time.Millisecond, "a fourth message beyond max_outstanding_messages 3")
	if _, err := subc.Acknowledge(context.Background(), &pb.AcknowledgeRequest{Subscription: subPath("flow-sub"), AckIds: held[:2]}); err != nil {
		t.Fatal(err)
	}
	rs.next()
	rs.next()
	rs.quiet(300*time.Millisecond, "more than 3 outstanding after acking 2")
}

// Ack ids are authenticated: a tampered, made-up or foreign one is refused
// with INVALID_ARGUMENT and changes nothing; valid ids beside it are
// applied, each on its own.
func TestSidecarRefusesForgedAckIDs(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{})
	c := sc.GoClient()
	mustCreateTopic(t, c, "acks")
	for _, s := range []string{"acks-sub", "other-sub"} {
		mustCreateSub(t, c, &pb.Subscription{Name: subPath(s), Topic: topicPath("acks"), EnableMessageOrdering: true, AckDeadlineSeconds: 60})
	}
	pubc, subc := sc.RawClients()
	var msgs []*pb.PubsubMessage
	for i := range 10 {
		msgs = append(msgs, &pb.PubsubMessage{Data: fmt.Appendf(nil, "m%d", i), OrderingKey: "k"})
	}
	if _, err := pubc.Publish(context.Background(), &pb.PublishRequest{Topic: topicPath("acks"), Messages: msgs}); err != nil {
		t.Fatal(err)
	}
	rs := openRawStream(t, subc, &pb.StreamingPullRequest{Subscription: subPath("acks-sub"), StreamAckDeadlineSeconds: 60})
	other := openRawStream(t, subc, &pb.StreamingPullRequest{Subscription: subPath("other-sub"), StreamAckDeadlineSeconds: 60})
	m := rs.next()
	foreign := other.next().AckId
	tampered := []byte(m.AckId)
	tampered[3] ^= 1
	for i, bad := range []string{"x", string(tampered), foreign, strings.Repeat("A", len(m.AckId)), "jetorder.projects.test-project.>", m.AckId + "A"} {
		// Alone, nothing happens: m stays leased, so nothing of its key comes.
		_, err := subc.ModifyAckDeadline(context.Background(), &pb.ModifyAckDeadlineRequest{Subscription: subPath("acks-sub"), AckIds: []string{bad}, AckDeadlineSeconds: 0})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "invalid ack id") {
			t.Fatalf("ModifyAckDeadline with %q = %v, want INVALID_ARGUMENT invalid ack id", bad, err)
		}
		// Beside a valid id: that one is applied, the call still fails.
		_, err = subc.Acknowledge(context.Background(), &pb.AcknowledgeRequest{Subscription: subPath("acks-sub"), AckIds: []string{bad, m.AckId}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "invalid ack id") {
			t.Fatalf("Acknowledge with %q = %v, want INVALID_ARGUMENT invalid ack id", bad, err)
		}
		next := rs.next()
		if want := fmt.Sprintf("m%d", i+1); string(next.GetMessage().GetData()) != want {
			t.Fatalf("after acking %s beside %q got %s, want %s", m.GetMessage().GetData(), bad, next.GetMessage().GetData(), want)
		}
		m = next
	}
}

// Ack ids outlive the process that issued them: after a restart, an ack of
// an earlier process's ack id is applied to the message it names: to the
// lease that holds it again, or, for a message without an ordering key, to
// the message when it is delivered again (a keyed one of an ordered
// subscription is delivered again, as Pub/Sub redelivers a key's later
// messages after a redelivery); in a batch with ids of the new process and
// forged ones, each valid id is applied.
func TestSidecarAckIDsAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	first := itest.Start(t, sidecar.Config{DataDir: dir})
	c := first.GoClient()
	mustCreateTopic(t, c, "restart-acks")
	// A long deadline: what the first process handed out comes back at once
	// all the same, as its stop hands it back.
	for _, s := range []string{"held-sub", "later-sub"} {
		mustCreateSub(t, c, &pb.Subscription{Name: subPath(s), Topic: topicPath("restart-acks"), EnableMessageOrdering: true, AckDeadlineSeconds: 60})
	}
	pubc, subc := first.RawClients()
	msgs := []*pb.PubsubMessage{{Data: []byte("u0")}}
	for _, k := range []string{"a", "b"} {
		for i := range 2 {
			msgs = append(msgs, &pb.PubsubMessage{Data: fmt.Appendf(nil, "%s%d", k, i), OrderingKey: k})
		}
	}
	if _, err := pubc.Publish(context.Background(), &pb.PublishRequest{Topic: topicPath("restart-acks"), Messages: msgs}); err != nil {
		t.Fatal(err)
	}
	// The first process hands out u0, a0 and b0 on both subscriptions.
	stale := map[string]map[string]string{} // subscription -> data -> ack id
	for _, sub := range []string{"held-sub", "later-sub"} {
		rs := openRawStream(t, subc, &pb.StreamingPullRequest{Subscription: subPath(sub), StreamAckDeadlineSeconds: 60})
		stale[sub] = map[string]string{}
		for range 3 {
			m := rs.next()
			stale[sub][string(m.GetMessage().GetData())] = m.AckId
		}
	}
	first.Stop() // hands them back: they come again at once

	second := itest.Start(t, sidecar.Config{DataDir: dir})
	_, subc = second.RawClients()
	// later-sub: u0 and a0 acked before anything is delivered again. u0's
	// ack waits for its redelivery, which then never reaches a client; a0
	// comes again.
	if _, err := subc.Acknowledge(context.Background(), &pb.AcknowledgeRequest{Subscription: subPath("later-sub"),
		AckIds: []string{stale["later-sub"]["u0"], stale["later-sub"]["a0"]}}); err != nil {
		t.Fatalf("Acknowledge of an earlier process's ack ids: %v", err)
	}
	later := openRawStream(t, subc, &pb.StreamingPullRequest{Subscription: subPath("later-sub"), StreamAckDeadlineSeconds: 60})
	got := map[string]string{} // data -> ack id
	for len(got) < 4 {
		m := later.next()
		data := string(m.GetMessage().GetData())
		got[data] = m.AckId
		switch data {
		case "u0":
			t.Fatal("later-sub: u0 delivered again after its ack with the old ack id")
		case "a0", "b0":
			if _, err := subc.Acknowledge(context.Background(), &pb.AcknowledgeRequest{Subscription: subPath("later-sub"), AckIds: []string{m.AckId}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got["a0"] == "" || got["b0"] == "" || got["a1"] == "" || got["b1"] == "" {
		t.Fatalf("later-sub after the restart got %v, want a0, b0, a1 and b1", slices.Sorted(maps.Keys(got)))
	}
	later.quiet(300*time.Millisecond, "u0 after its ack with the old ack id")

	// held-sub: a0 and b0 are held again by the second process; a batch of
	// a0's old id, b0's new one and a forged id acks both.
	held := openRawStream(t, subc, &pb.StreamingPullRequest{Subscription: subPath("held-sub"), StreamAckDeadlineSeconds: 60})
	fresh := map[string]string{}
	for range 3 {
		m := held.next()
		fresh[string(m.GetMessage().GetData())] = m.AckId
	}
	if fresh["a0"] == "" || fresh["b0"] == "" || fresh["u0"] == "" {
		t.Fatalf("held-sub after the restart got %v, want u0, a0 and b0 again", fresh)
	}
	_, err := subc.Acknowledge(context.Background(), &pb.AcknowledgeRequest{Subscription: subPath("held-sub"),
		AckIds: []string{stale["held-sub"]["a0"], fresh["b0"], "forged"}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Acknowledge of a mixed batch = %v, want INVALID_ARGUMENT for the forged id", err)
	}
	next := map[string]bool{}
	for range 2 {
		next[string(held.next().GetMessage().GetData())] = true
	}
	if !next["a1"] || !next["b1"] {
		t.Fatalf("held-sub after the mixed batch got %v, want a1 and b1: both valid ids applied", next)
	}
	// A deadline change of an old id does nothing.
	if _, err := subc.ModifyAckDeadline(context.Background(), &pb.ModifyAckDeadlineRequest{Subscription: subPath("held-sub"),
		AckIds: []string{stale["held-sub"]["b0"]}, AckDeadlineSeconds: 0}); err != nil {
		t.Fatalf("ModifyAckDeadline of an old ack id: %v", err)
	}
}

// A graceful stop hands back at once what clients hold unacked and what
// waits for a client: after a restart on the same data dir it is delivered
// again long before its ack deadline, and a key's next message still waits
// for the one held before it.
func TestSidecarStopHandsBackLeases(t *testing.T) {
	dir := t.TempDir()
	first := itest.Start(t, sidecar.Config{DataDir: dir})
	c := first.GoClient()
	mustCreateTopic(t, c, "handback")
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("handback-sub"), Topic: topicPath("handback"), EnableMessageOrdering: true, AckDeadlineSeconds: 60})
	pubc, subc := first.RawClients()
	msgs := []*pb.PubsubMessage{
		{Data: []byte("a0"), OrderingKey: "a"}, {Data: []byte("a1"), OrderingKey: "a"}, {Data: []byte("b0"), OrderingKey: "b"},
	}
	if _, err := pubc.Publish(context.Background(), &pb.PublishRequest{Topic: topicPath("handback"), Messages: msgs}); err != nil {
		t.Fatal(err)
	}
	// The client holds one of a0 and b0 without acking; the other waits in
	// the sidecar for room in the client's flow control.
	rs := openRawStream(t, subc, &pb.StreamingPullRequest{Subscription: subPath("handback-sub"), StreamAckDeadlineSeconds: 60, MaxOutstandingMessages: 1})
	if data := string(rs.next().GetMessage().GetData()); data != "a0" && data != "b0" {
		t.Fatalf("first delivery %q, want a0 or b0", data)
	}
	first.Stop()

	// Well within the 60s deadline (next waits at most 15s): a0 and b0
	// again, and a1 only after a0 is acked.
	second := itest.Start(t, sidecar.Config{DataDir: dir})
	_, subc = second.RawClients()
	rs = openRawStream(t, subc, &pb.StreamingPullRequest{Subscription: subPath("handback-sub"), StreamAckDeadlineSeconds: 60})
	got := map[string]string{} // data -> ack id
	for len(got) < 2 {
		m := rs.next()
		data := string(m.GetMessage().GetData())
		if data != "a0" && data != "b0" || got[data] != "" {
			t.Fatalf("after the restart got %q; a0 and b0 came back: %t, %t", data, got["a0"] != "", got["b0"] != "")
		}
		got[data] = m.AckId
	}
	rs.quiet(300*time.Millisecond, "a1 while a0 is unacked")
	if _, err := subc.Acknowledge(context.Background(), &pb.AcknowledgeRequest{Subscription: subPath("handback-sub"), AckIds: []string{got["a0"]}}); err != nil {
		t.Fatal(err)
	}
	if m := rs.next(); string(m.GetMessage().GetData()) != "a1" {
		t.Fatalf("after acking a0 got %q, want a1", m.GetMessage().GetData())
	}
}

// Bad requests get the status code that says what is wrong, and change
// nothing.
func TestSidecarBadRequests(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{})
	c := sc.GoClient()
	mustCreateTopic(t, c, "bad")
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("bad-sub"), Topic: topicPath("bad"), EnableMessageOrdering: true})
	pubc, subc := sc.RawClients()
	ctx := context.Background()
	long := strings.Repeat("k", 1025)
	cases := []struct {
		name string
		call func() error
		code codes.Code
		text string
	}{
		{"topic name", func() error { _, err := pubc.GetTopic(ctx, &pb.GetTopicRequest{Topic: "topics/bad"}); return err }, codes.InvalidArgument, "invalid topic name"},
		{"topic id", func() error { _, err := pubc.CreateTopic(ctx, &pb.Topic{Name: topicPath("a.b>")}); return err }, codes.InvalidArgument, "invalid topic name"},
		{"project", func() error { _, err := pubc.ListTopics(ctx, &pb.ListTopicsRequest{Project: "projects/"}); return err }, codes.InvalidArgument, "invalid project name"},
		{"unknown topic", func() error { _, err := pubc.GetTopic(ctx, &pb.GetTopicRequest{Topic: topicPath("nope")}); return err }, codes.NotFound, "topic not found"},
		{"existing topic", func() error { _, err := pubc.CreateTopic(ctx, &pb.Topic{Name: topicPath("bad")}); return err }, codes.AlreadyExists, "exists"},
		{"publish to unknown", func() error {
			_, err := pubc.Publish(ctx, &pb.PublishRequest{Topic: topicPath("nope"), Messages: []*pb.PubsubMessage{{Data: []byte("x")}}})
			return err
		}, codes.NotFound, "topic not found"},
		{"long key", func() error {
			_, err := pubc.Publish(ctx, &pb.PublishRequest{Topic: topicPath("bad"), Messages: []*pb.PubsubMessage{{Data: []byte("x"), OrderingKey: long}}})
			return err
		}, codes.InvalidArgument, "Ordering key exceeds maximum length of 1024 bytes"},
		{"no messages", func() error { _, err := pubc.Publish(ctx, &pb.PublishRequest{Topic: topicPath("bad")}); return err }, codes.InvalidArgument, "no messages"},
		{"empty message", func() error {
			_, err := pubc.Publish(ctx, &pb.PublishRequest{Topic: topicPath("bad"), Messages: []*pb.PubsubMessage{{}}})
			return err
		}, codes.InvalidArgument, "neither data nor attributes"},
		{"oversized message", func() error {
			_, err := pubc.Publish(ctx, &pb.PublishRequest{Topic: topicPath("bad"), Messages: []*pb.PubsubMessage{{Data: make([]byte, 10<<20+1)}}})
			return err
		}, codes.InvalidArgument, "the request is larger than"},
		{"reserved attribute after a good message", func() error {
			_, err := pubc.Publish(ctx, &pb.PublishRequest{Topic: topicPath("bad"), Messages: []*pb.PubsubMessage{
				{Data: []byte("good"), OrderingKey: "k"}, {Data: []byte("x"), Attributes: map[string]string{"googx": "1"}}}})
			return err
		}, codes.InvalidArgument, "messages[1]: invalid message: attribute key \"googx\": the prefix \"goog\" is reserved"},
		{"subscription name", func() error {
			_, err := subc.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: "projects/p/topics/t"})
			return err
		}, codes.InvalidArgument, "invalid subscription name"},
		{"unknown subscription", func() error {
			_, err := subc.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: subPath("nope")})
			return err
		}, codes.NotFound, "subscription not found"},
		{"subscription of unknown topic", func() error {
			_, err := subc.CreateSubscription(ctx, &pb.Subscription{Name: subPath("sub-2"), Topic: topicPath("nope")})
			return err
		}, codes.NotFound, "topic not found"},
		{"ack deadline", func() error {
			_, err := subc.CreateSubscription(ctx, &pb.Subscription{Name: subPath("sub-3"), Topic: topicPath("bad"), AckDeadlineSeconds: 601})
			return err
		}, codes.InvalidArgument, "ack_deadline_seconds"},
		{"push", func() error {
			_, err := subc.CreateSubscription(ctx, &pb.Subscription{Name: subPath("sub-4"), Topic: topicPath("bad"), PushConfig: &pb.PushConfig{PushEndpoint: "https://x"}})
			return err
		}, codes.InvalidArgument, "push"},
		{"ordering is immutable", func() error {
			_, err := subc.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{Subscription: &pb.Subscription{Name: subPath("bad-sub")}, UpdateMask: fieldMask("enable_message_ordering")})
			return err
		}, codes.InvalidArgument, "enable_message_ordering cannot be changed"},
		{"pull max_messages", func() error {
			_, err := subc.Pull(ctx, &pb.PullRequest{Subscription: subPath("bad-sub")})
			return err
		}, codes.InvalidArgument, "max_messages"},
		{"pull unknown", func() error {
			_, err := subc.Pull(ctx, &pb.PullRequest{Subscription: subPath("nope"), MaxMessages: 1})
			return err
		}, codes.NotFound, "subscription not found"},
		{"modify deadline", func() error {
			_, err := subc.ModifyAckDeadline(ctx, &pb.ModifyAckDeadlineRequest{Subscription: subPath("bad-sub"), AckIds: []string{"x"}, AckDeadlineSeconds: 601})
			return err
		}, codes.InvalidArgument, "ack_deadline_seconds"},
		{"streaming pull name", func() error {
			s, err := subc.StreamingPull(ctx)
			if err == nil {
				err = s.Send(&pb.StreamingPullRequest{Subscription: "nope"})
			}
			if err == nil {
				_, err = s.Recv()
			}
			return err
		}, codes.InvalidArgument, "invalid subscription name"},
		{"streaming pull unknown", func() error {
			s, err := subc.StreamingPull(ctx)
			if err == nil {
				err = s.Send(&pb.StreamingPullRequest{Subscription: subPath("nope")})
			}
			if err == nil {
				_, err = s.Recv()
			}
			return err
		}, codes.NotFound, "subscription not found"},
	}
	for _, tc := range cases {
		err := tc.call()
		if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.text) {
			t.Errorf("%s: got %v, want %v containing %q", tc.name, err, tc.code, tc.text)
		}
	}
	// Nothing was published by any of them.
	resp, err := subc.Pull(ctx, &pb.PullRequest{Subscription: subPath("bad-sub"), MaxMessages: 10, ReturnImmediately: true})
	if err != nil || len(resp.GetReceivedMessages()) != 0 {
		t.Fatalf("after bad requests Pull = %v, %v; want nothing", resp.GetReceivedMessages(), err)
	}
}

// Messages published before a sidecar restart on the same data dir are all
// delivered after it, in order per key.
func TestSidecarRestartLosesNothing(t *testing.T) {
	dir := t.TempDir()
	sc := itest.Start(t, sidecar.Config{DataDir: dir})
	c := sc.GoClient()
	mustCreateTopic(t, c, "durable")
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("durable-sub"), Topic: topicPath("durable"), EnableMessageOrdering: true})
	pub := c.Publisher("durable")
	pub.EnableMessageOrdering = true
	chk := ordercheck.New()
	var keys []string
	for k := range 8 {
		keys = append(keys, fmt.Sprintf("k%d", k))
	}
	itest.PublishChecked(t, pub, chk, keys, 0, 25)
	pub.Stop()
	_ = c.Close()
	sc.Stop()

	sc = itest.Start(t, sidecar.Config{DataDir: dir})
	c = sc.GoClient()
	receiveGo(t, c.Subscriber("durable-sub"), itest.CheckedHandler(chk, "durable-sub", 0))
	testutil.Eventually(t, 60*time.Second, func() bool { return chk.Complete("durable-sub") }, "missing after restart: %s",
		func() string { return chk.Missing("durable-sub") })
	if v := chk.Violations(); len(v) > 0 {
		t.Fatalf("%d violations, first: %s", len(v), v[0])
	}
}

// After max_delivery_attempts a message moves to the dead-letter topic,
// with the source's attributes, and its key moves on in order. The metrics
// count what happened.
func TestSidecarDeadLetterAndMetrics(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{})
	c := sc.GoClient()
	mustCreateTopic(t, c, "work")
	mustCreateTopic(t, c, "dead")
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("dead-sub"), Topic: topicPath("dead")})
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("work-sub"), Topic: topicPath("work"), EnableMessageOrdering: true, AckDeadlineSeconds: 60,
		DeadLetterPolicy: &pb.DeadLetterPolicy{DeadLetterTopic: topicPath("dead"), MaxDeliveryAttempts: 5}})
	got, err := c.SubscriptionAdminClient.GetSubscription(context.Background(), &pb.GetSubscriptionRequest{Subscription: subPath("work-sub")})
	if err != nil || got.GetDeadLetterPolicy().GetMaxDeliveryAttempts() != 5 || got.GetDeadLetterPolicy().GetDeadLetterTopic() != topicPath("dead") {
		t.Fatalf("GetSubscription = %v, %v", got, err)
	}
	pubc, subc := sc.RawClients()
	if _, err := pubc.Publish(context.Background(), &pb.PublishRequest{Topic: topicPath("work"), Messages: []*pb.PubsubMessage{
		{Data: []byte("poison"), OrderingKey: "k", Attributes: map[string]string{"a": "1"}}, {Data: []byte("next"), OrderingKey: "k"}}}); err != nil {
		t.Fatal(err)
	}
	rs := openRawStream(t, subc, &pb.StreamingPullRequest{Subscription: subPath("work-sub"), StreamAckDeadlineSeconds: 60})
	for attempt := 1; attempt <= 5; attempt++ {
		m := rs.next()
		if string(m.GetMessage().GetData()) != "poison" || m.GetDeliveryAttempt() != int32(attempt) {
			t.Fatalf("delivery %d: %q attempt %d", attempt, m.GetMessage().GetData(), m.GetDeliveryAttempt())
		}
		if _, err := subc.ModifyAckDeadline(context.Background(), &pb.ModifyAckDeadlineRequest{Subscription: subPath("work-sub"), AckIds: []string{m.AckId}}); err != nil {
			t.Fatal(err)
		}
	}
	if m := rs.next(); string(m.GetMessage().GetData()) != "next" || m.GetDeliveryAttempt() != 1 {
		t.Fatalf("after 5 attempts got %q attempt %d, want next attempt 1", m.GetMessage().GetData(), m.GetDeliveryAttempt())
	}
	var dead *pb.ReceivedMessage
	testutil.Eventually(t, 15*time.Second, func() bool {
		resp, err := subc.Pull(context.Background(), &pb.PullRequest{Subscription: subPath("dead-sub"), MaxMessages: 10})
		if err == nil && len(resp.GetReceivedMessages()) > 0 {
			dead = resp.GetReceivedMessages()[0]
		}
		return dead != nil
	}, "nothing on the dead-letter topic")
	attrs := dead.GetMessage().GetAttributes()
	if string(dead.GetMessage().GetData()) != "poison" || dead.GetMessage().GetOrderingKey() != "k" || attrs["a"] != "1" ||
		attrs["CloudPubSubDeadLetterSourceSubscription"] != subPath("work-sub") || attrs["CloudPubSubDeadLetterSourceDeliveryCount"] != "5" {
		t.Fatalf("dead letter = %q key %q attributes %v", dead.GetMessage().GetData(), dead.GetMessage().GetOrderingKey(), attrs)
	}

	var m testutil.Metrics
	sub := []string{"subscription", subPath("work-sub")}
	// The move is counted just after it is stored.
	testutil.Eventually(t, 10*time.Second, func() bool {
		m = testutil.Scrape(t, "http://"+sc.HTTP+"/metrics")
		v, _ := m.Value("jetorder_dead_lettered_total", sub...)
		return v == 1
	}, "metrics do not count the dead letter")
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"jetorder_nacked_total", sub, 5},
		{"jetorder_redelivered_total", sub, 4},
		{"jetorder_published_total", []string{"topic", topicPath("work")}, 2},
		{"jetorder_streaming_pull_streams", sub, 1},
	} {
		if v, ok := m.Value(c.name, c.labels...); !ok || v != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, v, ok, c.want)
		}
	}
	if _, ok := m.Value("jetorder_live_consumers"); !ok {
		t.Error("no jetorder_live_consumers")
	}
}

// startCountingAttempts starts a sidecar with topic id and an ordered
// subscription id+"-sub" of it with the given ack deadline and a
// dead-letter policy (to id+"-dead"), so that deliveries carry their
// attempt, and returns raw clients of it.
func startCountingAttempts(t *testing.T, id string, ackDeadlineSeconds int32) (pb.PublisherClient, pb.SubscriberClient) {
	t.Helper()
	sc := itest.Start(t, sidecar.Config{})
	c := sc.GoClient()
	mustCreateTopic(t, c, id)
	mustCreateTopic(t, c, id+"-dead")
	mustCreateSub(t, c, &pb.Subscription{Name: subPath(id + "-sub"), Topic: topicPath(id), EnableMessageOrdering: true, AckDeadlineSeconds: ackDeadlineSeconds,
		DeadLetterPolicy: &pb.DeadLetterPolicy{DeadLetterTopic: topicPath(id + "-dead"), MaxDeliveryAttempts: 100}})
	return sc.RawClients()
}
