package cluster_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/nats-io/nats.go"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/testutil"
)

// TestClusterBacklogThroughNodeKill: a backlog received through a node's
// death, as a new user tries it. Three sidecars, each on its own node of
// a three-node cluster (R3), receive one ordered subscription through
// Google's Go client with the subscription's defaults, while 200 keys x
// 100 messages are published as fast as the cluster stores them; a node
// is SIGKILLed 4 s in and started again 3 s later. Every message must be
// delivered within 2 minutes, in order per key, never two messages of a
// key in handlers at once.
func TestClusterBacklogThroughNodeKill(t *testing.T) {
	const keys, perKey = 200, 100
	cl := newChaosCluster(t)
	scs := cl.startSidecars(itest.Binary(itest.BuildSidecar(t)), itest.ReadyTimeout(90*time.Second))
	admin := scs[0].GoClient(itest.Patient()...)
	createTopicOnCluster(t, admin, "backlog-topic")
	itest.MustCreateSub(t, admin, &pb.Subscription{Name: itest.SubPath("backlog-sub"), Topic: itest.TopicPath("backlog-topic"), EnableMessageOrdering: true})

	chk := ordercheck.New()
	chk.AcksMayBeLost() // a sidecar whose node dies may lose acks it passed on
	var deliveries atomic.Int64
	for _, sc := range scs {
		c := sc.GoClient(itest.Patient()...)
		itest.ReceiveGo(t, c.Subscriber("backlog-sub"), func(_ context.Context, m *pubsub.Message) {
			key, idx, err := ordercheck.Decode(m.Data)
			if err != nil || key != m.OrderingKey {
				chk.Fail("undecodable delivery %q (key %q): %v", m.Data, m.OrderingKey, err)
				m.Ack()
				return
			}
			chk.Delivered("backlog-sub", key, idx)
			deliveries.Add(1)
			chk.Acked("backlog-sub", key, idx)
			m.Ack()
		})
	}

	// The library publishes, on a connection to every node: each key's
	// messages in order, a failed publish tried again until it is stored.
	nc, err := nats.Connect(strings.Join(cl.clientURLs, ","), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.ReconnectBufSize(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	pc, err := adapter.NewClient(nc, itest.Project, adapter.WithReplicas(3))
	if err != nil {
		t.Fatal(err)
	}
	topic := pc.Topic("backlog-topic")
	var stored atomic.Int64
	var publishers sync.WaitGroup
	for k := range keys {
		key := "k" + strconv.Itoa(k)
		publishers.Go(func() {
			for i := range perKey {
				for {
					ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
					_, err := topic.Publish(ctx, &adapter.Message{Data: ordercheck.Encode(key, i), OrderingKey: key}).Get(ctx)
					cancel()
					if err == nil {
						chk.Published(key, i)
						stored.Add(1)
						break
					}
					topic.ResumePublish(key)
					time.Sleep(100 * time.Millisecond) // before trying again
				}
			}
		})
	}
	began := time.Now()
	time.Sleep(4 * time.Second) // the fault's moment, not synchronisation
	victim := 1
	t.Logf("SIGKILL node c%d at %v: %d stored, %d delivered", victim, time.Since(began).Round(time.Millisecond), stored.Load(), deliveries.Load())
	cl.nodes[victim].Kill()
	time.Sleep(3 * time.Second) // down for a while, as a host that reboots
	cl.start(victim)
	t.Logf("node c%d started again at %v", victim, time.Since(began).Round(time.Millisecond))
	publishers.Wait()
	t.Logf("all %d stored at %v", stored.Load(), time.Since(began).Round(time.Millisecond))
	if !testutil.Poll(2*time.Minute, func() bool { return chk.Complete("backlog-sub") }) {
		t.Errorf("not every message delivered and acked 2 min after the last was stored (%d deliveries): %s", deliveries.Load(), chk.Missing("backlog-sub"))
	}
	st := chk.Stats("backlog-sub")
	t.Logf("%s delivery: %d messages delivered in %v, %d deliveries, %d redeliveries", itest.DeliveryName(), keys*perKey, time.Since(began).Round(time.Millisecond), st.Deliveries, st.Redeliveries)
	if v := chk.Violations(); len(v) > 0 {
		t.Fatalf("ordering violations:\n%s", strings.Join(v[:min(len(v), 20)], "\n"))
	}
}
