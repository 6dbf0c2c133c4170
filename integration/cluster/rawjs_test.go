package cluster_test

import (
	"context"
	crand "crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/testutil"
)

// rawKeys is how many keys the raw JetStream run publishes, each with a
// consumer of its own, as per-key delivery has.
const rawKeys = 40

// rawFlow is the raw run's record: for each key, the indices stored (the
// publisher had the ack) and delivered, and every delivery that came
// before its key's previous message was ever delivered (a skip).
type rawFlow struct {
	mu        sync.Mutex
	stored    []int // by key: how many of its messages are stored
	lastStore []time.Time
	delivered []int // by key: the highest index delivered so far, -1 if none
	skips     []string
	handled   int
	paused    int
}

func (f *rawFlow) deliver(k, idx int, who string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.handled++
	if idx > f.delivered[k]+1 {
		f.skips = append(f.skips, fmt.Sprintf("%s k%d: message %d delivered (to %s) before message %d ever was",
			time.Now().UTC().Format("15:04:05.000"), k, idx, who, f.delivered[k]+1))
	}
	f.delivered[k] = max(f.delivered[k], idx)
}

// caughtUp says whether every key's stored messages have been delivered.
func (f *rawFlow) caughtUp() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k := range f.stored {
		if f.delivered[k] < f.stored[k]-1 {
			return false
		}
	}
	return true
}

// TestRawJetStreamKeyConsumersUnderFaults runs what per-key delivery
// asks of JetStream, without jetorder: an R3 stream on the chaos
// cluster, a push consumer per key with MaxAckPending 1 delivering to a
// queue group on three connections (one per node), a publisher that
// tries each message again, with its message id, until it is stored, and
// the stream's leader partitioned, paused or killed again and again. It
// checks that no key's consumer delivers a message before the key's
// previous one, and that every stored message is delivered.
//
// It is a control for the cluster chaos test, not part of make test:
// JETORDER_RAW_CHAOS=N runs N faults (JETORDER_RAW_CHAOS_FAULTS: a comma
// list of partition, pause, kill; all by default), and
// JETORDER_RAW_CHAOS_PAUSES=1 adds the pauses and resumes of idle key
// consumers that per-key clean-up makes (docs/RELIABILITY.md).
func TestRawJetStreamKeyConsumersUnderFaults(t *testing.T) {
	faults := rawChaosFaults(t)
	kinds := strings.Split(os.Getenv("JETORDER_RAW_CHAOS_FAULTS"), ",")
	if kinds[0] == "" {
		kinds = []string{"partition", "pause", "kill"}
	}
	f, caught := runRawChaos(t, faults, kinds, os.Getenv("JETORDER_RAW_CHAOS_PAUSES") != "", 0)
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.skips {
		t.Error(s)
	}
	if !caught {
		for k := range rawKeys {
			if f.delivered[k] < f.stored[k]-1 {
				t.Errorf("k%d: %d stored, delivered up to %d", k, f.stored[k], f.delivered[k])
			}
		}
	}
}

// TestRawJetStreamNegativeControl: the raw run sees a consumer pass a
// message. One partition of the stream's leader, with a receiver that
// acks every tenth message of k0 without handling it, as a consumer that
// passed it would look: the checker must report those skips.
func TestRawJetStreamNegativeControl(t *testing.T) {
	rawChaosFaults(t)
	f, _ := runRawChaos(t, 1, []string{"partition"}, false, 10)
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.skips) == 0 {
		t.Fatal("no skip seen, with every tenth message of k0 acked unhandled")
	}
	t.Logf("%d skips seen, the first: %s", len(f.skips), f.skips[0])
}

