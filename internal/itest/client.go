package itest

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// GoClient is Google's Go client for the Pub/Sub API at addr, set up as
// the client does for PUBSUB_EMULATOR_HOST (plaintext, no authentication,
// no telemetry), then opts; closed when the test ends. A later
// option.WithGRPCDialOption(grpc.WithTransportCredentials(...)) replaces
// the plaintext.
func GoClient(t testing.TB, addr string, opts ...option.ClientOption) *pubsub.Client {
	t.Helper()
	return GoClientOf(t, addr, Project, opts...)
}

// GoClientOf is GoClient in project.
func GoClientOf(t testing.TB, addr, project string, opts ...option.ClientOption) *pubsub.Client {
	t.Helper()
	c, err := pubsub.NewClient(context.Background(), project, append(ClientOptions(addr), opts...)...)
	if err != nil {
		t.Fatalf("pubsub.NewClient: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// ClientOptions are GoClient's options for addr, for Google's other
// clients (such as the schema admin client).
func ClientOptions(addr string) []option.ClientOption {
	return []option.ClientOption{
		option.WithEndpoint(addr),
		option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
		option.WithTelemetryDisabled(),
	}
}

// Patient are GoClient options for a sidecar that restarts: the client
// retries its connection every 200ms at most and calls wait for it,
// instead of failing UNAVAILABLE and backing off for seconds, which would
// make a test's time depend on luck.
func Patient() []option.ClientOption {
	return []option.ClientOption{
		option.WithGRPCDialOption(grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 200 * time.Millisecond},
			MinConnectTimeout: 5 * time.Second,
		})),
		option.WithGRPCDialOption(grpc.WithDefaultCallOptions(grpc.WaitForReady(true))),
	}
}

// Dial is a raw gRPC connection to addr, plaintext unless opts give
// transport credentials, closed when the test ends.
func Dial(t testing.TB, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatalf("grpc.NewClient(%s): %v", addr, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// GoClient is Google's Go client for the sidecar's gRPC API, trusting the
// CA of its TLS option if it has one.
func (s *Sidecar) GoClient(opts ...option.ClientOption) *pubsub.Client {
	s.t.Helper()
	if s.o.tls != nil {
		opts = append([]option.ClientOption{option.WithGRPCDialOption(s.tlsCreds())}, opts...)
	}
	return GoClient(s.t, s.GRPC, opts...)
}

// Conn is a raw gRPC connection to the sidecar, over TLS trusting its CA
// if it has the TLS option.
func (s *Sidecar) Conn(opts ...grpc.DialOption) *grpc.ClientConn {
	s.t.Helper()
	if s.o.tls != nil {
		opts = append([]grpc.DialOption{s.tlsCreds()}, opts...)
	}
	return Dial(s.t, s.GRPC, opts...)
}

// RawClients are bare gRPC Publisher and Subscriber clients of the sidecar
// on one Conn: they do exactly what a test tells them, as a client that
// does not serialize keys itself (Node.js) would.
func (s *Sidecar) RawClients(opts ...grpc.DialOption) (pb.PublisherClient, pb.SubscriberClient) {
	s.t.Helper()
	conn := s.Conn(opts...)
	return pb.NewPublisherClient(conn), pb.NewSubscriberClient(conn)
}

func (s *Sidecar) tlsCreds() grpc.DialOption {
	return grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: s.o.tls.Pool}))
}

// JetStream is a JetStream context on the sidecar's embedded server, for
// looking at what it stored; the sidecar needs cfg.NATSListen, and opts
// the credentials its cfg.NATSListen* require. Its connection closes when
// the test ends.
func (s *Sidecar) JetStream(opts ...nats.Option) jetstream.JetStream {
	s.t.Helper()
	if s.NATS == "" {
		s.t.Fatal("itest: JetStream needs a sidecar with NATSListen")
	}
	nc, err := nats.Connect(s.NATS, opts...)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		s.t.Fatal(err)
	}
	return js
}
