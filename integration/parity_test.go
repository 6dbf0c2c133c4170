package integration

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
)

// The parity tests run one program through Google's Go client against the
// sidecar, against Google's official emulator (the reference where the
// service documents loosely, DESIGN.md) and against Google's in-memory fake
// (pstest), and assert the same answers wherever the other side implements
// the feature. Where the sidecar follows the service and the others do
// not, the test says so and asserts each side; docs/SIDECAR.md lists the
// differences.

// backend is a Pub/Sub server under test.
type backend struct {
	name     string
	client   *pubsub.Client
	fake     bool // Google's pstest
	emulator bool // Google's official emulator
}

// topic, sub and snapshot are resource names in the backend's project.
func (b backend) topic(id string) string    { return b.path("topics", id) }
func (b backend) sub(id string) string      { return b.path("subscriptions", id) }
func (b backend) snapshot(id string) string { return b.path("snapshots", id) }
func (b backend) path(kind, id string) string {
	return "projects/" + b.client.Project() + "/" + kind + "/" + id
}

// forBackends runs f against a new sidecar, Google's emulator (shared by
// the tests, a project each) and a new pstest server. Neither of Google's
// depends on the tests' delivery mode, so they run in the default pass
// only.
func forBackends(t *testing.T, f func(t *testing.T, b backend)) {
	t.Run("sidecar", func(t *testing.T) {
		sc := itest.Start(t, sidecar.Config{})
		f(t, backend{name: "sidecar", client: sc.GoClient()})
	})
	t.Run("emulator", func(t *testing.T) {
		skipPerKeyPass(t)
		f(t, backend{name: "emulator", client: itest.EmulatorClient(t), emulator: true})
	})
	t.Run("pstest", func(t *testing.T) {
		skipPerKeyPass(t)
		srv := pstest.NewServer()
		t.Cleanup(func() { _ = srv.Close() })
		f(t, backend{name: "pstest", client: itest.GoClient(t, srv.Addr), fake: true})
	})
}

// skipPerKeyPass skips a test of Google's servers in the per-key pass of
// make test (JETORDER_TEST_DELIVERY=per-key): they have no delivery modes.
func skipPerKeyPass(t *testing.T) {
	t.Helper()
	if itest.Delivery == adapter.DeliveryPerKey {
		t.Skip("Google's servers have no delivery modes: run in the default pass only (JETORDER_TEST_DELIVERY=per-key)")
	}
}

// receiveAll receives from sub until n messages have been acked, and
// returns them in the order received.
func receiveAll(t *testing.T, s *pubsub.Subscriber, n int, handle func(*pubsub.Message) bool) []*pubsub.Message {
	t.Helper()
	var mu sync.Mutex
	var got []*pubsub.Message
	stop := receiveGo(t, s, func(_ context.Context, m *pubsub.Message) {
		if handle != nil && !handle(m) {
			m.Nack()
			return
		}
		mu.Lock()
		got = append(got, m)
		mu.Unlock()
		m.Ack()
	})
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(got) }
	testutil.Eventually(t, 30*time.Second, func() bool { return count() >= n }, "received %d of %d", count, n)
	stop()
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(got)
}

// The Go client's documented "no limit", MaxOutstandingMessages -1 (and
// bytes -1), reaches the server as negative flow control: it means no
// limit, and messages flow.
func TestParityFlowControlNoLimit(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		c := b.client
		mustCreateTopic(t, c, "top")
		mustCreateSub(t, c, &pb.Subscription{Name: b.sub("sub"), Topic: b.topic("top"), EnableMessageOrdering: true})
		pub := c.Publisher("top")
		pub.EnableMessageOrdering = true
		defer pub.Stop()
		for i := range 3 {
			publishGo(t, pub, fmt.Sprint(i), "k")
		}
		s := c.Subscriber("sub")
		s.ReceiveSettings.MaxOutstandingMessages = -1
		s.ReceiveSettings.MaxOutstandingBytes = -1
		got := receiveAll(t, s, 3, nil)
		if data := []string{string(got[0].Data), string(got[1].Data), string(got[2].Data)}; !slices.Equal(data, []string{"0", "1", "2"}) {
			t.Fatalf("received %v", data)
		}
	})
}

