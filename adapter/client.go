package adapter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/semaphore"

	"github.com/jetorder/jetorder/keyrouter"
)

const (
	subscriptionsBucket = "JO_SUBSCRIPTIONS"
	leasesBucket        = "JO_LEASES"
	stateBucket         = "JO_STATE"
)

// Client is the entry point: topics and subscriptions of one project over a
// NATS connection. It is safe for concurrent use. The caller owns the
// connection: Close does not close it.
type Client struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	project string
	cfg     clientConfig

	mu       sync.Mutex
	subsKV   jetstream.KeyValue
	leases   jetstream.KeyValue
	leaseTTL time.Duration // the lease bucket's TTL, which its creator chose
	closed   bool

	// publishWindow bounds the client's messages awaiting a server ack.
	// Publishers take a whole batch's share before sending it, so the
	// asynchronous publisher below never stalls on its own pending limit
	// (a stalled send would fail one message in the middle of a batch).
	publishWindow *semaphore.Weighted
}

// publishWindowSize is the most messages a client has in flight at once.
const publishWindowSize = 4096

type clientConfig struct {
	logger       *slog.Logger
	replicas     int
	leaseTTL     time.Duration
	idleTimeout  time.Duration
	apiTimeout   time.Duration
	ackTimeout   time.Duration
	createWorker int
}

// Option configures a Client.
type Option func(*clientConfig) error

// WithLogger sets the logger for background events (partition take-overs,
// consumer clean-up, retried failures). The default discards everything.
func WithLogger(l *slog.Logger) Option {
	return func(c *clientConfig) error { c.logger = l; return nil }
}

// WithReplicas sets the replica count of the streams and buckets the client
// creates (1 on a single server, 3 in a cluster); buckets that exist keep
// theirs. Default 1.
func WithReplicas(n int) Option {
	return func(c *clientConfig) error {
		if n < 1 || n > 5 {
			return fmt.Errorf("%w: replicas %d not in 1..5", ErrInvalidConfig, n)
		}
		c.replicas = n
		return nil
	}
}

// WithFailoverTimeout sets how long what a receiving process that dies
// (without ending its Receive calls) held stays its own before another
// process takes it over: a partitioned subscription's partitions (the
// partition consumers' PinnedTTL, at least 3s, fixed when the subscription
// is created) and a per-key subscription's key discovery (the TTL of the
// JO_LEASES bucket, fixed by the first client that creates it). A Receive
// that ends hands both over at once. Default 6s.
func WithFailoverTimeout(d time.Duration) Option {
	return func(c *clientConfig) error {
		if d < 500*time.Millisecond {
			return fmt.Errorf("%w: failover timeout %v below 500ms", ErrInvalidConfig, d)
		}
		c.leaseTTL = d
		return nil
	}
}

// WithKeyConsumerIdleTimeout sets, for per-key delivery, how long a key
// must see no new message before its consumer is considered for removal (it
// is removed only when nothing is pending or unacked). Partitioned delivery
// has no per-key consumers. Default 5s.
func WithKeyConsumerIdleTimeout(d time.Duration) Option {
	return func(c *clientConfig) error {
		if d < 100*time.Millisecond {
			return fmt.Errorf("%w: idle timeout %v below 100ms", ErrInvalidConfig, d)
		}
		c.idleTimeout = d
		return nil
	}
}

// WithPublishAckTimeout sets how long a published message waits for the
// server's acknowledgement before it is sent again (with the same message
// id, so the stream stores it once). Default 5s.
func WithPublishAckTimeout(d time.Duration) Option {
	return func(c *clientConfig) error {
		if d < 10*time.Millisecond {
			return fmt.Errorf("%w: publish ack timeout %v below 10ms", ErrInvalidConfig, d)
		}
		c.ackTimeout = d
		return nil
	}
}

