package broker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/didcomm"
	"github.com/jetorder/jetorder/keyrouter"
)

// Write-ahead records of stamped messages.
//
// Each reservation of sender_orders carries, in the same compare-and-set
// of the counter (didcomm.KVSequencer.ReserveWith), a record of the
// stamped messages it is for: topic, ordering keys, data, attributes and
// headers, as they will be published. Once every message of the request
// has a result that says stored (or certainly not stored), the record is
// settled (removed). A record left behind is replayed: each of its
// messages that the topic does not hold (looked up on its key's subject
// from shortly before the reservation, by DIDComm thread, sender and
// order) is published again, in order, then the record is settled. So a
// crash between reservation and store leaves no hole, and a message found
// stored is not stored twice.
//
// Who replays: the next request of the same thread and sender (before its
// own messages, so that they follow), and RecoverStamps, which a sidecar
// runs at start and every recoverEvery. A record of another broker is
// replayed only once that broker is gone: each broker answers on
// _jetorder.stamper.<owner> while it runs, and "no responders" says it is
// gone. An index bucket (JO_DIDCOMM_PENDING) names the counters that hold
// records, so recovery reads only those.

// didcommPendingBucket indexes the counters holding write-ahead records.
const didcommPendingBucket = "JO_DIDCOMM_PENDING"

const (
	// maxStampRecord bounds a write-ahead record: it lives in the counter's
	// value, which must fit a NATS message. A group of stamped messages
	// whose record would be larger is stamped without one (logged).
	maxStampRecord = 256 << 10
	// replaySkew is how far before a record's time the lookup for its
	// stored messages starts: clocks of sidecars sharing the bucket differ.
	replaySkew = time.Minute
	// ownerAskTimeout bounds asking whether a record's owner still runs.
	ownerAskTimeout = 2 * time.Second
	// replayTimeout bounds replaying one record.
	replayTimeout = adapter.MaxPublishTimeout + 30*time.Second
	// recoverEvery is how often a sidecar looks for records left by
	// brokers that are gone.
	recoverEvery = time.Minute
)

// stampRecord is a write-ahead record: the stamped messages of one thread
// and sender in one request, the n-th with order first+n.
type stampRecord struct {
	Owner   string         `json:"owner"` // the broker that reserved
	At      int64          `json:"at"`    // reservation time, Unix milliseconds
	Project string         `json:"project"`
	Topic   string         `json:"topic"`
	Thread  string         `json:"thread"`
	Sender  string         `json:"sender"`
	Msgs    []recordedItem `json:"msgs"`
}

// recordedItem is a stamped message as it is published.
type recordedItem struct {
	Key    string            `json:"key,omitempty"`
	Data   []byte            `json:"data,omitempty"`
	Attrs  map[string]string `json:"attrs,omitempty"`
	Header nats.Header       `json:"header,omitempty"`
}

func (r recordedItem) message() *adapter.Message {
	return &adapter.Message{OrderingKey: r.Key, Data: r.Data, Attributes: r.Attrs, Header: r.Header}
}

// ownerID returns this broker's owner id, answering on its presence
// subject from the first call on.
func (st *stamper) ownerID(nc *nats.Conn) (string, error) {
	st.ownerMu.Lock()
	defer st.ownerMu.Unlock()
	if st.owner != "" {
		return st.owner, nil
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	sub, err := nc.Subscribe(stamperSubject(id), func(m *nats.Msg) { _ = m.Respond(nil) })
	if err != nil {
		return "", fmt.Errorf("answer as DIDComm stamper: %w", err)
	}
	if err := nc.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return "", fmt.Errorf("answer as DIDComm stamper: %w", err)
	}
	st.owner, st.ownerSub = id, sub
	return id, nil
}

func stamperSubject(owner string) string { return "_jetorder.stamper." + owner }

// ownerGone reports whether the broker owner certainly no longer runs.
func (b *Broker) ownerGone(ctx context.Context, owner string) bool {
	b.stamps.ownerMu.Lock()
	self := b.stamps.owner
	b.stamps.ownerMu.Unlock()
	if owner == self {
		return true // this broker: not in flight, or its lock would be held
	}
	ctx, cancel := context.WithTimeout(ctx, ownerAskTimeout)
	defer cancel()
	_, err := b.nc.RequestWithContext(ctx, stamperSubject(owner), nil)
	return errors.Is(err, nats.ErrNoResponders)
}

