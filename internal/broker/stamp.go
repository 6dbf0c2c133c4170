package broker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/didcomm"
	"github.com/jetorder/jetorder/keyrouter"
)

// Stamping DIDComm sender_order on publish (AttrDIDComm: DIDCommStamp).
//
// A request's messages are all checked before any order is reserved: the
// attribute's value, that the message is DIDComm in exactly one form, has
// id and from and no sender_order yet, and that it still passes
// Topic.Validate once stamped with the longest order there is, so that no
// reserved order is thrown away for a reason known beforehand. Then, per
// thread and sender, in request order, one compare-and-set reserves the
// orders of all its messages in JO_DIDCOMM_ORDERS (didcomm.KVSequencer),
// shared by every sidecar on the NATS system: orders never repeat, across
// restarts and sidecars. Under group commit (Broker.Durable) the
// reservation is durable before any of its messages is written, so no
// power cut keeps a message and loses its order's reservation.
//
// Within one broker a lock per project, thread and sender is held from
// the reservation until every message of the request has its result, so
// the broker stores a sender's requests in order of their orders (within a
// request, messages on one ordering key are stored in request order, and
// on different keys in no order, as Pub/Sub orders them); two sidecars
// may interleave theirs (receivers then see them out of order, with no
// repeat and no hole). Orders of messages that certainly were not stored are
// given back when no reservation came after them; otherwise they are a
// hole, logged at Warn. A crash between the reservation and the store
// leaves no hole: the reservation carries a write-ahead record of its
// messages, replayed when nobody settled it (stampwal.go).

// didcommOrdersBucket holds the sender_order counters the broker stamps
// from, one key per project, thread and sender (docs/WIRE.md).
const didcommOrdersBucket = "JO_DIDCOMM_ORDERS"

const (
	// giveBackTimeout bounds giving orders back after a failed store.
	giveBackTimeout = 5 * time.Second
	// resultWait bounds how long a sender stays locked after its request
	// gave up waiting (its ctx ended) for results still to come: longer
	// than the adapter retries a publish.
	resultWait = adapter.MaxPublishTimeout + 30*time.Second
)

// stamper is the broker's DIDComm stamping state. The zero value is ready.
type stamper struct {
	openMu sync.Mutex // held while opening the buckets
	kv     jetstream.KeyValue
	index  jetstream.KeyValue              // counters holding write-ahead records
	seqs   map[string]*didcomm.KVSequencer // by project

	ownerMu  sync.Mutex
	owner    string // this broker's id in write-ahead records
	ownerSub *nats.Subscription

	locksMu sync.Mutex
	locks   map[string]*senderLock // by lockKey

	bgMu    sync.Mutex
	closing bool
	bg      sync.WaitGroup // releases waiting for results after their request returned
}

// senderLock is held by the one request of a thread and sender between
// reservation and results. ch holds a token while it is held; refs counts
// the requests holding or waiting, so an unused lock is dropped.
type senderLock struct {
	ch   chan struct{}
	refs int
}

// stampForm is where a message carries its DIDComm headers, as didcomm.Read
// finds them.
type stampForm int

const (
	formPlaintext  stampForm = iota + 1 // top-level members of a DIDComm plaintext JSON payload
	formAttributes                      // didcomm-* attributes
	formHeader                          // Didcomm- NATS headers
)

// stampItem is one message to stamp, as it came.
type stampItem struct {
	i      int // in the request
	form   stampForm
	h      didcomm.Headers
	data   []byte
	header nats.Header
	attrs  map[string]string // without AttrDIDComm; never written
}

// stampGroup is the messages of one thread and sender, in request order,
// given orders first, first+1, ...
type stampGroup struct {
	lock           string
	thread, sender string
	items          []*stampItem
	first          uint64 // 0 until reserved
	record         []byte // the write-ahead record reserved with
	unrecorded     bool   // reserved without a write-ahead record (too large)
}

// stamping is one request's reservation, held until release.
type stamping struct {
	b       *Broker
	project string
	owner   string // the broker's id in write-ahead records
	t       *adapter.Topic
	seq     *didcomm.KVSequencer
	groups  []*stampGroup // sorted by lock, the order they are locked in
	locked  int           // groups[:locked] are locked
}

