package adapter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/internal/filter"
	"github.com/jetorder/jetorder/keyrouter"
)

// ReceiveSettings tune Receive.
type ReceiveSettings struct {
	// MaxOutstandingMessages bounds the messages handed to handlers and not
	// yet acked, nacked or returned. Messages beyond it wait, with their
	// deadlines extended, until a handler is free. Default 1000.
	MaxOutstandingMessages int
	// MaxExtension bounds how long Receive keeps extending the ack deadline
	// of a message it holds. Default 60 minutes.
	MaxExtension time.Duration
	// OnDeadLetter, if set, is called after a message has been moved to the
	// subscription's dead-letter topic (and terminated here), for metrics or
	// logs. It must not block.
	OnDeadLetter func(*Message)
	// Stats, if set, is kept up to date with the partitions this Receive
	// owns (partitioned subscriptions only).
	Stats *ReceiveStats
}

// DefaultReceiveSettings are the settings a new Subscription handle has.
var DefaultReceiveSettings = ReceiveSettings{
	MaxOutstandingMessages: 1000,
	MaxExtension:           60 * time.Minute,
}

type ackKind int

const (
	ackAck ackKind = iota
	ackNak
	ackProgress
	ackTerm
)

var ackPayload = [...][]byte{ackAck: []byte("+ACK"), ackNak: []byte("-NAK"), ackProgress: []byte("+WPI"), ackTerm: []byte("+TERM")}

// handBackPayload is the nack of a message handed back (Release), and of
// every message handed back as Receive ends. A plain -NAK only queues the
// message for redelivery in the consumer leader's memory, which a server
// restart or a new consumer leader forgets: the message then waits out its
// ack deadline, and with ordering so do the later messages of its key (of
// its partition, until the new owner's fence clears). A nack with a delay,
// even of 0, makes the server move the message's deadline to now in the
// consumer's stored (and replicated) state, and redeliver it from there.
var handBackPayload = []byte(`-NAK {"delay":0}`)

// heldKey names one message of one consumer: redeliveries of a message this
// process still holds have the same heldKey.
type heldKey struct {
	consumer string
	seq      uint64
}

// delivery is one message this process holds, from its arrival until it is
// acked, nacked or its handler returns without either.
type delivery struct {
	r          *receiver
	key        heldKey
	part       *partition // nil unless partitioned and keyed
	subject    string
	reply      string
	dseq       uint64  // the consumer's latest delivery sequence (partitioned); guarded by r.mu
	acked      ackKind // the ack or term being confirmed (partitioned)
	ackSent    bool    // its ack or term was sent; guarded by r.mu
	msg        *Message
	arrived    time.Time
	lastExtend time.Time // guarded by r.mu
	once       sync.Once
	// outcome is what the first of Ack, Nack, Release, AckWithResult (or
	// Receive) decided; read it only after once.Do has returned.
	outcome ackKind
	// ackState follows an ack to the server's confirmation
	// (AckWithResult); guarded by r.mu.
	ackState ackState
}

// ackState is where a delivery's ack is on its way to the server.
type ackState int

const (
	ackNotSent   ackState = iota // or sent by Ack, which does not say
	ackSent                      // sent by AckWithResult, not confirmed
	ackConfirmed                 // the server answered the ack: it has it
	ackRefused                   // nobody took it, or it was not valid to send: the message comes back
)

// finish is the one place a delivery's outcome is decided: the first call
// wins, later ones do nothing.
func (d *delivery) finish(kind ackKind) { d.finishWith(kind, ackPayload[kind]) }

