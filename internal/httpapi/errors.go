package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/cloudevents"
	"github.com/jetorder/jetorder/didcomm"
	"github.com/jetorder/jetorder/internal/broker"
	"github.com/jetorder/jetorder/keyrouter"
)

// apiError is an error the API found itself (a malformed request, say),
// with the HTTP status it is answered with. Its message is the error text
// of err, which it wraps.
type apiError struct {
	code int
	err  error
}

func (e *apiError) Error() string { return e.err.Error() }
func (e *apiError) Unwrap() error { return e.err }

// errorf returns an apiError with status code and a formatted message
// (which may wrap an error with %w).
func errorf(code int, format string, args ...any) error {
	return &apiError{code: code, err: fmt.Errorf(format, args...)}
}

// badRequest answers err with 400, its text unchanged.
func badRequest(err error) error { return &apiError{code: http.StatusBadRequest, err: err} }

// statusOf is the one place where an error becomes an HTTP status.
func statusOf(err error) int {
	var ae *apiError
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &ae):
		return ae.code
	case errors.As(err, &tooLarge):
		return http.StatusRequestEntityTooLarge
	// A key paused by an earlier failure (of another request sharing the
	// broker's publisher handle) wraps that failure's cause, which says
	// nothing about this request: it is transient, the broker resumes the
	// key once the failed request has all its results.
	case errors.Is(err, adapter.ErrPublishingPaused),
		errors.Is(err, adapter.ErrNotDurable),    // stored, but its sync failed or timed out: retry
		errors.Is(err, didcomm.ErrStateConflict): // DIDComm stamping lost every compare-and-set: try again
		return http.StatusServiceUnavailable
	case errors.Is(err, keyrouter.ErrInvalidProjectID),
		errors.Is(err, keyrouter.ErrInvalidTopicID),
		errors.Is(err, keyrouter.ErrEmptyOrderingKey),
		errors.Is(err, keyrouter.ErrOrderingKeyTooLong),
		errors.Is(err, keyrouter.ErrOrderingKeyNotUTF8),
		errors.Is(err, adapter.ErrInvalidMessage),
		errors.Is(err, cloudevents.ErrInvalidEvent),
		errors.Is(err, nats.ErrMaxPayload): // data and headers together over the server's max_payload
		return http.StatusBadRequest
	case errors.Is(err, adapter.ErrTopicNotFound):
		return http.StatusNotFound
	case errors.Is(err, broker.ErrTooManyProjects):
		return http.StatusTooManyRequests
	case unavailable(err):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// unavailable reports whether err is one a client should retry later: NATS
// or JetStream not reachable or too slow, flow control, the request's time
// running out, or the broker shutting down.
func unavailable(err error) bool {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, adapter.ErrFlowControlLimit),
		errors.Is(err, adapter.ErrTopicStopped),
		errors.Is(err, adapter.ErrClosed),
		errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, context.Canceled),
		errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, nats.ErrConnectionClosed),
		errors.Is(err, nats.ErrConnectionDraining),
		errors.Is(err, nats.ErrConnectionReconnecting),
		errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, nats.ErrReconnectBufExceeded),
		errors.Is(err, nats.ErrTimeout),
		errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, jetstream.ErrAsyncPublishTimeout),
		errors.Is(err, jetstream.ErrTooManyStalledMsgs):
		return true
	case errors.As(err, &apiErr):
		return apiErr.Code == http.StatusServiceUnavailable
	}
	return false
}

// statusName is the google.rpc.Code name the error body carries for an
// HTTP status.
func statusName(code int) string {
	switch code {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType:
		return "INVALID_ARGUMENT"
	case http.StatusForbidden:
		return "PERMISSION_DENIED"
	case http.StatusNotFound:
		return "NOT_FOUND"
	case http.StatusMethodNotAllowed:
		return "UNIMPLEMENTED"
	case http.StatusServiceUnavailable:
		return "UNAVAILABLE"
	}
	return "INTERNAL"
}
