package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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

// The acceptance criteria AC-001..AC-010 of the message ordering
// specification again, through Google's Go client against the sidecar.
// One sidecar serves them all; each criterion has its own topic.
func TestSidecarAcceptanceCriteria(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{})
	c := sc.GoClient()
	ctx := context.Background()
	// setup creates topic T-<n> and ordered subscriptions on it, and an
	// ordering publisher.
	setup := func(t *testing.T, n string, subs ...string) *pubsub.Publisher {
		t.Helper()
		mustCreateTopic(t, c, "topic-"+n)
		for _, s := range subs {
			mustCreateSub(t, c, &pb.Subscription{Name: subPath(s + "-" + n), Topic: topicPath("topic-" + n), EnableMessageOrdering: true, AckDeadlineSeconds: 10})
		}
		p := c.Publisher("topic-" + n)
		p.EnableMessageOrdering = true
		t.Cleanup(p.Stop)
		return p
	}
	receive := func(t *testing.T, sub string, f func(context.Context, *pubsub.Message)) {
		t.Helper()
		receiveGo(t, c.Subscriber(sub), f)
	}

	t.Run("AC-001 publish with an ordering key", func(t *testing.T) {
		p := setup(t, "001")
		if id := publishGo(t, p, "event-1", "user-123"); id == "" {
			t.Fatal("empty message id")
		}
		if _, err := c.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: topicPath("topic-001")}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("AC-002 same key in order", func(t *testing.T) {
		p := setup(t, "002", "sub")
		var got recorder
		receive(t, "sub-002", func(_ context.Context, m *pubsub.Message) { got.add(string(m.Data)); m.Ack() })
		for _, s := range []string{"first", "second", "third"} {
			publishGo(t, p, s, "user-123")
		}
		testutil.Eventually(t, 15*time.Second, func() bool { return got.count() >= 3 }, "received %v", got.snapshot)
		if want := []string{"first", "second", "third"}; !slices.Equal(got.snapshot(), want) {
			t.Fatalf("received %v, want %v", got.snapshot(), want)
		}
	})

	t.Run("AC-003 one at a time per key", func(t *testing.T) {
		p := setup(t, "003", "sub")
		var conc concurrency
		var got recorder
		receive(t, "sub-003", func(_ context.Context, m *pubsub.Message) {
			conc.enter()
			time.Sleep(50 * time.Millisecond) // the handler's own work
			got.add(string(m.Data))
			conc.leave()
			m.Ack()
		})
		var want []string
		for i := range 5 {
			want = append(want, fmt.Sprint("msg-", i))
			publishGo(t, p, want[i], "user-123")
		}
		testutil.Eventually(t, 15*time.Second, func() bool { return got.count() >= 5 }, "received %v", got.snapshot)
		if m := conc.max.Load(); m != 1 {
			t.Fatalf("max concurrent handlers for one key = %d, want 1", m)
		}
		if !slices.Equal(got.snapshot(), want) {
			t.Fatalf("received %v, want %v", got.snapshot(), want)
		}
	})

	t.Run("AC-004 keys concurrently", func(t *testing.T) {
		p := setup(t, "004", "sub")
		var conc concurrency
		allIn := make(chan struct{})
		var once sync.Once
		receive(t, "sub-004", func(_ context.Context, m *pubsub.Message) {
			conc.enter()
			if conc.cur.Load() == 3 {
				once.Do(func() { close(allIn) })
			}
			select { // hold until all three keys are in their handlers
			case <-allIn:
			case <-time.After(10 * time.Second):
			}
			conc.leave()
			m.Ack()
		})
		for _, k := range []string{"user-1", "user-2", "user-3"} {
			publishGo(t, p, "msg-"+k, k)
		}
		select {
		case <-allIn:
		case <-time.After(15 * time.Second):
			t.Fatalf("three keys never in handlers at once (max %d)", conc.max.Load())
		}
	})

	t.Run("AC-005 an expired message comes again before the next", func(t *testing.T) {
		setup(t, "005")
		mustCreateSub(t, c, &pb.Subscription{Name: subPath("sub-005"), Topic: topicPath("topic-005"), EnableMessageOrdering: true, AckDeadlineSeconds: 1})
		pubc, subc := sc.RawClients()
		if _, err := pubc.Publish(ctx, &pb.PublishRequest{Topic: topicPath("topic-005"), Messages: []*pb.PubsubMessage{
			{Data: []byte("first"), OrderingKey: "user-123"}, {Data: []byte("second"), OrderingKey: "user-123"}}}); err != nil {
			t.Fatal(err)
		}
		// A client that never acks the first delivery and lets its lease
		// expire; Google's Go client would keep extending it instead.
		rs := openRawStream(t, subc, &pb.StreamingPullRequest{Subscription: subPath("sub-005"), StreamAckDeadlineSeconds: 1})
		var got []string
		for len(got) == 0 || got[len(got)-1] != "second" {
			m := rs.next()
			got = append(got, string(m.GetMessage().GetData()))
			if len(got) > 1 {
				if _, err := subc.Acknowledge(ctx, &pb.AcknowledgeRequest{Subscription: subPath("sub-005"), AckIds: []string{m.AckId}}); err != nil {
					t.Fatal(err)
				}
			}
		}
		if want := []string{"first", "first", "second"}; !slices.Equal(got, want) {
			t.Fatalf("deliveries %v, want %v", got, want)
		}
	})

	t.Run("AC-006 unkeyed not held back", func(t *testing.T) {
		p := setup(t, "006", "sub")
		var got recorder
		release := make(chan struct{})
		receive(t, "sub-006", func(_ context.Context, m *pubsub.Message) {
			got.add(string(m.Data))
			if m.OrderingKey != "" {
				<-release // keyed: held, unacked, until the test ends
				m.Nack()
				return
			}
			m.Ack()
		})
		t.Cleanup(func() { close(release) }) // runs before Receive's clean-up
		publishGo(t, p, "blocked", "user-123")
		publishGo(t, p, "blocked-2", "user-123")
		publishGo(t, p, "unordered", "")
		testutil.Eventually(t, 15*time.Second, func() bool { return got.contains("unordered") }, "unordered held back: %v", got.snapshot)
		if got.contains("blocked-2") {
			t.Fatalf("blocked-2 delivered while blocked is unacked: %v", got.snapshot())
		}
	})

	t.Run("AC-007 each subscription its own ordered copy", func(t *testing.T) {
		p := setup(t, "007", "sub-1", "sub-2")
		var got1, got2 recorder
		receive(t, "sub-1-007", func(_ context.Context, m *pubsub.Message) { got1.add(string(m.Data)); m.Ack() })
		receive(t, "sub-2-007", func(_ context.Context, m *pubsub.Message) { got2.add(string(m.Data)); m.Ack() })
		publishGo(t, p, "first", "user-123")
		publishGo(t, p, "second", "user-123")
		testutil.Eventually(t, 15*time.Second, func() bool { return got1.count() >= 2 && got2.count() >= 2 }, "received %v and %v", got1.snapshot, got2.snapshot)
		want := []string{"first", "second"}
		if !slices.Equal(got1.snapshot(), want) || !slices.Equal(got2.snapshot(), want) {
			t.Fatalf("sub-1 got %v, sub-2 got %v, want %v each", got1.snapshot(), got2.snapshot(), want)
		}
	})

	t.Run("AC-008 invalid keys refused with the specification's texts", func(t *testing.T) {
		setup(t, "008", "sub")
		pubc, subc := sc.RawClients()
		// A key that is not UTF-8 cannot be sent at all: proto3 strings are
		// UTF-8 on the wire, and gRPC refuses to marshal it.
		for _, tc := range []struct{ key, text string }{
			{strings.Repeat("x", 1025), "Ordering key exceeds maximum length of 1024 bytes"},
		} {
			_, err := pubc.Publish(ctx, &pb.PublishRequest{Topic: topicPath("topic-008"), Messages: []*pb.PubsubMessage{{Data: []byte("test"), OrderingKey: tc.key}}})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.text) {
				t.Errorf("key %.20q: %v, want INVALID_ARGUMENT %q", tc.key, err, tc.text)
			}
		}
		resp, err := subc.Pull(ctx, &pb.PullRequest{Subscription: subPath("sub-008"), MaxMessages: 10, ReturnImmediately: true})
		if err != nil || len(resp.GetReceivedMessages()) != 0 {
			t.Fatalf("refused publishes stored messages: %v, %v", resp.GetReceivedMessages(), err)
		}
	})

	t.Run("AC-009 no opt-in on the topic", func(t *testing.T) {
		p := setup(t, "009")
		if id := publishGo(t, p, "test", "user-123"); id == "" {
			t.Fatal("no message id")
		}
	})

	t.Run("AC-010 batched publishes keep per-key order", func(t *testing.T) {
		p := setup(t, "010", "sub")
		p.PublishSettings.CountThreshold = 10
		p.PublishSettings.DelayThreshold = 50 * time.Millisecond
		chk := ordercheck.New()
		var results []*pubsub.PublishResult
		counts := map[string]int{}
		for i := range 20 {
			key := fmt.Sprint("user-", i%5)
			results = append(results, p.Publish(ctx, &pubsub.Message{Data: ordercheck.Encode(key, counts[key]), OrderingKey: key}))
			chk.Published(key, counts[key])
			counts[key]++
		}
		ids := map[string]bool{}
		for i, r := range results {
			id, err := r.Get(ctx)
			if err != nil || id == "" {
				t.Fatalf("message %d: %q, %v", i, id, err)
			}
			ids[id] = true
		}
		if len(ids) != 20 {
			t.Fatalf("%d distinct ids for 20 messages", len(ids))
		}
		var delivered atomic.Int32
		receive(t, "sub-010", func(_ context.Context, m *pubsub.Message) {
			key, idx, err := ordercheck.Decode(m.Data)
			if err != nil {
				chk.Fail("undecodable %q", m.Data)
			}
			chk.Delivered("sub", key, idx)
			chk.Acked("sub", key, idx)
			delivered.Add(1)
			m.Ack()
		})
		testutil.Eventually(t, 15*time.Second, func() bool { return chk.Complete("sub") }, "missing: %s", func() string { return chk.Missing("sub") })
		if v := chk.Violations(); len(v) > 0 {
			t.Fatalf("violations: %v", v)
		}
	})
}
