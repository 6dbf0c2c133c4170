package access

import (
	"context"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/sidecar"
)

func topicPath(id string) string { return "projects/" + itest.Project + "/topics/" + id }
func subPath(id string) string   { return "projects/" + itest.Project + "/subscriptions/" + id }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Errorf("%s: %v (%s), want %s", what, err, got, want)
	}
}

// Google's Go client with a token over TLS: the admin creates, the
// publisher publishes, the viewer may not publish, a caller without a
// token is UNAUTHENTICATED.
func TestGoClientTokenOverTLS(t *testing.T) {
	a := itest.NewAccess(t)
	sc := itest.Start(t, sidecar.Config{}, itest.WithAccess(a))
	ctx := ctxT(t)
	admin := sc.GoClientAs(a.Token("admin"))
	if _, err := admin.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topicPath("topic-a")}); err != nil {
		t.Fatalf("admin CreateTopic: %v", err)
	}
	pub := sc.GoClientAs(a.Token("publisher")).Publisher("topic-a")
	defer pub.Stop()
	if _, err := pub.Publish(ctx, pubsubMessage("hello")).Get(ctx); err != nil {
		t.Errorf("publisher Publish: %v", err)
	}
	viewer := sc.GoClientAs(a.Token("viewer")).Publisher("topic-a")
	defer viewer.Stop()
	_, err := viewer.Publish(ctx, pubsubMessage("no")).Get(ctx)
	wantCode(t, "viewer Publish", err, codes.PermissionDenied)
	if _, err := sc.GoClientAs(a.Token("viewer")).TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: topicPath("topic-a")}); err != nil {
		t.Errorf("viewer GetTopic: %v", err)
	}
	_, err = pb.NewPublisherClient(sc.ConnAs("")).GetTopic(ctx, &pb.GetTopicRequest{Topic: topicPath("topic-a")})
	wantCode(t, "GetTopic without a token", err, codes.Unauthenticated)
	_, err = pb.NewPublisherClient(sc.ConnAs("not-a-token-anyone-has")).GetTopic(ctx, &pb.GetTopicRequest{Topic: topicPath("topic-a")})
	wantCode(t, "GetTopic with an unknown token", err, codes.Unauthenticated)
}
