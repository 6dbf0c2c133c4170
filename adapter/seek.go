package adapter

// Seek (Pub/Sub's Seek): every message of the subscription before a point
// counts as acked, every message from it on as unacked, and is delivered
// again.
//
// JetStream cannot move a consumer back while messages it delivered are
// still in handlers without breaking one-in-flight per key: a handler may
// still run a key's later message when the key's earlier one comes again.
// So a seek starts a new epoch of consumers, and the epochs never overlap:
//
//  1. Seek stores Epoch+1, Settling and SeekSeq in the record, and pauses
//     the old epoch's consumers: they deliver nothing more.
//  2. Receivers that see the new epoch (supervise) hand no old message to a
//     handler again: each is acked unseen, and a nack or hand-back of one is
//     an ack (its fate is the seek's now). Messages already in handlers run
//     to their end.
//  3. Settling ends once no old consumer has a message delivered and
//     unacked (settle): then the new epoch's consumers are created at
//     SeekSeq, Settling is cleared, and the old consumers are deleted. A
//     dead receiver's messages stay unacked on a paused consumer, so a
//     pause lasts one ack deadline: after it the server redelivers them to
//     a live receiver, which acks them, and the next settle pauses again.
//  4. Receivers that see Settling cleared start again on the new epoch's
//     consumers. Its deliver subject and consumer names are the epoch's
//     own, so no receiver gets a new-epoch message before it knows the
//     epoch.
//
// Settle runs under the key-discovery lease, so it never overlaps key
// discovery (which stops when it sees the new epoch) or another settle.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/keyrouter"
)

// errEpochChanged ends one run of a receiver: the subscription was sought,
// and the new epoch's consumers exist.
var errEpochChanged = errors.New("the subscription was sought: receiving from the new epoch")

// A Point is a place in a topic, as seeks and snapshots name it: Seq is
// the sequence of the topic's own stream from which messages are unacked,
// and KeySeqs the same for each of its key streams (none for a topic
// without key streams, TopicConfig.KeyStreams).
type Point struct {
	Seq     uint64
	KeySeqs []uint64
}

// SeekToTime marks every message published before t as acked and every
// message published at or after t as unacked: those are delivered again,
// each key from its first message at or after t.
func (s *Subscription) SeekToTime(ctx context.Context, t time.Time) error {
	ctx, cancel := s.c.withTimeout(ctx)
	defer cancel()
	rec, err := s.load(ctx)
	if err != nil {
		return err
	}
	if err := s.c.checkTopic(ctx, rec); err != nil {
		return err
	}
	topic := s.c.TopicInProject(rec.Topic, rec.TopicProject)
	info, err := topic.info(ctx)
	if err != nil {
		return err
	}
	var p Point
	if p.Seq, err = topic.firstSequenceSince(ctx, topic.stream, t, info.State.LastSeq+1); err != nil {
		return err
	}
	if p.KeySeqs, err = s.c.keyStartSeqs(ctx, topic, rec.KeyStreams, t); err != nil {
		return err
	}
	return s.SeekToPoint(ctx, p)
}

// SeekToSequence marks every message of the topic before stream sequence
// seq as acked, and every message from seq on as unacked. A topic with key
// streams has no such order of all its messages: seek it to a Point.
func (s *Subscription) SeekToSequence(ctx context.Context, seq uint64) error {
	return s.SeekToPoint(ctx, Point{Seq: seq})
}

