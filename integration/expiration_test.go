package integration

import (
	"context"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
)

// expiration_policy through Google's Go client, as the service applies
// it: a subscription idle for its ttl is deleted; an update or an attached
// stream is activity; a policy without a ttl never expires; without a
// policy the ttl is 31 days. The sidecar's expiration clock is moved on
// instead of waiting days (sidecar.Config.ExpirationClock); a
// subscription expires once idle past its ttl and the hour to which
// activity is recorded.
func TestSidecarSubscriptionExpiration(t *testing.T) {
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	sc := itest.Start(t, sidecar.Config{ExpirationCheck: 20 * time.Millisecond, ExpirationClock: clock})
	c := sc.GoClient()
	ctx := context.Background()
	admin := c.SubscriptionAdminClient
	mustCreateTopic(t, c, "top")
	day := &pb.ExpirationPolicy{Ttl: durationpb.New(24 * time.Hour)}
	for _, s := range []*pb.Subscription{
		{Name: subPath("idle"), ExpirationPolicy: day},
		{Name: subPath("updated"), ExpirationPolicy: day},
		{Name: subPath("streamed"), ExpirationPolicy: day},
		{Name: subPath("never"), ExpirationPolicy: &pb.ExpirationPolicy{}},
		{Name: subPath("default")},
	} {
		s.Topic = topicPath("top")
		if s.ExpirationPolicy.GetTtl() != nil {
			s.MessageRetentionDuration = durationpb.New(10 * time.Minute) // a ttl is not shorter
		}
		mustCreateSub(t, c, s)
	}
	receiveGo(t, c.Subscriber("streamed"), func(_ context.Context, m *pubsub.Message) { m.Ack() })
	exists := func(id string) bool {
		t.Helper()
		_, err := admin.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: subPath(id)})
		if status.Code(err) != codes.NotFound && err != nil {
			t.Fatalf("GetSubscription(%s): %v", id, err)
		}
		return err == nil
	}
	// expires waits for id to be deleted, and checks that the others are
	// still there.
	expires := func(id string, others ...string) {
		t.Helper()
		testutil.Eventually(t, 10*time.Second, func() bool { return !exists(id) }, "%s not expired", id)
		for _, o := range others {
			if !exists(o) {
				t.Fatalf("%s expired with %s", o, id)
			}
		}
	}

	advance(20 * time.Hour)
	if _, err := admin.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{
		Subscription: &pb.Subscription{Name: subPath("updated"), AckDeadlineSeconds: 30}, UpdateMask: fieldMask("ack_deadline_seconds")}); err != nil {
		t.Fatal(err)
	}
	advance(6 * time.Hour) // idle: 26 hours without activity
	expires("idle", "updated", "streamed", "never", "default")
	advance(20 * time.Hour) // updated: 26 hours since its update
	expires("updated", "streamed", "never", "default")
	advance(31 * 24 * time.Hour)
	expires("default", "streamed", "never")
}
