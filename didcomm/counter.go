package didcomm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/keyrouter"
)

// KVSequencer stamps sender_order as Sequencer does, with its counters in a
// JetStream key-value bucket instead of memory: one key per thread and
// sender holding the last order given, changed only by compare-and-set on
// the key's revision. Every KVSequencer over the same bucket and prefix,
// in this process or another, draws from the same counters, so a restart
// needs no Restore, and two senders' processes stamping for the same
// thread and sender never give one order twice.
//
// Orders are given in reservation order with no hole, except that an order
// whose message is then never sent is a hole for its receivers unless it
// is given back (GiveBack), and a reservation whose answer was lost (the
// connection dropped, or ctx ended, while the write was in flight) may
// have taken its orders: they are skipped, never given again.
//
// A crash between reserving orders and sending their messages leaves a
// hole too, unless the reserver writes ahead (ReserveWith): then the
// counter keeps, beside its last order, a record of what the reservation
// is for until Settle removes it, written in the same compare-and-set, so
// the orders are never taken without their record. Whoever finds a record
// its reserver will not settle (a restart, PendingCounters) sends what it
// holds and settles it.
//
// Deleting or purging a counter's key starts it again at 1: receivers
// would then drop the new messages as copies of the old ones.
//
// A KVSequencer is safe for concurrent use.
type KVSequencer struct {
	kv     jetstream.KeyValue
	prefix string
	// index, when set, holds an empty key per counter that may have
	// pending records, so that they can be found without reading every
	// counter (IndexPending).
	index jetstream.KeyValue

	mu   sync.Mutex
	seen map[string]counterSeen // key -> what this sequencer last wrote or read
}

// counterSeen is a counter's value and revision as last seen. It is a
// hint that saves a read: a compare-and-set on a stale revision fails and
// the counter is read again.
type counterSeen struct {
	last, rev uint64
	pending   []Pending
}

// Pending is a write-ahead record kept in a counter: orders
// First..First+N-1 were reserved for what Record says (its reserver's
// bytes, one line), and may not all have been sent yet.
type Pending struct {
	First, N uint64
	Record   []byte
}

const (
	// maxReserveAttempts bounds the compare-and-set attempts of one
	// reservation: each failure means another reservation succeeded, and
	// the loser waits a random while (up to maxConflictWait, growing with
	// its losses) before trying again, so a crowd of reservers for one
	// counter spreads out instead of losing in step.
	maxReserveAttempts = 1000
	maxConflictWait    = 20 * time.Millisecond
	// maxSeenCounters bounds the revision hints kept; beyond it they are
	// dropped and counters are read before being written.
	maxSeenCounters = 10000
	// counterTimeout bounds each bucket operation whose ctx has no
	// deadline.
	counterTimeout = 10 * time.Second
)

// NewKVSequencer keeps counters in kv under keys
// prefix.<kv(thread)>.<kv(sender)> (docs/WIRE.md). prefix must be a valid
// KV key, or empty for keys <kv(thread)>.<kv(sender)>.
func NewKVSequencer(kv jetstream.KeyValue, prefix string) *KVSequencer {
	return &KVSequencer{kv: kv, prefix: prefix, seen: make(map[string]counterSeen)}
}

// Key is the bucket key of the thread and sender's counter.
func (s *KVSequencer) Key(thread, sender string) string {
	k := keyrouter.KVToken(thread) + "." + keyrouter.KVToken(sender)
	if s.prefix == "" {
		return k
	}
	return s.prefix + "." + k
}

// Reserve takes the n (at least 1) next orders of the thread and sender
// and returns the first of them: the caller owns first..first+n-1. It
// blocks for one or two bucket round trips, more while other reservations
// of the same counter win the compare-and-set; after maxReserveAttempts
// lost in a row it returns an error wrapping ErrStateConflict. It returns
// ErrMissingID for an empty thread, ErrMissingSender for an empty sender,
// and ErrInvalidSenderOrder when the counter would pass the largest order.
// Cancelling ctx ends the wait; an error other than those may have taken
// the orders (see KVSequencer).
func (s *KVSequencer) Reserve(ctx context.Context, thread, sender string, n uint64) (first uint64, err error) {
	first, _, err = s.ReserveWith(ctx, thread, sender, n, nil)
	return first, err
}

