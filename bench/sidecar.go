package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime/pprof"
	"strconv"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/nats-io/nats.go"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/broker"
	"github.com/jetorder/jetorder/internal/pubsubapi"
	"github.com/jetorder/jetorder/internal/push"
	"github.com/jetorder/jetorder/keyrouter"
)

// sidecarBench serves the Pub/Sub gRPC API in this process, over the same
// server, and reaches it with Google's Go client.
type sidecarBench struct {
	b      *bench
	client *pubsub.Client
	addr   string // the gRPC API's host:port
	stop   func()
}

func (b *bench) startSidecar() *sidecarBench { return b.startSidecarWith(pubsubapi.Config{}) }

// startSidecarWith is startSidecar with cfg (its PushAllow aside), and with
// opts for the broker's clients (default: the bench's idle timeout).
func (b *bench) startSidecarWith(cfg pubsubapi.Config, opts ...adapter.Option) *sidecarBench {
	if len(opts) == 0 {
		opts = []adapter.Option{adapter.WithKeyConsumerIdleTimeout(*idleTimeout)}
	}
	br := broker.New(b.nc, nil, nil, opts...)
	// Push to loopback only, the sidecar's default: the endpoint is in
	// this process.
	allow, err := push.ParseAllowList(push.DefaultAllow)
	check(err)
	cfg.PushAllow = allow
	api := pubsubapi.New(br, cfg)
	gs := grpc.NewServer(grpc.MaxRecvMsgSize(12 << 20))
	api.Register(gs)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	go func() { _ = gs.Serve(l) }()
	c, err := pubsub.NewClient(context.Background(), project,
		option.WithEndpoint(l.Addr().String()), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())), option.WithTelemetryDisabled())
	check(err)
	return &sidecarBench{b: b, client: c, addr: l.Addr().String(), stop: func() {
		_ = c.Close()
		api.Close()
		gs.Stop()
		br.Close()
	}}
}

// sidecarRound is one round of the sidecar run, in messages/s.
type sidecarRound struct {
	raw, lib, grpc, push float64 // delivery
	libPub, grpcPub      float64
}

// round compares, in one round, delivery of msgs messages over keys
// keys through the adapter's Receive, through the gRPC API with Google's
// Go client, and pushed by the sidecar to an HTTP endpoint, beside raw
// JetStream; then publishing through the adapter and the gRPC API.
func (s *sidecarBench) round(round, keys, msgs int) sidecarRound {
	b := s.b
	var r sidecarRound
	r.raw = b.raw("raw-map1000", msgs, 1000)
	r.lib = b.deliver(keys, msgs, func(sub *adapter.Subscription, done func()) func(context.Context) error {
		return func(ctx context.Context) error {
			return sub.Receive(ctx, func(_ context.Context, m *adapter.Message) { m.Ack(); done() })
		}
	})
	r.grpc = b.deliver(keys, msgs, func(sub *adapter.Subscription, done func()) func(context.Context) error {
		gs := s.client.Subscriber(sub.ID())
		return func(ctx context.Context) error {
			return gs.Receive(ctx, func(_ context.Context, m *pubsub.Message) { m.Ack(); done() })
		}
	})
	r.push = s.push(keys, msgs)
	r.libPub, r.grpcPub = s.publish(keys, msgs)
	fmt.Printf("%-5d %-36s %10.0f %10.0f %6.2fx %10.0f %6.3fx %10.0f %6.3fx %7.2fx   %10.0f %10.0f %6.2fx\n", round,
		fmt.Sprintf("%d keys, %d msgs", keys, msgs), r.raw, r.lib, r.lib/r.raw, r.grpc, r.grpc/r.raw, r.push, r.push/r.raw, r.lib/r.grpc,
		r.libPub, r.grpcPub, r.libPub/r.grpcPub)
	return r
}

// sidecarFigures are the sidecar run's figures, per round.
type sidecarFigures struct {
	rounds  []sidecarRound
	didcomm [][3]float64 // raw, untracked, tracked
}

