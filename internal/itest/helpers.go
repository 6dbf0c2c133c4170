package itest

import (
	"context"
	"fmt"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/internal/testutil"
)

// Helpers the integration test packages share.

// TopicPath is the resource name of topic id in Project.
func TopicPath(id string) string { return "projects/" + Project + "/topics/" + id }

// SubPath is the resource name of subscription id in Project.
func SubPath(id string) string { return "projects/" + Project + "/subscriptions/" + id }

// MustCreateSub creates s through c, failing the test on an error.
func MustCreateSub(t testing.TB, c *pubsub.Client, s *pb.Subscription) {
	t.Helper()
	if _, err := c.SubscriptionAdminClient.CreateSubscription(context.Background(), s); err != nil {
		t.Fatalf("CreateSubscription(%s): %v", s.Name, err)
	}
}

// ReceiveGo runs a Go client Receive until the test ends, or until the
// function it returns is called; an error of Receive, or a Receive that
// does not return within 30 s of the call, fails the test.
func ReceiveGo(t testing.TB, sub *pubsub.Subscriber, f func(context.Context, *pubsub.Message)) (stop func()) {
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

// WaitClusterJetStream waits until the cluster's JetStream answers: a meta
// leader is elected.
func WaitClusterJetStream(t testing.TB, urls string) {
	t.Helper()
	nc, err := nats.Connect(urls, nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 60*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err == nil
	}, "the cluster's JetStream did not answer")
}

// LastLines is the end of a process's log, its last n lines, for a
// failure message.
func LastLines(log string, n int) string {
	lines := strings.Split(strings.TrimRight(log, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Percentiles describes d (sorted in place) by its median, 95th
// percentile and maximum.
func Percentiles(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	slices.Sort(d)
	at := func(q int) time.Duration { return d[min(len(d)-1, len(d)*q/100)].Round(time.Millisecond) }
	return fmt.Sprintf("p50 %v, p95 %v, max %v", at(50), at(95), d[len(d)-1].Round(time.Millisecond))
}

// DeliveryName names the delivery mode the tests run in (Delivery).
func DeliveryName() string {
	if Delivery == "" {
		return "partitioned (default)"
	}
	return string(Delivery)
}
