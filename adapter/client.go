package adapter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"

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

	// stateKV is the state bucket, once opened (stateBucket).
	stateMu sync.Mutex
	stateKV jetstream.KeyValue

	// layoutOK is set once the account's layout is known to be this
	// build's (EnsureLayout), before the client's first write.
	layoutMu sync.Mutex
	layoutOK atomic.Bool

	mu       sync.Mutex
	subsKV   jetstream.KeyValue
	leases   jetstream.KeyValue
	leaseTTL time.Duration // the lease bucket's TTL, which its creator chose
	closed   bool

	// closing is cancelled, with cause ErrClosed, by the first Close: the
	// context of every Receive call is cancelled with it.
	closing  context.Context
	closeNow context.CancelCauseFunc
	// receives counts the Receive calls in progress, by subscription name;
	// receivesEnded is closed once the client is closed and none is left.
	receives      map[string]int
	receivesEnded chan struct{}
	// topics are the handles with a publisher, which Close flushes and
	// stops. They are held weakly: a handle the application dropped has
	// nothing left to send, and is forgotten when it is collected.
	topics map[weak.Pointer[Topic]]struct{}
	// stopping are the handles whose Stop, started by Close, has not
	// returned; topicsStopped is closed once none is left.
	stopping      map[*Topic]struct{}
	topicsStopped chan struct{}

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
	closeTimeout time.Duration
	createWorker int
	durable      func(context.Context) error
	name         string
}

// Option configures a Client.
type Option func(*clientConfig) error

// WithLogger sets the logger for background events (partition take-overs,
// consumer clean-up, retried failures). The default discards everything.
func WithLogger(l *slog.Logger) Option {
	return func(c *clientConfig) error { c.logger = l; return nil }
}

