package integration

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// A topic of one stream moves onto key streams (Topic.MoveToKeyStreams)
// while a publisher and receivers run: every message reaches every
// subscription, each key in order (the strict checker sees every
// delivery), a subscription with keyed messages from before the move
// unacked waits until its receivers have acked them and then reads the key
// streams, and one without receivers moves once it has them. Keyed
// messages published after the move are in the key streams alone.
func TestKeyStreamsMove(t *testing.T) {
	for _, mode := range []adapter.DeliveryMode{adapter.DeliveryPartitioned, adapter.DeliveryPerKey} {
		t.Run(string(mode), func(t *testing.T) { keyStreamsMove(t, mode) })
	}
}

func keyStreamsMove(t *testing.T, mode adapter.DeliveryMode) {
	e := newEnv(t)
	ctx := context.Background()
	topic, err := e.client.CreateTopicWithConfig(ctx, "move", &adapter.TopicConfig{KeyStreams: 1})
	if err != nil {
		t.Fatal(err)
	}
	ordered := adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, Delivery: mode}
	subs := map[string]*adapter.Subscription{
		"live":      e.client.Subscription("live"),
		"late":      e.client.Subscription("late"), // no receiver until after the move
		"unordered": e.client.Subscription("unordered"),
	}
	for id := range subs {
		cfg := ordered
		if id == "unordered" {
			cfg = adapter.SubscriptionConfig{Topic: topic}
		}
		if _, err := e.client.CreateSubscription(ctx, id, cfg); err != nil {
			t.Fatal(err)
		}
	}
	// check is strict until the seek at the end; afterSeek, which allows a
	// key to go back as a seek takes it, checks the deliveries after it.
	check, afterSeek := ordercheck.New(), ordercheck.New()
	afterSeek.AcksMayBeLost()
	var sought atomic.Bool
	var mu sync.Mutex
	unordered := map[string]bool{}
	receive := func(id string) *receiving {
		return startReceive(t, subs[id], func(ctx context.Context, m *adapter.Message) {
			key, index, err := ordercheck.Decode(m.Data)
			if err != nil || key != m.OrderingKey {
				check.Fail("%s: message %q on key %q: %v", id, m.Data, m.OrderingKey, err)
				m.Ack()
				return
			}
			if id == "unordered" {
				mu.Lock()
				unordered[string(m.Data)] = true
				mu.Unlock()
			} else {
				if !sought.Load() {
					check.Delivered(id, key, index)
					check.Acked(id, key, index)
				}
				afterSeek.Delivered(id, key, index)
				afterSeek.Acked(id, key, index)
			}
			m.Ack()
		})
	}

	// A publisher runs throughout, in rounds of a message per key and an
	// unkeyed one, each round stored before the next: until told to stop,
	// and then at least 10 rounds after.
	const keys = 20
	rounds := itest.PublishRounds(func(i int) error {
		var results []*adapter.PublishResult
		for k := range keys + 1 {
			key := fmt.Sprintf("key-%d", k)
			if k == keys {
				key = "" // and one unkeyed
			}
			check.Published(key, i)
			afterSeek.Published(key, i)
			results = append(results, topic.Publish(ctx, &adapter.Message{Data: ordercheck.Encode(key, i), OrderingKey: key}))
		}
		return itest.Stored(ctx, results)
	}, 0)
	receive("live")
	receive("unordered")
	testutil.Eventually(t, 30*time.Second, rounds.Reached(20), "20 rounds not published")
	// A point of the live subscription before the move: seeking to it
	// after the move is accepted.
	before, _, err := subs["live"].FirstUnackedPoint(ctx)
	if err != nil || len(before.KeySeqs) != 0 {
		t.Fatalf("FirstUnackedPoint before the move: %+v, %v; want a sequence alone", before, err)
	}

	if _, err := topic.MoveToKeyStreams(ctx, 3); !errors.Is(err, adapter.ErrInvalidConfig) {
		t.Fatalf("MoveToKeyStreams(3): %v, want ErrInvalidConfig", err)
	}
	move, err := topic.MoveToKeyStreams(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("moved at once: %v, waiting: %v", move.Moved, move.Waiting)
	if !slices.Contains(move.Waiting, "late") {
		t.Fatalf("the late subscription (keyed messages unacked, no receiver) moved at once: %+v", move)
	}
	if _, err := topic.MoveToKeyStreams(ctx, 8); !errors.Is(err, adapter.ErrInvalidConfig) {
		t.Fatalf("MoveToKeyStreams(8) after a move onto 4: %v, want ErrInvalidConfig", err)
	}
	if again, err := topic.MoveToKeyStreams(ctx, 4); err != nil || !slices.Contains(again.Waiting, "late") {
		t.Fatalf("MoveToKeyStreams(4) again: %+v, %v; want late still waiting", again, err)
	}
	if cfg, err := topic.Config(ctx); err != nil || cfg.KeyStreams != 4 {
		t.Fatalf("Config after the move: key streams %d, %v; want 4", cfg.KeyStreams, err)
	}
	testutil.Eventually(t, 30*time.Second, rounds.Reached(rounds.Done()+10), "10 rounds after the move not published")
	if err := rounds.Stop(); err != nil {
		t.Fatalf("publish across the move: %v", err)
	}
	total := uint64(rounds.Done() * (keys + 1))
	receive("late")

	// Keyed messages published after the move are in the key streams
	// alone: a subscription that has them all has moved.
	for _, id := range []string{"live", "late"} {
		testutil.Eventually(t, 60*time.Second, func() bool { return check.Complete(id) }, "%s: not every message acked: %s", id,
			func() string { return check.Missing(id) })
	}
	got := func() int { mu.Lock(); defer mu.Unlock(); return len(unordered) }
	testutil.Eventually(t, 30*time.Second, func() bool { return uint64(got()) == total }, "unordered: %d of %d messages", got, total)
	if v := check.Violations(); len(v) > 0 {
		t.Fatalf("violations:\n%s", strings.Join(v, "\n"))
	}
	// The keyed messages after the move are in the key streams, and the
	// topic's own stream took none.
	js := jetstreamOf(t, e)
	var split uint64
	for i := range 4 {
		st, err := js.Stream(ctx, keyrouter.KeyStreamName(project, "move", i))
		if err != nil {
			t.Fatal(err)
		}
		split += st.CachedInfo().State.Msgs
	}
	main, err := js.Stream(ctx, keyrouter.StreamName(project, "move"))
	if err != nil {
		t.Fatal(err)
	}
	if state := main.CachedInfo().State; split < 10*keys || split+state.Msgs != total {
		t.Fatalf("key streams hold %d messages, the topic's own stream %d: want at least %d and %d in all", split, state.Msgs, 10*keys, total)
	}

	// A point from before the move: the keyed messages since the move come
	// again (the key streams from their start), each key in order.
	sought.Store(true)
	already := afterSeek.Stats("live").Deliveries
	if err := subs["live"].SeekToPoint(ctx, before); err != nil {
		t.Fatalf("seek to a point from before the move: %v", err)
	}
	testutil.Eventually(t, 60*time.Second, func() bool { return afterSeek.Stats("live").Deliveries-already >= int(split) }, "after the seek, %d deliveries of keyed messages, want %d",
		func() int { return afterSeek.Stats("live").Deliveries - already }, split)
	if v := afterSeek.Violations(); len(v) > 0 {
		t.Fatalf("violations after the seek:\n%s", strings.Join(v, "\n"))
	}
}

