package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/keyrouter"
)

// The "modes" run: the two delivery modes of ordered subscriptions side by
// side, each beside raw JetStream measured in the same run.

var (
	modesKeys         = flag.Int("modes-keys", 100_000, "new keys, one message each, in the delivery-modes key burst (times -scale)")
	modesCap          = flag.Duration("modes-cap", 2*time.Minute, "how long a delivery mode may take over the key burst (and a throughput run) before it is reported unfinished")
	modesRate         = flag.Int("modes-rate", 10_000, "new keys per second in the delivery-modes latency run")
	modesDuration     = flag.Duration("modes-duration", 10*time.Second, "how long the delivery-modes latency run publishes")
	modesDrain        = flag.Duration("modes-drain", 15*time.Second, "how long the latency run waits for deliveries after publishing ends")
	modesParts        = flag.Int("modes-partitions", 0, "partitions of the partitioned subscriptions (0: the adapter's default)")
	modesSplitProfile = flag.String("modes-key-streams-cpuprofile", "", "as -modes-cpuprofile, for the run on a topic of -modes-key-streams key streams")
	modesSplit        = flag.Int("modes-key-streams", 16, "key streams of the topic of the extra partitioned 1,000-key run (TopicConfig.KeyStreams; as many partitions; 0 or 1 skips it)")
	modesProfile      = flag.String("modes-cpuprofile", "", "repeat the partitioned 1,000-key delivery with five times the messages under the CPU profiler (publishing left out; not in the figures) and write the profile to this file; not with -cpuprofile")
)

// rawJetStream stands beside the delivery modes for the baseline: one pull
// consumer, MaxAckPending 1000, on a stream of its own.
const rawJetStream adapter.DeliveryMode = "raw"

var deliveryModes = []adapter.DeliveryMode{adapter.DeliveryPartitioned, adapter.DeliveryPerKey}

