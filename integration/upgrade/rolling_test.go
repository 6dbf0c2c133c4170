package upgrade_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
)

// rollingSidecars share the subscription, each beside its own app (a
// publisher and a receiver of Google's Go client).
const rollingSidecars = 3

// rollingLoad is how hard a rolling upgrade is driven.
type rollingLoad struct {
	keys   int
	tick   time.Duration // each key publishes one message per tick
	mixed  int           // deliveries a new sidecar makes before the next step
	rounds int
}

// A rolling upgrade, as users upgrade the sidecars beside their app pods:
// three sidecars of an earlier release share an ordered subscription on
// one nats-server (R1) or a 3-node cluster (R3) while Google's Go client
// publishes keyed messages through all three and receives through all
// three; the sidecars are replaced by today's build one at a time (SIGTERM,
// then the new one on the same name and gRPC address, which the clients
// reconnect to), each new one delivering beside the old ones before the
// next step. Every delivery goes through the checker: nothing whose publish
// returned an id is lost or stored twice, no key is overtaken, never two
// messages of a key in handlers at once. Today's build leaves its layout
// record behind. The stall of each step is logged. JETORDER_UPGRADE_LONG=1
// runs twice the load (about what per-key delivery on the R3 cluster keeps
// up with on 2 cores under -race), three rounds and both delivery modes,
// and prints a table of figures.
func TestRollingUpgrade(t *testing.T) {
	long := os.Getenv("JETORDER_UPGRADE_LONG") == "1"
	load, deliveries := rollingLoad{keys: 50, tick: 200 * time.Millisecond, mixed: 50, rounds: 1}, []string{""}
	if long {
		load, deliveries = rollingLoad{keys: 100, tick: 200 * time.Millisecond, mixed: 500, rounds: 3}, []string{"per-key", "partitioned"}
	}
	newBin, natsBin := itest.BuildSidecar(t), itest.BuildNATSServer(t)
	for _, r := range itest.Releases {
		t.Run(r.Short(), func(t *testing.T) {
			oldBin := itest.BuildSidecarAt(t, r.Commit)
			for _, v := range []struct {
				name  string
				nodes int
			}{{"server", 1}, {"cluster", 3}} {
				t.Run(v.name, func(t *testing.T) {
					if !long {
						t.Parallel() // within make test's time; the long mode's figures are each run's own
						rollingUpgrade(t, oldBin, newBin, natsBin, v.nodes, "", rollingOldStop(r, ""), load)
						return
					}
					var table []string
					for _, d := range deliveries {
						for round := range load.rounds {
							t.Run(fmt.Sprintf("%s-round-%d", d, round+1), func(t *testing.T) {
								for _, s := range rollingUpgrade(t, oldBin, newBin, natsBin, v.nodes, d, rollingOldStop(r, d), load) {
									table = append(table, fmt.Sprintf("| %s | %s | %d | %s |", v.name, d, round+1, s.row()))
								}
							})
						}
					}
					t.Logf("rolling upgrade %s to today's build, %d keys, one message per key every %v:\n"+
						"| nats | delivery | round | step | stopped in | new one serving after | step took | worst key gap | any-delivery gap | slowest publish | deliveries per sidecar |\n"+
						"|---|---|---|---|---|---|---|---|---|---|---|\n%s", r.Short(), load.keys, load.tick, strings.Join(table, "\n"))
				})
			}
		})
	}
}

// rollingOldStop is the old sidecars' --shutdown-timeout: the default, 5
// s, but for a release whose per-key receivers may take 10 s to stop
// (itest.Release.SlowPerKeyStop): its shutdown would overrun the default
// and cut publishes in flight, which the client retries on the
// replacement, storing them twice (docs/EVIDENCE.md, "Rolling upgrades: the long run").
func rollingOldStop(r itest.Release, delivery string) time.Duration {
	if r.SlowPerKeyStop && delivery == string(adapter.DeliveryPerKey) {
		return 15 * time.Second
	}
	return 5 * time.Second
}

// rollingStep is the figures of one step (or of the steady flow before).
type rollingStep struct {
	name                                        string
	stop, start, took, keyGap, anyGap, slowestP time.Duration
	gapKey                                      string               // the key of keyGap
	per                                         [rollingSidecars]int // deliveries by each sidecar's receiver
}

func (s rollingStep) String() string {
	return fmt.Sprintf("stopped in %v, new one serving %v later, step took %v; worst key gap %v (%s), any-delivery gap %v, slowest publish %v; deliveries per sidecar %v",
		rollingMS(s.stop), rollingMS(s.start), rollingMS(s.took), rollingMS(s.keyGap), s.gapKey, rollingMS(s.anyGap), rollingMS(s.slowestP), s.per)
}

