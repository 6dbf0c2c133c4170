// Command bench measures ordered delivery through the adapter against raw
// JetStream on the same embedded server, in one run:
//
//   - baselines: one pull consumer consuming and acking with MaxAckPending
//     1000, and one with MaxAckPending 1;
//   - the adapter at 1, 16, 256 and 4,096 keys (messages/s and the ratio to
//     each baseline), consumers alive after the keys go idle;
//   - publishing: Topic.Publish at 100 and 10,000 keys against raw async
//     publish of the same messages, with and without the adapter's
//     headers (the target is the ratio to raw with the headers);
//   - publishing durably: each sync policy of the embedded server (lazy,
//     group, always) on its own server, publish throughput and latency of
//     the library and the sidecar beside raw JetStream made as durable
//     (durability.go);
//   - publish-to-handler latency, adapter and raw, at a steady rate;
//   - the sidecar's Pub/Sub gRPC API with Google's Go client beside the
//     adapter, 256 keys: delivery and publish messages/s, latency p50/p99;
//     and the sidecar pushing the same delivery to an HTTP endpoint in
//     this process;
//   - Google's Go clients v1 and v2 and its Node.js client through the
//     sidecar beside Google's emulator (clients.go): a hot key under strict
//     and pipelined ordering, and subscribe/read/close cycles;
//   - with -runs orderstress, per-key delivery through Google's Go client
//     beside pstest (orderstress.go): 1,000 new keys x 5 on two
//     subscriptions, 5% nacks;
//   - the DIDComm tracker in memory (1,000,000 messages over 10,000
//     threads) and didcomm.Receive with its state in KV;
//   - the two delivery modes of ordered subscriptions, partitioned and
//     per-key, side by side (modes.go): a burst of 100,000 new keys and
//     10,000 new keys/s for latency, both published into live
//     subscriptions, and throughput at 1,000 keys and 1 key;
//   - the sidecar's status page, /v1/status and /metrics with 100,000 keys
//     in flight (status.go);
//   - with -runs auth only (not by default): what access control costs
//     the sidecar's publish and receive paths, over TLS without and with
//     it, through Google's Go client at 256 keys (auth.go);
//   - process RSS (the embedded server runs in this process too).
//
// Every delivery run publishes its messages first and then times
// consumption only, so the figures compare delivery, not publishing. With -charts DIR the
// comparisons are also written as SVG bar charts (charts.go).
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/embedded"
	"github.com/jetorder/jetorder/internal/rsb"
	"github.com/jetorder/jetorder/keyrouter"
)

var (
	payloadSize = flag.Int("size", 128, "payload bytes")
	scale       = flag.Float64("scale", 1, "multiply every message count by this")
	idleTimeout = flag.Duration("idle", 2*time.Second, "key idle timeout before consumer clean-up")
	cpuProfile  = flag.String("cpuprofile", "", "write a CPU profile of the adapter runs to this file")
	keyCounts   = flag.String("keys", "1,16,256,4096", "key counts of the adapter runs")
	rounds      = flag.Int("rounds", 3, "rounds of baselines and adapter runs (key counts over 256 run once, in an extra last round)")
	burstKeys   = flag.Int("burst", 10_000, "keys in the new-key burst run (0 skips it)")
	runs        = flag.String("runs", "ordered,publish,durability,burst,latency,didcomm,sidecar,pipelined,clients,modes,status", "which runs to do, comma-separated (auth and orderstress are not among the defaults)")
)

const project = "bench"

