package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/embedded"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// Fault tests at the library level: keyed publishers and ordered receivers
// run against a server, or a cluster node, that is stopped and started
// again under load. Publishers do what an application does with a failed
// publish: resume the key and publish the failed messages again, in order.
// Every delivery goes through the ordering checker. (Batches of many
// messages of a key cut by a restart: TestFaultReconnectMidBatch.)

// loadMsg names one message: its key and its index within the key.
type loadMsg struct {
	key string
	idx int
}

// loadAck is the copy of a message that was acked first, and when.
type loadAck struct {
	seq uint64
	at  time.Time
}

// keyLoad publishes on keys at a steady rate and receives what it
// published, recording what the checks and the figures need.
type keyLoad struct {
	topic   *adapter.Topic
	check   *ordercheck.Checker
	sub     string
	keys    []string
	every   time.Duration // between two messages of one key
	nackPct int

	ctx     context.Context // bounds publishing, until the test's deadline
	stop    chan struct{}
	writers sync.WaitGroup

	mu           sync.Mutex
	stored       int              // messages published successfully, each once
	skipped      int              // publish ticks skipped, the key too far ahead of its acks
	failures     map[string]int   // failed publish results, by cause
	failed       map[loadMsg]bool // messages with a failed publish attempt
	acked        map[loadMsg]loadAck
	deliveries   []time.Time
	byKey        map[string][]time.Time
	ackedThrough map[string]int // per key, the first message not acked
	repeats      int            // acked messages delivered again, the same copy
	repeatDepth  int            // the furthest a repeat went back behind its key's first unacked message
	// repeats of a message acked away from the fault (well before it, or
	// after it healed): a consumer leader lost the ack at another time
	repeatsOutside int
	copies         int // deliveries of a second stored copy of a message whose publish had failed
	faultAt        time.Time
	healedAt       time.Time // zero while the fault lasts
	problems       []string  // broken publisher promises and de-duplication, reported by the test
}

func newKeyLoad(ctx context.Context, topic *adapter.Topic, sub string, keys int, every time.Duration, nackPct int) *keyLoad {
	l := &keyLoad{
		topic: topic, check: ordercheck.New(), sub: sub, every: every, nackPct: nackPct,
		ctx: ctx, stop: make(chan struct{}),
		failures: map[string]int{}, failed: map[loadMsg]bool{}, acked: map[loadMsg]loadAck{}, ackedThrough: map[string]int{}, byKey: map[string][]time.Time{},
	}
	for k := range keys {
		l.keys = append(l.keys, fmt.Sprintf("key-%02d", k))
	}
	return l
}

// startPublishing starts one publisher goroutine per key.
func (l *keyLoad) startPublishing() {
	for _, key := range l.keys {
		l.writers.Add(1)
		go l.publishKey(key)
	}
}

// stopPublishing stops new messages and waits until every key's messages,
// the failed ones published again, are stored.
func (l *keyLoad) stopPublishing() {
	close(l.stop)
	l.writers.Wait()
}

type loadSent struct {
	idx int
	res *adapter.PublishResult
}

// publishKey publishes key's messages 0, 1, 2, ... one every l.every, not
// waiting for results. When a result is a failure, the key is paused (and
// every later result fails too): it takes them all, resumes the key and
// goes on from the first failed message, as an application would.
func (l *keyLoad) publishKey(key string) {
	defer l.writers.Done()
	var out []loadSent
	next, high := 0, 0 // next index to publish; one past the highest published
	tick := time.NewTicker(l.every)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-l.stop:
			l.finishKey(key, out, next, high)
			return
		case <-l.ctx.Done():
			l.problem("key %s: publishing cut short: %v", key, l.ctx.Err())
			return
		}
		out, next = l.settle(key, out, next, false)
		if l.behind(key, next) {
			continue
		}
		out = append(out, loadSent{next, l.topic.Publish(l.ctx, &adapter.Message{Data: ordercheck.Encode(key, next), OrderingKey: key})})
		next++
		high = max(high, next)
	}
}