// record returns the write-ahead record of g's messages stamped from
// first, or nil when it would be too large.
func (s *stamping) record(g *stampGroup, msgs []*adapter.Message, first uint64) ([]byte, error) {
	rec := stampRecord{Owner: s.owner, At: time.Now().UnixMilli(), Project: s.project, Topic: s.t.ID(), Thread: g.thread, Sender: g.sender}
	for j, it := range g.items {
		m := *msgs[it.i]
		if err := it.apply(&m, first+uint64(j)); err != nil {
			return nil, fmt.Errorf("messages[%d]: %w: stamp sender_order: %w", it.i, adapter.ErrInvalidMessage, err)
		}
		rec.Msgs = append(rec.Msgs, recordedItem{Key: m.OrderingKey, Data: m.Data, Attrs: m.Attributes, Header: m.Header})
	}
	v, err := json.Marshal(rec) // one line: JSON escapes every newline
	if err != nil {
		return nil, err
	}
	if len(v) > maxStampRecord {
		g.record, g.unrecorded = nil, true
		return nil, nil
	}
	g.record, g.unrecorded = v, false
	return v, nil
}

// settle removes g's write-ahead record: every message of it is stored,
// or certainly not (and its order given back or logged).
func (s *stamping) settle(g *stampGroup) {
	if g.unrecorded || g.first == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), giveBackTimeout)
	defer cancel()
	if err := s.seq.Settle(ctx, s.seq.Key(g.thread, g.sender), g.first); err != nil {
		s.b.log.Warn("DIDComm write-ahead record not settled: it is replayed later (what is stored is not stored again)",
			"thread", g.thread, "sender", g.sender, "orders", orderRange(g.first, g.first+uint64(len(g.items))-1), "err", err)
	}
}

// replayEarlier replays the records a counter held before this request's
// reservation whose owners are gone, before the request's own messages
// go. It returns an error when one could not be replayed: the request's
// messages would otherwise be stored before earlier orders.
func (s *stamping) replayEarlier(ctx context.Context, g *stampGroup, earlier []didcomm.Pending) error {
	key := s.seq.Key(g.thread, g.sender)
	for _, p := range earlier {
		err := s.b.replay(ctx, s.seq, key, p, g.first-1)
		if errors.Is(err, errOwnerRuns) {
			continue // another sidecar's request in flight: theirs and ours may interleave
		}
		if err != nil {
			return fmt.Errorf("earlier DIDComm messages of thread %q sender %q (orders %s) are not all stored yet: %w",
				g.thread, g.sender, orderRange(p.First, p.First+p.N-1), err)
		}
	}
	return nil
}

// errOwnerRuns says a record's owner still runs: it settles the record.
var errOwnerRuns = errors.New("its owner still runs")

// replay publishes again each message of the pending record p, in counter
// key, that is not stored, and settles p. Orders after last were given
// back and are not replayed. The caller holds the thread and sender's
// lock. A record of another broker that still runs is left to it
// (errOwnerRuns).
func (b *Broker) replay(ctx context.Context, seq *didcomm.KVSequencer, key string, p didcomm.Pending, last uint64) error {
	var rec stampRecord
	if err := json.Unmarshal(p.Record, &rec); err != nil || uint64(len(rec.Msgs)) != p.N {
		// Not ours to understand: leave it, say so.
		return fmt.Errorf("write-ahead record of orders %s is not readable (%d messages for %d orders): %v", orderRange(p.First, p.First+p.N-1), len(rec.Msgs), p.N, err)
	}
	if !b.ownerGone(ctx, rec.Owner) {
		return errOwnerRuns
	}
	ctx, cancel := context.WithTimeout(ctx, replayTimeout)
	defer cancel()
	t, err := b.Topic(rec.Project, rec.Topic)
	if err != nil {
		return err
	}
	stored, err := b.storedOrders(ctx, &rec, p.First)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		b.log.Warn("DIDComm write-ahead record of a deleted topic dropped: its orders are skipped",
			"topic", t.String(), "thread", rec.Thread, "sender", rec.Sender, "orders", orderRange(p.First, p.First+p.N-1))
		return seq.Settle(ctx, key, p.First)
	}
	if err != nil {
		return err
	}
	var results []*adapter.PublishResult
	var orders []uint64
	for j, item := range rec.Msgs {
		order := p.First + uint64(j)
		if order > last || stored[order] {
			continue
		}
		results = append(results, t.Publish(ctx, item.message()))
		orders = append(orders, order)
	}
	for i, r := range results {
		if _, err := r.Get(ctx); err != nil {
			if k := rec.Msgs[orders[i]-p.First].Key; k != "" {
				t.ResumePublish(k)
			}
			return fmt.Errorf("publish again DIDComm order %d: %w", orders[i], err)
		}
	}
	if len(orders) > 0 {
		b.log.Info("DIDComm stamped messages whose store was not confirmed published again from their write-ahead record",
			"topic", t.String(), "thread", rec.Thread, "sender", rec.Sender, "orders", orderList(orders))
	}
	return seq.Settle(ctx, key, p.First)
}