// delivery_attempt is set only on a subscription with a dead-letter
// policy (the API: "If a dead letter policy is not set on the subscription,
// this will be 0"); the Go client shows 0 as nil.
func TestParityDeliveryAttempt(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		c := b.client
		mustCreateTopic(t, c, "top")
		mustCreateTopic(t, c, "dead")
		mustCreateSub(t, c, &pb.Subscription{Name: b.sub("plain-sub"), Topic: b.topic("top")})
		mustCreateSub(t, c, &pb.Subscription{Name: b.sub("dead-letter-sub"), Topic: b.topic("top"),
			DeadLetterPolicy: &pb.DeadLetterPolicy{DeadLetterTopic: b.topic("dead"), MaxDeliveryAttempts: 5}})
		pub := c.Publisher("top")
		defer pub.Stop()
		publishGo(t, pub, "x", "")
		for _, sub := range []string{"plain-sub", "dead-letter-sub"} {
			nacked := false
			var attempts []string
			got := receiveAll(t, c.Subscriber(sub), 1, func(m *pubsub.Message) bool {
				a := "nil"
				if m.DeliveryAttempt != nil {
					a = fmt.Sprint(*m.DeliveryAttempt)
				}
				attempts = append(attempts, a)
				if !nacked {
					nacked = true
					return false
				}
				return true
			})
			_ = got
			want := []string{"nil", "nil"}
			if sub == "dead-letter-sub" {
				want = []string{"1", "2"}
			}
			if sub == "dead-letter-sub" && b.fake {
				// pstest counts a message's deliveries to every
				// subscription together: these are 3 and 4.
				if len(attempts) != 2 || attempts[0] == "nil" || attempts[1] == "nil" {
					t.Errorf("%s: delivery attempts %v, want two set", sub, attempts)
				}
				continue
			}
			if !slices.Equal(attempts, want) {
				t.Errorf("%s: delivery attempts %v, want %v", sub, attempts, want)
			}
		}
	})
}

// Settings given at creation read back: a topic's labels, a
// subscription's retry policy; retentions under the service's 10 minutes
// are refused; updating a missing subscription is NOT_FOUND whatever the
// mask says.
func TestParitySettingsKept(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		c := b.client
		top, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: b.topic("top"), Labels: map[string]string{"team": "orders"}})
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: b.topic("top")})
		if err != nil || got.Labels["team"] != "orders" || top.Labels["team"] != "orders" {
			t.Fatalf("topic labels: created %v, got %v, %v", top.GetLabels(), got.GetLabels(), err)
		}
		retry := &pb.RetryPolicy{MinimumBackoff: durationpb.New(time.Second), MaximumBackoff: durationpb.New(time.Minute)}
		sub, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{Name: b.sub("sub"), Topic: b.topic("top"), RetryPolicy: retry})
		if err != nil {
			t.Fatal(err)
		}
		gs, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: b.sub("sub")})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []*pb.Subscription{sub, gs} {
			if s.GetRetryPolicy().GetMinimumBackoff().AsDuration() != time.Second || s.GetRetryPolicy().GetMaximumBackoff().AsDuration() != time.Minute {
				t.Errorf("retry policy read back as %v", s.GetRetryPolicy())
			}
			if s.GetMessageRetentionDuration().AsDuration() != 7*24*time.Hour {
				t.Errorf("default message_retention_duration %v, want 7 days", s.GetMessageRetentionDuration().AsDuration())
			}
		}
		_, err = c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: b.topic("short"), MessageRetentionDuration: durationpb.New(time.Second)})
		wantCode(t, "topic retention of 1s", err, codes.InvalidArgument)
		_, err = c.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{Name: b.sub("short"), Topic: b.topic("top"),
			MessageRetentionDuration: durationpb.New(time.Second)})
		wantCode(t, "subscription retention of 1s", err, codes.InvalidArgument)
		// The service's least expiration ttl is a day; Google's emulator
		// and pstest take less.
		_, err = c.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{Name: b.sub("brief"), Topic: b.topic("top"),
			MessageRetentionDuration: durationpb.New(10 * time.Minute), ExpirationPolicy: &pb.ExpirationPolicy{Ttl: durationpb.New(time.Hour)}})
		if b.emulator || b.fake {
			wantCode(t, b.name+"'s expiration ttl of an hour", err, codes.OK)
		} else {
			wantCode(t, "expiration ttl of an hour", err, codes.InvalidArgument)
		}
		_, err = c.SubscriptionAdminClient.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{
			Subscription: &pb.Subscription{Name: b.sub("missing"), AckDeadlineSeconds: 30}, UpdateMask: fieldMask("ack_deadline_seconds")})
		wantCode(t, "update of a missing subscription", err, codes.NotFound)
	})
}

