package integration

import (
	"context"
	"testing"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/jetorder/jetorder/internal/itest"
)

func topicPath(id string) string { return itest.TopicPath(id) }
func subPath(id string) string   { return itest.SubPath(id) }

func mustCreateTopic(t *testing.T, c *pubsub.Client, id string) {
	t.Helper()
	if _, err := c.TopicAdminClient.CreateTopic(context.Background(), &pb.Topic{Name: "projects/" + c.Project() + "/topics/" + id}); err != nil {
		t.Fatalf("CreateTopic(%s): %v", id, err)
	}
}

func mustCreateSub(t *testing.T, c *pubsub.Client, s *pb.Subscription) {
	t.Helper()
	itest.MustCreateSub(t, c, s)
}

// receiveGo is itest.ReceiveGo.
func receiveGo(t *testing.T, sub *pubsub.Subscriber, f func(context.Context, *pubsub.Message)) (stop func()) {
	t.Helper()
	return itest.ReceiveGo(t, sub, f)
}

// publishGo publishes and waits for the id.
func publishGo(t *testing.T, p *pubsub.Publisher, data, key string) string {
	t.Helper()
	id, err := p.Publish(context.Background(), &pubsub.Message{Data: []byte(data), OrderingKey: key}).Get(context.Background())
	if err != nil {
		t.Fatalf("Publish(%q, key %q): %v", data, key, err)
	}
	return id
}

func fieldMask(paths ...string) *fieldmaskpb.FieldMask { return &fieldmaskpb.FieldMask{Paths: paths} }