// rawConnect connects to the servers at urls, in that order, for the rest
// of the test, and reconnects for as long.
func rawConnect(t *testing.T, urls []string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	opts = append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond), nats.ReconnectBufSize(-1), nats.DontRandomize()}, opts...)
	nc, err := nats.Connect(strings.Join(urls, ","), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// rawChaosFaults is JETORDER_RAW_CHAOS, the raw runs' number of faults;
// without it they are skipped.
func rawChaosFaults(t *testing.T) int {
	faults, _ := strconv.Atoi(os.Getenv("JETORDER_RAW_CHAOS"))
	if faults <= 0 {
		t.Skip("JETORDER_RAW_CHAOS=N runs it with N faults")
	}
	return faults
}

// runRawChaos runs the raw run with faults of kinds in turn, the idle
// consumers' pauses if pauses, and, if loseEvery > 0, a receiver that
// acks every loseEvery-th message of k0 without handling it. It returns
// the run's record and whether every stored message was delivered.
func runRawChaos(t *testing.T, faults int, kinds []string, pauses bool, loseEvery int) (*rawFlow, bool) {
	cl := newChaosCluster(t)
	nc := rawConnect(t, cl.clientURLs)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stream jetstream.Stream
	testutil.Eventually(t, time.Minute, func() bool {
		stream, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "RAW", Subjects: []string{"raw.>"}, Replicas: 3, Storage: jetstream.FileStorage,
			Retention: jetstream.LimitsPolicy, Discard: jetstream.DiscardOld, Duplicates: 2 * time.Minute, AllowDirect: true, MaxConsumers: -1})
		return err == nil
	}, "create stream: %v", func() error { return err })
	for k := range rawKeys {
		testutil.Eventually(t, time.Minute, func() bool {
			_, err = js.CreateOrUpdatePushConsumer(ctx, "RAW", jetstream.ConsumerConfig{Durable: "key" + strconv.Itoa(k), DeliverSubject: "rawdeliver", DeliverGroup: "g",
				DeliverPolicy: jetstream.DeliverAllPolicy, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second, MaxDeliver: -1,
				FilterSubject: "raw.k" + strconv.Itoa(k), MaxAckPending: 1})
			return err == nil
		}, "create consumer: %v", func() error { return err })
	}

	f := &rawFlow{stored: make([]int, rawKeys), delivered: make([]int, rawKeys), lastStore: make([]time.Time, rawKeys)}
	for k := range f.delivered {
		f.delivered[k] = -1
	}
	for i := range 3 {
		rc := rawConnect(t, []string{cl.clientProxy[i].URL(), cl.clientProxy[(i+1)%3].URL(), cl.clientProxy[(i+2)%3].URL()})
		who := "receiver-" + strconv.Itoa(i)
		if _, err := rc.QueueSubscribe("rawdeliver", "g", func(m *nats.Msg) {
			var k, idx int
			if _, err := fmt.Sscanf(string(m.Data), "k%d %d", &k, &idx); err != nil || k < 0 || k >= rawKeys {
				return
			}
			if loseEvery > 0 && k == 0 && idx%loseEvery == loseEvery-1 {
				_ = m.Ack() // passed unhandled
				return
			}
			f.deliver(k, idx, who)
			time.Sleep(2 * time.Millisecond) // a handler's work
			_ = m.Ack()
		}); err != nil {
			t.Fatal(err)
		}
	}

	// The publisher: a round of every key about every 200 ms, each
	// message tried again (same id) until stored.
	pubCtx, stopPub := context.WithCancel(context.Background())
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		for idx := 0; pubCtx.Err() == nil; idx++ {
			var wg sync.WaitGroup
			for k := range rawKeys {
				wg.Go(func() {
					m := &nats.Msg{Subject: "raw.k" + strconv.Itoa(k), Data: fmt.Appendf(nil, "k%d %d", k, idx), Header: nats.Header{}}
					for pubCtx.Err() == nil {
						actx, cancel := context.WithTimeout(pubCtx, 2*time.Second)
						_, err := js.PublishMsg(actx, m, jetstream.WithMsgID(fmt.Sprintf("k%d-%d", k, idx)))
						cancel()
						if err == nil {
							f.mu.Lock()
							f.stored[k] = idx + 1
							f.lastStore[k] = time.Now()
							f.mu.Unlock()
							return
						}
						select { // "no responders" comes back at once
						case <-time.After(50 * time.Millisecond):
						case <-pubCtx.Done():
						}
					}
				})
			}
			wg.Wait()
			select {
			case <-time.After(200 * time.Millisecond):
			case <-pubCtx.Done():
			}
		}
	}()
	defer func() { stopPub(); <-pubDone }()

	// The idle-consumer clean-up of per-key delivery, without its delete:
	// a key with no message stored for 5 s has its consumer paused, looked
	// at, and resumed (a pause that ends in a moment).
	if pauses {
		cleanCtx, stopClean := context.WithCancel(context.Background())
		cleanDone := make(chan struct{})
		go func() {
			defer close(cleanDone)
			for cleanCtx.Err() == nil {
				select {
				case <-time.After(1250 * time.Millisecond):
				case <-cleanCtx.Done():
					return
				}
				f.mu.Lock()
				var idle []int
				for k, at := range f.lastStore {
					if !at.IsZero() && time.Since(at) > 5*time.Second {
						idle = append(idle, k)
					}
				}
				f.mu.Unlock()
				var wg sync.WaitGroup
				for _, k := range idle {
					wg.Go(func() {
						name := "key" + strconv.Itoa(k)
						actx, cancel := context.WithTimeout(cleanCtx, 10*time.Second)
						defer cancel()
						c, err := stream.PushConsumer(actx, name)
						if err != nil {
							return
						}
						info := c.CachedInfo()
						if info.NumPending > 0 || info.NumAckPending > 0 {
							return
						}
						if _, err := js.PauseConsumer(actx, "RAW", name, time.Now().Add(20*time.Second)); err != nil {
							return
						}
						_, _ = stream.GetLastMsgForSubject(actx, "raw.k"+strconv.Itoa(k))
						_, _ = stream.PushConsumer(actx, name)
						f.mu.Lock()
						f.paused++
						f.mu.Unlock()
						for delay := 10 * time.Millisecond; delay <= 2*time.Second; delay *= 4 {
							resp, err := js.PauseConsumer(actx, "RAW", name, time.Now().Add(delay))
							if err != nil || resp.Paused {
								return
							}
						}
					})
				}
				wg.Wait()
			}
		}()
		defer func() { stopClean(); <-cleanDone }()
	}

	leader := func() int {
		i := -1
		testutil.Eventually(t, time.Minute, func() bool {
			ictx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			info, err := stream.Info(ictx)
			if err == nil && info.Cluster != nil && strings.HasPrefix(info.Cluster.Leader, "c") {
				i, _ = strconv.Atoi(info.Cluster.Leader[1:])
			}
			return i >= 0
		}, "the stream has no leader")
		return i
	}
	for n := range faults {
		time.Sleep(3 * time.Second) // flowing between faults
		i, kind := leader(), kinds[n%len(kinds)]
		t.Logf("%s fault %d: %s the stream leader c%d", time.Now().UTC().Format("15:04:05.000"), n+1, kind, i)
		switch kind {
		case "partition":
			cl.partition(i, true)
			time.Sleep(5 * time.Second)
			cl.partition(i, false)
		case "pause":
			cl.nodes[i].Signal(syscall.SIGSTOP)
			time.Sleep(6 * time.Second)
			cl.nodes[i].Signal(syscall.SIGCONT)
		case "kill":
			cl.nodes[i].Kill()
			time.Sleep(3 * time.Second)
			cl.start(i)
		}
		f.mu.Lock()
		skips := len(f.skips)
		f.mu.Unlock()
		if skips > 0 {
			break
		}
	}
	stopPub()
	<-pubDone
	caught := testutil.Poll(2*time.Minute, f.caughtUp)
	f.mu.Lock()
	total := 0
	for _, s := range f.stored {
		total += s
	}
	t.Logf("%d messages stored, %d deliveries, %d skips, %d pauses", total, f.handled, len(f.skips), f.paused)
	f.mu.Unlock()
	return f, caught
}

