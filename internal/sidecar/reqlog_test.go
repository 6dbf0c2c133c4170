package sidecar

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/jetorder/jetorder/internal/testutil"
)

// At debug level every gRPC call and stream and every HTTP request is
// logged when it ends, with its outcome and duration; at info level none
// is.
func TestRequestLogs(t *testing.T) {
	for _, tc := range []struct {
		level slog.Level
		want  bool
	}{
		{slog.LevelDebug, true},
		{slog.LevelInfo, false},
	} {
		t.Run(tc.level.String(), func(t *testing.T) {
			var logged testutil.LogBuffer
			log := slog.New(slog.NewJSONHandler(&logged, &slog.HandlerOptions{Level: tc.level}))
			where := startSidecar(t, log)
			cc, err := grpc.NewClient(where.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			ctx := context.Background()

			if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
				t.Fatal(err)
			}
			_, err = pb.NewPublisherClient(cc).GetTopic(ctx, &pb.GetTopicRequest{Topic: "projects/p/topics/missing"})
			if status.Code(err) != codes.NotFound {
				t.Fatalf("GetTopic of a missing topic: %v, want NotFound", err)
			}
			wctx, cancelWatch := context.WithCancel(ctx)
			watch, err := healthpb.NewHealthClient(cc).Watch(wctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := watch.Recv(); err != nil { // the stream is open on the server
				t.Fatal(err)
			}
			cancelWatch()
			for _, path := range []string{"/healthz", "/v1/projects/p/topics/missing"} {
				resp, err := http.Get("http://" + where.HTTP + path)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
			}

			wanted := []struct {
				msg   string
				attrs map[string]any
			}{
				{"grpc call", map[string]any{"rpc": "/grpc.health.v1.Health/Check", "code": "OK"}},
				{"grpc call", map[string]any{"rpc": "/google.pubsub.v1.Publisher/GetTopic", "code": "NotFound"}},
				{"grpc stream", map[string]any{"rpc": "/grpc.health.v1.Health/Watch", "code": "Canceled"}},
				{"http request", map[string]any{"method": "GET", "path": "/healthz", "status": float64(200)}},
				{"http request", map[string]any{"method": "GET", "path": "/v1/projects/p/topics/missing", "status": float64(404)}},
			}
			find := func(msg string, attrs map[string]any) map[string]any {
			lines:
				for _, l := range logged.Lines() {
					var m map[string]any
					if err := json.Unmarshal([]byte(l), &m); err != nil {
						t.Fatalf("log line %q: %v", l, err)
					}
					if m["msg"] != msg {
						continue
					}
					for k, v := range attrs {
						if m[k] != v {
							continue lines
						}
					}
					return m
				}
				return nil
			}
			if !tc.want {
				// A call or request is logged, if at all, before its
				// answer reaches the client; the stream's line could
				// come later, and is not looked for.
				for _, w := range wanted {
					if m := find(w.msg, w.attrs); m != nil && w.msg != "grpc stream" {
						t.Errorf("at %v: %v", tc.level, m)
					}
				}
				return
			}
			for _, w := range wanted {
				var m map[string]any
				testutil.Eventually(t, 10*time.Second, func() bool { m = find(w.msg, w.attrs); return m != nil },
					"no %q line with %v:\n%s", w.msg, w.attrs, logged.String)
				if m["level"] != "DEBUG" || m["took"] == nil || m["peer"] == nil {
					t.Errorf("%v: want level DEBUG, took and peer", m)
				}
				if failed := w.attrs["code"] != nil && w.attrs["code"] != "OK"; failed != (m["err"] != nil) {
					t.Errorf("%v: want err for a failed call only", m)
				}
			}
		})
	}
}

// startSidecar runs a sidecar on loopback with an embedded server until the
// test ends.
func startSidecar(t *testing.T, log *slog.Logger) Listening {
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan error, 1)
	ready := make(chan Listening, 1)
	go func() {
		ended <- Run(ctx, Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DataDir: t.TempDir(), Project: "p"}, log,
			func(l Listening) { ready <- l })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-ended; err != nil {
			t.Errorf("sidecar: %v", err)
		}
	})
	select {
	case l := <-ready:
		return l
	case err := <-ended:
		t.Fatalf("sidecar did not start: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("sidecar not listening after 30s")
	}
	return Listening{}
}
