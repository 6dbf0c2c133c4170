package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/keyrouter"
)

// closeSubs are the kinds of subscription the Close tests receive from.
var closeSubs = []struct {
	name string
	cfg  adapter.SubscriptionConfig
}{
	{"unordered", adapter.SubscriptionConfig{}},
	{"per-key", adapter.SubscriptionConfig{EnableMessageOrdering: true, Delivery: adapter.DeliveryPerKey}},
	{"partitioned", adapter.SubscriptionConfig{EnableMessageOrdering: true, Delivery: adapter.DeliveryPartitioned}},
}

// Close ends a running Receive at once, not at the next check of the
// subscription: the handlers' context is cancelled, Receive returns
// ErrClosed, and Close returns only after it has.
func TestCloseEndsReceive(t *testing.T) {
	for _, tc := range closeSubs {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			topic := e.createTopic("orders")
			cfg := tc.cfg
			cfg.Topic = topic
			sub := e.createSub("orders-sub", cfg)
			started := make(chan struct{}, 1)
			var running atomic.Int32 // handlers that have not returned
			r := startReceive(t, sub, func(ctx context.Context, m *adapter.Message) {
				running.Add(1)
				defer running.Add(-1)
				select {
				case started <- struct{}{}:
				default:
				}
				<-ctx.Done() // held until Receive ends
				m.Nack()
			})
			publish(t, topic, "held", "key-1")
			select {
			case <-started:
			case <-time.After(20 * time.Second):
				t.Fatal("no delivery")
			}

			start := time.Now()
			err := e.client.Close()
			took := time.Since(start)
			if err != nil {
				t.Fatalf("Close: %v", err)
			}
			if n := running.Load(); n != 0 {
				t.Fatalf("Close returned before %d handlers did", n)
			}
			if took > 500*time.Millisecond {
				t.Fatalf("Close took %v, want under 500ms", took)
			}
			// Receive's work is done: all that is left is its return.
			r.wantClosed(t, time.Second)
			if err := sub.Receive(context.Background(), func(context.Context, *adapter.Message) {}); !errors.Is(err, adapter.ErrClosed) {
				t.Fatalf("Receive after Close: %v, want ErrClosed", err)
			}
			if _, err := e.client.CreateTopic(context.Background(), "later"); !errors.Is(err, adapter.ErrClosed) {
				t.Fatalf("CreateTopic after Close: %v, want ErrClosed", err)
			}
		})
	}
}