// ReserveWith is Reserve writing ahead: record, called with the first
// order of each attempt, returns what the reservation is for (one line, no
// '\n'), and the counter keeps it as a Pending record, taken in the same
// compare-and-set as the orders, until Settle. A nil record (or a nil
// func) writes none; an error from record ends the reservation with that
// error and nothing taken. earlier is the pending records the counter held
// before, of reservations that may still be unsent: a caller that must
// send after them sees to them first.
func (s *KVSequencer) ReserveWith(ctx context.Context, thread, sender string, n uint64, record func(first uint64) ([]byte, error)) (first uint64, earlier []Pending, err error) {
	if thread == "" {
		return 0, nil, ErrMissingID
	}
	if sender == "" {
		return 0, nil, ErrMissingSender
	}
	if n == 0 {
		return 0, nil, errors.New("didcomm: reserve at least one order")
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	key := s.Key(thread, sender)
	cur, hinted := s.hint(key)
	indexed := false
	for attempt := range maxReserveAttempts {
		if !hinted {
			if cur, err = s.read(ctx, key); err != nil {
				return 0, nil, err
			}
		}
		if cur.last > math.MaxUint64-n {
			return 0, nil, fmt.Errorf("%w: thread %q sender %q is at %d, cannot reserve %d more", ErrInvalidSenderOrder, thread, sender, cur.last, n)
		}
		next := cur.last + n
		pending := cur.pending
		if record != nil {
			rec, err := record(cur.last + 1)
			if err != nil {
				return 0, nil, err
			}
			if rec != nil {
				if bytes.IndexByte(rec, '\n') >= 0 {
					return 0, nil, errors.New("didcomm: a pending record is one line")
				}
				if !indexed {
					// Indexed before it exists: a record is never
					// unfindable, an index entry without one is dropped.
					if err := s.indexPending(ctx, key); err != nil {
						return 0, nil, err
					}
					indexed = true
				}
				pending = append(slices.Clone(pending), Pending{First: cur.last + 1, N: n, Record: rec})
			}
		}
		rev, err := s.write(ctx, key, next, pending, cur.rev)
		switch {
		case err == nil:
			s.remember(key, counterSeen{last: next, rev: rev, pending: pending})
			return cur.last + 1, cur.pending, nil
		case conflict(err):
			hinted = false // another reservation came first: read it
			if err := conflictWait(ctx, attempt); err != nil {
				s.forget(key)
				return 0, nil, fmt.Errorf("%w: reserve orders of thread %q sender %q: %v", ErrStateConflict, thread, sender, err)
			}
			continue
		default:
			s.forget(key)
			return 0, nil, fmt.Errorf("didcomm: reserve orders of thread %q sender %q: %w", thread, sender, err)
		}
	}
	s.forget(key)
	return 0, nil, fmt.Errorf("%w: reserve orders of thread %q sender %q: %d compare-and-set attempts lost to other reservations", ErrStateConflict, thread, sender, maxReserveAttempts)
}

// Stamp gives h the next sender_order of its thread (thid, or its own id)
// and sender, reserved in the bucket, and marks it a first send (no
// sent_count). It returns ErrMissingID or ErrMissingSender when h lacks
// what the order belongs to, and otherwise what Reserve returns; h is
// unchanged on error. A resend keeps its order: use Headers.Resend.
func (s *KVSequencer) Stamp(ctx context.Context, h *Headers) error {
	if h.ID == "" {
		return ErrMissingID
	}
	if h.From == "" {
		return ErrMissingSender
	}
	order, err := s.Reserve(ctx, h.ThreadID(), h.From, 1)
	if err != nil {
		return err
	}
	h.SenderOrder, h.SentCount = order, 0
	return nil
}

// GiveBack returns the orders first..first+n-1, reserved by Reserve and
// never used, to the counter, if no reservation came after them (the
// counter is still at first+n-1): the next Reserve then gives first
// again. It reports whether they were given back; when they were not,
// they are a hole that receivers see as missing. Call it only for orders
// no message carries, or receivers would drop the next message given them
// as a copy. It blocks for two bucket round trips at most.
func (s *KVSequencer) GiveBack(ctx context.Context, thread, sender string, first, n uint64) (bool, error) {
	if n == 0 || first == 0 || first-1 > math.MaxUint64-n {
		return false, fmt.Errorf("didcomm: give back %d orders from %d: not a reservation", n, first)
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	key := s.Key(thread, sender)
	cur, err := s.read(ctx, key)
	if err != nil {
		return false, err
	}
	if cur.last != first-1+n {
		return false, nil // reserved after us, or not ours
	}
	rev, err := s.write(ctx, key, first-1, cur.pending, cur.rev)
	switch {
	case err == nil:
		s.remember(key, counterSeen{last: first - 1, rev: rev, pending: cur.pending})
		return true, nil
	case conflict(err):
		s.forget(key)
		return false, nil
	default:
		s.forget(key)
		return false, fmt.Errorf("didcomm: give back orders of thread %q sender %q: %w", thread, sender, err)
	}
}

// Last is the last order reserved in the thread for sender (0: none), as
// the bucket has it now.
func (s *KVSequencer) Last(ctx context.Context, thread, sender string) (uint64, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	cur, err := s.read(ctx, s.Key(thread, sender))
	return cur.last, err
}

// read returns a counter as the bucket has it: zero for one never written
// (or deleted).
func (s *KVSequencer) read(ctx context.Context, key string) (counterSeen, error) {
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		s.forget(key)
		return counterSeen{}, nil
	}
	if err != nil {
		return counterSeen{}, fmt.Errorf("didcomm: read counter %s: %w", key, err)
	}
	last, pending, err := parseCounter(e.Value())
	if err != nil {
		// Never overwritten: a counter we cannot read might be ahead.
		return counterSeen{}, fmt.Errorf("%w: counter %s holds %.40q: %v", ErrInvalidSenderOrder, key, e.Value(), err)
	}
	cur := counterSeen{last: last, rev: e.Revision(), pending: pending}
	s.remember(key, cur)
	return cur, nil
}

// write sets a counter to last and its pending records if it is still at
// revision rev (0: absent).
func (s *KVSequencer) write(ctx context.Context, key string, last uint64, pending []Pending, rev uint64) (uint64, error) {
	value := formatCounter(last, pending)
	if rev == 0 {
		return s.kv.Create(ctx, key, value)
	}
	return s.kv.Update(ctx, key, value, rev)
}

func (s *KVSequencer) hint(key string) (counterSeen, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.seen[key]
	return c, ok
}

func (s *KVSequencer) remember(key string, c counterSeen) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.seen[key]; ok && old.rev > c.rev {
		return // a concurrent call saw a later revision
	}
	if len(s.seen) >= maxSeenCounters {
		clear(s.seen)
	}
	s.seen[key] = c
}

func (s *KVSequencer) forget(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.seen, key)
}

// conflict reports whether a compare-and-set failed because the key
// changed (or was created) since it was read.
func conflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

// withDefaultTimeout gives ctx a deadline when it has none.
// conflictWait waits a random while after the attempt-th lost
// compare-and-set (counted from 0), or until ctx ends.
func conflictWait(ctx context.Context, attempt int) error {
	limit := min(time.Duration(1<<min(attempt, 10))*50*time.Microsecond, maxConflictWait)
	t := time.NewTimer(rand.N(limit) + 1)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, counterTimeout)
}
