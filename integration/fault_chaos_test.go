package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
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
	"google.golang.org/api/option"
	"google.golang.org/grpc"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/embedded"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// TestFaultChaosKills deploys as users do: a NATS server (here the sidecar
// binary with its embedded server and --nats-listen, process A) and a
// sidecar using it (--nats-url, process B), Google's Go client on B with
// two ordered subscriptions. While the subscriptions deliver, the test
// kills B (a sidecar crash) with SIGKILL and restarts it on the same ports
// and data dir, and every other time it kills A instead (a NATS server
// crash; JETORDER_CHAOS_NATS=0 kills only B). Every delivery goes through the ordering
// checker: nothing may be lost and no key may go out of order. It reports,
// per kill, the stall (from the kill to the first delivery after the
// restarted process was ready, and how much of it the sidecar's), and how
// many messages already acked were delivered again.
//
// Sizes: JETORDER_CHAOS_KEYS (default 100), JETORDER_CHAOS_PER_KEY (30)
// and JETORDER_CHAOS_KILLS (10). With JETORDER_CHAOS_LOGDIR=DIR it writes
// what a failure needs to be understood into DIR (chaosDiag).
// docs/RELIABILITY.md, "How long a crash stalls delivery", has the figures
// (docs/EVIDENCE.md the runs).
func TestFaultChaosKills(t *testing.T) { chaosKills(t, false) }

// TestFaultChaosKillsPipelined is TestFaultChaosKills with pipelined
// ordering (partitioned delivery in either suite run): the kills come
// while each key has a window of messages with the client, and every
// delivery is checked against pipelined ordering. Six kills by default.
func TestFaultChaosKillsPipelined(t *testing.T) { chaosKills(t, true) }

