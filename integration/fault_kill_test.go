package integration

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
)

// The sidecar binary, killed with SIGKILL while it delivers and restarted
// on the same data dir and ports: Google's Go client reconnects by itself,
// every message is acked in the end, and per key the first deliveries stay
// in publish order. Acks the dead process had not passed on are lost, so a
// key may start again from a message acked before (counted as a rewind);
// from there it must go on in order. Messages published after the restart
// are delivered too.
func TestFaultSidecarSIGKILL(t *testing.T) {
	a := itest.Start(t, sidecar.Config{}, itest.Binary(itest.BuildSidecar(t)))
	c := a.GoClient()
	mustCreateTopic(t, c, "killed")
	mustCreateSub(t, c, &pb.Subscription{Name: subPath("killed-sub"), Topic: topicPath("killed"), EnableMessageOrdering: true, AckDeadlineSeconds: 10})

	chk := ordercheck.New()
	const keys, perBatch = 16, 30
	pub := c.Publisher("killed")
	pub.EnableMessageOrdering = true
	defer pub.Stop()
	keyNames := make([]string, 0, keys+1)
	for k := range keys {
		keyNames = append(keyNames, fmt.Sprintf("device-%d", k))
	}
	keyNames = append(keyNames, "") // and unkeyed messages
	publishBatch := func(from int) { itest.PublishChecked(t, pub, chk, keyNames, from, from+perBatch) }
	publishBatch(0)

	var lastDelivery atomic.Int64 // unix nanos
	handle := itest.CheckedHandler(chk, "killed-sub", 0)
	stopReceive := receiveGo(t, c.Subscriber("killed-sub"), func(ctx context.Context, m *pubsub.Message) {
		lastDelivery.Store(time.Now().UnixNano())
		handle(ctx, m)
	})
	total := (keys + 1) * perBatch
	testutil.Eventually(t, 60*time.Second, func() bool { return chk.Stats("killed-sub").Acks >= total/3 },
		"a third of the messages not acked before the kill: %+v", func() ordercheck.Stats { return chk.Stats("killed-sub") })

	chk.AcksMayBeLost()
	before := chk.Stats("killed-sub")
	killedAt := time.Now()
	a.Kill()
	b := a.Restart()
	restartedIn := time.Since(killedAt)
	testutil.Eventually(t, 60*time.Second, func() bool { return lastDelivery.Load() > b.ReadyAt.UnixNano() },
		"nothing delivered after the restart")
	stall := time.Unix(0, lastDelivery.Load()).Sub(killedAt)

	publishBatch(perBatch)
	testutil.Eventually(t, 90*time.Second, func() bool { return chk.Complete("killed-sub") },
		"not acked after the restart: %s", func() string { return chk.Missing("killed-sub") })
	if v := chk.Violations(); len(v) > 0 {
		t.Fatalf("%d ordering violations, first: %s", len(v), strings.Join(v, "\n"))
	}
	st := chk.Stats("killed-sub")
	t.Logf("SIGKILL after %d of %d acks; restart took %v; first delivery %v after the kill; "+
		"%d messages (%d keys + unkeyed), %d deliveries, %d redeliveries, %d keys went back to a message acked before",
		before.Acks, total, restartedIn.Round(time.Millisecond), stall.Round(time.Millisecond),
		2*total, keys, st.Deliveries, st.Redeliveries, st.Rewinds)
	stopReceive() // while the sidecar still answers the client's last acks
	b.Stop()
	if testing.Verbose() && os.Getenv("JETORDER_TEST_LOG") != "" {
		t.Logf("restarted sidecar's log:\n%s", b.Log())
	}
}