// finishWith is finish with the payload sent to the server (a nack with a
// delay).
func (d *delivery) finishWith(kind ackKind, payload []byte) {
	d.once.Do(func() {
		if kind == ackNak && d.r.isSuperseded() {
			// The subscription was sought: a message of the old epoch is
			// not delivered again by it (the new epoch delivers it if the
			// seek says so).
			kind, payload = ackAck, ackPayload[ackAck]
		} else if kind == ackNak && bytes.Equal(payload, ackPayload[ackNak]) && d.r.ending() {
			payload = handBackPayload
		}
		d.outcome = kind
		// A partitioned key's ack is confirmed before its next message
		// starts; everything else is forgotten at once (for a nack, before
		// it is sent: its redelivery may come at once, and must not be taken
		// for a copy of this one).
		confirm := d.part != nil && (kind == ackAck || kind == ackTerm)
		if confirm {
			// Counted as acked before the ack can reach the server, so a
			// fence never counts it as unacked after the server has it.
			d.r.markAckSent(d)
		} else {
			d.r.release(d, false)
		}
		err := d.r.c.nc.Publish(d.reply, payload)
		if confirm {
			// confirmAcks sends it again if it did not go.
			d.acked = kind
			d.r.confirmLater(d)
			return
		}
		if err != nil {
			d.r.c.cfg.logger.Warn("ack not sent; the message will be redelivered", "subscription", d.r.sub.id, "err", err)
		}
	})
}

// ackConfirmed is finish(ackAck) that waits for the server to confirm the
// ack (AckWithResult): the ack goes as a request on the message's reply
// subject, which JetStream answers once it has applied the ack (a double
// ack; in a cluster, once the consumer's replicas have it).
//
// Until the answer the delivery stays held, its deadline extended, so a
// redelivery meanwhile is taken for a copy; the answer releases it, and a
// partitioned key's next message starts only then. An ack that went
// unanswered is, for a partitioned key, confirmed as Ack's are
// (confirmAcks sends it until the server has it, and the key waits);
// elsewhere the delivery stays held until its handler returns, and if the
// ack was lost the message comes back after its deadline. A later call
// sends the ack again: acking twice is harmless.
func (d *delivery) ackConfirmed(ctx context.Context) error {
	r := d.r
	first := false
	d.once.Do(func() {
		first = true
		d.outcome = ackAck
		r.mu.Lock()
		cur, held := r.held[d.key]
		// A delivery its handler returned from without an ack may still be
		// acked until the server's deadline for it passes; after that, or
		// once a newer delivery of it is held, the server has redelivered
		// it and the ack would take a message that is someone else's.
		valid := cur == d || (!held && time.Since(d.lastExtend) < r.rec.ackDeadline())
		d.ackState = ackSent
		if !valid {
			d.ackState = ackRefused
		}
		r.mu.Unlock()
		if valid && d.part != nil {
			r.markAckSent(d) // as in finishWith: a fence never counts it unacked after the server has it
		}
	})
	if d.outcome != ackAck {
		return fmt.Errorf("%w: it was handed back first", ErrAckInvalid)
	}
	r.mu.Lock()
	state := d.ackState // ackNotSent here: an Ack went first, without confirmation
	r.mu.Unlock()
	switch state {
	case ackConfirmed:
		return nil
	case ackRefused:
		return fmt.Errorf("%w: its deadline passed or it was delivered again", ErrAckInvalid)
	}
	cctx, cancel := r.c.withTimeout(ctx)
	defer cancel()
	_, err := r.c.nc.RequestWithContext(cctx, d.reply, ackPayload[ackAck])
	switch {
	case err == nil:
		r.mu.Lock()
		d.ackState = ackConfirmed
		r.mu.Unlock()
		r.release(d, true)
		return nil
	case errors.Is(err, nats.ErrNoResponders):
		// Nobody received it, so the server does not have it: the
		// message is unacked there, as after a nack.
		r.mu.Lock()
		d.ackState = ackRefused
		r.mu.Unlock()
		r.release(d, false)
		return fmt.Errorf("%w: nobody took the ack (its consumer is gone): %w", ErrAckInvalid, err)
	}
	if first && d.part != nil {
		d.acked = ackAck
		r.confirmLater(d)
	}
	return fmt.Errorf("%w: %w", ErrAckTimeout, err)
}

// nakPayload is a nack of a message after attempt deliveries: with the
// retry policy's backoff as JetStream's redelivery delay, if there is one.
func (r *receiver) nakPayload(attempt int) []byte {
	p := r.retry.Load()
	if p == nil {
		return ackPayload[ackNak]
	}
	d := p.backoff(attempt)
	if d <= 0 {
		return ackPayload[ackNak]
	}
	return fmt.Appendf(nil, `-NAK {"delay":%d}`, d.Nanoseconds())
}

