package powercut_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/jetorder/jetorder/didcomm"
	"github.com/jetorder/jetorder/internal/broker"
	"github.com/jetorder/jetorder/internal/embedded"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/powercut"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
)

// Power cuts: the sidecar binary keeps its store on a powercut mount, which
// passes writes through but drops every write never fsynced when it "cuts
// the power". Each round: start the sidecar on what is left, check that
// every topic and subscription it acknowledged is still there, create one
// more topic, publish ordered messages through Google's Go client under
// load, and at a random moment SIGKILL the sidecar and cut. At the end one
// subscriber receives everything: no acknowledged publish may be missing,
// and per key the first deliveries must be in publish order. Every fourth
// key's messages ask the sidecar to stamp a DIDComm sender_order: no order
// may be skipped (from 1 to the highest delivered) or given to two
// messages.
//
// With the default sync policy nothing acknowledged may be lost. The
// negative control runs the same harness with --sync lazy and must lose
// acknowledged messages: otherwise the harness proves nothing.
//
// JETORDER_POWERCUT_CUTS sets the number of cuts (default 3; the long run
// in docs/EVIDENCE.md, "Power cuts: 20 cuts", uses 20).
func TestPowerCutDefaultLosesNothing(t *testing.T) {
	cuts := 3
	if n, err := strconv.Atoi(os.Getenv("JETORDER_POWERCUT_CUTS")); err == nil && n > 0 {
		cuts = n
	}
	powerCutWantNoLoss(t, "the default sync policy", powerCutRun(t, newPowerCutNode(t, ""), cuts))
}

// powerCutWantNoLoss fails the test unless the run lost nothing it
// acknowledged, kept order and every resource, and had something to lose.
func powerCutWantNoLoss(t *testing.T, what string, r powerCutResult) {
	t.Helper()
	t.Logf("%s: %s", what, r)
	if r.lost > 0 || len(r.missingResources) > 0 || len(r.violations) > 0 {
		t.Fatalf("%s: %d acknowledged messages lost (first: %s), resources missing: %v, order violations: %v",
			what, r.lost, r.firstLost, r.missingResources, r.violations)
	}
	if r.acked == 0 || r.rolledBack.Bytes == 0 {
		t.Fatalf("the run proves nothing: %d messages acknowledged, %d bytes rolled back", r.acked, r.rolledBack.Bytes)
	}
}

// The negative control's first round runs with --sync always, so that the
// topic, the subscription and the first messages are durable; the second
// runs with --sync lazy. After its cut, messages must be missing from a
// subscription that survived: loss of messages, not only of resources.
func TestPowerCutLazyLosesMessages(t *testing.T) {
	n := newPowerCutNode(t, embedded.SyncLazy)
	n.first = embedded.SyncAlways
	r := powerCutRun(t, n, 2)
	t.Logf("negative control, --sync lazy after a first round with --sync always: %s", r)
	if r.lost == 0 || r.delivered == 0 {
		t.Fatalf("--sync lazy did not lose messages from a subscription that survived the cut (lost %d, delivered %d): the harness does not drop unsynced writes", r.lost, r.delivered)
	}
}

// powerCutWindow is how many messages each key has in flight.
const powerCutWindow = 10

// powerCutReplayed is what the sidecar logs when it replays a stamping
// write-ahead record (internal/broker/stampwal.go).
const powerCutReplayed = "published again from their write-ahead record"

// powerCutStamped reports whether a key's messages ask the sidecar for a
// DIDComm sender_order: every fourth key, each its own sender and thread.
func powerCutStamped(key string) bool {
	n, _ := strconv.Atoi(strings.TrimPrefix(key, "device-"))
	return n%4 == 0
}

// powerCutAttrs are the attributes of message i of key: DIDComm headers
// and the stamping request for a stamped key.
func powerCutAttrs(key string, i int) map[string]string {
	if !powerCutStamped(key) {
		return nil
	}
	return map[string]string{
		broker.AttrDIDComm: broker.DIDCommStamp,
		didcomm.AttrID:     fmt.Sprintf("%s-%d", key, i),
		didcomm.AttrThread: "thread-" + key,
		didcomm.AttrFrom:   "did:example:" + key,
	}
}