// stamp stamps the messages of a request that ask for it, after checking
// them all, and returns the reservation to release once every message of
// the request has its result. It returns nil, nil when no message asks.
// An error leaves no order reserved and no lock held; a refused message is
// an error wrapping adapter.ErrInvalidMessage that names it as
// messages[i].
func (b *Broker) stamp(ctx context.Context, project string, t *adapter.Topic, msgs []*adapter.Message) (*stamping, error) {
	groups, err := stampGroups(t, msgs)
	if err != nil || len(groups) == 0 {
		return nil, err
	}
	seq, err := b.stamps.sequencer(ctx, b, project)
	if err != nil {
		return nil, err
	}
	owner, err := b.stamps.ownerID(b.nc)
	if err != nil {
		return nil, err
	}
	s := &stamping{b: b, project: project, owner: owner, t: t, seq: seq, groups: groups}
	for _, g := range groups {
		g.lock = project + "\x00" + g.thread + "\x00" + g.sender
	}
	slices.SortFunc(groups, func(x, y *stampGroup) int { return strings.Compare(x.lock, y.lock) })
	for _, g := range groups {
		if err := b.stamps.lock(ctx, g.lock); err != nil {
			s.abandon()
			return nil, fmt.Errorf("wait for the earlier messages of DIDComm thread %q sender %q: %w", g.thread, g.sender, err)
		}
		s.locked++
	}
	earlier := make([][]didcomm.Pending, len(groups))
	for i, g := range groups {
		first, prev, err := seq.ReserveWith(ctx, g.thread, g.sender, uint64(len(g.items)), func(first uint64) ([]byte, error) {
			return s.record(g, msgs, first)
		})
		if err != nil {
			s.abandon()
			return nil, fmt.Errorf("reserve DIDComm sender_order: %w", err)
		}
		g.first, earlier[i] = first, prev
		if g.unrecorded {
			b.log.Warn("DIDComm stamped messages too large for a write-ahead record: a crash before they are stored leaves their orders a hole",
				"topic", t.String(), "thread", g.thread, "sender", g.sender, "orders", orderRange(first, first+uint64(len(g.items))-1))
		}
	}
	if b.Durable != nil {
		if err := b.Durable(ctx); err != nil {
			s.abandon()
			return nil, fmt.Errorf("%w: DIDComm sender_order reservation: %w", adapter.ErrNotDurable, err)
		}
	}
	for i, g := range groups {
		if err := s.replayEarlier(ctx, g, earlier[i]); err != nil {
			s.abandon()
			return nil, err
		}
	}
	for _, g := range groups {
		for j, it := range g.items {
			if err := it.apply(msgs[it.i], g.first+uint64(j)); err != nil {
				s.abandon() // cannot happen: the same write passed with the longest order
				return nil, fmt.Errorf("messages[%d]: %w: stamp sender_order: %w", it.i, adapter.ErrInvalidMessage, err)
			}
		}
	}
	return s, nil
}

// stampGroups checks every message of a request that asks for stamping
// and groups them by thread and sender, in request order. It changes
// nothing.
func stampGroups(t *adapter.Topic, msgs []*adapter.Message) ([]*stampGroup, error) {
	var groups []*stampGroup
	byKey := map[[2]string]*stampGroup{}
	for i, m := range msgs {
		v, ok := m.Attributes[AttrDIDComm]
		if !ok {
			continue
		}
		if v != DIDCommStamp {
			return nil, fmt.Errorf("messages[%d]: %w: attribute %s is %.40q: the only value is %q", i, adapter.ErrInvalidMessage, AttrDIDComm, v, DIDCommStamp)
		}
		it, err := newStampItem(i, m)
		if err != nil {
			return nil, err
		}
		trial := *m
		if err := it.apply(&trial, math.MaxUint64); err != nil {
			return nil, fmt.Errorf("messages[%d]: %w: cannot stamp sender_order: %w", i, adapter.ErrInvalidMessage, err)
		}
		if err := t.Validate(&trial); err != nil {
			return nil, fmt.Errorf("messages[%d]: once stamped: %w", i, err)
		}
		k := [2]string{it.h.ThreadID(), it.h.From}
		g := byKey[k]
		if g == nil {
			g = &stampGroup{thread: k[0], sender: k[1]}
			byKey[k] = g
			groups = append(groups, g)
		}
		g.items = append(g.items, it)
	}
	return groups, nil
}

