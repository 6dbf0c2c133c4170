package itest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/jetorder/jetorder/internal/ordercheck"
)

// PublishChecked publishes messages from..to-1 of each of keys ("" is no
// ordering key) through p as ordercheck payloads, interleaved (message i of
// every key before message i+1 of any), tells chk of each (when not nil),
// and waits until all are stored.
func PublishChecked(t testing.TB, p *pubsub.Publisher, chk *ordercheck.Checker, keys []string, from, to int) {
	t.Helper()
	ctx := context.Background()
	var results []*pubsub.PublishResult
	for i := from; i < to; i++ {
		for _, key := range keys {
			results = append(results, p.Publish(ctx, &pubsub.Message{Data: ordercheck.Encode(key, i), OrderingKey: key}))
			if chk != nil {
				chk.Published(key, i)
			}
		}
	}
	if err := Stored(ctx, results); err != nil {
		t.Fatalf("publish: %v", err)
	}
}

// Stored waits for every publish result, of Google's client or the
// library, and returns the first error.
func Stored[R interface {
	Get(context.Context) (string, error)
}](ctx context.Context, results []R) error {
	for _, r := range results {
		if _, err := r.Get(ctx); err != nil {
			return err
		}
	}
	return nil
}

// CheckedHandler is a Go client handler that reports every delivery of
// sub to chk and nacks every nackEvery-th one it gets (0: none), acking the
// rest. It is safe for concurrent use.
func CheckedHandler(chk *ordercheck.Checker, sub string, nackEvery int) func(context.Context, *pubsub.Message) {
	var mu sync.Mutex
	count := 0
	return func(_ context.Context, m *pubsub.Message) {
		key, idx, err := ordercheck.Decode(m.Data)
		if err != nil || key != m.OrderingKey {
			chk.Fail("%s: undecodable delivery %q (key %q): %v", sub, m.Data, m.OrderingKey, err)
			m.Ack()
			return
		}
		chk.Delivered(sub, key, idx)
		mu.Lock()
		count++
		nack := nackEvery > 0 && count%nackEvery == 0
		mu.Unlock()
		if nack {
			chk.Released(sub, key, idx)
			m.Nack()
			return
		}
		chk.Acked(sub, key, idx)
		m.Ack()
	}
}

// Rounds publishes round after round on a goroutine of its own until
// Stop: round(i) publishes round i and returns once it is stored, or with
// the error that ends the rounds. With pace over 0, rounds start at most
// one per pace.
type Rounds struct {
	done atomic.Int64
	stop chan struct{}
	err  chan error
}

// PublishRounds starts the rounds.
func PublishRounds(round func(i int) error, pace time.Duration) *Rounds {
	r := &Rounds{stop: make(chan struct{}), err: make(chan error, 1)}
	go func() {
		defer close(r.err)
		var tick <-chan time.Time
		if pace > 0 {
			t := time.NewTicker(pace)
			defer t.Stop()
			tick = t.C
		}
		for i := 0; ; i++ {
			if tick != nil {
				<-tick
			}
			if err := round(i); err != nil {
				r.err <- err
				return
			}
			r.done.Add(1)
			select {
			case <-r.stop:
				return
			default:
			}
		}
	}()
	return r
}

// Done is how many rounds are stored.
func (r *Rounds) Done() int64 { return r.done.Load() }

// Reached returns a condition for testutil.Eventually: n rounds stored.
func (r *Rounds) Reached(n int64) func() bool { return func() bool { return r.Done() >= n } }

// Stop ends the rounds after the one under way and returns the error that
// ended them, if one did.
func (r *Rounds) Stop() error {
	close(r.stop)
	return <-r.err
}