func chaosKills(t *testing.T, pipelined bool) {
	keys, perKey := chaosEnv("KEYS", 100), chaosEnv("PER_KEY", 30)
	kills, labels, chk, ordering := chaosEnv("KILLS", 10), map[string]string(nil), ordercheck.New(), "strict"
	if pipelined {
		kills, labels, chk, ordering = chaosEnv("KILLS", 6), pipelinedLabels, ordercheck.NewPipelined(), "pipelined"
	}
	killNATS := os.Getenv("JETORDER_CHAOS_NATS") != "0"
	bin := itest.BuildSidecar(t)
	natsAddr := itest.FreeAddr(t)
	// Process A only hosts NATS; --sync lazy keeps its server as these
	// stall bounds were measured (group commit's 1 s server sync interval
	// coincided with two CI runs over the 8 s bound).
	a := itest.Start(t, sidecar.Config{NATSListen: natsAddr, Sync: embedded.SyncLazy}, itest.Binary(bin))
	diag := newChaosDiag(t, natsAddr)
	b := itest.Start(t, sidecar.Config{NATSURL: "nats://" + natsAddr}, itest.Binary(bin), itest.Flags(diag.sidecarArgs()...))

	opens := &streamOpens{at: map[string]time.Time{}}
	c := b.GoClient(option.WithGRPCDialOption(grpc.WithStreamInterceptor(opens.intercept)))
	subs := []string{"chaos-a", "chaos-b"}
	mustCreateTopic(t, c, "chaos")
	for _, s := range subs {
		mustCreateSub(t, c, &pb.Subscription{Name: subPath(s), Topic: topicPath("chaos"), EnableMessageOrdering: true, AckDeadlineSeconds: 10, Labels: labels})
	}

	pub := c.Publisher("chaos")
	pub.EnableMessageOrdering = true
	var names []string
	for k := range keys {
		names = append(names, fmt.Sprintf("user-%d", k))
	}
	itest.PublishChecked(t, pub, chk, names, 0, perKey)
	pub.Stop()
	chk.AcksMayBeLost()

	type subWatch struct {
		mark       atomic.Int64 // unix nanos: firstAfter is the first delivery after it
		firstAfter atomic.Int64
		mu         sync.Mutex
		acked      map[string]bool
		ackedAgain int // deliveries of a message acked before
	}
	watch := map[string]*subWatch{}
	var stops []func()
	for _, s := range subs {
		w := &subWatch{acked: map[string]bool{}}
		watch[s] = w
		stops = append(stops, receiveGo(t, c.Subscriber(s), func(_ context.Context, m *pubsub.Message) {
			now := time.Now().UnixNano()
			if mark := w.mark.Load(); mark != 0 && now > mark {
				w.firstAfter.CompareAndSwap(0, now)
			}
			key, idx, err := ordercheck.Decode(m.Data)
			if err != nil || key != m.OrderingKey {
				chk.Fail("undecodable delivery %q (key %q): %v", m.Data, m.OrderingKey, err)
				m.Ack()
				return
			}
			w.mu.Lock()
			if w.acked[string(m.Data)] {
				w.ackedAgain++
			}
			w.acked[string(m.Data)] = true
			w.mu.Unlock()
			diag.tracef("%s %s %d", s, key, idx)
			chk.Delivered(s, key, idx)
			chk.Acked(s, key, idx)
			m.Ack()
		}))
	}
	acks := func() int {
		n := 0
		for _, s := range subs {
			n += chk.Stats(s).Acks
		}
		return n
	}
	total := len(subs) * keys * perKey
	step := total / (kills + 2)

	var out []chaosKill
	for i := range kills {
		testutil.Eventually(t, 120*time.Second, func() bool { return acks() >= (i+1)*step }, "no progress before kill %d: %d of %d acks", i+1, acks, total)
		var open []string // subscriptions with messages left to deliver
		for _, s := range subs {
			if !chk.Complete(s) {
				open = append(open, s)
			}
		}
		killedAt := time.Now()
		diag.tracef("KILL %d", i+1)
		var ready time.Time
		what := "sidecar"
		if i%2 == 0 || !killNATS {
			b.Kill()
			diag.saveLog("b", b)
			b = b.Restart()
			ready = b.ReadyAt
			diag.tracef("READY sidecar %d", i+1)
		} else {
			what = "nats"
			diag.consumers(fmt.Sprintf("before nats kill %d", i+1))
			a.Kill()
			diag.saveLog("a", a)
			a = a.Restart()
			ready = a.ReadyAt
			diag.tracef("READY nats %d", i+1)
			diag.consumers(fmt.Sprintf("after nats restart %d", i+1))
		}
		for _, s := range open {
			watch[s].firstAfter.Store(0)
			watch[s].mark.Store(ready.UnixNano())
		}
		res := chaosKill{what: what}
		for _, s := range open {
			w := watch[s]
			testutil.Eventually(t, 90*time.Second, func() bool { return w.firstAfter.Load() != 0 || chk.Complete(s) },
				"%s: nothing delivered after the %s restart (kill %d)", s, what, i+1)
			f := w.firstAfter.Load()
			if f == 0 {
				w.mark.Store(0)
				continue
			}
			first := time.Unix(0, f)
			if stall := first.Sub(killedAt); stall > res.stall {
				res.stall = stall
				switch opened := opens.last(subPath(s)); {
				case what == "sidecar" && opened.After(killedAt) && opened.Before(first):
					res.back, res.after = opened.Sub(killedAt), first.Sub(opened)
				case what == "nats" && ready.Before(first):
					res.back, res.after = ready.Sub(killedAt), first.Sub(ready)
				}
			}
			w.mark.Store(0)
		}
		out = append(out, res)
		t.Logf("kill %d (%s) at %s: stall %v%s; %d of %d acks", i+1, what, killedAt.Format("05.000"), res.stall.Round(time.Millisecond), res.split(), acks(), total)
	}
	t.Cleanup(func() {
		diag.saveLog("b-last", b)
		diag.consumers("end")
		if t.Failed() {
			t.Logf("violations: %s", strings.Join(chk.Violations(), "\n"))
			t.Logf("consumers:\n%s", chaosConsumers(natsAddr))
			t.Logf("sidecar log:\n%s", b.Log())
		}
	})
	for _, s := range subs {
		testutil.Eventually(t, 120*time.Second, func() bool { return chk.Complete(s) }, "%s: not everything acked: %s", s, func() string { return chk.Missing(s) })
	}
	if v := chk.Violations(); len(v) > 0 {
		t.Fatalf("%d ordering violations, first: %s", len(v), strings.Join(v, "\n"))
	}
	for _, s := range stops {
		s()
	}

	var lines []string
	byKind := map[string][]time.Duration{}
	for i, r := range out {
		lines = append(lines, fmt.Sprintf("kill %d (%s): stall %v%s", i+1, r.what, r.stall.Round(time.Millisecond), r.split()))
		byKind[r.what] = append(byKind[r.what], r.stall)
		byKind["all"] = append(byKind["all"], r.stall)
		if r.back > 0 {
			byKind[r.what+" kills, "+r.backName()] = append(byKind[r.what+" kills, "+r.backName()], r.back)
			byKind[r.what+" kills, the sidecar's share"] = append(byKind[r.what+" kills, the sidecar's share"], r.after)
		}
	}
	for _, k := range []string{"sidecar", "nats", "all"} {
		if d := byKind[k]; len(d) > 0 {
			lines = append(lines, fmt.Sprintf("%s kills: %d, stall %s", k, len(d), itest.Percentiles(d)))
		}
	}
	for _, k := range []string{"sidecar kills, client reconnect", "sidecar kills, the sidecar's share", "nats kills, server restart", "nats kills, the sidecar's share"} {
		if d := byKind[k]; len(d) > 0 {
			lines = append(lines, fmt.Sprintf("%s: %d, %s", k, len(d), itest.Percentiles(d)))
		}
	}
	for _, s := range subs {
		st := chk.Stats(s)
		w := watch[s]
		w.mu.Lock()
		lines = append(lines, fmt.Sprintf("%s: %d messages, %d deliveries, %d redeliveries, %d of acked messages, %d keys went back to a message acked before",
			s, keys*perKey, st.Deliveries, st.Redeliveries, w.ackedAgain, st.Rewinds))
		w.mu.Unlock()
	}
	delivery := itest.DeliveryName()
	if pipelined {
		delivery = "partitioned (label)"
	}
	t.Logf("delivery %s, %s ordering, %d keys x %d messages:\n%s", delivery, ordering, keys, perKey, strings.Join(lines, "\n"))
	// In partitioned delivery a crash costs a restart, the client's
	// reconnect and a take-over, never an ack deadline (10 s). The bound is
	// on the sidecar's share when the stall splits: the client's retry
	// backoff grows while the sidecar is down (24.6 s once, under CI load)
	// and is not the sidecar's to shorten. Per-key delivery's take-over
	// waits for the lease's sweep, which under CI load has reached 8.5 s
	// once, so it is only reported. (The figures, not this bound, are
	// what docs/RELIABILITY.md and docs/EVIDENCE.md report.) The bound stays under the ack
	// deadline; it was 8 s until CI ran the integration packages side by
	// side, where a NATS kill's share reached 8.8 s.
	for i, r := range out {
		share := r.stall
		if r.back > 0 {
			share = r.after
		}
		if (itest.Delivery != adapter.DeliveryPerKey || pipelined) && share > chaosShareBound {
			t.Errorf("kill %d (%s): delivery stalled %v, the sidecar's share %v", i+1, r.what, r.stall, share)
		}
	}
	b.Stop()
	a.Stop()
}