// chart draws the sidecar run's figures: bars of the medians, ratios the
// median of each round's.
func (f sidecarFigures) chart(keys, msgs int) chart {
	col := func(v func(sidecarRound) float64) []float64 {
		out := make([]float64, len(f.rounds))
		for i, r := range f.rounds {
			out[i] = v(r)
		}
		return out
	}
	med := func(v func(sidecarRound) float64) float64 { return median(col(v)) }
	delivery := barGroup{title: fmt.Sprintf("delivery, %s messages over %d keys: messages/s", count(float64(msgs)), keys), bars: []bar{
		baseBar("raw JetStream, MaxAckPending 1000", med(func(r sidecarRound) float64 { return r.raw })),
		rateBar("library Receive", med(func(r sidecarRound) float64 { return r.lib }), vs(med(func(r sidecarRound) float64 { return r.lib / r.raw }), "raw")),
		rateBar("gRPC, Google's Go client (pull)", med(func(r sidecarRound) float64 { return r.grpc }), vs(med(func(r sidecarRound) float64 { return r.grpc / r.raw }), "raw")),
		rateBar("push, HTTP endpoint", med(func(r sidecarRound) float64 { return r.push }), vs(med(func(r sidecarRound) float64 { return r.push / r.raw }), "raw"),
			vs(med(func(r sidecarRound) float64 { return r.push / r.grpc }), "gRPC")),
	}}
	publish := barGroup{title: fmt.Sprintf("publishing, %d keys: messages/s (the baseline is the library)", keys), bars: []bar{
		baseBar("library Topic.Publish", med(func(r sidecarRound) float64 { return r.libPub })),
		rateBar("gRPC, Google's Go client", med(func(r sidecarRound) float64 { return r.grpcPub }), vs(med(func(r sidecarRound) float64 { return r.grpcPub / r.libPub }), "library")),
	}}
	g := []barGroup{delivery, publish}
	if len(f.didcomm) > 0 {
		d := func(i int) float64 {
			v := make([]float64, len(f.didcomm))
			for j, r := range f.didcomm {
				v[j] = r[i]
			}
			return median(v)
		}
		ratios := func(i, j int) float64 {
			v := make([]float64, len(f.didcomm))
			for k, r := range f.didcomm {
				v[k] = r[i] / r[j]
			}
			return median(v)
		}
		g = append(g, barGroup{title: fmt.Sprintf("DIDComm tracking through the sidecar, Go client, %d threads on %d keys: messages/s", keys, keys), bars: []bar{
			baseBar("raw JetStream, MaxAckPending 1000", d(0)),
			rateBar("untracked subscription", d(1), vs(ratios(1, 0), "raw")),
			rateBar("jetorder-didcomm: track", d(2), vs(ratios(2, 0), "raw"), vs(ratios(2, 1), "untracked")),
		}})
	}
	return chart{name: "sidecar", title: "The sidecar: the Pub/Sub gRPC API and push, against the library and raw JetStream", groups: g,
		note: "median of " + plural(len(f.rounds), "round") + ", a ratio the median of each round's"}
}

// deliver fills an ordered topic and times receive until every message is
// acked, from the first delivery.
func (b *bench) deliver(keys, msgs int, recv func(sub *adapter.Subscription, done func()) func(context.Context) error) float64 {
	return b.deliverIn(adapter.SubscriptionConfig{Delivery: adapter.DeliveryPerKey}, keys, msgs, recv)
}