// SeekToPoint marks every message of the topic before p as acked, and
// every message from p on as unacked (FirstUnackedPoint gives one). On a
// topic moved onto key streams (Topic.MoveToKeyStreams), a point without
// KeySeqs (taken before the move) starts every key stream from its first
// message.
func (s *Subscription) SeekToPoint(ctx context.Context, p Point) error {
	p.Seq = max(p.Seq, 1)
	ctx, cancel := s.c.withTimeout(ctx)
	defer cancel()
	rec, err := s.load(ctx)
	if err != nil {
		return err
	}
	if len(p.KeySeqs) == 0 && rec.split() {
		// A point from before the topic's move onto key streams: every
		// keyed message published since the move comes after it.
		if moved, err := s.c.movedOntoKeyStreams(ctx, rec); err != nil {
			return err
		} else if moved {
			p.KeySeqs = keyStreamFirstSeqs(rec.KeyStreams)
		}
	}
	if len(p.KeySeqs) != len(keyStreamIndexes(rec.KeyStreams)) {
		if len(p.KeySeqs) == 0 {
			return fmt.Errorf("seek %s: %w: its topic splits keyed messages over %d key streams, so a sequence is not a point of it",
				s, errors.ErrUnsupported, rec.KeyStreams)
		}
		return fmt.Errorf("%w: seek %s: a point of %d key streams, but its topic has %d", ErrInvalidConfig, s, len(p.KeySeqs), max(rec.KeyStreams, 0))
	}
	rec, err = s.modify(ctx, "seek", func(rec *subRecord) bool {
		if rec.Detached {
			return false
		}
		rec.Epoch++
		rec.Settling = true
		rec.SeekSeq = p.Seq
		rec.SeekKeySeqs = p.KeySeqs
		return true
	})
	if err != nil {
		return err
	}
	if rec.Detached {
		return fmt.Errorf("%w: %s", ErrDetached, s)
	}
	if _, err := s.c.topicStream(ctx, rec); err != nil {
		return err
	}
	if _, err := s.pauseOld(ctx, rec); err != nil {
		return fmt.Errorf("seek %s: %w", s, err)
	}
	// Settled at once when nothing is in flight; otherwise receivers
	// settle it once their handlers are done.
	if err := s.settle(ctx); err != nil {
		return fmt.Errorf("seek %s: %w", s, err)
	}
	return nil
}

// FirstUnacked returns the stream sequence of the subscription's first
// unacked message, and when it was published (the zero time when there is
// none yet): every message before it is acked (a snapshot's point).
// Messages after it may be acked too; seeking to it delivers them again.
// A topic with key streams has no such sequence: use FirstUnackedPoint.
func (s *Subscription) FirstUnacked(ctx context.Context) (uint64, time.Time, error) {
	p, oldest, err := s.FirstUnackedPoint(ctx)
	if err == nil && len(p.KeySeqs) > 0 {
		return 0, time.Time{}, fmt.Errorf("first unacked of %s: %w: its topic splits keyed messages over %d key streams, so a sequence is not a point of it",
			s, errors.ErrUnsupported, len(p.KeySeqs))
	}
	return p.Seq, oldest, err
}

// FirstUnackedPoint returns the point of the subscription's first unacked
// message in each of its topic's streams, and when the oldest of those
// was published (the zero time when there is none yet): every message
// before the point is acked. Messages after it may be acked too; seeking
// to it delivers them again.
func (s *Subscription) FirstUnackedPoint(ctx context.Context) (Point, time.Time, error) {
	ctx, cancel := s.c.withTimeout(ctx)
	defer cancel()
	rec, err := s.load(ctx)
	if err != nil {
		return Point{}, time.Time{}, err
	}
	for attempt := 1; ; attempt++ {
		p, oldest, err := s.firstUnackedPoint(ctx, rec)
		if attempt == 3 {
			return p, oldest, err
		}
		// Sought (or moved onto key streams) by another process
		// meanwhile, the answer is of the epoch before, or its read
		// failed: the settle removes that epoch's consumers and
		// discovery floor. The new epoch answers.
		now, lerr := s.load(ctx)
		if lerr != nil || now.Epoch == rec.Epoch {
			return p, oldest, err
		}
		rec = now
	}
}

// firstUnackedPoint is FirstUnackedPoint for the subscription's record rec.
func (s *Subscription) firstUnackedPoint(ctx context.Context, rec *subRecord) (Point, time.Time, error) {
	stream, err := s.c.topicStream(ctx, rec)
	if err != nil {
		return Point{}, time.Time{}, err
	}
	var p Point
	if p.Seq, err = s.firstUnacked(ctx, rec, stream); err != nil {
		return Point{}, time.Time{}, err
	}
	oldest, err := firstStored(ctx, stream, p.Seq)
	if err != nil {
		return Point{}, time.Time{}, err
	}
	var keyStreams []jetstream.Stream
	if p.KeySeqs, keyStreams, err = s.firstUnackedKeyed(ctx, rec); err != nil {
		return Point{}, time.Time{}, err
	}
	for i, seq := range p.KeySeqs {
		at, err := firstStored(ctx, keyStreams[i], seq)
		if err != nil {
			return Point{}, time.Time{}, err
		}
		if !at.IsZero() && (oldest.IsZero() || at.Before(oldest)) {
			oldest = at
		}
	}
	return p, oldest, nil
}

