package main

import (
	"context"
	"github.com/jetorder/jetorder/keyrouter"
	"github.com/nats-io/nats.go/jetstream"
	"sync/atomic"
	"time"

	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"

	"github.com/jetorder/jetorder/adapter"
)

func init() {
	spec := os.Getenv("SCRATCH")
	if spec == "" {
		return
	}
	scratchPartitions, _ = strconv.Atoi(os.Getenv("PARTS"))
	scratch = func(b *bench) {
		for _, f := range strings.Split(spec, ",") {
			kv := strings.Split(f, "x")
			keys, _ := strconv.Atoi(kv[0])
			msgs, _ := strconv.Atoi(kv[1])
			for _, parts := range []int{1, 8, 64} {
				fmt.Printf("raw layout parts %d keys %d msgs %d: %.0f msgs/s\n", parts, keys, msgs, b.scratchRawLayout(keys, msgs, parts))
			}
			fmt.Printf("raw single consumer: %.0f\n", b.raw(b.name("r"), msgs, 1000))
			for _, mode := range []adapter.DeliveryMode{adapter.DeliveryPartitioned} {
				r := b.modeThroughput(mode, keys, msgs)
				fmt.Printf("%s keys %d msgs %d: %.0f msgs/s; %s\n", mode, keys, msgs, r.rate, r.describe())
			}
		}
		pprof.StopCPUProfile()
		os.Exit(0)
	}
}

var _ = adapter.DeliveryPerKey

func (b *bench) scratchRawLayout(keys, msgs, parts int) float64 {
	ctx := context.Background()
	topicID := b.name("rawlayout")
	topic, err := b.client.CreateTopic(ctx, topicID)
	check(err)
	defer topic.Delete(ctx)
	subject, hdr := keyed(topicID, "key", keys)
	b.fill(subject, hdr, msgs)
	var got, first atomic.Int64
	done := make(chan struct{})
	var ccs []jetstream.ConsumeContext
	for i := range parts {
		cons, err := b.js.CreateConsumer(ctx, keyrouter.StreamName(project, topicID), jetstream.ConsumerConfig{
			Durable: fmt.Sprintf("p%d", i), AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1000,
			FilterSubjects: keyrouter.PartitionFilters(project, topicID, parts, i)})
		check(err)
		cc, err := cons.Consume(func(m jetstream.Msg) {
			first.CompareAndSwap(0, time.Now().UnixNano())
			_ = m.Ack()
			if got.Add(1) == int64(msgs) {
				close(done)
			}
		})
		check(err)
		ccs = append(ccs, cc)
	}
	<-done
	rate := float64(msgs-1) / time.Since(time.Unix(0, first.Load())).Seconds()
	for _, cc := range ccs {
		cc.Stop()
	}
	return rate
}
