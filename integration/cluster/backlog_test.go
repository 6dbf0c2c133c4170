package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
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
	// At debug level: a failed run reports the sidecars' lines about the
	// keys left behind (backlogReport).
	scs := cl.startSidecars(itest.Binary(itest.BuildSidecar(t)), itest.ReadyTimeout(90*time.Second), itest.Flags("--log-level", "debug"))
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
		t.Errorf("not every message delivered and acked 2 min after the last was stored (%d deliveries): %s\n%s",
			deliveries.Load(), chk.Missing("backlog-sub"), backlogReport(nc, scs, chk, keys, perKey))
	}
	rebound := 0
	for _, sc := range scs {
		rebound += strings.Count(sc.Log(), "it was asked to step down")
	}
	if rebound > 0 {
		t.Logf("%d key consumers stalled unbound had their leader step down", rebound)
	}
	st := chk.Stats("backlog-sub")
	t.Logf("%s delivery: %d messages delivered in %v, %d deliveries, %d redeliveries", itest.DeliveryName(), keys*perKey, time.Since(began).Round(time.Millisecond), st.Deliveries, st.Redeliveries)
	if v := chk.Violations(); len(v) > 0 {
		t.Fatalf("ordering violations:\n%s", strings.Join(v[:min(len(v), 20)], "\n"))
	}
}

// backlogReport says, for a backlog left behind, what the server's key
// consumers of the keys behind hold, and what the sidecars logged of the
// first few of those consumers.
func backlogReport(nc *nats.Conn, scs []*itest.Sidecar, chk *ordercheck.Checker, keys, perKey int) string {
	var b strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		return err.Error()
	}
	behind := map[string]int{} // the key's subject -> messages acked
	for k := range keys {
		key := "k" + strconv.Itoa(k)
		if n := chk.AckedThrough("backlog-sub", key) + 1; n < perKey {
			behind[keyrouter.KeyedSubject(itest.Project, "backlog-topic", key)] = n
		}
	}
	var named []string
	for name := range js.StreamNames(ctx).Name() {
		if !strings.HasPrefix(name, "JO_") {
			continue
		}
		s, err := js.Stream(ctx, name)
		if err != nil {
			fmt.Fprintf(&b, "stream %s: %v\n", name, err)
			continue
		}
		var all, paused, ackPending, pendingIdle int
		for info := range s.ListConsumers(ctx).Info() {
			all++
			if info.Paused {
				paused++
			}
			if info.NumAckPending > 0 {
				ackPending++
			}
			if info.NumAckPending == 0 && info.NumPending > 0 {
				pendingIdle++
			}
			acked, ok := behind[info.Config.FilterSubject]
			if !ok {
				continue
			}
			if len(named) < 8 {
				named = append(named, info.Name)
				fmt.Fprintf(&b, "behind (%d acked): consumer %s %s\n", acked, info.Name, consumerState(info))
			}
		}
		fmt.Fprintf(&b, "stream %s: %d consumers, %d paused, %d with a message unacked, %d with messages pending and none unacked; %d keys behind\n",
			name, all, paused, ackPending, pendingIdle, len(behind))
	}
	for n, sc := range scs {
		var lines []string
		for line := range strings.Lines(sc.Log()) {
			if slices.ContainsFunc(named, func(c string) bool { return strings.Contains(line, c) }) {
				lines = append(lines, line)
			}
		}
		fmt.Fprintf(&b, "sidecar %d, %d lines about those consumers:\n%s", n, len(lines), strings.Join(lines[max(0, len(lines)-40):], ""))
	}
	return b.String()
}
