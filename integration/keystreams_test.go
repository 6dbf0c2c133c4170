package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// A topic with key streams (TopicConfig.KeyStreams) keeps its keyed
// messages in a stream per group of slots. Partitioned subscriptions with
// as many partitions as key streams, and with more, and unordered ones
// receive every message, each key in order; sequences stay unique in the
// topic.
func TestKeyStreamsDeliverEverything(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	topic, err := e.client.CreateTopicWithConfig(ctx, "split", &adapter.TopicConfig{KeyStreams: 4})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := topic.Config(ctx)
	if err != nil || cfg.KeyStreams != 4 {
		t.Fatalf("Config: key streams %d, %v; want 4", cfg.KeyStreams, err)
	}
	subs := map[string]adapter.SubscriptionConfig{
		"split-p4":        {Topic: topic, EnableMessageOrdering: true, Delivery: adapter.DeliveryPartitioned, Partitions: 4},
		"split-p16":       {Topic: topic, EnableMessageOrdering: true, Delivery: adapter.DeliveryPartitioned, Partitions: 16},
		"split-default":   {Topic: topic, EnableMessageOrdering: true, Delivery: adapter.DeliveryPartitioned},
		"split-unordered": {Topic: topic},
	}
	check := ordercheck.New()
	var mu sync.Mutex
	seqs := map[string]map[uint64]string{} // per subscription, who had each sequence
	unordered := map[string]bool{}         // what the unordered subscription got
	for id, c := range subs {
		sub := e.createSub(id, c)
		seqs[id] = map[uint64]string{}
		startReceive(t, sub, func(ctx context.Context, m *adapter.Message) {
			key, index, err := ordercheck.Decode(m.Data)
			if err != nil {
				check.Fail("%s: %v", id, err)
				m.Ack()
				return
			}
			mu.Lock()
			if other, ok := seqs[id][m.StreamSequence]; ok && other != string(m.Data) {
				check.Fail("%s: sequence %d is both %s and %s", id, m.StreamSequence, other, m.Data)
			}
			seqs[id][m.StreamSequence] = string(m.Data)
			mu.Unlock()
			if c.EnableMessageOrdering {
				check.Delivered(id, key, index)
				check.Acked(id, key, index)
			} else {
				mu.Lock()
				unordered[string(m.Data)] = true
				mu.Unlock()
			}
			m.Ack()
		})
	}
	const keys, perKey = 40, 25
	var results []*adapter.PublishResult
	for i := range perKey {
		for k := range keys {
			key := fmt.Sprintf("key-%d", k)
			check.Published(key, i)
			results = append(results, topic.Publish(ctx, &adapter.Message{Data: ordercheck.Encode(key, i), OrderingKey: key}))
		}
		check.Published("", i)
		results = append(results, topic.Publish(ctx, &adapter.Message{Data: ordercheck.Encode("", i)}))
	}
	for _, r := range results {
		if _, err := r.Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for id, c := range subs {
		if !c.EnableMessageOrdering {
			got := func() int { mu.Lock(); defer mu.Unlock(); return len(unordered) }
			testutil.Eventually(t, 30*time.Second, func() bool { return got() == len(results) }, "%s: %d of %d messages", id, got, len(results))
			continue
		}
		testutil.Eventually(t, 30*time.Second, func() bool { return check.Complete(id) }, "%s: not every message acked: %s", id,
			func() string { return check.Missing(id) })
	}
	if v := check.Violations(); len(v) > 0 {
		t.Fatalf("violations:\n%s", strings.Join(v, "\n"))
	}
	// Every key stream holds messages, numbered in its own range.
	js := jetstreamOf(t, e)
	for i := range 4 {
		st, err := js.Stream(ctx, keyrouter.KeyStreamName(project, "split", i))
		if err != nil {
			t.Fatal(err)
		}
		state := st.CachedInfo().State
		if state.Msgs == 0 || state.FirstSeq != keyrouter.KeyStreamFirstSeq(i) {
			t.Fatalf("key stream %d: %d messages from %d, want some from %d", i, state.Msgs, state.FirstSeq, keyrouter.KeyStreamFirstSeq(i))
		}
	}
	// The listing shows the topic once, and its key streams nowhere.
	topics, err := e.client.Topics(ctx)
	if err != nil || len(topics) != 1 || topics[0].ID() != "split" {
		t.Fatalf("Topics: %v, %v; want split alone", topics, err)
	}
}

// What a topic with key streams refuses, clearly and before it creates
// anything: per-key delivery, fewer partitions than key streams, a key
// stream count that is not a power of two, and seeks.
func TestKeyStreamsRefusals(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, n := range []int{3, 32, -1} {
		if _, err := e.client.CreateTopicWithConfig(ctx, "bad", &adapter.TopicConfig{KeyStreams: n}); !errors.Is(err, adapter.ErrInvalidConfig) {
			t.Fatalf("key streams %d: %v, want ErrInvalidConfig", n, err)
		}
	}
	topic, err := e.client.CreateTopicWithConfig(ctx, "split", &adapter.TopicConfig{KeyStreams: 8})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []adapter.SubscriptionConfig{
		{Topic: topic, EnableMessageOrdering: true, Delivery: adapter.DeliveryPerKey},
		{Topic: topic, EnableMessageOrdering: true, Delivery: adapter.DeliveryPartitioned, Partitions: 4},
	} {
		_, err := e.client.CreateSubscription(ctx, "refused", c)
		if !errors.Is(err, adapter.ErrInvalidConfig) {
			t.Fatalf("%+v: %v, want ErrInvalidConfig", c, err)
		}
		t.Logf("refused: %v", err)
		if ok, _ := e.client.Subscription("refused").Exists(ctx); ok {
			t.Fatal("a refused subscription exists")
		}
	}
	sub := e.createSub("split-sub", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, Delivery: adapter.DeliveryPartitioned})
	if err := sub.SeekToTime(ctx, time.Now()); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("SeekToTime: %v, want ErrUnsupported", err)
	}
	if _, _, err := sub.FirstUnacked(ctx); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("FirstUnacked: %v, want ErrUnsupported", err)
	}
}

// Deleting a topic with key streams removes them; a topic of the same id
// created again, with another count, starts empty.
func TestKeyStreamsDeleteAndCreateAgain(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	topic, err := e.client.CreateTopicWithConfig(ctx, "again", &adapter.TopicConfig{KeyStreams: 4, RetentionDuration: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	publish(t, topic, "x", "k")
	hour2 := 2 * time.Hour
	if cfg, err := topic.Update(ctx, adapter.TopicUpdate{RetentionDuration: &hour2}); err != nil || cfg.RetentionDuration != hour2 {
		t.Fatalf("Update: %+v, %v", cfg, err)
	}
	js := jetstreamOf(t, e)
	for i := range 4 {
		st, err := js.Stream(ctx, keyrouter.KeyStreamName(project, "again", i))
		if err != nil {
			t.Fatal(err)
		}
		if got := st.CachedInfo().Config.MaxAge; got != hour2 {
			t.Fatalf("key stream %d keeps messages %v, want %v", i, got, hour2)
		}
	}
	if err := topic.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if _, err := js.Stream(ctx, keyrouter.KeyStreamName(project, "again", i)); err == nil {
			t.Fatalf("key stream %d is left after the topic's delete", i)
		}
	}
	topic, err = e.client.CreateTopicWithConfig(ctx, "again", &adapter.TopicConfig{KeyStreams: 2})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := topic.Config(ctx)
	if err != nil || cfg.KeyStreams != 2 {
		t.Fatalf("Config: %+v, %v", cfg, err)
	}
}