// The deposed-leader scene: one key's stream and consumer.
const (
	deposedStream   = "DEPOSED"
	deposedSubject  = "deposed.k"
	deposedConsumer = "key"
	deposedDeliver  = "deposed.deliver"
)

// deposedCase is the scene of the deposed-leader tests on the chaos
// cluster: an R3 stream, an R3 key consumer configured as per-key
// delivery's (adapter's consumerConfig: AckExplicit, MaxAckPending 1, a
// deliver subject and queue group; AckWait 3 s) whose leader L is not the
// stream's leader, m1 to m3 stored, and receiver A, connected to L's node
// alone, holding m1.
type deposedCase struct {
	cl     *chaosCluster
	leader int            // L
	a      *nats.Conn     // A's connection, to L's node only
	toA    chan *nats.Msg // A's deliveries after m1
	first  *nats.Msg      // m1, as A got it
}

// startDeposedCase sets the scene; flowControl gives the consumer flow
// control and heartbeats, which deliver without waiting for the
// consumer's quorum (the negative control).
func startDeposedCase(t *testing.T, flowControl bool) *deposedCase {
	if itest.Delivery == adapter.DeliveryPerKey {
		t.Skip("raw JetStream, the same in every delivery mode: it runs in the default pass")
	}
	c := &deposedCase{cl: newChaosCluster(t), toA: make(chan *nats.Msg, 16)}
	nc := rawConnect(t, c.cl.clientURLs)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stream jetstream.Stream
	testutil.Eventually(t, time.Minute, func() bool {
		stream, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: deposedStream, Subjects: []string{deposedSubject}, Replicas: 3, Storage: jetstream.FileStorage})
		return err == nil
	}, "create stream: %v", func() error { return err })
	cfg := jetstream.ConsumerConfig{Durable: deposedConsumer, DeliverSubject: deposedDeliver, DeliverGroup: "g",
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: 1, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: 3 * time.Second, MaxDeliver: -1, FilterSubject: deposedSubject, MaxAckPending: 1}
	if flowControl {
		cfg.FlowControl, cfg.IdleHeartbeat = true, time.Second
	}
	testutil.Eventually(t, time.Minute, func() bool {
		_, err = js.CreateOrUpdatePushConsumer(ctx, deposedStream, cfg)
		return err == nil
	}, "create consumer: %v", func() error { return err })
	c.leader = -1
	testutil.Eventually(t, 30*time.Second, func() bool {
		if l := deposedLeaderVia(nc); strings.HasPrefix(l, "c") {
			c.leader, _ = strconv.Atoi(l[1:])
		}
		return c.leader >= 0
	}, "the consumer has no leader")
	// The stream's leader moves off L's node, so that the partition
	// leaves the stream led on the majority's side, and only the
	// consumer's leadership changes.
	lName, other := deposedNode(c.leader), deposedNode((c.leader+1)%3)
	var streamLeader string
	testutil.Eventually(t, time.Minute, func() bool {
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if info, err := stream.Info(ictx); err == nil && info.Cluster != nil {
			streamLeader = info.Cluster.Leader
		}
		if streamLeader == lName {
			_, _ = nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+deposedStream, []byte(`{"placement":{"preferred":"`+other+`"}}`), 2*time.Second)
		}
		return streamLeader != "" && streamLeader != lName
	}, "the stream's leader (%s) did not move off the consumer's leader %s", func() string { return streamLeader }, lName)
	for i := 1; i <= 3; i++ {
		testutil.Eventually(t, 30*time.Second, func() bool {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			_, err = js.Publish(pctx, deposedSubject, []byte("m"+strconv.Itoa(i)), jetstream.WithMsgID("m"+strconv.Itoa(i)))
			return err == nil
		}, "publish m%d: %v", i, func() error { return err })
	}

	// A sees no other node: L delivers to it, and only L can.
	c.a = rawConnect(t, []string{c.cl.clientURLs[c.leader]}, nats.IgnoreDiscoveredServers())
	if _, err := c.a.QueueSubscribe(deposedDeliver, "g", deposedReceiver(c.toA)); err != nil {
		t.Fatal(err)
	}
	select {
	case c.first = <-c.toA:
	case <-time.After(30 * time.Second):
		t.Fatalf("A, on the consumer's leader %s, got no delivery", lName)
	}
	if md, err := c.first.Metadata(); err != nil || md.Sequence.Stream != 1 || md.NumDelivered != 1 {
		t.Fatalf("A's first delivery: %s, want m1's first", deposedDescribe(c.first))
	}
	if l := deposedLeaderVia(c.a); l != lName {
		t.Fatalf("the consumer's leader moved from %s to %q before the partition", lName, l)
	}
	return c
}

