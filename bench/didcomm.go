package main

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/didcomm"
	"github.com/jetorder/jetorder/internal/broker"
)

// didcommStream is the message stream of the tracker runs: msgs messages
// round-robin over threads, 4 senders per thread; every 10th message of a
// sender is held back and sent after the sender's next one (a gap opened,
// then filled), and every 100th message is followed by a resend
// (sent_count 2).
func didcommStream(threads, msgs int, emit func(h didcomm.Headers)) {
	orders := make([]uint64, threads*4)
	held := make(map[int]didcomm.Headers)
	ids := make([]string, threads)
	for i := range ids {
		ids[i] = "thread-" + strconv.Itoa(i)
	}
	senders := [4]string{"did:ex:alice", "did:ex:bob", "did:ex:carol", "did:ex:dave"}
	for i := 0; i < msgs; i++ {
		th, s := i%threads, (i/threads)%4
		k := th*4 + s
		orders[k]++
		h := didcomm.Headers{ID: ids[th] + "/" + senders[s] + "/" + strconv.FormatUint(orders[k], 10), Thread: ids[th], From: senders[s], SenderOrder: orders[k]}
		if orders[k]%10 == 5 {
			held[k] = h
			continue
		}
		emit(h)
		if i%100 == 0 {
			h.Resend()
			emit(h)
		}
		if late, ok := held[k]; ok {
			emit(late)
			delete(held, k)
		}
	}
}

func heapMiB() float64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapAlloc) / (1 << 20)
}

// didcommTracker measures the in-memory tracker against the naive way to
// drop resends: a set of every message id seen (no gaps, no bound), and
// returns the figures as a chart's group.
func (b *bench) didcommTracker(threads, msgs int) barGroup {
	ctx := context.Background()
	base := heapMiB()
	seen := make(map[string]struct{})
	dups := 0
	start := time.Now()
	didcommStream(threads, msgs, func(h didcomm.Headers) {
		if _, ok := seen[h.ID]; ok {
			dups++
			return
		}
		seen[h.ID] = struct{}{}
	})
	naiveRate := float64(msgs) / time.Since(start).Seconds()
	naiveHeap := heapMiB() - base
	runtime.KeepAlive(seen)
	seen = nil
	g := barGroup{title: fmt.Sprintf("the tracker in memory, %s messages over %s threads x 4 senders: messages/s", count(float64(msgs)), count(float64(threads))),
		bars: []bar{{label: "a set of every message id (no gaps)", value: naiveRate, text: fmt.Sprintf("%s, heap %.1f MiB", count(naiveRate), naiveHeap), baseline: true}}}

	for _, maxThreads := range []int{didcomm.DefaultMaxThreads, threads / 10} {
		base = heapMiB()
		var events [didcomm.GapAbandoned + 1]int
		tr, err := didcomm.NewTracker(didcomm.WithMaxThreads(maxThreads), didcomm.WithEventHook(func(e didcomm.Event) { events[e.Kind]++ }))
		check(err)
		start = time.Now()
		didcommStream(threads, msgs, func(h didcomm.Headers) {
			_, err := tr.Observe(ctx, h, 0)
			check(err)
		})
		rate := float64(msgs) / time.Since(start).Seconds()
		heap := heapMiB() - base
		fmt.Printf("didcomm tracker, %d msgs over %d threads x 4 senders, max %d threads in memory: %.0f msgs/s (%.2fx the id set's %.0f); heap %.1f MiB (id set %.1f MiB); %d threads held; gaps opened %d, filled %d, duplicates %d (id set: %d)\n",
			msgs, threads, maxThreads, rate, rate/naiveRate, naiveRate, heap, naiveHeap, tr.Threads(), events[didcomm.GapOpened], events[didcomm.GapFilled], events[didcomm.Duplicate], dups)
		runtime.KeepAlive(tr)
		label := "tracker, default limits"
		if maxThreads != didcomm.DefaultMaxThreads {
			label = fmt.Sprintf("tracker, WithMaxThreads(%d)", maxThreads)
		}
		g.bars = append(g.bars, bar{label: label, value: rate, text: fmt.Sprintf("%s (%s id set), heap %.1f MiB", count(rate), ratio(rate/naiveRate), heap)})
	}
	// A sender jumping from 3 to 10^12: two gap ranges, not a trillion.
	base = heapMiB()
	tr, err := didcomm.NewTracker()
	check(err)
	for _, o := range []uint64{1, 3, 1_000_000_000_000} {
		_, err := tr.Observe(ctx, didcomm.Headers{ID: strconv.FormatUint(o, 10), Thread: "t", From: "a", SenderOrder: o}, 0)
		check(err)
	}
	ros, err := tr.ReceivedOrders(ctx, "t")
	check(err)
	fmt.Printf("didcomm tracker, a sender jumping from 3 to 10^12: heap %+.3f MiB; received_orders lists %d gaps and omits %d\n",
		heapMiB()-base, len(ros[0].Gaps), ros[0].GapsOmitted)
	runtime.KeepAlive(tr)
	return g
}

