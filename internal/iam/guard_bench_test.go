package iam

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// What access control costs each call, step by step, as the interceptors
// take it: authenticating the bearer token (with token files of 1 and
// 1,000 tokens), authorizing a PublishRequest, and the whole unary
// interceptor around a handler that does nothing.
//
//	go test -run '^$' -bench . -benchmem ./internal/iam

const benchPrincipal = "serviceAccount:bench"

// benchGuard is a Guard whose token file holds tokens tokens, the last
// of them benchPrincipal's (returned), and whose project policy grants
// benchPrincipal roles/pubsub.publisher and roles/pubsub.subscriber in
// every project.
func benchGuard(b *testing.B, tokens int) (*Guard, string) {
	b.Helper()
	dir := b.TempDir()
	var file strings.Builder
	for i := range tokens - 1 {
		fmt.Fprintf(&file, "user:u%d@example.com token-%d-0123456789abcdef\n", i, i)
	}
	token := "bench-token-0123456789abcdef"
	fmt.Fprintf(&file, "%s %s\n", benchPrincipal, token)
	tokensFile := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokensFile, []byte(file.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	projects, err := ParseProjectPolicy([]byte(`{"bindings":[
		{"role":"roles/pubsub.publisher","members":["` + benchPrincipal + `"]},
		{"role":"roles/pubsub.subscriber","members":["` + benchPrincipal + `"]}]}`))
	if err != nil {
		b.Fatal(err)
	}
	g, err := New(Config{TokensFile: tokensFile, Projects: projects})
	if err != nil {
		b.Fatal(err)
	}
	return g, token
}

// BenchmarkAuthenticate is the token step alone: the SHA-256 of the token
// and the constant-time comparison with every entry of the file.
func BenchmarkAuthenticate(b *testing.B) {
	for _, tokens := range []int{1, 10, 1000} {
		b.Run(fmt.Sprintf("tokens=%d", tokens), func(b *testing.B) {
			g, token := benchGuard(b, tokens)
			p := presented{bearer: token}
			b.ReportAllocs()
			for b.Loop() {
				c, err := g.authenticate(p)
				if err != nil || c.Principal != benchPrincipal {
					b.Fatal(c, err)
				}
			}
		})
	}
}

// BenchmarkAuthenticateGRPC is what the interceptors do to authenticate a
// call: read the authorization metadata, authenticate, and put the caller
// in the context.
func BenchmarkAuthenticateGRPC(b *testing.B) {
	for _, tokens := range []int{1, 1000} {
		b.Run(fmt.Sprintf("tokens=%d", tokens), func(b *testing.B) {
			g, token := benchGuard(b, tokens)
			ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+token))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := g.authenticateGRPC(ctx, "/google.pubsub.v1.Publisher/Publish"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAuthorizePublish is Authorize of a PublishRequest by a caller
// the project policy grants pubsub.topics.publish.
func BenchmarkAuthorizePublish(b *testing.B) {
	g, _ := benchGuard(b, 1)
	ctx := WithCaller(context.Background(), Caller{Principal: benchPrincipal, Via: "token"})
	req := &pb.PublishRequest{Topic: "projects/bench/topics/t", Messages: []*pb.PubsubMessage{{Data: []byte("x"), OrderingKey: "k"}}}
	b.ReportAllocs()
	for b.Loop() {
		if err := g.Authorize(ctx, "/google.pubsub.v1.Publisher/Publish", req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAuthorizeAcknowledge is Authorize of an AcknowledgeRequest, the
// unary call of the receive path (with ModifyAckDeadline).
func BenchmarkAuthorizeAcknowledge(b *testing.B) {
	g, _ := benchGuard(b, 1)
	ctx := WithCaller(context.Background(), Caller{Principal: benchPrincipal, Via: "token"})
	req := &pb.AcknowledgeRequest{Subscription: "projects/bench/subscriptions/s", AckIds: []string{"a", "b"}}
	b.ReportAllocs()
	for b.Loop() {
		if err := g.Authorize(ctx, "/google.pubsub.v1.Subscriber/Acknowledge", req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUnaryInterceptorPublish is the whole unary interceptor on a
// Publish call whose handler does nothing: what access control adds to
// each unary call.
func BenchmarkUnaryInterceptorPublish(b *testing.B) {
	for _, tokens := range []int{1, 1000} {
		b.Run(fmt.Sprintf("tokens=%d", tokens), func(b *testing.B) {
			g, token := benchGuard(b, tokens)
			intercept := g.UnaryInterceptor()
			ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+token))
			req := &pb.PublishRequest{Topic: "projects/bench/topics/t", Messages: []*pb.PubsubMessage{{Data: []byte("x"), OrderingKey: "k"}}}
			info := &grpc.UnaryServerInfo{FullMethod: "/google.pubsub.v1.Publisher/Publish"}
			handler := func(context.Context, any) (any, error) { return nil, nil }
			b.ReportAllocs()
			for b.Loop() {
				if _, err := intercept(ctx, req, info, handler); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
