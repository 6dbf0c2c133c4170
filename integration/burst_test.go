package integration

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/testutil"
)

// A burst of many keys, one message each: every message is delivered, and
// once the keys go idle their consumers are removed again. (make bench runs
// the same burst with 10,000 keys.)
func TestKeyBurstConsumersFallBack(t *testing.T) {
	const keys = 2000
	e := newEnv(t, adapter.WithKeyConsumerIdleTimeout(500*time.Millisecond))
	topic := e.createTopic("burst")
	sub := e.createSub("sub-1", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	var delivered atomic.Int32
	startReceive(t, sub, func(_ context.Context, m *adapter.Message) {
		delivered.Add(1)
		m.Ack()
	})
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, keys)
	sem := make(chan struct{}, 64)
	for k := range keys {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			_, err := topic.Publish(context.Background(), &adapter.Message{Data: []byte("x"), OrderingKey: fmt.Sprint("device-", k)}).Get(context.Background())
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	testutil.Eventually(t, 120*time.Second, func() bool { return delivered.Load() == keys }, "%d of %d delivered", delivered.Load, keys)
	t.Logf("%d keys delivered in %v", keys, time.Since(start).Round(time.Millisecond))
	peak := keyConsumers(t, e, "burst", "sub-1")
	testutil.Eventually(t, 120*time.Second, func() bool { return keyConsumers(t, e, "burst", "sub-1") == 0 },
		"%d key consumers left after idle", func() int { return keyConsumers(t, e, "burst", "sub-1") })
	t.Logf("key consumers: %d right after delivery, 0 after %v", peak, time.Since(start).Round(time.Millisecond))
}