func (b *bench) modes() chart {
	fmt.Println("delivery modes of ordered subscriptions, default settings: partitioned and per-key, beside raw JetStream")
	s := modesSummary{burst: map[adapter.DeliveryMode]burstResult{}, latency: map[adapter.DeliveryMode]latencyResult{}}
	keys := n(*modesKeys)
	burst := func(mode adapter.DeliveryMode) {
		r := b.newKeyBurst(mode, keys, *modesCap)
		s.burst[mode] = r
		fmt.Printf("1. %-12s %s\n", mode, r.describe(s.burst[rawJetStream]))
	}
	latency := func(mode adapter.DeliveryMode) {
		r := b.newKeyLatency(mode, *modesRate, *modesDuration)
		s.latency[mode] = r
		fmt.Printf("2. %-12s %s\n", mode, r.describe())
	}
	fmt.Printf("1. %d new keys, one message each, published as fast as JetStream takes them into a live subscription (cap %v)\n", keys, *modesCap)
	fmt.Printf("2. %d new keys/s for %v, one message each, publish->handler latency (undelivered %v after publishing ends count as missing)\n",
		*modesRate, *modesDuration, *modesDrain)
	// Per-key delivery's share of 1 and 2 runs last: the tens of thousands
	// of consumers it creates leave the server and the heap busy for a while
	// after they are deleted, which would weigh on whatever came next.
	burst(rawJetStream)
	burst(adapter.DeliveryPartitioned)
	latency(rawJetStream)
	latency(adapter.DeliveryPartitioned)

	for _, t := range []*throughputCase{
		{keys: 1000, msgs: n(20_000), baselineAckPending: 1000, layoutBaseline: true},
		{keys: 1, msgs: n(20_000), baselineAckPending: 1},
	} {
		fmt.Printf("%d. %s, %d messages published first, consumed from first delivery to last ack\n", len(s.throughput)+3, plural(t.keys, "key"), t.msgs)
		t.raw = b.raw(b.name("modes-raw"), t.msgs, t.baselineAckPending)
		fmt.Printf("   %-12s %10.0f msgs/s (one pull consumer, MaxAckPending %d)\n", rawJetStream, t.raw, t.baselineAckPending)
		if t.layoutBaseline {
			t.rawLayout = b.rawPartitionLayout(t.keys, t.msgs, partitionsOf(adapter.DeliveryPartitioned))
			fmt.Printf("   %-12s %10.0f msgs/s %6.2fx raw (%d pull consumers with the partitions' filter subjects, MaxAckPending %d each, no key gating)\n",
				"raw-layout", t.rawLayout, t.rawLayout/t.raw, partitionsOf(adapter.DeliveryPartitioned), defaultPartitionBuffer)
			t.rawSplit = b.rawStreamPerPartition(t.keys, t.msgs, partitionsOf(adapter.DeliveryPartitioned))
			fmt.Printf("   %-12s %10.0f msgs/s %6.2fx raw (a stream per partition, one pull consumer each without a filter, MaxAckPending %d, no key gating)\n",
				"raw-split", t.rawSplit, t.rawSplit/t.raw, defaultPartitionBuffer)
			t.rawOneMulti = b.rawOneConsumer(t.keys, t.msgs, partitionsOf(adapter.DeliveryPartitioned), everyPartition)
			fmt.Printf("   %-12s %10.0f msgs/s %6.2fx raw (one pull consumer with every partition's filter subject, MaxAckPending %d, no key gating)\n",
				"raw-one", t.rawOneMulti, t.rawOneMulti/t.raw, defaultPartitionBuffer)
			t.rawOneKeyed = b.rawOneConsumer(t.keys, t.msgs, partitionsOf(adapter.DeliveryPartitioned), keyedOnly)
			fmt.Printf("   %-12s %10.0f msgs/s %6.2fx raw (one pull consumer with the topic's keyed filter, MaxAckPending %d, no key gating)\n",
				"raw-keyed", t.rawOneKeyed, t.rawOneKeyed/t.raw, defaultPartitionBuffer)
			t.rawOneAll = b.rawOneConsumer(t.keys, t.msgs, partitionsOf(adapter.DeliveryPartitioned), noFilter)
			fmt.Printf("   %-12s %10.0f msgs/s %6.2fx raw (one pull consumer of the topic without a filter, MaxAckPending %d, no key gating)\n",
				"raw-topic", t.rawOneAll, t.rawOneAll/t.raw, defaultPartitionBuffer)
		}
		t.modes = map[adapter.DeliveryMode]throughputResult{}
		for _, mode := range deliveryModes {
			r := b.modeThroughput(mode, t.keys, t.msgs)
			t.modes[mode] = r
			fmt.Printf("   %-12s %10.0f msgs/s %6.2fx raw; %s\n", mode, r.rate, r.rate/t.raw, r.describe())
			if t.layoutBaseline && mode == adapter.DeliveryPartitioned && *modesProfile != "" {
				// A repeat, so that the profiler's cost stays out of the
				// figures, with five times the messages, for samples enough;
				// before per-key's run, whose consumers keep the server busy
				// for a while after it.
				b.deliveryProfile = *modesProfile
				r := b.modeThroughput(mode, t.keys, 5*t.msgs)
				fmt.Printf("   %-12s %10.0f msgs/s %6.2fx raw (partitioned again with %d messages, under the CPU profiler; not in the figures)\n   %-12s %s\n",
					"profiled", r.rate, r.rate/t.raw, 5*t.msgs, "", describeCPU(*modesProfile))
			}
			if t.layoutBaseline && mode == adapter.DeliveryPartitioned && *modesSplit > 1 {
				t.split = b.modeThroughputSplit(mode, t.keys, t.msgs, *modesSplit)
				fmt.Printf("   %-12s %10.0f msgs/s %6.2fx raw (partitioned, a topic of %d key streams, %d partitions); %s\n",
					"key-streams", t.split.rate, t.split.rate/t.raw, *modesSplit, *modesSplit, t.split.describe())
				if *modesSplitProfile != "" {
					b.deliveryProfile = *modesSplitProfile
					r := b.modeThroughputSplit(mode, t.keys, 5*t.msgs, *modesSplit)
					fmt.Printf("   %-12s %10.0f msgs/s %6.2fx raw (key streams again with %d messages, under the CPU profiler; not in the figures)\n   %-12s %s\n",
						"profiled", r.rate, r.rate/t.raw, 5*t.msgs, "", describeCPU(*modesSplitProfile))
				}
			}
		}
		s.throughput = append(s.throughput, t)
	}

	burst(adapter.DeliveryPerKey)
	latency(adapter.DeliveryPerKey)
	s.print()
	return s.chart()
}

// newKeys is a live consumer of messages each on a key of its own: raw
// JetStream or an ordered subscription in a delivery mode.
type newKeys struct {
	subject func(i int) string
	header  func(i int) nats.Header
	stop    func() // stops consuming and deletes what was created
}

// startNewKeys starts consuming before anything is published, so every key
// is new to the subscription. onMsg runs in the handler, before the ack.
func (b *bench) startNewKeys(mode adapter.DeliveryMode, onMsg func(data []byte, attempt int)) newKeys {
	ctx := context.Background()
	if mode == rawJetStream {
		stream := b.name("modes-raw")
		s, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}, Storage: jetstream.FileStorage})
		check(err)
		cons, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1000})
		check(err)
		cc, err := cons.Consume(func(m jetstream.Msg) {
			attempt := 1
			if meta, err := m.Metadata(); err == nil {
				attempt = int(meta.NumDelivered)
			}
			onMsg(m.Data(), attempt)
			_ = m.Ack()
		})
		check(err)
		return newKeys{
			subject: func(i int) string { return stream + ".k." + strconv.Itoa(i) },
			header:  func(int) nats.Header { return nil },
			stop: func() {
				cc.Stop()
				_ = b.js.DeleteStream(ctx, stream)
			},
		}
	}
	topicID, sub, cleanup := b.modeTopic("modes", mode)
	stopReceive := receiveUntilStopped(sub, func(m *adapter.Message) {
		onMsg(m.Data, m.DeliveryAttempt)
		m.Ack()
	})
	return newKeys{
		subject: func(i int) string { return keyrouter.KeyedSubject(project, topicID, "device-"+strconv.Itoa(i)) },
		header:  func(i int) nats.Header { return nats.Header{"Jetorder-Ordering-Key": {"device-" + strconv.Itoa(i)}} },
		stop: func() {
			stopReceive()
			cleanup()
		},
	}
}