func main() {
	flag.Parse()
	if *cpuProfile != "" && (*pipeProfile != "" || *modesProfile != "") {
		check(errors.New("-cpuprofile cannot be used with -pipe-cpuprofile or -modes-cpuprofile: Go writes one CPU profile at a time"))
	}
	dir, err := os.MkdirTemp("", "jetorder-bench-")
	check(err)
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(embedded.Config{StoreDir: dir})
	check(err)
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.ClientURL(), nats.ReconnectBufSize(-1))
	check(err)
	defer nc.Close()
	// fillData waits for every 5,000 async publishes: room for them, so a
	// loaded machine stalls nothing.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(10_000))
	check(err)
	client, err := adapter.NewClient(nc, project, adapter.WithKeyConsumerIdleTimeout(*idleTimeout))
	check(err)
	b := &bench{nc: nc, js: js, client: client, tmp: dir}

	fmt.Printf("jetorder bench: %s, GOMAXPROCS=%d, payload %d B, file storage, one process (server embedded)\n\n",
		runtime.Version(), runtime.GOMAXPROCS(0), *payloadSize)

	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		check(err)
		check(pprof.StartCPUProfile(f))
		defer pprof.StopCPUProfile()
	}
	var counts []int
	for _, field := range strings.Split(*keyCounts, ",") {
		keys, err := strconv.Atoi(strings.TrimSpace(field))
		check(err)
		counts = append(counts, keys)
	}
	// Each round measures the baselines and then the adapter runs, and each
	// adapter figure is divided by the baselines of its own round: on a
	// shared 2-core machine the spread between runs is large, so the
	// summary reports the median ratio and its range.
	var charts []chart
	var many, one, push []float64
	ratios := map[int][][2]float64{}
	rates := map[int][]float64{}
	large := slices.ContainsFunc(counts, func(k int) bool { return k > 256 })
	lastRound := *rounds
	if large {
		lastRound++ // key counts over 256 run once, last, in a round of their own
	}
	if selected("ordered") {
		fmt.Printf("%-5s %-34s %10s %11s %11s\n", "round", "run", "msgs/s", "vs raw1000", "vs raw-map1")
	} else {
		lastRound = 0
	}
	for round := 1; round <= lastRound; round++ {
		m, o, p := b.raw("raw-map1000", n(100_000), 1000), b.raw("raw-map1", n(50_000), 1), b.rawPush("raw-push-map1", n(50_000))
		many, one, push = append(many, m), append(one, o), append(push, p)
		fmt.Printf("%-5d %-34s %10.0f %11s %11s\n", round, "raw JetStream, MaxAckPending 1000", m, "1.00x", "")
		fmt.Printf("%-5d %-34s %10.0f %11s %11s\n", round, "raw JetStream, MaxAckPending 1", o, "", "1.00x")
		fmt.Printf("%-5d %-34s %10.0f %11s %10.2fx\n", round, "raw push, MaxAckPending 1", p, "", p/o)
		for _, keys := range counts {
			// Large key counts are slow and leave the server busy retiring
			// thousands of consumers; running them last keeps them from
			// weighing on the smaller runs.
			if (keys > 256) != (round > *rounds) {
				continue
			}
			msgs := n(100_000)
			if keys <= 16 {
				msgs = n(50_000)
			}
			r := b.ordered(keys, msgs)
			rates[keys] = append(rates[keys], r.rate)
			ratios[keys] = append(ratios[keys], [2]float64{r.rate / m, r.rate / o})
			fmt.Printf("%-5d %-34s %10.0f %10.2fx %10.2fx   first delivery after %v; key consumers: %d at end, %d after %v idle; %s\n",
				round, fmt.Sprintf("adapter, %d keys, %d msgs", keys, msgs), r.rate, r.rate/m, r.rate/o,
				r.startup.Round(time.Millisecond), r.consumersAtEnd, r.consumersAfterIdle, r.idleWait.Round(100*time.Millisecond), rss())
		}
	}
	if selected("ordered") {
		summarizeOrdered(counts, many, one, push, rates, ratios)
		charts = append(charts, orderedChart(counts, many, one, push, rates, ratios))
	}
	if selected("publish") {
		// The target compares the adapter with raw publishing of the same
		// headers: what the headers and de-duplication cost the server is
		// the wire format's, not the publisher's.
		fmt.Printf("%-5s %-28s %10s %22s %18s %16s\n", "round", "publish run", "raw async", "raw + adapter headers", "adapter Publish", "adapter vs raw+h")
		c := chart{name: "publish", title: "Publishing, against raw JetStream async publish of the same headers",
			note: fmt.Sprintf("%s messages per round, round-robin over the keys, every result awaited; median of %s, a ratio the median of each round's", count(float64(n(100_000))), plural(*rounds, "round"))}
		for _, pt := range []struct {
			keys   int
			target float64
		}{{100, 0.8}, {10_000, 0.6}} {
			var vsRaw, vsHeaders, headersVsRaw, raws, headers, ads []float64
			for round := 1; round <= *rounds; round++ {
				raw, rawHeaders, ad := b.publish(pt.keys, n(100_000))
				vsRaw, vsHeaders, headersVsRaw = append(vsRaw, ad/raw), append(vsHeaders, ad/rawHeaders), append(headersVsRaw, rawHeaders/raw)
				raws, headers, ads = append(raws, raw), append(headers, rawHeaders), append(ads, ad)
				fmt.Printf("%-5d %-28s %10.0f %15.0f %5.2fx %11.0f %5.2fx %15.2fx\n", round,
					fmt.Sprintf("%d keys, %d msgs", pt.keys, n(100_000)), raw, rawHeaders, rawHeaders/raw, ad, ad/raw, ad/rawHeaders)
			}
			met := "met"
			if median(vsHeaders) < pt.target {
				met = "not met"
			}
			fmt.Printf("publish, %d keys, median of %d rounds: adapter %.2fx raw with the adapter's headers [%.2f-%.2f], target %.1fx %s; "+
				"adapter %.2fx raw async [%.2f-%.2f]; raw with the adapter's headers %.2fx raw async\n\n",
				pt.keys, *rounds, median(vsHeaders), slices.Min(vsHeaders), slices.Max(vsHeaders), pt.target, met,
				median(vsRaw), slices.Min(vsRaw), slices.Max(vsRaw), median(headersVsRaw))
			c.groups = append(c.groups, barGroup{title: fmt.Sprintf("%s keys: messages/s published (target: the adapter at %.1fx raw with the adapter's headers)",
				count(float64(pt.keys)), pt.target), bars: []bar{
				baseBar("raw JetStream async publish", median(raws)),
				baseBar("raw, with the adapter's headers", median(headers), vs(median(headersVsRaw), "raw")),
				rateBar("adapter Topic.Publish", median(ads), vs(median(vsHeaders), "raw with headers"), vs(median(vsRaw), "raw")),
			}})
		}
		charts = append(charts, c)
	}
	if selected("durability") {
		durability()
	}
	if selected("burst") && *burstKeys > 0 {
		b.burst(*burstKeys)
	}
	if selected("latency") {
		rawLat := b.rawLatency(2000, 3*time.Second)
		adLat := b.orderedLatency(16, 2000, 3*time.Second)
		fmt.Printf("latency publish->handler at 2000 msg/s: raw p50 %v p99 %v; adapter (16 keys) p50 %v p99 %v\n",
			rawLat.p50, rawLat.p99, adLat.p50, adLat.p99)
		charts = append(charts, latencyChart(rawLat, adLat))
	}
	if selected("didcomm") {
		c := chart{name: "didcomm", title: "DIDComm tracking",
			note: "the tracker: one run; didcomm.Receive: median of " + plural(*rounds, "round") + ", a ratio the median of each round's"}
		c.groups = append(c.groups, b.didcommTracker(10_000, n(1_000_000)))
		var raws, plains, trackeds, plainVsRaw, trackedVsRaw, trackedVsPlain []float64
		for round := 1; round <= *rounds; round++ {
			raw, plain, tracked := b.didcommReceive(256, n(20_000))
			fmt.Printf("%-5d didcomm.Receive, 256 threads on 256 keys, %d msgs: raw %.0f msgs/s; adapter Receive %.0f (%.2fx raw); didcomm.Receive with KV state %.0f (%.2fx raw, %.2fx adapter)\n",
				round, n(20_000), raw, plain, plain/raw, tracked, tracked/raw, tracked/plain)
			raws, plains, trackeds = append(raws, raw), append(plains, plain), append(trackeds, tracked)
			plainVsRaw, trackedVsRaw, trackedVsPlain = append(plainVsRaw, plain/raw), append(trackedVsRaw, tracked/raw), append(trackedVsPlain, tracked/plain)
		}
		c.groups = append(c.groups, barGroup{title: fmt.Sprintf("didcomm.Receive, %s messages over 256 threads on 256 keys: messages/s", count(float64(n(20_000)))), bars: []bar{
			baseBar("raw JetStream, MaxAckPending 1000", median(raws)),
			rateBar("adapter Receive", median(plains), vs(median(plainVsRaw), "raw")),
			rateBar("didcomm.Receive, state in KV", median(trackeds), vs(median(trackedVsRaw), "raw"), vs(median(trackedVsPlain), "adapter")),
		}})
		charts = append(charts, c)
	}
	if selected("pipelined") {
		charts = append(charts, b.pipelinedRuns())
	}
	if selected("clients") {
		charts = append(charts, b.clientsRuns())
	}
	if selected("orderstress") {
		charts = append(charts, b.orderStressRuns())
	}
	if selected("sidecar") {
		var sc sidecarFigures
		s := b.startSidecar()
		fmt.Printf("%-5s %-36s %10s %10s %7s %10s %7s %10s %7s %8s   %10s %10s %7s\n", "round", "sidecar run (delivery, then publish)",
			"raw1000", "library", "vs raw", "gRPC", "vs raw", "push", "vs raw", "lib/gRPC", "lib pub", "gRPC pub", "lib/gRPC")
		var dl, pl, pushRaw, pushGRPC []float64
		for round := 1; round <= *rounds; round++ {
			r := s.round(round, 256, n(20_000))
			sc.rounds = append(sc.rounds, r)
			dl, pl = append(dl, r.lib/r.grpc), append(pl, r.libPub/r.grpcPub)
			pushRaw, pushGRPC = append(pushRaw, r.push/r.raw), append(pushGRPC, r.push/r.grpc)
		}
		fmt.Printf("sidecar, 256 keys, median of %d rounds: the gRPC layer costs %.2fx in delivery [%.2f-%.2f] and %.2fx in publishing [%.2f-%.2f]\n",
			*rounds, median(dl), slices.Min(dl), slices.Max(dl), median(pl), slices.Min(pl), slices.Max(pl))
		fmt.Printf("sidecar push, 256 keys, median of %d rounds: %.3fx raw [%.3f-%.3f], %.2fx the Go client's pull [%.2f-%.2f]\n",
			*rounds, median(pushRaw), slices.Min(pushRaw), slices.Max(pushRaw), median(pushGRPC), slices.Min(pushGRPC), slices.Max(pushGRPC))
		var costs []float64
		for round := 1; round <= *rounds; round++ {
			raw, untracked, tracked := s.didcommSidecar(256, n(20_000))
			costs = append(costs, untracked/tracked)
			sc.didcomm = append(sc.didcomm, [3]float64{raw, untracked, tracked})
			fmt.Printf("%-5d sidecar DIDComm tracking, 256 threads on 256 keys, %d msgs, Go client: raw %.0f msgs/s; untracked %.0f (%.3fx raw); tracked %.0f (%.3fx raw; costs %.2fx)\n",
				round, n(20_000), raw, untracked, untracked/raw, tracked, tracked/raw, untracked/tracked)
		}
		fmt.Printf("sidecar DIDComm tracking, median of %d rounds: costs %.2fx [%.2f-%.2f]\n", *rounds, median(costs), slices.Min(costs), slices.Max(costs))
		lib, g := s.latency(256, 2000, 3*time.Second)
		fmt.Printf("latency publish->handler at 2000 msg/s over 256 keys: library p50 %v p99 %v; gRPC (Go client) p50 %v p99 %v\n\n",
			lib.p50, lib.p99, g.p50, g.p99)
		s.stop()
		charts = append(charts, sc.chart(256, n(20_000)))
	}
	if selected("modes") {
		charts = append(charts, b.modes())
	}
	if selected("status") {
		b.status()
	}
	if selected("auth") {
		charts = append(charts, b.auth())
	}
	fmt.Printf("process RSS at end: %s\n", rss())
	if *chartsDir != "" {
		check(writeCharts(*chartsDir, charts))
	}
}

