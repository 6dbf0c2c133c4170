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
)

// seekLog records every delivery of a seek test: the checker sees each one,
// and the log keeps when each message was published and when it was
// handed to a handler.
type seekLog struct {
	c  *ordercheck.Checker
	mu sync.Mutex
	// by "key|index"
	published map[string]time.Time
	delivered map[string][]time.Time
}

func (l *seekLog) handler(sub string) func(context.Context, *adapter.Message) {
	return func(_ context.Context, m *adapter.Message) {
		key, idx, err := ordercheck.Decode(m.Data)
		if err != nil || key != m.OrderingKey {
			l.c.Fail("%s: undecodable delivery %q (key %q): %v", sub, m.Data, m.OrderingKey, err)
			m.Ack()
			return
		}
		now := time.Now()
		l.c.Delivered(sub, key, idx)
		l.mu.Lock()
		id := string(m.Data)
		l.published[id] = m.PublishTime
		l.delivered[id] = append(l.delivered[id], now)
		l.mu.Unlock()
		// Hold it a moment, so a seek finds messages in handlers.
		time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
		l.c.Acked(sub, key, idx)
		m.Ack()
	}
}

// deliveredSince counts the messages published in [from, to) and how many
// of them were handed to a handler at or after since.
func (l *seekLog) deliveredSince(from, to, since time.Time) (total, again int, missing []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, pub := range l.published {
		if pub.Before(from) || !pub.Before(to) {
			continue
		}
		total++
		n := 0
		for _, at := range l.delivered[id] {
			if !at.Before(since) {
				n++
			}
		}
		if n > 0 {
			again++
		} else if len(missing) < 5 {
			missing = append(missing, id)
		}
	}
	return total, again, missing
}

// Seek under load: 100 keys stream to two receivers; the subscription is
// sought back 10 s, then (once everything is acked) forward to the present. The checker sees every
// delivery: no key ever has two messages in handlers, each key restarts
// from its first message after the seek point and goes on in order, every
// message published after the seek point is delivered again, and none
// published well before it is.
func TestSeekUnderLoadKeepsOrder(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("seek")
	sub := e.createSub("seek-sub", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true, AckDeadline: 5 * time.Second})
	c := ordercheck.New()
	c.AcksMayBeLost() // a seek takes keys back to messages acked before
	log := &seekLog{c: c, published: map[string]time.Time{}, delivered: map[string][]time.Time{}}
	receivers := []*receiving{startReceive(t, sub, log.handler("seek-sub"))}
	_, client2 := e.connect()
	receivers = append(receivers, startReceive(t, client2.Subscription("seek-sub"), log.handler("seek-sub")))

	const keys = 100
	round := func(i int) error {
		ctx := context.Background()
		results := make([]*adapter.PublishResult, keys)
		for k := range keys {
			key := fmt.Sprintf("key-%d", k)
			c.Published(key, i)
			results[k] = topic.Publish(ctx, &adapter.Message{Data: ordercheck.Encode(key, i), OrderingKey: key})
		}
		for _, r := range results {
			if _, err := r.Get(ctx); err != nil {
				return err
			}
		}
		return nil
	}
	stop := make(chan struct{})
	rounds := make(chan int, 1)
	published := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			if err := round(i); err != nil {
				published <- err
				return
			}
			select {
			case <-stop:
				rounds <- i + 1
				published <- nil
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	waitFor := func(d time.Duration) {
		select {
		case err := <-published:
			t.Fatalf("publish: %v", err)
		case <-time.After(d):
		}
	}
	complete := func() {
		t.Helper()
		testutil.Eventually(t, 90*time.Second, func() bool { return c.Complete("seek-sub") },
			"not everything acked: %s", func() string { return c.Missing("seek-sub") })
	}

	// Seek back 10 s while messages stream in.
	waitFor(13 * time.Second)
	back := time.Now().Add(-10 * time.Second)
	seekCall := time.Now()
	if err := sub.SeekToTime(context.Background(), back); err != nil {
		t.Fatalf("SeekToTime(-10s): %v", err)
	}
	sought := time.Now()
	t.Logf("seek back took %v", sought.Sub(seekCall))
	waitFor(4 * time.Second)
	close(stop)
	if err := <-published; err != nil {
		t.Fatalf("publish: %v", err)
	}
	complete()
	// Every message published from the seek point until the seek came
	// again after it, and nothing published well before the point.
	total, again, missing := log.deliveredSince(back, seekCall, sought)
	if total == 0 || again != total {
		t.Errorf("of %d messages published in the 10 s before the seek, %d came again after it; not: %v", total, again, missing)
	}
	total, again, missing = log.deliveredSince(time.Time{}, back.Add(-2*time.Second), sought.Add(2*time.Second))
	if total == 0 || again != 0 {
		t.Errorf("of %d messages published before the seek point, %d came again after the seek: %v", total, again, missing)
	}

	// Seek forward to now: nothing comes again, and what is published
	// next comes once.
	forward := time.Now()
	if err := sub.SeekToTime(context.Background(), forward); err != nil {
		t.Fatalf("SeekToTime(now): %v", err)
	}
	forwardDone := time.Now()
	if err := round(<-rounds); err != nil {
		t.Fatalf("publish: %v", err)
	}
	complete()
	total, again, missing = log.deliveredSince(time.Time{}, forward, forwardDone)
	if total == 0 || again != 0 {
		t.Errorf("of %d messages published before the forward seek, %d came again after it: %v", total, again, missing)
	}

	if v := c.Violations(); len(v) > 0 {
		t.Fatalf("%d ordering violations, first: %s", len(v), strings.Join(v, "\n"))
	}
	for i, r := range receivers {
		if err, ended := r.wait(0); ended {
			t.Errorf("receiver %d ended across the seeks: %v", i, err)
		}
	}
	st := c.Stats("seek-sub")
	t.Logf("%d deliveries, %d redeliveries, %d rewinds, %d acks", st.Deliveries, st.Redeliveries, st.Rewinds, st.Acks)
}
