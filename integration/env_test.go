package integration

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/embedded"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/testutil"
)

const project = itest.Project

// env is one embedded server and a client of it.
type env struct {
	t      *testing.T
	srv    *embedded.Server
	nc     *nats.Conn
	client *adapter.Client
}

// testLogger gives the adapter the tests' logger, itest.Log.
func testLogger() []adapter.Option { return []adapter.Option{adapter.WithLogger(itest.Log())} }

func newEnv(t *testing.T, opts ...adapter.Option) *env {
	t.Helper()
	opts = append(testLogger(), opts...)
	srv := testutil.Server(t)
	e := &env{t: t, srv: srv}
	e.nc, e.client = e.connect(opts...)
	return e
}

// connect opens another connection and client, as a second process would.
func (e *env) connect(opts ...adapter.Option) (*nats.Conn, *adapter.Client) {
	e.t.Helper()
	nc := testutil.Connect(e.t, e.srv.ClientURL())
	c, err := adapter.NewClient(nc, project, append(testLogger(), opts...)...)
	if err != nil {
		e.t.Fatalf("NewClient: %v", err)
	}
	return nc, c
}

func (e *env) createTopic(id string) *adapter.Topic {
	e.t.Helper()
	topic, err := e.client.CreateTopicWithConfig(context.Background(), id, &adapter.TopicConfig{KeyStreams: itest.KeyStreams})
	if err != nil {
		e.t.Fatalf("CreateTopic(%s): %v", id, err)
	}
	return topic
}

// withTestDelivery applies itest.Delivery, the delivery mode the tests
// run with, to cfg.
func withTestDelivery(cfg adapter.SubscriptionConfig) adapter.SubscriptionConfig {
	if cfg.EnableMessageOrdering && cfg.Delivery == "" && itest.Delivery != "" {
		cfg.Delivery = itest.Delivery
	}
	return cfg
}

func (e *env) createSub(id string, cfg adapter.SubscriptionConfig) *adapter.Subscription {
	e.t.Helper()
	cfg = withTestDelivery(cfg)
	sub, err := e.client.CreateSubscription(context.Background(), id, cfg)
	if err != nil {
		e.t.Fatalf("CreateSubscription(%s): %v", id, err)
	}
	return sub
}

func publish(t *testing.T, topic *adapter.Topic, data, key string) string {
	t.Helper()
	id, err := topic.Publish(context.Background(), &adapter.Message{Data: []byte(data), OrderingKey: key}).Get(context.Background())
	if err != nil {
		t.Fatalf("Publish(%q, key %q): %v", data, key, err)
	}
	return id
}

// receiving is a Receive call running in the background.
type receiving struct {
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// startReceive runs sub.Receive(f) until stop is called or the test ends.
func startReceive(t *testing.T, sub *adapter.Subscription, f func(context.Context, *adapter.Message)) *receiving {
	t.Helper()
	return startReceiving(t, func(ctx context.Context) error { return sub.Receive(ctx, f) })
}

// startReceiving runs receive (a Receive call of some kind) until stop is
// called or the test ends.
func startReceiving(t *testing.T, receive func(context.Context) error) *receiving {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &receiving{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- receive(ctx) }()
	t.Cleanup(func() { r.stop() })
	return r
}

// stop ends Receive and returns its error.
func (r *receiving) stop() error {
	r.once.Do(func() {
		r.cancel()
		select {
		case r.err = <-r.done:
		case <-time.After(30 * time.Second):
			r.err = errors.New("Receive did not return within 30s of cancel")
		}
	})
	return r.err
}

// wait returns Receive's error once it ends by itself.
func (r *receiving) wait(timeout time.Duration) (error, bool) {
	select {
	case err := <-r.done:
		r.once.Do(func() { r.err = err })
		return err, true
	case <-time.After(timeout):
		return nil, false
	}
}

// wantClosed waits up to timeout for Receive to end by itself (the client
// was closed) and fails the test unless it returned ErrClosed.
func (r *receiving) wantClosed(t *testing.T, timeout time.Duration) {
	t.Helper()
	err, ok := r.wait(timeout)
	switch {
	case !ok:
		t.Fatalf("Receive did not return within %v after Close", timeout)
	case !errors.Is(err, adapter.ErrClosed):
		t.Fatalf("Receive returned %v, want ErrClosed", err)
	}
}

// recorder collects delivered payloads in order, safe for handlers.
type recorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) add(s string) {
	r.mu.Lock()
	r.msgs = append(r.msgs, s)
	r.mu.Unlock()
}

func (r *recorder) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.msgs...)
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs)
}

func (r *recorder) contains(s string) bool {
	for _, m := range r.snapshot() {
		if m == s {
			return true
		}
	}
	return false
}
