package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/jetorder/jetorder/internal/embedded"
)

// A caller is told a resource exists, or a change was made, only once the
// embedded server's writes for it are on stable storage (docs/RELIABILITY.md,
// "Power cuts"). Publishes are made durable by the adapter
// (adapter.WithDurableSync), one sync per group of acknowledged batches; the
// wrappers here cover everything else a caller changes: topics,
// subscriptions, snapshots, schemas, push configs, seeks, and the DIDComm
// stamping counters (written before their message is published).

// readOnlyRPC reports whether a unary method changes nothing that must
// survive a power cut: reads, and the consumer side (acks and deadlines may
// roll back in a power cut: delivery is at least once). Publish is made
// durable by the adapter itself.
func readOnlyRPC(fullMethod string) bool {
	name := fullMethod[strings.LastIndexByte(fullMethod, '/')+1:]
	switch name {
	case "Publish", "Pull", "StreamingPull", "Acknowledge", "ModifyAckDeadline", "TestIamPermissions", "Check", "Watch":
		return true
	}
	for _, p := range []string{"Get", "List", "Validate", "ServerReflectionInfo"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// syncUnary makes every changing unary RPC wait for sync before it answers.
func syncUnary(sync func(context.Context) error) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if err != nil || readOnlyRPC(info.FullMethod) {
			return resp, err
		}
		if serr := sync(ctx); serr != nil {
			return nil, status.Errorf(codes.Unavailable, "done, but not confirmed on stable storage: %v", serr)
		}
		return resp, nil
	}
}

// syncHTTP makes every request that may change something (any method but
// GET, HEAD and OPTIONS) wait for sync before its response starts, or
// before net/http answers for a handler that wrote nothing. Routes whose
// durability is the adapter's (publishing) or that only settle deliveries
// (pull, acknowledge, ack deadlines) do not wait.
func syncHTTP(sync func(context.Context) error, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
			next.ServeHTTP(w, r)
			return
		}
		for _, verb := range []string{":publish", ":pull", ":acknowledge", ":modifyAckDeadline"} {
			if strings.HasSuffix(r.URL.Path, verb) {
				next.ServeHTTP(w, r)
				return
			}
		}
		sw := &syncingWriter{ResponseWriter: w, ctx: r.Context(), sync: sync}
		next.ServeHTTP(sw, r)
		if !sw.synced {
			sw.WriteHeader(http.StatusOK) // what net/http would send
		}
	})
}

// syncingWriter syncs before the response's status line goes out: by then
// the handler has done what the request asked. It has no Unwrap: a
// ResponseController could flush the status line past the sync.
type syncingWriter struct {
	http.ResponseWriter
	ctx    context.Context
	sync   func(context.Context) error
	synced bool
	failed bool // the sync failed: the handler's own response is dropped
}

func (w *syncingWriter) WriteHeader(code int) {
	if w.synced {
		if !w.failed {
			w.ResponseWriter.WriteHeader(code)
		}
		return
	}
	w.synced = true
	if code < 400 {
		if err := w.sync(w.ctx); err != nil {
			w.failed = true
			http.Error(w.ResponseWriter, "done, but not confirmed on stable storage: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *syncingWriter) Write(b []byte) (int, error) {
	if !w.synced {
		w.WriteHeader(http.StatusOK)
	}
	if w.failed {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

// Flush syncs first, as Write does.
func (w *syncingWriter) Flush() {
	if !w.synced {
		w.WriteHeader(http.StatusOK)
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok && !w.failed {
		f.Flush()
	}
}

// describeSync says, in the log and for the status page, when the NATS
// server's writes reach disk, and whether an acknowledged publish may be
// lost in a power cut. Of an external server the sidecar knows only what
// the servers tell the system account ($SYS.REQ.SERVER.PING.VARZ): a
// publish they acknowledged is durable only if every server that stores it
// runs with sync_interval: always.
func (s *sidecar) describeSync() (desc string, risk bool) {
	if s.srv != nil {
		switch p := s.srv.SyncPolicy(); p {
		case embedded.SyncGroup:
			if s.cfg.NATSListen != "" {
				// Clients of the NATS port hear JetStream's own acks, which
				// wait for no sync.
				return "group commit: acknowledged once on disk (--sync group); publishes made on --nats-listen are not waited for", true
			}
			return "group commit: acknowledged once on disk (--sync group)", false
		case embedded.SyncAlways:
			return "every write synced: acknowledged once on disk (--sync always)", false
		default:
			s.log.Warn("--sync lazy: acknowledged publishes, topics and subscriptions written in the last 2 minutes are lost in a power cut or an operating system crash")
			return "lazy (--sync lazy): writes of the last 2 minutes are lost in a power cut", true
		}
	}
	policies, err := externalSyncPolicies(s.nc, time.Second)
	if err != nil || len(policies) == 0 {
		s.log.Warn("external NATS: its sync policy is unknown to the sidecar (it needs the system account to ask); acknowledged publishes survive a power cut only if every server runs with sync_interval: always (docs/RELIABILITY.md)", "err", err)
		return "unknown: durable only if every server runs with sync_interval: always", true
	}
	var lazy []string
	for name, always := range policies {
		if !always {
			lazy = append(lazy, name)
		}
	}
	if len(lazy) > 0 {
		slices.Sort(lazy)
		s.log.Warn("external NATS servers that do not sync every write: acknowledged publishes may be lost in a power cut; set sync_interval: always (docs/RELIABILITY.md)", "servers", lazy)
		return fmt.Sprintf("not every write synced on %s: writes can be lost in a power cut", strings.Join(lazy, ", ")), true
	}
	s.log.Info("external NATS: every server that answered syncs every write (sync_interval: always)", "servers", len(policies))
	return fmt.Sprintf("every write synced on the %d servers that answered (sync_interval: always)", len(policies)), false
}

// externalSyncPolicies asks every server that answers within wait whether
// it runs with sync_interval: always, by server name.
func externalSyncPolicies(nc *nats.Conn, wait time.Duration) (map[string]bool, error) {
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest("$SYS.REQ.SERVER.PING.VARZ", inbox, nil); err != nil {
		return nil, err
	}
	policies := make(map[string]bool)
	deadline := time.Now().Add(wait)
	for {
		m, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			if errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) {
				return policies, nil
			}
			return policies, err
		}
		if m.Header.Get("Status") == "503" {
			// No responders: the account cannot reach the system account's
			// subjects. Waiting longer would only delay the start.
			return policies, nil
		}
		var resp struct {
			Server struct {
				Name string `json:"name"`
			} `json:"server"`
			Data struct {
				JetStream struct {
					Config *struct {
						SyncAlways bool `json:"sync_always"`
					} `json:"config"`
				} `json:"jetstream"`
			} `json:"data"`
		}
		if json.Unmarshal(m.Data, &resp) != nil || resp.Data.JetStream.Config == nil {
			continue // not a JetStream server, or not an answer
		}
		policies[resp.Server.Name] = resp.Data.JetStream.Config.SyncAlways
	}
}
