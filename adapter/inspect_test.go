package adapter

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// inspectEnv is a server, a client of project "p", an inspector, and a
// topic "orders" with one subscription.
type inspectEnv struct {
	nc    *nats.Conn
	c     *Client
	in    *Inspector
	js    jetstream.JetStream
	topic *Topic
	sub   *Subscription
}

// newInspectEnv creates the subscription id with cfg (its topic set).
func newInspectEnv(t *testing.T, id string, cfg SubscriptionConfig) *inspectEnv {
	t.Helper()
	return newInspectEnvOn(t, id, nil, cfg)
}

// newInspectEnvOn is newInspectEnv on a topic created with tcfg.
func newInspectEnvOn(t *testing.T, id string, tcfg *TopicConfig, cfg SubscriptionConfig) *inspectEnv {
	t.Helper()
	srv := testutil.Server(t)
	nc := testutil.Connect(t, srv.ClientURL())
	c, err := NewClient(nc, "p")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	in, err := NewInspector(nc)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	topic, err := c.CreateTopicWithConfig(ctx, "orders", tcfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Topic = topic
	sub, err := c.CreateSubscription(ctx, id, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &inspectEnv{nc: nc, c: c, in: in, js: js, topic: topic, sub: sub}
}

// publish stores a message of each key on topic, in order.
func (e *inspectEnv) publish(t *testing.T, topic *Topic, keys ...string) {
	t.Helper()
	ctx := context.Background()
	for _, k := range keys {
		if _, err := topic.Publish(ctx, &Message{Data: []byte(k), OrderingKey: k}).Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// stored is when the topic's message seq was stored.
func (e *inspectEnv) stored(t *testing.T, topic *Topic, seq uint64) time.Time {
	t.Helper()
	stream, err := e.js.Stream(context.Background(), keyrouter.StreamName(topic.project, topic.id))
	if err != nil {
		t.Fatal(err)
	}
	m, err := stream.GetMsg(context.Background(), seq)
	if err != nil {
		t.Fatal(err)
	}
	return m.Time
}

// read is one inspection of sub, with its configuration known.
func (e *inspectEnv) read(t *testing.T, sub *Subscription) *SubscriptionState {
	t.Helper()
	ctx := context.Background()
	cfg, err := sub.Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	topics, err := e.in.Topics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	subs, err := e.in.Subscriptions(ctx, topics, map[string]*SubscriptionConfig{sub.String(): &cfg}, nil)
	if err != nil {
		t.Fatal(err)
	}
	st := subs[sub.String()]
	if st == nil {
		t.Fatalf("%s not in the inspection: %v", sub, subs)
	}
	return st
}

// hold receives sub, and keeps every message in its handler until the
// test ends; it returns the count of messages in handlers.
func hold(t *testing.T, sub *Subscription) func() int {
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	held := 0
	done := make(chan error, 1)
	go func() {
		done <- sub.Receive(ctx, func(ctx context.Context, m *Message) {
			mu.Lock()
			held++
			mu.Unlock()
			<-ctx.Done()
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("receive: %v", err)
		}
	})
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return held
	}
}

// A partitioned subscription: its backlog, its partitions, the owner of
// the one a receiver holds a message of, and its oldest unacked message.
func TestInspectPartitioned(t *testing.T) {
	e := newInspectEnv(t, "parts", SubscriptionConfig{EnableMessageOrdering: true, Partitions: 2})
	ctx, topic, sub := context.Background(), e.topic, e.sub
	e.publish(t, topic, "k", "k", "k")

	topics, err := e.in.Topics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(topics) != 1 {
		t.Fatalf("topics %+v, want one", topics)
	}
	if got := topics[0]; got.Name != "projects/p/topics/orders" || got.Project != "p" || got.ID != "orders" ||
		got.Messages != 3 || got.LastSequence != 3 || got.Consumers != 3 || !got.LastStored.Equal(e.stored(t, topic, 3)) {
		t.Errorf("topic %+v; want 3 messages, last sequence 3, 3 consumers, stored at %v", got, e.stored(t, topic, 3))
	}

	first := e.stored(t, topic, 1)
	mine := keyrouter.Slot("k") % 2
	st := e.read(t, sub)
	if st.Backlog != 3 || st.Unacked != 0 || st.Consumers != 3 || !st.OldestUnacked.Equal(first) || len(st.Partitions) != 2 || st.HasFloor {
		t.Fatalf("before receiving: %+v; want backlog 3, nothing unacked, 3 consumers, oldest %v, 2 partitions, no floor", st, first)
	}
	if p := st.Partitions[mine]; p.Index != mine || p.Pending != 3 || p.PinID != "" {
		t.Fatalf("partition %d before receiving: %+v; want 3 pending, no owner", mine, p)
	}

	held := hold(t, sub)
	testutil.Eventually(t, 10*time.Second, func() bool {
		st = e.read(t, sub)
		return held() == 1 && st.Unacked > 0 && st.Partitions[mine].PinID != ""
	}, "no partition owned with a message unacked: held %d, %+v", held, func() any { return st })
	if st.Backlog != 3 || !st.OldestUnacked.Equal(first) {
		t.Errorf("receiving: backlog %d, oldest %v; want 3, %v", st.Backlog, st.OldestUnacked, first)
	}
	if p := st.Partitions[mine]; p.Pending+p.Unacked != 3 || p.Unacked == 0 || p.PinnedSince.IsZero() {
		t.Errorf("owned partition %+v; want 3 messages, some unacked, pinned since a time", p)
	}
	if p := st.Partitions[1-mine]; p.Pending+p.Unacked != 0 {
		t.Errorf("other partition %+v; want nothing in it", p)
	}
}

// A per-key subscription: keyed messages nobody has discovered count from
// the discovery floor, then from the key consumers that discovery makes;
// after a seek, the new epoch's floor counts.
func TestInspectPerKey(t *testing.T) {
	e := newInspectEnv(t, "keys", SubscriptionConfig{EnableMessageOrdering: true, Delivery: DeliveryPerKey})
	ctx, topic, sub := context.Background(), e.topic, e.sub
	e.publish(t, topic, "a", "b", "c", "a")
	first := e.stored(t, topic, 1)

	st := e.read(t, sub)
	if !st.HasFloor || st.Floor != 0 || st.Undiscovered != 4 || st.Backlog != 4 || st.Unacked != 0 || st.Consumers != 1 || !st.OldestUnacked.Equal(first) {
		t.Fatalf("nobody receiving: %+v; want floor 0, 4 undiscovered, backlog 4, 1 consumer, oldest %v", st, first)
	}

	if err := sub.SeekToSequence(ctx, 3); err != nil {
		t.Fatal(err)
	}
	st = e.read(t, sub)
	if !st.HasFloor || st.Floor != 2 || st.Undiscovered != 2 || st.Backlog != 2 || !st.OldestUnacked.Equal(e.stored(t, topic, 3)) {
		t.Fatalf("after a seek to 3: %+v; want floor 2, 2 undiscovered, backlog 2, oldest the third message", st)
	}

	held := hold(t, sub)
	testutil.Eventually(t, 10*time.Second, func() bool {
		st = e.read(t, sub)
		return held() == 2 && st.Unacked == 2
	}, "keys a and c not held unacked: held %d, %+v", held, func() any { return st })
	if st.Backlog != 2 || st.Consumers != 3 || !st.OldestUnacked.Equal(e.stored(t, topic, 3)) || len(st.Partitions) != 0 {
		t.Errorf("receiving: %+v; want backlog 2, 3 consumers (unkeyed, a, c), oldest the third message, no partitions", st)
	}
}

// A per-key subscription of a topic with key streams: the keyed messages
// nobody has discovered count from each key stream's discovery floor, and
// from the key consumers once discovered.
func TestInspectPerKeyKeyStreams(t *testing.T) {
	e := newInspectEnvOn(t, "keys", &TopicConfig{KeyStreams: 4}, SubscriptionConfig{EnableMessageOrdering: true, Delivery: DeliveryPerKey})
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h", "a", "b"}
	before := time.Now()
	e.publish(t, e.topic, keys...)

	st := e.read(t, e.sub)
	if !st.HasFloor || st.Undiscovered != uint64(len(keys)) || st.Backlog != uint64(len(keys)) || st.Unacked != 0 ||
		st.OldestUnacked.Before(before.Add(-time.Second)) || st.OldestUnacked.After(time.Now()) {
		t.Fatalf("nobody receiving: %+v; want %d undiscovered, backlog %d, nothing unacked, oldest since the publish", st, len(keys), len(keys))
	}

	held := hold(t, e.sub)
	testutil.Eventually(t, 10*time.Second, func() bool {
		st = e.read(t, e.sub)
		return held() == 8 && st.Unacked == 8 && st.Undiscovered == 0
	}, "the eight keys not each held unacked: held %d, %+v", held, func() any { return st })
	if st.Backlog != uint64(len(keys)) || st.Consumers != 9 {
		t.Errorf("receiving: %+v; want backlog %d, 9 consumers (unkeyed and the eight keys')", st, len(keys))
	}
}

// A subscription found by its consumers is reported with the configuration
// lookup gives, asked once, and left out without one.
func TestInspectFoundByConsumers(t *testing.T) {
	e := newInspectEnv(t, "all", SubscriptionConfig{})
	ctx, topic, sub := context.Background(), e.topic, e.sub
	e.publish(t, topic, "a", "")
	topics, err := e.in.Topics(ctx)
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name  string
		found bool
	}{{"deleted", false}, {"configured", true}} {
		t.Run(tc.name, func(t *testing.T) {
			asked := 0
			lookup := func(ctx context.Context, project, id string) *SubscriptionConfig {
				asked++
				if project != "p" || id != "all" {
					t.Errorf("asked for %s/%s", project, id)
				}
				if !tc.found {
					return nil
				}
				cfg, err := e.c.Subscription(id).Config(ctx)
				if err != nil {
					t.Error(err)
				}
				return &cfg
			}
			subs, err := e.in.Subscriptions(ctx, topics, nil, lookup)
			if err != nil {
				t.Fatal(err)
			}
			st := subs[sub.String()]
			want := 0
			if tc.found {
				want = 1
			}
			if asked != 1 || len(subs) != want || (st != nil) != tc.found {
				t.Fatalf("asked %d times, found %v; want asked once, found %v", asked, subs, tc.found)
			}
			if tc.found && (st.Backlog != 2 || st.Consumers != 1 || st.Config == nil || st.Config.EnableMessageOrdering || st.HasFloor) {
				t.Errorf("%+v; want backlog 2, one consumer, its configuration, no floor", st)
			}
		})
	}
}

// What the inspector reads back is what the writers wrote: consumer
// descriptions and floor keys.
func TestInspectReadsTheWriters(t *testing.T) {
	rec := &subRecord{ID: "sub", Project: "p", Partitions: 8}
	for _, tc := range []struct {
		desc      string
		project   string
		partition int
		ok        bool
	}{
		{rec.consumerDescription(), "p", -1, true},
		{rec.partitionConsumerConfig(time.Second, 5).Description, "p", 5, true},
		{rec.partitionConsumerConfig(time.Second, 0).Description, "p", 0, true},
		{"jetorder projects/p/subscriptions/sub partition x of 8", "p", -1, true},
		{"jetorder projects/p/topics/t", "", 0, false},
		{"jetorder projects/p/subscriptions/a/b", "", 0, false},
		{"jetorder status: messages after a discovery floor", "", 0, false},
		{"someone else's", "", 0, false},
		{"", "", 0, false},
	} {
		project, id, partition, ok := parseConsumerDescription(tc.desc)
		if ok != tc.ok || ok && (project != tc.project || id != "sub" || partition != tc.partition) {
			t.Errorf("parseConsumerDescription(%q) = %q, %q, %d, %v; want %q, sub, %d, %v", tc.desc, project, id, partition, ok, tc.project, tc.partition, tc.ok)
		}
	}

	kv := keyrouter.KVKey("p", "sub")
	for _, epoch := range []uint64{0, 1, 12} {
		if got, ok := floorEpoch(kv, floorKey(kv, epoch)); !ok || got != epoch {
			t.Errorf("floorEpoch(floorKey(%d)) = %d, %v", epoch, got, ok)
		}
	}
	for _, key := range []string{kv, kv + ".floor.x", kv + ".floor.e", kv + ".floor.e01", keyrouter.KVKey("p", "sub2") + ".floor", kv + ".floorx"} {
		if epoch, ok := floorEpoch(kv, key); ok {
			t.Errorf("floorEpoch(%q) = %d, true; want not a floor", key, epoch)
		}
	}
}

func TestNewInspectorRefusesNil(t *testing.T) {
	if _, err := NewInspector(nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("NewInspector(nil) = %v; want ErrInvalidConfig", err)
	}
}
