package adapter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/keyrouter"
)

// discoverer runs key discovery and clean-up for an ordered subscription. Every
// Receive call runs one, but only the holder of the subscription's discovery lease
// acts, so discovery and clean-up for a subscription happen in one
// goroutine at a time.
//
// Discovery reads every keyed message's headers, in stream order, through
// an ordered consumer that starts after the stored floor: the stream
// sequence at or below which every keyed message has a consumer that covers
// it. For a key without a live consumer it creates one starting at the
// message.
//
// Clean-up removes a key's consumer once the key has been idle for the idle
// timeout, nothing is pending or unacked, the consumer has acked past the
// last message discovery saw for the key, and the key's last message is at
// or below the stored floor, so discovery will never see it again. The
// consumer is paused while this is checked, so nothing is delivered between
// the check and the delete. A message that arrives meanwhile has a sequence
// above the floor (the floor only moves in this goroutine, between
// clean-ups), so discovery finds it and creates the consumer again, starting
// at it: no message is skipped, and none is delivered twice by the race.
type discoverer struct {
	r     *receiver
	c     *Client
	rec   *subRecord
	lease *lease

	subsKV  jetstream.KeyValue
	members jetstream.KeyValue // the state bucket, which holds member records
	// streamName is the stream whose keyed messages this discoverer
	// finds: the topic's own, or one of its key streams (each has a
	// discoverer of its own, with its own lease and floor).
	streamName string
	filter     string // of its keyed messages: the stream's own subjects for a key stream
	leaseKey   string
	floorKey   string
	// sweptReconnects is the connection's reconnect count when a sweep
	// after a reconnect last succeeded (takeover_perkey.go).
	sweptReconnects uint64

	stream      jetstream.Stream
	startFloor  uint64 // the stored floor when this discoverer took the lease
	floor       uint64 // stored discovery floor
	floorRev    uint64
	floorStored time.Time
	seen        uint64              // last stream sequence discovery handled
	live        map[string]*liveKey // key consumer name -> state
	names       map[string]string   // subject -> key consumer name, a cache
	cleanAt     time.Time
}

type liveKey struct {
	subject  string    // "" until known
	lastSeq  uint64    // highest sequence of the key discovery handed to it
	lastSeen time.Time // when discovery last saw the key
	// verified is false for a consumer found at take-over, until discovery
	// has made sure it still exists: a late delete by a dead discoverer cannot
	// then leave a key without a consumer. It is false again after a delete
	// of ours whose outcome is unknown.
	verified bool
	// retiredUpTo is set when this discoverer sent a delete that may have gone
	// through: every message of the key up to it had been acked.
	retiredUpTo uint64
}

const (
	// floorInterval bounds how often the discovery floor is written; a new
	// discoverer re-reads at most this much of the stream.
	floorInterval  = 100 * time.Millisecond
	discoveryBatch = 1024
	discoveryPace  = 5 * time.Millisecond
	cleanupBatch   = 512
	cleanupWorkers = 16
	maxNameCache   = 100_000
)

// newDiscoverers returns the discoverers of the receiver's subscription:
// one for its topic's stream, or one per key stream when the topic has
// them (its own stream then holds no keyed message).
func newDiscoverers(r *receiver) []*discoverer {
	rec := r.rec
	if !rec.split() {
		return []*discoverer{r.newDiscoverer(rec.stream(), keyrouter.KeyedFilter(rec.TopicProject, rec.Topic), r.sub.kvKey(), r.sub.floorKey(rec.Epoch))}
	}
	var out []*discoverer
	for _, i := range keyStreamIndexes(rec.KeyStreams) {
		out = append(out, r.newDiscoverer(keyrouter.KeyStreamName(rec.TopicProject, rec.Topic, i), keyStreamFilter(rec, i),
			keyStreamLeaseKey(r.sub.kvKey(), i), keyStreamFloorKey(r.sub.kvKey(), rec.Epoch, i)))
	}
	return out
}

