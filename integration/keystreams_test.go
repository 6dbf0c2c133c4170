package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// A topic with key streams (TopicConfig.KeyStreams) keeps its keyed
// messages in a stream per group of slots. Partitioned subscriptions with
// as many partitions as key streams, and with more, per-key and unordered
// ones receive every message, each key in order; sequences stay unique in
// the topic.
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
		"split-per-key":   {Topic: topic, EnableMessageOrdering: true, Delivery: adapter.DeliveryPerKey},
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
// anything: a key stream count that is not a power of two, and seeks to a
// single sequence. Fewer partitions than key streams become as many.
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
	// A topic created with key streams has nothing to move, and keeps its
	// count.
	if move, err := topic.MoveToKeyStreams(ctx, 8); err != nil || len(move.Moved)+len(move.Waiting) > 0 {
		t.Fatalf("MoveToKeyStreams(8) on a topic created with 8: %+v, %v; want nothing moved", move, err)
	}
	if _, err := topic.MoveToKeyStreams(ctx, 4); !errors.Is(err, adapter.ErrInvalidConfig) {
		t.Fatalf("MoveToKeyStreams(4) on a topic created with 8: %v, want ErrInvalidConfig", err)
	}
	// Fewer partitions than key streams: as many as key streams.
	sub := e.createSub("split-sub", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, Delivery: adapter.DeliveryPartitioned, Partitions: 2})
	if cfg, err := sub.Config(ctx); err != nil || cfg.Partitions != 8 {
		t.Fatalf("2 partitions asked on 8 key streams: %d, %v; want 8", cfg.Partitions, err)
	}
	// A sequence is not a point of a topic with key streams.
	if err := sub.SeekToSequence(ctx, 1); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("SeekToSequence: %v, want ErrUnsupported", err)
	}
	if _, _, err := sub.FirstUnacked(ctx); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("FirstUnacked: %v, want ErrUnsupported", err)
	}
	if err := sub.SeekToPoint(ctx, adapter.Point{Seq: 1, KeySeqs: []uint64{1, 2}}); !errors.Is(err, adapter.ErrInvalidConfig) {
		t.Fatalf("SeekToPoint with 2 key streams of 8: %v, want ErrInvalidConfig", err)
	}
}

// Seeks on a topic with key streams: to a point taken from the
// subscription (as a snapshot takes it) every message after it comes
// again, and none before; to a time before everything, every message. Each
// key in order throughout (the checker sees every delivery).
func TestKeyStreamsSeek(t *testing.T) {
	for _, mode := range []adapter.DeliveryMode{adapter.DeliveryPartitioned, adapter.DeliveryPerKey} {
		t.Run(string(mode), func(t *testing.T) { keyStreamsSeek(t, mode) })
	}
}

func keyStreamsSeek(t *testing.T, mode adapter.DeliveryMode) {
	e := newEnv(t)
	ctx := context.Background()
	topic, err := e.client.CreateTopicWithConfig(ctx, "split-seek", &adapter.TopicConfig{KeyStreams: 4})
	if err != nil {
		t.Fatal(err)
	}
	sub := e.createSub("split-seek-sub", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, Delivery: mode})
	r := newSeekRecorder([]string{"k0", "k1", "k2", "k3", "k4", "k5", ""})
	startReceive(t, sub, func(ctx context.Context, m *adapter.Message) {
		r.record(m.Data, m.OrderingKey)
		m.Ack()
	})
	before := time.Now().Add(-time.Second)
	send := func(from, to int) {
		for i := from; i < to; i++ {
			for _, key := range r.keys {
				r.check.Published(key, i)
				publish(t, topic, string(ordercheck.Encode(key, i)), key)
			}
		}
	}
	everyOnce, count := r.every, r.count
	send(0, 5)
	testutil.Eventually(t, 20*time.Second, everyOnce(0, 5, 1), "first five of each key not delivered")
	var point adapter.Point
	testutil.Eventually(t, 10*time.Second, func() bool {
		p, _, err := sub.FirstUnackedPoint(ctx)
		if err != nil {
			t.Fatalf("FirstUnackedPoint: %v", err)
		}
		point = p
		return len(p.KeySeqs) == 4 && p.Seq == 6 // the five unkeyed acked, and so the rest
	}, "the first unacked point never passed the first five unkeyed messages: %+v", func() adapter.Point { return point })
	send(5, 10)
	testutil.Eventually(t, 20*time.Second, everyOnce(5, 10, 1), "second five of each key not delivered")

	if err := sub.SeekToPoint(ctx, point); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, everyOnce(5, 10, 2), "after the seek to the point, the second five not delivered again")
	if !everyOnce(0, 5, 1)() || everyOnce(0, 5, 2)() {
		t.Fatal("the seek to the point delivered messages from before it")
	}
	for i := range 5 {
		if n := count(string(ordercheck.Encode("k0", i))); n != 1 {
			t.Fatalf("k0|%d delivered %d times, once expected: it is before the point", i, n)
		}
	}
	if err := sub.SeekToTime(ctx, before); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, everyOnce(0, 5, 2), "after the seek to a time before everything, the first five not delivered again")
	testutil.Eventually(t, 20*time.Second, everyOnce(5, 10, 3), "after the seek to a time before everything, the second five not delivered again")
	if v := r.check.Violations(); len(v) > 0 {
		t.Fatalf("violations:\n%s", strings.Join(v, "\n"))
	}
}

