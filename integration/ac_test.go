package integration

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// The acceptance criteria AC-001..AC-010 of the message ordering
// specification, against the library on an embedded nats-server.

// TestAC001 — AC-001: create a topic and publish with an ordering key.
func TestAC001(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("ordered-events")
	id := publish(t, topic, "event-1", "user-123")
	if id == "" {
		t.Fatal("Publish returned an empty message id")
	}
	// The message is stored under its key's subject, with the key beside it.
	js := jetstreamOf(t, e)
	stream, err := js.Stream(context.Background(), keyrouter.StreamName(project, "ordered-events"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := stream.GetLastMsgForSubject(context.Background(), keyrouter.KeyedSubject(project, "ordered-events", "user-123"))
	if err != nil {
		t.Fatalf("message not stored under its key's subject: %v", err)
	}
	if string(m.Data) != "event-1" || m.Header.Get("Jetorder-Ordering-Key") != "user-123" || m.Header.Get("Nats-Msg-Id") != id {
		t.Fatalf("stored message = %q headers %v", m.Data, m.Header)
	}
}

// TestAC002 — AC-002: messages with the same key are delivered in order.
func TestAC002(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("ordered-events")
	sub := e.createSub("ordered-sub", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	var got recorder
	startReceive(t, sub, func(_ context.Context, m *adapter.Message) {
		got.add(string(m.Data))
		m.Ack()
	})
	for _, s := range []string{"first", "second", "third"} {
		publish(t, topic, s, "user-123")
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return got.count() >= 3 }, "received %v", got.snapshot)
	if want := []string{"first", "second", "third"}; !slices.Equal(got.snapshot(), want) {
		t.Fatalf("received %v, want %v", got.snapshot(), want)
	}
}

// concurrency tracks how many handlers run at once.
type concurrency struct {
	cur, max atomic.Int32
}

func (c *concurrency) enter() {
	n := c.cur.Add(1)
	for {
		m := c.max.Load()
		if n <= m || c.max.CompareAndSwap(m, n) {
			return
		}
	}
}

func (c *concurrency) leave() { c.cur.Add(-1) }

// TestAC003 — AC-003: one handler at a time per key.
func TestAC003(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("ordered-events")
	sub := e.createSub("ordered-sub", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	var conc concurrency
	var got recorder
	startReceive(t, sub, func(_ context.Context, m *adapter.Message) {
		conc.enter()
		time.Sleep(50 * time.Millisecond) // the handler's own work
		got.add(string(m.Data))
		conc.leave()
		m.Ack()
	})
	var want []string
	for i := range 5 {
		s := "msg-" + string(rune('0'+i))
		want = append(want, s)
		publish(t, topic, s, "user-123")
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return got.count() >= 5 }, "received %v", got.snapshot)
	if m := conc.max.Load(); m != 1 {
		t.Fatalf("max concurrent handlers for one key = %d, want 1", m)
	}
	if !slices.Equal(got.snapshot(), want) {
		t.Fatalf("received %v, want %v", got.snapshot(), want)
	}
}

// TestAC004 — AC-004: different keys are handled concurrently.
func TestAC004(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("ordered-events")
	sub := e.createSub("ordered-sub", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	var conc concurrency
	var got recorder
	allIn := make(chan struct{})
	var closeOnce sync.Once
	startReceive(t, sub, func(_ context.Context, m *adapter.Message) {
		conc.enter()
		if conc.cur.Load() == 3 {
			closeOnce.Do(func() { close(allIn) })
		}
		// Hold the handler until all three keys are in handlers at once (or
		// give up after a while, and the assertion below fails).
		select {
		case <-allIn:
		case <-time.After(5 * time.Second):
		}
		got.add(string(m.Data))
		conc.leave()
		m.Ack()
	})
	publish(t, topic, "user1-msg1", "user-1")
	publish(t, topic, "user2-msg1", "user-2")
	publish(t, topic, "user3-msg1", "user-3")
	testutil.Eventually(t, 15*time.Second, func() bool { return got.count() >= 3 }, "received %v", got.snapshot)
	if m := conc.max.Load(); m != 3 {
		t.Fatalf("max concurrent handlers across three keys = %d, want 3", m)
	}
}

// TestAC005 — AC-005: a message whose deadline passes is redelivered before the next one of its key.
func TestAC005(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("ordered-events")
	sub := e.createSub("ordered-sub", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, AckDeadline: time.Second})
	var got recorder
	var firstDelivered atomic.Bool
	startReceive(t, sub, func(_ context.Context, m *adapter.Message) {
		got.add(string(m.Data))
		if string(m.Data) == "first" && firstDelivered.CompareAndSwap(false, true) {
			return // don't ack: let the deadline pass
		}
		m.Ack()
	})
	publish(t, topic, "first", "user-123")
	publish(t, topic, "second", "user-123")
	testutil.Eventually(t, 15*time.Second, func() bool { return got.contains("second") }, "second never delivered: %v", got.snapshot)
	msgs := got.snapshot()
	lastFirst, firstSecond := -1, -1
	for i, m := range msgs {
		if m == "first" {
			lastFirst = i
		}
		if m == "second" && firstSecond < 0 {
			firstSecond = i
		}
	}
	if lastFirst < 1 {
		t.Fatalf("first was not redelivered: %v", msgs)
	}
	if lastFirst > firstSecond {
		t.Fatalf("second delivered before first was redelivered and acked: %v", msgs)
	}
}

// TestAC006 — AC-006: unkeyed messages are not held back by a blocked key.
func TestAC006(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("ordered-events")
	sub := e.createSub("ordered-sub", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	var got recorder
	startReceive(t, sub, func(_ context.Context, m *adapter.Message) {
		got.add(string(m.Data))
		if m.OrderingKey != "" {
			return // block ordered messages: never ack
		}
		m.Ack()
	})
	publish(t, topic, "blocked", "user-123")
	publish(t, topic, "blocked-2", "user-123")
	publish(t, topic, "unordered", "")
	testutil.Eventually(t, 10*time.Second, func() bool { return got.contains("unordered") }, "unordered message held back: %v", got.snapshot)
	if got.contains("blocked-2") {
		t.Fatalf("blocked-2 delivered while blocked is unacked: %v", got.snapshot())
	}
}

// TestAC007 — AC-007: each subscription gets its own ordered copy.
func TestAC007(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("ordered-events")
	sub1 := e.createSub("sub-1", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	sub2 := e.createSub("sub-2", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	var got1, got2 recorder
	startReceive(t, sub1, func(_ context.Context, m *adapter.Message) { got1.add(string(m.Data)); m.Ack() })
	startReceive(t, sub2, func(_ context.Context, m *adapter.Message) { got2.add(string(m.Data)); m.Ack() })
	publish(t, topic, "first", "user-123")
	publish(t, topic, "second", "user-123")
	testutil.Eventually(t, 10*time.Second, func() bool { return got1.count() >= 2 && got2.count() >= 2 }, "received %v and %v", got1.snapshot, got2.snapshot)
	want := []string{"first", "second"}
	if !slices.Equal(got1.snapshot(), want) || !slices.Equal(got2.snapshot(), want) {
		t.Fatalf("sub-1 got %v, sub-2 got %v, want %v each", got1.snapshot(), got2.snapshot(), want)
	}
}

// TestAC008 — AC-008: invalid ordering keys are rejected with the specification's texts.
func TestAC008(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("ordered-events")
	ctx := context.Background()

	// In Go, as in protobuf, the empty string means "no key"; the empty-key
	// rule applies where a key can be present and empty (the sidecar's HTTP
	// API). The validator itself rejects it with the specification's text.
	if err := keyrouter.ValidateOrderingKey(""); !errors.Is(err, adapter.ErrEmptyOrderingKey) || err.Error() != "Ordering key cannot be empty" {
		t.Fatalf("empty key: %v", err)
	}

	_, err := topic.Publish(ctx, &adapter.Message{Data: []byte("test"), OrderingKey: strings.Repeat("x", 1025)}).Get(ctx)
	if !errors.Is(err, adapter.ErrOrderingKeyTooLong) || !strings.Contains(err.Error(), "Ordering key exceeds maximum length") {
		t.Fatalf("1025-byte key: err = %v", err)
	}
	_, err = topic.Publish(ctx, &adapter.Message{Data: []byte("test"), OrderingKey: "bad\xffkey"}).Get(ctx)
	if !errors.Is(err, adapter.ErrOrderingKeyNotUTF8) {
		t.Fatalf("non-UTF-8 key: err = %v", err)
	}
	// A rejected publish stores nothing; the longest valid key is fine.
	js := jetstreamOf(t, e)
	stream, err := js.Stream(ctx, keyrouter.StreamName(project, "ordered-events"))
	if err != nil {
		t.Fatal(err)
	}
	if n := stream.CachedInfo().State.Msgs; n != 0 {
		t.Fatalf("rejected publishes stored %d messages", n)
	}
	publish(t, topic, "test", strings.Repeat("x", 1024))
	// An empty key in Go publishes without a key.
	publish(t, topic, "no key", "")
	m, err := stream.GetLastMsgForSubject(ctx, keyrouter.UnkeyedSubject(project, "ordered-events"))
	if err != nil || string(m.Data) != "no key" || m.Header.Get("Jetorder-Ordering-Key") != "" {
		t.Fatalf("empty-key message not stored unkeyed: %v", err)
	}
}

// TestAC009 — AC-009: ordering keys need no opt-in on the topic.
func TestAC009(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("ordered-events")
	if id := publish(t, topic, "test", "user-123"); id == "" {
		t.Fatal("no message id")
	}
}
