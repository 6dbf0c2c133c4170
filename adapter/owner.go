package adapter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/keyrouter"
)

// owner runs key discovery and clean-up for an ordered subscription. Every
// Receive call runs one, but only the holder of the subscription's lease
// (a key in the lease bucket, expiring unless renewed) acts, so discovery
// and clean-up for a subscription happen in one goroutine at a time.
//
// Discovery reads every keyed message's headers, in stream order, through
// an ordered consumer that starts after the persisted floor: the stream
// sequence below which every keyed message has a consumer that covers it.
// For a key without a live consumer it creates one starting at the message.
//
// Clean-up removes a key's consumer once the key has been idle for the idle
// timeout, nothing is pending or unacked, and its last message is at or
// below the floor, so discovery will never see it again. The consumer is
// paused while this is checked, so nothing is delivered between the check
// and the delete. A message that arrives meanwhile has a sequence above the
// floor (the floor only moves in this goroutine, between clean-ups), so
// discovery finds it and creates the consumer again, starting at it: no
// message is skipped, and none is delivered twice by the race.
type owner struct {
	r        *receiver
	c        *Client
	rec      *subRecord
	id       string
	leaseKey string
	floorKey string

	leases, subsKV jetstream.KeyValue
	leaseRev       uint64
	leaseUntil     time.Time // act only before this (half the TTL after renewal)
	renewAt        time.Time

	stream   jetstream.Stream
	floor    uint64
	floorRev uint64
	live     map[string]*liveKey // key consumer name -> state
	cleanAt  time.Time
}

type liveKey struct {
	subject  string
	lastSeen time.Time
}

var errLeaseLost = errors.New("ownership lease lost")

const (
	discoveryBatch = 1024
	cleanupBatch   = 512
	cleanupWorkers = 16
)

func newOwner(r *receiver) *owner {
	return &owner{
		r:        r,
		c:        r.c,
		rec:      r.rec,
		id:       uuid.NewString(),
		leaseKey: r.sub.kvKey(),
		floorKey: r.sub.floorKey(),
	}
}

func (o *owner) warn(msg string, err error) {
	o.c.cfg.logger.Warn(msg, "subscription", o.rec.ID, "owner", o.id, "err", err)
}

// run tries to take the lease until ctx ends; while it holds it, it owns.
func (o *owner) run(ctx context.Context) {
	defer o.r.loops.Done()
	retry := o.c.cfg.leaseTTL / 6
	for ctx.Err() == nil {
		ok, err := o.acquire(ctx)
		if err != nil && ctx.Err() == nil {
			o.warn("lease check failed", err)
		}
		if ok {
			o.c.cfg.logger.Info("owns key discovery", "subscription", o.rec.ID, "owner", o.id)
			err := o.own(ctx)
			o.releaseLease()
			if ctx.Err() != nil {
				return
			}
			o.warn("gave up key discovery; will try again", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
	}
}

func (o *owner) acquire(ctx context.Context) (bool, error) {
	cctx, cancel := o.c.withTimeout(ctx)
	defer cancel()
	subsKV, leases, err := o.c.buckets(cctx)
	if err != nil {
		return false, err
	}
	o.subsKV, o.leases = subsKV, leases
	start := time.Now()
	rev, err := leases.Create(cctx, o.leaseKey, []byte(o.id))
	if errors.Is(err, jetstream.ErrKeyExists) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	o.leaseRev = rev
	o.leaseUntil = start.Add(o.c.cfg.leaseTTL / 2)
	o.renewAt = start.Add(o.c.cfg.leaseTTL / 4)
	return true, nil
}

func (o *owner) renew(ctx context.Context) error {
	cctx, cancel := o.c.withTimeout(ctx)
	defer cancel()
	start := time.Now()
	rev, err := o.leases.Update(cctx, o.leaseKey, []byte(o.id), o.leaseRev)
	if err != nil {
		return fmt.Errorf("%w: %v", errLeaseLost, err)
	}
	o.leaseRev = rev
	o.leaseUntil = start.Add(o.c.cfg.leaseTTL / 2)
	o.renewAt = start.Add(o.c.cfg.leaseTTL / 4)
	return nil
}

func (o *owner) releaseLease() {
	ctx, cancel := context.WithTimeout(context.Background(), o.c.cfg.apiTimeout)
	defer cancel()
	_ = o.leases.Delete(ctx, o.leaseKey, jetstream.LastRevision(o.leaseRev))
}

func (o *owner) leaseValid() bool { return time.Now().Before(o.leaseUntil) }

// own runs discovery and clean-up until the lease is lost, ctx ends or an
// error occurs; each start re-reads everything from JetStream.
func (o *owner) own(ctx context.Context) error {
	cctx, cancel := o.c.withTimeout(ctx)
	defer cancel()
	stream, err := o.c.js.Stream(cctx, o.rec.stream())
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
	discovery, err := stream.OrderedConsumer(cctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{keyrouter.KeyedFilter(o.rec.TopicProject, o.rec.Topic)},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    o.floor + 1,
		HeadersOnly:    true,
	})
	if err != nil {
		return fmt.Errorf("start key discovery: %w", err)
	}
	o.cleanAt = time.Now().Add(o.c.cfg.idleTimeout / 2)
	wait := min(250*time.Millisecond, o.c.cfg.leaseTTL/8)
	for ctx.Err() == nil {
		if time.Now().After(o.renewAt) {
			if err := o.renew(ctx); err != nil {
				return err
			}
		}
		if err := o.discover(ctx, discovery, wait); err != nil {
			return err
		}
		if time.Now().After(o.cleanAt) {
			o.cleanup(ctx)
			o.cleanAt = time.Now().Add(o.c.cfg.idleTimeout / 4)
		}
	}
	return ctx.Err()
}

// loadLive lists the subscription's key consumers: a new owner takes over
// what the last one left.
func (o *owner) loadLive(ctx context.Context) error {
	o.live = make(map[string]*liveKey)
	prefix := keyrouter.KeyConsumerPrefix(o.rec.Project, o.rec.ID)
	names := o.stream.ConsumerNames(ctx)
	now := time.Now()
	for name := range names.Name() {
		if strings.HasPrefix(name, prefix) {
			o.live[name] = &liveKey{lastSeen: now}
		}
	}
	return names.Err()
}

// discover reads one batch and makes sure every key in it has a consumer;
// only then does it move the floor past the batch.
func (o *owner) discover(ctx context.Context, discovery jetstream.Consumer, wait time.Duration) error {
	batch, err := discovery.Fetch(discoveryBatch, jetstream.FetchMaxWait(wait))
	if err != nil {
		return fmt.Errorf("key discovery: %w", err)
	}
	type create struct {
		name, subject string
		seq           uint64
	}
	var creates []create
	pending := map[string]bool{}
	var last uint64
	now := time.Now()
	for m := range batch.Messages() {
		meta, err := m.Metadata()
		if err != nil {
			continue
		}
		last = meta.Sequence.Stream
		subject := m.Subject()
		tok, ok := keyrouter.TokenOfSubject(subject)
		if !ok {
			continue
		}
		name := keyrouter.KeyConsumer(o.rec.Project, o.rec.ID, tok)
		if lk, ok := o.live[name]; ok {
			lk.lastSeen = now
			lk.subject = subject
			continue
		}
		if !pending[name] {
			pending[name] = true
			creates = append(creates, create{name, subject, last})
		}
	}
	if err := batch.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("key discovery: %w", err)
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
			o.live[c.name] = &liveKey{subject: c.subject, lastSeen: now}
			mu.Unlock()
			return nil
		})
		if err != nil {
			return err
		}
	}
	cctx, cancel := o.c.withTimeout(ctx)
	defer cancel()
	rev, err := o.subsKV.Update(cctx, o.floorKey, []byte(strconv.FormatUint(last, 10)), o.floorRev)
	if err != nil {
		return fmt.Errorf("store discovery floor: %w", err)
	}
	o.floor, o.floorRev = last, rev
	return nil
}