// storedOrders returns which of rec's orders (the n-th message has order
// first+n) the topic holds, looking at the subjects of its messages' keys
// from shortly before the reservation.
func (b *Broker) storedOrders(ctx context.Context, rec *stampRecord, first uint64) (map[uint64]bool, error) {
	js, err := jetstream.New(b.nc)
	if err != nil {
		return nil, err
	}
	var subjects []string
	for _, m := range rec.Msgs {
		s := keyrouter.UnkeyedSubject(rec.Project, rec.Topic)
		if m.Key != "" {
			s = keyrouter.KeyedSubject(rec.Project, rec.Topic, m.Key)
		}
		if !slices.Contains(subjects, s) {
			subjects = append(subjects, s)
		}
	}
	start := time.UnixMilli(rec.At).Add(-replaySkew)
	cons, err := js.OrderedConsumer(ctx, keyrouter.StreamName(rec.Project, rec.Topic), jetstream.OrderedConsumerConfig{
		FilterSubjects: subjects,
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
		OptStartTime:   &start,
	})
	if err != nil {
		return nil, err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, err
	}
	stored := make(map[uint64]bool)
	for pending := info.NumPending; pending > 0; {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, err
		}
		n := 0
		for m := range batch.Messages() {
			n++
			if md, err := m.Metadata(); err == nil {
				pending = md.NumPending
			}
			h, err := didcomm.Read(adapter.ReadMessage(m.Data(), m.Headers()))
			if err == nil && h.ThreadID() == rec.Thread && h.From == rec.Sender && h.SenderOrder >= first && h.SenderOrder < first+uint64(len(rec.Msgs)) {
				stored[h.SenderOrder] = true
			}
		}
		if err := batch.Error(); err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, errors.New("the topic's messages since the reservation could not be read")
		}
	}
	return stored, nil
}

// RecoverStamps replays the write-ahead records of stamped DIDComm
// messages that brokers now gone left unsettled (a crash between reserving
// orders and storing their messages), so that no order stays a hole. It
// returns how many records it replayed; records of brokers that still run
// are left to them. The sidecar runs it at start and every recoverEvery
// (RecoverStampsLoop).
func (b *Broker) RecoverStamps(ctx context.Context) (int, error) {
	js, err := jetstream.New(b.nc)
	if err != nil {
		return 0, err
	}
	if _, err := js.KeyValue(ctx, didcommPendingBucket); errors.Is(err, jetstream.ErrBucketNotFound) {
		return 0, nil // nothing was ever stamped with a record
	} else if err != nil {
		return 0, err
	}
	seq, err := b.stamps.sequencer(ctx, b, "")
	if err != nil {
		return 0, err
	}
	keys, err := seq.PendingCounters(ctx)
	if err != nil {
		return 0, err
	}
	replayed := 0
	var errs []error
	for _, key := range keys {
		n, err := b.recoverCounter(ctx, seq, key)
		replayed += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return replayed, errors.Join(errs...)
}

// recoverCounter replays the records of one counter whose owners are gone,
// holding its thread and sender's lock.
func (b *Broker) recoverCounter(ctx context.Context, seq *didcomm.KVSequencer, key string) (int, error) {
	_, pending, err := seq.PendingAt(ctx, key)
	if err != nil {
		return 0, err
	}
	if len(pending) == 0 {
		return 0, seq.Settle(ctx, key, 0) // drops the index entry
	}
	var rec stampRecord
	if err := json.Unmarshal(pending[0].Record, &rec); err != nil {
		return 0, fmt.Errorf("counter %s: write-ahead record not readable: %w", key, err)
	}
	lock := rec.Project + "\x00" + rec.Thread + "\x00" + rec.Sender
	if err := b.stamps.lock(ctx, lock); err != nil {
		return 0, err
	}
	defer b.stamps.unlock(lock)
	last, pending, err := seq.PendingAt(ctx, key) // again, under the lock
	if err != nil {
		return 0, err
	}
	replayed := 0
	for _, p := range pending {
		switch err := b.replay(ctx, seq, key, p, last); {
		case errors.Is(err, errOwnerRuns):
		case err != nil:
			return replayed, fmt.Errorf("thread %q sender %q: %w", rec.Thread, rec.Sender, err)
		default:
			replayed++
		}
	}
	return replayed, nil
}

// RecoverStampsLoop runs RecoverStamps now and every recoverEvery until
// ctx ends, logging what it did.
func (b *Broker) RecoverStampsLoop(ctx context.Context) {
	t := time.NewTicker(recoverEvery)
	defer t.Stop()
	for {
		n, err := b.RecoverStamps(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			b.log.Warn("DIDComm write-ahead records not all replayed; trying again later", "replayed", n, "err", err)
		case n > 0:
			b.log.Info("DIDComm write-ahead records left by a stopped sidecar replayed", "records", n)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}