type powerCutResult struct {
	cuts, acked, lost, delivered int
	stamped                      int // distinct DIDComm sender_orders delivered
	replays                      int // stamping write-ahead records the sidecar replayed
	receivedBetweenCuts          int // distinct messages received while publishing
	firstLost                    string
	missingResources             []string
	violations                   []string
	rolledBack                   powercut.Stats
}

func (r powerCutResult) String() string {
	return fmt.Sprintf("%d cuts, %d publishes acknowledged, %d lost, %d delivered after the last cut (%d received between cuts, %d DIDComm sender_orders, %d stamping records replayed); rolled back %d bytes in %d files; resources missing: %d",
		r.cuts, r.acked, r.lost, r.delivered, r.receivedBetweenCuts, r.stamped, r.replays, r.rolledBack.Bytes, r.rolledBack.Files, len(r.missingResources))
}

// powerCutSite is what loses power: the sidecar and the servers and mounts
// that hold its store.
type powerCutSite interface {
	// start starts whatever is down on what the last cut left, and returns
	// the sidecar.
	start(t *testing.T) *itest.Sidecar
	// kill SIGKILLs every process; cut then rolls every mount back.
	kill()
	cut(t *testing.T) powercut.Stats
}

// powerCutNode is the sidecar with its embedded server, its store on one
// powercut mount.
type powerCutNode struct {
	bin   string
	cfg   sidecar.Config
	first embedded.SyncPolicy // of the first start only, instead of cfg's
	fs    *powercut.FS
	p     *itest.Sidecar
}

func newPowerCutNode(t *testing.T, policy embedded.SyncPolicy) *powerCutNode {
	needFUSE(t)
	n := &powerCutNode{bin: itest.BuildSidecar(t), cfg: sidecar.Config{Sync: policy}}
	var mnt string
	n.fs, mnt = powerCutMount(t)
	n.cfg.DataDir = filepath.Join(mnt, "data")
	if err := os.Mkdir(n.cfg.DataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	return n
}

func (n *powerCutNode) start(t *testing.T) *itest.Sidecar {
	cfg := n.cfg
	if n.p == nil && n.first != "" {
		cfg.Sync = n.first
	}
	// On new ports each round: every round makes its own client, and a
	// port given up at the cut may be taken by then by another process.
	n.p = itest.Start(t, cfg, itest.Binary(n.bin))
	return n.p
}

func (n *powerCutNode) kill() { n.p.Kill() }

func (n *powerCutNode) cut(t *testing.T) powercut.Stats {
	st, err := n.fs.Cut()
	if err != nil {
		t.Fatalf("cut: %v", err)
	}
	return st
}

func needFUSE(t *testing.T) {
	t.Helper()
	if err := powercut.Available(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("power-cut tests need FUSE as root: %v", err)
		}
		t.Skipf("power-cut tests need FUSE as root: %v", err)
	}
}

// powerCutExists asks get until it answers: NotFound, or any error after
// 60 s (a cluster elects its leaders after a restart), means the resource
// is gone.
func powerCutExists(get func(context.Context) error) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := get(ctx)
		cancel()
		if err == nil || status.Code(err) == codes.NotFound || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond) // polling until the servers answer
	}
}

// powerCutMount mounts a powercut file system over a temp dir; it is
// unmounted when the test ends, after the processes using it are killed
// (their clean-ups are registered later, so they run first).
func powerCutMount(t *testing.T) (*powercut.FS, string) {
	t.Helper()
	backing, mnt := t.TempDir(), t.TempDir()
	fs, err := powercut.Mount(backing, mnt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fs.Close() })
	return fs, mnt
}