// abandon stops extending the deadline of a message whose handler returned
// without acking it: it is redelivered when its deadline passes, unless the
// application acks it first.
func (d *delivery) abandon() { d.r.release(d, false) }

// receiver runs one Receive call.
type receiver struct {
	c        *Client
	sub      *Subscription
	rec      *subRecord
	handler  func(context.Context, *Message)
	settings ReceiveSettings

	// deadLetter is the subscription's current policy (nil for none);
	// supervise refreshes it, so an Update reaches a running Receive.
	deadLetter  atomic.Pointer[deadLetterRecord]
	retry       atomic.Pointer[retryPolicyRecord] // likewise the retry policy
	filter      *filter.Filter                    // the subscription's (fixed at creation), or nil
	deadTopics  map[string]*Topic                 // dead-letter topic handles, by full name
	deadTopicMu sync.Mutex

	partitions []*partition // partitioned subscriptions only; appended under mu

	confirmMu   sync.Mutex
	confirmQ    []*delivery // acked, waiting for the server to have the ack
	confirmWake chan struct{}

	hctx    context.Context // handlers' context, cancelled when Receive ends
	slots   chan struct{}
	wake    chan struct{}
	stopped chan struct{}
	workers sync.WaitGroup // handlers
	loops   sync.WaitGroup // background goroutines

	// superseded is closed when the subscription was sought: this run's
	// messages are the old epoch's, and none starts in a handler again.
	superseded    chan struct{}
	supersedeOnce sync.Once

	mu       sync.Mutex
	queue    []*delivery
	held     map[heldKey]*delivery
	stopping bool
	fatal    error
	fatalSet chan struct{}
}

// Receive calls f for each delivered message, concurrently, until ctx is
// done or a fatal error occurs. With message ordering enabled, f never runs
// for a message while an earlier message of its ordering key is unacked, on
// any process receiving from the subscription.
//
// f must call Ack or Nack. If f returns without either, the message is
// redelivered when its ack deadline passes. The ack deadline is extended
// while f runs (up to ReceiveSettings.MaxExtension).
//
// Receive returns nil when ctx is cancelled, after every running f has
// returned; messages not yet handed to f are nacked so they are redelivered
// at once. It returns ErrSubscriptionNotFound or ErrTopicDeleted when the
// subscription or its topic goes away, an ErrHandlerPanic error if f
// panics (the message is nacked), and an ErrClosed error when Client.Close
// is called (Receive ends at once, as when ctx is cancelled).
func (s *Subscription) Receive(ctx context.Context, f func(context.Context, *Message)) (err error) {
	ctx, end, err := s.c.startReceive(ctx, s)
	if err != nil {
		return err
	}
	defer func() { err = end(err) }()
	if f == nil {
		return fmt.Errorf("%w: nil handler", ErrInvalidConfig)
	}
	settings := s.ReceiveSettings
	if settings.MaxOutstandingMessages <= 0 {
		settings.MaxOutstandingMessages = DefaultReceiveSettings.MaxOutstandingMessages
	}
	if settings.MaxExtension <= 0 {
		settings.MaxExtension = DefaultReceiveSettings.MaxExtension
	}
	for {
		rec, err := s.receivable(ctx)
		if err != nil || rec == nil {
			return err // rec is nil when ctx ended first
		}
		hctx, hcancel := context.WithCancel(ctx)
		r := &receiver{
			c:        s.c,
			sub:      s,
			rec:      rec,
			handler:  f,
			settings: settings,
			hctx:     hctx,
			slots:    make(chan struct{}, settings.MaxOutstandingMessages),
			wake:     make(chan struct{}, 1),
			stopped:  make(chan struct{}),

			confirmWake: make(chan struct{}, 1),
			held:        make(map[heldKey]*delivery),
			fatalSet:    make(chan struct{}),
			superseded:  make(chan struct{}),
		}
		r.deadLetter.Store(rec.DeadLetter)
		r.retry.Store(rec.Retry)
		if rec.Filter != "" {
			if r.filter, err = filter.Parse(rec.Filter); err != nil {
				hcancel()
				return fmt.Errorf("receive %s: stored %w", s, err) // Create checked it
			}
		}
		err = r.run(ctx, hcancel)
		hcancel()
		if !errors.Is(err, errEpochChanged) {
			return err
		}
		// Sought: every message of the old epoch is settled; receive from
		// the new one.
	}
}

