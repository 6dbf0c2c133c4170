package main

import (
	"context"
	"fmt"
	"net"
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
	stop   func()
}

func (b *bench) startSidecar() *sidecarBench {
	br := broker.New(b.nc, nil, nil, adapter.WithKeyConsumerIdleTimeout(*idleTimeout))
	// Push to loopback only, the sidecar's default: the endpoint is in
	// this process.
	allow, err := push.ParseAllowList(push.DefaultAllow)
	check(err)
	api := pubsubapi.New(br, pubsubapi.Config{PushAllow: allow})
	gs := grpc.NewServer(grpc.MaxRecvMsgSize(12 << 20))
	api.Register(gs)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	go func() { _ = gs.Serve(l) }()
	c, err := pubsub.NewClient(context.Background(), project,
		option.WithEndpoint(l.Addr().String()), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())), option.WithTelemetryDisabled())
	check(err)
	return &sidecarBench{b: b, client: c, stop: func() {
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

// deliver fills an ordered topic and times receive until every message is
// acked, from the first delivery.
func (b *bench) deliver(keys, msgs int, recv func(sub *adapter.Subscription, done func()) func(context.Context) error) float64 {
	topicID, _, sub, cleanup := b.orderedTopic("deliver")
	defer cleanup()
	subject, hdr := keyed(topicID, "key", keys)
	b.fill(subject, hdr, msgs)
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
	cancel()
	check(<-ended)
	return rate
}

// publish times publishing msgs messages over keys keys with the adapter's
// Topic and with Google's Publisher through the gRPC API.
func (s *sidecarBench) publish(keys, msgs int) (lib, grpcRate float64) {
	ctx := context.Background()
	payload := make([]byte, *payloadSize)
	keyNames := make([]string, keys)
	for k := range keyNames {
		keyNames[k] = "key-" + strconv.Itoa(k)
	}
	lib = s.b.timedPublish(msgs, func(_ string, topic *adapter.Topic) { adapterPublish(topic, keyNames, msgs, payload) })
	grpcRate = s.b.timedPublish(msgs, func(topicID string, _ *adapter.Topic) {
		p := s.client.Publisher(topicID)
		p.EnableMessageOrdering = true
		defer p.Stop()
		results := make([]*pubsub.PublishResult, 0, msgs)
		for i := range msgs {
			results = append(results, p.Publish(ctx, &pubsub.Message{Data: payload, OrderingKey: keyNames[i%keys]}))
		}
		for _, r := range results {
			_, err := r.Get(ctx)
			check(err)
		}
	})
	return lib, grpcRate
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