// modeTopic creates a topic and an ordered subscription to it in mode;
// cleanup deletes both, the topic first: deleting its stream removes
// thousands of per-key consumers at once, where the subscription's delete
// would remove them one by one.
func (b *bench) modeTopic(prefix string, mode adapter.DeliveryMode) (string, *adapter.Subscription, func()) {
	return b.modeTopicSplit(prefix, mode, 0)
}

// modeTopicSplit is modeTopic with a topic of keyStreams key streams (and
// a partitioned subscription with as many partitions) when keyStreams > 1.
func (b *bench) modeTopicSplit(prefix string, mode adapter.DeliveryMode, keyStreams int) (string, *adapter.Subscription, func()) {
	ctx := context.Background()
	topicID := b.name(prefix + "-" + string(mode))
	topic, err := b.client.CreateTopicWithConfig(ctx, topicID, &adapter.TopicConfig{KeyStreams: keyStreams})
	check(err)
	partitions := partitionsOf(mode)
	if keyStreams > 1 {
		partitions = keyStreams
	}
	sub, err := b.client.CreateSubscription(ctx, topicID+"-sub",
		adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, Delivery: mode, Partitions: partitions})
	check(err)
	return topicID, sub, func() {
		_ = topic.Delete(ctx)
		_ = sub.Delete(ctx)
	}
}

// receiveUntilStopped runs Receive on sub until the returned stop is called.
func receiveUntilStopped(sub *adapter.Subscription, handle func(*adapter.Message)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- sub.Receive(ctx, func(_ context.Context, m *adapter.Message) { handle(m) })
	}()
	return func() {
		cancel()
		check(<-done)
	}
}

// peakWatch samples the account's JetStream consumers and the process RSS
// while a run goes on.
type peakWatch struct {
	stop, done chan struct{}
	consumers  int
	rssMiB     int
}

func (b *bench) watchPeaks() *peakWatch {
	w := &peakWatch{stop: make(chan struct{}), done: make(chan struct{})}
	sample := func() {
		w.consumers = max(w.consumers, b.accountConsumers())
		w.rssMiB = max(w.rssMiB, rssMiB())
	}
	go func() {
		defer close(w.done)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			sample()
			select {
			case <-t.C:
			case <-w.stop:
				sample()
				return
			}
		}
	}()
	return w
}

func (w *peakWatch) end() (consumers, rssMiB int) {
	close(w.stop)
	<-w.done
	return w.consumers, w.rssMiB
}

// rssMiB is the process's resident set size, 0 if unknown.
func rssMiB() int {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			kb, _ := strconv.Atoi(strings.Fields(line)[1])
			return kb / 1024
		}
	}
	return 0
}

// accountConsumers is the account's JetStream consumer count; -1 when the
// server does not answer in time (it may be busy with thousands of
// consumers).
func (b *bench) accountConsumers() int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := b.js.AccountInfo(ctx)
	if err != nil {
		return -1
	}
	return info.Consumers
}

// settle waits, after a run's clean-up, until the account is back to the
// consumers it had before, so a run does not weigh on the next.
func (b *bench) settle(before int) {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if now := b.accountConsumers(); now >= 0 && now <= before {
			return
		}
	}
}

// publishAsync publishes m without waiting for its ack, waiting for the
// outstanding acks instead of failing when too many are pending.
func (b *bench) publishAsync(m *nats.Msg) {
	for {
		_, err := b.js.PublishMsgAsync(m)
		if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			check(err)
			return
		}
		<-b.js.PublishAsyncComplete()
	}
}

type burstResult struct {
	keys, delivered, redelivered int
	published                    time.Duration // publishing all keys, acks included
	elapsed                      time.Duration // first publish to last delivery, or to the cap
	consumers, rssMiB            int           // peaks while it ran
	baseConsumers, baseRSSMiB    int           // before it started
}

func (r burstResult) finished() bool { return r.delivered >= r.keys }

func (r burstResult) rate() float64 { return float64(r.delivered) / r.elapsed.Seconds() }