func powerCutRun(t *testing.T, site powerCutSite, cuts int) powerCutResult {
	// sub is received between the cuts; audit only after the last, so
	// that loss is judged on everything the store still holds.
	const sub, audit = "cut-sub", "cut-audit"
	keys := make([]string, 32)
	for i := range keys {
		keys[i] = "device-" + strconv.Itoa(i)
	}
	next := make(map[string]int)     // per key, the next index to publish
	acked := make(map[string][]bool) // per key and index: acknowledged
	var res powerCutResult
	stampedAcked := 0                // of stamped keys' messages
	var topics []string              // acknowledged as created
	var seen map[string]map[int]bool // what the last receive got: key -> index
	order := newPowerCutOrder()      // every delivery of the run
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
	began := time.Now()

	for round := 0; round <= cuts; round++ {
		p := site.start(t)
		c := p.GoClient()
		ctx := context.Background()
		subMissing := false
		for _, id := range topics {
			if err := powerCutExists(func(ctx context.Context) error {
				_, err := c.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: itest.TopicPath(id)})
				return err
			}); err != nil {
				res.missingResources = append(res.missingResources, fmt.Sprintf("topic %s after cut %d: %v", id, round, err))
			}
		}
		auditMissing := false
		for _, id := range []string{sub, audit} {
			if round == 0 {
				break
			}
			if err := powerCutExists(func(ctx context.Context) error {
				_, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: itest.SubPath(id)})
				return err
			}); err != nil {
				subMissing = subMissing || id == sub
				auditMissing = auditMissing || id == audit
				res.missingResources = append(res.missingResources, fmt.Sprintf("subscription %s after cut %d: %v", id, round, err))
			}
		}
		if round == cuts {
			// Last start: receive everything.
			order.mu.Lock()
			for _, idx := range order.first {
				res.receivedBetweenCuts += len(idx)
			}
			order.mu.Unlock()
			if !auditMissing {
				auditOrder := newPowerCutOrder()
				seen, res.delivered = powerCutReceive(t, c, audit, keys, acked, auditOrder)
				order.violations = append(order.violations, auditOrder.violations...)
				res.replays += strings.Count(p.Log(), powerCutReplayed)
				t.Logf("received at %v", time.Since(began).Round(time.Millisecond))
			}
			break
		}
		topic := "cut-topic-" + strconv.Itoa(round)
		if _, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: itest.TopicPath(topic)}); err != nil && status.Code(err) != codes.AlreadyExists {
			t.Fatalf("create topic %s: %v", topic, err)
		}
		topics = append(topics, topic)
		if round == 0 {
			for _, id := range []string{sub, audit} {
				itest.MustCreateSub(t, c, &pb.Subscription{Name: itest.SubPath(id), Topic: itest.TopicPath(topics[0]), EnableMessageOrdering: true, AckDeadlineSeconds: 10})
			}
		}
		// Receive while publishing, through the cut: acks a cut rolls back
		// bring messages again, and order must hold across it. (Errors of
		// a Receive whose sidecar was killed are expected.)
		var receiving chan struct{}
		rctx, stopReceiving := context.WithCancel(ctx)
		if !subMissing {
			receiving = make(chan struct{})
			go func() {
				defer close(receiving)
				_ = c.Subscriber(sub).Receive(rctx, order.handle)
			}()
		}

		// Publish under load until the cut: each key's messages in order,
		// a result awaited as it comes.
		pub := c.Publisher(topics[0])
		pub.EnableMessageOrdering = true
		var mu sync.Mutex
		var pubErrs []string // publishes that failed before the cut
		// Cancelled at the cut: a result still pending then is not
		// acknowledged (the client would retry it for a minute).
		pctx, cut := context.WithCancel(ctx)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for _, key := range keys {
			wg.Add(1)
			go func() {
				defer wg.Done()
			window:
				for {
					select {
					case <-stop:
						return
					default:
					}
					// A window of messages in flight per key, awaited
					// in order: the cut finds writes not yet synced.
					mu.Lock()
					from := next[key]
					next[key] += powerCutWindow
					for range powerCutWindow {
						acked[key] = append(acked[key], false)
					}
					mu.Unlock()
					results := make([]*pubsub.PublishResult, powerCutWindow)
					for j := range results {
						results[j] = pub.Publish(pctx, &pubsub.Message{Data: ordercheck.Encode(key, from+j), OrderingKey: key, Attributes: powerCutAttrs(key, from+j)})
					}
					for j, r := range results {
						if _, err := r.Get(pctx); err != nil {
							if pctx.Err() != nil {
								return // the cut: this key publishes no more this round
							}
							// Not the cut: as an application does, publish
							// on (the client paused the key). A stamped
							// key's first requests after a cut wait for
							// the sidecar to replay its write-ahead
							// records, which can outlast the client's
							// publish timeout. Reported if the round does
							// not get going.
							mu.Lock()
							pubErrs = append(pubErrs, fmt.Sprintf("%s #%d: %v", key, from+j, err))
							mu.Unlock()
							pub.ResumePublish(key)
							continue window
						}
						mu.Lock()
						acked[key][from+j] = true
						res.acked++
						if powerCutStamped(key) {
							stampedAcked++
						}
						mu.Unlock()
					}
				}
			}()
		}
		// Stamped keys go slower (several KV writes per request; seconds
		// at first on a cluster syncing every write): each round waits for
		// some of theirs too, so that cuts find stamping under way. A
		// cluster cut as a whole elects the leaders of every stream and
		// bucket again from rolled-back logs, and the sidecar replays the
		// stamping write-ahead records left by the cut, a thread at a
		// time (seconds each on a loaded machine) before that thread's
		// next stamped publish: the wait is three minutes, and its
		// failure says what it saw.
		before, stampedBefore := func() (int, int) { mu.Lock(); defer mu.Unlock(); return res.acked, stampedAcked }()
		testutil.Eventually(t, 3*time.Minute, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return res.acked >= before+600 && stampedAcked >= stampedBefore+20
		}, "publishing did not get going: %v publishes acknowledged this round (want 600), %v of stamped keys (want 20); publishes failed before the cut: %v; the sidecar's log:\n%v",
			func() int { mu.Lock(); defer mu.Unlock(); return res.acked - before },
			func() int { mu.Lock(); defer mu.Unlock(); return stampedAcked - stampedBefore },
			func() []string { mu.Lock(); defer mu.Unlock(); return pubErrs[:min(len(pubErrs), 5)] },
			func() string { return itest.LastLines(p.Log(), 60) })
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond) // a random moment to cut, not synchronisation
		site.kill()
		res.replays += strings.Count(p.Log(), powerCutReplayed)
		stopReceiving()
		close(stop)
		cut()
		wg.Wait()
		_ = c.Close()         // ends the client's retries: nothing crosses the cut
		if receiving != nil { // the client's Receive waits for its acks until the client closes
			select {
			case <-receiving:
			case <-time.After(30 * time.Second):
				t.Fatal("Receive did not end within 30s of the cut")
			}
		}
		st := site.cut(t)
		res.cuts++
		res.rolledBack.Files += st.Files
		res.rolledBack.Bytes += st.Bytes
		t.Logf("cut %d at %v: %d publishes acknowledged so far; rolled back %d bytes in %d files", round+1, time.Since(began).Round(time.Millisecond), res.acked, st.Bytes, st.Files)
	}

	for _, key := range keys {
		for i, ok := range acked[key] {
			if ok && !seen[key][i] {
				res.lost++
				if res.firstLost == "" {
					res.firstLost = fmt.Sprintf("%s #%d", key, i)
				}
			}
		}
	}
	order.mu.Lock()
	res.violations = order.violations
	for _, key := range keys {
		// Every sender_order of a stamped key's sender, from 1 to the
		// highest seen, must have come, each for one message only.
		orders := order.orders[key]
		if !powerCutStamped(key) || len(orders) == 0 {
			continue
		}
		res.stamped += len(orders)
		high := slices.Max(slices.Collect(maps.Keys(orders)))
		for o := uint64(1); o <= high; o++ {
			if len(orders[o]) == 0 {
				res.violations = append(res.violations, fmt.Sprintf("%s: sender_order %d skipped (highest %d)", key, o, high))
			}
			if len(orders[o]) > 1 {
				res.violations = append(res.violations, fmt.Sprintf("%s: sender_order %d given to %d messages: %v", key, o, len(orders[o]), slices.Sorted(maps.Keys(orders[o]))))
			}
		}
	}
	order.mu.Unlock()
	if len(res.violations) > 5 {
		res.violations = append(res.violations[:5], "...")
	}
	return res
}

