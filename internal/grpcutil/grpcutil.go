// Package grpcutil holds what the sidecar's gRPC services (internal/pubsubapi
// and internal/schemaapi) share: the API's project names and page tokens,
// the status codes of NATS and context errors, and the lazily created KV
// buckets the services keep their state in.
package grpcutil

import (
	"context"
	"errors"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/jetorder/jetorder/keyrouter"
)

// ParseProject returns the project id of a project name, projects/{project}.
// Errors are INVALID_ARGUMENT statuses.
func ParseProject(name string) (string, error) {
	p, ok := strings.CutPrefix(name, "projects/")
	if !ok || p == "" || strings.Contains(p, "/") {
		return "", status.Errorf(codes.InvalidArgument, "invalid project name %q: want projects/{project}", name)
	}
	if err := keyrouter.ValidateProjectID(p); err != nil {
		return "", status.Errorf(codes.InvalidArgument, "invalid project name %q: %v", name, err)
	}
	return p, nil
}

// Page cuts a list sorted by name at a page token (the last name of the
// previous page) and a page size (0: everything), and returns the page and
// the next token ("" after the last page). A negative size is
// INVALID_ARGUMENT.
func Page[T any](items []T, name func(T) string, size int32, token string) ([]T, string, error) {
	if size < 0 {
		return nil, "", status.Errorf(codes.InvalidArgument, "page_size %d is negative", size)
	}
	start := 0
	if token != "" {
		start = len(items)
		for i, it := range items {
			if name(it) > token {
				start = i
				break
			}
		}
	}
	items = items[start:]
	if size == 0 || int(size) >= len(items) {
		return items, "", nil
	}
	return items[:size], name(items[size-1]), nil
}

// Code is the status code that steers Pub/Sub clients for an error of
// NATS, JetStream or a context: a message over the server's max_payload
// INVALID_ARGUMENT, a context's end DEADLINE_EXCEEDED or CANCELLED, and
// transient trouble with the connection or the server UNAVAILABLE, which
// clients retry. Any other error is INTERNAL.
func Code(err error) codes.Code {
	switch {
	case errors.Is(err, nats.ErrMaxPayload): // data and headers together over the server's max_payload
		return codes.InvalidArgument
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrConnectionDraining),
		errors.Is(err, nats.ErrDisconnected), errors.Is(err, nats.ErrConnectionReconnecting),
		errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, jetstream.ErrJetStreamNotEnabled):
		return codes.Unavailable
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.Code >= 500 {
		return codes.Unavailable
	}
	return codes.Internal
}

// Status returns err as a status: err itself if it is one, else a status
// of Code(err) with err's text. nil returns nil.
func Status(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(Code(err), err.Error())
}
