package adapter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

var errLeaseLost = errors.New("ownership lease lost")

// lease is one key of the lease bucket, held by one Receive call at a time.
// The bucket's TTL removes it unless it is renewed, so a dead holder loses
// it after one TTL. The holder acts only while its lease is valid: until
// half a TTL after its last renewal was sent, and every action's deadline
// ends by then, so by the time the server lets another holder in, every
// request of the old one has completed or timed out.
type lease struct {
	kv      jetstream.KeyValue
	key, id string
	ttl     time.Duration
	timeout time.Duration

	mu    sync.Mutex
	rev   uint64
	until time.Time
}

// acquire takes the lease if nobody holds it.
func (l *lease) acquire(ctx context.Context) (bool, error) {
	start := time.Now()
	rev, err := l.kv.Create(ctx, l.key, []byte(l.id))
	if errors.Is(err, jetstream.ErrKeyExists) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	l.mu.Lock()
	l.rev, l.until = rev, start.Add(l.ttl/2)
	l.mu.Unlock()
	return true, nil
}

// keep renews the lease every quarter TTL until ctx ends; when a renewal
// fails it calls lost and returns.
func (l *lease) keep(ctx context.Context, lost func(error)) {
	t := time.NewTicker(l.ttl / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		l.mu.Lock()
		rev := l.rev
		l.mu.Unlock()
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, l.ttl/4)
		newRev, err := l.kv.Update(cctx, l.key, []byte(l.id), rev)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				lost(fmt.Errorf("%w: %v", errLeaseLost, err))
			}
			return
		}
		l.mu.Lock()
		l.rev, l.until = newRev, start.Add(l.ttl/2)
		l.mu.Unlock()
	}
}

// opContext bounds one action by the lease: it fails with errLeaseLost when
// the lease is not valid, and its deadline is the lease's end at the latest.
func (l *lease) opContext(ctx context.Context) (context.Context, context.CancelFunc, error) {
	l.mu.Lock()
	until := l.until
	l.mu.Unlock()
	if !time.Now().Before(until) {
		return nil, nil, errLeaseLost
	}
	deadline := time.Now().Add(l.timeout)
	if until.Before(deadline) {
		deadline = until
	}
	cctx, cancel := context.WithDeadline(ctx, deadline)
	return cctx, cancel, nil
}

// valid reports whether the holder may still act.
func (l *lease) valid() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Now().Before(l.until)
}

// release gives the lease up at once, so another process need not wait for
// the TTL.
func (l *lease) release() {
	l.mu.Lock()
	rev := l.rev
	l.until = time.Time{}
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	defer cancel()
	_ = l.kv.Delete(ctx, l.key, jetstream.LastRevision(rev))
}