// firstStored returns when the message of stream at seq (or the first one
// after it) was stored: the zero time when there is none.
func firstStored(ctx context.Context, stream jetstream.Stream, seq uint64) (time.Time, error) {
	state := stream.CachedInfo().State
	if seq > state.LastSeq {
		return time.Time{}, nil // nothing unacked yet
	}
	m, err := stream.GetMsg(ctx, max(seq, state.FirstSeq))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, err
	}
	return m.Time, nil
}

// firstUnackedKeyed is firstUnacked for each key stream of the
// subscription's topic, with the key streams: none for a topic without
// key streams.
func (s *Subscription) firstUnackedKeyed(ctx context.Context, rec *subRecord) ([]uint64, []jetstream.Stream, error) {
	indexes := keyStreamIndexes(rec.KeyStreams)
	if len(indexes) == 0 {
		return nil, nil, nil
	}
	streams := make([]jetstream.Stream, len(indexes))
	for _, i := range indexes {
		var err error
		if streams[i], err = s.c.js.Stream(ctx, keyrouter.KeyStreamName(rec.TopicProject, rec.Topic, i)); err != nil {
			return nil, nil, err
		}
	}
	if rec.Settling {
		return rec.SeekKeySeqs, streams, nil
	}
	infos, err := s.c.topicConsumers(ctx, rec)
	if err != nil {
		return nil, nil, err
	}
	starts := rec.KeyStartSeqs
	out := make([]uint64, len(indexes))
	prefix := keyrouter.SubscriptionBase(rec.Project, rec.nameID()) + "_"
	for _, i := range indexes {
		name := streams[i].CachedInfo().Config.Name
		first := streams[i].CachedInfo().State.LastSeq + 1
		for _, info := range infos {
			if info.Stream != name || !strings.HasPrefix(info.Name, prefix) || info.NumAckPending == 0 && info.NumPending == 0 {
				continue
			}
			first = min(first, info.AckFloor.Stream+1)
		}
		if rec.Ordering && !rec.partitioned() {
			// Per-key delivery: keyed messages after the stream's
			// discovery floor may have no consumer yet (firstUnacked).
			floor, err := s.discoveryFloor(ctx, keyStreamFloorKey(s.kvKey(), rec.Epoch, i))
			if err != nil {
				return nil, nil, err
			}
			first = min(first, s.firstUncovered(ctx, streams[i], keyStreamFilter(rec, i), rec, floor+1, infos))
		}
		out[i] = max(first, starts[i])
	}
	return out, streams, nil
}

// firstUnacked is the first unacked sequence of the topic's own stream.
func (s *Subscription) firstUnacked(ctx context.Context, rec *subRecord, stream jetstream.Stream) (uint64, error) {
	if rec.Settling {
		return rec.SeekSeq, nil
	}
	infos, err := s.c.consumerInfos(ctx, stream, rec)
	if err != nil {
		return 0, err
	}
	first := stream.CachedInfo().State.LastSeq + 1
	if rec.Ordering && !rec.partitioned() && !rec.split() {
		// Keyed messages after the discovery floor may have no consumer
		// yet: they are unacked. (With key streams this stream holds
		// none: firstUnackedKeyed looks at theirs.)
		floor, err := s.discoveryFloor(ctx, s.floorKey(rec.Epoch))
		if err != nil {
			return 0, err
		}
		first = min(first, s.firstUncovered(ctx, stream, keyrouter.KeyedFilter(rec.TopicProject, rec.Topic), rec, floor+1, infos))
	}
	prefix := keyrouter.SubscriptionBase(rec.Project, rec.nameID()) + "_"
	for _, info := range infos {
		if !strings.HasPrefix(info.Name, prefix) {
			continue // another epoch's, about to go
		}
		if info.NumAckPending == 0 && info.NumPending == 0 {
			continue // everything it has is acked
		}
		first = min(first, info.AckFloor.Stream+1)
	}
	return max(first, rec.StartSeq), nil
}