// deliverIn is deliver on a subscription with the settings of cfg.
func (b *bench) deliverIn(cfg adapter.SubscriptionConfig, keys, msgs int, recv func(sub *adapter.Subscription, done func()) func(context.Context) error) float64 {
	topicID, _, sub, cleanup := b.orderedTopicIn("deliver", cfg)
	defer cleanup()
	subject, hdr := keyed(topicID, "key", keys)
	b.fill(subject, hdr, msgs)
	stopProfile := b.startDeliveryProfile()
	var got atomic.Int64
	var first atomic.Int64
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan error, 1)
	go func() {
		ended <- recv(sub, func() {
			first.CompareAndSwap(0, time.Now().UnixNano())
			if got.Add(1) == int64(msgs) {
				close(done)
			}
		})(ctx)
	}()
	<-done
	rate := float64(msgs-1) / time.Since(time.Unix(0, first.Load())).Seconds()
	stopProfile()
	cancel()
	check(<-ended)
	return rate
}

// startDeliveryProfile starts the CPU profile b.deliveryProfile asks for,
// if any, and returns what stops it.
func (b *bench) startDeliveryProfile() (stop func()) {
	if b.deliveryProfile == "" {
		return func() {}
	}
	f, err := os.Create(b.deliveryProfile)
	check(err)
	b.deliveryProfile = ""
	check(pprof.StartCPUProfile(f))
	return func() {
		pprof.StopCPUProfile()
		check(f.Close())
	}
}

// publish times publishing msgs messages over keys keys with the adapter's
// Topic and with Google's Publisher through the gRPC API.
func (s *sidecarBench) publish(keys, msgs int) (lib, grpcRate float64) {
	payload := make([]byte, *payloadSize)
	keyNames := make([]string, keys)
	for k := range keyNames {
		keyNames[k] = "key-" + strconv.Itoa(k)
	}
	lib = s.b.timedPublish(msgs, func(_ string, topic *adapter.Topic) { adapterPublish(topic, keyNames, msgs, payload) })
	grpcRate = s.b.timedPublish(msgs, func(topicID string, _ *adapter.Topic) {
		orderedGoPublish(s.client, topicID, keyNames, msgs, payload)
	})
	return lib, grpcRate
}

// orderedGoPublish publishes msgs messages round-robin over keys through
// Google's Publisher with message ordering, and awaits every result.
func orderedGoPublish(c *pubsub.Client, topicID string, keys []string, msgs int, payload []byte) {
	ctx := context.Background()
	p := c.Publisher(topicID)
	p.EnableMessageOrdering = true
	defer p.Stop()
	results := make([]*pubsub.PublishResult, 0, msgs)
	for i := range msgs {
		results = append(results, p.Publish(ctx, &pubsub.Message{Data: payload, OrderingKey: keys[i%len(keys)]}))
	}
	for _, r := range results {
		_, err := r.Get(ctx)
		check(err)
	}
}

// latency measures publish (raw JetStream, stamped) to handler at a steady
// rate over keys keys, through the adapter and through the gRPC API.
func (s *sidecarBench) latency(keys, rate int, dur time.Duration) (lib, grpcLat latency) {
	b := s.b
	lib = b.orderedLatency(keys, rate, dur)
	ctx := context.Background()
	topicID, topic, sub, cleanup := b.orderedTopic("glat")
	defer cleanup()
	var c collector
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var warmed atomic.Int32
	gs := s.client.Subscriber(sub.ID())
	go func() {
		_ = gs.Receive(rctx, func(_ context.Context, m *pubsub.Message) {
			if len(m.Data) == 0 {
				warmed.Add(1)
			}
			c.add(m.Data)
			m.Ack()
		})
	}()
	for k := range keys { // warm up: each key's consumer exists before timing
		_, err := topic.Publish(ctx, &adapter.Message{OrderingKey: "key-" + strconv.Itoa(k)}).Get(ctx)
		check(err)
	}
	for deadline := time.Now().Add(30 * time.Second); int(warmed.Load()) < keys && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	sent := pace(rate, dur, func(i int, stamp []byte) {
		key := "key-" + strconv.Itoa(i%keys)
		_, err := b.js.PublishMsgAsync(&nats.Msg{Subject: keyrouter.KeyedSubject(project, topicID, key), Data: stamp,
			Header: nats.Header{"Jetorder-Ordering-Key": {key}}})
		check(err)
	})
	return lib, c.wait(sent)
}