// receivable loads the subscription's record for a Receive: it fails when
// the subscription cannot be received from, and waits while a seek settles
// (the new epoch's consumers do not exist yet).
func (s *Subscription) receivable(ctx context.Context) (*subRecord, error) {
	for {
		lctx, lcancel := s.c.withTimeout(ctx)
		rec, err := s.load(lctx)
		if err == nil && rec.Detached {
			err = fmt.Errorf("%w: %s", ErrDetached, s)
		}
		if err == nil {
			err = s.c.checkTopic(lctx, rec)
		}
		if err == nil && rec.Settling {
			err = s.settle(lctx)
		}
		lcancel()
		if err != nil || !rec.Settling {
			return rec, err
		}
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// checkTopic returns ErrTopicDeleted if the subscription's topic is gone or
// was deleted and created again.
func (c *Client) checkTopic(ctx context.Context, rec *subRecord) error {
	info, err := c.js.Stream(ctx, rec.stream())
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("%w: projects/%s/topics/%s", ErrTopicDeleted, rec.TopicProject, rec.Topic)
		}
		return err
	}
	if !info.CachedInfo().Created.Equal(rec.StreamCreated) {
		return fmt.Errorf("%w: projects/%s/topics/%s was deleted and created again", ErrTopicDeleted, rec.TopicProject, rec.Topic)
	}
	if v := info.CachedInfo().Config.Metadata[metaLayout]; v != subjectLayout {
		return fmt.Errorf("%w: projects/%s/topics/%s has subject layout %q, this version reads %q; create the topic again",
			ErrInvalidConfig, rec.TopicProject, rec.Topic, v, subjectLayout)
	}
	return nil
}

func (r *receiver) run(ctx context.Context, cancelHandlers context.CancelFunc) error {
	sub, err := r.c.nc.QueueSubscribe(keyrouter.DeliverSubject(r.rec.Project, r.rec.nameID()), deliverGroup, r.onMsg)
	if err != nil {
		return fmt.Errorf("receive %s: %w", r.sub, err)
	}
	// JetStream bounds what can be pushed (MaxAckPending per consumer), so
	// the client must not drop any of it as a slow consumer.
	_ = sub.SetPendingLimits(-1, -1)

	bg, stopBackground := context.WithCancel(ctx)
	defer stopBackground()
	// Leases are extended until the last handler has returned: a handler
	// still running after Receive was cancelled must not see its message
	// redelivered, and the next of its key run, elsewhere.
	stopExtending := make(chan struct{})
	extended := make(chan struct{})
	go func() {
		defer close(extended)
		r.extendLeases(stopExtending)
	}()
	r.loops.Add(2)
	go r.dispatch()
	go r.supervise(bg)
	var partitions []jetstream.ConsumeContext
	switch {
	case r.rec.partitioned():
		sctx, cancel := r.c.withTimeout(ctx)
		partitions, err = r.startPartitions(sctx)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			// Deleted meanwhile, most likely: say so if it was.
			if _, lerr := r.sub.load(sctx); errors.Is(lerr, ErrSubscriptionNotFound) {
				err = lerr
			}
		}
		if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrConsumerNotFound) {
			if terr := r.c.checkTopic(sctx, r.rec); errors.Is(terr, ErrTopicDeleted) {
				err = terr // the topic was deleted as Receive started
			}
		}
		cancel()
		switch {
		case err == nil, ctx.Err() != nil:
		case errors.Is(err, ErrSubscriptionNotFound), errors.Is(err, ErrTopicDeleted):
			r.fail(err)
		default:
			r.fail(fmt.Errorf("receive %s: %w", r.sub, err))
		}
		r.loops.Add(1)
		go r.confirmAcks()
	case r.rec.Ordering:
		r.loops.Add(1)
		go newOwner(r).run(bg)
	}

	select {
	case <-ctx.Done():
	case <-r.fatalSet:
	}

	// Stop taking messages, hand back what no handler has started, wait for
	// the handlers, then hand back whatever they left unacked.
	r.mu.Lock()
	r.stopping = true
	r.mu.Unlock()
	// Drain hands what the connection already holds for us to onMsg, which
	// nacks it now that stopping is set, instead of dropping it to wait out
	// its ack deadline.
	closed := sub.StatusChanged(nats.SubscriptionClosed)
	if err := sub.Drain(); err == nil {
		select {
		case <-closed:
		case <-time.After(r.c.cfg.apiTimeout):
		}
	}
	_ = sub.Unsubscribe()
	// Drain, as above: what the client buffered is handed back now.
	for _, cc := range partitions {
		cc.Drain()
	}
	for _, cc := range partitions {
		select {
		case <-cc.Closed():
		case <-time.After(r.c.cfg.apiTimeout):
		}
	}
	close(r.stopped)
	stopBackground()
	r.loops.Wait()
	r.mu.Lock()
	queued := r.queue
	r.queue = nil
	r.mu.Unlock()
	for _, d := range queued {
		d.finish(ackNak)
	}
	cancelHandlers()
	r.workers.Wait()
	r.confirmRemaining(nil) // what handlers acked after confirmAcks ended
	r.deadTopicMu.Lock()
	for _, t := range r.deadTopics {
		t.Stop()
	}
	r.deadTopicMu.Unlock()
	close(stopExtending)
	<-extended
	r.mu.Lock()
	var left []*delivery
	for _, d := range r.held {
		left = append(left, d)
	}
	r.mu.Unlock()
	for _, d := range left {
		d.finish(ackNak)
	}
	r.unpin()
	if r.fatal != nil && (errors.Is(r.fatal, ErrSubscriptionNotFound) || errors.Is(r.fatal, ErrDetached)) {
		// An owner may have created a key consumer after the subscription's
		// consumers were removed; remove it too, unless a subscription of
		// the same id was created meanwhile (its consumers have our names).
		cctx, cancel := context.WithTimeout(context.Background(), r.c.cfg.apiTimeout)
		if rec, err := r.sub.load(cctx); errors.Is(err, ErrSubscriptionNotFound) || (err == nil && rec.Detached && rec.Created.Equal(r.rec.Created)) {
			_ = r.c.deleteConsumers(cctx, r.rec)
		}
		cancel()
	}
	return r.fatal
}