// discoveryFloor reads the discovery floor stored at key.
func (s *Subscription) discoveryFloor(ctx context.Context, key string) (uint64, error) {
	kv, err := s.c.buckets(ctx)
	if err != nil {
		return 0, err
	}
	e, err := kv.Get(ctx, key)
	if err != nil {
		return 0, fmt.Errorf("subscription %s: discovery floor: %w", s, err)
	}
	floor, err := strconv.ParseUint(string(e.Value()), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("subscription %s: corrupt discovery floor %q", s, e.Value())
	}
	return floor, nil
}

// topicStream is the subscription's topic stream; ErrTopicDeleted when it
// is gone.
func (c *Client) topicStream(ctx context.Context, rec *subRecord) (jetstream.Stream, error) {
	stream, err := c.js.Stream(ctx, rec.stream())
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("%w: projects/%s/topics/%s", ErrTopicDeleted, rec.TopicProject, rec.Topic)
	}
	return stream, err
}

// maxCoverScan bounds the messages firstUncovered looks at.
const maxCoverScan = 10_000

// firstUncovered returns the first keyed message (of filter) from seq on that no key
// consumer covers (not discovered yet: unacked), for per-key delivery. The
// stored discovery floor is written now and then, so the messages after it
// are mostly covered: a key's consumer that exists covers every message of
// the key after the floor. Past maxCoverScan messages it gives up, and
// returns where it got to (a snapshot then goes back further than needed).
func (s *Subscription) firstUncovered(ctx context.Context, stream jetstream.Stream, filter string, rec *subRecord, seq uint64, infos []*jetstream.ConsumerInfo) uint64 {
	live := make(map[string]bool, len(infos))
	for _, info := range infos {
		live[info.Name] = true
	}
	for range maxCoverScan {
		m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if err != nil {
			return seq // none (ErrMsgNotFound: seq is past the last), or unknown
		}
		token, ok := keyrouter.TokenOfSubject(m.Subject)
		if !ok || !live[keyrouter.KeyConsumer(rec.Project, rec.nameID(), token)] {
			return m.Sequence
		}
		seq = m.Sequence + 1
	}
	return seq
}

// oldConsumers are the consumers of the subscription's earlier epochs.
func (c *Client) oldConsumers(ctx context.Context, rec *subRecord) ([]*jetstream.ConsumerInfo, error) {
	infos, err := c.topicConsumers(ctx, rec)
	if err != nil {
		return nil, err
	}
	prefix := keyrouter.SubscriptionBase(rec.Project, rec.nameID()) + "_"
	old := infos[:0]
	for _, info := range infos {
		if !strings.HasPrefix(info.Name, prefix) {
			old = append(old, info)
		}
	}
	return old, nil
}

// pauseOld pauses the old epoch's consumers that are not paused, for one
// ack deadline, and reports whether every old consumer has settled all it
// delivered.
func (s *Subscription) pauseOld(ctx context.Context, rec *subRecord) (settled bool, err error) {
	old, err := s.c.oldConsumers(ctx, rec)
	if err != nil {
		return false, err
	}
	// At least a few seconds: a receiver learns of the seek within a
	// second or so (supervise), and hands old messages to no handler from
	// then on.
	until := time.Now().Add(max(rec.ackDeadline(), minSeekPause))
	err = forEachParallel(ctx, old, 16, func(ctx context.Context, info *jetstream.ConsumerInfo) error {
		if info.Paused {
			return nil
		}
		_, err := s.c.js.PauseConsumer(ctx, info.Stream, info.Name, until)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil
		}
		return err
	})
	if err != nil {
		return false, err
	}
	// Counted after the pause: nothing more is delivered meanwhile.
	old, err = s.c.oldConsumers(ctx, rec)
	if err != nil {
		return false, err
	}
	for _, info := range old {
		if info.NumAckPending > 0 && !abandoned(info, rec.ackDeadline()) {
			return false, nil
		}
	}
	return true, nil
}

