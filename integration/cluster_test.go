package integration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/embedded"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/testutil"
)

// Ordered delivery on an R3 stream in a 3-node in-process cluster, received
// through two nodes at once.
func TestClusterR3OrderedDelivery(t *testing.T) {
	cluster, err := embedded.StartCluster(t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Shutdown)
	opts := []adapter.Option{adapter.WithReplicas(3), adapter.WithOwnerLease(2 * time.Second)}
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
	if _, err := clients[0].CreateSubscription(ctx, "sub-1", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, AckDeadline: 2 * time.Second}); err != nil {
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
