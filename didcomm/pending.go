package didcomm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
)

// Write-ahead records in KVSequencer counters (docs/WIRE.md). A counter's
// value is its last order on the first line and, on each further line, a
// pending record: "<first> <n> <record>". A record's orders after the last
// order were given back (GiveBack leaves records as they are).

// parseCounter reads a counter's value.
func parseCounter(v []byte) (last uint64, pending []Pending, err error) {
	head, rest, more := bytes.Cut(v, []byte{'\n'})
	if last, err = parseCount(string(head)); err != nil {
		return 0, nil, err
	}
	for more {
		var line []byte
		line, rest, more = bytes.Cut(rest, []byte{'\n'})
		p, err := parsePending(line)
		if err != nil {
			return 0, nil, fmt.Errorf("pending record %d: %w", len(pending)+1, err)
		}
		pending = append(pending, p)
	}
	return last, pending, nil
}

func parsePending(line []byte) (Pending, error) {
	first, rest, ok1 := bytes.Cut(line, []byte{' '})
	n, rec, ok2 := bytes.Cut(rest, []byte{' '})
	if !ok1 || !ok2 {
		return Pending{}, errors.New(`not "<first> <n> <record>"`)
	}
	f, err1 := parseCount(string(first))
	c, err2 := parseCount(string(n))
	if err := errors.Join(err1, err2); err != nil || f == 0 || c == 0 || f-1 > ^uint64(0)-c {
		return Pending{}, fmt.Errorf("orders %q count %q: not a reservation", first, n)
	}
	return Pending{First: f, N: c, Record: bytes.Clone(rec)}, nil
}

// formatCounter writes a counter's value.
func formatCounter(last uint64, pending []Pending) []byte {
	v := strconv.AppendUint(nil, last, 10)
	for _, p := range pending {
		v = append(v, '\n')
		v = strconv.AppendUint(v, p.First, 10)
		v = append(v, ' ')
		v = strconv.AppendUint(v, p.N, 10)
		v = append(v, ' ')
		v = append(v, p.Record...)
	}
	return v
}

// IndexPending keeps, in index, an empty key named as the counter for
// every counter that may hold pending records, written before the record
// and deleted once the counter holds none, so that PendingCounters finds
// them without reading every counter. Call it before the first
// ReserveWith; every KVSequencer over the bucket should use the same
// index.
func (s *KVSequencer) IndexPending(index jetstream.KeyValue) { s.index = index }

func (s *KVSequencer) indexPending(ctx context.Context, key string) error {
	if s.index == nil {
		return nil
	}
	if _, err := s.index.Put(ctx, key, nil); err != nil {
		return fmt.Errorf("didcomm: index pending record of counter %s: %w", key, err)
	}
	return nil
}

// PendingCounters returns the keys of this sequencer's counters that may
// hold pending records (IndexPending; none without an index).
func (s *KVSequencer) PendingCounters(ctx context.Context) ([]string, error) {
	if s.index == nil {
		return nil, nil
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	filter := ">"
	if s.prefix != "" {
		filter = s.prefix + ".>"
	}
	lister, err := s.index.ListKeysFiltered(ctx, filter)
	if err != nil {
		return nil, fmt.Errorf("didcomm: list counters with pending records: %w", err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("didcomm: list counters with pending records: %w", err)
	}
	slices.Sort(keys)
	return slices.Compact(keys), nil // a busy index may list a key twice
}

// PendingAt reads the counter with key (Key): its last order and pending
// records, oldest first.
func (s *KVSequencer) PendingAt(ctx context.Context, key string) (last uint64, pending []Pending, err error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	cur, err := s.read(ctx, key)
	return cur.last, cur.pending, err
}

// Settle removes the pending record of the reservation starting at first
// from the counter with key: everything it was for is sent, or will never
// be. Settling a record that is not there does nothing. When the counter
// then holds none, its index entry goes.
func (s *KVSequencer) Settle(ctx context.Context, key string, first uint64) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	cur, hinted := s.hint(key)
	for attempt := range maxReserveAttempts {
		if !hinted {
			var err error
			if cur, err = s.read(ctx, key); err != nil {
				return err
			}
		}
		i := slices.IndexFunc(cur.pending, func(p Pending) bool { return p.First == first })
		if i < 0 {
			if hinted {
				hinted = false // the hint may be stale: look
				continue
			}
			return s.unindex(ctx, key, cur)
		}
		pending := slices.Delete(slices.Clone(cur.pending), i, i+1)
		rev, err := s.write(ctx, key, cur.last, pending, cur.rev)
		switch {
		case err == nil:
			cur = counterSeen{last: cur.last, rev: rev, pending: pending}
			s.remember(key, cur)
			return s.unindex(ctx, key, cur)
		case conflict(err):
			hinted = false
			if err := conflictWait(ctx, attempt); err != nil {
				s.forget(key)
				return fmt.Errorf("%w: settle pending record of counter %s: %v", ErrStateConflict, key, err)
			}
		default:
			s.forget(key)
			return fmt.Errorf("didcomm: settle pending record of counter %s: %w", key, err)
		}
	}
	s.forget(key)
	return fmt.Errorf("%w: settle pending record of counter %s: %d compare-and-set attempts lost", ErrStateConflict, key, maxReserveAttempts)
}

// unindex drops the index entry of a counter that, as of cur, holds no
// pending record; if one was added meanwhile (by a reserver that indexed
// it before this delete), the entry is written again.
func (s *KVSequencer) unindex(ctx context.Context, key string, cur counterSeen) error {
	if s.index == nil || len(cur.pending) > 0 {
		return nil
	}
	if err := s.index.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("didcomm: drop index entry of counter %s: %w", key, err)
	}
	again, err := s.read(ctx, key)
	if err != nil || len(again.pending) == 0 {
		return err
	}
	return s.indexPending(ctx, key)
}
