package integration

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/sidecar"
)

// sidecarProc is a sidecar started in-process by sidecar.Run, the function
// cmd/sidecar runs, with its own embedded nats-server unless cfg names one.
type sidecarProc struct {
	t      *testing.T
	cfg    sidecar.Config
	at     sidecar.Listening
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func startSidecar(t *testing.T, cfg sidecar.Config) *sidecarProc {
	t.Helper()
	if cfg.GRPCAddr == "" {
		cfg.GRPCAddr = "127.0.0.1:0"
	}
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = "127.0.0.1:0"
	}
	if cfg.DataDir == "" && cfg.NATSURL == "" {
		cfg.DataDir = t.TempDir()
	}
	if cfg.Project == "" {
		cfg.Project = project
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 2 * time.Second
	}
	if cfg.Delivery == "" {
		cfg.Delivery = testDelivery
	}
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("JETORDER_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &sidecarProc{t: t, cfg: cfg, cancel: cancel, done: make(chan error, 1)}
	ready := make(chan sidecar.Listening, 1)
	go func() { p.done <- sidecar.Run(ctx, cfg, log, func(l sidecar.Listening) { ready <- l }) }()
	select {
	case p.at = <-ready:
	case err := <-p.done:
		cancel()
		t.Fatalf("sidecar ended before it was ready: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("sidecar not ready within 30s")
	}
	t.Cleanup(func() { p.stop() })
	return p
}

// stop shuts the sidecar down as SIGTERM does and waits for it.
func (p *sidecarProc) stop() {
	p.t.Helper()
	p.once.Do(func() {
		p.cancel()
		select {
		case err := <-p.done:
			if err != nil {
				p.t.Errorf("sidecar: %v", err)
			}
		case <-time.After(30 * time.Second):
			p.t.Error("sidecar did not stop within 30s")
		}
	})
}

// goClient is Google's Go client pointed at the sidecar, set up exactly as
// the client does for PUBSUB_EMULATOR_HOST.
func (p *sidecarProc) goClient() *pubsub.Client {
	p.t.Helper()
	return goClientAt(p.t, p.at.GRPC)
}

// goClientAt is Google's Go client for the sidecar at addr.
func goClientAt(t *testing.T, addr string, opts ...option.ClientOption) *pubsub.Client {
	t.Helper()
	c, err := pubsub.NewClient(context.Background(), project, append([]option.ClientOption{
		option.WithEndpoint(addr),
		option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
		option.WithTelemetryDisabled()}, opts...)...)
	if err != nil {
		t.Fatalf("pubsub.NewClient: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// rawClient is a bare gRPC Subscriber/Publisher client: it does exactly
// what a test tells it, as a client that does not serialize keys itself
// (Node.js) would.
func (p *sidecarProc) rawClient() (pb.PublisherClient, pb.SubscriberClient) {
	p.t.Helper()
	conn, err := grpc.NewClient(p.at.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { _ = conn.Close() })
	return pb.NewPublisherClient(conn), pb.NewSubscriberClient(conn)
}

func topicPath(id string) string { return "projects/" + project + "/topics/" + id }
func subPath(id string) string   { return "projects/" + project + "/subscriptions/" + id }

func mustCreateTopic(t *testing.T, c *pubsub.Client, id string) {
	t.Helper()
	if _, err := c.TopicAdminClient.CreateTopic(context.Background(), &pb.Topic{Name: topicPath(id)}); err != nil {
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
				t.Error("Receive did not return within 30s")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// publishCheckedGo publishes msgs messages on each of keys through p,
// interleaved (message i of every key before message i+1 of any; "" is no
// ordering key), records each with chk, and waits for every result.
func publishCheckedGo(t *testing.T, p *pubsub.Publisher, chk *ordercheck.Checker, keys []string, msgs int) {
	t.Helper()
	var results []*pubsub.PublishResult
	for i := range msgs {
		for _, key := range keys {
			results = append(results, p.Publish(context.Background(), &pubsub.Message{Data: ordercheck.Encode(key, i), OrderingKey: key}))
			chk.Published(key, i)
		}
	}
	for _, r := range results {
		if _, err := r.Get(context.Background()); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
}

// checkedGoHandler is a Go client handler that reports every delivery of
// sub to chk and nacks every nackEvery-th one it gets (0: none), acking the
// rest.
func checkedGoHandler(chk *ordercheck.Checker, sub string, nackEvery int) func(context.Context, *pubsub.Message) {
	var mu sync.Mutex
	count := 0
	return func(_ context.Context, m *pubsub.Message) {
		key, idx, err := ordercheck.Decode(m.Data)
		if err != nil || key != m.OrderingKey {
			chk.Fail("%s: undecodable delivery %q (key %q): %v", sub, m.Data, m.OrderingKey, err)
			m.Ack()
			return
		}
		chk.Delivered(sub, key, idx)
		mu.Lock()
		count++
		nack := nackEvery > 0 && count%nackEvery == 0
		mu.Unlock()
		if nack {
			chk.Released(sub, key, idx)
			m.Nack()
			return
		}
		chk.Acked(sub, key, idx)
		m.Ack()
	}
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