// Through Google's Go client: UpdateTopic setting the label
// jetorder-key-streams on a topic of one stream moves it onto key streams,
// while the client publishes and receives; every message arrives, each
// key in order, and keyed messages published after it are in the key
// streams. A count that is not a power of two is refused, and the count
// cannot change again.
func TestKeyStreamsMoveThroughGoClient(t *testing.T) {
	sc := itest.Start(t, sidecar.Config{NATSListen: "127.0.0.1:0"}) // NATSListen: the test looks at the streams
	c := sc.GoClient()
	ctx := context.Background()
	// A label of 1: one stream, whatever the test run's default.
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topicPath("move"), Labels: map[string]string{"jetorder-key-streams": "1", "team": "a"}}); err != nil {
		t.Fatal(err)
	}
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("move-sub"), Topic: topicPath("move"), EnableMessageOrdering: true})
	update := func(n string) (*pb.Topic, error) {
		return c.TopicAdminClient.UpdateTopic(ctx, &pb.UpdateTopicRequest{
			Topic:      &pb.Topic{Name: topicPath("move"), Labels: map[string]string{"jetorder-key-streams": n, "team": "a"}},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels"}}})
	}
	_, err := update("3")
	wantCode(t, "a move onto 3 key streams", err, codes.InvalidArgument)

	check := ordercheck.New()
	stop := receiveGo(t, c.Subscriber("move-sub"), itest.CheckedHandler(check, "s", 0))
	defer stop()
	pub := c.Publisher("move")
	pub.EnableMessageOrdering = true
	defer pub.Stop()
	var keys []string
	for k := range 10 {
		keys = append(keys, fmt.Sprintf("k%d", k))
	}
	rounds := itest.PublishRounds(func(i int) error {
		var results []*pubsub.PublishResult
		for _, key := range keys {
			check.Published(key, i)
			results = append(results, pub.Publish(ctx, &pubsub.Message{Data: ordercheck.Encode(key, i), OrderingKey: key}))
		}
		return itest.Stored(ctx, results)
	}, 0)
	testutil.Eventually(t, 30*time.Second, rounds.Reached(10), "10 rounds not published")
	topic, err := update("4")
	if err != nil {
		t.Fatal(err)
	}
	if topic.GetLabels()["jetorder-key-streams"] != "4" || topic.GetLabels()["team"] != "a" {
		t.Fatalf("labels after the move %v, want jetorder-key-streams 4 and team a", topic.GetLabels())
	}
	testutil.Eventually(t, 30*time.Second, rounds.Reached(rounds.Done()+10), "10 rounds after the move not published")
	if err := rounds.Stop(); err != nil {
		t.Fatalf("publish across the move: %v", err)
	}
	testutil.Eventually(t, 60*time.Second, func() bool { return check.Complete("s") }, "not every message acked: %s", func() string { return check.Missing("s") })
	if v := check.Violations(); len(v) > 0 {
		t.Fatalf("violations:\n%s", strings.Join(v, "\n"))
	}
	js := sc.JetStream()
	var split uint64
	for i := range 4 {
		st, err := js.Stream(ctx, keyrouter.KeyStreamName(itest.Project, "move", i))
		if err != nil {
			t.Fatal(err)
		}
		split += st.CachedInfo().State.Msgs
	}
	if split < uint64(10*len(keys)) {
		t.Fatalf("key streams hold %d messages, want the %d or more published after the move", split, 10*len(keys))
	}
	_, err = update("8")
	wantCode(t, "a change of the key stream count after the move", err, codes.InvalidArgument)
}