// chaosShareBound bounds the sidecar's share of a kill's stall: under the
// subscription's 10 s ack deadline, so a take-over that waited for it
// fails.
const chaosShareBound = 9500 * time.Millisecond

// chaosKill is what one kill cost.
type chaosKill struct {
	what  string // "sidecar" or "nats"
	stall time.Duration
	// The stall in two: until the part outside the sidecar was back (for
	// a sidecar kill, the client's stream opened again after its retry
	// backoff, which the sidecar cannot shorten; for a NATS kill, the
	// server restarted and ready), and from then to the first delivery
	// (the sidecar's share: reconnecting, the take-over).
	back, after time.Duration
}

func (k chaosKill) backName() string {
	if k.what == "nats" {
		return "server restart"
	}
	return "client reconnect"
}

func (k chaosKill) split() string {
	if k.back == 0 {
		return ""
	}
	return fmt.Sprintf(" (%s %v, then the sidecar %v)", k.backName(), k.back.Round(time.Millisecond), k.after.Round(time.Millisecond))
}

// streamOpens records, per subscription, when the client last opened a
// StreamingPull stream the server took.
type streamOpens struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (o *streamOpens) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != "/google.pubsub.v1.Subscriber/StreamingPull" {
		return cs, err
	}
	return &openedStream{ClientStream: cs, o: o, opened: time.Now()}, nil
}