// NewClient returns a client for project over nc, which must have JetStream
// available and must not buffer publishes while reconnecting (connect with
// nats.ReconnectBufSize(-1), or without reconnects). It does no I/O;
// buckets are created on first use.
func NewClient(nc *nats.Conn, project string, opts ...Option) (*Client, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: nil *nats.Conn", ErrInvalidConfig)
	}
	if err := keyrouter.ValidateProjectID(project); err != nil {
		return nil, err
	}
	if nc.Opts.AllowReconnect && nc.Opts.ReconnectBufSize >= 0 {
		// While reconnecting, nats.go buffers publishes and sends them
		// after the reconnect, but what was written just before the drop
		// may be lost with the socket: a key's later messages would be
		// stored without its earlier ones. Unbuffered, they fail instead,
		// and their key pauses.
		return nil, fmt.Errorf("%w: the connection buffers publishes while reconnecting, which can store a key's messages out of order; connect with nats.ReconnectBufSize(-1)", ErrInvalidConfig)
	}
	cfg := clientConfig{
		logger:       slog.New(slog.DiscardHandler),
		replicas:     1,
		leaseTTL:     6 * time.Second,
		idleTimeout:  5 * time.Second,
		apiTimeout:   10 * time.Second,
		ackTimeout:   5 * time.Second,
		createWorker: 32,
	}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.logger == nil {
		cfg.logger = slog.New(slog.DiscardHandler)
	}
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(cfg.apiTimeout),
		// An ack that does not come is retried (same message id, so stored
		// once) rather than waited for forever.
		jetstream.WithPublishAsyncTimeout(cfg.ackTimeout),
		jetstream.WithPublishAsyncMaxPending(2*publishWindowSize))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return &Client{nc: nc, js: js, project: project, cfg: cfg, publishWindow: semaphore.NewWeighted(publishWindowSize)}, nil
}

// Project is the client's project id.
func (c *Client) Project() string { return c.project }

// Close marks the client closed: later calls fail with ErrClosed, and
// Receive calls in progress end with ErrClosed within about a second
// (cancelling their contexts ends them at once).
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	return nil
}

func (c *Client) checkOpen() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	return nil
}

// withTimeout gives ctx a deadline if it has none, so no API call waits
// forever on a missing server.
func (c *Client) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, c.cfg.apiTimeout)
}

// buckets returns the subscription registry bucket.
func (c *Client) buckets(ctx context.Context) (subs jetstream.KeyValue, err error) {
	subs, _, _, err = c.registry(ctx)
	return subs, err
}

// registry returns the registry buckets, creating them on first use, and
// the lease bucket's TTL.
func (c *Client) registry(ctx context.Context) (subs, leases jetstream.KeyValue, leaseTTL time.Duration, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, nil, 0, ErrClosed
	}
	if c.subsKV == nil {
		kv, err := c.openBucket(ctx, jetstream.KeyValueConfig{
			Bucket:      subscriptionsBucket,
			Description: "jetorder subscriptions and key-discovery positions",
			Storage:     jetstream.FileStorage,
			Replicas:    c.cfg.replicas,
		})
		if err != nil {
			return nil, nil, 0, err
		}
		c.subsKV = kv
	}
	if c.leases == nil {
		kv, err := c.openBucket(ctx, jetstream.KeyValueConfig{
			Bucket:      leasesBucket,
			Description: "jetorder key-discovery leases",
			Storage:     jetstream.FileStorage,
			Replicas:    c.cfg.replicas,
			TTL:         c.cfg.leaseTTL,
		})
		if err != nil {
			return nil, nil, 0, err
		}
		st, err := kv.Status(ctx)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("open bucket %s: %w", leasesBucket, err)
		}
		if st.TTL() <= 0 {
			return nil, nil, 0, fmt.Errorf("%w: bucket %s has no TTL", ErrInvalidConfig, leasesBucket)
		}
		c.leases, c.leaseTTL = kv, st.TTL()
	}
	return c.subsKV, c.leases, c.leaseTTL, nil
}

func (c *Client) openBucket(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := c.js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = c.js.CreateKeyValue(ctx, cfg)
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = c.js.KeyValue(ctx, cfg.Bucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}
