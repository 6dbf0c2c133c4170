package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/ordercheck"
	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// chaos decides, per delivery, what a checked handler does.
type chaos struct {
	nackPct, expirePct int
}

// checkedHandler feeds every delivery to the checker and then acks, nacks
// or lets the deadline pass, as chaos says. The checker hears of an ack or
// nack before the server does, so a next delivery can never overtake it.
func checkedHandler(c *ordercheck.Checker, sub string, ch chaos) func(context.Context, *adapter.Message) {
	return func(_ context.Context, m *adapter.Message) {
		key, idx, err := ordercheck.Decode(m.Data)
		if err != nil || key != m.OrderingKey {
			c.Fail("%s: undecodable delivery %q (key %q): %v", sub, m.Data, m.OrderingKey, err)
			m.Ack()
			return
		}
		c.Delivered(sub, key, idx)
		switch p := rand.IntN(100); {
		case p < ch.nackPct:
			c.Released(sub, key, idx)
			m.Nack()
		case p < ch.nackPct+ch.expirePct:
			c.Released(sub, key, idx) // returns without ack: redelivered after the deadline
		default:
			c.Acked(sub, key, idx)
			m.Ack()
		}
	}
}

// publishChecked publishes msgs messages on each of keys keys (plus
// unkeyed ones) in waves, with an idle gap between waves long enough for
// per-key consumers to be retired and created again. Each key's messages
// are published in order by one goroutine.
func publishChecked(t *testing.T, topic *adapter.Topic, c *ordercheck.Checker, keys, msgs, waves int, gap time.Duration) {
	t.Helper()
	ctx := context.Background()
	per := msgs / waves
	for w := range waves {
		var wg sync.WaitGroup
		errs := make(chan error, keys+1)
		for k := 0; k <= keys; k++ {
			key := fmt.Sprintf("key-%d.%s", k, strings.Repeat("*", k%3)) // dots and wildcards are just characters
			if k == keys {
				key = "" // unkeyed
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w * per; i < (w+1)*per; i++ {
					if _, err := topic.Publish(ctx, &adapter.Message{Data: ordercheck.Encode(key, i), OrderingKey: key}).Get(ctx); err != nil {
						errs <- err
						return
					}
					c.Published(key, i)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("publish: %v", err)
		}
		if w < waves-1 {
			time.Sleep(gap) // workload shape: let keys go idle between waves
		}
	}
}

// keyConsumers counts a subscription's live per-key consumers.
func keyConsumers(t *testing.T, e *env, topic, sub string) int {
	t.Helper()
	stream, err := jetstreamOf(t, e).Stream(context.Background(), keyrouter.StreamName(project, topic))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	names := stream.ConsumerNames(context.Background())
	for name := range names.Name() {
		if strings.HasPrefix(name, keyrouter.KeyConsumerPrefix(project, sub)) {
			n++
		}
	}
	return n
}

// TestOrderingChecker runs many keys x many messages through two ordered
// subscriptions, one of them received by two clients at once, with random
// nacks and deadline expiries and per-key consumers retired and recreated
// between waves. The checker looks at every delivery.
func TestOrderingChecker(t *testing.T) {
	opts := []adapter.Option{adapter.WithKeyConsumerIdleTimeout(300 * time.Millisecond), adapter.WithFailoverTimeout(2 * time.Second)}
	e := newEnv(t, opts...)
	topic := e.createTopic("checked")
	cfg := adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, AckDeadline: time.Second}
	subA := e.createSub("sub-a", cfg)
	subB := e.createSub("sub-b", cfg)

	c := ordercheck.New()
	ch := chaos{nackPct: 5, expirePct: 2}
	startReceive(t, subA, checkedHandler(c, "sub-a", ch))
	_, client2 := e.connect(opts...)
	startReceive(t, client2.Subscription("sub-a"), checkedHandler(c, "sub-a", ch))
	startReceive(t, subB, checkedHandler(c, "sub-b", ch))

	const keys, msgs = 40, 60
	publishChecked(t, topic, c, keys, msgs, 3, 900*time.Millisecond)

	testutil.Eventually(t, 90*time.Second, func() bool { return c.Complete("sub-a") && c.Complete("sub-b") },
		"not everything acked: sub-a: %s; sub-b: %s", func() string { return c.Missing("sub-a") }, func() string { return c.Missing("sub-b") })
	if v := c.Violations(); len(v) > 0 {
		t.Fatalf("%d ordering violations, first: %s", len(v), strings.Join(v, "\n"))
	}
	for _, s := range []string{"sub-a", "sub-b"} {
		st := c.Stats(s)
		t.Logf("%s: %d deliveries, %d redeliveries, %d acks", s, st.Deliveries, st.Redeliveries, st.Acks)
	}
	testutil.Eventually(t, 30*time.Second, func() bool { return keyConsumers(t, e, "checked", "sub-a") == 0 },
		"per-key consumers of sub-a not retired after idle: %d left", func() int { return keyConsumers(t, e, "checked", "sub-a") })
}

// Messages arrive right around the moment their key's consumer is being
// retired, again and again: the create/delete race must lose, reorder and
// duplicate nothing.
func TestRetireRaceLosesNothing(t *testing.T) {
	e := newEnv(t, adapter.WithKeyConsumerIdleTimeout(100*time.Millisecond))
	topic := e.createTopic("churn")
	sub := e.createSub("sub-1", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, Delivery: adapter.DeliveryPerKey})
	c := ordercheck.New()
	startReceive(t, sub, checkedHandler(c, "sub-1", chaos{}))
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	sawRetired := make(chan struct{}, 1)
	for k := range 8 {
		key := fmt.Sprint("churn-", k)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for i := range 30 {
				if _, err := topic.Publish(ctx, &adapter.Message{Data: ordercheck.Encode(key, i), OrderingKey: key}).Get(ctx); err != nil {
					errs <- err
					return
				}
				c.Published(key, i)
				// Workload shape: gaps around the idle timeout plus clean-up period.
				time.Sleep(time.Duration(60+rand.IntN(150)) * time.Millisecond)
			}
		}()
	}
	// Meanwhile, on the test goroutine: the consumers really are retired
	// between messages at least once.
	deadline := time.Now().Add(20 * time.Second)
	peak := 0
	for time.Now().Before(deadline) && len(sawRetired) == 0 {
		n := keyConsumers(t, e, "churn", "sub-1")
		peak = max(peak, n)
		if n < peak {
			sawRetired <- struct{}{}
		}
		time.Sleep(10 * time.Millisecond)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(sawRetired) == 0 {
		t.Fatal("no key consumer was ever retired: the race was not exercised")
	}
	testutil.Eventually(t, 30*time.Second, func() bool { return c.Complete("sub-1") }, "not acked: %s", func() string { return c.Missing("sub-1") })
	if v := c.Violations(); len(v) > 0 {
		t.Fatalf("ordering violations: %s", strings.Join(v, "\n"))
	}
}