// row is the step's row of the long mode's table; the steady flow has no
// stop and start.
func (s rollingStep) row() string {
	stop, start := "-", "-"
	if s.stop > 0 {
		stop, start = rollingMS(s.stop).String(), rollingMS(s.start).String()
	}
	return fmt.Sprintf("%s | %s | %s | %s | %s (%s) | %s | %s | %v", s.name, stop, start, rollingMS(s.took), rollingMS(s.keyGap), s.gapKey, rollingMS(s.anyGap), rollingMS(s.slowestP), s.per)
}

func rollingMS(d time.Duration) time.Duration { return d.Round(time.Millisecond) }

// rollingUpgrade runs one rolling upgrade from oldBin to newBin on nodes
// nats-servers, the subscription created with the delivery label (""
// none: the sidecar's default), and returns the figures of the steady
// flow before and of each step.
func rollingUpgrade(t *testing.T, oldBin, newBin, natsBin string, nodes int, delivery string, oldStop time.Duration, load rollingLoad) []rollingStep {
	urls := itest.StartNATSServers(t, natsBin, nodes)
	ctx := context.Background()
	cfg := func(i int, addr string, stop time.Duration) sidecar.Config {
		c := sidecar.Config{NATSURL: urls, Name: fmt.Sprintf("sidecar-%d", i), GRPCAddr: addr, ShutdownTimeout: stop}
		if nodes > 1 {
			c.Replicas = 3
		}
		if itest.Delivery != "" {
			c.Delivery = adapter.DefaultDelivery // a new user's default, whatever JETORDER_TEST_DELIVERY says
		}
		return c
	}
	var (
		scs     [rollingSidecars]*itest.Sidecar
		clients [rollingSidecars]*pubsub.Client
	)
	for i := range scs {
		addr := itest.FreeAddr(t) // kept by the replacement, so the app's client reconnects to it
		scs[i] = itest.Start(t, cfg(i, addr, oldStop), itest.Binary(oldBin))
		clients[i] = itest.GoClient(t, addr, itest.Patient()...)
	}
	labels := map[string]string{}
	if delivery != "" {
		labels["jetorder-delivery"] = delivery
	}
	// A new cluster may still be placing its first streams.
	var err error
	testutil.Eventually(t, 30*time.Second, func() bool {
		_, err = clients[0].TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: itest.TopicPath("rolling")})
		if err == nil || status.Code(err) == codes.AlreadyExists {
			_, err = clients[0].SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{Name: itest.SubPath("rolling-sub"),
				Topic: itest.TopicPath("rolling"), EnableMessageOrdering: true, AckDeadlineSeconds: 10, Labels: labels})
		}
		return err == nil || status.Code(err) == codes.AlreadyExists
	}, "create the topic and subscription: %v", func() error { return err })

	chk := ordercheck.New() // the sidecar's default ordering is strict
	flow := newRollingFlow(load.keys)
	var stopReceive [rollingSidecars]func()
	for i, c := range clients {
		handle := itest.CheckedHandler(chk, "rolling-sub", 0)
		stopReceive[i] = itest.ReceiveGo(t, c.Subscriber("rolling-sub"), func(ctx context.Context, m *pubsub.Message) {
			flow.delivered(i, m.OrderingKey)
			handle(ctx, m)
		})
	}
	// Receivers stop before their sidecars are killed at the test's end
	// (the new ones' cleanups run first), also when the test fails.
	defer func() {
		for _, stop := range stopReceive {
			stop()
		}
	}()
	stopPublish := flow.publish(clients, chk, load.tick)
	defer stopPublish()

	// Steady flow through the three old sidecars first, for comparison:
	// once every key and every sidecar delivers, as long again.
	var steps []rollingStep
	for range 2 {
		since := time.Now()
		testutil.Eventually(t, 60*time.Second, func() bool { return flow.serving(since, -1, load.mixed) }, "old sidecars not delivering: %s", flow.describe)
		steps = []rollingStep{flow.figures("steady (old)", since, time.Now())}
	}
	for i := range scs {
		stop := time.Now()
		scs[i].Stop()
		stopped := time.Now()
		scs[i] = itest.Start(t, cfg(i, scs[i].GRPC, 5*time.Second), itest.Binary(newBin)) // --shutdown-timeout's default
		ready := scs[i].ReadyAt
		// Mixed versions serve the subscription until the new one has
		// delivered its share and every key flows again.
		testutil.Eventually(t, 90*time.Second, func() bool { return flow.serving(ready, i, load.mixed) },
			"step %d: not flowing again after the new sidecar started: %s; missing: %s", i+1, flow.describe, func() string { return chk.Missing("rolling-sub") })
		s := flow.figures(fmt.Sprintf("%d: sidecar-%d", i+1, i), stop, time.Now())
		s.stop, s.start = stopped.Sub(stop), ready.Sub(stopped)
		steps = append(steps, s)
		// The time of day, to find the step of a violation (the checker's).
		t.Logf("step %s old to new at %s: %s", s.name, stop.Format("15:04:05.000"), s)
	}
	drain := time.Now()
	stopPublish()

	// Every message whose publish returned an id gets acked: waited for
	// while acks go on (a backlog drains at its own pace), failed once
	// none came for 30 s.
	published, failures := flow.published()
	acks, acked := -1, time.Now()
	testutil.Poll(10*time.Minute, func() bool {
		if a := chk.Stats("rolling-sub").Acks; a != acks {
			acks, acked = a, time.Now()
		}
		return chk.Complete("rolling-sub") || time.Since(acked) > 30*time.Second
	})
	if !chk.Complete("rolling-sub") {
		t.Fatalf("published messages not acked, the last ack %v ago: %s", time.Since(acked).Round(time.Millisecond), chk.Missing("rolling-sub"))
	}
	drained := time.Since(drain)
	if len(failures) > 0 {
		t.Errorf("%d keys' publishes failed through the rolling upgrade, first: %s", len(failures), strings.Join(failures[:min(5, len(failures))], "; "))
	}
	if v := chk.Violations(); len(v) > 0 {
		t.Errorf("%d ordering violations:\n%s", len(v), strings.Join(v, "\n"))
	}
	st := chk.Stats("rolling-sub")
	t.Logf("%d messages published (%d keys) and acked, the last %v after publishing stopped: %d deliveries, %d redeliveries; steady flow: worst key gap %v, any-delivery gap %v",
		published, load.keys, drained.Round(time.Millisecond), st.Deliveries, st.Redeliveries, steps[0].keyGap.Round(time.Millisecond), steps[0].anyGap.Round(time.Millisecond))

	nc, err := nats.Connect(urls)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// Each message whose publish returned an id is stored once: a
	// publish cut off by a stopping sidecar and retried by the client on
	// its replacement would be stored twice (and delivered again after
	// later messages of its key).
	in, err := adapter.NewInspector(nc)
	if err != nil {
		t.Fatal(err)
	}
	topics, err := in.Topics(ctx)
	if err != nil || len(topics) != 1 {
		t.Fatalf("topics: %v (%d)", err, len(topics))
	}
	if stored := int(topics[0].Messages); stored != published && len(failures) == 0 {
		t.Errorf("the topic holds %d messages, and %d publishes returned an id", stored, published)
	}

	// Today's build recorded its layout (1 would be no record).
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := adapter.AccountLayout(ctx, js); err != nil || v != adapter.LayoutVersion {
		t.Errorf("layout after the upgrade: %d (%v), want %d", v, err, adapter.LayoutVersion)
	}

	// The new sidecars stop as cleanly, once their clients are gone.
	for _, stop := range stopReceive {
		stop()
	}
	for _, sc := range scs {
		sc.Stop()
	}
	return steps
}