// deposedReceiver passes a receiver's deliveries to ch, and answers the
// flow control requests and drops the heartbeats of a consumer with flow
// control.
func deposedReceiver(ch chan<- *nats.Msg) nats.MsgHandler {
	return func(m *nats.Msg) {
		if m.Header.Get("Status") != "" {
			if m.Reply != "" {
				_ = m.Respond(nil)
			}
			return
		}
		ch <- m
	}
}

// deposedLeaderVia is the leader the consumer's info names, asked through
// nc ("" without an answer): the server that takes itself for the
// consumer's leader, among those nc's server reaches, answers.
func deposedLeaderVia(nc *nats.Conn) string {
	m, err := nc.Request("$JS.API.CONSUMER.INFO."+deposedStream+"."+deposedConsumer, nil, 500*time.Millisecond)
	if err != nil {
		return ""
	}
	var resp struct {
		jetstream.ConsumerInfo
		Error *jetstream.APIError `json:"error"`
	}
	if json.Unmarshal(m.Data, &resp) != nil || resp.Error != nil || resp.Cluster == nil {
		return ""
	}
	return resp.Cluster.Leader
}

func deposedNode(i int) string { return "c" + strconv.Itoa(i) }

func deposedDescribe(m *nats.Msg) string {
	md, err := m.Metadata()
	if err != nil {
		return fmt.Sprintf("%q (%v)", m.Data, err)
	}
	return fmt.Sprintf("%s (stream seq %d, consumer seq %d, delivery %d)", m.Data, md.Sequence.Stream, md.Sequence.Consumer, md.NumDelivered)
}

