package push

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"syscall"
	"time"
)

// DefaultTimeout is the per-request timeout when the caller gives none:
// Pub/Sub's default ack deadline, 10 seconds, which "for push delivery
// ... is also used to set the request timeout for the call to the push
// endpoint" (Subscription.ack_deadline_seconds).
const DefaultTimeout = 10 * time.Second

// DefaultDrainLimit is how much of a response body Deliver reads before
// closing it. Reading a short body to its end lets the connection be
// reused; a longer one is cut off and its connection closed.
const DefaultDrainLimit = 4 << 10

// Reason says why a delivery was nacked.
type Reason int

const (
	ReasonNone       Reason = iota // acked
	ReasonStatus                   // a status code that is not an ack
	ReasonRedirect                 // a 3xx; redirects are not followed
	ReasonTimeout                  // no answer within the timeout
	ReasonRefused                  // connection refused
	ReasonNotAllowed               // the allow-list refused the endpoint or its addresses
	ReasonTransport                // any other network, TLS or protocol error
	ReasonCanceled                 // the caller's ctx ended (shutdown): not the endpoint's fault
)

// String returns a short name, suitable as a metric label.
func (r Reason) String() string {
	switch r {
	case ReasonNone:
		return "none"
	case ReasonStatus:
		return "status"
	case ReasonRedirect:
		return "redirect"
	case ReasonTimeout:
		return "timeout"
	case ReasonRefused:
		return "refused"
	case ReasonNotAllowed:
		return "not_allowed"
	case ReasonTransport:
		return "transport"
	case ReasonCanceled:
		return "canceled"
	}
	return fmt.Sprintf("Reason(%d)", int(r))
}

// Result is the outcome of one delivery.
type Result struct {
	// Acked is true when the endpoint answered 102, 200, 201, 202 or 204,
	// the codes Pub/Sub counts as an acknowledgement; anything else is a
	// nack.
	Acked bool
	// Reason is ReasonNone when acked.
	Reason Reason
	// StatusCode is the response's status, 0 when none arrived.
	StatusCode int
	// Err is nil when acked; otherwise it wraps ErrStatus, ErrRedirect,
	// ErrTimeout, ErrRefused, ErrNotAllowed, the caller's ctx error, or
	// the transport's error.
	Err error
}

// Client sends push requests. It is safe for concurrent use; it starts no
// goroutines of its own beyond net/http's connection handling, and Close
// releases its idle connections.
type Client struct {
	hc    *http.Client
	tr    *http.Transport
	drain int64
}

type clientConfig struct {
	tls    *tls.Config
	drain  int64
	lookup LookupFunc
	idle   int
}

// Option configures a Client.
type Option func(*clientConfig)

// WithTLSConfig sets the TLS configuration for https endpoints (for
// example a private CA). The default verifies against the system roots.
func WithTLSConfig(c *tls.Config) Option { return func(cfg *clientConfig) { cfg.tls = c } }

// WithDrainLimit sets how many bytes of a response body are read before
// it is closed; 0 reads none. The default is DefaultDrainLimit.
func WithDrainLimit(n int64) Option { return func(cfg *clientConfig) { cfg.drain = n } }

// WithLookup replaces the DNS lookup used at dial time (tests, or a
// resolver of the sidecar's choosing).
func WithLookup(f LookupFunc) Option { return func(cfg *clientConfig) { cfg.lookup = f } }

// WithMaxIdleConnsPerHost sets how many idle connections are kept per
// endpoint host; the runner keeps up to one request per ordering key in
// flight, so this bounds reuse, not concurrency. The default is 64.
func WithMaxIdleConnsPerHost(n int) Option { return func(cfg *clientConfig) { cfg.idle = n } }

func (c *clientConfig) validate() error {
	switch {
	case c.drain < 0:
		return errors.New("push: drain limit must not be negative")
	case c.lookup == nil:
		return errors.New("push: lookup must not be nil")
	case c.idle < 0:
		return errors.New("push: max idle connections per host must not be negative")
	}
	return nil
}

