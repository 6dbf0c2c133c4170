package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
)

// orderStressRuns measures per-key delivery through Google's Go client in
// the shape of an ordering stress test: 1,000 new keys of 5 messages each,
// two ordered subscriptions received at once, 5% of first deliveries
// nacked, every ack sent from a goroutine of its own after the handler
// returned. The baseline is pstest, Google's fake, in the same round.
func (b *bench) orderStressRuns() chart {
	const keys, perKey, subs, nackEvery = 1000, 5, 2, 20
	sc := b.startSidecar()
	defer sc.stop()
	fake := pstest.NewServer()
	defer fake.Close()
	servers := []clientsServer{{name: "pstest", addr: fake.Addr, project: project}, {name: "sidecar", addr: sc.addr, project: project}}
	labels := map[string]map[string]string{"sidecar": {"jetorder-delivery": "per-key"}}
	rates := map[string][]float64{}
	for round := 1; round <= *rounds; round++ {
		fmt.Printf("round %d: order stress (%d keys x %d, %d subscriptions, 1 in %d first deliveries nacked)\n", round, keys, perKey, subs, nackEvery)
		for _, s := range servers {
			rate := s.orderStress(labels[s.name], keys, perKey, subs, nackEvery)
			rates[s.name] = append(rates[s.name], rate)
			fmt.Printf("      %-8s %10.0f deliveries acked/s\n", s.name, rate)
		}
	}
	p, s := median(rates["pstest"]), median(rates["sidecar"])
	fmt.Printf("order stress, median of %d rounds: sidecar (per-key) %.0f acked/s, pstest %.0f, %.2fx\n", *rounds, s, p, s/p)
	return chart{name: "orderstress", title: "Order stress through Google's Go client: per-key delivery against pstest", note: "median of " + plural(*rounds, "round"),
		groups: []barGroup{{title: fmt.Sprintf("%d keys x %d, %d subscriptions, 5%% nacks: messages acked/s", keys, perKey, subs),
			bars: []bar{baseBar("pstest", p), rateBar("sidecar, per-key", s, vs(s/p, "pstest"))}}}}
}

// orderStress publishes keys x perKey messages to a new topic with subs
// ordered subscriptions and times receiving them until every subscription
// has acked every message, in order per key (an order violation stops
// the bench).
func (s clientsServer) orderStress(labels map[string]string, keys, perKey, subs, nackEvery int) float64 {
	ctx := context.Background()
	c, err := pubsub.NewClient(ctx, s.project, clientOptions(s.addr)...)
	check(err)
	defer c.Close()
	id := fmt.Sprintf("stress-%d", clientsIDs.Add(1))
	topic := "projects/" + s.project + "/topics/" + id
	_, err = c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topic})
	check(err)
	for i := range subs {
		_, err = c.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{Name: fmt.Sprintf("projects/%s/subscriptions/%s-%d", s.project, id, i),
			Topic: topic, EnableMessageOrdering: true, Labels: labels})
		check(err)
	}
	p := c.Publisher(id)
	p.EnableMessageOrdering = true
	var results []*pubsub.PublishResult
	for i := range perKey {
		for k := range keys {
			key := "key-" + strconv.Itoa(k)
			results = append(results, p.Publish(ctx, &pubsub.Message{Data: []byte(key + "|" + strconv.Itoa(i)), OrderingKey: key}))
		}
	}
	for _, r := range results {
		_, err := r.Get(ctx)
		check(err)
	}
	p.Stop()

	total := keys * perKey * subs
	var mu sync.Mutex
	next := map[string]int{} // sub/key -> index of the next message to ack
	nacked := map[string]bool{}
	acked := 0
	all := make(chan struct{})
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	start := time.Now()
	for i := range subs {
		sub := fmt.Sprintf("%s-%d", id, i)
		wg.Go(func() {
			err := c.Subscriber(sub).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
				key, idx, _ := strings.Cut(string(m.Data), "|")
				index, _ := strconv.Atoi(idx)
				sk := sub + "/" + key
				mu.Lock()
				defer mu.Unlock()
				if index != next[sk] {
					// Redelivered before its ack took effect, or out of order.
					if index > next[sk] {
						check(fmt.Errorf("%s: message %d delivered while %d is not acked", sk, index, next[sk]))
					}
					go m.Ack()
					return
				}
				h := fnv.New32a()
				h.Write(m.Data)
				if !nacked[sk+idx] && h.Sum32()%uint32(nackEvery) == 0 {
					nacked[sk+idx] = true
					go m.Nack()
					return
				}
				next[sk]++
				acked++
				if acked == total {
					close(all)
				}
				go m.Ack()
			})
			check(err)
		})
	}
	select {
	case <-all:
	case <-time.After(clientsCap):
		fmt.Printf("      (cut short after %v)\n", clientsCap)
	}
	mu.Lock()
	rate := float64(acked) / time.Since(start).Seconds()
	mu.Unlock()
	cancel()
	wg.Wait()
	return rate
}