func selected(run string) bool { return slices.Contains(strings.Split(*runs, ","), run) }

func summarizeOrdered(counts []int, many, one, push []float64, rates map[int][]float64, ratios map[int][][2]float64) {
	fmt.Printf("\nsummary, median of %d rounds (ratio range in brackets)\n", *rounds)
	fmt.Printf("%-34s %10.0f\n", "raw JetStream, MaxAckPending 1000", median(many))
	fmt.Printf("%-34s %10.0f\n", "raw JetStream, MaxAckPending 1", median(one))
	fmt.Printf("%-34s %10.0f\n", "raw push, MaxAckPending 1", median(push))
	for _, keys := range counts {
		var vsMany, vsOne []float64
		for _, r := range ratios[keys] {
			vsMany, vsOne = append(vsMany, r[0]), append(vsOne, r[1])
		}
		fmt.Printf("%-34s %10.0f   vs raw1000 %.2fx [%.2f-%.2f]   vs raw-map1 %.2fx [%.2f-%.2f]\n",
			fmt.Sprintf("adapter, %d keys", keys), median(rates[keys]),
			median(vsMany), slices.Min(vsMany), slices.Max(vsMany), median(vsOne), slices.Min(vsOne), slices.Max(vsOne))
	}
	fmt.Println()
}