func (r *receiver) newDiscoverer(stream, filter, leaseKey, floorKey string) *discoverer {
	return &discoverer{r: r, c: r.c, rec: r.rec, streamName: stream, filter: filter, leaseKey: leaseKey, floorKey: floorKey,
		sweptReconnects: r.c.nc.Stats().Reconnects}
}

// keyStreamFilter is the subjects of key stream i of the subscription's
// topic: all of its messages.
func keyStreamFilter(rec *subRecord, i int) string {
	return keyrouter.PartitionFilter(rec.TopicProject, rec.Topic, rec.KeyStreams, i)
}

// keyStreamLeaseKey is the key of the discovery lease of key stream i of
// the subscription whose registry key is kvKey.
func keyStreamLeaseKey(kvKey string, i int) string { return kvKey + ".k" + strconv.Itoa(i) }

// keyStreamFloorKey is the registry key of the discovery floor of key
// stream i, of the epoch's consumers of the subscription whose registry
// key is kvKey.
func keyStreamFloorKey(kvKey string, epoch uint64, i int) string {
	return keyStreamFloorOf(floorKey(kvKey, epoch), i)
}

// keyStreamFloorOf is the key of key stream i's discovery floor beside the
// floor key floor (of the topic's own stream, in the same epoch).
func keyStreamFloorOf(floor string, i int) string { return floor + ".k" + strconv.Itoa(i) }

func (o *discoverer) warn(msg string, err error) {
	o.c.cfg.logger.Warn(msg, "subscription", o.rec.ID, "discoverer", o.lease.id, "err", err)
}

// run tries to take the discovery lease until ctx ends; while it holds it,
// it discovers.
func (o *discoverer) run(ctx context.Context) {
	cctx, cancel := o.c.withTimeout(ctx)
	subsKV, leases, ttl, err := o.c.registry(cctx)
	cancel()
	if err != nil {
		o.r.fail(fmt.Errorf("receive %s: %w", o.r.sub, err))
		return
	}
	o.subsKV = subsKV
	reconnects := func() uint64 { return o.c.nc.Stats().Reconnects }
	o.lease = newLease(leases, o.leaseKey, leaseHolderPrefix+o.r.presence.id, ttl, o.c.cfg.apiTimeout, reconnects)
	for ctx.Err() == nil && !o.r.isSuperseded() {
		cctx, cancel := context.WithTimeout(ctx, ttl/4)
		ok, err := o.lease.acquire(cctx, func(holder string) bool {
			id, ok := strings.CutPrefix(holder, leaseHolderPrefix)
			return ok && o.r.presence.gone(cctx, id)
		})
		cancel()
		if err != nil && ctx.Err() == nil {
			o.warn("lease check failed", err)
		}
		if ok {
			o.c.cfg.logger.Info("holds the discovery lease", "subscription", o.rec.ID, "discoverer", o.lease.id, "stream", o.streamName)
			err := o.hold(ctx)
			o.lease.release()
			if ctx.Err() != nil || errors.Is(err, errEpochChanged) {
				return
			}
			o.warn("gave up key discovery; will try again", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(min(ttl/6, memberCheckInterval)):
		}
	}
}

// leaseHolderPrefix starts the value of a discovery lease that a
// receiver holds: its presence id follows. (A seek's settle holds it too,
// and is never taken for gone.)
const leaseHolderPrefix = "receiver "

// hold keeps the lease renewed while own runs, and stops own when the
// lease is lost.
func (o *discoverer) hold(ctx context.Context) error {
	octx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		o.lease.keep(octx, func(err error) { cancel(err) })
	}()
	err := o.own(octx)
	cancel(nil)
	wg.Wait()
	if cause := context.Cause(octx); cause != nil && ctx.Err() == nil && errors.Is(cause, errLeaseLost) {
		return cause
	}
	return err
}

