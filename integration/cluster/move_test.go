package cluster_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// TestClusterMoveOntoKeyStreams: a topic of one stream on a three-node
// cluster (R3) moves onto key streams by UpdateTopic of its label while
// the library publishes and three sidecars receive its ordered
// subscription through Google's Go client; their receivers move the
// subscription at once. Every message arrives, each key in order (the
// strict checker sees every delivery), and the key streams have three
// replicas and the keyed messages published after the move.
func TestClusterMoveOntoKeyStreams(t *testing.T) {
	const keys = 20
	cl := newChaosCluster(t)
	scs := cl.startSidecars(itest.ReadyTimeout(90 * time.Second))
	admin := scs[0].GoClient(itest.Patient()...)
	ctx := context.Background()
	testutil.Eventually(t, 60*time.Second, func() bool {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		// A label of 1: one stream, whatever the test run's default.
		_, err := admin.TopicAdminClient.CreateTopic(cctx, &pb.Topic{Name: itest.TopicPath("move"), Labels: map[string]string{"jetorder-key-streams": "1"}})
		return err == nil || strings.Contains(err.Error(), "AlreadyExists")
	}, "CreateTopic on the cluster")
	itest.MustCreateSub(t, admin, &pb.Subscription{Name: itest.SubPath("move-sub"), Topic: itest.TopicPath("move"), EnableMessageOrdering: true})

	chk := ordercheck.New()
	for _, sc := range scs {
		c := sc.GoClient(itest.Patient()...)
		itest.ReceiveGo(t, c.Subscriber("move-sub"), itest.CheckedHandler(chk, "move-sub", 0))
	}

	// The library publishes in rounds of a message per key, each round
	// stored before the next, 10 rounds a second at most (the move takes
	// seconds on the cluster: the backlog stays a few thousand messages).
	nc := rawConnect(t, cl.clientURLs)
	pc, err := adapter.NewClient(nc, itest.Project, adapter.WithReplicas(3))
	if err != nil {
		t.Fatal(err)
	}
	topic := pc.Topic("move")
	rounds := itest.PublishRounds(func(i int) error {
		var results []*adapter.PublishResult
		for k := range keys {
			key := fmt.Sprintf("k%d", k)
			chk.Published(key, i)
			results = append(results, topic.Publish(ctx, &adapter.Message{Data: ordercheck.Encode(key, i), OrderingKey: key}))
		}
		return itest.Stored(ctx, results)
	}, 100*time.Millisecond)
	start := time.Now()
	testutil.Eventually(t, 60*time.Second, rounds.Reached(10), "10 rounds not published")
	t.Logf("%v: 10 rounds published; moving", time.Since(start).Round(time.Millisecond))
	if _, err := admin.TopicAdminClient.UpdateTopic(ctx, &pb.UpdateTopicRequest{
		Topic:      &pb.Topic{Name: itest.TopicPath("move"), Labels: map[string]string{"jetorder-key-streams": "4"}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels"}}}); err != nil {
		t.Fatalf("UpdateTopic moving the topic onto 4 key streams: %v", err)
	}
	t.Logf("%v: moved", time.Since(start).Round(time.Millisecond))
	testutil.Eventually(t, 60*time.Second, rounds.Reached(rounds.Done()+10), "10 rounds after the move not published")
	if err := rounds.Stop(); err != nil {
		t.Fatalf("publish across the move: %v", err)
	}
	t.Logf("%v: %d rounds published", time.Since(start).Round(time.Millisecond), rounds.Done())
	testutil.Eventually(t, 90*time.Second, func() bool { return chk.Complete("move-sub") }, "not every message acked: %s",
		func() string { return chk.Missing("move-sub") })
	t.Logf("%v: every message acked", time.Since(start).Round(time.Millisecond))
	if v := chk.Violations(); len(v) > 0 {
		t.Fatalf("violations:\n%s", strings.Join(v, "\n"))
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var split uint64
	for i := range 4 {
		st, err := js.Stream(ctx, keyrouter.KeyStreamName(itest.Project, "move", i))
		if err != nil {
			t.Fatal(err)
		}
		if r := st.CachedInfo().Config.Replicas; r != 3 {
			t.Fatalf("key stream %d has %d replicas, want 3", i, r)
		}
		split += st.CachedInfo().State.Msgs
	}
	if split < 10*keys {
		t.Fatalf("key streams hold %d messages, want the %d or more published after the move", split, 10*keys)
	}
}