// newStampItem reads the DIDComm headers of message i, which asks to be
// stamped, and refuses it when it cannot be.
func newStampItem(i int, m *adapter.Message) (*stampItem, error) {
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("messages[%d]: %w: cannot stamp sender_order: %w", i, adapter.ErrInvalidMessage, fmt.Errorf(format, args...))
	}
	attrs := maps.Clone(m.Attributes)
	delete(attrs, AttrDIDComm)
	it := &stampItem{i: i, data: m.Data, header: m.Header, attrs: attrs}

	// Where didcomm.Read looks, in its order; a message must use one form.
	var forms []stampForm
	hh, ok, err := didcomm.ReadHeader(m.Header)
	if err != nil {
		return nil, refuse("%w", err)
	}
	if ok {
		forms, it.h = append(forms, formHeader), hh
	}
	ha, ok, err := didcomm.ReadAttributes(attrs)
	if err != nil {
		return nil, refuse("%w", err)
	}
	if ok {
		forms, it.h = append(forms, formAttributes), ha
	}
	var ct nats.Header // the plaintext rule looks at Content-Type only
	if v := m.Header.Values("Content-Type"); len(v) > 0 {
		ct = nats.Header{"Content-Type": v}
	}
	hp, err := didcomm.Read(&adapter.Message{Data: m.Data, Header: ct})
	switch {
	case err == nil:
		forms, it.h = append(forms, formPlaintext), hp
	case !errors.Is(err, didcomm.ErrNotDIDComm):
		return nil, refuse("%w", err)
	}
	switch len(forms) {
	case 0:
		return nil, refuse("%w: the payload is not a DIDComm plaintext JSON message (an object with string \"id\" and \"type\", or Content-Type %s) and there are no didcomm-* attributes", didcomm.ErrNotDIDComm, didcomm.PlaintextMediaType)
	case 1:
		it.form = forms[0]
	default:
		return nil, refuse("its DIDComm headers are in more than one form (%s): readers take only the first, so use one", formNames(forms))
	}
	switch h := it.h; {
	case h.ID == "":
		return nil, refuse("the DIDComm message has no id")
	case h.From == "":
		return nil, refuse("the DIDComm message has no from")
	case h.SenderOrder != 0:
		return nil, refuse("it already has sender_order %d; a resend keeps its order and is published without %s", h.SenderOrder, AttrDIDComm)
	}
	return it, nil
}

func (f stampForm) String() string {
	switch f {
	case formPlaintext:
		return "plaintext payload"
	case formAttributes:
		return "didcomm-* attributes"
	case formHeader:
		return "Didcomm- headers"
	}
	return "none"
}

func formNames(forms []stampForm) string {
	names := make([]string, len(forms))
	for i, f := range forms {
		names[i] = f.String()
	}
	return strings.Join(names, ", ")
}

// apply writes the message as it came, stamped with order as a first send
// and without AttrDIDComm, into m. The item is not changed.
func (it *stampItem) apply(m *adapter.Message, order uint64) error {
	h := it.h
	h.SenderOrder, h.SentCount = order, 0
	attrs := maps.Clone(it.attrs)
	switch it.form {
	case formPlaintext:
		data, err := didcomm.WritePlaintext(it.data, h)
		if err != nil {
			return err
		}
		m.Data = data
	case formAttributes:
		if attrs == nil {
			attrs = map[string]string{}
		}
		didcomm.WriteAttributes(attrs, h)
	case formHeader:
		header := make(nats.Header, len(it.header))
		for k, v := range it.header {
			header[k] = slices.Clone(v)
		}
		didcomm.WriteHeader(header, h)
		m.Header = header
	}
	if len(attrs) == 0 {
		attrs = nil
	}
	m.Attributes = attrs
	return nil
}

// release ends the reservation once every message of the request has its
// result: orders of messages certainly not stored are given back if no
// reservation came after them, other failed ones are logged as skipped,
// and the locks are let go. When results are still to come (the request's
// ctx ended first), it does that in the background, so that the sender's
// next messages are not stored before them. Safe on nil.
func (s *stamping) release(results []*adapter.PublishResult) {
	if s == nil {
		return
	}
	if s.resolved(results) {
		s.finish(results)
		return
	}
	s.b.stamps.background(func() {
		timeout := time.NewTimer(resultWait)
		defer timeout.Stop()
		for _, g := range s.groups {
			for _, it := range g.items {
				select {
				case <-results[it.i].Ready():
				case <-timeout.C:
					s.b.log.Warn("DIDComm stamped messages without a publish result; their orders may be skipped",
						"topic", s.t.String(), "thread", g.thread, "sender", g.sender, "orders", orderRange(g.first, g.first+uint64(len(g.items))-1))
					s.unlock()
					return
				}
			}
		}
		s.finish(results)
	})
}