// own runs discovery and clean-up until ctx ends or an error occurs; each
// start re-reads everything from JetStream.
func (o *discoverer) own(ctx context.Context) error {
	cctx, cancel, err := o.lease.opContext(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	stream, err := o.c.js.Stream(cctx, o.streamName)
	if err != nil {
		return err
	}
	o.stream = stream
	if err := o.loadLive(cctx); err != nil {
		return err
	}
	e, err := o.subsKV.Get(cctx, o.floorKey)
	if err != nil {
		return fmt.Errorf("read discovery floor: %w", err)
	}
	if o.floor, err = strconv.ParseUint(string(e.Value()), 10, 64); err != nil {
		return fmt.Errorf("corrupt discovery floor %q: %w", e.Value(), err)
	}
	o.floorRev = e.Revision()
	o.startFloor, o.seen = o.floor, o.floor
	o.names = make(map[string]string)
	discovery, err := stream.OrderedConsumer(cctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{o.filter},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    o.floor + 1,
		HeadersOnly:    true,
		// Removed when the lease is given up; this bounds its life if that fails.
		InactiveThreshold: 30 * time.Second,
	})
	if err != nil {
		return fmt.Errorf("start key discovery: %w", err)
	}
	defer o.dropDiscovery(discovery)
	// Discovery streams: each message reaches the discoverer as soon as it is
	// stored, so a new key's first message waits only for its consumer.
	done := make(chan struct{})
	msgs := make(chan jetstream.Msg, discoveryBatch)
	errs := make(chan error, 1)
	cc, err := discovery.Consume(func(m jetstream.Msg) {
		select {
		case msgs <- m:
		case <-done:
		}
	}, jetstream.PullMaxMessages(discoveryBatch), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted) {
			select {
			case errs <- err:
			default:
			}
		}
	}))
	if err != nil {
		return fmt.Errorf("start key discovery: %w", err)
	}
	defer func() {
		// done first: a callback blocked on a full msgs would hold
		// Consume open until the wait below gave up.
		close(done)
		cc.Stop()
		select {
		case <-cc.Closed():
		case <-time.After(o.c.cfg.apiTimeout):
		}
	}()

	// Take-over from gone members, and the watch for key consumers that
	// stopped delivering (rebind.go), run beside discovery, under the lease.
	sweepCtx, stopSweeps := context.WithCancel(ctx)
	var sweeps sync.WaitGroup
	sweeps.Go(func() { o.watchMembers(sweepCtx) })
	sweeps.Go(func() { o.watchBinding(sweepCtx) })
	defer func() {
		stopSweeps()
		sweeps.Wait()
	}()

	o.cleanAt = time.Now().Add(o.c.cfg.idleTimeout / 2)
	wait := min(250*time.Millisecond, o.lease.ttl/8)
	for ctx.Err() == nil {
		var batch []jetstream.Msg
		select {
		case m := <-msgs:
			batch = append(batch, m)
		drain:
			for len(batch) < discoveryBatch {
				select {
				case m := <-msgs:
					batch = append(batch, m)
				default:
					break drain
				}
			}
		case err := <-errs:
			return fmt.Errorf("key discovery: %w", err)
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		case <-o.r.superseded:
			return errEpochChanged // the seek's settle takes the lease
		}
		if err := o.discover(ctx, batch); err != nil {
			return err
		}
		if n := len(batch); n > 0 && n < discoveryBatch {
			// Pace a trickle into batches: waking for every message would
			// take CPU from delivery, and a new key waits at most this long.
			select {
			case <-time.After(discoveryPace):
			case <-ctx.Done():
			}
		}
		if time.Now().After(o.cleanAt) {
			if err := o.storeFloor(ctx); err != nil {
				return err
			}
			o.cleanup(ctx)
			o.cleanAt = time.Now().Add(o.c.cfg.idleTimeout / 4)
		}
	}
	return ctx.Err()
}

// dropDiscovery deletes the discovery consumer on the server rather than
// leaving it to its inactivity threshold.
func (o *discoverer) dropDiscovery(discovery jetstream.Consumer) {
	info := discovery.CachedInfo()
	if info == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.c.cfg.apiTimeout)
	defer cancel()
	_ = o.stream.DeleteConsumer(ctx, info.Name)
}