func (r burstResult) describe(raw burstResult) string {
	out := fmt.Sprintf("all %d delivered in %v (%.0f keys/s, %s raw)", r.keys, r.elapsed.Round(10*time.Millisecond), r.rate(), ratio(r.rate()/raw.rate()))
	if !r.finished() {
		out = fmt.Sprintf("NOT FINISHED: %d of %d delivered in %v (%.0f keys/s, %s raw)",
			r.delivered, r.keys, r.elapsed.Round(10*time.Millisecond), r.rate(), ratio(r.rate()/raw.rate()))
	}
	return out + fmt.Sprintf("; published in %v; peak consumers %d (%d before); peak RSS %d MiB (%d before); %d redelivered",
		r.published.Round(10*time.Millisecond), r.consumers, r.baseConsumers, r.rssMiB, r.baseRSSMiB, r.redelivered)
}

// newKeyBurst publishes one message to each of keys new keys into a live
// consumer and waits, at most limit, for all of them to be delivered.
func (b *bench) newKeyBurst(mode adapter.DeliveryMode, keys int, limit time.Duration) burstResult {
	before := b.accountConsumers()
	res := burstResult{keys: keys, baseConsumers: before, baseRSSMiB: rssMiB()}
	var got, redelivered, lastAt atomic.Int64
	done := make(chan struct{})
	run := b.startNewKeys(mode, func(_ []byte, attempt int) {
		if attempt > 1 {
			redelivered.Add(1)
			return
		}
		if got.Add(1) == int64(keys) {
			lastAt.Store(time.Now().UnixNano())
			close(done)
		}
	})
	watch := b.watchPeaks()
	start := time.Now()
	// fill, but waiting when the server falls behind: per-key delivery keeps
	// it busy creating consumers while the keys are published.
	payload := make([]byte, *payloadSize)
	for i := range keys {
		b.publishAsync(&nats.Msg{Subject: run.subject(i), Header: run.header(i), Data: payload})
		if i%5000 == 4999 {
			<-b.js.PublishAsyncComplete()
		}
	}
	<-b.js.PublishAsyncComplete()
	res.published = time.Since(start)
	select {
	case <-done:
		res.elapsed = time.Unix(0, lastAt.Load()).Sub(start)
	case <-time.After(limit - res.published):
		res.elapsed = time.Since(start)
	}
	res.delivered, res.redelivered = int(got.Load()), int(redelivered.Load())
	res.consumers, res.rssMiB = watch.end()
	run.stop()
	b.settle(before)
	return res
}

type latencyResult struct {
	sent, delivered int
	sending         time.Duration // publishing, paced
	elapsed         time.Duration // first publish to last delivery
	d               []time.Duration
}

// percentile is the p-th percentile over every sent message; ok is false
// when it falls on a message that was not delivered.
func (r latencyResult) percentile(p float64) (d time.Duration, ok bool) {
	if r.sent == 0 {
		return 0, false
	}
	i := min(int(float64(r.sent)*p), r.sent-1)
	if i >= len(r.d) {
		return 0, false
	}
	return r.d[i], true
}

func (r latencyResult) max() (time.Duration, bool) {
	if len(r.d) == 0 || len(r.d) < r.sent {
		return 0, false
	}
	return r.d[len(r.d)-1], true
}

func (r latencyResult) format(d time.Duration, ok bool) string {
	if !ok {
		return "undelivered"
	}
	if d >= time.Millisecond {
		return d.Round(100 * time.Microsecond).String()
	}
	return d.Round(time.Microsecond).String()
}

func (r latencyResult) describe() string {
	p50, ok50 := r.percentile(0.50)
	p99, ok99 := r.percentile(0.99)
	mx, okMax := r.max()
	return fmt.Sprintf("p50 %s p99 %s max %s; sent %d at %.0f/s, delivered %d (%.0f keys/s over %v)",
		r.format(p50, ok50), r.format(p99, ok99), r.format(mx, okMax), r.sent, r.sendRate(), r.delivered,
		r.deliverRate(), r.elapsed.Round(10*time.Millisecond))
}

func (r latencyResult) sendRate() float64 { return float64(r.sent) / r.sending.Seconds() }

func (r latencyResult) deliverRate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.delivered) / r.elapsed.Seconds()
}