// TestRawJetStreamDeposedLeaderDoesNotDeliver: a key consumer's leader
// cut off from its peers does not deliver the key's next message, though
// it takes the ack of the one before and still answers as the leader
// while the majority's new leader does too. nats-server (2.15.2) sends a
// delivery of a replicated consumer with acks and no flow control only
// once its "delivered" entry is committed (consumer.go
// replicateDeliveries, jetstream_cluster.go's apply of updateDeliveredOp),
// which a leader without its quorum cannot do. The majority's leader
// delivers m1 again, then m2 and m3; after the heal L steps down, and
// nothing it queued reaches A. docs/RELIABILITY.md.
func TestRawJetStreamDeposedLeaderDoesNotDeliver(t *testing.T) {
	c := startDeposedCase(t, false)
	lName := deposedNode(c.leader)
	aFirst, _ := c.first.Metadata()
	c.cl.partition(c.leader, true)
	cut := time.Now()
	// L takes the ack, but an ack is answered only once committed.
	if err := c.first.AckSync(nats.AckWait(2 * time.Second)); !errors.Is(err, nats.ErrTimeout) {
		t.Fatalf("A's ack of m1 to the cut-off leader %s: %v, want no answer (a timeout)", lName, err)
	}
	// B, on the majority's side, subscribes there: L never learns of it.
	b := rawConnect(t, []string{c.cl.clientURLs[(c.leader+1)%3]}, nats.IgnoreDiscoveredServers())
	toB := make(chan *nats.Msg, 16)
	if _, err := b.QueueSubscribe(deposedDeliver, "g", deposedReceiver(toB)); err != nil {
		t.Fatal(err)
	}
	staleToA := func(when string) {
		select {
		case m := <-c.toA:
			t.Fatalf("A got %s from %s %s", deposedDescribe(m), lName, when)
		default:
		}
	}

	// Until the two leaders have answered at once and B has acked m3.
	// The two leaders last from the majority's election (4 to 9 s after
	// its last heartbeat from L, nats-server's election timeout) to L's
	// own step-down (10 s without an answer from a peer, its
	// lostQuorumInterval); 25 s is past both.
	var (
		majority      string   // the majority's leader, named through B while L named itself through A
		bSeqs         []uint64 // the consumer sequences of B's deliveries
		last, acked   uint64   // the highest stream sequence B got, and that B's ack of was answered
		infoA, infoB  string
		partitionEnds = time.Now().Add(25 * time.Second)
	)
	for majority == "" || acked < 3 {
		if time.Now().After(partitionEnds) {
			t.Fatalf("after 25 s of partition: the two leaders answering at once seen: %q (the last answers through A %q, through B %q); B has acked up to m%d",
				majority, infoA, infoB, acked)
		}
		staleToA("during the partition")
		select {
		case m := <-toB:
			md, err := m.Metadata()
			if err != nil {
				t.Fatalf("B's delivery %q: %v", m.Data, err)
			}
			s := md.Sequence.Stream
			switch {
			case s <= acked:
				t.Fatalf("B got %s again after its ack was answered", deposedDescribe(m))
			case s > last+1:
				t.Fatalf("B got %s before m%d", deposedDescribe(m), last+1)
			case s == 1 && md.NumDelivered < 2:
				t.Fatalf("B got %s: A's delivery of m1 was not counted", deposedDescribe(m))
			}
			last = s
			bSeqs = append(bSeqs, md.Sequence.Consumer)
			t.Logf("B got %s, %v after the cut", deposedDescribe(m), time.Since(cut).Round(time.Millisecond))
			if err := m.AckSync(nats.AckWait(2 * time.Second)); err != nil {
				t.Logf("B's ack of %s: %v; it comes again after its ack wait", m.Data, err)
			} else {
				acked = s
			}
		case <-time.After(100 * time.Millisecond): // the poll's period
		}
		if majority == "" {
			infoA, infoB = deposedLeaderVia(c.a), deposedLeaderVia(b)
			if infoA == lName && infoB != "" && infoB != lName {
				majority = infoB
				t.Logf("two leaders answer, %v after the cut: %s through A, %s through B", time.Since(cut).Round(time.Millisecond), infoA, infoB)
			}
		}
	}

	c.cl.partition(c.leader, false)
	healed := time.Now()
	t.Logf("healed %v after the cut", healed.Sub(cut).Round(time.Millisecond))
	testutil.Eventually(t, 30*time.Second, func() bool {
		staleToA("after the heal")
		infoA, infoB = deposedLeaderVia(c.a), deposedLeaderVia(b)
		return infoA != "" && infoA != lName && infoA == infoB
	}, "after the heal, the consumer's info names %q through A and %q through B, want one leader other than %s",
		func() string { return infoA }, func() string { return infoB }, lName)
	t.Logf("%v after the heal, %s leads, through A and B alike", time.Since(healed).Round(time.Millisecond), infoA)
	// What L had queued would go out when it applies the new leader's
	// "delivered" entry for the same message (at the heal, before its
	// step-down) or on its redelivery timer: 3 s, one ack wait, after the
	// step-down covers both.
	select {
	case m := <-c.toA:
		t.Fatalf("A got %s from %s after the heal", deposedDescribe(m), lName)
	case <-time.After(3 * time.Second):
	}
	prev := aFirst.Sequence.Consumer
	for _, seq := range bSeqs {
		if seq <= prev {
			t.Fatalf("consumer sequences: A's m1 %d, then B's %v: not increasing", aFirst.Sequence.Consumer, bSeqs)
		}
		prev = seq
	}
}

// TestRawJetStreamDeposedLeaderNegativeControl: the same scene with a
// consumer with flow control, whose deliveries nats-server sends without
// waiting for their commit (replicateDeliveries is false with flow
// control). L, cut off, must take A's ack of m1 and send m2 to A, while
// the majority's new leader delivers m1 again to B: the key delivered by
// two leaders at once, which the test above would catch.
func TestRawJetStreamDeposedLeaderNegativeControl(t *testing.T) {
	c := startDeposedCase(t, true)
	lName := deposedNode(c.leader)
	c.cl.partition(c.leader, true)
	defer c.cl.partition(c.leader, false)
	if err := c.first.Ack(); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-c.toA:
		if md, err := m.Metadata(); err != nil || md.Sequence.Stream != 2 {
			t.Fatalf("A got %s from the cut-off leader %s, want m2", deposedDescribe(m), lName)
		}
		t.Logf("A got %s from the cut-off leader %s", deposedDescribe(m), lName)
	case <-time.After(10 * time.Second):
		t.Fatalf("the cut-off leader %s of a consumer with flow control sent A no m2 after A's ack of m1", lName)
	}
	b := rawConnect(t, []string{c.cl.clientURLs[(c.leader+1)%3]}, nats.IgnoreDiscoveredServers())
	toB := make(chan *nats.Msg, 16)
	if _, err := b.QueueSubscribe(deposedDeliver, "g", deposedReceiver(toB)); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-toB:
		if md, err := m.Metadata(); err != nil || md.Sequence.Stream != 1 || md.NumDelivered < 2 {
			t.Fatalf("B got %s from the majority's leader, want m1 again", deposedDescribe(m))
		}
		t.Logf("B got %s from the majority's leader %s, while A has m2", deposedDescribe(m), deposedLeaderVia(b))
	case <-time.After(25 * time.Second):
		t.Fatal("the majority's side delivered nothing to B within 25 s of the partition")
	}
}

