package adapter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

var errLeaseLost = errors.New("discovery lease lost")

// leaseStore is what a lease needs of its KV bucket (jetstream.KeyValue).
type leaseStore interface {
	Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error)
	Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error)
	Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error
	Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error)
}

var _ leaseStore = (jetstream.KeyValue)(nil)

// lease is one key of the lease bucket, held by one Receive call at a time;
// its value is the holder's presence id.
//
// The bucket's TTL removes it unless it is renewed, so a dead holder loses
// it after one TTL; sooner when another receiver finds the holder gone
// (presence.gone: it has no connection to NATS) and takes the lease over.
// The holder acts only while its lease is valid: until half a TTL after
// its last renewal was sent, and every action's deadline ends by then, so
// by the time the server lets another holder in, every request of the old
// one has completed or timed out. A holder whose connection came back
// since its last renewal was sent may have been taken for gone: its lease
// is not valid again until a renewal sent since succeeds.
type lease struct {
	kv         leaseStore
	key, id    string
	ttl        time.Duration
	timeout    time.Duration
	now        func() time.Time // time.Now; tests step it
	reconnects func() uint64    // the connection's reconnect count, or nil

	mu       sync.Mutex
	rev      uint64
	until    time.Time
	renewedN uint64 // reconnects when the last renewal was sent
}

func newLease(kv leaseStore, key, id string, ttl, timeout time.Duration, reconnects func() uint64) *lease {
	return &lease{kv: kv, key: key, id: id, ttl: ttl, timeout: timeout, now: time.Now, reconnects: reconnects}
}

func (l *lease) reconnectCount() uint64 {
	if l.reconnects == nil {
		return 0
	}
	return l.reconnects()
}

// acquire takes the lease if nobody holds it, if it still names this
// holder (a release that never reached the server: the connection was
// down when the lease was lost), or if gone (which may be nil) says its
// holder is gone.
func (l *lease) acquire(ctx context.Context, gone func(holder string) bool) (bool, error) {
	start, n := l.now(), l.reconnectCount()
	rev, err := l.kv.Create(ctx, l.key, []byte(l.id))
	if errors.Is(err, jetstream.ErrKeyExists) {
		e, gerr := l.kv.Get(ctx, l.key)
		if gerr != nil {
			return false, nil
		}
		if holder := string(e.Value()); holder != l.id && (gone == nil || !gone(holder)) {
			return false, nil
		}
		// Only one taker's update names the revision read.
		if rev, err = l.kv.Update(ctx, l.key, []byte(l.id), e.Revision()); err != nil {
			return false, nil
		}
	}
	if err != nil {
		return false, err
	}
	l.mu.Lock()
	l.rev, l.until, l.renewedN = rev, start.Add(l.ttl/2), n
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
		if err := l.renew(ctx); err != nil {
			if ctx.Err() == nil {
				lost(err)
			}
			return
		}
	}
}

// renew renews the lease once, if nobody else has written it since: the
// lease is valid until half a TTL after the renewal was sent.
func (l *lease) renew(ctx context.Context) error {
	l.mu.Lock()
	rev := l.rev
	l.mu.Unlock()
	start, n := l.now(), l.reconnectCount()
	cctx, cancel := context.WithTimeout(ctx, l.ttl/4)
	newRev, err := l.kv.Update(cctx, l.key, []byte(l.id), rev)
	cancel()
	if err != nil {
		return fmt.Errorf("%w: %v", errLeaseLost, err)
	}
	l.mu.Lock()
	l.rev, l.until, l.renewedN = newRev, start.Add(l.ttl/2), n
	l.mu.Unlock()
	return nil
}

// opContext bounds one action by the lease: it fails with errLeaseLost when
// the lease is not valid, and its deadline is the lease's end at the latest.
func (l *lease) opContext(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if !l.valid() {
		return nil, nil, errLeaseLost
	}
	l.mu.Lock()
	until := l.until
	l.mu.Unlock()
	now := l.now()
	deadline := now.Add(l.timeout)
	if until.Before(deadline) {
		deadline = until
	}
	cctx, cancel := context.WithDeadline(ctx, deadline)
	return cctx, cancel, nil
}

// valid reports whether the holder may still act.
func (l *lease) valid() bool {
	n := l.reconnectCount()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.now().Before(l.until) && n == l.renewedN
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