// newKeyLatency publishes rate messages per second for dur, each on a new
// key, into a live consumer and measures publish-to-handler latency.
func (b *bench) newKeyLatency(mode adapter.DeliveryMode, rate int, dur time.Duration) latencyResult {
	before := b.accountConsumers()
	var c collector
	var lastAt atomic.Int64
	run := b.startNewKeys(mode, func(data []byte, attempt int) {
		if attempt == 1 {
			c.add(data)
			lastAt.Store(time.Now().UnixNano())
		}
	})
	start := time.Now()
	sent := pace(rate, dur, func(i int, stamp []byte) {
		b.publishAsync(&nats.Msg{Subject: run.subject(i), Header: run.header(i), Data: stamp})
	})
	sending := time.Since(start)
	<-b.js.PublishAsyncComplete()
	for deadline := time.Now().Add(*modesDrain); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		c.mu.Lock()
		got := len(c.d)
		c.mu.Unlock()
		if got >= sent {
			break
		}
	}
	c.mu.Lock()
	d := slices.Clone(c.d)
	c.mu.Unlock()
	run.stop()
	b.settle(before)
	slices.Sort(d)
	elapsed := time.Unix(0, lastAt.Load()).Sub(start)
	return latencyResult{sent: sent, delivered: len(d), sending: sending, elapsed: elapsed, d: d}
}

type throughputResult struct {
	rate      float64
	startup   time.Duration // Receive to first delivery
	delivered int
	msgs      int
}

func (r throughputResult) describe() string {
	out := fmt.Sprintf("first delivery after %v", r.startup.Round(time.Millisecond))
	if r.delivered < r.msgs {
		out = fmt.Sprintf("NOT FINISHED within %v: %d of %d delivered; ", *modesCap, r.delivered, r.msgs) + out
	}
	return out
}

type throughputCase struct {
	keys, msgs         int
	baselineAckPending int
	raw                float64
	// layoutBaseline adds raw JetStream consuming through consumers laid
	// out like a partitioned subscription's, to tell the server's share of
	// the partitioned figure from the adapter's.
	layoutBaseline bool
	rawLayout      float64
	rawSplit       float64 // rawStreamPerPartition
	rawOneMulti    float64 // rawOneConsumer with every partition's filter
	rawOneKeyed    float64 // rawOneConsumer with the keyed filter
	rawOneAll      float64 // rawOneConsumer without a filter
	modes          map[adapter.DeliveryMode]throughputResult
	split          throughputResult // partitioned on a topic with -modes-key-streams key streams (layoutBaseline only)
}

// partitionsOf is the partition count the runs give mode's subscriptions.
func partitionsOf(mode adapter.DeliveryMode) int {
	switch {
	case mode != adapter.DeliveryPartitioned:
		return 0
	case *modesParts > 0:
		return *modesParts
	}
	return defaultPartitions
}

// The adapter's defaults for a partitioned subscription.
const (
	defaultPartitions      = 8
	defaultPartitionBuffer = 1000
)

// filledTopic creates an adapter topic and publishes msgs messages over
// keys keys to it, as the raw baselines read them; cleanup deletes it.
func (b *bench) filledTopic(prefix string, keys, msgs int) (topicID string, cleanup func()) {
	ctx := context.Background()
	topicID = b.name(prefix)
	topic, err := b.client.CreateTopic(ctx, topicID)
	check(err)
	subject, hdr := keyed(topicID, "key", keys)
	b.fill(subject, hdr, msgs)
	return topicID, func() { _ = topic.Delete(ctx) }
}

// rawPartitionLayout times raw pull consumers, each with the filter subjects
// of one partition of a partitioned subscription and MaxAckPending of its
// buffer, consuming and acking msgs messages published first over keys
// keys of an adapter topic, from first delivery to last ack.
func (b *bench) rawPartitionLayout(keys, msgs, partitions int) float64 {
	ctx := context.Background()
	topicID, cleanup := b.filledTopic("modes-layout", keys, msgs)
	defer cleanup()
	var consumers []jetstream.Consumer
	for i := range partitions {
		cons, err := b.js.CreateConsumer(ctx, keyrouter.StreamName(project, topicID), jetstream.ConsumerConfig{
			Durable:       "p" + strconv.Itoa(i),
			AckPolicy:     jetstream.AckExplicitPolicy,
			MaxAckPending: defaultPartitionBuffer,
			FilterSubject: keyrouter.PartitionFilter(project, topicID, partitions, i),
		})
		check(err)
		consumers = append(consumers, cons)
	}
	return consumeAndAck(msgs, consumers...)
}

// rawStreamPerPartition is rawPartitionLayout with the partitions apart in
// streams of their own, one per partition (its subjects the partition's
// filter), each read by one pull consumer without a filter: what the
// server can do for a partitioned subscription whose partitions it need
// not pick out of one stream (the ceiling of a storage layout that splits
// a topic by partition).
func (b *bench) rawStreamPerPartition(keys, msgs, partitions int) float64 {
	ctx := context.Background()
	topicID := b.name("modes-split")
	streams := make([]jetstream.Stream, partitions)
	for i := range partitions {
		name := keyrouter.StreamName(project, topicID) + "_" + strconv.Itoa(i)
		s, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{keyrouter.PartitionFilter(project, topicID, partitions, i)}, Storage: jetstream.FileStorage})
		check(err)
		defer func() { _ = b.js.DeleteStream(ctx, name) }()
		streams[i] = s
	}
	subject, hdr := keyed(topicID, "key", keys)
	b.fill(subject, hdr, msgs)
	var consumers []jetstream.Consumer
	for _, s := range streams {
		cons, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "p", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: defaultPartitionBuffer})
		check(err)
		consumers = append(consumers, cons)
	}
	return consumeAndAck(msgs, consumers...)
}