// orderedChart draws summarizeOrdered's figures.
func orderedChart(counts []int, many, one, push []float64, rates map[int][]float64, ratios map[int][][2]float64) chart {
	g := barGroup{title: "messages/s, published first, then consumed and acked", bars: []bar{
		baseBar("raw JetStream, MaxAckPending 1000", median(many)),
		baseBar("raw JetStream, MaxAckPending 1", median(one)),
		baseBar("raw push, MaxAckPending 1", median(push)),
	}}
	for _, keys := range counts {
		var vsMany, vsOne []float64
		for _, r := range ratios[keys] {
			vsMany, vsOne = append(vsMany, r[0]), append(vsOne, r[1])
		}
		g.bars = append(g.bars, rateBar("adapter, per-key delivery, "+plural(keys, "key"), median(rates[keys]),
			vs(median(vsMany), "MaxAckPending 1000"), vs(median(vsOne), "MaxAckPending 1")))
	}
	return chart{name: "ordered", title: "Ordered delivery, per key, against raw JetStream", groups: []barGroup{g},
		note: "median of " + plural(*rounds, "round") + " (key counts over 256: one round), a ratio the median of each round's to its own baselines"}
}

// latencyChart draws the latency run's figures.
func latencyChart(raw, ad latency) chart {
	bars := func(r, a time.Duration) []bar {
		return []bar{
			durationBar("raw JetStream", r, true, true, r.String()),
			durationBar("adapter, per-key delivery, 16 keys", a, true, false, a.String()+" ("+ratio(a.Seconds()/r.Seconds())+" raw)"),
		}
	}
	return chart{name: "latency", title: "Latency, publish to handler, at 2,000 messages/s",
		note:   "one run each, 3 s of publishing; lower is better",
		groups: []barGroup{{title: "p50", bars: bars(raw.p50, ad.p50)}, {title: "p99", bars: bars(raw.p99, ad.p99)}}}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func n(base int) int { return max(1, int(float64(base)**scale)) }

type bench struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	client *adapter.Client
	seq    int
	tmp    string // the run's temp dir (the embedded server's store is in it too)
	// deliveryProfile, when set, is the file the next deliverIn or
	// modeThroughput writes a CPU profile of its delivery to (publishing
	// left out); it is cleared then.
	deliveryProfile string
}