// powerCutOrder watches every delivery of the run, across cuts: per key,
// no message may be first delivered after a later one (acks rolled back by
// a cut bring messages again, which is allowed), and it records what the
// current receive got.
type powerCutOrder struct {
	mu    sync.Mutex
	first map[string]map[int]bool // delivered at least once in the run
	// orders holds, per stamped key, the DIDComm ids delivered with each
	// sender_order.
	orders     map[string]map[uint64]map[string]bool
	high       map[string]int          // highest index first delivered, per key
	got        map[string]map[int]bool // delivered since the last reset
	last       time.Time               // of the last delivery
	violations []string
}

func newPowerCutOrder() *powerCutOrder {
	return &powerCutOrder{first: map[string]map[int]bool{}, high: map[string]int{}, got: map[string]map[int]bool{}, orders: map[string]map[uint64]map[string]bool{}}
}

func (o *powerCutOrder) handle(_ context.Context, m *pubsub.Message) {
	key, i, err := ordercheck.Decode(m.Data)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.last = time.Now()
	m.Ack()
	if err != nil || key != m.OrderingKey {
		o.violations = append(o.violations, fmt.Sprintf("undecodable delivery %q (key %q): %v", m.Data, m.OrderingKey, err))
		return
	}
	if powerCutStamped(key) {
		order, err := strconv.ParseUint(m.Attributes[didcomm.AttrSenderOrder], 10, 64)
		if err != nil || m.Attributes[didcomm.AttrID] != fmt.Sprintf("%s-%d", key, i) {
			o.violations = append(o.violations, fmt.Sprintf("%s #%d: DIDComm attributes %v: stamped wrongly (%v)", key, i, m.Attributes, err))
			return
		}
		if o.orders[key] == nil {
			o.orders[key] = map[uint64]map[string]bool{}
		}
		if o.orders[key][order] == nil {
			o.orders[key][order] = map[string]bool{}
		}
		o.orders[key][order][m.Attributes[didcomm.AttrID]] = true
	}
	if o.got[key] == nil {
		o.got[key] = map[int]bool{}
	}
	o.got[key][i] = true
	if o.first[key] == nil {
		o.first[key] = map[int]bool{}
		o.high[key] = -1
	}
	if !o.first[key][i] {
		o.first[key][i] = true
		if i < o.high[key] {
			o.violations = append(o.violations, fmt.Sprintf("%s #%d first delivered after #%d", key, i, o.high[key]))
		}
		o.high[key] = max(o.high[key], i)
	}
}

