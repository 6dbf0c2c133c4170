package adapter

// Moving a topic of one stream onto key streams (TopicConfig.KeyStreams),
// with its subscriptions, while publishers and receivers run:
//
//  1. The topic's own stream gives up its keyed subjects and records the
//     key stream count; keyed publishes then find no stream for a moment,
//     and publishers send them again (publisher.retryable).
//  2. The key streams are created, empty, with the keyed subjects: keyed
//     messages published from then on are stored there. The topic's own
//     stream keeps the keyed messages published before, and takes no more.
//  3. Each subscription keeps reading the topic's own stream as before
//     until every keyed message there is acked, and then moves: a new
//     epoch of its consumers (seek.go) reads the key streams from their
//     start and the topic's own stream's unkeyed messages from its first
//     unacked one. So a key's messages from before the move are all acked
//     before any of its later ones is delivered. Receivers move their
//     subscription (receiver.supervise); Topic.MoveToKeyStreams moves those
//     it can at once.
//
// Every step can run again, and builds that know key streams may run
// beside it: a subscription not yet moved reads what it read before.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/keyrouter"
)

// KeyStreamsMove reports what Topic.MoveToKeyStreams did with the
// subscriptions of the topic's project: Moved read the key streams now;
// Waiting still have keyed messages from before the move unacked, and move
// once their receivers have acked them.
type KeyStreamsMove struct {
	Moved, Waiting []string
}

// MoveToKeyStreams splits the keyed messages of a topic of one stream over
// n key streams from now on, as TopicConfig.KeyStreams does at creation,
// and moves its subscriptions onto them (the steps are in move.go's
// opening comment): keyed messages published before stay in the topic's own stream
// and are delivered first, each subscription moving once it has acked
// them. On a topic moved onto n key streams before, the move is made
// whole (key streams a move cut short left out are created) and the
// subscriptions still waiting are tried again; a topic created with n is
// left as it is, and one with another count gives ErrInvalidConfig (the
// count is fixed once over 1).
//
// Seeks to a time or snapshot from before the move deliver again the
// unkeyed messages after the point and the keyed messages published since
// the move, not the keyed ones of the topic's own stream. A MaxBytes
// limit stays on the topic's own stream, and each key stream gets an
// (n+1)th of it: Config then reports n+1 times the limit.
func (t *Topic) MoveToKeyStreams(ctx context.Context, n int) (KeyStreamsMove, error) {
	if n < 2 || !keyrouter.ValidKeyStreams(n) {
		return KeyStreamsMove{}, fmt.Errorf("%w: move %s onto %d key streams: a power of two from 2 to %d", ErrInvalidConfig, t, n, keyrouter.MaxKeyStreams)
	}
	ctx, cancel := t.c.withTimeout(ctx)
	defer cancel()
	if err := t.c.ensureLayout(ctx); err != nil {
		return KeyStreamsMove{}, err
	}
	info, err := t.info(ctx)
	if err != nil {
		return KeyStreamsMove{}, err
	}
	switch cur := keyStreams(info); {
	case cur == 1 || cur == n && info.Config.Metadata[metaMoved] != "":
		// Again on a moved topic: a move cut short may lack key streams.
		if err := t.split(ctx, info.Config, n); err != nil {
			return KeyStreamsMove{}, fmt.Errorf("move %s onto %d key streams: %w", t, n, err)
		}
		if cur == 1 {
			t.c.cfg.logger.Info("topic moved onto key streams", "topic", t.String(), "key_streams", n)
		}
	case cur == n:
		return KeyStreamsMove{}, nil // created with them: its subscriptions too
	default:
		return KeyStreamsMove{}, fmt.Errorf("%w: move %s onto %d key streams: it has %d, and the count of a topic with key streams is fixed", ErrInvalidConfig, t, n, cur)
	}
	subs, err := t.c.Subscriptions(ctx)
	if err != nil {
		return KeyStreamsMove{}, err
	}
	var out KeyStreamsMove
	for _, s := range subs {
		moved, err := s.moveToKeyStreams(ctx, t)
		switch {
		case errors.Is(err, errNotTopics), errors.Is(err, ErrSubscriptionNotFound):
		case ctx.Err() != nil:
			return out, ctx.Err()
		case err != nil:
			// Its receivers try again: the topic's part is done.
			t.c.cfg.logger.Warn("subscription not moved onto its topic's key streams yet; its receivers will", "subscription", s.String(), "err", err)
			out.Waiting = append(out.Waiting, s.id)
		case moved:
			out.Moved = append(out.Moved, s.id)
		default:
			out.Waiting = append(out.Waiting, s.id)
		}
	}
	return out, nil
}