// supersede marks this run's messages as the old epoch's.
func (r *receiver) supersede() {
	r.supersedeOnce.Do(func() {
		r.c.cfg.logger.Info("subscription sought: settling the old epoch's messages", "subscription", r.sub.id)
		close(r.superseded)
	})
}

func (r *receiver) isSuperseded() bool {
	select {
	case <-r.superseded:
		return true
	default:
		return false
	}
}

// ending reports whether Receive is ending: what is handed back now goes
// with handBackPayload.
func (r *receiver) ending() bool {
	if r.hctx.Err() != nil {
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stopping
}

// fail ends Receive with err (the first error wins).
func (r *receiver) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fatal == nil {
		r.fatal = err
		close(r.fatalSet)
	}
}

// arrival is one delivered message, from a push or a pull consumer.
type arrival struct {
	subject, reply string
	header         nats.Header
	data           []byte
	consumer       string
	seq, attempt   uint64
	dseq           uint64 // the consumer's delivery sequence
	published      time.Time
	pin            string // the pin id of a partition's term
}

// onMsg runs on the subscription's delivery goroutine for every pushed
// message.
func (r *receiver) onMsg(m *nats.Msg) {
	meta, err := m.Metadata()
	if err != nil {
		return // not a JetStream delivery (nothing else is sent here)
	}
	r.deliver(nil, arrival{subject: m.Subject, reply: m.Reply, header: m.Header, data: m.Data,
		consumer: meta.Consumer, seq: meta.Sequence.Stream, attempt: meta.NumDelivered, published: meta.Timestamp})
}