// powerCutReceive receives sub until every acknowledged message came, and
// every stamped key's sender_orders from 1 to the highest, or
// until deliveries stop for 30 s after the first (then what did not come
// is lost), or for 120 s. It returns what came.
func powerCutReceive(t *testing.T, c *pubsub.Client, sub string, keys []string, acked map[string][]bool, o *powerCutOrder) (map[string]map[int]bool, int) {
	stop := itest.ReceiveGo(t, c.Subscriber(sub), o.handle)
	complete := func() bool {
		for _, key := range keys {
			for i, ok := range acked[key] {
				if ok && !o.got[key][i] {
					return false
				}
			}
			// Messages replayed from a stamping write-ahead record come
			// whenever the sidecar's recovery gets to them.
			if len(o.orders[key]) > 0 && uint64(len(o.orders[key])) != slices.Max(slices.Collect(maps.Keys(o.orders[key]))) {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(120 * time.Second)
	for {
		o.mu.Lock()
		// Quiet only once something came, and for long: a cluster just
		// restarted may take a while to elect its consumers' leaders (a
		// CI run saw 10 deliveries, then 10 s of none).
		done, quiet := complete(), len(o.got) > 0 && time.Since(o.last) > 30*time.Second
		o.mu.Unlock()
		if done || quiet || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // polling for completion
	}
	stop()
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, idx := range o.got {
		n += len(idx)
	}
	return o.got, n
}
