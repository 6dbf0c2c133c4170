package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/faultproxy"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// storedOrder reads every message of a topic's stream in stream order and
// checks, per key, that the checker-encoded indexes are 0, 1, 2, ... with
// nothing missing or repeated. It returns the number of messages read.
func storedOrder(t *testing.T, e *env, topicID string, want map[string]int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := jetstreamOf(t, e).Stream(ctx, keyrouter.StreamName(project, topicID))
	if err != nil {
		t.Fatal(err)
	}
	total := int(stream.CachedInfo().State.Msgs)
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	it, err := cons.Messages()
	if err != nil {
		t.Fatal(err)
	}
	defer it.Stop()
	next := map[string]int{}
	for read := 0; read < total; read++ {
		m, err := it.Next()
		if err != nil {
			t.Fatalf("read message %d of %d: %v", read+1, total, err)
		}
		key, idx, err := ordercheck.Decode(m.Data())
		if err != nil {
			t.Fatal(err)
		}
		if idx != next[key] {
			t.Fatalf("key %q: stored message %d where %d was due", key, idx, next[key])
		}
		next[key]++
	}
	for key, n := range want {
		if next[key] != n {
			t.Fatalf("key %q: %d messages stored, want %d", key, next[key], n)
		}
	}
	return total
}

// TestAC010 — AC-010: with batching of 10 messages and 50 ms, 20 messages
// over 5 keys published without waiting all succeed, each with its own id,
// and each key's messages are stored in publish order.
func TestAC010(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("ordered-events")
	topic.PublishSettings.CountThreshold = 10
	topic.PublishSettings.DelayThreshold = 50 * time.Millisecond
	ctx := context.Background()
	var results []*adapter.PublishResult
	counts := map[string]int{}
	for i := range 20 {
		key := fmt.Sprint("user-", i%5)
		results = append(results, topic.Publish(ctx, &adapter.Message{Data: ordercheck.Encode(key, counts[key]), OrderingKey: key}))
		counts[key]++
	}
	ids := map[string]bool{}
	for i, r := range results {
		id, err := r.Get(ctx)
		if err != nil || id == "" {
			t.Fatalf("message %d: %q, %v", i, id, err)
		}
		ids[id] = true
	}
	if len(ids) != 20 {
		t.Fatalf("%d distinct ids for 20 messages", len(ids))
	}
	storedOrder(t, e, "ordered-events", counts)
}

// 64 goroutines publish over 100 keys without waiting for results; each key
// belongs to one goroutine, so its Publish calls have an order, and the
// stream must hold every key's messages in that order, once each.
func TestPublishOrderUnderConcurrency(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("concurrent")
	const goroutines, keys, perKey = 64, 100, 30
	ctx := context.Background()
	var wg sync.WaitGroup
	results := make(chan *adapter.PublishResult, keys*perKey)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perKey {
				for k := g; k < keys; k += goroutines {
					key := fmt.Sprint("key-", k)
					results <- topic.Publish(ctx, &adapter.Message{Data: ordercheck.Encode(key, i), OrderingKey: key})
				}
			}
		}()
	}
	wg.Wait()
	topic.Flush()
	close(results)
	for r := range results {
		if _, err := r.Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]int{}
	for k := range keys {
		want[fmt.Sprint("key-", k)] = perKey
	}
	if n := storedOrder(t, e, "concurrent", want); n != keys*perKey {
		t.Fatalf("%d messages stored, want %d", n, keys*perKey)
	}
}

// A message the server refuses for good pauses its key, and only its key,
// until ResumePublish.
func TestPublishFailurePausesOneKey(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("pausing")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Make the stream refuse messages over 1 KiB, so one message fails
	// after it was queued (the client's own limit is far larger).
	js := jetstreamOf(t, e)
	stream, err := js.Stream(ctx, keyrouter.StreamName(project, "pausing"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := stream.CachedInfo().Config
	cfg.MaxMsgSize = 1024
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	get := func(key string, data []byte) error {
		_, err := topic.Publish(ctx, &adapter.Message{Data: data, OrderingKey: key}).Get(ctx)
		return err
	}
	if err := get("a", []byte("a0")); err != nil {
		t.Fatal(err)
	}
	if err := get("a", make([]byte, 2048)); err == nil || errors.Is(err, adapter.ErrPublishingPaused) {
		t.Fatalf("oversized message: err = %v, want the server's refusal", err)
	}
	if err := get("a", []byte("a2")); !errors.Is(err, adapter.ErrPublishingPaused) {
		t.Fatalf("after the failure key a: err = %v, want ErrPublishingPaused", err)
	}
	if err := get("b", []byte("b0")); err != nil {
		t.Fatalf("key b must carry on: %v", err)
	}
	if err := get("", []byte("u0")); err != nil {
		t.Fatalf("unkeyed messages must carry on: %v", err)
	}
	topic.ResumePublish("a")
	if err := get("a", []byte("a3")); err != nil {
		t.Fatalf("after ResumePublish: %v", err)
	}
	// Stored: a0, b0, u0, a3 — nothing of a between a0 and a3.
	var got []string
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(m.Data()))
	}
	if strings.Join(got, ",") != "a0,b0,u0,a3" {
		t.Fatalf("stored %v", got)
	}
}