// NewClient returns a Client that connects only where allow permits
// (see AllowList). It never uses a proxy from the environment: a proxy
// would make the dial-time check look at the proxy, not the endpoint.
func NewClient(allow *AllowList, opts ...Option) (*Client, error) {
	if allow == nil {
		return nil, errors.New("push: NewClient needs an allow-list")
	}
	cfg := clientConfig{drain: DefaultDrainLimit, lookup: defaultLookup, idle: 64}
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	d := &net.Dialer{KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         allow.dialContext(d, cfg.lookup),
		TLSClientConfig:     cfg.tls,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: cfg.idle,
		IdleConnTimeout:     90 * time.Second,
	}
	hc := &http.Client{
		Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	return &Client{hc: hc, tr: tr, drain: cfg.drain}, nil
}

// Close closes idle connections. It is idempotent; requests in flight
// are not interrupted (cancel their ctx for that).
func (c *Client) Close() error {
	c.tr.CloseIdleConnections()
	return nil
}

// errProcessing aborts a request on a 102 Processing, which Pub/Sub
// counts as an ack.
var errProcessing = errors.New("push: 102 processing")

// errDeadline is the cause of Deliver's own timeout, to tell it from the
// caller's ctx ending.
var errDeadline = errors.New("push: request timeout")

// Deliver sends req and classifies the outcome. timeout bounds the whole
// exchange (connect, request, response headers and the drained body); 0
// or less means DefaultTimeout. req's context is replaced by one derived
// from ctx. Deliver blocks until the outcome is known; cancelling ctx
// ends it early with ReasonCanceled. It never follows a redirect and reads
// at most the drain limit of the response body.
func (c *Client) Deliver(ctx context.Context, req *http.Request, timeout time.Duration) Result {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	rctx, cancel := context.WithTimeoutCause(ctx, timeout, errDeadline)
	defer cancel()
	trace := &httptrace.ClientTrace{
		Got1xxResponse: func(code int, _ textproto.MIMEHeader) error {
			if code == http.StatusProcessing {
				return errProcessing
			}
			return nil
		},
	}
	req = req.WithContext(httptrace.WithClientTrace(rctx, trace))
	resp, err := c.hc.Do(req)
	if err != nil {
		return classify(ctx, rctx, err)
	}
	if c.drain > 0 {
		_, _ = io.CopyN(io.Discard, resp.Body, c.drain)
	}
	_ = resp.Body.Close()
	return statusResult(resp)
}

func statusResult(resp *http.Response) Result {
	code := resp.StatusCode
	switch {
	case isAck(code):
		return Result{Acked: true, StatusCode: code}
	case code >= 300 && code < 400:
		return Result{Reason: ReasonRedirect, StatusCode: code,
			Err: fmt.Errorf("%w: %s to %q", ErrRedirect, resp.Status, resp.Header.Get("Location"))}
	}
	return Result{Reason: ReasonStatus, StatusCode: code, Err: fmt.Errorf("%w: %s", ErrStatus, resp.Status)}
}

// isAck reports whether Pub/Sub counts code as an acknowledgement.
func isAck(code int) bool {
	switch code {
	case http.StatusProcessing, http.StatusOK, http.StatusCreated, http.StatusAccepted, http.StatusNoContent:
		return true
	}
	return false
}

func classify(parent, rctx context.Context, err error) Result {
	switch {
	case errors.Is(err, errProcessing):
		return Result{Acked: true, StatusCode: http.StatusProcessing}
	case parent.Err() != nil:
		return Result{Reason: ReasonCanceled, Err: fmt.Errorf("push: delivery abandoned: %w", context.Cause(parent))}
	case errors.Is(context.Cause(rctx), errDeadline):
		return Result{Reason: ReasonTimeout, Err: fmt.Errorf("%w: %v", ErrTimeout, err)}
	case errors.Is(err, ErrNotAllowed):
		return Result{Reason: ReasonNotAllowed, Err: err}
	case errors.Is(err, syscall.ECONNREFUSED):
		return Result{Reason: ReasonRefused, Err: fmt.Errorf("%w: %v", ErrRefused, err)}
	}
	return Result{Reason: ReasonTransport, Err: err}
}