// WithName names the client's process to the other receivers of its
// subscriptions and to an Inspector (PartitionState.Holder): a sidecar's
// name, a host name. Its member records carry it. Default: none.
func WithName(name string) Option {
	return func(c *clientConfig) error { c.name = name; return nil }
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

// WithDurableSync makes every publish result wait, after the server's
// acknowledgement, until sync has returned: sync must make everything the
// server wrote before the call durable (an embedded server's group commit).
// A JetStream acknowledgement alone means the message is in the server's
// memory, on disk only after the server's next fsync (every 2 minutes by
// default), unless the server runs with sync_interval: always. One sync
// covers every batch acknowledged since the last, and a key's next batch
// is sent once its previous one is durable, so a power cut can lose a
// suffix of a key's unacknowledged messages but never leave a gap.
func WithDurableSync(sync func(context.Context) error) Option {
	return func(c *clientConfig) error { c.durable = sync; return nil }
}

// WithCloseTimeout sets how long Close waits for the client's Receive calls
// and topic publishers to finish before it returns ErrCloseTimeout.
// Default 30s.
func WithCloseTimeout(d time.Duration) Option {
	return func(c *clientConfig) error {
		if d <= 0 {
			return fmt.Errorf("%w: close timeout %v not positive", ErrInvalidConfig, d)
		}
		c.closeTimeout = d
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
		closeTimeout: 30 * time.Second,
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
	closing, closeNow := context.WithCancelCause(context.Background())
	return &Client{
		nc: nc, js: js, project: project, cfg: cfg,
		closing:       closing,
		closeNow:      closeNow,
		receives:      make(map[string]int),
		receivesEnded: make(chan struct{}),
		topics:        make(map[weak.Pointer[Topic]]struct{}),
		stopping:      make(map[*Topic]struct{}),
		topicsStopped: make(chan struct{}),
		publishWindow: semaphore.NewWeighted(publishWindowSize),
	}, nil
}

// Project is the client's project id.
func (c *Client) Project() string { return c.project }

// Close closes the client and waits for what it started to finish. It
// returns nil once they have, and is safe for concurrent use.
//
// At once, later calls fail with ErrClosed, and every Receive call in
// progress starts ending as if its context had been cancelled: it stops
// taking messages, hands back those no handler has started, cancels its
// handlers' context, waits for them, and returns an error that wraps
// ErrClosed. Every Topic handle of the client that has published is
// stopped (Topic.Stop): what is queued is sent, and later publishes fail.
//
// Close waits until every Receive call has returned and every queued
// message is stored or has failed, at most the close timeout
// (WithCloseTimeout, default 30s); after that it returns an
// ErrCloseTimeout error naming what is still running, which goes on in
// the background (a topic's messages until their PublishSettings.Timeout,
// a Receive until its handlers return). Other calls in progress are not
// waited for: their contexts bound them.
//
// Calling Close again is harmless: it waits the same way for what is still
// running, and returns nil once nothing is. Called from inside a Receive
// handler (on the handler's own goroutine; a handler of any client
// counts), Close does not wait for Receive calls, since the handler's
// Receive cannot return before the handler does; it still waits for the
// topics. Receive then returns once the handler has returned. A handler
// that waits for another goroutine's Close deadlocks until the close
// timeout. The caller owns the NATS connection: Close does not close it.
func (c *Client) Close() error {
	waitReceives := !inHandler()
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		c.closeNow(ErrClosed)
		if len(c.receives) == 0 {
			close(c.receivesEnded)
		}
		c.stopTopicsLocked()
	}
	c.mu.Unlock()

	timer := time.NewTimer(c.cfg.closeTimeout)
	defer timer.Stop()
	if waitReceives {
		select {
		case <-c.receivesEnded:
		case <-timer.C:
			return c.closeTimeoutError(waitReceives)
		}
	}
	select {
	case <-c.topicsStopped:
	case <-timer.C:
		return c.closeTimeoutError(waitReceives)
	}
	return nil
}

// stopTopicsLocked stops every tracked topic handle, each on a goroutine
// of its own, which ends once the handle's queued messages are stored or
// have failed. Called with c.mu held, once.
func (c *Client) stopTopicsLocked() {
	for wp := range c.topics {
		if t := wp.Value(); t != nil {
			c.stopping[t] = struct{}{}
		}
	}
	clear(c.topics)
	if len(c.stopping) == 0 {
		close(c.topicsStopped)
		return
	}
	for t := range c.stopping {
		go func() {
			t.Stop()
			c.mu.Lock()
			defer c.mu.Unlock()
			delete(c.stopping, t)
			if len(c.stopping) == 0 {
				close(c.topicsStopped)
			}
		}()
	}
}

// closeTimeoutError says what Close waited for in vain.
func (c *Client) closeTimeoutError(receives bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var parts []string
	if names := slices.Sorted(maps.Keys(c.receives)); receives && len(names) > 0 {
		n := 0
		for _, name := range names {
			n += c.receives[name]
		}
		parts = append(parts, fmt.Sprintf("%d Receive calls (%s)", n, strings.Join(names, ", ")))
	}
	if len(c.stopping) > 0 {
		var names []string
		for t := range c.stopping {
			names = append(names, t.String())
		}
		slices.Sort(names)
		parts = append(parts, fmt.Sprintf("publishing to %s", strings.Join(names, ", ")))
	}
	if len(parts) == 0 {
		parts = []string{"nothing (it finished just now)"}
	}
	return fmt.Errorf("%w: still running after %v: %s", ErrCloseTimeout, c.cfg.closeTimeout, strings.Join(parts, "; "))
}

// startReceive counts a Receive call in progress, so that Close can wait
// for it, and returns ctx, cancelled also when the client closes: Close
// ends Receive as cancelling its context does. Receive returns end(err),
// which turns the nil of a Receive that Close ended into ErrClosed.
// startReceive fails with ErrClosed after Close.
func (c *Client) startReceive(ctx context.Context, s *Subscription) (_ context.Context, end func(error) error, _ error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, nil, ErrClosed
	}
	name := s.String()
	c.receives[name]++
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(c.closing, func() { cancel(ErrClosed) })
	return ctx, func(err error) error {
		stop()
		if err == nil && errors.Is(context.Cause(ctx), ErrClosed) {
			err = fmt.Errorf("receive %s: %w", s, ErrClosed)
		}
		cancel(nil)
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.receives[name]--; c.receives[name] == 0 {
			delete(c.receives, name)
		}
		if c.closed && len(c.receives) == 0 {
			close(c.receivesEnded)
		}
		return err
	}, nil
}

// trackTopic records that t has a publisher, for Close to stop. It
// reports false once the client is closed: t's publisher must then refuse
// every message, since Close will not flush it.
func (c *Client) trackTopic(t *Topic) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	wp := weak.Make(t)
	c.topics[wp] = struct{}{}
	runtime.AddCleanup(t, c.untrackTopic, wp)
	return true
}