// Updates: a topic's labels and retention; a subscription's ack deadline,
// retry policy, labels, retention, expiration, retained acks and dead
// letters, each read back. What cannot change is refused.
func TestParityUpdates(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		c := b.client
		mustCreateTopic(t, c, "top")
		mustCreateTopic(t, c, "dead")
		// Google's emulator updates neither a topic's nor a
		// subscription's labels ("labels is not a known Topic field"),
		// nor a subscription's expiration_policy ("currently
		// unsupported in the Pub/Sub Emulator"): the service does.
		topicMask, subMask := fieldMask("labels", "message_retention_duration"), fieldMask("ack_deadline_seconds", "retry_policy",
			"labels", "message_retention_duration", "retain_acked_messages", "expiration_policy", "dead_letter_policy")
		if b.emulator {
			_, err := c.TopicAdminClient.UpdateTopic(ctx, &pb.UpdateTopicRequest{Topic: &pb.Topic{Name: b.topic("top")}, UpdateMask: fieldMask("labels")})
			wantCode(t, "the emulator's update of a topic's labels", err, codes.InvalidArgument)
			topicMask = fieldMask("message_retention_duration")
			subMask = fieldMask("ack_deadline_seconds", "retry_policy", "message_retention_duration", "retain_acked_messages", "dead_letter_policy")
		}
		top, err := c.TopicAdminClient.UpdateTopic(ctx, &pb.UpdateTopicRequest{
			Topic:      &pb.Topic{Name: b.topic("top"), Labels: map[string]string{"env": "prod"}, MessageRetentionDuration: durationpb.New(time.Hour)},
			UpdateMask: topicMask})
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: b.topic("top")})
		for _, tp := range []*pb.Topic{top, got} {
			if err != nil || (tp.GetLabels()["env"] != "prod") != b.emulator || tp.GetMessageRetentionDuration().AsDuration() != time.Hour {
				t.Fatalf("topic after update: %v, %v", tp, err)
			}
		}
		_, err = c.TopicAdminClient.UpdateTopic(ctx, &pb.UpdateTopicRequest{
			Topic: &pb.Topic{Name: b.topic("top"), MessageRetentionDuration: durationpb.New(time.Second)}, UpdateMask: fieldMask("message_retention_duration")})
		wantCode(t, "topic retention of 1s", err, codes.InvalidArgument)

		mustCreateSub(t, c, &pb.Subscription{Name: b.sub("sub"), Topic: b.topic("top"), EnableMessageOrdering: true})
		if b.emulator {
			for _, unsupported := range []string{"labels", "expiration_policy"} {
				_, err := c.SubscriptionAdminClient.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{
					Subscription: &pb.Subscription{Name: b.sub("sub")}, UpdateMask: fieldMask(unsupported)})
				wantCode(t, "the emulator's update of "+unsupported, err, codes.InvalidArgument)
			}
		}
		in := &pb.Subscription{
			Name:                     b.sub("sub"),
			AckDeadlineSeconds:       42,
			RetryPolicy:              &pb.RetryPolicy{MinimumBackoff: durationpb.New(2 * time.Second), MaximumBackoff: durationpb.New(20 * time.Second)},
			Labels:                   map[string]string{"owner": "billing"},
			MessageRetentionDuration: durationpb.New(2 * time.Hour),
			RetainAckedMessages:      true,
			ExpirationPolicy:         &pb.ExpirationPolicy{Ttl: durationpb.New(48 * time.Hour)},
			DeadLetterPolicy:         &pb.DeadLetterPolicy{DeadLetterTopic: b.topic("dead"), MaxDeliveryAttempts: 7},
		}
		if !b.fake { // the delivery mode's label stays as it was created
			created, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: b.sub("sub")})
			if err != nil {
				t.Fatal(err)
			}
			in.Labels["jetorder-delivery"] = created.Labels["jetorder-delivery"]
		}
		up, err := c.SubscriptionAdminClient.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{Subscription: in,
			UpdateMask: subMask})
		if err != nil {
			t.Fatal(err)
		}
		gs, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: b.sub("sub")})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []*pb.Subscription{up, gs} {
			if s.AckDeadlineSeconds != 42 || s.GetRetryPolicy().GetMaximumBackoff().AsDuration() != 20*time.Second ||
				(s.GetLabels()["owner"] != "billing") != b.emulator || s.GetMessageRetentionDuration().AsDuration() != 2*time.Hour || !s.RetainAckedMessages ||
				(s.GetExpirationPolicy().GetTtl().AsDuration() != 48*time.Hour) != b.emulator || s.GetDeadLetterPolicy().GetMaxDeliveryAttempts() != 7 {
				t.Fatalf("subscription after update: %v", s)
			}
		}
		// Removing the retry policy.
		up, err = c.SubscriptionAdminClient.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{
			Subscription: &pb.Subscription{Name: b.sub("sub")}, UpdateMask: fieldMask("retry_policy")})
		if err != nil || up.RetryPolicy != nil {
			t.Fatalf("retry policy removed: %v, %v", up.GetRetryPolicy(), err)
		}
		_, err = c.SubscriptionAdminClient.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{
			Subscription: &pb.Subscription{Name: b.sub("sub"), AckDeadlineSeconds: 601}, UpdateMask: fieldMask("ack_deadline_seconds")})
		if b.fake {
			wantCode(t, "ack deadline 601", err, codes.Unknown) // pstest answers Unknown
		} else {
			wantCode(t, "ack deadline 601", err, codes.InvalidArgument)
		}
		_, err = c.SubscriptionAdminClient.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{
			Subscription: &pb.Subscription{Name: b.sub("sub"), Filter: `attributes:x`}, UpdateMask: fieldMask("filter")})
		if b.fake {
			if err != nil {
				t.Fatalf("pstest refused a filter update: %v", err)
			}
		} else { // the service: "After creating the subscription, you can't modify the filter."
			wantCode(t, "filter update", err, codes.InvalidArgument)
		}
		_, err = c.SubscriptionAdminClient.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{
			Subscription: &pb.Subscription{Name: b.sub("sub")}, UpdateMask: fieldMask("no_such_field")})
		wantCode(t, "unknown field", err, codes.InvalidArgument)
	})
}