// The catch-up scene: a stream, a key consumer per key, and node X killed
// while the keys' messages are stored, then started again.
const (
	catchupStream  = "CATCHUP"
	catchupKeys    = 20
	catchupFillers = 60000 // small messages stored before the keys: most of what X catches up
	catchupBulk    = 120   // 100 KB messages stored after the keys: past the stream leader's 8 MB compaction threshold
	catchupWait    = 10 * time.Second
)

// catchupCase is the scene of the catch-up tests: the key consumers'
// leaders moved onto node X, restarted, while its replica of the stream
// catches up (messages X missed, the keys' among them), with a queue
// subscription bound to every key consumer from then on.
type catchupCase struct {
	cl        *chaosCluster
	nc        *nats.Conn // an admin connection, to any node
	js        jetstream.JetStream
	x         int // the lagging node
	xName     string
	delivered chan catchupDelivery
	caughtUp  time.Time // when X's log said its catch-up was complete
}

type catchupDelivery struct {
	key  int
	data string
	at   time.Time
}

// catchupCompleteLine is what X logs when its catch-up is over
// (jetstream_cluster.go processSnapshot).
const catchupCompleteLine = "Catchup for stream '$G > " + catchupStream + "' complete"

// startCatchupCase sets the scene with consumers of idle heartbeat hb (0:
// none) and returns once X's catch-up is over.
func startCatchupCase(t *testing.T, hb time.Duration) *catchupCase {
	if itest.Delivery == adapter.DeliveryPerKey {
		t.Skip("raw JetStream, the same in every delivery mode: it runs in the default pass")
	}
	// One catch-up message in flight at a time (the stream leader's
	// outbound catch-up budget, a byte): the catch-up takes seconds, long
	// enough to move the consumers' leaders onto X during it.
	c := &catchupCase{cl: newChaosCluster(t, "max_outstanding_catchup: 1"), delivered: make(chan catchupDelivery, 4*catchupKeys)}
	c.nc = rawConnect(t, c.cl.clientURLs)
	var err error
	if c.js, err = jetstream.New(c.nc); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stream jetstream.Stream
	testutil.Eventually(t, time.Minute, func() bool {
		stream, err = c.js.CreateStream(ctx, jetstream.StreamConfig{Name: catchupStream, Subjects: []string{"catchup.>"}, Replicas: 3, Storage: jetstream.FileStorage})
		return err == nil
	}, "create stream: %v", func() error { return err })
	for k := range catchupKeys {
		testutil.Eventually(t, time.Minute, func() bool {
			_, err = c.js.CreateOrUpdatePushConsumer(ctx, catchupStream, jetstream.ConsumerConfig{Durable: catchupConsumer(k),
				DeliverSubject: catchupDeliver(k), DeliverGroup: "g", DeliverPolicy: jetstream.DeliverAllPolicy,
				AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxDeliver: -1,
				FilterSubject: catchupSubject(k), MaxAckPending: 1, IdleHeartbeat: hb})
			return err == nil
		}, "create consumer %d: %v", k, func() error { return err })
	}
	s := -1
	testutil.Eventually(t, time.Minute, func() bool {
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if info, err := stream.Info(ictx); err == nil && info.Cluster != nil && strings.HasPrefix(info.Cluster.Leader, "c") {
			s, _ = strconv.Atoi(info.Cluster.Leader[1:])
		}
		return s >= 0
	}, "the stream has no leader")
	c.x = (s + 1) % 3
	c.xName = deposedNode(c.x)

	// X down, the messages stored without it: the fillers, one message per
	// key, and the bulk, whose size makes the stream's leader snapshot its
	// log after the keys' messages: X, back, gets the snapshot and catches
	// up on all of them from the leader's store (processCatchupMsg), none
	// through its log.
	c.cl.nodes[c.x].Kill()
	pub := rawConnect(t, []string{c.cl.clientURLs[s], c.cl.clientURLs[(s+2)%3]}, nats.IgnoreDiscoveredServers())
	pjs, err := jetstream.New(pub, jetstream.WithPublishAsyncMaxPending(1000))
	if err != nil {
		t.Fatal(err)
	}
	var acks []jetstream.PubAckFuture
	publishAsync := func(subject string, data []byte) {
		f, err := pjs.PublishAsync(subject, data)
		if err != nil {
			t.Fatalf("publish to %s: %v", subject, err)
		}
		acks = append(acks, f)
	}
	published := time.Now()
	for i := range catchupFillers {
		publishAsync("catchup.filler", fmt.Appendf(nil, "filler %d", i))
	}
	for k := range catchupKeys {
		publishAsync(catchupSubject(k), fmt.Appendf(nil, "k%d 1", k))
	}
	bulk := make([]byte, 100<<10) // random: the stream's log compresses what it can
	for range catchupBulk {
		_, _ = crand.Read(bulk)
		publishAsync("catchup.bulk", bulk)
	}
	select {
	case <-pjs.PublishAsyncComplete():
	case <-time.After(time.Minute):
		t.Fatalf("%d of %d publishes unacknowledged after a minute", pjs.PublishAsyncPending(), len(acks))
	}
	for _, f := range acks {
		select {
		case err := <-f.Err():
			t.Fatalf("publish to %s: %v", f.Msg().Subject, err)
		default:
		}
	}
	t.Logf("%d messages stored with %s down, in %v", len(acks), c.xName, time.Since(published).Round(time.Millisecond))

	// X back: every key consumer's leader is moved onto it as soon as its
	// leader has heard from X since the restart.
	restarted := time.Now()
	c.cl.start(c.x)
	moved, asked := make([]bool, catchupKeys), make([]time.Time, catchupKeys)
	testutil.Eventually(t, 30*time.Second, func() bool {
		done := true
		for k := range catchupKeys {
			if moved[k] {
				continue
			}
			info := c.info(k)
			if info != nil && info.Cluster != nil && info.Cluster.Leader == c.xName {
				moved[k] = true
				continue
			}
			done = false
			if info == nil || info.Cluster == nil || time.Since(asked[k]) < 500*time.Millisecond {
				continue
			}
			for _, p := range info.Cluster.Replicas {
				if p.Name == c.xName && !p.Offline && p.Active < time.Since(restarted) {
					_, _ = c.nc.Request("$JS.API.CONSUMER.LEADER.STEPDOWN."+catchupStream+"."+catchupConsumer(k),
						[]byte(`{"placement":{"preferred":"`+c.xName+`"}}`), time.Second)
					asked[k] = time.Now()
				}
			}
		}
		return done
	}, "the key consumers' leaders not all moved onto %s: %v", c.xName, func() []bool { return moved })
	t.Logf("every key consumer's leader on %s, %v after its restart", c.xName, time.Since(restarted).Round(time.Millisecond))

	// The receivers, on the stream leader's node.
	rc := rawConnect(t, []string{c.cl.clientURLs[s]}, nats.IgnoreDiscoveredServers())
	for k := range catchupKeys {
		if _, err := rc.QueueSubscribe(catchupDeliver(k), "g", func(m *nats.Msg) {
			if m.Header.Get("Status") != "" { // an idle heartbeat
				return
			}
			c.delivered <- catchupDelivery{key: k, data: string(m.Data), at: time.Now()}
			_ = m.Ack()
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := rc.Flush(); err != nil {
		t.Fatal(err)
	}
	bound := make([]bool, catchupKeys)
	testutil.Eventually(t, 10*time.Second, func() bool {
		done := true
		for k := range catchupKeys {
			if !bound[k] {
				info := c.info(k)
				bound[k] = info != nil && info.PushBound && info.Cluster != nil && info.Cluster.Leader == c.xName
				done = done && bound[k]
			}
		}
		return done
	}, "the key consumers, led by %s, not all bound: %v", c.xName, func() []bool { return bound })
	if strings.Contains(c.cl.nodes[c.x].Log(), catchupCompleteLine) {
		t.Fatalf("%s's catch-up was over before every key consumer led by it was bound (%v after its restart): no scene; more fillers?",
			c.xName, time.Since(restarted).Round(time.Millisecond))
	}
	t.Logf("every key consumer bound on %s, %v after its restart, its catch-up still running", c.xName, time.Since(restarted).Round(time.Millisecond))

	testutil.Eventually(t, time.Minute, func() bool { return strings.Contains(c.cl.nodes[c.x].Log(), catchupCompleteLine) },
		"%s logged no end of a catch-up of the stream (did the stream's leader not snapshot its log after the keys' messages?)", c.xName)
	c.caughtUp = time.Now()
	line := c.cl.nodes[c.x].Log()
	line = line[strings.Index(line, catchupCompleteLine):]
	t.Logf("%v after its restart, %s logs: %s", c.caughtUp.Sub(restarted).Round(time.Millisecond), c.xName, line[:strings.IndexByte(line, '\n')])
	return c
}

// info is key consumer k's info, from its leader (nil without an answer).
func (c *catchupCase) info(k int) *jetstream.ConsumerInfo {
	m, err := c.nc.Request("$JS.API.CONSUMER.INFO."+catchupStream+"."+catchupConsumer(k), nil, 500*time.Millisecond)
	if err != nil {
		return nil
	}
	var resp struct {
		jetstream.ConsumerInfo
		Error *jetstream.APIError `json:"error"`
	}
	if json.Unmarshal(m.Data, &resp) != nil || resp.Error != nil {
		return nil
	}
	return &resp.ConsumerInfo
}

func catchupConsumer(k int) string { return "key" + strconv.Itoa(k) }
func catchupSubject(k int) string  { return "catchup.k" + strconv.Itoa(k) }
func catchupDeliver(k int) string  { return "catchupdeliver." + strconv.Itoa(k) }

// TestRawJetStreamCaughtUpMessageNotDelivered: a key consumer (push, R3,
// AckExplicit, MaxAckPending 1, a deliver group) whose leader is on a
// node still catching up its replica of the stream does not deliver a
// message the catch-up stores: nats-server (2.15.2) stores caught-up
// messages without signalling the consumers (jetstream_cluster.go
// processCatchupMsg, StoreRawMsg; processJetStreamMsg, stream.go, pushes
// the signal to sigq), and the consumer's loop (consumer.go
// loopAndGatherMsgs), which found nothing to deliver when it started or
// when its subscription came, waits for a signal; the catch-up's end
// (processSnapshot) updates num_pending and signals nothing either. The
// message stays undelivered (num_pending 1, num_ack_pending 0,
// push_bound) until the key's next message is stored, through the
// stream's log, and signals. The scene (startCatchupCase) moves 20 key
// consumers' leaders onto the node during a catch-up slowed to one
// message in flight (max_outstanding_catchup).
func TestRawJetStreamCaughtUpMessageNotDelivered(t *testing.T) {
	c := startCatchupCase(t, 0)
	got := make([][]string, catchupKeys)
	deadline := time.After(catchupWait)
	for waiting := true; waiting; {
		select {
		case d := <-c.delivered:
			got[d.key] = append(got[d.key], d.data)
			t.Logf("k%d: %q delivered %v after the catch-up", d.key, d.data, d.at.Sub(c.caughtUp).Round(time.Millisecond))
		case <-deadline:
			waiting = false
		}
	}
	var stuck []int
	for k := range catchupKeys {
		if len(got[k]) > 0 {
			continue
		}
		info := c.info(k)
		if info == nil || info.Cluster == nil {
			t.Errorf("k%d: no delivery in %v, and no consumer info", k, catchupWait)
			continue
		}
		if info.Cluster.Leader != c.xName || info.NumPending < 1 || info.NumAckPending != 0 || !info.PushBound {
			t.Errorf("k%d: no delivery in %v; leader %s, num_pending %d, num_ack_pending %d, push_bound %v", k, catchupWait,
				info.Cluster.Leader, info.NumPending, info.NumAckPending, info.PushBound)
			continue
		}
		stuck = append(stuck, k)
	}
	t.Logf("%d of %d key consumers led by %s have not delivered their key's message %v after %s caught up (num_pending 1, num_ack_pending 0, push_bound); %d did",
		len(stuck), catchupKeys, c.xName, catchupWait, c.xName, catchupKeys-len(stuck))
	if len(stuck) == 0 {
		t.Fatalf("every key consumer delivered its key's caught-up message within %v", catchupWait)
	}

	// The key's next message, stored through the stream's log, wakes the
	// consumer: the first message, then the second.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	published := time.Now()
	for _, k := range stuck {
		if _, err := c.js.Publish(ctx, catchupSubject(k), fmt.Appendf(nil, "k%d 2", k)); err != nil {
			t.Fatal(err)
		}
	}
	deadline = time.After(10 * time.Second)
	for waiting := true; waiting; {
		select {
		case d := <-c.delivered:
			got[d.key] = append(got[d.key], d.data)
		case <-deadline:
			waiting = false
		}
		waiting = waiting && slices.ContainsFunc(stuck, func(k int) bool { return len(got[k]) < 2 })
	}
	for _, k := range stuck {
		if want := []string{fmt.Sprintf("k%d 1", k), fmt.Sprintf("k%d 2", k)}; !slices.Equal(got[k], want) {
			t.Errorf("k%d: after its next message, delivered %q, want %q", k, got[k], want)
		}
	}
	t.Logf("the stuck keys' next messages published: both messages delivered within %v", time.Since(published).Round(time.Millisecond))
}

// TestRawJetStreamCaughtUpMessageHeartbeatControl: the same scene with
// key consumers with a 2 s idle heartbeat: the heartbeat's timer wakes the
// consumer's loop (loopAndGatherMsgs, case <-hbc), which looks for a
// message again and delivers the caught-up one within a heartbeat.
func TestRawJetStreamCaughtUpMessageHeartbeatControl(t *testing.T) {
	const hb = 2 * time.Second
	c := startCatchupCase(t, hb)
	got := make([]string, catchupKeys)
	var delays []time.Duration
	deadline := time.After(hb + 3*time.Second)
	for n := 0; n < catchupKeys; {
		select {
		case d := <-c.delivered:
			if got[d.key] != "" {
				t.Fatalf("k%d: %q delivered after %q", d.key, d.data, got[d.key])
			}
			got[d.key] = d.data
			delays = append(delays, d.at.Sub(c.caughtUp))
			n++
		case <-deadline:
			t.Fatalf("%v after %s caught up, with a %v idle heartbeat, only %d of %d keys' messages delivered: %q", hb+3*time.Second, c.xName, hb, n, catchupKeys, got)
		}
	}
	slices.Sort(delays)
	t.Logf("every key's message delivered, from %v to %v after %s caught up", delays[0].Round(time.Millisecond), delays[len(delays)-1].Round(time.Millisecond), c.xName)
}