func (b *bench) name(prefix string) string {
	b.seq++
	return fmt.Sprintf("%s-%d", prefix, b.seq)
}

// fill publishes msgs messages of the bench's payload size with async
// publish and waits for every ack.
func (b *bench) fill(subject func(i int) string, hdr func(i int) nats.Header, msgs int) {
	payload := make([]byte, *payloadSize)
	payloads := make([][]byte, msgs)
	for i := range payloads {
		payloads[i] = payload
	}
	b.fillData(subject, hdr, payloads)
}

// fillData is fill with a payload per message.
func (b *bench) fillData(subject func(i int) string, hdr func(i int) nats.Header, payloads [][]byte) {
	for i, p := range payloads {
		if _, err := b.js.PublishMsgAsync(&nats.Msg{Subject: subject(i), Data: p, Header: hdr(i)}); err != nil {
			check(err)
		}
		if i%5000 == 4999 {
			<-b.js.PublishAsyncComplete()
		}
	}
	<-b.js.PublishAsyncComplete()
}

// keyed returns the ordering keys prefix-0 .. prefix-(keys-1) of a topic,
// their subjects, and the header function fill takes to publish message i
// on key i%keys.
func keyed(topicID, prefix string, keys int) (subject func(i int) string, hdr func(i int) nats.Header) {
	names := make([]string, keys)
	subjects := make([]string, keys)
	for k := range keys {
		names[k] = prefix + "-" + strconv.Itoa(k)
		subjects[k] = keyrouter.KeyedSubject(project, topicID, names[k])
	}
	return func(i int) string { return subjects[i%keys] },
		func(i int) nats.Header { return nats.Header{"Jetorder-Ordering-Key": {names[i%keys]}} }
}

// raw times one pull consumer consuming and acking msgs messages.
func (b *bench) raw(stream string, msgs, maxAckPending int) float64 {
	ctx := context.Background()
	subj := stream + ".x"
	s, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subj}, Storage: jetstream.FileStorage})
	check(err)
	defer b.js.DeleteStream(ctx, stream)
	b.fill(func(int) string { return subj }, func(int) nats.Header { return nil }, msgs)
	cons, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: maxAckPending})
	check(err)
	return consumeAndAck(msgs, cons)
}

// consumeAndAck consumes and acks msgs messages from the consumers
// together and returns their rate, from the first delivery to the last.
func consumeAndAck(msgs int, consumers ...jetstream.Consumer) float64 {
	acks := newAckTimer(msgs)
	for _, cons := range consumers {
		cc, err := cons.Consume(func(m jetstream.Msg) { acks.ack(m.Ack) })
		check(err)
		defer cc.Stop()
	}
	return acks.rate()
}

// ackTimer times acking msgs messages, from the first ack to the last.
type ackTimer struct {
	msgs       int64
	got, first atomic.Int64
	done       chan struct{}
}

func newAckTimer(msgs int) *ackTimer { return &ackTimer{msgs: int64(msgs), done: make(chan struct{})} }