// oneFilter is what rawOneConsumer's consumer filters on.
type oneFilter int

const (
	everyPartition oneFilter = iota // the partitions' filters, as a receiver holding them all would list them
	keyedOnly                       // one filter for every keyed message of the topic
	noFilter                        // none: the topic's whole stream
)

// rawOneConsumer is rawPartitionLayout with one pull consumer over every
// partition, the ceiling of a layout with one consumer per receiving
// process, filtering as filter says.
func (b *bench) rawOneConsumer(keys, msgs, partitions int, filter oneFilter) float64 {
	ctx := context.Background()
	topicID, cleanup := b.filledTopic("modes-one", keys, msgs)
	defer cleanup()
	cfg := jetstream.ConsumerConfig{Durable: "one", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: defaultPartitionBuffer}
	switch filter {
	case everyPartition:
		for i := range partitions {
			cfg.FilterSubjects = append(cfg.FilterSubjects, keyrouter.PartitionFilter(project, topicID, partitions, i))
		}
	case keyedOnly:
		cfg.FilterSubject = keyrouter.KeyedFilter(project, topicID)
	}
	cons, err := b.js.CreateConsumer(ctx, keyrouter.StreamName(project, topicID), cfg)
	check(err)
	return consumeAndAck(msgs, cons)
}

// modeThroughput times an ordered subscription in mode delivering msgs
// messages published first over keys keys, from the first delivery to the
// last ack, like the ordered runs; a run that takes longer than the cap is
// cut short and its rate is what it delivered so far.
func (b *bench) modeThroughput(mode adapter.DeliveryMode, keys, msgs int) throughputResult {
	return b.modeThroughputSplit(mode, keys, msgs, 0)
}

// modeThroughputSplit is modeThroughput on a topic with keyStreams key
// streams (modeTopicSplit).
func (b *bench) modeThroughputSplit(mode adapter.DeliveryMode, keys, msgs, keyStreams int) throughputResult {
	before := b.accountConsumers()
	topicID, sub, cleanup := b.modeTopicSplit("modes-tput", mode, keyStreams)
	subject, hdr := keyed(topicID, "key", keys)
	b.fill(subject, hdr, msgs)
	stopProfile := b.startDeliveryProfile()

	var got, first, last atomic.Int64
	done := make(chan struct{})
	start := time.Now()
	stop := receiveUntilStopped(sub, func(m *adapter.Message) {
		first.CompareAndSwap(0, time.Now().UnixNano())
		m.Ack()
		if m.DeliveryAttempt > 1 {
			return
		}
		n := got.Add(1)
		last.Store(time.Now().UnixNano())
		if n == int64(msgs) {
			close(done)
		}
	})
	select {
	case <-done:
	case <-time.After(*modesCap):
	}
	stopProfile()
	stop()
	cleanup()
	b.settle(before)
	firstAt, lastAt := time.Unix(0, first.Load()), time.Unix(0, last.Load())
	res := throughputResult{startup: firstAt.Sub(start), delivered: int(got.Load()), msgs: msgs}
	if res.delivered > 1 {
		res.rate = float64(res.delivered-1) / lastAt.Sub(firstAt).Seconds()
	}
	return res
}

type modesSummary struct {
	burst      map[adapter.DeliveryMode]burstResult
	latency    map[adapter.DeliveryMode]latencyResult
	throughput []*throughputCase
}