// rollingFlow publishes the keys' messages and records when each was
// delivered, by which sidecar's receiver.
type rollingFlow struct {
	keys   []string
	keyIdx map[string]int // read-only once made

	mu       sync.Mutex
	events   []rollingEvent // in time order
	last     []time.Time    // by key: its latest delivery
	pubs     []rollingPub   // publish results, in the order they came back
	failures []string       // by key: its first failed publish
	count    int            // publishes that returned an id
	failed   []atomic.Bool  // by key: a publish failed, the key is paused
}

type rollingEvent struct {
	at        time.Time
	key, slot int
}

type rollingPub struct{ at, began time.Time }

func newRollingFlow(keys int) *rollingFlow {
	f := &rollingFlow{keyIdx: map[string]int{}, last: make([]time.Time, keys), failed: make([]atomic.Bool, keys)}
	for k := range keys {
		f.keys = append(f.keys, fmt.Sprintf("key-%03d", k))
		f.keyIdx[f.keys[k]] = k
	}
	return f
}

func (f *rollingFlow) delivered(slot int, key string) {
	k, ok := f.keyIdx[key]
	if !ok {
		return // the checker reports it
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	f.events = append(f.events, rollingEvent{at: now, key: k, slot: slot})
	f.last[k] = now
}

// publish sends each key's next message every tick, key k through
// clients[k%3], and tells chk of those whose publish returned an id. A
// key whose publish fails is paused by the client and published no more.
// The returned stop waits until every result is in; calling it again does
// nothing.
func (f *rollingFlow) publish(clients [rollingSidecars]*pubsub.Client, chk *ordercheck.Checker, tick time.Duration) (stop func()) {
	type pending struct {
		k, idx int
		began  time.Time
		r      *pubsub.PublishResult
	}
	ctx, cancel := context.WithCancel(context.Background())
	var (
		wg      sync.WaitGroup
		pubs    [rollingSidecars]*pubsub.Publisher
		results [rollingSidecars]chan pending
	)
	for i, c := range clients {
		pubs[i], results[i] = c.Publisher("rolling"), make(chan pending, 100_000)
		pubs[i].EnableMessageOrdering = true
		// One collector per publisher, whose results come back in order.
		wg.Go(func() {
			for q := range results[i] {
				_, err := q.r.Get(context.Background())
				f.mu.Lock()
				switch {
				case err == nil:
					chk.Published(f.keys[q.k], q.idx)
					f.count++
					f.pubs = append(f.pubs, rollingPub{at: time.Now(), began: q.began})
				case !f.failed[q.k].Swap(true):
					f.failures = append(f.failures, fmt.Sprintf("%s message %d: %v", f.keys[q.k], q.idx, err))
				}
				f.mu.Unlock()
			}
			pubs[i].Stop()
		})
	}
	wg.Go(func() {
		ticker := time.NewTicker(tick)
		defer ticker.Stop()
		next := make([]int, len(f.keys))
		for {
			for k, key := range f.keys {
				if f.failed[k].Load() {
					continue
				}
				i := k % rollingSidecars
				results[i] <- pending{k: k, idx: next[k], began: time.Now(),
					r: pubs[i].Publish(ctx, &pubsub.Message{Data: ordercheck.Encode(key, next[k]), OrderingKey: key})}
				next[k]++
			}
			select {
			case <-ticker.C:
				continue
			case <-ctx.Done():
			}
			for _, ch := range results {
				close(ch)
			}
			return
		}
	})
	var once sync.Once
	return func() { once.Do(func() { cancel(); wg.Wait() }) }
}

// serving reports whether deliveries flow since t: every key not paused
// has had one, and the receiver of sidecar slot (every one, with -1) has
// made at least n.
func (f *rollingFlow) serving(t time.Time, slot, n int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, at := range f.last {
		if !f.failed[k].Load() && !at.After(t) {
			return false
		}
	}
	var per [rollingSidecars]int
	for i := len(f.events) - 1; i >= 0 && f.events[i].at.After(t); i-- {
		per[f.events[i].slot]++
	}
	for i, got := range per {
		if (slot < 0 || slot == i) && got < n {
			return false
		}
	}
	return true
}

// figures are the stalls of [from, to]: the longest any key went without
// a delivery (counted from its last one before from, and up to to), the
// longest without any delivery, the slowest publish that came back, and
// the deliveries by each sidecar's receiver.
func (f *rollingFlow) figures(name string, from, to time.Time) rollingStep {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := rollingStep{name: name, took: to.Sub(from)}
	prev, anyAt := make([]time.Time, len(f.keys)), from
	for k := range prev {
		prev[k] = from
	}
	for _, e := range f.events {
		if e.at.After(to) {
			break
		}
		if !e.at.Before(from) {
			if gap := e.at.Sub(prev[e.key]); gap > s.keyGap {
				s.keyGap, s.gapKey = gap, f.keys[e.key]
			}
			s.anyGap = max(s.anyGap, e.at.Sub(anyAt))
			s.per[e.slot]++
			anyAt = e.at
		}
		prev[e.key] = e.at
	}
	for k, at := range prev {
		if gap := to.Sub(at); gap > s.keyGap && !f.failed[k].Load() {
			s.keyGap, s.gapKey = gap, f.keys[k]
		}
	}
	s.anyGap = max(s.anyGap, to.Sub(anyAt))
	for _, p := range f.pubs {
		if !p.at.Before(from) && !p.at.After(to) {
			s.slowestP = max(s.slowestP, p.at.Sub(p.began))
		}
	}
	return s
}

// describe says which keys wait and what each receiver delivered.
func (f *rollingFlow) describe() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var per [rollingSidecars]int
	for _, e := range f.events {
		per[e.slot]++
	}
	var waiting []string
	for k, at := range f.last {
		if time.Since(at) > 2*time.Second {
			waiting = append(waiting, fmt.Sprintf("%s (last delivered %v ago)", f.keys[k], time.Since(at).Round(time.Millisecond)))
		}
	}
	return fmt.Sprintf("deliveries per sidecar %v, %d keys without a delivery for 2 s: %s", per, len(waiting), strings.Join(waiting[:min(5, len(waiting))], ", "))
}

// published is the count of publishes that returned an id, and each
// paused key's first failure.
func (f *rollingFlow) published() (int, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.count, append([]string(nil), f.failures...)
}