// loadLive lists the subscription's key consumers: a new discoverer takes over
// what the last one left.
func (o *discoverer) loadLive(ctx context.Context) error {
	o.live = make(map[string]*liveKey)
	prefix := keyrouter.KeyConsumerPrefix(o.rec.Project, o.rec.nameID())
	names := o.stream.ConsumerNames(ctx)
	now := time.Now()
	for name := range names.Name() {
		if strings.HasPrefix(name, prefix) {
			o.live[name] = &liveKey{lastSeen: now}
		}
	}
	return names.Err()
}

// discover makes sure every key in batch has a consumer; only then does it
// move the floor past the batch.
func (o *discoverer) discover(ctx context.Context, batch []jetstream.Msg) error {
	if len(batch) == 0 {
		return nil
	}
	type create struct {
		name, subject string
		seq           uint64
	}
	var creates []create
	pending := map[string]bool{}
	var last uint64
	now := time.Now()
	for _, m := range batch {
		meta, err := m.Metadata()
		if err != nil {
			continue
		}
		last = meta.Sequence.Stream
		subject := m.Subject()
		name, ok := o.names[subject]
		if !ok {
			tok, isKeyed := keyrouter.TokenOfSubject(subject)
			if !isKeyed {
				continue
			}
			name = keyrouter.KeyConsumer(o.rec.Project, o.rec.nameID(), tok)
			if len(o.names) >= maxNameCache {
				clear(o.names)
			}
			o.names[subject] = name
		}
		lk, isLive := o.live[name]
		if isLive {
			lk.lastSeen, lk.subject, lk.lastSeq = now, subject, last
			if lk.verified {
				continue
			}
		}
		if !pending[name] {
			pending[name] = true
			creates = append(creates, create{name, subject, last})
		}
	}
	if last == 0 {
		return nil
	}
	if len(creates) > 0 {
		var mu sync.Mutex
		err := forEachParallel(ctx, creates, o.c.cfg.createWorker, func(ctx context.Context, c create) error {
			if err := o.createKeyConsumer(ctx, c.name, c.subject, c.seq); err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			if lk := o.live[c.name]; lk != nil {
				lk.verified = true
				return nil
			}
			o.live[c.name] = &liveKey{subject: c.subject, lastSeq: c.seq, lastSeen: now, verified: true}
			return nil
		})
		if err != nil {
			return err
		}
		// A key seen again later in the batch has a higher last sequence.
		for _, m := range batch {
			if meta, err := m.Metadata(); err == nil {
				if lk := o.live[o.names[m.Subject()]]; lk != nil && meta.Sequence.Stream > lk.lastSeq {
					lk.lastSeq = meta.Sequence.Stream
				}
			}
		}
	}
	o.seen = last
	if time.Since(o.floorStored) >= floorInterval {
		return o.storeFloor(ctx)
	}
	return nil
}