// untrackTopic forgets a handle that was stopped or collected.
func (c *Client) untrackTopic(wp weak.Pointer[Topic]) {
	c.mu.Lock()
	delete(c.topics, wp)
	c.mu.Unlock()
}

// handlerFunc is the function every Receive handler is called from, on a
// goroutine of its own.
var handlerFunc = runtime.FuncForPC(reflect.ValueOf((*receiver).handle).Pointer()).Name()

// inHandler reports whether the calling goroutine is running a Receive
// handler (of any client).
func inHandler() bool {
	pcs := make([]uintptr, 64)
	for {
		n := runtime.Callers(2, pcs)
		if n < len(pcs) {
			pcs = pcs[:n]
			break
		}
		pcs = make([]uintptr, 2*len(pcs)) // the handler's frame is at the bottom
	}
	frames := runtime.CallersFrames(pcs)
	for {
		f, more := frames.Next()
		if f.Function == handlerFunc {
			return true
		}
		if !more {
			return false
		}
	}
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

// ensureLayout makes sure, once, that the account holds this build's
// storage layout (EnsureLayout) before the client writes anything.
func (c *Client) ensureLayout(ctx context.Context) error {
	if c.layoutOK.Load() {
		return nil
	}
	c.layoutMu.Lock()
	defer c.layoutMu.Unlock()
	if c.layoutOK.Load() {
		return nil
	}
	// Not in retryAPI's bounded attempts: a migration may take a while.
	// A failure is tried again for up to the API timeout.
	giveUp := time.Now().Add(c.cfg.apiTimeout)
	for {
		err := EnsureLayout(ctx, c.js, c.cfg.replicas, c.cfg.logger)
		if err == nil {
			c.layoutOK.Store(true)
			return nil
		}
		if errors.Is(err, ErrLayoutNewer) || time.Now().After(giveUp) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// buckets returns the subscription registry bucket.
func (c *Client) buckets(ctx context.Context) (subs jetstream.KeyValue, err error) {
	subs, _, _, err = c.registry(ctx)
	return subs, err
}

// registry returns the registry buckets, creating them on first use, and
// the lease bucket's TTL.
func (c *Client) registry(ctx context.Context) (subs, leases jetstream.KeyValue, leaseTTL time.Duration, err error) {
	if err := c.ensureLayout(ctx); err != nil {
		return nil, nil, 0, err
	}
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
	var kv jetstream.KeyValue
	err := c.retryAPI(ctx, func(ctx context.Context) (err error) {
		kv, err = c.js.KeyValue(ctx, cfg.Bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			kv, err = c.js.CreateKeyValue(ctx, cfg)
			if errors.Is(err, jetstream.ErrBucketExists) {
				kv, err = c.js.KeyValue(ctx, cfg.Bucket)
			}
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// apiAttempt bounds the first attempt of an API request that retryAPI
// makes; each one after it may take twice as long as the one before, up
// to the client's API timeout.
const apiAttempt = 2 * time.Second

// retryAPI makes the API request f in attempts of at first apiAttempt,
// again after a transient failure, for at most the client's API timeout
// in all (or until ctx ends). A request a cluster leaves unanswered (its
// leader killed while it was on its way, or several clients creating
// one stream at once) is then asked again instead of waited for until
// the timeout.
func (c *Client) retryAPI(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.apiTimeout)
	defer cancel()
	return c.retryUntil(ctx, f)
}

// retryUntil is retryAPI bounded by ctx alone: for a call whose caller
// gave it a deadline (a Pub/Sub client's CreateSubscription waits a
// minute), and whose request a cluster may drop without an answer (a
// meta leader that cannot propose a consumer's creation does not reply).
// The attempts grow, so that a cluster slow to answer (elections under
// load) is waited for in the end rather than asked again and again.
func (c *Client) retryUntil(ctx context.Context, f func(context.Context) error) error {
	backoff := 50 * time.Millisecond
	attempt := min(c.cfg.apiTimeout, apiAttempt)
	for {
		actx, acancel := context.WithTimeout(ctx, attempt)
		err := f(actx)
		acancel()
		attempt = max(attempt, min(2*attempt, c.cfg.apiTimeout))
		if err == nil || ctx.Err() != nil || !transient(err) {
			return err
		}
		select {
		case <-time.After(backoff):
			backoff = min(2*backoff, 500*time.Millisecond)
		case <-ctx.Done():
			return err
		}
	}
}