// Deleting a topic leaves its subscriptions naming "_deleted-topic_", as
// in the service, also once a topic of that name is created again.
func TestParityDeletedTopic(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		c := b.client
		mustCreateTopic(t, c, "top")
		mustCreateSub(t, c, &pb.Subscription{Name: b.sub("sub"), Topic: b.topic("top")})
		if err := c.TopicAdminClient.DeleteTopic(ctx, &pb.DeleteTopicRequest{Topic: b.topic("top")}); err != nil {
			t.Fatal(err)
		}
		gs, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: b.sub("sub")})
		if err != nil {
			t.Fatal(err)
		}
		const want = "_deleted-topic_"
		if gs.Topic != want {
			t.Fatalf("topic of the subscription: %q, want %q", gs.Topic, want)
		}
		// Created again, the topic is a new one: the subscription stays detached from it.
		mustCreateTopic(t, c, "top")
		if gs, err = c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: b.sub("sub")}); err != nil || gs.Topic != want {
			t.Fatalf("after the topic is created again: %v, %v", gs.GetTopic(), err)
		}
	})
}

// DetachSubscription: the subscription stays, detached, and receives
// nothing more.
func TestParityDetach(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		c := b.client
		mustCreateTopic(t, c, "top")
		mustCreateSub(t, c, &pb.Subscription{Name: b.sub("sub"), Topic: b.topic("top")})
		_, err := c.TopicAdminClient.DetachSubscription(ctx, &pb.DetachSubscriptionRequest{Subscription: b.sub("sub")})
		if b.emulator {
			wantCode(t, "the emulator's DetachSubscription", err, codes.Unimplemented)
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.TopicAdminClient.DetachSubscription(ctx, &pb.DetachSubscriptionRequest{Subscription: b.sub("missing")})
		wantCode(t, "detach a missing subscription", err, codes.NotFound)
		if b.fake {
			return // pstest drops the subscription from its topic and reports nothing more
		}
		gs, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: b.sub("sub")})
		if err != nil || !gs.Detached {
			t.Fatalf("after detach: %v, %v", gs, err)
		}
		_, err = c.SubscriptionAdminClient.Pull(ctx, &pb.PullRequest{Subscription: b.sub("sub"), MaxMessages: 1})
		wantCode(t, "pull of a detached subscription", err, codes.FailedPrecondition)
	})
}

