package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/embedded"
	"github.com/jetorder/jetorder/internal/pubsubapi"
)

// durPolicies are the sync policies compared; lazy, JetStream's default,
// is what the others are divided by.
var durPolicies = []embedded.SyncPolicy{embedded.SyncLazy, embedded.SyncGroup, embedded.SyncAlways}

// durPaths are the ways of publishing measured, the baseline first.
var durPaths = [3]string{"raw", "library", "gRPC"}

// durKeys are the key counts of the throughput figures.
var durKeys = []int{100, 10_000}

// durFigures are one policy's figures, each indexed as durPaths.
type durFigures struct {
	rates map[int][3]float64 // msgs/s by key count, median of the rounds
	lat   [3]latency
	stats embedded.SyncStats
}

// durability measures publishing under each sync policy, each on a server
// of its own in a fresh store on the disk of the temporary directory (on
// tmpfs fsync costs nothing, so /dev/shm would hide what is measured).
func durability() {
	fmt.Printf("durability: publishing under each sync policy (every result awaited, %d-byte payloads); own embedded server per policy\n", *payloadSize)
	fmt.Printf("  baselines: throughput: raw JetStream async publish, acks awaited per 1,000, then srv.Sync (group commit; a no-op under lazy and always)\n")
	fmt.Printf("             latency: raw JetStream sync publish, then srv.Sync; library and gRPC with their default 10 ms batching delay\n")
	figs := map[embedded.SyncPolicy]durFigures{}
	for _, p := range durPolicies {
		figs[p] = durabilityPolicy(p)
	}
	durabilitySummary(figs)
}

// durabilityPolicy measures one policy on a server of its own.
func durabilityPolicy(policy embedded.SyncPolicy) durFigures {
	dir, err := os.MkdirTemp("", "jetorder-durability-")
	check(err)
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(embedded.Config{StoreDir: dir, Sync: policy})
	check(err)
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.ClientURL(), nats.ReconnectBufSize(-1))
	check(err)
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(10_000))
	check(err)
	// As internal/sidecar wires Config.Sync: under group every client, the
	// sidecar's broker's too, resolves a publish only after srv.Sync.
	opts := []adapter.Option{adapter.WithKeyConsumerIdleTimeout(*idleTimeout)}
	if policy == embedded.SyncGroup {
		opts = append(opts, adapter.WithDurableSync(srv.Sync))
	}
	client, err := adapter.NewClient(nc, project, opts...)
	check(err)
	defer client.Close()
	b := &bench{nc: nc, js: js, client: client}
	// Publish is not among the RPCs internal/sidecar's interceptor syncs
	// (the adapter does), so this serves publishing as the sidecar does.
	s := b.startSidecarWith(pubsubapi.Config{}, opts...)
	defer s.stop()

	msgs := n(50_000)
	if policy == embedded.SyncAlways {
		msgs = n(10_000) // an fsync per write: a few thousand msgs/s
	}
	fmt.Printf("\n%-5s %-7s %-24s %10s %10s %7s %10s %7s\n", "round", "policy", "durable publish run", "raw async", "library", "vs raw", "gRPC", "vs raw")
	f := durFigures{rates: map[int][3]float64{}}
	for _, keys := range durKeys {
		var runs [3][]float64
		for round := 1; round <= *rounds; round++ {
			raw := b.rawDurable(srv, keys, msgs)
			lib, g := s.publish(keys, msgs)
			for i, v := range []float64{raw, lib, g} {
				runs[i] = append(runs[i], v)
			}
			fmt.Printf("%-5d %-7s %-24s %10.0f %10.0f %7s %10.0f %7s\n", round, policy, fmt.Sprintf("%s, %s msgs", plural(keys, "key"), count(float64(msgs))),
				raw, lib, ratio(lib/raw), g, ratio(g/raw))
		}
		f.rates[keys] = [3]float64{median(runs[0]), median(runs[1]), median(runs[2])}
	}
	f.lat = s.durableLatency(srv, 100, 1000, 5*time.Second)
	raw, lib, g := f.lat[0], f.lat[1], f.lat[2]
	fmt.Printf("%-7s publish latency at 1,000 msgs/s for 5 s over 100 keys, p50 / p99: raw sync %v / %v; library %v / %v (%s / %s raw); gRPC %v / %v (%s / %s raw)\n",
		policy, raw.p50, raw.p99, lib.p50, lib.p99, ratio(lib.p50.Seconds()/raw.p50.Seconds()), ratio(lib.p99.Seconds()/raw.p99.Seconds()),
		g.p50, g.p99, ratio(g.p50.Seconds()/raw.p50.Seconds()), ratio(g.p99.Seconds()/raw.p99.Seconds()))
	f.stats = srv.SyncStats()
	fmt.Printf("%-7s srv.SyncStats: %d rounds, %d files fsynced, busy %v\n", policy, f.stats.Rounds, f.stats.Files, f.stats.Busy.Round(time.Millisecond))
	return f
}