func (s *stamping) resolved(results []*adapter.PublishResult) bool {
	for _, g := range s.groups {
		for _, it := range g.items {
			select {
			case <-results[it.i].Ready():
			default:
				return false
			}
		}
	}
	return true
}

// finish settles each group's orders against its messages' results, all
// known, and unlocks.
func (s *stamping) finish(results []*adapter.PublishResult) {
	defer s.unlock()
	var topicGone *bool // asked once, when a result says so
	neverStored := func(err error) bool {
		switch {
		case errors.Is(err, adapter.ErrInvalidMessage), errors.Is(err, adapter.ErrFlowControlLimit),
			errors.Is(err, adapter.ErrPublishingPaused), errors.Is(err, adapter.ErrTopicStopped),
			errors.Is(err, adapter.ErrClosed):
			return true // refused before it was sent
		case errors.Is(err, adapter.ErrTopicNotFound):
			// No stream answered. Trust it only if the topic is gone
			// indeed: nothing of it can then be stored.
			if topicGone == nil {
				ctx, cancel := context.WithTimeout(context.Background(), giveBackTimeout)
				ok, err := s.t.Exists(ctx)
				cancel()
				gone := err == nil && !ok
				topicGone = &gone
			}
			return *topicGone
		}
		return false // a timeout, a lost connection: it may be stored
	}
	for _, g := range s.groups {
		n := uint64(len(g.items))
		keep := uint64(0) // orders first..first+keep-1 stay taken
		var failed []uint64
		var firstErr error
		for j, it := range g.items {
			_, err := results[it.i].Get(context.Background()) // known: returns at once
			if err == nil {
				keep = uint64(j) + 1
				continue
			}
			failed = append(failed, g.first+uint64(j))
			if firstErr == nil {
				firstErr = err
			}
			if !neverStored(err) {
				keep = uint64(j) + 1
			}
		}
		if len(failed) == 0 {
			s.settle(g)
			continue
		}
		last := g.first + n - 1 // the last order that stays taken
		if keep < n {
			ctx, cancel := context.WithTimeout(context.Background(), giveBackTimeout)
			ok, err := s.seq.GiveBack(ctx, g.thread, g.sender, g.first+keep, n-keep)
			cancel()
			if err != nil {
				s.b.log.Warn("give back DIDComm orders", "thread", g.thread, "sender", g.sender, "err", err)
			}
			if ok {
				last = g.first + keep - 1
				failed = slices.DeleteFunc(failed, func(o uint64) bool { return o > last })
			}
		}
		if len(failed) == 0 {
			s.settle(g)
			continue
		}
		if !g.unrecorded {
			// Orders that stay taken may have no message stored: the
			// record publishes again what the topic does not hold, now,
			// or later if it cannot (the next request of the sender, or
			// recovery), so they are no hole.
			ctx, cancel := context.WithTimeout(context.Background(), giveBackTimeout)
			err := s.b.replay(ctx, s.seq, s.seq.Key(g.thread, g.sender), didcomm.Pending{First: g.first, N: n, Record: g.record}, last)
			cancel()
			if err != nil {
				s.b.log.Info("DIDComm stamped messages failed to publish (or their results were lost): their write-ahead record is replayed later",
					"topic", s.t.String(), "thread", g.thread, "sender", g.sender, "orders", orderList(failed), "publish_err", firstErr, "err", err)
			}
			continue
		}
		s.b.log.Warn("DIDComm orders skipped: stamped messages failed to publish (or their results were lost) and the orders could not be given back; receivers may see them missing",
			"topic", s.t.String(), "thread", g.thread, "sender", g.sender, "orders", orderList(failed), "err", firstErr)
	}
}

// abandon gives back every order reserved, settles their records and
// unlocks: nothing was sent.
func (s *stamping) abandon() {
	defer s.unlock()
	for _, g := range s.groups {
		if g.first == 0 {
			continue
		}
		defer s.settle(g)
		ctx, cancel := context.WithTimeout(context.Background(), giveBackTimeout)
		ok, err := s.seq.GiveBack(ctx, g.thread, g.sender, g.first, uint64(len(g.items)))
		cancel()
		if !ok {
			s.b.log.Warn("DIDComm orders skipped: reserved for a request that failed before publishing, and could not be given back",
				"topic", s.t.String(), "thread", g.thread, "sender", g.sender, "orders", orderRange(g.first, g.first+uint64(len(g.items))-1), "err", err)
		}
	}
}