// A filter delivers only what matches; what does not match never reaches
// the client and never holds its key.
func TestParityFilter(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		c := b.client
		mustCreateTopic(t, c, "top")
		_, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{Name: b.sub("bad"), Topic: b.topic("top"), Filter: `attributes.x = `})
		if b.emulator {
			wantCode(t, "the emulator's bad filter", err, codes.OK) // it checks no filter at creation
		} else {
			wantCode(t, "a bad filter", err, codes.InvalidArgument)
		}
		const f = `attributes.kind = "order" AND NOT attributes:test`
		mustCreateSub(t, c, &pb.Subscription{Name: b.sub("sub"), Topic: b.topic("top"), EnableMessageOrdering: true, Filter: f})
		gs, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: b.sub("sub")})
		if err != nil || gs.Filter != f {
			t.Fatalf("filter read back: %q, %v", gs.GetFilter(), err)
		}
		pub := c.Publisher("top")
		pub.EnableMessageOrdering = true
		defer pub.Stop()
		var want []string
		for i := range 12 {
			attrs := map[string]string{"kind": "order"}
			switch i % 3 {
			case 1:
				attrs["kind"] = "refund"
			case 2:
				attrs["test"] = ""
			default:
				want = append(want, fmt.Sprint(i))
			}
			if _, err := pub.Publish(ctx, &pubsub.Message{Data: []byte(fmt.Sprint(i)), OrderingKey: "k", Attributes: attrs}).Get(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if b.emulator {
			// Google's emulator keeps a filter and applies none.
			want = want[:0]
			for i := range 12 {
				want = append(want, fmt.Sprint(i))
			}
		}
		got := receiveAll(t, c.Subscriber("sub"), len(want), nil)
		var data []string
		for _, m := range got {
			data = append(data, string(m.Data))
		}
		if !slices.Equal(data, want) {
			t.Fatalf("received %v, want %v", data, want)
		}
	})
}

// The client's gzip compression of publish requests.
func TestParityGzip(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		c := b.client
		mustCreateTopic(t, c, "top")
		mustCreateSub(t, c, &pb.Subscription{Name: b.sub("sub"), Topic: b.topic("top")})
		pub := c.Publisher("top")
		pub.PublishSettings.EnableCompression = true
		pub.PublishSettings.CompressionBytesThreshold = 10
		defer pub.Stop()
		data := strings.Repeat("compressible ", 1000)
		publishGo(t, pub, data, "")
		got := receiveAll(t, c.Subscriber("sub"), 1, nil)
		if string(got[0].Data) != data {
			t.Fatalf("received %d bytes, want the %d published", len(got[0].Data), len(data))
		}
	})
}