// split carries out steps 1 and 2 of a move: primary is the topic's own
// stream's configuration.
func (t *Topic) split(ctx context.Context, primary jetstream.StreamConfig, n int) error {
	primary.Subjects = []string{keyrouter.UnkeyedSubject(t.project, t.id)}
	primary.Metadata = maps.Clone(primary.Metadata)
	primary.Metadata[metaKeyStreams] = strconv.Itoa(n)
	if primary.Metadata[metaMoved] == "" {
		primary.Metadata[metaMoved] = time.Now().UTC().Format(time.RFC3339)
	}
	if err := t.c.retryUntil(ctx, func(ctx context.Context) error {
		_, err := t.c.js.UpdateStream(ctx, primary)
		return err
	}); err != nil {
		return fmt.Errorf("give up the keyed subjects: %w", err)
	}
	// The topic's own stream keeps its byte limit (its keyed messages stay
	// until they age out); each key stream takes a share, as at creation.
	keyCfg := primary
	if keyCfg.MaxBytes > 0 {
		keyCfg.MaxBytes = max(keyCfg.MaxBytes/int64(n+1), 1)
	}
	if err := forEachParallel(ctx, keyStreamIndexes(n), 16, func(ctx context.Context, i int) error {
		return t.c.createKeyStream(ctx, t, keyCfg, i, n)
	}); err != nil {
		return fmt.Errorf("create the key streams: %w", err)
	}
	return nil
}

// errNotTopics: the subscription is not one of the topic's, or is detached
// from it.
var errNotTopics = errors.New("not a subscription of the topic")

// moveToKeyStreams moves the subscription onto its topic's key streams
// (step 3 of a move), when the topic has them and the subscription has
// acked every keyed message of the topic's own stream; it reports whether
// the subscription reads the key streams now. With t nil, the subscription's
// own topic.
func (s *Subscription) moveToKeyStreams(ctx context.Context, t *Topic) (bool, error) {
	rec, err := s.load(ctx)
	if err != nil {
		return false, err
	}
	if t != nil && (rec.TopicProject != t.project || rec.Topic != t.id) || rec.Detached {
		return false, errNotTopics
	}
	if rec.split() {
		return true, nil
	}
	if rec.Settling {
		return false, nil // a seek settles first
	}
	stream, err := s.c.topicStream(ctx, rec)
	if err != nil {
		return false, err
	}
	info := stream.CachedInfo()
	n := keyStreams(info)
	if n <= 1 || info.Config.Metadata[metaMoved] == "" || !info.Created.Equal(rec.StreamCreated) {
		return false, nil // not moved (or another topic of the id): checkTopic says what
	}
	epoch := rec.Epoch
	// Moved or sought by another process meanwhile, this answers from
	// the new epoch, which the modify below then refuses to move again.
	p, _, err := s.FirstUnackedPoint(ctx)
	if err != nil {
		return false, err
	}
	last, err := lastKeyed(ctx, stream, rec)
	if err != nil || p.Seq <= last {
		return false, err
	}
	starts := keyStreamFirstSeqs(n)
	rec, err = s.modify(ctx, "move to key streams", func(r *subRecord) bool {
		if r.Epoch != epoch || r.Settling || r.Detached || r.split() {
			return false // sought, detached or moved meanwhile: try again later
		}
		r.Epoch++
		r.Settling = true
		r.SeekSeq = p.Seq
		r.SeekKeySeqs = starts
		r.KeyStreams = n
		r.KeyStartSeqs = starts
		if r.partitioned() {
			r.Partitions = max(r.Partitions, n) // at least a partition per key stream
		}
		return true
	})
	if err != nil || !rec.split() {
		return false, err
	}
	if rec.Epoch != epoch+1 || !rec.Settling {
		return true, nil
	}
	s.c.cfg.logger.Info("subscription moving onto its topic's key streams", "subscription", s.String(), "key_streams", n, "epoch", rec.Epoch)
	if _, err := s.pauseOld(ctx, rec); err != nil {
		return true, fmt.Errorf("move %s onto key streams: %w", s, err)
	}
	// Settled at once when nothing is in flight; otherwise receivers
	// settle it once their handlers are done.
	if err := s.settle(ctx); err != nil {
		return true, fmt.Errorf("move %s onto key streams: %w", s, err)
	}
	return true, nil
}

// lastKeyed is the sequence of the last keyed message in the topic's own
// stream: 0 when it holds none.
func lastKeyed(ctx context.Context, stream jetstream.Stream, rec *subRecord) (uint64, error) {
	m, err := stream.GetLastMsgForSubject(ctx, keyrouter.KeyedFilter(rec.TopicProject, rec.Topic))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("subscription %s: the last keyed message of its topic's stream: %w", rec.ID, err)
	}
	return m.Sequence, nil
}

// keyStreamFirstSeqs is the first sequence of each of n key streams.
func keyStreamFirstSeqs(n int) []uint64 {
	out := make([]uint64, len(keyStreamIndexes(n)))
	for i := range out {
		out[i] = keyrouter.KeyStreamFirstSeq(i)
	}
	return out
}

// movedOntoKeyStreams reports whether the subscription's topic moved onto
// key streams after its creation.
func (c *Client) movedOntoKeyStreams(ctx context.Context, rec *subRecord) (bool, error) {
	stream, err := c.topicStream(ctx, rec)
	if err != nil {
		return false, err
	}
	return stream.CachedInfo().Config.Metadata[metaMoved] != "", nil
}
