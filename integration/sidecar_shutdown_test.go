package integration

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/sidecar"
)

// Shutdown keeps one deadline, --shutdown-timeout, however many things it
// waits for: here a StreamingPull client that holds a message and never
// acks it, and an HTTP publish stuck in flight (its body never comes).
// The sidecar stops within the timeout (and the embedded server's stop),
// the stream ends UNAVAILABLE, and the held message was handed back: after
// a restart it comes again at once, not after its 600s ack deadline.
func TestSidecarShutdownWithinDeadline(t *testing.T) {
	const timeout = 2 * time.Second
	dir := t.TempDir()
	sc := itest.Start(t, sidecar.Config{DataDir: dir, ShutdownTimeout: timeout})
	pubc, subc := sc.RawClients()
	ctx := context.Background()
	if _, err := pubc.CreateTopic(ctx, &pb.Topic{Name: topicPath("held")}); err != nil {
		t.Fatal(err)
	}
	if _, err := subc.CreateSubscription(ctx, &pb.Subscription{Name: subPath("held-sub"), Topic: topicPath("held"),
		EnableMessageOrdering: true, AckDeadlineSeconds: 600}); err != nil {
		t.Fatal(err)
	}
	if _, err := pubc.Publish(ctx, &pb.PublishRequest{Topic: topicPath("held"),
		Messages: []*pb.PubsubMessage{{Data: []byte("held"), OrderingKey: "k"}}}); err != nil {
		t.Fatal(err)
	}
	stream := openRawStream(t, subc, &pb.StreamingPullRequest{Subscription: subPath("held-sub"), StreamAckDeadlineSeconds: 600})
	if m := stream.next(); string(m.GetMessage().GetData()) != "held" {
		t.Fatalf("got %q, want held", m.GetMessage().GetData())
	}
	conn, err := net.Dial("tcp", sc.HTTP)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if _, err := fmt.Fprintf(conn, "POST /v1/topics/held:publish HTTP/1.1\r\nHost: sidecar\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"messages\""); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	sc.Stop()
	took := time.Since(start)
	t.Logf("shutdown took %v", took)
	if took > timeout+time.Second {
		t.Fatalf("shutdown took %v, want at most the %v timeout (and a second to stop the server)", took, timeout)
	}
	select {
	case err := <-stream.errc:
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("stream ended with %v, want UNAVAILABLE", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stream did not end with the sidecar")
	}

	sc = itest.Start(t, sidecar.Config{DataDir: dir, ShutdownTimeout: timeout})
	_, subc = sc.RawClients()
	stream = openRawStream(t, subc, &pb.StreamingPullRequest{Subscription: subPath("held-sub"), StreamAckDeadlineSeconds: 600})
	if m := stream.next(); string(m.GetMessage().GetData()) != "held" { // within 15s, not 600s
		t.Fatalf("after restart got %q, want held", m.GetMessage().GetData())
	}
}