// A message near the service's 10 MB request limit (the Go client refuses
// one whose data alone is 10,000,000 bytes: with the request's framing it
// is over), more than the 8 MiB the sidecar refused before, is published
// and delivered.
func TestParityTenMegabytes(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		if b.fake {
			t.Skip("pstest's gRPC server keeps grpc-go's 4 MiB limit on requests")
		}
		c := b.client
		mustCreateTopic(t, c, "top")
		mustCreateSub(t, c, &pb.Subscription{Name: b.sub("sub"), Topic: b.topic("top")})
		pub := c.Publisher("top")
		defer pub.Stop()
		data := bytes.Repeat([]byte{0xa5}, 9_900_000)
		if _, err := pub.Publish(context.Background(), &pubsub.Message{Data: data, Attributes: map[string]string{"a": "b"}}).Get(context.Background()); err != nil {
			t.Fatalf("publish %d bytes: %v", len(data), err)
		}
		got := receiveAll(t, c.Subscriber("sub"), 1, nil)
		if !bytes.Equal(got[0].Data, data) {
			t.Fatalf("received %d bytes, want %d", len(got[0].Data), len(data))
		}
	})
}

// A retry policy delays a nacked message's redelivery by its backoff, and
// the key's next message waits for it.
func TestSidecarRetryPolicyBackoff(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{})
	c := sc.GoClient()
	mustCreateTopic(t, c, "top")
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("sub"), Topic: topicPath("top"), EnableMessageOrdering: true,
		RetryPolicy: &pb.RetryPolicy{MinimumBackoff: durationpb.New(2 * time.Second), MaximumBackoff: durationpb.New(10 * time.Second)}})
	pub := c.Publisher("top")
	pub.EnableMessageOrdering = true
	defer pub.Stop()
	publishGo(t, pub, "first", "k")
	publishGo(t, pub, "second", "k")
	type delivery struct {
		data string
		at   time.Time
	}
	var mu sync.Mutex
	var seen []delivery
	nacked := false
	got := receiveAll(t, c.Subscriber("sub"), 2, func(m *pubsub.Message) bool {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, delivery{string(m.Data), time.Now()})
		if !nacked {
			nacked = true
			return false
		}
		return true
	})
	if string(got[0].Data) != "first" || string(got[1].Data) != "second" {
		t.Fatalf("acked %q then %q", got[0].Data, got[1].Data)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 3 || seen[0].data != "first" || seen[1].data != "first" {
		t.Fatalf("deliveries %v: want first, first (after the backoff), second", seen)
	}
	if gap := seen[1].at.Sub(seen[0].at); gap < 1900*time.Millisecond {
		t.Fatalf("redelivered %v after the nack, before the 2s minimum backoff", gap)
	}
}

// gRPC health answers SERVING once NATS is ready, and reflection lists
// the Pub/Sub services.
func TestSidecarHealthAndReflection(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{})
	conn := sc.Conn()
	ctx := context.Background()
	hc := healthpb.NewHealthClient(conn)
	for _, svc := range []string{"", "google.pubsub.v1.Publisher", "google.pubsub.v1.Subscriber"} {
		var resp *healthpb.HealthCheckResponse
		var err error
		testutil.Eventually(t, 10*time.Second, func() bool {
			resp, err = hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
			return err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING
		}, "health of %q: %v, %v", svc, func() any { return resp }, func() any { return err })
	}
	rc, err := rpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Send(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := rc.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	for _, want := range []string{"google.pubsub.v1.Publisher", "google.pubsub.v1.Subscriber", "grpc.health.v1.Health"} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v, without %s", names, want)
		}
	}
}