func (o *owner) createKeyConsumer(ctx context.Context, name, subject string, start uint64) error {
	cctx, cancel := o.c.withTimeout(ctx)
	defer cancel()
	_, err := o.c.js.CreatePushConsumer(cctx, o.rec.stream(), o.rec.consumerConfig(name, subject, start, 1))
	if errors.Is(err, jetstream.ErrConsumerExists) {
		return nil // it exists already, with an older start: it covers this message
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
)

// cleanup retires idle key consumers, a bounded number per call.
func (o *owner) cleanup(ctx context.Context) {
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
	idx := make(map[string]int, len(idle))
	for i, n := range idle {
		idx[n] = i
	}
	floor := o.floor
	_ = forEachParallel(ctx, idle, cleanupWorkers, func(ctx context.Context, name string) error {
		out, err := o.retire(ctx, name, floor)
		if err != nil && ctx.Err() == nil {
			o.warn("key consumer clean-up failed; will retry", fmt.Errorf("%s: %w", name, err))
		}
		outcomes[idx[name]] = out
		return nil
	})
	now := time.Now()
	for i, name := range idle {
		switch outcomes[i] {
		case keyGone:
			delete(o.live, name)
		default:
			o.live[name].lastSeen = now
		}
	}
}

// retire removes one idle key consumer if nothing can be lost by it; see
// the owner comment for why each step is where it is.
func (o *owner) retire(ctx context.Context, name string, floor uint64) (retireOutcome, error) {
	if !o.leaseValid() {
		return keyBusy, errLeaseLost
	}
	ctx, cancel := o.c.withTimeout(ctx)
	defer cancel()
	info, err := o.consumerInfo(ctx, name)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return keyGone, nil
	}
	if err != nil || busy(info) {
		return keyBusy, err
	}
	subject := info.Config.FilterSubject
	if _, err := o.c.js.PauseConsumer(ctx, o.rec.stream(), name, time.Now().Add(time.Minute)); err != nil {
		return keyBusy, err
	}
	resume := func() { _, _ = o.c.js.ResumeConsumer(ctx, o.rec.stream(), name) }
	last, err := o.lastSeq(ctx, subject)
	if err != nil {
		resume()
		return keyBusy, err
	}
	info, err = o.consumerInfo(ctx, name)
	if err != nil || busy(info) || last > floor || !o.leaseValid() {
		resume()
		return keyBusy, err
	}
	if err := o.stream.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		resume()
		return keyBusy, err
	}
	o.c.cfg.logger.Debug("retired idle key consumer", "subscription", o.rec.ID, "consumer", name, "last", last)
	return keyGone, nil
}

func busy(info *jetstream.ConsumerInfo) bool {
	return info.NumPending > 0 || info.NumAckPending > 0
}

func (o *owner) consumerInfo(ctx context.Context, name string) (*jetstream.ConsumerInfo, error) {
	c, err := o.stream.PushConsumer(ctx, name)
	if err != nil {
		return nil, err
	}
	return c.CachedInfo(), nil
}

// lastSeq is the stream sequence of the subject's last message, 0 if none.
func (o *owner) lastSeq(ctx context.Context, subject string) (uint64, error) {
	m, err := o.stream.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return m.Sequence, nil
}