// loadBacklog bounds how far a key's publisher runs ahead of its acks: on a
// machine too slow to deliver at the publish rate, the run stays the same
// size instead of piling up messages to wait for.
const loadBacklog = 150

// behind reports whether key's publisher is to skip a tick, next being
// loadBacklog messages ahead of the key's first unacked one.
func (l *keyLoad) behind(key string, next int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if next-l.ackedThrough[key] < loadBacklog {
		return false
	}
	l.skipped++
	return true
}

// finishKey waits for key's outstanding results and publishes what failed
// again until every message below high is stored.
func (l *keyLoad) finishKey(key string, out []loadSent, next, high int) {
	for {
		out, next = l.settle(key, out, next, true)
		if len(out) == 0 && next == high {
			return
		}
		if l.ctx.Err() != nil {
			l.problem("key %s: messages %d..%d never stored: %v", key, next, high-1, l.ctx.Err())
			return
		}
		for ; next < high; next++ {
			out = append(out, loadSent{next, l.topic.Publish(l.ctx, &adapter.Message{Data: ordercheck.Encode(key, next), OrderingKey: key})})
		}
	}
}

// settle takes the finished results off the front of out (all of them,
// waiting, if wait is set) and returns what is left and the next index to
// publish.
func (l *keyLoad) settle(key string, out []loadSent, next int, wait bool) ([]loadSent, int) {
	for len(out) > 0 {
		s := out[0]
		if !wait {
			select {
			case <-s.res.Ready():
			default:
				return out, next
			}
		}
		if _, err := s.res.Get(l.ctx); err != nil {
			if l.ctx.Err() != nil {
				return out, next
			}
			l.failedFrom(key, out)
			l.topic.ResumePublish(key)
			return nil, s.idx
		}
		l.mu.Lock()
		l.stored++
		l.mu.Unlock()
		l.check.Published(key, s.idx)
		out = out[1:]
	}
	return out, next
}

// failedFrom records the failure of out[0] and of everything after it,
// which the paused key fails too; a later success would break the
// publisher's promise that nothing of a key is stored after a failure.
func (l *keyLoad) failedFrom(key string, out []loadSent) {
	for _, s := range out {
		select {
		case <-s.res.Ready():
		case <-l.ctx.Done():
			return
		}
		_, err := s.res.Get(l.ctx)
		l.mu.Lock()
		if err == nil {
			l.problems = append(l.problems, fmt.Sprintf("key %s: message %d stored after message %d failed", key, s.idx, out[0].idx))
		} else {
			l.failures[causeOf(err)]++
			l.failed[loadMsg{key, s.idx}] = true
		}
		l.mu.Unlock()
	}
}

func causeOf(err error) string {
	switch {
	case errors.Is(err, adapter.ErrPublishingPaused):
		return "key paused"
	case errors.Is(err, nats.ErrDisconnected):
		return "disconnected"
	case errors.Is(err, jetstream.ErrAsyncPublishTimeout):
		return "ack timeout"
	case errors.Is(err, adapter.ErrTopicNotFound):
		return "no stream responded"
	}
	return err.Error()
}