// With jetorder-ordering: pipelined, a key's next message reaches Google's
// Go client once the client's handler of the previous one has returned,
// acked or not, as the service (and Google's emulator) sends them. pstest
// keeps to stop-and-wait whatever the labels: the next message comes once
// the previous one is acked. All deliver the key in order.
func TestParityPipelinedOrdering(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		c := b.client
		mustCreateTopic(t, c, "pipe-parity")
		mustCreateSub(t, c, &pb.Subscription{Name: b.sub("pipe-parity-sub"), Topic: b.topic("pipe-parity"),
			EnableMessageOrdering: true, AckDeadlineSeconds: 60, Labels: pipelinedLabels})
		pub := c.Publisher("pipe-parity")
		pub.EnableMessageOrdering = true
		defer pub.Stop()
		for _, d := range []string{"m0", "m1", "m2"} {
			publishGo(t, pub, d, "k")
		}
		got := make(chan *pubsub.Message, 10)
		receiveGo(t, c.Subscriber("pipe-parity-sub"), func(_ context.Context, m *pubsub.Message) { got <- m }) // acked below
		next := func(want string) *pubsub.Message {
			t.Helper()
			select {
			case m := <-got:
				if string(m.Data) != want {
					t.Fatalf("%s delivered %q, want %q", b.name, m.Data, want)
				}
				return m
			case <-time.After(15 * time.Second):
				t.Fatalf("%s: %s not delivered within 15s", b.name, want)
			}
			return nil
		}
		m0 := next("m0")
		if b.fake {
			// What is asserted is an absence: the one wait of this test.
			select {
			case m := <-got:
				t.Fatalf("pstest delivered %q while m0 was unacked", m.Data)
			case <-time.After(time.Second):
			}
			m0.Ack()
			next("m1").Ack()
			next("m2").Ack()
			return
		}
		m1 := next("m1") // m0 not acked yet: its handler has returned
		m2 := next("m2")
		m0.Ack()
		m1.Ack()
		m2.Ack()
	})
}

// A topic's message_storage_policy is kept and returned, and replaced or
// removed by UpdateTopic; a policy without regions, or with a region that
// is not a region name, is refused, as the service refuses it.
// Google's emulator keeps what it is given at creation, checks nothing,
// and cannot update it.
func TestParityMessageStoragePolicy(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		admin := b.client.TopicAdminClient
		policy := &pb.MessageStoragePolicy{AllowedPersistenceRegions: []string{"us-east1", "europe-west4"}, EnforceInTransit: true}
		created, err := admin.CreateTopic(ctx, &pb.Topic{Name: b.topic("stored"), MessageStoragePolicy: policy})
		if err != nil {
			t.Fatal(err)
		}
		expect := func(what string, returned *pb.Topic, want *pb.MessageStoragePolicy) {
			t.Helper()
			got, err := admin.GetTopic(ctx, &pb.GetTopicRequest{Topic: b.topic("stored")})
			if err != nil {
				t.Fatal(err)
			}
			for _, tp := range []*pb.Topic{returned, got} {
				if tp != nil && !proto.Equal(tp.GetMessageStoragePolicy(), want) {
					t.Errorf("%s: message_storage_policy %v, want %v", what, tp.GetMessageStoragePolicy(), want)
				}
			}
		}
		expect("created", created, policy)

		_, err = admin.CreateTopic(ctx, &pb.Topic{Name: b.topic("nowhere"),
			MessageStoragePolicy: &pb.MessageStoragePolicy{AllowedPersistenceRegions: []string{"not a region"}}})
		if b.emulator || b.fake {
			wantCode(t, b.name+"'s policy with a bad region", err, codes.OK)
		} else {
			wantCode(t, "a policy with a bad region", err, codes.InvalidArgument)
		}

		update := func(p *pb.MessageStoragePolicy) (*pb.Topic, error) {
			return admin.UpdateTopic(ctx, &pb.UpdateTopicRequest{Topic: &pb.Topic{Name: b.topic("stored"), MessageStoragePolicy: p},
				UpdateMask: fieldMask("message_storage_policy")})
		}
		other := &pb.MessageStoragePolicy{AllowedPersistenceRegions: []string{"asia-east1"}}
		up, err := update(other)
		if b.emulator {
			wantCode(t, "the emulator's update of message_storage_policy", err, codes.InvalidArgument)
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		expect("updated", up, other)
		if b.fake {
			return // pstest takes an update as given
		}
		_, err = update(&pb.MessageStoragePolicy{AllowedPersistenceRegions: []string{"us-east1", "Mars"}})
		wantCode(t, "an update with a bad region", err, codes.InvalidArgument)
		expect("after a refused update", nil, other) // nil: only GetTopic
		_, err = update(&pb.MessageStoragePolicy{})
		wantCode(t, "an update to no region", err, codes.InvalidArgument)
		up, err = update(nil)
		if err != nil {
			t.Fatal(err)
		}
		expect("removed", up, nil)
	})
}