// Close sends what topic handles have queued and returns once it is
// stored; later publishes fail with ErrClosed, on old handles and new.
func TestCloseFlushesPublishes(t *testing.T) {
	e := newEnv(t)
	e.createTopic("queued")
	topic := e.client.Topic("queued")
	// Nothing goes until Close: batches wait an hour or for 10,000 messages.
	topic.PublishSettings.DelayThreshold = time.Hour
	topic.PublishSettings.CountThreshold = 10000
	var results []*adapter.PublishResult
	for i := range 50 {
		key := ""
		if i%5 != 0 {
			key = fmt.Sprint("key-", i%5)
		}
		results = append(results, topic.Publish(context.Background(), &adapter.Message{Data: []byte(fmt.Sprint(i)), OrderingKey: key}))
	}
	for i, r := range results {
		select {
		case <-r.Ready():
			t.Fatalf("message %d done before Close: the batches did not wait", i)
		default:
		}
	}

	if err := e.client.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for i, r := range results {
		select {
		case <-r.Ready():
		default:
			t.Fatalf("message %d not done when Close returned", i)
		}
		if _, err := r.Get(context.Background()); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	stream, err := jetstreamOf(t, e).Stream(context.Background(), keyrouter.StreamName(project, "queued"))
	if err != nil {
		t.Fatal(err)
	}
	if n := stream.CachedInfo().State.Msgs; n != 50 {
		t.Fatalf("%d messages stored, want 50", n)
	}
	for name, tp := range map[string]*adapter.Topic{"the flushed handle": topic, "a new handle": e.client.Topic("queued")} {
		if _, err := tp.Publish(context.Background(), &adapter.Message{Data: []byte("late")}).Get(context.Background()); !errors.Is(err, adapter.ErrClosed) {
			t.Errorf("Publish on %s after Close: %v, want ErrClosed", name, err)
		}
		tp.Flush() // nothing queued: returns at once
	}
}

// Close may be called again, and from several goroutines at once: every
// call returns nil once the Receive calls have returned.
func TestCloseTwice(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("twice")
	sub := e.createSub("twice-sub", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	got := make(chan struct{}, 1)
	r := startReceive(t, sub, func(_ context.Context, m *adapter.Message) {
		m.Ack()
		select {
		case got <- struct{}{}:
		default:
		}
	})
	publish(t, topic, "one", "k")
	select {
	case <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("no delivery")
	}

	const callers = 4
	results := make(chan error, callers)
	for range callers {
		go func() { results <- e.client.Close() }()
	}
	for range callers {
		select {
		case err := <-results:
			if err != nil {
				t.Fatalf("concurrent Close: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("concurrent Close did not return")
		}
	}
	r.wantClosed(t, time.Second)
	if err := e.client.Close(); err != nil {
		t.Fatalf("Close again: %v", err)
	}
}

// A handler may call Close: Close does not wait for the handler's own
// Receive (which waits for the handler), and that Receive returns
// ErrClosed once the handler has returned.
func TestCloseFromHandler(t *testing.T) {
	for _, tc := range closeSubs {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			topic := e.createTopic("inside")
			cfg := tc.cfg
			cfg.Topic = topic
			sub := e.createSub("inside-sub", cfg)
			closed := make(chan error, 1)
			r := startReceive(t, sub, func(_ context.Context, m *adapter.Message) {
				select {
				case closed <- e.client.Close():
				default: // another delivery, while Receive ends
				}
				m.Ack()
			})
			publish(t, topic, "stop", "key-1")
			select {
			case err := <-closed:
				if err != nil {
					t.Fatalf("Close in a handler: %v", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("Close in a handler did not return (or no delivery)")
			}
			r.wantClosed(t, 20*time.Second)
			if err := e.client.Close(); err != nil {
				t.Fatalf("Close after: %v", err)
			}
		})
	}
}

// Close waits at most the close timeout: a handler that ignores its
// context keeps Receive running, and Close says so.
func TestCloseTimeout(t *testing.T) {
	e := newEnv(t, adapter.WithCloseTimeout(300*time.Millisecond))
	topic := e.createTopic("stuck")
	sub := e.createSub("stuck-sub", adapter.SubscriptionConfig{Topic: topic})
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	r := startReceive(t, sub, func(_ context.Context, m *adapter.Message) {
		select {
		case started <- struct{}{}:
		default:
		}
		<-release // ignores its context
		m.Ack()
	})
	publish(t, topic, "stuck", "")
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("no delivery")
	}

	start := time.Now()
	err := e.client.Close()
	took := time.Since(start)
	if !errors.Is(err, adapter.ErrCloseTimeout) || !strings.Contains(err.Error(), sub.String()) {
		t.Fatalf("Close with a stuck handler: %v, want ErrCloseTimeout naming %s", err, sub)
	}
	if took < 300*time.Millisecond || took > 5*time.Second {
		t.Fatalf("Close took %v, want about 300ms", took)
	}
	close(release)
	r.wantClosed(t, 20*time.Second)
	if err := e.client.Close(); err != nil {
		t.Fatalf("Close once the handler returned: %v", err)
	}
}

// A per-key Receive whose key discovery has a backlog of new keys (more
// than its buffer holds, while it creates their consumers) ends promptly
// when cancelled: its discovery's callback, blocked on the full buffer,
// must not hold the stop until the client's API timeout (10 s), which
// outlasts the sidecar's default shutdown timeout (5 s).
func TestReceiveEndsWithDiscoveryBacklog(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("orders")
	sub := e.createSub("orders-sub", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, Delivery: adapter.DeliveryPerKey})
	const keys = 4000
	var results []*adapter.PublishResult
	for i := range keys {
		results = append(results, topic.Publish(context.Background(), &adapter.Message{Data: []byte("m"), OrderingKey: fmt.Sprintf("key-%d", i)}))
	}
	for _, r := range results {
		if _, err := r.Get(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	started := make(chan struct{}, 1)
	r := startReceive(t, sub, func(ctx context.Context, m *adapter.Message) {
		select {
		case started <- struct{}{}:
		default:
		}
		<-ctx.Done()
		m.Nack()
	})
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery")
	}
	start := time.Now()
	if err := r.stop(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Receive: %v", err)
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("Receive took %v to end after its context was cancelled, want under 4 s", took)
	}
}
