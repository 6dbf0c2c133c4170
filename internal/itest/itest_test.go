package itest

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
)

// roundTrip creates topic id and an ordered subscription of it through c,
// publishes two keys' messages checked and receives them all in order.
func roundTrip(t *testing.T, c *pubsub.Client, id string) {
	t.Helper()
	ctx := context.Background()
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: "projects/" + Project + "/topics/" + id}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{Name: "projects/" + Project + "/subscriptions/" + id,
		Topic: "projects/" + Project + "/topics/" + id, EnableMessageOrdering: true}); err != nil {
		t.Fatal(err)
	}
	chk := ordercheck.New()
	pub := c.Publisher(id)
	pub.EnableMessageOrdering = true
	defer pub.Stop()
	PublishChecked(t, pub, chk, []string{"a", "b", ""}, 0, 5)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Subscriber(id).Receive(rctx, CheckedHandler(chk, id, 3)) }()
	testutil.Eventually(t, 30*time.Second, func() bool { return chk.Complete(id) }, "not acked: %s", func() string { return chk.Missing(id) })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Receive: %v", err)
	}
	if v := chk.Violations(); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
}

func TestInProcess(t *testing.T) {
	s := Start(t, sidecar.Config{NATSListen: "127.0.0.1:0"})
	roundTrip(t, s.GoClient(), "in-process")
	if len(s.Metrics()) == 0 {
		t.Fatal("/metrics has no metrics")
	}
	if _, err := s.JetStream().AccountInfo(context.Background()); err != nil {
		t.Fatal(err)
	}

	// A restart keeps the data dir and the addresses.
	grpcAddr, natsURL := s.GRPC, s.NATS
	s = s.Restart()
	if s.GRPC != grpcAddr || s.NATS != natsURL {
		t.Fatalf("restarted on %s %s, want %s %s", s.GRPC, s.NATS, grpcAddr, natsURL)
	}
	pubc, _ := s.RawClients()
	if _, err := pubc.GetTopic(context.Background(), &pb.GetTopicRequest{Topic: "projects/" + Project + "/topics/in-process"}); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
}

func TestTLS(t *testing.T) {
	certs := testutil.NewCerts(t)
	s := Start(t, sidecar.Config{}, TLS(certs))
	roundTrip(t, s.GoClient(), "tls")
	// Plaintext gets nowhere.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := pb.NewPublisherClient(Dial(t, s.GRPC)).GetTopic(ctx, &pb.GetTopicRequest{Topic: "projects/" + Project + "/topics/tls"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("plaintext GetTopic: %v, want UNAVAILABLE", err)
	}
}

func TestStartErr(t *testing.T) {
	addr := FreeAddr(t)
	Start(t, sidecar.Config{GRPCAddr: addr})
	s, err := StartErr(t, sidecar.Config{GRPCAddr: addr})
	if s != nil || err == nil || errors.Is(err, ErrNotReady) || errors.Is(err, ErrEnded) {
		t.Fatalf("a second sidecar on %s: %v, %v; want Run's error", addr, s, err)
	}
}

func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the sidecar")
	}
	s := Start(t, sidecar.Config{}, Binary(BuildSidecar(t)), Flags("--log-format", "json"), Env("JETORDER_LOG_LEVEL=debug"))
	roundTrip(t, s.GoClient(Patient()...), "binary")
	if log := s.Log(); !strings.Contains(log, `"level":"DEBUG"`) {
		t.Fatalf("neither the flag nor the environment reached the binary:\n%s", log)
	}
	s.Kill()
	s = s.Restart()
	pubc, _ := s.RawClients()
	if _, err := pubc.GetTopic(context.Background(), &pb.GetTopicRequest{Topic: "projects/" + Project + "/topics/binary"}); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
	s.Stop()
}

func TestClaimPort(t *testing.T) {
	addr := FreeAddr(t)
	_, p, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(p)
	// Nothing listens on addr now, as while its server restarts: still
	// nobody else gets it.
	if _, ok := claimPort(port); ok {
		t.Fatalf("port %d given by FreeAddr claimed again", port)
	}
	free := 0
	for port := 10000; free == 0; port++ {
		if release, ok := claimPort(port); ok {
			release()
			free = port
		}
	}
	release, ok := claimPort(free)
	if !ok {
		t.Fatalf("port %d released but not claimed again", free)
	}
	defer release()
	if _, ok := claimPort(free); ok {
		t.Fatalf("port %d claimed twice", free)
	}
}