// ack acks one message with ack.
func (a *ackTimer) ack(ack func() error) {
	a.first.CompareAndSwap(0, time.Now().UnixNano())
	_ = ack()
	if a.got.Add(1) == a.msgs {
		close(a.done)
	}
}

// rate waits for the last ack and returns messages per second.
func (a *ackTimer) rate() float64 {
	<-a.done
	return float64(a.msgs-1) / time.Since(time.Unix(0, a.first.Load())).Seconds()
}

// rawPush times one push consumer with MaxAckPending 1 delivering to a
// queue subscription: the delivery path the adapter's key consumers use.
func (b *bench) rawPush(stream string, msgs int) float64 {
	ctx := context.Background()
	subj := stream + ".x"
	_, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subj}, Storage: jetstream.FileStorage})
	check(err)
	defer b.js.DeleteStream(ctx, stream)
	b.fill(func(int) string { return subj }, func(int) nats.Header { return nil }, msgs)
	acks := newAckTimer(msgs)
	sub, err := b.nc.QueueSubscribe("deliver."+stream, "g", func(m *nats.Msg) { acks.ack(func() error { return m.Ack() }) })
	check(err)
	defer sub.Unsubscribe()
	_, err = b.js.CreatePushConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "c", DeliverSubject: "deliver." + stream,
		DeliverGroup: "g", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1})
	check(err)
	return acks.rate()
}

// burst publishes one message to each of keys new keys on a live ordered
// subscription and reports how the key consumers come and go.
func (b *bench) burst(keys int) {
	ctx := context.Background()
	topicID, _, sub, cleanup := b.orderedTopic("burst")
	defer cleanup()
	var got atomic.Int64
	done := make(chan struct{})
	rctx, cancel := context.WithCancel(ctx)
	recvDone := make(chan error, 1)
	go func() {
		recvDone <- sub.Receive(rctx, func(_ context.Context, m *adapter.Message) {
			m.Ack()
			if got.Add(1) == int64(keys) {
				close(done)
			}
		})
	}()
	start := time.Now()
	b.fill(func(i int) string { return keyrouter.KeyedSubject(project, topicID, "device-"+strconv.Itoa(i)) },
		func(i int) nats.Header { return nats.Header{"Jetorder-Ordering-Key": {"device-" + strconv.Itoa(i)}} }, keys)
	peak := 0
	for waiting := true; waiting; {
		select {
		case <-done:
			waiting = false
		case <-time.After(250 * time.Millisecond):
			peak = max(peak, b.keyConsumers(topicID, sub.ID()))
		}
	}
	delivered := time.Since(start)
	peak = max(peak, b.keyConsumers(topicID, sub.ID()))
	memAtPeak := rss()
	left, idle := b.waitRetired(topicID, sub.ID(), 3*time.Minute)
	cancel()
	check(<-recvDone)
	fmt.Printf("burst of %d new keys, one message each: all delivered in %v (%.0f keys/s); key consumers: peak %d (%s), %d left %v after the last delivery\n",
		keys, delivered.Round(100*time.Millisecond), float64(keys)/delivered.Seconds(), peak, memAtPeak, left, idle.Round(100*time.Millisecond))
}

// publish times, each into a fresh topic, raw JetStream async publishing
// of msgs messages round-robin over keys subjects; the same with the headers
// the adapter writes; and the adapter's Publish of the same messages with
// the same keys (every result awaited).
func (b *bench) publish(keys, msgs int) (raw, rawHeaders, ad float64) {
	payload := make([]byte, *payloadSize)
	keyNames := make([]string, keys)
	for k := range keyNames {
		keyNames[k] = "key-" + strconv.Itoa(k)
	}
	// The label names the run in a CPU profile (-cpuprofile) on this
	// goroutine and those it starts, the publisher's among them; the
	// server labels its own work with the stream.
	timed := func(run string, f func(topicID string, topic *adapter.Topic)) float64 {
		var rate float64
		pprof.Do(context.Background(), pprof.Labels("publish", run), func(context.Context) { rate = b.timedPublish(msgs, f) })
		return rate
	}
	raw = timed("raw", func(topicID string, _ *adapter.Topic) {
		b.fill(func(i int) string { return keyrouter.KeyedSubject(project, topicID, keyNames[i%keys]) },
			func(i int) nats.Header { return nats.Header{"Jetorder-Ordering-Key": {keyNames[i%keys]}} }, msgs)
	})
	// The difference between raw and this is what the headers (and
	// de-duplication by Nats-Msg-Id) cost; the rest is the publisher's own.
	sender := uuid.New()
	rawHeaders = timed("raw+headers", func(topicID string, _ *adapter.Topic) {
		b.fill(func(i int) string { return keyrouter.KeyedSubject(project, topicID, keyNames[i%keys]) },
			func(i int) nats.Header {
				now := time.Now().UTC().Format("2006-01-02T15:04:05.000000Z")
				return nats.Header{"Jetorder-Ordering-Key": {keyNames[i%keys]}, "Nats-Msg-Id": {rsb.MessageID(sender, uint32(i))},
					"Jetorder-Sender-Id": {sender.String()}, "Jetorder-Sequence": {strconv.Itoa(i)},
					"Jetorder-Create-Time": {now}, "Jetorder-Send-Time": {now}}
			}, msgs)
	})
	ad = timed("adapter", func(_ string, topic *adapter.Topic) { adapterPublish(topic, keyNames, msgs, payload) })
	return raw, rawHeaders, ad
}