func TestPublishAfterStopAndFlowControl(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()

	stopped := e.createTopic("stopped")
	r := stopped.Publish(ctx, &adapter.Message{Data: []byte("before"), OrderingKey: "k"})
	stopped.Stop()
	if _, err := r.Get(ctx); err != nil {
		t.Fatalf("message queued before Stop: %v", err)
	}
	if _, err := stopped.Publish(ctx, &adapter.Message{Data: []byte("after")}).Get(ctx); !errors.Is(err, adapter.ErrTopicStopped) {
		t.Fatalf("after Stop: %v, want ErrTopicStopped", err)
	}

	limited := e.createTopic("limited")
	limited.PublishSettings.DelayThreshold = time.Hour // nothing leaves until Flush
	limited.PublishSettings.FlowControlSettings = adapter.FlowControlSettings{MaxOutstandingMessages: 2, LimitExceededBehavior: adapter.FlowControlSignalError}
	first := limited.Publish(ctx, &adapter.Message{Data: []byte("1")})
	second := limited.Publish(ctx, &adapter.Message{Data: []byte("2")})
	if _, err := limited.Publish(ctx, &adapter.Message{Data: []byte("3"), OrderingKey: "k"}).Get(ctx); !errors.Is(err, adapter.ErrFlowControlLimit) {
		t.Fatalf("third outstanding message: %v, want ErrFlowControlLimit", err)
	}
	limited.Flush()
	for _, r := range []*adapter.PublishResult{first, second} {
		if _, err := r.Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The refused keyed message paused its key: a later one must not be
	// stored in its place.
	if _, err := limited.Publish(ctx, &adapter.Message{Data: []byte("4"), OrderingKey: "k"}).Get(ctx); !errors.Is(err, adapter.ErrPublishingPaused) {
		t.Fatalf("after a flow-control refusal: %v, want ErrPublishingPaused", err)
	}

	// A blocked Publish sends what is queued; while its ack is held back
	// by the network, the wait ends with Publish's context.
	e.createTopic("blocking")
	proxy, err := faultproxy.Start(e.srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	proxied, err := adapter.NewClient(testutil.Connect(t, proxy.URL()), project)
	if err != nil {
		t.Fatal(err)
	}
	blocking := proxied.Topic("blocking")
	blocking.PublishSettings.DelayThreshold = time.Hour
	blocking.PublishSettings.FlowControlSettings = adapter.FlowControlSettings{MaxOutstandingMessages: 1}
	readLayout(t, proxied) // before the network holds its reply
	proxy.HoldReplies()
	held := blocking.Publish(ctx, &adapter.Message{Data: []byte("1")})
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := blocking.Publish(cctx, &adapter.Message{Data: []byte("2")}).Get(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("blocked publish with an ending context: %v, want DeadlineExceeded", err)
	}
	proxy.ReleaseReplies()
	if _, err := held.Get(ctx); err != nil {
		t.Fatalf("the message that held the room: %v", err)
	}
}

// Each way Publish can refuse a keyed message fails that message with its
// own error and pauses its key until ResumePublish; every other key, and
// everything published before, is stored as if nothing happened.
func TestPublishRefusalsPauseOnlyTheirKey(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("refusals")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cancelled, cancelNow := context.WithCancel(ctx)
	cancelNow()
	refusals := []struct {
		key  string
		call func(key string) error
		want error
	}{
		{"bad-attribute", func(key string) error {
			_, err := topic.Publish(ctx, &adapter.Message{Data: []byte("x"), OrderingKey: key, Attributes: map[string]string{"googclient_x": "v"}}).Get(ctx)
			return err
		}, adapter.ErrInvalidMessage},
		{"too-large", func(key string) error {
			_, err := topic.Publish(ctx, &adapter.Message{Data: make([]byte, e.nc.MaxPayload()+1), OrderingKey: key}).Get(ctx)
			return err
		}, adapter.ErrInvalidMessage},
		{"cancelled-context", func(key string) error {
			_, err := topic.Publish(cancelled, &adapter.Message{Data: []byte("x"), OrderingKey: key}).Get(ctx)
			return err
		}, context.Canceled},
	}
	publish := func(key string, idx int) *adapter.PublishResult {
		return topic.Publish(ctx, &adapter.Message{Data: ordercheck.Encode(key, idx), OrderingKey: key})
	}
	stored := map[string]int{}
	for _, r := range refusals {
		if _, err := publish(r.key, 0).Get(ctx); err != nil {
			t.Fatal(err)
		}
		if err := r.call(r.key); !errors.Is(err, r.want) || errors.Is(err, adapter.ErrPublishingPaused) {
			t.Fatalf("%s: err = %v, want %v", r.key, err, r.want)
		}
		if _, err := publish(r.key, 1).Get(ctx); !errors.Is(err, adapter.ErrPublishingPaused) {
			t.Fatalf("%s: next message: err = %v, want ErrPublishingPaused", r.key, err)
		}
		if _, err := publish("bystander", stored["bystander"]).Get(ctx); err != nil {
			t.Fatalf("%s: another key must carry on: %v", r.key, err)
		}
		stored["bystander"]++
		topic.ResumePublish(r.key)
		if _, err := publish(r.key, 1).Get(ctx); err != nil {
			t.Fatalf("%s: after ResumePublish: %v", r.key, err)
		}
		stored[r.key] = 2
	}
	if n := storedOrder(t, e, "refusals", stored); n != len(refusals)*3 {
		t.Fatalf("%d messages stored, want %d", n, len(refusals)*3)
	}
}

// Replies from the server are held back while messages are published, so
// every publish times out waiting for its ack after the server stored it,
// and is sent again. Each message must be stored once, in key order, and
// every result must end in success once the replies flow again.
func TestRetriedPublishIsStoredOnce(t *testing.T) {
	e := newEnv(t)
	e.createTopic("retried")
	proxy, err := faultproxy.Start(e.srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	nc := testutil.Connect(t, proxy.URL())
	client, err := adapter.NewClient(nc, project, append(testLogger(), adapter.WithPublishAckTimeout(200*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	const keys, perKey = 5, 20
	topic := client.Topic("retried")
	// Each key's messages (and the unkeyed ones) make exactly one batch,
	// sent as soon as it is full, so every message is in flight at once.
	topic.PublishSettings.CountThreshold = perKey
	topic.PublishSettings.DelayThreshold = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Every attempt crosses the server as a plain NATS message; count the
	// attempts of each message id.
	var mu sync.Mutex
	attempts := map[string]int{}
	sub, err := e.nc.Subscribe(keyrouter.TopicSubjects(project, "retried"), func(m *nats.Msg) {
		mu.Lock()
		attempts[m.Header.Get("Nats-Msg-Id")]++
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}

	readLayout(t, client) // before the network holds its reply
	proxy.HoldReplies()
	var results []*adapter.PublishResult
	want := map[string]int{}
	for i := range perKey {
		for k := range keys + 1 { // key "" is the unkeyed messages
			key := ""
			if k > 0 {
				key = fmt.Sprint("key-", k)
			}
			results = append(results, topic.Publish(ctx, &adapter.Message{Data: ordercheck.Encode(key, i), OrderingKey: key}))
			want[key]++
		}
	}
	total := len(results)
	retried := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, a := range attempts {
			if a >= 2 {
				n++
			}
		}
		return n
	}
	testutil.Eventually(t, 30*time.Second, func() bool { return retried() == total },
		"every message sent at least twice: %d of %d were", retried, total)
	proxy.ReleaseReplies()

	ids := map[string]bool{}
	for i, r := range results {
		id, err := r.Get(ctx)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		ids[id] = true
	}
	if len(ids) != total {
		t.Fatalf("%d distinct ids for %d messages", len(ids), total)
	}
	if n := storedOrder(t, e, "retried", want); n != total {
		t.Fatalf("%d messages stored, want %d", n, total)
	}
}

// Flush, and a Publish blocked by flow control, send queued batches at once
// rather than after DelayThreshold, also those queued behind a batch in
// flight.
func TestFlushAndBlockedPublishDoNotWaitForTheDelay(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("hurry")
	topic.PublishSettings.CountThreshold = 10
	topic.PublishSettings.DelayThreshold = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var results []*adapter.PublishResult
	for i := range 15 { // one full batch goes; five wait behind it
		results = append(results, topic.Publish(ctx, &adapter.Message{Data: ordercheck.Encode("k", i), OrderingKey: "k"}))
	}
	flushed := make(chan struct{})
	go func() { topic.Flush(); close(flushed) }()
	select {
	case <-flushed:
	case <-time.After(20 * time.Second):
		t.Fatal("Flush waited for the delay threshold")
	}
	for i, r := range results {
		select {
		case <-r.Ready():
		default:
			t.Fatalf("result %d not known after Flush", i)
		}
	}

	limited := e.createTopic("hurry-blocked")
	limited.PublishSettings.CountThreshold = 100
	limited.PublishSettings.DelayThreshold = time.Hour
	limited.PublishSettings.FlowControlSettings = adapter.FlowControlSettings{MaxOutstandingMessages: 5}
	for i := range 20 { // the sixth waits for room, which only a send makes
		if err := ctx.Err(); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		results = append(results, limited.Publish(ctx, &adapter.Message{Data: ordercheck.Encode("k", i), OrderingKey: "k"}))
	}
	limited.Flush()
	for i, r := range results {
		if _, err := r.Get(ctx); err != nil {
			t.Fatalf("result %d: %v", i, err)
		}
	}
	storedOrder(t, e, "hurry", map[string]int{"k": 15})
	storedOrder(t, e, "hurry-blocked", map[string]int{"k": 20})
}

// WithDurableSync: a publish result waits for the sync that covers it, and
// a key's next batch waits too; a failed sync fails its messages with
// ErrNotDurable and pauses their key, other keys carry on.
func TestPublishWaitsForDurableSync(t *testing.T) {
	type call struct{ done chan error }
	calls := make(chan call)
	sync := func(ctx context.Context) error {
		c := call{done: make(chan error)}
		select {
		case calls <- c:
		case <-ctx.Done():
			return ctx.Err()
		}
		return <-c.done
	}
	e := newEnv(t, adapter.WithDurableSync(sync))
	topic := e.createTopic("durable")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	next := func() call {
		t.Helper()
		select {
		case c := <-calls:
			return c
		case <-ctx.Done():
			t.Fatal("no sync asked for")
			return call{}
		}
	}

	r0 := topic.Publish(ctx, &adapter.Message{Data: []byte("a0"), OrderingKey: "a"})
	c := next() // acked by the server, waiting for the sync
	r1 := topic.Publish(ctx, &adapter.Message{Data: []byte("a1"), OrderingKey: "a"})
	select {
	case <-r0.Ready():
		t.Fatal("a0's result came before its sync returned")
	default:
	}
	c.done <- nil
	if _, err := r0.Get(ctx); err != nil {
		t.Fatalf("a0: %v", err)
	}
	c = next() // a1, sent once a0 was durable
	c.done <- errors.New("disk gone")
	if _, err := r1.Get(ctx); !errors.Is(err, adapter.ErrNotDurable) {
		t.Fatalf("a1 after a failed sync: %v, want ErrNotDurable", err)
	}
	if _, err := topic.Publish(ctx, &adapter.Message{Data: []byte("a2"), OrderingKey: "a"}).Get(ctx); !errors.Is(err, adapter.ErrPublishingPaused) {
		t.Fatalf("a2 after a1 failed: %v, want ErrPublishingPaused", err)
	}
	rb := topic.Publish(ctx, &adapter.Message{Data: []byte("b0"), OrderingKey: "b"})
	next().done <- nil
	if _, err := rb.Get(ctx); err != nil {
		t.Fatalf("key b must carry on: %v", err)
	}
}

// readLayout has client read the account's layout record, which its first
// write waits for (adapter.EnsureLayout): a test that holds the network's
// replies from a client's first publish on does it first.
func readLayout(t *testing.T, client *adapter.Client) {
	t.Helper()
	if _, err := client.Subscriptions(context.Background()); err != nil {
		t.Fatal(err)
	}
}