// minSeekPause is the shortest pause of an old epoch's consumer.
const minSeekPause = 5 * time.Second

// abandoned reports whether the messages an old consumer has out are held
// by nobody: no receiver is attached to it (they stay attached until the
// seek settles), and nothing was delivered for an ack deadline, so no
// holder can be extending them.
func abandoned(info *jetstream.ConsumerInfo, ackDeadline time.Duration) bool {
	attached := info.PushBound || info.NumWaiting > 0
	last := info.Delivered.Last
	return !attached && last != nil && time.Since(*last) > ackDeadline
}

// settle ends the settling of a seek if the old epoch has nothing in
// flight: it creates the new epoch's consumers, clears Settling and deletes
// the old consumers. It does nothing when another process holds the
// key-discovery lease (that process settles), or there is nothing to
// settle.
func (s *Subscription) settle(ctx context.Context) error {
	rec, err := s.load(ctx)
	if err != nil || !rec.Settling {
		return err
	}
	subs, leases, ttl, err := s.c.registry(ctx)
	if err != nil {
		return err
	}
	holder := "seek-" + uuid.NewString()
	l := newLease(leases, s.kvKey(), holder, ttl, s.c.cfg.apiTimeout, nil)
	ok, err := l.acquire(ctx, nil)
	if err != nil || !ok {
		return err
	}
	defer l.release()
	if !rec.partitioned() && rec.Ordering && rec.split() {
		// Per-key delivery on key streams: each key stream's discoverer
		// holds a lease of its own, and the settle holds them all.
		for _, i := range keyStreamIndexes(rec.KeyStreams) {
			kl := newLease(leases, keyStreamLeaseKey(s.kvKey(), i), holder, ttl, s.c.cfg.apiTimeout, nil)
			ok, err := kl.acquire(ctx, nil)
			if err != nil || !ok {
				return err
			}
			defer kl.release()
		}
	}
	lctx, cancel, err := l.opContext(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	if rec, err = s.load(lctx); err != nil || !rec.Settling {
		return err
	}
	settled, err := s.pauseOld(lctx, rec)
	if err != nil || !settled {
		return err
	}
	next := *rec
	next.StartSeq = max(rec.SeekSeq, 1)
	if len(rec.SeekKeySeqs) > 0 {
		next.KeyStartSeqs = rec.SeekKeySeqs
	}
	if err := s.createConsumers(lctx, subs, &next); err != nil {
		return fmt.Errorf("create the consumers of epoch %d: %w", rec.Epoch, err)
	}
	epoch := rec.Epoch
	if _, err := s.modify(lctx, "seek", func(r *subRecord) bool {
		if r.Epoch != epoch || !r.Settling {
			return false // sought again meanwhile: that seek settles
		}
		r.Settling = false
		return true
	}); err != nil {
		return err
	}
	old, err := s.c.oldConsumers(lctx, rec)
	if err != nil {
		return err
	}
	if err := forEachParallel(lctx, old, 16, func(ctx context.Context, info *jetstream.ConsumerInfo) error {
		err := s.c.js.DeleteConsumer(ctx, info.Stream, info.Name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil
		}
		return err
	}); err != nil {
		return fmt.Errorf("delete the consumers of earlier epochs: %w", err)
	}
	s.purgeFloors(lctx, subs, &epoch)
	s.c.cfg.logger.Info("seek settled", "subscription", s.String(), "epoch", epoch, "from_sequence", rec.SeekSeq)
	return nil
}

// purgeFloors removes the key-discovery floors of the subscription's
// epochs, but for keep's.
func (s *Subscription) purgeFloors(ctx context.Context, kv jetstream.KeyValue, keep *uint64) {
	var except string
	if keep != nil {
		except = s.floorKey(*keep)
	}
	if base := s.floorKey(0); base != except {
		_ = kv.Purge(ctx, base)
	}
	keys, err := kv.ListKeysFiltered(ctx, s.floorKey(0)+".>")
	if err != nil {
		return
	}
	for k := range keys.Keys() {
		if except == "" || k != except && !strings.HasPrefix(k, except+".k") { // keep's key streams' floors too
			_ = kv.Purge(ctx, k)
		}
	}
}