// deliver records a delivered message and queues it; p is its partition
// (nil for push consumers).
func (r *receiver) deliver(p *partition, a arrival) {
	k := heldKey{consumer: a.consumer, seq: a.seq}
	now := time.Now()
	msg := &Message{
		Data:            a.data,
		Header:          a.header,
		PublishTime:     a.published,
		StreamSequence:  a.seq,
		DeliveryAttempt: int(a.attempt),
		ReceiveTime:     now.UTC(),
	}
	readHeaders(a.header, msg)
	d := &delivery{r: r, key: k, part: p, subject: a.subject, reply: a.reply, dseq: a.dseq, msg: msg, arrived: now, lastExtend: now}
	msg.d = d

	r.mu.Lock()
	if p != nil {
		p.arrivedLocked(a.pin, a.dseq)
	}
	if held, dup := r.held[k]; dup {
		// A redelivery of a message this process still holds (its deadline
		// passed while it waited): keep the copy we have, under the
		// server's newest delivery sequence, which the fence counts it by.
		// Even when stopping: a nack would let it run elsewhere beside our
		// handler.
		held.dseq = a.dseq
		r.mu.Unlock()
		return
	}
	if r.stopping {
		r.mu.Unlock()
		_ = r.c.nc.Publish(a.reply, handBackPayload)
		return
	}
	if p != nil && a.pin != "" && a.pin == p.lostPin {
		// Sent in a term that has ended: the new owner's fence counts it,
		// and it must not start here beside the new owner's handlers.
		// (Unless the server has that pin again: checkPin finds out.)
		p.checkPinLocked(a.pin)
		r.mu.Unlock()
		_ = r.c.nc.Publish(a.reply, ackPayload[ackNak])
		return
	}
	r.held[k] = d
	var start []*delivery
	if p != nil {
		start = p.addLocked(d)
	} else {
		start = []*delivery{d}
	}
	startNow, queued := r.launchLocked(start)
	r.mu.Unlock()
	r.afterLaunch(startNow, queued)
}

// launchLocked hands ds to handlers: those it can start at once (a free
// handler slot and nobody waiting ahead) it returns, the rest it queues for
// the dispatcher. The caller starts them with afterLaunch once it has
// unlocked r.mu.
func (r *receiver) launchLocked(ds []*delivery) (now []*delivery, queued bool) {
	for _, d := range ds {
		if len(r.queue) == 0 {
			select {
			case r.slots <- struct{}{}:
				r.workers.Add(1)
				now = append(now, d)
				continue
			default:
			}
		}
		r.queue = append(r.queue, d)
		queued = true
	}
	return now, queued
}

