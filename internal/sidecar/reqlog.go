package sidecar

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Request logs: at debug level, one line per gRPC call or stream and per
// HTTP request, written when it ends, with what was asked, the outcome and
// how long it took. At other levels they cost one Enabled check.

// logUnary logs each unary gRPC call: "grpc call", with rpc (the full
// method name), code, took, peer and, when it failed, err (the status
// message).
func logUnary(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !log.Enabled(ctx, slog.LevelDebug) {
			return handler(ctx, req)
		}
		start := time.Now()
		resp, err := handler(ctx, req)
		logRPC(ctx, log, "grpc call", info.FullMethod, start, err)
		return resp, err
	}
}

// logStream logs each gRPC stream, such as StreamingPull, when it ends:
// "grpc stream", with the attributes of logUnary.
func logStream(log *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		if !log.Enabled(ctx, slog.LevelDebug) {
			return handler(srv, ss)
		}
		start := time.Now()
		err := handler(srv, ss)
		logRPC(ctx, log, "grpc stream", info.FullMethod, start, err)
		return err
	}
}

func logRPC(ctx context.Context, log *slog.Logger, msg, method string, start time.Time, err error) {
	st := status.Convert(err)
	attrs := []slog.Attr{
		slog.String("rpc", method),
		slog.String("code", st.Code().String()),
		slog.Duration("took", time.Since(start)),
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		attrs = append(attrs, slog.String("peer", p.Addr.String()))
	}
	if err != nil {
		attrs = append(attrs, slog.String("err", st.Message()))
	}
	log.LogAttrs(ctx, slog.LevelDebug, msg, attrs...)
}

// logRequests logs each HTTP request next serves: "http request", with
// method, path (without the query), status, bytes (of the body written),
// took and peer.
func logRequests(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !log.Enabled(r.Context(), slog.LevelDebug) {
			next.ServeHTTP(w, r)
			return
		}
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w}
		next.ServeHTTP(rec, r)
		if rec.status == 0 {
			rec.status = http.StatusOK // nothing written: net/http answers 200
		}
		log.LogAttrs(r.Context(), slog.LevelDebug, "http request",
			slog.String("method", r.Method),
			slog.String("path", r.URL.Path),
			slog.Int("status", rec.status),
			slog.Int64("bytes", rec.bytes),
			slog.Duration("took", time.Since(start)),
			slog.String("peer", r.RemoteAddr))
	})
}

// statusRecorder notes the status and body size a handler writes.
type statusRecorder struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 && code >= 200 { // 1xx are interim
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	n, err := r.ResponseWriter.Write(p)
	r.bytes += int64(n)
	return n, err
}

// Unwrap lets http.ResponseController reach the connection's writer
// (flushing, deadlines).
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