// storeFloor persists how far discovery got. Clean-up trusts only the
// stored floor, so a new discoverer, starting from it, never meets a message of
// a key whose consumer was removed after delivering that message.
func (o *discoverer) storeFloor(ctx context.Context) error {
	if o.seen <= o.floor {
		return nil
	}
	cctx, cancel, err := o.lease.opContext(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	rev, err := o.subsKV.Update(cctx, o.floorKey, []byte(strconv.FormatUint(o.seen, 10)), o.floorRev)
	if err != nil {
		return fmt.Errorf("store discovery floor: %w", err)
	}
	o.floor, o.floorRev, o.floorStored = o.seen, rev, time.Now()
	return nil
}

// keyConsumerHeartbeat is a key consumer's idle heartbeat. Its receivers
// ignore the heartbeats; what counts is that each wakes the consumer's
// delivery loop on its leader, which then looks for the next message
// again. A leader whose copy of the stream caught up on messages after a
// restart or an election was not woken for them (nats-server v2.15.2
// stores caught-up messages without signalling consumers:
// processCatchupMsg), and without a later message of its key would wait
// for good.
const keyConsumerHeartbeat = 2 * time.Second

// createKeyConsumer creates a key's consumer starting at start. A consumer
// of that name that exists already started earlier and covers start.
func (o *discoverer) createKeyConsumer(ctx context.Context, name, subject string, start uint64) error {
	cctx, cancel, err := o.lease.opContext(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	cfg := o.rec.consumerConfig(name, subject, start, 1)
	cfg.IdleHeartbeat = keyConsumerHeartbeat
	_, err = o.c.js.CreatePushConsumer(cctx, o.streamName, cfg)
	if errors.Is(err, jetstream.ErrConsumerExists) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("create consumer %s: %w", name, err)
	}
	o.c.cfg.logger.Debug("created key consumer", "subscription", o.rec.ID, "consumer", name, "start", start)
	return nil
}

type retireOutcome int

const (
	keyBusy retireOutcome = iota
	keyGone
	// keyMaybeGone: the delete was sent but its answer did not come (a
	// timeout on a slow server); the consumer may be gone.
	keyMaybeGone
)

// cleanup retires idle key consumers, a bounded number per call.
func (o *discoverer) cleanup(ctx context.Context) {
	cutoff := time.Now().Add(-o.c.cfg.idleTimeout)
	var idle []string
	for name, lk := range o.live {
		if lk.lastSeen.Before(cutoff) {
			idle = append(idle, name)
			if len(idle) == cleanupBatch {
				break
			}
		}
	}
	if len(idle) == 0 {
		return
	}
	outcomes := make([]retireOutcome, len(idle))
	lasts := make([]uint64, len(idle))
	states := make([]liveKey, len(idle))
	order := make([]int, len(idle))
	for i, name := range idle {
		states[i], order[i] = *o.live[name], i
	}
	floor := o.floor
	_ = forEachParallel(ctx, order, cleanupWorkers, func(ctx context.Context, i int) error {
		name := idle[i]
		out, last, err := o.retire(ctx, name, states[i], floor)
		if err != nil && ctx.Err() == nil {
			o.warn("key consumer clean-up failed; will retry", fmt.Errorf("%s: %w", name, err))
		}
		outcomes[i], lasts[i] = out, last
		return nil
	})
	now := time.Now()
	for i, name := range idle {
		switch outcomes[i] {
		case keyGone:
			delete(o.live, name)
		case keyMaybeGone:
			// A new message of the key makes discovery create the consumer
			// again, starting at that message; without one, the next
			// clean-up finds it gone and knows it was ours (vanished).
			lk := o.live[name]
			lk.lastSeen, lk.verified, lk.retiredUpTo = now, false, lasts[i]
		default:
			o.live[name].lastSeen = now
		}
	}
}

// retire removes one idle key consumer if nothing can be lost by it; see
// the discoverer comment for why each step is where it is. lk is a copy: retire
// runs beside other retires and must not touch the live map. With
// keyMaybeGone it also returns the key's last sequence, all acked.
func (o *discoverer) retire(ctx context.Context, name string, lk liveKey, floor uint64) (retireOutcome, uint64, error) {
	cctx, cancel, err := o.lease.opContext(ctx)
	if err != nil {
		return keyBusy, 0, err
	}
	defer cancel()
	info, err := o.consumerInfo(cctx, name)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		out, err := o.vanished(ctx, name, lk)
		return out, 0, err
	}
	if err != nil || busy(info, lk) {
		return keyBusy, 0, err
	}
	subject := info.Config.FilterSubject
	pauseFor := 2 * o.c.cfg.apiTimeout
	if _, err := o.c.js.PauseConsumer(cctx, o.streamName, name, time.Now().Add(pauseFor)); err != nil {
		return keyBusy, 0, err
	}
	resume := func() { o.resume(name) }
	last, err := o.lastSeq(cctx, subject)
	if err != nil {
		resume()
		return keyBusy, 0, err
	}
	info, err = o.consumerInfo(cctx, name)
	// Paused must show in the info itself: in a cluster the pause is
	// answered before the consumer's leader has applied it.
	if err != nil || busy(info, lk) || !info.Paused || info.AckFloor.Stream < last || last > floor {
		resume()
		return keyBusy, 0, err
	}
	if !o.lease.valid() {
		resume()
		return keyBusy, 0, errLeaseLost
	}
	if err := o.stream.DeleteConsumer(cctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		// The server may have deleted it all the same; if not, it must
		// not stay paused.
		resume()
		return keyMaybeGone, last, err
	}
	o.c.cfg.logger.Debug("retired idle key consumer", "subscription", o.rec.ID, "consumer", name, "last", last)
	return keyGone, 0, nil
}

