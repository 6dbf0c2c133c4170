package cluster_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
	connect := func(urls ...string) *nats.Conn {
		nc, err := nats.Connect(strings.Join(urls, ","), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.ReconnectBufSize(-1), nats.DontRandomize())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	nc := connect(cl.clientURLs...)
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
		rc := connect(cl.clientProxy[i].URL(), cl.clientProxy[(i+1)%3].URL(), cl.clientProxy[(i+2)%3].URL())
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
