// Package broker is what the sidecar's gRPC and HTTP APIs share: one
// adapter client per project over one NATS connection, one publisher handle
// per topic, and the metrics.
package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/metrics"
	"github.com/jetorder/jetorder/keyrouter"
)

// publishDelay is how long a topic handle waits to batch messages of a key
// before sending them. Publish requests arrive batched by the client
// already, so the sidecar adds little waiting of its own.
const publishDelay = time.Millisecond

// maxProjects bounds the adapter clients a broker keeps, so requests naming
// ever new projects cannot grow it without limit.
const maxProjects = 1000

// ErrTooManyProjects is returned for a project beyond maxProjects.
var ErrTooManyProjects = fmt.Errorf("more than %d projects in use", maxProjects)

// Broker holds the sidecar's adapter clients and publisher handles. It is
// safe for concurrent use.
type Broker struct {
	nc      *nats.Conn
	opts    []adapter.Option
	log     *slog.Logger
	Metrics *metrics.Registry
	// BucketReplicas is the replicas of the KV buckets the broker creates
	// (JO_DIDCOMM_ORDERS, see stamp.go); 0 means 1. Set before use.
	BucketReplicas int
	// Durable, when set, makes every write before the call durable (the
	// embedded server's group commit): stamped messages go only once
	// their orders' reservation is, so that a power cut can never keep a
	// message whose order it rolled back. Set before use.
	Durable func(context.Context) error
	stamps  stamper

	mu      sync.Mutex
	clients map[string]*adapter.Client // project -> client
	topics  map[string]*adapter.Topic  // projects/P/topics/T -> publisher handle
	closed  bool
}

// New returns a broker over nc; opts configure every adapter client.
func New(nc *nats.Conn, log *slog.Logger, m *metrics.Registry, opts ...adapter.Option) *Broker {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if m == nil {
		m = metrics.New()
	}
	return &Broker{
		nc: nc, opts: opts, log: log, Metrics: m,
		clients: make(map[string]*adapter.Client),
		topics:  make(map[string]*adapter.Topic),
	}
}

// Conn is the broker's NATS connection.
func (b *Broker) Conn() *nats.Conn { return b.nc }

// Client returns the adapter client of project, creating it on first use.
func (b *Broker) Client(project string) (*adapter.Client, error) {
	if err := keyrouter.ValidateProjectID(project); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, adapter.ErrClosed
	}
	if c, ok := b.clients[project]; ok {
		return c, nil
	}
	if len(b.clients) >= maxProjects {
		return nil, ErrTooManyProjects
	}
	c, err := adapter.NewClient(b.nc, project, b.opts...)
	if err != nil {
		return nil, err
	}
	b.clients[project] = c
	return c, nil
}

// Topic returns the shared publisher handle of a topic.
func (b *Broker) Topic(project, topic string) (*adapter.Topic, error) {
	if err := keyrouter.ValidateTopicID(topic); err != nil {
		return nil, err
	}
	c, err := b.Client(project)
	if err != nil {
		return nil, err
	}
	name := "projects/" + project + "/topics/" + topic
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, adapter.ErrClosed
	}
	t, ok := b.topics[name]
	if !ok {
		t = c.Topic(topic)
		t.PublishSettings.DelayThreshold = publishDelay
		b.topics[name] = t
	}
	return t, nil
}

// Publish publishes msgs to a topic and waits until each is stored. It
// checks every message first: a request with one invalid message stores
// none (the error names it as messages[i]). Messages that ask for a
// DIDComm sender_order (AttrDIDComm) are then stamped (stamp.go). It
// returns the ids, or the first error; messages that failed do not keep
// their key paused, since each request stands alone (the client pauses its
// own key). ctx bounds the whole wait.
func (b *Broker) Publish(ctx context.Context, project, topic string, msgs []*adapter.Message) (ids []string, err error) {
	t, err := b.Topic(project, topic)
	if err != nil {
		return nil, err
	}
	defer func() {
		if errors.Is(err, adapter.ErrTopicNotFound) {
			b.Forget(project, topic) // no handle kept for names that name nothing
		}
	}()
	for i, m := range msgs {
		if err := t.Validate(m); err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
	}
	st, err := b.stamp(ctx, project, t, msgs) // nil unless a message asks for a DIDComm sender_order
	if err != nil {
		return nil, err
	}
	start := time.Now()
	var mt *metrics.Topic // once a message is stored: no series for names that name no topic
	results := make([]*adapter.PublishResult, len(msgs))
	for i, m := range msgs {
		results[i] = t.Publish(ctx, m)
	}
	defer st.release(results) // once every result is known
	ids = make([]string, len(msgs))
	var first error
	var paused []string
	for i, r := range results {
		id, err := r.Get(ctx)
		if err != nil {
			b.Metrics.PublishFails.Inc()
			if first == nil {
				first = err
			}
			if k := msgs[i].OrderingKey; k != "" {
				paused = append(paused, k)
			}
			continue
		}
		ids[i] = id
		if mt == nil {
			mt = b.Metrics.Topic("projects/" + project + "/topics/" + topic)
		}
		mt.Published.Inc()
		mt.PublishLat.Observe(time.Since(start).Seconds())
	}
	if len(paused) > 0 {
		// Wait for every result first, so that no message of this request
		// is stored after one that failed; then let the key go on.
		for _, k := range paused {
			t.ResumePublish(k)
		}
	}
	if first != nil {
		return nil, first
	}
	return ids, nil
}

// Forget drops the publisher handle of a deleted topic, after flushing it.
func (b *Broker) Forget(project, topic string) {
	name := "projects/" + project + "/topics/" + topic
	b.mu.Lock()
	t := b.topics[name]
	delete(b.topics, name)
	b.mu.Unlock()
	if t != nil {
		t.Stop()
	}
}

// Close flushes every publisher handle and closes the clients. The NATS
// connection is the caller's.
func (b *Broker) Close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	topics, clients := b.topics, b.clients
	b.mu.Unlock()
	var wg sync.WaitGroup
	for _, t := range topics {
		wg.Go(t.Stop)
	}
	wg.Wait()
	b.stamps.wait()
	for _, c := range clients {
		if err := c.Close(); err != nil && !errors.Is(err, adapter.ErrClosed) {
			b.log.Warn("close client", "project", c.Project(), "err", err)
		}
	}
}
