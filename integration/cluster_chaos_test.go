package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/nats-io/nats.go"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/faultproxy"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
)

// chaosCluster is three nats-server processes in a cluster whose every
// route goes through a proxy (routes[i][j]: node i's route to node j), so
// that a node can be partitioned from the others, and a proxy in front of
// each node's client port for the sidecar that uses it. Each node
// advertises, as its route address, a port where nothing listens: the
// routes the servers learn from each other fail, and only the proxied ones
// carry the cluster.
type chaosCluster struct {
	t           *testing.T
	bin         string
	confs       []string
	clientURLs  []string // the nodes' own client ports
	nodes       []*itest.Process
	routes      [3][3]*faultproxy.Proxy
	clientProxy [3]*faultproxy.Proxy
}

func newChaosCluster(t *testing.T) *chaosCluster {
	c := &chaosCluster{t: t, bin: itest.BuildNATSServer(t), nodes: make([]*itest.Process, 3)}
	var clusterAddrs [3]string
	for i := range 3 {
		clusterAddrs[i] = itest.FreeAddr(t)
		c.clientURLs = append(c.clientURLs, "nats://"+itest.FreeAddr(t))
	}
	proxy := func(target string) *faultproxy.Proxy {
		p, err := faultproxy.Start(target)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	for i := range 3 {
		for j := range 3 {
			if i != j {
				c.routes[i][j] = proxy(clusterAddrs[j])
			}
		}
		c.clientProxy[i] = proxy(c.clientURLs[i])
	}
	nowhere := itest.FreeAddr(t)
	for i := range 3 {
		var routes []string
		for j := range 3 {
			if i != j {
				routes = append(routes, strconv.Quote("nats-route://"+c.routes[i][j].Addr()))
			}
		}
		conf := filepath.Join(t.TempDir(), "c"+strconv.Itoa(i)+".conf")
		text := fmt.Sprintf("server_name: c%d\nlisten: %q\njetstream { store_dir: %q }\ncluster { name: chaos, listen: %q, advertise: %q, routes: [%s] }\n",
			i, strings.TrimPrefix(c.clientURLs[i], "nats://"), filepath.Join(t.TempDir(), "js"), clusterAddrs[i], nowhere, strings.Join(routes, ", "))
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		c.confs = append(c.confs, conf)
		c.start(i)
	}
	waitClusterJetStream(t, strings.Join(c.clientURLs, ","))
	return c
}

func (c *chaosCluster) start(i int) {
	c.nodes[i] = itest.StartProcess(c.t, c.bin, []string{"-c", c.confs[i]}, nil, nil)
}

// partition cuts node i off from the other two; heal joins it again.
func (c *chaosCluster) partition(i int, cut bool) {
	for j := range 3 {
		if j == i {
			continue
		}
		for _, p := range []*faultproxy.Proxy{c.routes[i][j], c.routes[j][i]} {
			if cut {
				p.Block()
			} else {
				p.Heal()
			}
		}
	}
}

// A fault is done to the cluster and, after a while, undone.
type clusterFault struct {
	kind string
	do   func() (undo func())
}

// TestClusterChaos: three sidecar processes, each on its own node of a
// three-node cluster (R3 streams and buckets), receive one ordered
// subscription through Google's Go client while a publisher stores ordered
// messages throughout, and faults come one after another: a node killed,
// a node paused past the ack deadline, a node partitioned from the other
// two, a sidecar cut off from its node, a sidecar killed, and a node and a
// sidecar killed at once. The checker sees every delivery: no acknowledged
// publish lost, no key overtaken, no key's message delivered while an
// earlier one was in a handler. Each fault's stall (from the fault to the
// moment every message published before it is acked) is reported.
//
// It runs with JETORDER_CLUSTER_CHAOS=1 (JETORDER_CLUSTER_CHAOS_ROUNDS
// runs every kind of fault that many times, JETORDER_CLUSTER_CHAOS_FAULTS
// picks kinds), not yet in make test: its runs still find stalls of
// minutes after some faults (docs/RELIABILITY.md, "A cluster under
// faults").
func TestClusterChaos(t *testing.T) {
	if os.Getenv("JETORDER_CLUSTER_CHAOS") != "1" {
		t.Skip("set JETORDER_CLUSTER_CHAOS=1 to run the cluster chaos test (about 2 minutes a round)")
	}
	rounds := chaosEnv("ROUNDS", 1)
	if v, err := strconv.Atoi(os.Getenv("JETORDER_CLUSTER_CHAOS_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	cl := newChaosCluster(t)
	bin := itest.BuildSidecar(t)
	scs := make([]*itest.Sidecar, 3)
	for i := range 3 {
		// Its own node first; the others the client learns from the
		// cluster, and fails over to.
		scs[i] = itest.Start(t, sidecar.Config{NATSURL: cl.clientProxy[i].URL(), Replicas: 3, Name: "sidecar-" + strconv.Itoa(i)},
			itest.Binary(bin), itest.ReadyTimeout(90*time.Second))
	}
	admin := scs[0].GoClient(itest.Patient()...)
	var err error
	testutil.Eventually(t, 60*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = admin.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topicPath("cluster-topic")})
		return err == nil || strings.Contains(err.Error(), "AlreadyExists")
	}, "CreateTopic on the cluster: %v", func() error { return err })
	mustCreateSub(t, admin, &pb.Subscription{Name: subPath("cluster-sub"), Topic: topicPath("cluster-topic"), EnableMessageOrdering: true, AckDeadlineSeconds: 5})

	chk := ordercheck.New()
	chk.AcksMayBeLost()
	var lastDelivery atomic.Int64
	perSidecar := make([]atomic.Int64, 3)
	var stopReceiving []func()
	for i, sc := range scs {
		c := sc.GoClient(itest.Patient()...)
		stopReceiving = append(stopReceiving, receiveGo(t, c.Subscriber("cluster-sub"), func(_ context.Context, m *pubsub.Message) {
			lastDelivery.Store(time.Now().UnixNano())
			perSidecar[i].Add(1)
			key, idx, err := ordercheck.Decode(m.Data)
			if err != nil || key != m.OrderingKey {
				chk.Fail("undecodable delivery %q (key %q): %v", m.Data, m.OrderingKey, err)
				m.Ack()
				return
			}
			chk.Delivered("cluster-sub", key, idx)
			chk.Acked("cluster-sub", key, idx)
			m.Ack()
		}))
	}

	// The publisher: the library on its own connection to every node,
	// each key's messages in order, a failed publish tried again until
	// it is stored (it may then be stored twice: a redelivery of an
	// acked message, which AcksMayBeLost allows).
	nc, err := nats.Connect(strings.Join(cl.clientURLs, ","), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.ReconnectBufSize(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	pc, err := adapter.NewClient(nc, itest.Project, adapter.WithReplicas(3))
	if err != nil {
		t.Fatal(err)
	}
	topic := pc.Topic("cluster-topic")
	const keys = 40
	var published atomic.Int64 // messages stored
	var lastIdx [keys]atomic.Int64
	pubCtx, stopPub := context.WithCancel(context.Background())
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		for idx := 0; pubCtx.Err() == nil; idx++ {
			var wg sync.WaitGroup
			for k := range keys {
				key := "k" + strconv.Itoa(k)
				wg.Go(func() {
					for pubCtx.Err() == nil {
						ctx, cancel := context.WithTimeout(pubCtx, 15*time.Second)
						_, err := topic.Publish(ctx, &adapter.Message{Data: ordercheck.Encode(key, idx), OrderingKey: key}).Get(ctx)
						cancel()
						if err == nil {
							chk.Published(key, idx)
							published.Add(1)
							lastIdx[k].Store(int64(idx))
							return
						}
						topic.ResumePublish(key)
						select {
						case <-time.After(100 * time.Millisecond):
						case <-pubCtx.Done():
						}
					}
				})
			}
			wg.Wait()
			select { // about 400 messages a second
			case <-time.After(100 * time.Millisecond):
			case <-pubCtx.Done():
			}
		}
	}()
	stopPublishing := sync.OnceFunc(func() { stopPub(); <-pubDone })
	t.Cleanup(stopPublishing)

	// stored is, per key, the last index stored so far; caughtUp waits
	// until every key is acked up to it, and returns how long after from
	// that was.
	stored := func() []int64 {
		out := make([]int64, keys)
		for k := range out {
			out[k] = lastIdx[k].Load()
		}
		return out
	}
	behind := func(upTo []int64) string {
		for k, n := range upTo {
			if got := chk.AckedThrough("cluster-sub", "k"+strconv.Itoa(k)); int64(got) < n {
				return fmt.Sprintf("k%d acked through %d of %d", k, got, n)
			}
		}
		return ""
	}
	caughtUp := func(what string, from time.Time, upTo []int64) time.Duration {
		testutil.Eventually(t, 120*time.Second, func() bool { return behind(upTo) == "" },
			"%s: messages stored before it not all acked within 120 s: %s", what, func() string { return behind(upTo) })
		return time.Since(from)
	}
	testutil.Eventually(t, 60*time.Second, func() bool { return published.Load() > 2*keys }, "nothing published")
	caughtUp("start", time.Now(), stored())

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	node := func() int { return rng.IntN(3) }
	faults := []clusterFault{
		{"node killed", func() func() {
			i := node()
			cl.nodes[i].Kill()
			time.Sleep(3 * time.Second) // down for a while, as a host that reboots
			return func() { cl.start(i) }
		}},
		{"node paused past the ack deadline", func() func() {
			i := node()
			cl.nodes[i].Signal(syscall.SIGSTOP)
			time.Sleep(6 * time.Second) // the fault's length: the ack deadline (5 s) and more
			return func() { cl.nodes[i].Signal(syscall.SIGCONT) }
		}},
		{"node partitioned", func() func() {
			i := node()
			cl.partition(i, true)
			time.Sleep(5 * time.Second) // the partition's length
			return func() { cl.partition(i, false) }
		}},
		{"sidecar cut off from its node", func() func() {
			i := node()
			cl.clientProxy[i].Block()
			time.Sleep(3 * time.Second)
			return cl.clientProxy[i].Heal
		}},
		{"sidecar killed", func() func() {
			i := node()
			scs[i].Kill()
			return func() { scs[i] = scs[i].Restart() }
		}},
		{"node and sidecar killed at once", func() func() {
			i, j := node(), node()
			cl.nodes[i].Kill()
			scs[j].Kill()
			return func() { cl.start(i); scs[j] = scs[j].Restart() }
		}},
	}
	// JETORDER_CLUSTER_CHAOS_FAULTS picks faults by a word of their kind
	// ("killed,partitioned").
	if only := os.Getenv("JETORDER_CLUSTER_CHAOS_FAULTS"); only != "" {
		var picked []clusterFault
		for _, f := range faults {
			for w := range strings.SplitSeq(only, ",") {
				if strings.Contains(f.kind, strings.TrimSpace(w)) {
					picked = append(picked, f)
					break
				}
			}
		}
		faults = picked
	}
	stalls := map[string][]time.Duration{}
	for r := range rounds {
		for _, f := range faults {
			// Let deliveries flow between faults.
			testutil.Eventually(t, 60*time.Second, func() bool { return time.Since(time.Unix(0, lastDelivery.Load())) < 200*time.Millisecond },
				"no deliveries before %q (round %d)", f.kind, r+1)
			// The stall: from the fault to the moment every message stored
			// before it is acked, watched while the fault lasts.
			at, before := time.Now(), stored()
			caught := make(chan time.Duration, 1)
			go func() {
				for behind(before) != "" && time.Since(at) < 2*time.Minute {
					time.Sleep(10 * time.Millisecond) // polling the checker
				}
				caught <- time.Since(at)
			}()
			undo := f.do()
			undo()
			stall := <-caught
			if b := behind(before); b != "" {
				t.Fatalf("%s (round %d): messages stored before it not all acked 2 min later: %s", f.kind, r+1, b)
			}
			stalls[f.kind] = append(stalls[f.kind], stall)
			t.Logf("round %d, %s: caught up %v after the fault began; %d stored, deliveries per sidecar %d/%d/%d",
				r+1, f.kind, stall.Round(time.Millisecond), published.Load(), perSidecar[0].Load(), perSidecar[1].Load(), perSidecar[2].Load())
		}
	}
	stopPublishing()
	caughtUp("the end", time.Now(), stored())
	if m := chk.Missing("cluster-sub"); m != "" {
		t.Errorf("stored messages never acked: %s", m)
	}
	// While every sidecar runs: a sidecar restarted by a fault is stopped
	// by a cleanup that runs before the receivers' own (cleanups run
	// last-in first-out), and a client whose sidecar is gone waits for it.
	for _, stop := range stopReceiving {
		stop()
	}
	var report []string
	for _, f := range faults {
		report = append(report, fmt.Sprintf("%s: %d, %s", f.kind, len(stalls[f.kind]), percentiles(stalls[f.kind])))
	}
	st := chk.Stats("cluster-sub")
	t.Logf("cluster chaos, %s delivery, %d rounds:\n%s\n%d messages stored, %d deliveries, %d redeliveries, %d keys went back to a message acked before",
		deliveryName(), rounds, strings.Join(report, "\n"), published.Load(), st.Deliveries, st.Redeliveries, st.Rewinds)
	if v := chk.Violations(); len(v) > 0 {
		t.Fatalf("ordering violations:\n%s", strings.Join(v, "\n"))
	}
}