func (s *modesSummary) print() {
	const row = "%-38s %-22s %-24s %-24s\n"
	fmt.Printf("\ndelivery modes summary (ratios against raw JetStream of the same run)\n")
	fmt.Printf(row, "measurement", "raw JetStream", "partitioned", "per-key")
	cells := func(f func(adapter.DeliveryMode) string) (string, string, string) {
		return f(rawJetStream), f(adapter.DeliveryPartitioned), f(adapter.DeliveryPerKey)
	}
	line := func(label string, f func(adapter.DeliveryMode) string) {
		a, p, k := cells(f)
		fmt.Printf(row, label, a, p, k)
	}

	raw := s.burst[rawJetStream]
	line(fmt.Sprintf("1. %d new keys: delivered", raw.keys), func(m adapter.DeliveryMode) string {
		r := s.burst[m]
		if !r.finished() {
			return fmt.Sprintf("%d in %v (cap)", r.delivered, r.elapsed.Round(time.Second))
		}
		return fmt.Sprintf("all in %v", r.elapsed.Round(10*time.Millisecond))
	})
	line("   keys/s (vs raw)", func(m adapter.DeliveryMode) string {
		r := s.burst[m]
		if m == rawJetStream {
			return fmt.Sprintf("%.0f", r.rate())
		}
		return fmt.Sprintf("%.0f (%s)", r.rate(), ratio(r.rate()/raw.rate()))
	})
	line("   peak consumers (account)", func(m adapter.DeliveryMode) string { return strconv.Itoa(s.burst[m].consumers) })
	line("   peak RSS (process, server incl.)", func(m adapter.DeliveryMode) string { return fmt.Sprintf("%d MiB", s.burst[m].rssMiB) })

	line(fmt.Sprintf("2. %d new keys/s for %v: p50", *modesRate, *modesDuration), func(m adapter.DeliveryMode) string {
		return s.latency[m].format(s.latency[m].percentile(0.50))
	})
	line("   p99", func(m adapter.DeliveryMode) string { return s.latency[m].format(s.latency[m].percentile(0.99)) })
	line("   max", func(m adapter.DeliveryMode) string { return s.latency[m].format(s.latency[m].max()) })
	line("   sent/s, delivered/s", func(m adapter.DeliveryMode) string {
		r := s.latency[m]
		return fmt.Sprintf("%.0f, %.0f", r.sendRate(), r.deliverRate())
	})
	line("   delivered of sent", func(m adapter.DeliveryMode) string {
		r := s.latency[m]
		return fmt.Sprintf("%d of %d", r.delivered, r.sent)
	})

	for i, t := range s.throughput {
		line(fmt.Sprintf("%d. %s: msgs/s (vs raw)", i+3, plural(t.keys, "key")), func(m adapter.DeliveryMode) string {
			if m == rawJetStream {
				return fmt.Sprintf("%.0f", t.raw)
			}
			r := t.modes[m]
			out := fmt.Sprintf("%.0f (%s)", r.rate, ratio(r.rate/t.raw))
			if r.delivered < r.msgs {
				out += " unfinished"
			}
			return out
		})
		line("   raw is one consumer, MaxAckPending", func(m adapter.DeliveryMode) string {
			if m == rawJetStream {
				return strconv.Itoa(t.baselineAckPending)
			}
			return ""
		})
		if t.layoutBaseline && *modesSplit > 1 {
			fmt.Printf(row, fmt.Sprintf("   partitioned, %d key streams", *modesSplit), "", fmt.Sprintf("%.0f (%s)", t.split.rate, ratio(t.split.rate/t.raw)), "")
		}
		if t.layoutBaseline {
			fmt.Printf(row, "   raw with the partitions' filters", fmt.Sprintf("%.0f (%s)", t.rawLayout, ratio(t.rawLayout/t.raw)),
				fmt.Sprintf("%.2fx of that", t.modes[adapter.DeliveryPartitioned].rate/t.rawLayout), "")
			fmt.Printf(row, "   raw, a stream per partition", fmt.Sprintf("%.0f (%s)", t.rawSplit, ratio(t.rawSplit/t.raw)),
				fmt.Sprintf("%.2fx of that", t.modes[adapter.DeliveryPartitioned].rate/t.rawSplit), "")
			fmt.Printf(row, "   raw, one consumer, every filter", fmt.Sprintf("%.0f (%s)", t.rawOneMulti, ratio(t.rawOneMulti/t.raw)),
				fmt.Sprintf("%.2fx of that", t.modes[adapter.DeliveryPartitioned].rate/t.rawOneMulti), "")
			fmt.Printf(row, "   raw, one consumer, keyed filter", fmt.Sprintf("%.0f (%s)", t.rawOneKeyed, ratio(t.rawOneKeyed/t.raw)),
				fmt.Sprintf("%.2fx of that", t.modes[adapter.DeliveryPartitioned].rate/t.rawOneKeyed), "")
			fmt.Printf(row, "   raw, one consumer, no filter", fmt.Sprintf("%.0f (%s)", t.rawOneAll, ratio(t.rawOneAll/t.raw)),
				fmt.Sprintf("%.2fx of that", t.modes[adapter.DeliveryPartitioned].rate/t.rawOneAll), "")
		}
	}

	part := s.latency[adapter.DeliveryPartitioned]
	p99, ok := part.percentile(0.99)
	many := s.throughput[0]
	one := s.throughput[1]
	fmt.Printf("\ntargets for partitioned:\n")
	fmt.Printf("  new-key latency p99 < 50ms: %s (p99 %s)\n", verdict(ok && p99 < 50*time.Millisecond), part.format(p99, ok))
	vsRaw := many.modes[adapter.DeliveryPartitioned].rate / many.raw
	fmt.Printf("  %s >= 0.8x raw consume-and-ack: %s (%s)\n", plural(many.keys, "key"), verdict(vsRaw >= 0.8), ratio(vsRaw))
	if *modesSplit > 1 {
		vsRaw := many.split.rate / many.raw
		fmt.Printf("  the same on a topic of %d key streams: %s (%s)\n", *modesSplit, verdict(vsRaw >= 0.8), ratio(vsRaw))
	}
	vsPerKey := one.modes[adapter.DeliveryPartitioned].rate / one.modes[adapter.DeliveryPerKey].rate
	fmt.Printf("  %s no worse than per-key: %s (partitioned/per-key %.2fx)\n\n", plural(one.keys, "key"), verdict(vsPerKey >= 1), vsPerKey)
}

