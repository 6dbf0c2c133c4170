package integration

import (
	"context"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
)

func topicPath(id string) string { return "projects/" + project + "/topics/" + id }
func subPath(id string) string   { return "projects/" + project + "/subscriptions/" + id }

func mustCreateTopic(t *testing.T, c *pubsub.Client, id string) {
	t.Helper()
	if _, err := c.TopicAdminClient.CreateTopic(context.Background(), &pb.Topic{Name: "projects/" + c.Project() + "/topics/" + id}); err != nil {
		t.Fatalf("CreateTopic(%s): %v", id, err)
	}
}

func mustCreateSub(t *testing.T, c *pubsub.Client, s *pb.Subscription) {
	t.Helper()
	if _, err := c.SubscriptionAdminClient.CreateSubscription(context.Background(), s); err != nil {
		t.Fatalf("CreateSubscription(%s): %v", s.Name, err)
	}
}

// receiveGo runs a Go client Receive until the test ends, or until the
// function it returns is called.
func receiveGo(t *testing.T, sub *pubsub.Subscriber, f func(context.Context, *pubsub.Message)) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Receive(ctx, f) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Receive: %v", err)
				}
			case <-time.After(30 * time.Second):
				var stacks strings.Builder
				_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
				t.Errorf("Receive did not return within 30s; the client's goroutines:\n%s", clientStacks(stacks.String()))
			}
		})
	}
	t.Cleanup(stop)
	return stop
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

// clientStacks keeps the goroutines of Google's Pub/Sub client from a
// goroutine dump (pprof debug=1).
func clientStacks(dump string) string {
	var out []string
	for g := range strings.SplitSeq(dump, "\n\n") {
		if strings.Contains(g, "cloud.google.com/go/pubsub") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}