func (o *streamOpens) last(sub string) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.at[sub]
}

// openedStream names its subscription by the first request sent on it.
type openedStream struct {
	grpc.ClientStream
	o      *streamOpens
	opened time.Time
	once   sync.Once
}

func (s *openedStream) SendMsg(m any) error {
	if req, ok := m.(*pb.StreamingPullRequest); ok && req.GetSubscription() != "" {
		s.once.Do(func() {
			s.o.mu.Lock()
			s.o.at[req.GetSubscription()] = s.opened
			s.o.mu.Unlock()
		})
	}
	return s.ClientStream.SendMsg(m)
}

func chaosEnv(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv("JETORDER_CHAOS_" + name)); err == nil && v > 0 {
		return v
	}
	return def
}

// chaosConsumers describes every consumer of the chaos topic, for a
// failure's log.
func chaosConsumers(addr string) string {
	nc, err := nats.Connect("nats://" + addr)
	if err != nil {
		return err.Error()
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err.Error()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, keyrouter.StreamName(project, "chaos"))
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	l := st.ListConsumers(ctx)
	for ci := range l.Info() {
		fmt.Fprintf(&b, "%s: pending %d, unacked %d, waiting %d, delivered %d/%d, ack floor %d/%d, groups %+v\n", ci.Name, ci.NumPending, ci.NumAckPending, ci.NumWaiting,
			ci.Delivered.Consumer, ci.Delivered.Stream, ci.AckFloor.Consumer, ci.AckFloor.Stream, ci.PriorityGroups)
	}
	return b.String()
}

// chaosDiag writes, into JETORDER_CHAOS_LOGDIR when set, what explains a
// failing chaos run: each process's log (sidecars at debug level), every
// delivery and kill in order (trace.log: time, subscription, key, index),
// and the consumers' states around each NATS kill (consumers.log).
type chaosDiag struct {
	dir, natsAddr string
	mu            sync.Mutex
	trace         *os.File
	logs          int
}

func newChaosDiag(t *testing.T, natsAddr string) *chaosDiag {
	d := &chaosDiag{dir: os.Getenv("JETORDER_CHAOS_LOGDIR"), natsAddr: natsAddr}
	if d.dir == "" {
		return d
	}
	d.dir = filepath.Join(d.dir, t.Name()) // each chaos test's files apart
	if err := os.MkdirAll(d.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(d.dir, "trace.log"))
	if err != nil {
		t.Fatal(err)
	}
	d.trace = f
	t.Cleanup(func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		_ = f.Close()
		d.trace = nil
	})
	return d
}

func (d *chaosDiag) sidecarArgs() []string {
	if d.dir == "" {
		return nil
	}
	return []string{"--log-level", "debug"}
}

func (d *chaosDiag) tracef(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.trace != nil {
		fmt.Fprintf(d.trace, time.Now().Format("15:04:05.000000")+" "+format+"\n", args...)
	}
}

// saveLog writes p's log as NN-name.log, numbered in the order saved.
func (d *chaosDiag) saveLog(name string, p *itest.Sidecar) {
	if d.dir == "" {
		return
	}
	d.mu.Lock()
	d.logs++
	n := d.logs
	d.mu.Unlock()
	_ = os.WriteFile(filepath.Join(d.dir, fmt.Sprintf("%02d-%s.log", n, name)), []byte(p.Log()), 0o644)
}

func (d *chaosDiag) consumers(when string) {
	if d.dir == "" {
		return
	}
	f, err := os.OpenFile(filepath.Join(d.dir, "consumers.log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "=== %s %s\n%s", time.Now().Format("15:04:05.000"), when, chaosConsumers(d.natsAddr))
}