// chart draws the summary.
func (s *modesSummary) chart() chart {
	label := map[adapter.DeliveryMode]string{rawJetStream: "raw JetStream", adapter.DeliveryPartitioned: "partitioned", adapter.DeliveryPerKey: "per-key"}
	modes := []adapter.DeliveryMode{rawJetStream, adapter.DeliveryPartitioned, adapter.DeliveryPerKey}
	raw := s.burst[rawJetStream]
	burst := barGroup{title: fmt.Sprintf("1. %s new keys, one message each, into a live subscription: keys/s", count(float64(raw.keys)))}
	rss := barGroup{title: "1. peak RSS of the process (server and clients) meanwhile, MiB: lower is better"}
	for _, m := range modes {
		r := s.burst[m]
		text := count(r.rate())
		if m != rawJetStream {
			text += " (" + ratio(r.rate()/raw.rate()) + " raw)"
		}
		if !r.finished() {
			text += fmt.Sprintf(", not finished: %s of %s in %v", count(float64(r.delivered)), count(float64(r.keys)), r.elapsed.Round(time.Second))
		}
		burst.bars = append(burst.bars, bar{label: label[m], value: r.rate(), text: text, baseline: m == rawJetStream})
		rss.bars = append(rss.bars, bar{label: label[m], value: float64(r.rssMiB), text: fmt.Sprintf("%d MiB; at most %s", r.rssMiB, plural(r.consumers, "consumer")), baseline: m == rawJetStream})
	}
	lat := barGroup{title: fmt.Sprintf("2. %s new keys/s for %v: p99 publish to handler, lower is better", count(float64(*modesRate)), *modesDuration)}
	for _, m := range modes {
		r := s.latency[m]
		d, ok := r.percentile(0.99)
		text := r.format(d, ok)
		if ok && m != rawJetStream {
			if rd, rok := s.latency[rawJetStream].percentile(0.99); rok {
				text += " (" + ratio(d.Seconds()/rd.Seconds()) + " raw)"
			}
		}
		text += fmt.Sprintf("; %s of %s delivered", count(float64(r.delivered)), count(float64(r.sent)))
		lat.bars = append(lat.bars, durationBar(label[m], d, ok, m == rawJetStream, text))
	}
	groups := []barGroup{burst, rss, lat}
	for i, t := range s.throughput {
		g := barGroup{title: fmt.Sprintf("%d. %s, %s messages published first: messages/s", i+3, plural(t.keys, "key"), count(float64(t.msgs))),
			bars: []bar{baseBar(fmt.Sprintf("raw JetStream, MaxAckPending %d", t.baselineAckPending), t.raw)}}
		if t.layoutBaseline {
			g.bars = append(g.bars, baseBar(fmt.Sprintf("raw, the partitions' %d filters", partitionsOf(adapter.DeliveryPartitioned)), t.rawLayout,
				vs(t.rawLayout/t.raw, "raw")),
				baseBar(fmt.Sprintf("raw, a stream per partition (%d)", partitionsOf(adapter.DeliveryPartitioned)), t.rawSplit, vs(t.rawSplit/t.raw, "raw")),
				baseBar("raw, one consumer with every partition's filter", t.rawOneMulti, vs(t.rawOneMulti/t.raw, "raw")))
		}
		for _, m := range deliveryModes {
			r := t.modes[m]
			b := rateBar(label[m], r.rate, vs(r.rate/t.raw, "raw"))
			if r.delivered < r.msgs {
				b.text += ", unfinished"
			}
			g.bars = append(g.bars, b)
		}
		groups = append(groups, g)
	}
	return chart{name: "modes", title: "Delivery modes: partitioned and per-key, against raw JetStream", groups: groups,
		note: fmt.Sprintf("one run of each; partitioned with %s and a buffer of %s", plural(partitionsOf(adapter.DeliveryPartitioned), "partition"), count(defaultPartitionBuffer))}
}

// ratio shows small ratios with a third digit, so 0.004x does not read as
// nothing at all.
func ratio(x float64) string {
	if x < 0.01 {
		return fmt.Sprintf("%.3fx", x)
	}
	return fmt.Sprintf("%.2fx", x)
}

func verdict(met bool) string {
	if met {
		return "met"
	}
	return "MISSED"
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return count(float64(n)) + " " + noun + "s"
}