// resume ends the pause of a key consumer that turned out to be busy.
// nats-server's own resume (PauseUntil unset) does not wake the consumer's
// delivery loop, so a message stored during the pause would wait for the
// next message of its key, possibly forever. A pause that ends a moment
// from now does wake it, from the pause timer; the server's answer says
// whether the moment is still ahead by its clock, else a longer one is tried.
func (o *discoverer) resume(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), o.c.cfg.apiTimeout)
	defer cancel()
	for delay := 10 * time.Millisecond; delay <= 2*time.Second; delay *= 4 {
		resp, err := o.c.js.PauseConsumer(ctx, o.streamName, name, time.Now().Add(delay))
		if err != nil {
			o.warn("resume key consumer failed; its pause ends by itself", fmt.Errorf("%s: %w", name, err))
			return
		}
		if resp.Paused {
			return
		}
	}
	o.warn("resume key consumer: server clock far ahead; its pause ends by itself", errors.New(name))
}

// vanished handles a key consumer that is gone although clean-up has not
// retired it: a delete of ours whose answer was lost, or one by hand, or a
// consumer lost with a server's memory. Its unacked messages must not be
// lost: it is created again from where this discoverer's discovery started,
// at the price of redelivering what it had acked since; or, after a delete
// of ours, from the first message after those it had acked.
//
// A consumer gone with its subscription (deleted, or deleted and created
// anew, while this Receive still runs) is not created again: that would
// deliver the deleted subscription's messages again, and leave a consumer
// that nothing deletes.
func (o *discoverer) vanished(ctx context.Context, name string, lk liveKey) (retireOutcome, error) {
	if lk.subject == "" {
		// Never seen by this discoverer's discovery: it had no messages above
		// the floor this discoverer started from.
		return keyGone, nil
	}
	rec, err := o.r.sub.load(ctx)
	if errors.Is(err, ErrSubscriptionNotFound) || err == nil && !rec.Created.Equal(o.rec.Created) {
		return keyGone, nil
	}
	if err != nil {
		return keyBusy, err
	}
	if lk.retiredUpTo > 0 {
		if lk.lastSeq <= lk.retiredUpTo {
			o.c.cfg.logger.Debug("retired idle key consumer (its delete's answer was lost)", "subscription", o.rec.ID, "consumer", name)
			return keyGone, nil
		}
		o.c.cfg.logger.Info("key consumer retired while its key had a new message; recreating it after the acked ones",
			"subscription", o.rec.ID, "consumer", name, "start", lk.retiredUpTo+1)
		return keyBusy, o.createKeyConsumer(ctx, name, lk.subject, lk.retiredUpTo+1)
	}
	o.warn("key consumer vanished; recreating it from the discovery start", errors.New(name))
	if err := o.createKeyConsumer(ctx, name, lk.subject, o.startFloor+1); err != nil {
		return keyBusy, err
	}
	return keyBusy, nil
}

// busy reports whether a key consumer still has work, or has not yet acked
// what discovery handed it.
func busy(info *jetstream.ConsumerInfo, lk liveKey) bool {
	return info.NumPending > 0 || info.NumAckPending > 0 || info.AckFloor.Stream < lk.lastSeq
}

func (o *discoverer) consumerInfo(ctx context.Context, name string) (*jetstream.ConsumerInfo, error) {
	c, err := o.stream.PushConsumer(ctx, name)
	if err != nil {
		return nil, err
	}
	return c.CachedInfo(), nil
}

// lastSeq is the stream sequence of the subject's last message, 0 if none.
func (o *discoverer) lastSeq(ctx context.Context, subject string) (uint64, error) {
	seq, err := o.c.leaderMsgSeq(ctx, o.streamName, msgGetRequest{LastBySubj: subject})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	return seq, err
}
