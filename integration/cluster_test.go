package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/embedded"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// Ordered delivery on an R3 stream in a 3-node in-process cluster, received
// through two nodes at once.
func TestClusterR3OrderedDelivery(t *testing.T) {
	cluster, err := embedded.StartCluster(t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Shutdown)
	opts := []adapter.Option{adapter.WithReplicas(3), adapter.WithFailoverTimeout(2 * time.Second)}
	clients := make([]*adapter.Client, 2)
	for i := range clients {
		nc := testutil.Connect(t, cluster.Nodes[i].ClientURL())
		if clients[i], err = adapter.NewClient(nc, project, opts...); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	var topic *adapter.Topic
	// The cluster may still be settling its JetStream placement.
	testutil.Eventually(t, 30*time.Second, func() bool {
		topic, err = clients[0].CreateTopic(ctx, "replicated")
		if errors.Is(err, adapter.ErrTopicExists) { // an earlier try timed out but went through
			topic, err = clients[0].Topic("replicated"), nil
		}
		return err == nil
	}, "CreateTopic on the cluster: %v", func() error { return err })
	if _, err := clients[0].CreateSubscription(ctx, "sub-1", withTestDelivery(adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, AckDeadline: 2 * time.Second})); err != nil {
		t.Fatal(err)
	}
	c := ordercheck.New()
	for _, cl := range clients {
		startReceive(t, cl.Subscription("sub-1"), checkedHandler(c, "sub-1", chaos{nackPct: 5}))
	}
	publishChecked(t, topic, c, 8, 20, 1, 0)
	testutil.Eventually(t, 60*time.Second, func() bool { return c.Complete("sub-1") }, "not acked: %s", func() string { return c.Missing("sub-1") })
	if v := c.Violations(); len(v) > 0 {
		t.Fatalf("ordering violations: %s", strings.Join(v, "\n"))
	}
}

// Publishing over 10 keys to an R3 topic while its stream leader is made to
// step down three times: messages that get no responder during an election
// are retried by the publisher, in order, so every key's stored messages
// are in publish order, each stored once, and every success is stored.
// (nats.go's own no-responder retry re-sends messages in timer order, which
// stored messages behind later ones of their key.)
func TestClusterPublishOrderAcrossLeaderChanges(t *testing.T) {
	cluster, err := embedded.StartCluster(t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Shutdown)
	nc := testutil.Connect(t, cluster.Nodes[0].ClientURL())
	client, err := adapter.NewClient(nc, project, adapter.WithReplicas(3))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	var topic *adapter.Topic
	testutil.Eventually(t, 30*time.Second, func() bool {
		topic, err = client.CreateTopic(ctx, "elections")
		if errors.Is(err, adapter.ErrTopicExists) {
			topic, err = client.Topic("elections"), nil
		}
		return err == nil
	}, "CreateTopic on the cluster: %v", func() error { return err })

	const keys, perBurst, bursts = 10, 500, 4
	type sent struct {
		key    string
		idx    int
		result *adapter.PublishResult
	}
	var all []sent
	next := map[string]int{}
	stream := keyrouter.StreamName(project, "elections")
	stepDowns := 0
	for b := range bursts {
		if b > 0 {
			// A request made mid-election may time out; the others count.
			if _, err := nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+stream, nil, 10*time.Second); err == nil {
				stepDowns++
			}
		}
		for i := range perBurst {
			key := fmt.Sprint("k", i%keys)
			r := topic.Publish(ctx, &adapter.Message{Data: ordercheck.Encode(key, next[key]), OrderingKey: key})
			all = append(all, sent{key, next[key], r})
			next[key]++
		}
	}
	topic.Flush()
	succeeded := map[string]bool{}
	failed := 0
	for _, s := range all {
		if _, err := s.result.Get(ctx); err != nil {
			failed++
			continue
		}
		succeeded[fmt.Sprint(s.key, "|", s.idx)] = true
	}
	if stepDowns == 0 {
		t.Fatal("no leader step-down took place")
	}
	t.Logf("%d published through %d leader changes, %d failed (their keys paused)", len(all), stepDowns, failed)

	// Read the stream back once it has a leader again, message by message.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var str jetstream.Stream
	testutil.Eventually(t, 30*time.Second, func() bool {
		str, err = js.Stream(ctx, stream)
		return err == nil && str.CachedInfo().Cluster != nil && str.CachedInfo().Cluster.Leader != ""
	}, "stream leader: %v", func() error { return err })
	last := map[string]int{}
	stored := map[string]bool{}
	for seq := uint64(1); seq <= str.CachedInfo().State.LastSeq; seq++ {
		var m *jetstream.RawStreamMsg
		testutil.Eventually(t, 10*time.Second, func() bool {
			m, err = str.GetMsg(ctx, seq)
			return err == nil || errors.Is(err, jetstream.ErrMsgNotFound)
		}, "get message %d: %v", seq, func() error { return err })
		if m == nil {
			continue
		}
		key, idx, err := ordercheck.Decode(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if l, ok := last[key]; ok && idx <= l {
			t.Fatalf("key %s: message %d stored after message %d", key, idx, l)
		}
		last[key] = idx
		stored[fmt.Sprint(key, "|", idx)] = true
	}
	for id := range succeeded {
		if !stored[id] {
			t.Fatalf("message %s reported stored but is not in the stream", id)
		}
	}
}