// timedPublish runs run on a new topic and returns msgs over its time.
func (b *bench) timedPublish(msgs int, run func(topicID string, topic *adapter.Topic)) float64 {
	topicID, topic, _, cleanup := b.orderedTopic("pub")
	defer cleanup()
	start := time.Now()
	run(topicID, topic)
	return float64(msgs) / time.Since(start).Seconds()
}

// adapterPublish publishes msgs messages over keys with the adapter's
// Topic, without waiting, then waits for every result.
func adapterPublish(topic *adapter.Topic, keys []string, msgs int, payload []byte) {
	ctx := context.Background()
	results := make([]*adapter.PublishResult, 0, msgs)
	for i := range msgs {
		results = append(results, topic.Publish(ctx, &adapter.Message{Data: payload, OrderingKey: keys[i%len(keys)]}))
	}
	for _, r := range results {
		_, err := r.Get(ctx)
		check(err)
	}
}

// orderedTopic creates a topic and an ordered subscription to it; cleanup
// deletes both.
func (b *bench) orderedTopic(prefix string) (string, *adapter.Topic, *adapter.Subscription, func()) {
	// Per key: these runs measure per-key consumers (the modes run compares
	// both modes).
	return b.orderedTopicIn(prefix, adapter.SubscriptionConfig{Delivery: adapter.DeliveryPerKey})
}

// orderedTopicIn is orderedTopic with the subscription settings of cfg
// (its topic and ordering set here).
func (b *bench) orderedTopicIn(prefix string, cfg adapter.SubscriptionConfig) (string, *adapter.Topic, *adapter.Subscription, func()) {
	ctx := context.Background()
	topicID := b.name(prefix)
	topic, err := b.client.CreateTopic(ctx, topicID)
	check(err)
	cfg.Topic, cfg.EnableMessageOrdering = topic, true
	sub, err := b.client.CreateSubscription(ctx, topicID+"-sub", cfg)
	check(err)
	return topicID, topic, sub, func() {
		_ = sub.Delete(ctx)
		_ = topic.Delete(ctx)
	}
}

// waitRetired polls until the subscription has no key consumers (or limit
// passes) and returns how many are left and how long it waited.
func (b *bench) waitRetired(topicID, subID string, limit time.Duration) (int, time.Duration) {
	start := time.Now()
	left := b.keyConsumers(topicID, subID)
	for left > 0 && time.Since(start) < limit {
		time.Sleep(100 * time.Millisecond)
		left = b.keyConsumers(topicID, subID)
	}
	return left, time.Since(start)
}

type orderedResult struct {
	rate                               float64
	startup                            time.Duration
	consumersAtEnd, consumersAfterIdle int
	idleWait                           time.Duration
}

// ordered times the adapter delivering msgs messages over keys keys to an
// ordered subscription, then waits for the key consumers to be retired.
func (b *bench) ordered(keys, msgs int) orderedResult {
	ctx := context.Background()
	topicID, _, sub, cleanup := b.orderedTopic("ordered")
	defer cleanup()
	subject, hdr := keyed(topicID, "key", keys)
	b.fill(subject, hdr, msgs)

	var got atomic.Int64
	var first atomic.Int64
	done := make(chan struct{})
	rctx, cancel := context.WithCancel(ctx)
	recvDone := make(chan error, 1)
	start := time.Now()
	go func() {
		recvDone <- sub.Receive(rctx, func(_ context.Context, m *adapter.Message) {
			first.CompareAndSwap(0, time.Now().UnixNano())
			m.Ack()
			if got.Add(1) == int64(msgs) {
				close(done)
			}
		})
	}()
	<-done
	end := time.Now()
	firstAt := time.Unix(0, first.Load())
	// Throughput is timed from the first delivery, like the raw baselines
	// (whose consumer exists before their clock starts); the start-up
	// (registry read, ownership, discovery, first consumer) is reported apart.
	res := orderedResult{
		rate:           float64(msgs-1) / end.Sub(firstAt).Seconds(),
		startup:        firstAt.Sub(start),
		consumersAtEnd: b.keyConsumers(topicID, sub.ID()),
	}
	res.consumersAfterIdle, res.idleWait = b.waitRetired(topicID, sub.ID(), 2*time.Minute)
	cancel()
	check(<-recvDone)
	return res
}