func (s *stamping) unlock() {
	for _, g := range s.groups[:s.locked] {
		s.b.stamps.unlock(g.lock)
	}
	s.locked = 0
}

// sequencer returns the counters of a project, opening (or creating) the
// bucket on first use.
func (st *stamper) sequencer(ctx context.Context, b *Broker, project string) (*didcomm.KVSequencer, error) {
	st.openMu.Lock()
	defer st.openMu.Unlock()
	if st.kv == nil {
		js, err := jetstream.New(b.nc)
		if err != nil {
			return nil, err
		}
		kv, err := openBucket(ctx, js, jetstream.KeyValueConfig{
			Bucket:      didcommOrdersBucket,
			Description: "jetorder DIDComm sender_order counters the sidecar stamps from: the last order per project, thread and sender",
			Storage:     jetstream.FileStorage,
			Replicas:    max(b.BucketReplicas, 1),
		})
		if err != nil {
			return nil, err
		}
		index, err := openBucket(ctx, js, jetstream.KeyValueConfig{
			Bucket:      didcommPendingBucket,
			Description: "jetorder DIDComm counters holding write-ahead records of stamped messages not yet confirmed stored",
			Storage:     jetstream.FileStorage,
			Replicas:    max(b.BucketReplicas, 1),
		})
		if err != nil {
			return nil, err
		}
		st.kv, st.index = kv, index
		st.seqs = make(map[string]*didcomm.KVSequencer)
	}
	seq := st.seqs[project]
	if seq == nil {
		seq = didcomm.NewKVSequencer(st.kv, keyrouter.KVToken(project))
		seq.IndexPending(st.index)
		st.seqs[project] = seq
	}
	return seq, nil
}

// openBucket opens a KV bucket, creating it with cfg when absent.
func openBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, cfg)
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, cfg.Bucket) // another sidecar made it first
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// lock takes the lock of key, waiting while another request holds it or
// until ctx ends.
func (st *stamper) lock(ctx context.Context, key string) error {
	st.locksMu.Lock()
	if st.locks == nil {
		st.locks = make(map[string]*senderLock)
	}
	l := st.locks[key]
	if l == nil {
		l = &senderLock{ch: make(chan struct{}, 1)}
		st.locks[key] = l
	}
	l.refs++
	st.locksMu.Unlock()
	select {
	case l.ch <- struct{}{}:
		return nil
	case <-ctx.Done():
		st.locksMu.Lock()
		if l.refs--; l.refs == 0 {
			delete(st.locks, key)
		}
		st.locksMu.Unlock()
		return ctx.Err()
	}
}

func (st *stamper) unlock(key string) {
	st.locksMu.Lock()
	defer st.locksMu.Unlock()
	l := st.locks[key]
	<-l.ch
	if l.refs--; l.refs == 0 {
		delete(st.locks, key)
	}
}

// background runs f in a goroutine that wait waits for; once wait has
// begun, f runs in the caller's goroutine instead.
func (st *stamper) background(f func()) {
	st.bgMu.Lock()
	if st.closing {
		st.bgMu.Unlock()
		f()
		return
	}
	st.bg.Add(1)
	st.bgMu.Unlock()
	go func() {
		defer st.bg.Done()
		f()
	}()
}

// wait waits for the background releases; each is bounded by resultWait,
// and ends at once when the topics' publishers have stopped.
func (st *stamper) wait() {
	st.bgMu.Lock()
	st.closing = true
	st.bgMu.Unlock()
	st.bg.Wait()
	st.ownerMu.Lock()
	if st.ownerSub != nil {
		_ = st.ownerSub.Unsubscribe() // gone: another sidecar may replay what is left
	}
	st.ownerMu.Unlock()
}

func orderRange(first, last uint64) string {
	if first == last {
		return strconv.FormatUint(first, 10)
	}
	return strconv.FormatUint(first, 10) + ".." + strconv.FormatUint(last, 10)
}

// orderList writes ascending orders as ranges: "3, 5..9".
func orderList(orders []uint64) string {
	var parts []string
	for i := 0; i < len(orders); {
		j := i
		for j+1 < len(orders) && orders[j+1] == orders[j]+1 {
			j++
		}
		parts = append(parts, orderRange(orders[i], orders[j]))
		i = j + 1
	}
	return strings.Join(parts, ", ")
}