func (l *keyLoad) problem(format string, args ...any) {
	l.mu.Lock()
	l.problems = append(l.problems, fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

// fault marks the start of the fault; healed marks its end (the server or
// node is back).
func (l *keyLoad) fault() {
	l.mu.Lock()
	l.faultAt = time.Now()
	l.mu.Unlock()
}

func (l *keyLoad) healed() {
	l.mu.Lock()
	l.healedAt = time.Now()
	l.mu.Unlock()
}

// handle is the receivers' handler. A delivery of a message already acked
// is a repeat, allowed by at-least-once delivery: it is counted and acked,
// and only first deliveries (and redeliveries of messages not yet acked) go
// to the checker, whose order they must keep. A repeat is either the same
// stored copy again (its ack was lost, with a server or a consumer leader)
// or a second stored copy of a message whose publish had failed (the failed
// attempt was stored after all, then published again). A second copy of a
// message whose publish never failed is a problem: de-duplication failed.
func (l *keyLoad) handle(_ context.Context, m *adapter.Message) {
	key, idx, err := ordercheck.Decode(m.Data)
	if err != nil || key != m.OrderingKey {
		l.check.Fail("%s: undecodable delivery %q (key %q): %v", l.sub, m.Data, m.OrderingKey, err)
		m.Ack()
		return
	}
	id := loadMsg{key, idx}
	l.mu.Lock()
	now := time.Now() // under the lock: the delivery times stay sorted
	l.deliveries = append(l.deliveries, now)
	l.byKey[key] = append(l.byKey[key], now)
	if a, ok := l.acked[id]; ok {
		switch {
		case a.seq == m.StreamSequence:
			l.repeats++
			l.repeatDepth = max(l.repeatDepth, l.ackedThrough[key]-idx)
			if !l.inFault(a.at) {
				l.repeatsOutside++
			}
		case l.failed[id]:
			l.copies++
		default:
			l.problems = append(l.problems, fmt.Sprintf("%s|%d stored twice (stream sequences %d and %d) though its publish never failed", key, idx, a.seq, m.StreamSequence))
		}
		l.mu.Unlock()
		m.Ack()
		return
	}
	l.mu.Unlock()
	l.check.Delivered(l.sub, key, idx)
	if rand.IntN(100) < l.nackPct {
		l.check.Released(l.sub, key, idx)
		m.Nack()
		return
	}
	l.mu.Lock()
	l.acked[id] = loadAck{m.StreamSequence, time.Now()}
	for l.acked[loadMsg{key, l.ackedThrough[key]}].seq != 0 {
		l.ackedThrough[key]++
	}
	l.mu.Unlock()
	l.check.Acked(l.sub, key, idx)
	m.Ack()
}

// inFault reports whether an ack at t was made around the fault: from
// shortly before it began (acks on their way or not yet applied) until it
// healed. Called with l.mu held.
func (l *keyLoad) inFault(t time.Time) bool {
	if l.faultAt.IsZero() || t.Before(l.faultAt.Add(-2*time.Second)) {
		return false
	}
	return l.healedAt.IsZero() || !t.After(l.healedAt)
}

// delivered counts the deliveries so far (each key's, and in all).
func (l *keyLoad) delivered() (min, all int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	min = -1
	for _, k := range l.keys {
		if n := len(l.byKey[k]); min < 0 || n < min {
			min = n
		}
	}
	return min, len(l.deliveries)
}

// deliveredSince counts, for the key with fewest, deliveries after t.
func (l *keyLoad) deliveredSince(t time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	least := -1
	for _, k := range l.keys {
		ts := l.byKey[k]
		n := len(ts) - sort.Search(len(ts), func(i int) bool { return ts[i].After(t) })
		if least < 0 || n < least {
			least = n
		}
	}
	return least
}

// verify waits until every stored message is acked and fails on any
// ordering violation or broken publisher promise; then it logs the figures.
func (l *keyLoad) verify(t *testing.T, timeout time.Duration) {
	t.Helper()
	testutil.Eventually(t, timeout, func() bool { return l.check.Complete(l.sub) },
		"not every stored message acked: %s%s", func() string { return l.check.Missing(l.sub) },
		func() string { // a stall may follow an ordering violation: show it
			if v := l.check.Violations(); len(v) > 0 {
				return fmt.Sprintf("; %d ordering violations:\n%s", len(v), strings.Join(v, "\n"))
			}
			return ""
		})
	if v := l.check.Violations(); len(v) > 0 {
		t.Fatalf("%d ordering violations:\n%s", len(v), strings.Join(v, "\n"))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.problems) > 0 {
		t.Fatalf("publishing: %s", strings.Join(l.problems, "; "))
	}
	st := l.check.Stats(l.sub)
	failed := 0
	for _, n := range l.failures {
		failed += n
	}
	t.Logf("%d keys, one message per key every %v: %d messages stored; %d publish results failed %v and were published again; %d ticks skipped with %d messages of a key unacked",
		len(l.keys), l.every, l.stored, failed, l.failures, l.skipped, loadBacklog)
	t.Logf("%d deliveries: %d redeliveries before an ack (%d%% nacked); %d repeats of acked messages: %d the same copy (ack lost; %d acked away from the fault; at most %d behind the key's first unacked message), %d a second copy of a message whose publish had failed",
		len(l.deliveries), st.Redeliveries, l.nackPct, l.repeats+l.copies, l.repeats, l.repeatsOutside, l.repeatDepth, l.copies)
	l.logStall(t)
}

// logStall logs how long delivery stalled around the fault: the time from
// the fault to the first delivery after it and to the first after it
// healed, the time until every key had a delivery again, the longest gap
// between two deliveries from a second before the fault on, and the longest
// gap of one key after the fault. Called with l.mu held.
func (l *keyLoad) logStall(t *testing.T) {
	t.Helper()
	ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	firstAfter := func(ts []time.Time, at time.Time) (time.Duration, int) {
		i := sort.Search(len(ts), func(i int) bool { return ts[i].After(at) })
		if i == len(ts) {
			return -1, i
		}
		return ts[i].Sub(at), i
	}
	var gap time.Duration
	var gapAt time.Time
	_, from := firstAfter(l.deliveries, l.faultAt.Add(-time.Second))
	for i := max(from, 1); i < len(l.deliveries); i++ {
		if d := l.deliveries[i].Sub(l.deliveries[i-1]); d > gap {
			gap, gapAt = d, l.deliveries[i-1]
		}
	}
	afterFault, _ := firstAfter(l.deliveries, l.faultAt)
	afterHeal, _ := firstAfter(l.deliveries, l.healedAt)
	var everyKey, keyGap time.Duration
	for _, ts := range l.byKey {
		d, i := firstAfter(ts, l.faultAt)
		everyKey = max(everyKey, d)
		for j := max(i, 1); j < len(ts); j++ {
			keyGap = max(keyGap, ts[j].Sub(ts[j-1]))
		}
	}
	t.Logf("stall: fault to healed %v; first delivery %v after the fault, %v after it healed; every key delivering again %v after the fault",
		ms(l.healedAt.Sub(l.faultAt)), ms(afterFault), ms(afterHeal), ms(everyKey))
	t.Logf("stall: longest gap between two deliveries from 1s before the fault on %v (from %+v relative to the fault); longest gap of one key after the fault %v",
		ms(gap), ms(gapAt.Sub(l.faultAt)), ms(keyGap))
}

// connectCluster connects to urls (comma-separated) in the order given, so the
// test chooses which node a client starts on, reconnecting forever.
func connectCluster(t *testing.T, urls string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(urls, nats.ReconnectBufSize(-1), nats.DontRandomize(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("connect %s: %v", urls, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestFaultServerRestart stops the embedded nats-server (file storage)
// while 25 keys are published and received, keeps it down for a second
// after every client has noticed, and starts it again on the same store and
// port. Publishers and receivers reconnect and carry on: every stored
// message is acked, in order.
func TestFaultServerRestart(t *testing.T) {
	dir := t.TempDir()
	srv := testutil.ServerAt(t, dir, -1)
	port := srv.Addr().(*net.TCPAddr).Port
	url := srv.ClientURL()
	opts := append(testLogger(), adapter.WithFailoverTimeout(2*time.Second))
	conns := make([]*nats.Conn, 3) // a publisher and two receivers, as three processes
	clients := make([]*adapter.Client, 3)
	for i := range conns {
		conns[i] = testutil.Connect(t, url)
		var err error
		if clients[i], err = adapter.NewClient(conns[i], project, opts...); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	topic, err := clients[0].CreateTopic(ctx, "restarted")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := clients[0].CreateSubscription(ctx, "sub", withTestDelivery(adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, AckDeadline: 2 * time.Second})); err != nil {
		t.Fatal(err)
	}
	l := newKeyLoad(ctx, topic, "sub", 25, 40*time.Millisecond, 3)
	var receivers []*receiving
	for _, c := range clients[1:] {
		receivers = append(receivers, startReceive(t, c.Subscription("sub"), l.handle))
	}
	l.startPublishing()
	testutil.Eventually(t, 30*time.Second, func() bool { least, _ := l.delivered(); return least >= 40 },
		"warm-up: every key delivered 40 times (fewest, all: %v)", func() string { a, b := l.delivered(); return fmt.Sprint(a, b) })

	l.fault()
	began := time.Now()
	srv.Shutdown()
	stopped := time.Since(began)
	testutil.Eventually(t, 10*time.Second, func() bool {
		for _, nc := range conns {
			if nc.IsConnected() {
				return false
			}
		}
		return true
	}, "clients still connected after the server stopped")
	noticed := time.Since(began)
	// The outage itself, a parameter of the fault: clients keep publishing
	// into it.
	<-time.After(time.Second)
	restarting := time.Now()
	testutil.ServerAt(t, dir, port)
	l.healed()
	t.Logf("server stopped in %v, every client disconnected %v after the stop began; restart took %v",
		stopped.Round(time.Millisecond), noticed.Round(time.Millisecond), time.Since(restarting).Round(time.Millisecond))
	testutil.Eventually(t, 30*time.Second, func() bool { return l.deliveredSinceHeal() >= 100 },
		"after the restart: every key delivered 100 more times (fewest: %d)", l.deliveredSinceHeal)
	l.stopPublishing()
	l.verify(t, 30*time.Second)
	for i, r := range receivers {
		if err := r.stop(); err != nil {
			t.Errorf("receiver %d: %v", i, err)
		}
	}
}

// deliveredSinceHeal counts, for the key with fewest, deliveries after the
// fault healed.
func (l *keyLoad) deliveredSinceHeal() int {
	l.mu.Lock()
	healed := l.healedAt
	l.mu.Unlock()
	return l.deliveredSince(healed)
}

// TestFaultClusterLeaderKilled and TestFaultClusterFollowerKilled run 20
// keys through an R3 topic on a 3-node cluster and stop one node under
// load: the topic stream's leader, or a node that is not its leader. The
// publisher and one receiver start on that node, the other receiver on
// another; all know every node's URL and fail over. The node is started
// again on its store, and every stored message is acked, in order.
// (Stopping a node is nats-server's Shutdown, which hands its raft
// leaderships over before it closes connections: an orderly stop, not a
// crash.)
func TestFaultClusterLeaderKilled(t *testing.T) { clusterNodeKilled(t, true) }

func TestFaultClusterFollowerKilled(t *testing.T) { clusterNodeKilled(t, false) }

func clusterNodeKilled(t *testing.T, leader bool) {
	cluster, err := embedded.StartCluster(t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	opts := append(testLogger(), adapter.WithReplicas(3), adapter.WithFailoverTimeout(2*time.Second))
	admin, err := adapter.NewClient(connectCluster(t, cluster.ClientURLs()), project, opts...)
	if err != nil {
		t.Fatal(err)
	}
	var topic *adapter.Topic
	// The cluster may still be settling its JetStream placement.
	testutil.Eventually(t, 30*time.Second, func() bool {
		topic, err = admin.CreateTopic(ctx, "replicated")
		if errors.Is(err, adapter.ErrTopicExists) { // an earlier try timed out but went through
			topic, err = admin.Topic("replicated"), nil
		}
		return err == nil
	}, "CreateTopic on the cluster: %v", func() error { return err })
	testutil.Eventually(t, 30*time.Second, func() bool {
		_, err = admin.CreateSubscription(ctx, "sub", withTestDelivery(adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, AckDeadline: 2 * time.Second}))
		if errors.Is(err, adapter.ErrSubscriptionExists) {
			err = nil
		}
		return err == nil
	}, "CreateSubscription on the cluster: %v", func() error { return err })
	stream := keyrouter.StreamName(project, "replicated")
	testutil.Eventually(t, 30*time.Second, func() bool { return streamCurrent(cluster, stream) },
		"stream %s: a leader and current replicas", stream)
	leaderIdx := streamLeader(cluster, stream)
	victim, other := leaderIdx, (leaderIdx+1)%len(cluster.Nodes)
	if !leader {
		victim, other = (leaderIdx+1)%len(cluster.Nodes), leaderIdx
	}
	urls := func(first int) string {
		list := []string{cluster.Nodes[first].ClientURL()}
		for i, n := range cluster.Nodes {
			if i != first {
				list = append(list, n.ClientURL())
			}
		}
		return strings.Join(list, ",")
	}
	var clients []*adapter.Client
	for _, first := range []int{victim, victim, other} { // publisher, receiver, receiver
		c, err := adapter.NewClient(connectCluster(t, urls(first)), project, opts...)
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}

	l := newKeyLoad(ctx, clients[0].Topic("replicated"), "sub", 20, 50*time.Millisecond, 3)
	var receivers []*receiving
	for _, c := range clients[1:] {
		receivers = append(receivers, startReceive(t, c.Subscription("sub"), l.handle))
	}
	started := time.Now()
	l.startPublishing()
	testutil.Eventually(t, 60*time.Second, func() bool { least, _ := l.delivered(); return least >= 40 },
		"warm-up: every key delivered 40 times (fewest, all: %v)", func() string { a, b := l.delivered(); return fmt.Sprint(a, b) })

	role := "a follower"
	if leader {
		role = "the stream leader"
	}
	t.Logf("stopping node %s, %s (the leader is %s)", cluster.Nodes[victim].Name(), role, cluster.Nodes[leaderIdx].Name())
	l.fault()
	cluster.StopNode(victim)
	killedAt := time.Now()
	testutil.Eventually(t, 30*time.Second, func() bool { return streamLeader(cluster, stream) >= 0 },
		"stream %s: no leader on the nodes left", stream)
	t.Logf("node stopped in %v; stream leader %s %v after the stop began",
		killedAt.Sub(l.faultAt).Round(time.Millisecond), cluster.Nodes[streamLeader(cluster, stream)].Name(), time.Since(l.faultAt).Round(time.Millisecond))
	testutil.Eventually(t, 60*time.Second, func() bool { return l.deliveredSince(killedAt) >= 40 },
		"with a node down: every key delivered 40 more times (fewest: %d)", func() int { return l.deliveredSince(killedAt) })
	restarting := time.Now()
	if err := cluster.RestartNode(victim); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 60*time.Second, func() bool { return streamCurrent(cluster, stream) },
		"stream replicas current again after the restart")
	l.healed()
	t.Logf("warm-up %v, down %v, restart until every replica current %v",
		l.faultAt.Sub(started).Round(time.Millisecond), restarting.Sub(l.faultAt).Round(time.Millisecond), time.Since(restarting).Round(time.Millisecond))
	testutil.Eventually(t, 60*time.Second, func() bool { return l.deliveredSinceHeal() >= 40 },
		"after the restart: every key delivered 40 more times (fewest: %d)", l.deliveredSinceHeal)
	draining := time.Now()
	l.stopPublishing()
	l.verify(t, 60*time.Second)
	t.Logf("after the restart %v, last messages stored and acked in %v", draining.Sub(l.healedAt).Round(time.Millisecond), time.Since(draining).Round(time.Millisecond))
	for i, r := range receivers {
		if err := r.stop(); err != nil {
			t.Errorf("receiver %d: %v", i, err)
		}
	}
}

// streamLeader is the index of the node leading stream, -1 if none does.
func streamLeader(c *embedded.Cluster, stream string) int {
	for i, n := range c.Nodes {
		if n != nil && n.JetStreamIsStreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, stream) {
			return i
		}
	}
	return -1
}

// streamCurrent reports whether stream has a leader and is current on
// every node: all three replicas hold everything.
func streamCurrent(c *embedded.Cluster, stream string) bool {
	if streamLeader(c, stream) < 0 {
		return false
	}
	for _, n := range c.Nodes {
		if n == nil || !n.JetStreamIsStreamCurrent(server.DEFAULT_GLOBAL_ACCOUNT, stream) {
			return false
		}
	}
	return true
}