// seekRecorder records every delivery of a seek test: in an order checker
// (which allows a key to go back, as a seek takes it), and counted per
// message.
type seekRecorder struct {
	keys  []string // "" for unkeyed messages
	check *ordercheck.Checker

	mu  sync.Mutex
	got map[string]int // deliveries per message data
}

func newSeekRecorder(keys []string) *seekRecorder {
	r := &seekRecorder{keys: keys, check: ordercheck.New(), got: map[string]int{}}
	r.check.AcksMayBeLost()
	return r
}

// record checks and counts a delivery, acked by the caller.
func (r *seekRecorder) record(data []byte, orderingKey string) {
	key, index, err := ordercheck.Decode(data)
	if err != nil || key != orderingKey {
		r.check.Fail("message %q on key %q: %v", data, orderingKey, err)
	} else {
		r.check.Delivered("s", key, index)
		r.check.Acked("s", key, index)
	}
	r.mu.Lock()
	r.got[string(data)]++
	r.mu.Unlock()
}

func (r *seekRecorder) count(data string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.got[data]
}

// every reports whether messages from..to-1 of every key were delivered at
// least times times.
func (r *seekRecorder) every(from, to, times int) func() bool {
	return func() bool {
		for i := from; i < to; i++ {
			for _, key := range r.keys {
				if r.count(string(ordercheck.Encode(key, i))) < times {
					return false
				}
			}
		}
		return true
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

// Through Google's Go client, against a sidecar with each delivery mode: a
// topic created with the jetorder-key-streams label carries it, refuses a
// change of the label, and an ordered subscription gets every key in
// order, and again from a snapshot.
func TestKeyStreamsThroughGoClient(t *testing.T) {
	for _, mode := range []adapter.DeliveryMode{adapter.DeliveryPartitioned, adapter.DeliveryPerKey} {
		t.Run(string(mode), func(t *testing.T) { keyStreamsThroughGoClient(t, mode) })
	}
}

func keyStreamsThroughGoClient(t *testing.T, mode adapter.DeliveryMode) {
	// NATSListen: the test looks at the consumers.
	sc := itest.Start(t, sidecar.Config{NATSListen: "127.0.0.1:0", Delivery: mode})
	c := sc.GoClient()
	ctx := context.Background()
	topic, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topicPath("split"), Labels: map[string]string{"jetorder-key-streams": "4"}})
	if err != nil {
		t.Fatal(err)
	}
	if topic.GetLabels()["jetorder-key-streams"] != "4" {
		t.Fatalf("labels %v, want jetorder-key-streams 4", topic.GetLabels())
	}
	_, err = c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topicPath("bad"), Labels: map[string]string{"jetorder-key-streams": "3"}})
	wantCode(t, "a key stream count of 3", err, codes.InvalidArgument)
	_, err = c.TopicAdminClient.UpdateTopic(ctx, &pb.UpdateTopicRequest{Topic: &pb.Topic{Name: topicPath("split"), Labels: map[string]string{"jetorder-key-streams": "8"}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels"}}})
	wantCode(t, "a change of the key stream count", err, codes.InvalidArgument)
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("split-sub"), Topic: topicPath("split"), EnableMessageOrdering: true})

	pub := c.Publisher("split")
	pub.EnableMessageOrdering = true
	defer pub.Stop()
	var keys []string
	for k := range 20 {
		keys = append(keys, fmt.Sprintf("k%d", k))
	}
	r := newSeekRecorder(keys)
	send := func(from, to int) {
		for i := from; i < to; i++ {
			for _, key := range keys {
				r.check.Published(key, i)
				publishGo(t, pub, string(ordercheck.Encode(key, i)), key)
			}
		}
	}
	stop := receiveGo(t, c.Subscriber("split-sub"), func(_ context.Context, m *pubsub.Message) {
		r.record(m.Data, m.OrderingKey)
		m.Ack()
	})
	defer stop()
	all := r.every
	send(0, 5)
	testutil.Eventually(t, 30*time.Second, all(0, 5, 1), "the first five of each key not received")
	// The snapshot is taken once the server has every ack: its point is
	// then past the first five of every key.
	js := sc.JetStream()
	testutil.Eventually(t, 10*time.Second, func() bool {
		// Every consumer of the subscription on the key streams: the
		// partitions' or the keys'.
		for i := range 4 {
			st, err := js.Stream(ctx, keyrouter.KeyStreamName(itest.Project, "split", i))
			if err != nil {
				return false
			}
			list := st.ListConsumers(ctx)
			for info := range list.Info() {
				if strings.HasPrefix(info.Name, keyrouter.SubscriptionBase(itest.Project, "split-sub")+"_") && info.NumAckPending+int(info.NumPending) > 0 {
					return false
				}
			}
			if list.Err() != nil {
				return false
			}
		}
		return true
	}, "the acks of the first five never reached the server")
	snap, err := c.SubscriptionAdminClient.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: snapshotPath("snap"), Subscription: subPath("split-sub")})
	if err != nil {
		t.Fatal(err)
	}
	send(5, 10)
	testutil.Eventually(t, 30*time.Second, all(5, 10, 1), "the second five of each key not received")
	if _, err := c.SubscriptionAdminClient.Seek(ctx, &pb.SeekRequest{Subscription: subPath("split-sub"), Target: &pb.SeekRequest_Snapshot{Snapshot: snap.GetName()}}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, all(5, 10, 2), "after the seek to the snapshot, the second five not received again")
	if all(0, 5, 2)() {
		t.Fatal("the seek to the snapshot delivered messages taken before it again")
	}
	if v := r.check.Violations(); len(v) > 0 {
		t.Fatalf("violations:\n%s", strings.Join(v, "\n"))
	}
}

// A create whose key stream cannot be made (here a stream of another
// application already captures its subjects) fails, and leaves no topic
// behind: the id is free, and a create once the way is clear succeeds.
func TestKeyStreamsCreateFailureLeavesNoTopic(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	js := jetstreamOf(t, e)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OTHER", Subjects: []string{keyrouter.PartitionFilter(project, "blocked", 2, 1)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.CreateTopicWithConfig(ctx, "blocked", &adapter.TopicConfig{KeyStreams: 2}); err == nil {
		t.Fatal("created a topic whose key stream overlaps another stream")
	}
	if ok, err := e.client.Topic("blocked").Exists(ctx); ok || err != nil {
		t.Fatalf("after the failed create the topic exists: %v, %v", ok, err)
	}
	if err := js.DeleteStream(ctx, "OTHER"); err != nil {
		t.Fatal(err)
	}
	topic, err := e.client.CreateTopicWithConfig(ctx, "blocked", &adapter.TopicConfig{KeyStreams: 2})
	if err != nil {
		t.Fatalf("create once the way is clear: %v", err)
	}
	publish(t, topic, "x", "k")
}
