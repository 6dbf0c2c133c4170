package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"

	"google.golang.org/grpc/grpclog"
)

// newLogger is the sidecar's one log, on w: the sidecar's own lines, the
// embedded nats-server's (component=nats-server) and, with --log-level
// debug, one line per gRPC call and HTTP request. format is "text"
// (key=value) or "json" (one object per line).
func newLogger(w io.Writer, format string, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// logProcessWide sends what logs through process-wide loggers to log as
// well, so that a JSON log holds nothing but JSON: the standard library's
// log package and slog's default (net/http and dependencies), and gRPC's
// own log, which by default writes its errors to stderr as text.
func logProcessWide(log *slog.Logger) {
	slog.SetDefault(log)
	grpclog.SetLoggerV2(grpcLog{log.With("component", "grpc")})
}

// grpcLog passes gRPC's log to slog at the severities gRPC's default
// logger shows: errors at error level, warnings at debug (a client that
// speaks something else than HTTP/2, a connection reset), info not at
// all (channel and transport tracing).
type grpcLog struct{ log *slog.Logger }

var _ grpclog.LoggerV2 = grpcLog{}

func (g grpcLog) at(level slog.Level, msg string) { g.log.Log(context.Background(), level, msg) }

func (grpcLog) Info(...any)             {}
func (grpcLog) Infoln(...any)           {}
func (grpcLog) Infof(string, ...any)    {}
func (grpcLog) V(int) bool              { return false }
func (g grpcLog) Warning(args ...any)   { g.at(slog.LevelDebug, fmt.Sprint(args...)) }
func (g grpcLog) Warningln(args ...any) { g.at(slog.LevelDebug, sprintln(args)) }
func (g grpcLog) Warningf(format string, args ...any) {
	g.at(slog.LevelDebug, fmt.Sprintf(format, args...))
}
func (g grpcLog) Error(args ...any)   { g.at(slog.LevelError, fmt.Sprint(args...)) }
func (g grpcLog) Errorln(args ...any) { g.at(slog.LevelError, sprintln(args)) }
func (g grpcLog) Errorf(format string, args ...any) {
	g.at(slog.LevelError, fmt.Sprintf(format, args...))
}

// Fatal* are errors gRPC cannot go on from; it expects the logger to exit.
func (g grpcLog) Fatal(args ...any)                 { g.Error(args...); os.Exit(1) }
func (g grpcLog) Fatalln(args ...any)               { g.Errorln(args...); os.Exit(1) }
func (g grpcLog) Fatalf(format string, args ...any) { g.Errorf(format, args...); os.Exit(1) }

// sprintln is fmt.Sprintln without the newline a log line does not need.
func sprintln(args []any) string {
	s := fmt.Sprintln(args...)
	return s[:len(s)-1]
}