// didcommPayloads are msgs plaintext DIDComm messages over keys threads,
// one sender per thread, in order.
func didcommPayloads(keys, msgs int) [][]byte {
	payloads := make([][]byte, msgs)
	orders := make([]uint64, keys)
	for i := range payloads {
		k := i % keys
		orders[k]++
		payloads[i] = fmt.Appendf(nil, `{"id":"m-%d","type":"https://example.org/bench/1.0/tick","thid":"thread-%d","from":"did:ex:sender","sender_order":%d,"body":{}}`, i, k, orders[k])
	}
	return payloads
}

// timeDIDComm fills an ordered topic with payloads, one thread per
// ordering key, and times receive until every message is counted, from
// the first. labels are the subscription's.
func (b *bench) timeDIDComm(keys int, payloads [][]byte, labels map[string]string, receive func(context.Context, *adapter.Subscription, func()) error) float64 {
	ctx := context.Background()
	topicID, _, sub, cleanup := b.orderedTopic("didcomm")
	defer cleanup()
	if labels != nil {
		_, err := sub.Update(ctx, adapter.SubscriptionUpdate{Labels: labels})
		check(err)
	}
	subject, hdr := keyed(topicID, "thread", keys)
	b.fillData(subject, hdr, payloads)
	var got, first atomic.Int64
	done := make(chan struct{})
	var once sync.Once
	rctx, cancel := context.WithCancel(ctx)
	recvDone := make(chan error, 1)
	go func() {
		recvDone <- receive(rctx, sub, func() {
			first.CompareAndSwap(0, time.Now().UnixNano())
			if got.Add(1) == int64(len(payloads)) {
				once.Do(func() { close(done) })
			}
		})
	}()
	<-done
	rate := float64(len(payloads)-1) / time.Since(time.Unix(0, first.Load())).Seconds()
	cancel()
	check(<-recvDone)
	return rate
}

// didcommReceive times didcomm.Receive (tracker state in KV, one update on
// delivery and one on ack) against the adapter's Receive and raw JetStream
// on the same messages: plaintext DIDComm messages over keys threads, one
// thread per ordering key.
func (b *bench) didcommReceive(keys, msgs int) (raw, plain, tracked float64) {
	raw = b.raw(b.name("raw-didcomm"), msgs, 1000)
	payloads := didcommPayloads(keys, msgs)
	plain = b.timeDIDComm(keys, payloads, nil, func(ctx context.Context, sub *adapter.Subscription, count func()) error {
		return sub.Receive(ctx, func(_ context.Context, m *adapter.Message) {
			m.Ack()
			count()
		})
	})
	tracked = b.timeDIDComm(keys, payloads, nil, func(ctx context.Context, sub *adapter.Subscription, count func()) error {
		tr, err := didcomm.OpenSubscriptionTracker(ctx, sub)
		check(err)
		return didcomm.Receive(ctx, sub, tr, func(_ context.Context, d *didcomm.Delivery) {
			if d.Err != nil || !d.Tracked {
				check(fmt.Errorf("message not tracked: %v", d.Err))
			}
			d.Ack()
			count()
		})
	})
	return raw, plain, tracked
}

// didcommSidecar times the same messages through the sidecar with Google's
// Go client, on a subscription without and with the label that has the
// sidecar track DIDComm sequencing.
func (s *sidecarBench) didcommSidecar(keys, msgs int) (raw, untracked, tracked float64) {
	raw = s.b.raw(s.b.name("raw-didcomm"), msgs, 1000)
	payloads := didcommPayloads(keys, msgs)
	receive := func(wantTracked bool) func(context.Context, *adapter.Subscription, func()) error {
		return func(ctx context.Context, sub *adapter.Subscription, count func()) error {
			return s.client.Subscriber(sub.ID()).Receive(ctx, func(_ context.Context, m *pubsub.Message) {
				if _, ok := m.Attributes["jetorder-didcomm-received-orders"]; ok != wantTracked {
					check(fmt.Errorf("message tracked: %v, want %v", ok, wantTracked))
				}
				m.Ack()
				count()
			})
		}
	}
	untracked = s.b.timeDIDComm(keys, payloads, nil, receive(false))
	tracked = s.b.timeDIDComm(keys, payloads, map[string]string{broker.LabelDIDComm: broker.DIDCommTrack}, receive(true))
	return raw, untracked, tracked
}