func (r *receiver) afterLaunch(now []*delivery, queued bool) {
	for _, d := range now {
		go r.handle(d)
	}
	if queued {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

// release forgets d: its deadline is no longer extended. settled says the
// server has its ack, for the gate of a partitioned key.
func (r *receiver) release(d *delivery, settled bool) {
	r.mu.Lock()
	var start []*delivery
	if r.held[d.key] == d {
		delete(r.held, d.key)
		if d.part != nil {
			start = d.part.releaseLocked(d, settled)
		}
	} else if settled && d.part != nil {
		start = d.part.settledLateLocked(d)
	}
	now, queued := r.launchLocked(start)
	r.mu.Unlock()
	r.afterLaunch(now, queued)
}

// confirmRemaining is the last round of confirmAcks, once Receive is
// stopping, so the books (and ReceiveStats) end square.
func (r *receiver) confirmRemaining(unconfirmed []*delivery) {
	r.confirmMu.Lock()
	batch := append(r.confirmQ, unconfirmed...)
	r.confirmQ = nil
	r.confirmMu.Unlock()
	if len(batch) == 0 {
		return
	}
	err := r.c.nc.FlushTimeout(r.c.cfg.apiTimeout)
	for _, d := range batch {
		r.release(d, err == nil)
	}
}

// markAckSent records that d's ack is on its way: a fence no longer
// counts it as unacked.
func (r *receiver) markAckSent(d *delivery) {
	r.mu.Lock()
	if r.held[d.key] == d && !d.ackSent {
		d.ackSent = true
	}
	r.mu.Unlock()
}

// confirmLater releases d once a round trip to the server shows the server
// has its ack.
func (r *receiver) confirmLater(d *delivery) {
	r.confirmMu.Lock()
	r.confirmQ = append(r.confirmQ, d)
	r.confirmMu.Unlock()
	select {
	case r.confirmWake <- struct{}{}:
	default:
	}
}

// confirmAcks confirms acks in groups: one flush (a PING the server answers
// after everything sent before it) for all the acks sent meanwhile. Acks
// that cannot be confirmed (the connection is down) are sent again until
// they are: their keys wait, as the server may or may not have them.
func (r *receiver) confirmAcks() {
	defer r.loops.Done()
	var batch, unconfirmed []*delivery
	failing := false // warned about this run of failures
	retry := time.NewTimer(0)
	<-retry.C
	for {
		select {
		case <-r.confirmWake:
		case <-retry.C:
			for _, d := range unconfirmed {
				_ = r.c.nc.Publish(d.reply, ackPayload[d.acked])
			}
		case <-r.stopped:
			r.confirmRemaining(unconfirmed)
			return
		}
		r.confirmMu.Lock()
		batch, r.confirmQ = r.confirmQ, batch[:0]
		r.confirmMu.Unlock()
		batch = append(batch, unconfirmed...)
		unconfirmed = unconfirmed[:0]
		if err := r.c.nc.FlushTimeout(r.c.cfg.apiTimeout); err != nil {
			if !failing {
				failing = true
				r.c.cfg.logger.Warn("acks not confirmed; sending them again until they are, their keys wait", "subscription", r.sub.id, "messages", len(batch), "err", err)
			}
			unconfirmed = append(unconfirmed, batch...)
			clear(batch)
			retry.Reset(250 * time.Millisecond)
			continue
		}
		failing = false
		for i, d := range batch {
			r.release(d, true)
			batch[i] = nil
		}
	}
}

// dispatch hands queued messages to handlers, at most
// MaxOutstandingMessages at a time.
func (r *receiver) dispatch() {
	defer r.loops.Done()
	for {
		select {
		case <-r.wake:
		case <-r.stopped:
			return
		}
		for {
			r.mu.Lock()
			if len(r.queue) == 0 {
				r.mu.Unlock()
				break
			}
			d := r.queue[0]
			r.queue[0] = nil
			r.queue = r.queue[1:]
			r.mu.Unlock()
			select {
			case r.slots <- struct{}{}:
			case <-r.stopped:
				d.finish(ackNak)
				return
			}
			r.workers.Add(1)
			go r.handle(d)
		}
	}
}

func (r *receiver) handle(d *delivery) {
	defer r.workers.Done()
	defer func() { <-r.slots }()
	defer func() {
		if p := recover(); p != nil {
			d.finish(ackNak)
			r.fail(fmt.Errorf("%w: %v (message %s, ordering key %q)", ErrHandlerPanic, p, d.msg.ID, d.msg.OrderingKey))
		}
	}()
	if r.isSuperseded() {
		d.finish(ackAck) // the old epoch's: the seek decides its fate
		return
	}
	if r.filter != nil && !r.filter.Match(d.msg.PubSubAttributes()) {
		d.finish(ackAck) // filtered out: acked unseen, so its key moves on
		return
	}
	if dl := r.deadLetter.Load(); dl != nil && d.msg.DeliveryAttempt > dl.MaxDeliveryAttempts {
		r.moveToDeadLetter(d, dl)
		return
	}
	d.msg.DeliverTime = time.Now().UTC()
	r.handler(r.hctx, d.msg)
	d.abandon()
}

// moveToDeadLetter publishes a message delivered too often to the
// dead-letter topic and terminates it here, so its key moves on. When the
// publish fails the message stays: it is redelivered after its deadline
// and the move is tried again.
func (r *receiver) moveToDeadLetter(d *delivery, dl *deadLetterRecord) {
	m := d.msg
	out := &Message{
		Data:        m.Data,
		OrderingKey: m.OrderingKey,
		Attributes:  make(map[string]string, len(m.Attributes)+2),
		CreateTime:  m.CreateTime,
	}
	maps.Copy(out.Attributes, m.Attributes)
	out.Attributes[DeadLetterSourceSubscriptionAttribute] = r.sub.String()
	out.Attributes[DeadLetterSourceDeliveryCountAttribute] = strconv.Itoa(m.DeliveryAttempt - 1)
	for name, vals := range m.Header {
		lower := strings.ToLower(name)
		if strings.HasPrefix(lower, "jetorder-") || strings.HasPrefix(lower, "nats-") {
			continue
		}
		if out.Header == nil {
			out.Header = nats.Header{}
		}
		out.Header[name] = vals
	}
	t := r.deadTopic(dl)
	// Wait for the outcome even when Receive is ending: a move cut short
	// would leave the message stored on the dead-letter topic and not
	// terminated here, to be moved again.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(r.hctx), r.c.cfg.apiTimeout+MaxPublishTimeout)
	defer cancel()
	_, err := t.Publish(wctx, out).Get(wctx)
	if err != nil {
		if out.OrderingKey != "" {
			t.ResumePublish(out.OrderingKey)
		}
		d.abandon()
		if r.hctx.Err() == nil {
			r.c.cfg.logger.Warn("move to dead-letter topic failed; will retry after the ack deadline",
				"subscription", r.sub.id, "dead_letter_topic", t.String(), "message", m.ID, "err", err)
		}
		return
	}
	r.c.cfg.logger.Info("moved message to dead-letter topic", "subscription", r.sub.id,
		"dead_letter_topic", t.String(), "message", m.ID, "ordering_key", m.OrderingKey, "attempts", m.DeliveryAttempt-1)
	d.finish(ackTerm)
	if f := r.settings.OnDeadLetter; f != nil {
		f(m)
	}
}

func (r *receiver) deadTopic(dl *deadLetterRecord) *Topic {
	name := dl.TopicProject + "/" + dl.Topic
	r.deadTopicMu.Lock()
	defer r.deadTopicMu.Unlock()
	t, ok := r.deadTopics[name]
	if !ok {
		if r.deadTopics == nil {
			r.deadTopics = make(map[string]*Topic)
		}
		t = r.c.TopicInProject(dl.Topic, dl.TopicProject)
		r.deadTopics[name] = t
	}
	return t
}

// extendLeases keeps the deadline of every held message from passing while
// it waits for, or runs in, a handler.
func (r *receiver) extendLeases(stop <-chan struct{}) {
	deadline := r.rec.ackDeadline()
	period := deadline / 3
	t := time.NewTicker(period)
	defer t.Stop()
	var due []string
	for {
		select {
		case <-t.C:
		case <-stop:
			return
		}
		now := time.Now()
		due = due[:0]
		r.mu.Lock()
		for _, d := range r.held {
			if now.Sub(d.lastExtend) >= deadline/2 && now.Sub(d.arrived) < r.settings.MaxExtension {
				d.lastExtend = now
				due = append(due, d.reply)
			}
		}
		r.mu.Unlock()
		for _, reply := range due {
			_ = r.c.nc.Publish(reply, ackPayload[ackProgress])
		}
	}
}

// supervise ends Receive when the subscription or its topic goes away, or
// the client or its connection closes.
func (r *receiver) supervise(ctx context.Context) {
	defer r.loops.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-r.stopped:
			return
		}
		if r.c.nc.IsClosed() {
			r.fail(fmt.Errorf("receive %s: %w", r.sub, nats.ErrConnectionClosed))
			return
		}
		cctx, cancel := r.c.withTimeout(ctx)
		rec, err := r.sub.load(cctx)
		if err == nil && !rec.Created.Equal(r.rec.Created) {
			err = fmt.Errorf("%w: %s was deleted and created again", ErrSubscriptionNotFound, r.sub)
		}
		if err == nil && rec.Detached {
			err = fmt.Errorf("%w: %s", ErrDetached, r.sub)
		}
		if err == nil && rec.Epoch != r.rec.Epoch {
			r.supersede()
			if rec.Settling {
				err = r.sub.settle(cctx)
			} else {
				err = errEpochChanged
			}
		}
		if err == nil {
			r.deadLetter.Store(rec.DeadLetter)
			r.retry.Store(rec.Retry)
		}
		if err == nil {
			err = r.c.checkTopic(cctx, r.rec)
		}
		if err == nil && r.rec.partitioned() {
			r.checkAwaiting(cctx)
		}
		cancel()
		if errors.Is(err, ErrSubscriptionNotFound) || errors.Is(err, ErrTopicDeleted) || errors.Is(err, ErrClosed) || errors.Is(err, ErrDetached) || errors.Is(err, errEpochChanged) {
			r.fail(err)
			return
		}
		if err != nil && ctx.Err() == nil {
			r.c.cfg.logger.Debug("subscription check failed; will retry", "subscription", r.sub.id, "err", err)
		}
	}
}
