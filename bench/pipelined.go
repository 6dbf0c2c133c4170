package main

import (
	"context"
	"flag"
	"fmt"
	"slices"

	"cloud.google.com/go/pubsub/v2"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/pubsubapi"
)

var (
	pipeOutstanding = flag.Int("pipe-outstanding", 1000, "pipelined run: the Go client's MaxOutstandingMessages and the sidecar's --max-outstanding-messages")
	pipeBuffer      = flag.Int("pipe-partition-buffer", 0, "pipelined run: the subscriptions' partition buffer (0: the adapter's default, 1000)")
	pipeProfile     = flag.String("pipe-cpuprofile", "", "pipelined run: repeat each round's 256-key pipelined delivery through the Go client under the CPU profiler (publishing left out; not in the figures) and write the profile to FILE.<round>; not with -cpuprofile")
)

// pipelinedRuns measures delivery through the sidecar's gRPC API with
// Google's Go client on partitioned subscriptions, strict and pipelined
// (jetorder-ordering), beside the library's Receive (strict) in the same
// round: 256 keys, and a single hot key.
func (b *bench) pipelinedRuns() chart {
	strict := b.startSidecarWith(pubsubapi.Config{Ordering: pubsubapi.StrictOrdering})
	defer strict.stop()
	piped := b.startSidecarWith(pubsubapi.Config{Ordering: pubsubapi.PipelinedOrdering, MaxOutstandingMessages: *pipeOutstanding})
	defer piped.stop()
	library := func(sub *adapter.Subscription, done func()) func(context.Context) error {
		return func(ctx context.Context) error {
			return sub.Receive(ctx, func(_ context.Context, m *adapter.Message) { m.Ack(); done() })
		}
	}
	goClient := func(s *sidecarBench) func(sub *adapter.Subscription, done func()) func(context.Context) error {
		return func(sub *adapter.Subscription, done func()) func(context.Context) error {
			gs := s.client.Subscriber(sub.ID())
			gs.ReceiveSettings.MaxOutstandingMessages = *pipeOutstanding
			return func(ctx context.Context) error {
				return gs.Receive(ctx, func(_ context.Context, m *pubsub.Message) { m.Ack(); done() })
			}
		}
	}
	cfg := adapter.SubscriptionConfig{Delivery: adapter.DeliveryPartitioned, PartitionBuffer: *pipeBuffer}
	fmt.Printf("%-5s %-30s %10s %10s %8s %10s %8s\n", "round", "pipelined run (partitioned)", "library", "strict", "vs lib", "pipelined", "vs lib")
	type row struct{ lib, strict, piped float64 }
	var many, one []row
	for round := 1; round <= *rounds; round++ {
		for _, r := range []struct {
			keys, msgs, strictMsgs int
			out                    *[]row
		}{{256, n(20_000), n(20_000), &many}, {1, n(10_000), n(300), &one}} {
			var x row
			x.lib = b.deliverIn(cfg, r.keys, r.msgs, library)
			// Strict through the Go client moves about ten messages a
			// second on one key (it acks every 100 ms): fewer of them.
			x.strict = b.deliverIn(cfg, r.keys, r.strictMsgs, goClient(strict))
			x.piped = b.deliverIn(cfg, r.keys, r.msgs, goClient(piped))
			*r.out = append(*r.out, x)
			fmt.Printf("%-5d %-30s %10.0f %10.0f %7.3fx %10.0f %7.3fx\n", round, fmt.Sprintf("%s, %d msgs, Go client", plural(r.keys, "key"), r.msgs),
				x.lib, x.strict, x.strict/x.lib, x.piped, x.piped/x.lib)
			if *pipeProfile != "" && r.keys > 1 {
				// A repeat, so that the profiler's cost stays out of the figures.
				b.deliveryProfile = fmt.Sprintf("%s.%d", *pipeProfile, round)
				rate := b.deliverIn(cfg, r.keys, r.msgs, goClient(piped))
				fmt.Printf("      pipelined again under the CPU profiler (not in the figures): %.0f msgs/s, %.3fx; %s\n",
					rate, rate/x.lib, describeCPU(fmt.Sprintf("%s.%d", *pipeProfile, round)))
			}
		}
	}
	med := func(rows []row, v func(row) float64) float64 {
		out := make([]float64, len(rows))
		for i, r := range rows {
			out[i] = v(r)
		}
		return median(out)
	}
	ratios := func(rows []row) []float64 {
		var out []float64
		for _, r := range rows {
			out = append(out, r.piped/r.lib)
		}
		return out
	}
	rm, ro := ratios(many), ratios(one)
	fmt.Printf("pipelined, 256 keys, median of %d rounds: the Go client through the sidecar at %.2fx the library's Receive [%.2f-%.2f] (target 0.5x)\n",
		*rounds, median(rm), slices.Min(rm), slices.Max(rm))
	fmt.Printf("pipelined, 1 key, median of %d rounds: %.0f msgs/s through the Go client (target 1,000), %.2fx the library's Receive [%.2f-%.2f]; strict %.0f msgs/s\n",
		*rounds, med(one, func(r row) float64 { return r.piped }), median(ro), slices.Min(ro), slices.Max(ro), med(one, func(r row) float64 { return r.strict }))
	group := func(keys int, rows []row) barGroup {
		return barGroup{title: fmt.Sprintf("%s, partitioned, Google's Go client through the sidecar: messages/s", plural(keys, "key")), bars: []bar{
			baseBar("library Receive (strict)", med(rows, func(r row) float64 { return r.lib })),
			rateBar("gRPC, strict", med(rows, func(r row) float64 { return r.strict }), vs(med(rows, func(r row) float64 { return r.strict / r.lib }), "library")),
			rateBar("gRPC, pipelined", med(rows, func(r row) float64 { return r.piped }), vs(med(rows, func(r row) float64 { return r.piped / r.lib }), "library")),
		}}
	}
	return chart{name: "pipelined", title: "Pipelined ordering through the sidecar, against the library", groups: []barGroup{group(256, many), group(1, one)},
		note: "median of " + plural(len(many), "round") + ", a ratio the median of each round's"}
}