// rawDurable times raw async publishing of msgs messages over keys keys
// into a fresh topic, a window of 1,000 at a time: their acks awaited,
// then srv.Sync, so that under group the baseline is as durable as the
// library's results.
func (b *bench) rawDurable(srv *embedded.Server, keys, msgs int) float64 {
	ctx := context.Background()
	payload := make([]byte, *payloadSize)
	return b.timedPublish(msgs, func(topicID string, _ *adapter.Topic) {
		subject, hdr := keyed(topicID, "key", keys)
		for i := range msgs {
			_, err := b.js.PublishMsgAsync(&nats.Msg{Subject: subject(i), Data: payload, Header: hdr(i)})
			check(err)
			if i%1000 == 999 || i == msgs-1 {
				<-b.js.PublishAsyncComplete()
				check(srv.Sync(ctx))
			}
		}
	})
}

// durableLatency measures publish latency, from the call to its result,
// at rate msgs/s for dur over keys keys: raw sync publish then srv.Sync,
// the library, and Google's client through the sidecar. Each message is
// published from a goroutine of its own, so that a slow result does not
// lower the rate offered (and concurrent syncs share rounds, as the
// library's do).
func (s *sidecarBench) durableLatency(srv *embedded.Server, keys, rate int, dur time.Duration) [3]latency {
	b := s.b
	ctx := context.Background()
	payload := make([]byte, *payloadSize)
	topicID, topic, _, cleanup := b.orderedTopic("durlat")
	defer cleanup()
	subject, hdr := keyed(topicID, "key", keys)
	gp := s.client.Publisher(topicID)
	gp.EnableMessageOrdering = true
	defer gp.Stop()
	key := func(i int) string { return "key-" + strconv.Itoa(i%keys) }
	// Warm up: each key's publisher state exists before timing.
	var warm []func(context.Context) (string, error)
	for k := range keys {
		warm = append(warm, topic.Publish(ctx, &adapter.Message{Data: payload, OrderingKey: key(k)}).Get,
			gp.Publish(ctx, &pubsub.Message{Data: payload, OrderingKey: key(k)}).Get)
	}
	for _, get := range warm {
		_, err := get(ctx)
		check(err)
	}
	measure := func(publish func(i int) error) latency {
		var c collector
		sent := pace(rate, dur, func(i int, stamp []byte) {
			go func() { check(publish(i)); c.add(stamp) }()
		})
		return c.wait(sent)
	}
	raw := measure(func(i int) error {
		if _, err := b.js.PublishMsg(ctx, &nats.Msg{Subject: subject(i), Data: payload, Header: hdr(i)}); err != nil {
			return err
		}
		return srv.Sync(ctx)
	})
	lib := measure(func(i int) error {
		_, err := topic.Publish(ctx, &adapter.Message{Data: payload, OrderingKey: key(i)}).Get(ctx)
		return err
	})
	g := measure(func(i int) error {
		_, err := gp.Publish(ctx, &pubsub.Message{Data: payload, OrderingKey: key(i)}).Get(ctx)
		return err
	})
	return [3]latency{raw, lib, g}
}

// durabilitySummary prints each policy against lazy on the same path, and
// the targets: group publishing at 100 keys at least 0.5x lazy, group p99
// publish latency at 1,000 msgs/s at most 25 ms.
func durabilitySummary(figs map[embedded.SyncPolicy]durFigures) {
	lazy, group, always := figs[embedded.SyncLazy], figs[embedded.SyncGroup], figs[embedded.SyncAlways]
	const row = "%-8s %-26s %10s %10s %8s %10s %8s\n"
	fmt.Printf("\ndurability summary: each policy against lazy on the same path (msgs/s the median of %s)\n", plural(*rounds, "round"))
	fmt.Printf(row, "path", "measure", "lazy", "group", "vs lazy", "always", "vs lazy")
	for i, path := range durPaths {
		for _, keys := range durKeys {
			r := func(f durFigures) float64 { return f.rates[keys][i] }
			fmt.Printf(row, path, "msgs/s, "+plural(keys, "key"), count(r(lazy)), count(r(group)), ratio(r(group)/r(lazy)), count(r(always)), ratio(r(always)/r(lazy)))
		}
		for _, q := range []string{"p50", "p99"} {
			d := func(f durFigures) time.Duration {
				if q == "p50" {
					return f.lat[i].p50
				}
				return f.lat[i].p99
			}
			fmt.Printf(row, path, q+" latency at 1,000 msgs/s", d(lazy), d(group), ratio(d(group).Seconds()/d(lazy).Seconds()),
				d(always), ratio(d(always).Seconds()/d(lazy).Seconds()))
		}
	}
	for i := 1; i <= 2; i++ {
		r := group.rates[100][i] / lazy.rates[100][i]
		p99 := group.lat[i].p99
		fmt.Printf("target, %s under group: msgs/s at 100 keys %s lazy (>= 0.5x) %s; p99 at 1,000 msgs/s %v (<= 25ms) %s\n",
			durPaths[i], ratio(r), verdict(r >= 0.5), p99, verdict(p99 <= 25*time.Millisecond))
	}
	fmt.Println()
}