func (b *bench) keyConsumers(topicID, subID string) int {
	s, err := b.js.Stream(context.Background(), keyrouter.StreamName(project, topicID))
	check(err)
	count := 0
	names := s.ConsumerNames(context.Background())
	for name := range names.Name() {
		if strings.HasPrefix(name, keyrouter.KeyConsumerPrefix(project, subID)) {
			count++
		}
	}
	return count
}

type latency struct{ p50, p99 time.Duration }

func summarize(d []time.Duration) latency {
	if len(d) == 0 {
		return latency{}
	}
	slices.Sort(d)
	return latency{p50: d[len(d)/2].Round(time.Microsecond), p99: d[len(d)*99/100].Round(time.Microsecond)}
}

// pace publishes stamped messages at rate per second for dur.
func pace(rate int, dur time.Duration, publish func(i int, stamp []byte)) int {
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	i := 0
	for time.Since(start) < dur {
		next := start.Add(time.Duration(i) * interval)
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		stamp := make([]byte, 8)
		binary.BigEndian.PutUint64(stamp, uint64(time.Now().UnixNano()))
		publish(i, stamp)
		i++
	}
	return i
}

type collector struct {
	mu sync.Mutex
	d  []time.Duration
}

func (c *collector) add(stamp []byte) {
	if len(stamp) < 8 {
		return
	}
	d := time.Since(time.Unix(0, int64(binary.BigEndian.Uint64(stamp))))
	c.mu.Lock()
	c.d = append(c.d, d)
	c.mu.Unlock()
}

func (c *collector) wait(n int) latency {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		got := len(c.d)
		c.mu.Unlock()
		if got >= n {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return summarize(c.d)
}

func (b *bench) rawLatency(rate int, dur time.Duration) latency {
	ctx := context.Background()
	stream := b.name("rawlat")
	s, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".x"}, Storage: jetstream.FileStorage})
	check(err)
	defer b.js.DeleteStream(ctx, stream)
	cons, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1000})
	check(err)
	var c collector
	cc, err := cons.Consume(func(m jetstream.Msg) { c.add(m.Data()); _ = m.Ack() })
	check(err)
	defer cc.Stop()
	sent := pace(rate, dur, func(_ int, stamp []byte) {
		_, err := b.js.PublishAsync(stream+".x", stamp)
		check(err)
	})
	return c.wait(sent)
}

func (b *bench) orderedLatency(keys, rate int, dur time.Duration) latency {
	ctx := context.Background()
	topicID, topic, sub, cleanup := b.orderedTopic("lat")
	defer cleanup()
	var c collector
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var warmed atomic.Int32
	go func() {
		_ = sub.Receive(rctx, func(_ context.Context, m *adapter.Message) {
			if len(m.Data) == 0 {
				warmed.Add(1)
			}
			c.add(m.Data)
			m.Ack()
		})
	}()
	// Warm up: one message per key, so consumer creation is not timed.
	warm := make([]*adapter.PublishResult, keys)
	for k := range keys {
		warm[k] = topic.Publish(ctx, &adapter.Message{Data: nil, OrderingKey: "key-" + strconv.Itoa(k)})
	}
	for _, r := range warm {
		_, err := r.Get(ctx)
		check(err)
	}
	for deadline := time.Now().Add(30 * time.Second); int(warmed.Load()) < keys && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	sent := pace(rate, dur, func(i int, stamp []byte) {
		m := &nats.Msg{Subject: keyrouter.KeyedSubject(project, topicID, "key-"+strconv.Itoa(i%keys)), Data: stamp,
			Header: nats.Header{"Jetorder-Ordering-Key": {"key-" + strconv.Itoa(i%keys)}}}
		_, err := b.js.PublishMsgAsync(m)
		check(err)
	})
	return c.wait(sent)
}

// rss is the process's resident set size from /proc.
func rss() string {
	mib := rssMiB()
	if mib == 0 {
		return "rss n/a"
	}
	return fmt.Sprintf("RSS %d MiB, %d goroutines", mib, runtime.NumGoroutine())
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
