package adapter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	// Hooks, if set, hear what Receive does, for metrics and logs.
	Hooks Hooks

	// Ordering is when a key's next message may start on an ordered
	// subscription: StrictOrdering (the default) or PipelinedOrdering.
	Ordering Ordering
	// KeyWindow bounds, with PipelinedOrdering, the messages of a key
	// started and not yet acked. Default DefaultKeyWindow.
	KeyWindow int
}

// Ordering is when a key's next message may start.
type Ordering int

const (
	// StrictOrdering starts a key's next message once the server has the
	// previous one's ack (the ordering specification's stop-and-wait).
	StrictOrdering Ordering = iota
	// PipelinedOrdering starts a key's next message as soon as the
	// previous one's handler returns, acked or not, up to KeyWindow
	// messages of the key not yet acked: Pub/Sub's semantics for clients
	// that run a key's handlers one at a time. A handler may return before
	// it acks or nacks; its message stays held (its deadline extended, up
	// to MaxExtension) until it does, and the key's later acks wait for
	// it: every message must be acked or nacked. A key's acks reach the
	// server in order. A nack brings back that message and every later
	// message of its key started since, acked or not, in order after it.
	// AckWithResult acks as Ack does and does not wait for the server's
	// confirmation (the ack may wait for the key's earlier ones).
	//
	// It applies to partitioned delivery. Per-key delivery (a consumer per
	// key with MaxAckPending 1), and subscriptions with exactly-once
	// delivery (whose acks are confirmed one by one), deliver with
	// StrictOrdering.
	PipelinedOrdering
)

// DefaultKeyWindow is KeyWindow's default: as many as the default
// MaxOutstandingMessages, so that flow control, not the window, is what
// bounds a hot key.
const DefaultKeyWindow = 1000

// DefaultReceiveSettings are the settings a new Subscription handle has.
var DefaultReceiveSettings = ReceiveSettings{
	MaxOutstandingMessages: 1000,
	MaxExtension:           60 * time.Minute,
}

// keyWindow is how many messages of a key this receiver lets be started
// and unsettled at once: 1 unless it pipelines.
func (r *receiver) keyWindow() int {
	if r.settings.Ordering != PipelinedOrdering || !r.rec.partitioned() || r.rec.ExactlyOnce {
		return 1
	}
	if r.settings.KeyWindow <= 0 {
		return DefaultKeyWindow
	}
	return r.settings.KeyWindow
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

// receiver runs one Receive call.
type receiver struct {
	c        *Client
	sub      *Subscription
	rec      *subRecord
	handler  func(context.Context, *Message)
	settings ReceiveSettings
	// pipelined: a key's next message starts once the previous one is
	// handed over (keyWindow > 1).
	pipelined bool

	// deadLetter is the subscription's current policy (nil for none);
	// supervise refreshes it, so an Update reaches a running Receive.
	deadLetter  atomic.Pointer[deadLetterRecord]
	retry       atomic.Pointer[retryPolicyRecord] // likewise the retry policy
	filter      *filter.Filter                    // the subscription's (fixed at creation), or nil
	deadTopics  map[string]*Topic                 // dead-letter topic handles, by full name
	deadTopicMu sync.Mutex

	// ackWarn logs the acks and nacks that could not be sent (the
	// connection is down), at most once per interval.
	ackWarn rareWarning

	// mode delivers an ordered subscription's keyed messages (nil
	// without ordering); the receiver holds what the push subscription
	// delivers.
	mode keyedDelivery
	// presence answers for this receiver of an ordered subscription, so
	// that others can take over at once what it held should it die
	// (presence.go); nil without ordering.
	presence *presence

	hctx    context.Context // handlers' context, cancelled when Receive ends
	slots   chan struct{}
	wake    chan struct{}
	work    chan *delivery // to a handler goroutine waiting for work (startHandler)
	stopped chan struct{}
	workers sync.WaitGroup // handlers
	loops   sync.WaitGroup // background goroutines

	// superseded is closed when the subscription was sought: this run's
	// messages are the old epoch's, and none starts in a handler again.
	superseded    chan struct{}
	supersedeOnce sync.Once

	mu    sync.Mutex
	queue []*delivery           // waiting for a handler slot
	held  map[heldKey]*delivery // pushed messages held
	// revoked are deliveries a per-key take-over handed back while they
	// were on their way here: they must not start (takeover_perkey.go).
	revoked map[heldKey]revocation
	// lastAcks are, per consumer, the last message a handler acked
	// (noteAck), for hold checks.
	lastAcks map[string]lastAck
	// checking are the key consumer deliveries being checked before they
	// may start (keyDeliveryDue), by message: the highest delivery number
	// of each. Hold checks about them are answered "checking".
	checking map[heldKey]uint64
	// elected is, per key consumer, when a leader was last elected for
	// it (nats-server's advisory): its deposed leader may still send
	// copies for a while (newLeaderLately).
	elected map[string]election
	// lastElection is when elected last changed (unix nanoseconds), so
	// that a delivery needs no lock to know nothing changed lately.
	lastElection atomic.Int64
	stopping     bool
	fatal        error
	fatalSet     chan struct{}
}

// Receive calls f for each delivered message, concurrently, until ctx is
// done or a fatal error occurs. With message ordering enabled and
// StrictOrdering, f never runs for a message while an earlier message of
// its ordering key is unacked, on any process receiving from the
// subscription; with PipelinedOrdering it runs once f has returned for the
// earlier one (ReceiveSettings.Ordering).
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
			work:     make(chan *delivery),
			stopped:  make(chan struct{}),

			held:       make(map[heldKey]*delivery),
			revoked:    make(map[heldKey]revocation),
			lastAcks:   make(map[string]lastAck),
			checking:   make(map[heldKey]uint64),
			elected:    make(map[string]election),
			fatalSet:   make(chan struct{}),
			superseded: make(chan struct{}),
		}
		r.pipelined = r.keyWindow() > 1
		r.mode = newKeyedDelivery(r)
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
	_, err := c.checkTopicStreams(ctx, rec)
	return err
}

// checkTopicStreams is checkTopic, and returns the topic's key stream
// count (1 for none).
func (c *Client) checkTopicStreams(ctx context.Context, rec *subRecord) (int, error) {
	info, err := c.js.Stream(ctx, rec.stream())
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return 0, fmt.Errorf("%w: projects/%s/topics/%s", ErrTopicDeleted, rec.TopicProject, rec.Topic)
		}
		return 0, err
	}
	if !info.CachedInfo().Created.Equal(rec.StreamCreated) {
		return 0, fmt.Errorf("%w: projects/%s/topics/%s was deleted and created again", ErrTopicDeleted, rec.TopicProject, rec.Topic)
	}
	if v := info.CachedInfo().Config.Metadata[metaLayout]; v != subjectLayout {
		return 0, fmt.Errorf("%w: projects/%s/topics/%s has subject layout %q, this version reads %q; create the topic again",
			ErrInvalidConfig, rec.TopicProject, rec.Topic, v, subjectLayout)
	}
	n := keyStreams(info.CachedInfo())
	awaitingMove := rec.KeyStreams <= 1 && info.CachedInfo().Config.Metadata[metaMoved] != "" // move.go: it reads what it read before
	if n != max(rec.KeyStreams, 1) && !awaitingMove {
		// A subscription created by a build that does not know key
		// streams has no consumers on them.
		return 0, fmt.Errorf("%w: projects/%s/topics/%s has %d key streams, and subscription %s was created for %d; create the subscription again",
			ErrInvalidConfig, rec.TopicProject, rec.Topic, n, rec.ID, max(rec.KeyStreams, 1))
	}
	return n, nil
}

// run receives until ctx ends or a fatal error, then shuts down.
func (r *receiver) run(ctx context.Context, cancelHandlers context.CancelFunc) error {
	if r.mode != nil {
		r.presence = newPresence(r.c.nc)
		if err := r.presence.start(r.answerHoldCheck); err != nil {
			return fmt.Errorf("receive %s: %w", r.sub, err)
		}
	}
	bg, stopBackground := context.WithCancel(ctx)
	defer stopBackground()
	r.loops.Add(1)
	go r.dispatch()
	var sub *nats.Subscription
	err := r.startMode(ctx)
	if err == nil {
		// Subscribed after the mode started: a per-key receiver is a
		// member of its subscription before anything reaches it.
		sub, err = r.c.nc.QueueSubscribe(keyrouter.DeliverSubject(r.rec.Project, r.rec.nameID()), deliverGroup, r.onMsg)
		if err != nil {
			err = fmt.Errorf("receive %s: %w", r.sub, err)
		} else {
			// JetStream bounds what can be pushed (MaxAckPending per
			// consumer), so the client must not drop any of it as a slow
			// consumer.
			_ = sub.SetPendingLimits(-1, -1)
		}
	}
	if err != nil {
		r.fail(err)
	}
	// Started after the mode, which they call: deadlines are extended until
	// the last handler has returned (a handler still running after Receive
	// was cancelled must not see its message redelivered, and the next of
	// its key run, elsewhere); the first extension is a third of a
	// deadline away.
	stopExtending := make(chan struct{})
	extended := make(chan struct{})
	go func() {
		defer close(extended)
		r.extendDeadlines(stopExtending)
	}()
	r.loops.Add(1)
	go r.supervise(bg)

	select {
	case <-ctx.Done():
	case <-r.fatalSet:
	}
	r.shutdown(sub, stopBackground, cancelHandlers, func() {
		close(stopExtending)
		<-extended
	})
	return r.fatal
}

// startMode starts the delivery mode, if any, and says why it failed: a
// subscription or topic deleted as Receive started, most likely.
func (r *receiver) startMode(ctx context.Context) error {
	if r.mode == nil {
		return nil
	}
	sctx, cancel := r.c.withTimeout(ctx)
	defer cancel()
	err := r.mode.start(sctx)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		if _, lerr := r.sub.load(sctx); errors.Is(lerr, ErrSubscriptionNotFound) {
			err = lerr
		}
	}
	if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrConsumerNotFound) {
		if terr := r.c.checkTopic(sctx, r.rec); errors.Is(terr, ErrTopicDeleted) {
			err = terr
		}
	}
	switch {
	case err == nil, ctx.Err() != nil:
		return nil
	case errors.Is(err, ErrSubscriptionNotFound), errors.Is(err, ErrTopicDeleted):
		return err
	}
	return fmt.Errorf("receive %s: %w", r.sub, err)
}

// shutdown ends Receive, in this order, under one deadline for every step
// that waits on the server (the handlers are waited for without one:
// Receive returns only once every handler has):
//
//  1. Stop taking messages: the push subscription and the mode drain, so
//     what the connection already holds for us is handed back at once
//     instead of waiting out its ack deadline; the background loops end.
//  2. Hand back what no handler has started.
//  3. Cancel the handlers' context and wait for every handler.
//  4. Stop the dead-letter topics' publishers and the deadline extension.
//  5. The mode settles what it holds (acks confirmed, the rest handed
//     back) and gives up what it owned; the receiver hands back what
//     handlers left unacked.
//  6. Remove key consumers the discoverer may have created after the
//     subscription was deleted.
func (r *receiver) shutdown(sub *nats.Subscription, stopBackground, cancelHandlers, stopExtending func()) {
	deadline := time.Now().Add(r.c.cfg.apiTimeout)

	// 1.
	r.mu.Lock()
	r.stopping = true
	r.mu.Unlock()
	if r.mode != nil {
		r.mode.stop(deadline)
	}
	if sub != nil {
		closed := sub.StatusChanged(nats.SubscriptionClosed)
		if err := sub.Drain(); err == nil {
			select {
			case <-closed:
			case <-time.After(time.Until(deadline)):
			}
		}
		_ = sub.Unsubscribe()
	}
	close(r.stopped)
	stopBackground()
	r.loops.Wait()

	// 2.
	r.mu.Lock()
	queued := r.queue
	r.queue = nil
	r.mu.Unlock()
	for _, d := range queued {
		d.finish(ackNak)
	}

	// 3.
	cancelHandlers()
	r.workers.Wait()
	r.ackWarn.flush(r.c.cfg.logger)

	// 4.
	r.deadTopicMu.Lock()
	for _, t := range r.deadTopics {
		t.Stop()
	}
	r.deadTopicMu.Unlock()
	stopExtending()

	// 5.
	if r.mode != nil {
		r.mode.end(deadline)
	}
	r.mu.Lock()
	var left []*delivery
	for _, d := range r.held {
		left = append(left, d)
	}
	r.mu.Unlock()
	for _, d := range left {
		d.finish(ackNak)
	}
	if r.presence != nil {
		// Nothing of ours is unacked any more.
		r.presence.stop()
	}

	// 6.
	if r.fatal != nil && (errors.Is(r.fatal, ErrSubscriptionNotFound) || errors.Is(r.fatal, ErrDetached)) {
		// Unless a subscription of the same id was created meanwhile (its
		// consumers have our names).
		cctx, cancel := context.WithTimeout(context.Background(), r.c.cfg.apiTimeout)
		if rec, err := r.sub.load(cctx); errors.Is(err, ErrSubscriptionNotFound) || (err == nil && rec.Detached && rec.Created.Equal(r.rec.Created)) {
			_ = r.c.deleteConsumers(cctx, r.rec)
		}
		cancel()
	}
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
	published      time.Time
}

// newDelivery is the delivery of a, held by home.
func (r *receiver) newDelivery(home holder, a arrival) *delivery {
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
	d := &delivery{r: r, home: home, key: heldKey{consumer: a.consumer, seq: a.seq}, subject: a.subject, reply: a.reply, msg: msg, arrived: now}
	if r.pipelined {
		d.revokedC = make(chan struct{})
	}
	d.lastExtend.Store(now.UnixNano())
	msg.d = d
	return d
}

// onMsg runs on the push subscription's delivery goroutine for every
// pushed message: the shared consumer's, and per-key consumers'.
func (r *receiver) onMsg(m *nats.Msg) {
	meta, err := m.Metadata()
	if err != nil {
		return // not a JetStream delivery (nothing else is sent here)
	}
	keyConsumer := r.isKeyConsumer(meta.Consumer)
	if keyConsumer {
		r.traceKey("key consumer delivery arrived", meta.Consumer, meta.Sequence.Stream, meta.Sequence.Consumer, meta.NumDelivered)
	}
	if staleCheck && keyConsumer && (meta.NumDelivered > 1 || time.Since(meta.Timestamp) > r.staleCheckAge() || r.newLeaderLately(meta.Consumer)) {
		k, dseq := heldKey{consumer: meta.Consumer, seq: meta.Sequence.Stream}, meta.Sequence.Consumer
		r.mu.Lock()
		acked := r.ackedHereLocked(meta.Consumer, meta.Sequence.Stream, meta.Timestamp)
		revoked := !acked && r.revokedLocked(k, dseq)
		if !acked && !revoked && r.checking[k] < dseq {
			// Claimed before anyone is asked: a receiver asked about its
			// twin meanwhile answers "checking" (answerHoldCheck).
			r.checking[k] = dseq
		}
		r.mu.Unlock()
		if revoked {
			// As arrive would: handed back, or a twin's receiver was
			// asked about it first.
			r.traceKey("key consumer delivery dropped: handed back while on its way", meta.Consumer, meta.Sequence.Stream, dseq, meta.NumDelivered)
			return
		}
		if acked {
			// Not worth asking anyone about (arrive drops it).
			r.dropAckedHere(m, meta)
			return
		}
		// A key consumer's redelivery, a message stored a while ago, or
		// a delivery of a consumer whose leader changed lately: each may
		// not be the key's to deliver. Asked off the delivery goroutine,
		// which every key shares.
		r.loops.Add(1)
		go func() {
			defer r.loops.Done()
			if r.keyDeliveryDue(m, meta) {
				r.arrive(m, meta)
			}
			r.mu.Lock()
			if r.checking[k] == dseq {
				delete(r.checking, k)
			}
			r.mu.Unlock()
		}()
		return
	}
	r.arrive(m, meta)
}

// staleCheckAge is how old a key consumer's message may be on arrival
// before the consumer is asked whether its delivery is still due (see
// keyDeliveryDue). A first delivery overtaken by a later one waited in
// transit at least until the server redelivered the message, an ack
// deadline after sending it (a paused server holds what it was passing on
// for as long as it is paused); a tenth of it is left for the servers'
// and this host's clocks to differ.
//
// On a cluster a stale first delivery can also come sooner: a consumer
// leader cut off by a partition that, at the heal, sends a copy it had
// queued before the majority elected another leader, which delivered the
// message meanwhile (RELIABILITY.md, "A deposed consumer leader does not
// deliver"). Its message was stored before the partition, and a majority
// elects no leader in under nats-server's shortest election timeout (4 s),
// so such a copy is older than that: messages older than clusterStaleAge
// are asked about (1.5 s left for clocks). Asking costs a round trip to
// the consumer's leader, which a key catching up on a backlog pays for
// each of its messages older than that.
func (r *receiver) staleCheckAge() time.Duration {
	age := r.rec.ackDeadline() * 9 / 10
	if r.c.nc.ConnectedClusterName() != "" {
		age = min(age, clusterStaleAge)
	}
	return age
}

// clusterStaleAge is staleCheckAge's bound on a cluster.
const clusterStaleAge = 2500 * time.Millisecond

// newLeaderWindow is how long after a key consumer's leader election its
// receivers check each of its first deliveries (newLeaderLately).
const newLeaderWindow = time.Minute

// firstElectionSlack is how soon after a key consumer's creation its
// leader's election is taken for its first, which deposes nobody: the
// creation's time and the election's are of two servers' clocks.
const firstElectionSlack = 5 * time.Second

// election is a leader elected for a key consumer: when the advisory came,
// and its time by the elected leader's clock.
type election struct {
	at, serverAt time.Time
}

// newLeaderLately reports whether a leader was elected for the key
// consumer within newLeaderWindow. Until its deposed leader has stepped
// down, which may be as late as it is paused (a stopped process, a frozen
// host), nats-server may send a delivery of the deposed leader's beside
// its successor's: the same message with the same delivery number, or
// another message under that number (RELIABILITY.md, "A deposed consumer
// leader does not deliver"). Both reach receivers as first deliveries of
// messages stored just now, which only the consumer and the other
// receivers can tell apart (keyDeliveryDue).
func (r *receiver) newLeaderLately(consumer string) bool {
	if time.Since(time.Unix(0, r.lastElection.Load())) >= newLeaderWindow {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.elected[consumer]
	return ok && time.Since(e.at) < newLeaderWindow
}

// leaderElected notes an advisory of a leader elected for a consumer, at
// serverAt by the leader's clock (zero if the advisory did not say).
func (r *receiver) leaderElected(consumer string, serverAt time.Time) {
	if !r.isKeyConsumer(consumer) {
		return
	}
	now := time.Now()
	r.mu.Lock()
	r.elected[consumer] = election{at: now, serverAt: serverAt}
	r.mu.Unlock()
	r.lastElection.Store(now.UnixNano())
	r.c.cfg.logger.Debug("key consumer leader elected: its first deliveries are checked for a while", "subscription", r.sub.id,
		"consumer", consumer, "for", newLeaderWindow)
}

// firstElection forgets the consumer's election when it came within
// firstElectionSlack of the consumer's creation: nats-server announces a
// new consumer's first leader too, and no deposed leader can send a twin.
// So a new key's deliveries cost one question to its consumer, not a
// minute of them.
func (r *receiver) firstElection(consumer string, created time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.elected[consumer]; ok && !e.serverAt.IsZero() && e.serverAt.Sub(created).Abs() < firstElectionSlack {
		delete(r.elected, consumer)
	}
}

// keyDeliveryDue reports whether m, a key consumer's delivery that is a
// redelivery, of a message stored a while ago, or of a consumer whose
// leader changed lately, is to be delivered:
// whether it is the consumer's latest delivery, of a message the consumer
// still has unacked and has delivered nothing of the key after.
//
// With MaxAckPending 1 a key consumer has one message out at a time, so
// any other delivery is stale:
//   - an earlier delivery of a message delivered again since, which waited
//     in a paused server while the redelivery went elsewhere and was acked,
//     and the key went on;
//   - a redelivery of a message acked meanwhile (its ack came late, through
//     a server that was paused);
//   - a redelivery of a message the consumer had delivered past: the
//     server had its ack and lost it (a consumer leader that failed before
//     it passed the ack on). Pub/Sub would deliver every later message of
//     the key again too; JetStream redelivers only this one;
//   - a deposed leader's delivery of another message than the one the
//     consumer delivered under that number (newLeaderLately).
//
// (The consumer's state in a cluster may not show the latest delivery yet:
// a delivery sequence above the state's is taken for the latest.)
//
// A handler given a stale delivery would see its key go back a message
// and then skip ahead, or two messages of the key in handlers at once. A
// stale delivery of a message the consumer has acked, or the redelivery of
// one it has delivered past, is acked again, unseen, as the partitioned
// receiver does (gates.done); any other stale delivery is dropped, its
// newer delivery being the one that counts.
//
// A redelivery the consumer still counts as due may yet meet its earlier
// delivery: still in another receiver's handler (whose deadline extensions
// a paused or cut-off server did not pass on), or on its way there; and a
// first delivery of a consumer whose leader changed lately may have a
// twin, the same message under the same number, sent by the deposed
// leader. So the other receivers are asked too (perKeyMode.heldElsewhere):
// one that holds the message keeps it, and the delivery is dropped; one
// that acked it lately has it acked again; one checking a copy of it
// settles with this one which runs (receiver.yields); and each that does
// not hold it drops the earlier delivery should it come. A receiver that
// neither answers nor is gone within the time below has the redelivery
// dropped: the message comes again after its ack deadline, and is asked
// about again. (A first delivery is handed over then.)
//
// The consumer is asked for up to min(ack deadline / 4, 2 s); when it does
// not answer (a cluster electing its leaders), the delivery is handed over
// unasked, as the receiver did before it asked: dropping it would hold
// its key until the deadline, again and again while the cluster is busy.
// A redelivery is still checked with the other receivers, who answer
// without the cluster's JetStream.
func (r *receiver) keyDeliveryDue(m *nats.Msg, meta *nats.MsgMetadata) bool {
	seq, dseq := meta.Sequence.Stream, meta.Sequence.Consumer
	giveUp := time.Now().Add(min(r.rec.ackDeadline()/4, 2*time.Second))
	for {
		ctx, cancel := context.WithTimeout(r.hctx, min(r.c.cfg.apiTimeout, r.rec.ackDeadline()/4, time.Second))
		c, err := r.c.js.PushConsumer(ctx, meta.Stream, meta.Consumer)
		switch {
		case err == nil:
			info := c.CachedInfo()
			acked := info.AckFloor.Stream >= seq
			overtaken := info.Delivered.Consumer > dseq // delivered again, or the key went on
			lostAck := meta.NumDelivered > 1 && !overtaken && info.Delivered.Stream > seq
			// With a message unacked the consumer moves on to no other, so
			// its number names that message alone.
			otherUnderNumber := !acked && info.Delivered.Consumer == dseq && info.Delivered.Stream != seq
			r.firstElection(meta.Consumer, info.Created)
			if acked || overtaken || lostAck || otherUnderNumber {
				r.c.cfg.logger.Debug("key consumer delivery no longer due: dropped", "subscription", r.sub.id,
					"consumer", meta.Consumer, "seq", seq, "dseq", dseq, "attempt", meta.NumDelivered, "delivered", info.Delivered.Stream,
					"delivered_dseq", info.Delivered.Consumer, "ack_floor", info.AckFloor.Stream)
				if acked || lostAck {
					// Not delivered even if the ack fails: it then comes
					// again, and is asked about again.
					_, _ = r.c.nc.RequestWithContext(ctx, m.Reply, ackPayload[ackAck])
				}
				cancel()
				return false
			}
		case errors.Is(err, jetstream.ErrConsumerNotFound):
			cancel()
			r.traceKey("key consumer delivery dropped: the consumer is gone", meta.Consumer, seq, dseq, meta.NumDelivered)
			return false // gone with its messages
		case r.hctx.Err() != nil:
			cancel()
			return r.handBackUnasked(m)
		case !time.Now().After(giveUp):
			cancel()
			if !r.pauseBeforeAsking() {
				return r.handBackUnasked(m)
			}
			continue
		default:
			r.c.cfg.logger.Debug("key consumer did not answer whether its delivery is due: handed over unasked, a redelivery once no other receiver holds it",
				"subscription", r.sub.id, "consumer", meta.Consumer, "seq", seq, "err", err)
		}
		cancel()
		if meta.NumDelivered == 1 && !r.newLeaderLately(meta.Consumer) {
			return true
		}
		held, err := r.deliveryHeldElsewhere(m, meta)
		switch {
		case err == nil && held == heldByNone:
			return true
		case err == nil:
			r.c.cfg.logger.Debug("key consumer delivery dropped: another receiver holds the message, or acked it",
				"subscription", r.sub.id, "consumer", meta.Consumer, "seq", seq, "dseq", dseq, "acked", held == ackedByPeer)
			return false
		case meta.NumDelivered == 1 && (time.Now().After(giveUp) || !isTimeout(err)):
			// A twin comes from a deposed leader catching up with the
			// cluster, which a receiver cut off from the others is not,
			// and dropping the delivery would hold its key until its
			// deadline. A receiver slow to answer is asked again until
			// then; one without a presence subscription (gone, or not
			// yet seen after a reconnect) holds no twin to answer for.
			r.c.cfg.logger.Debug("key consumer delivery handed over: a receiver that may hold a twin did not answer", "subscription", r.sub.id,
				"consumer", meta.Consumer, "seq", seq, "err", err)
			return true
		case time.Now().After(giveUp):
			// Its next delivery asks again.
			r.c.cfg.logger.Debug("key consumer delivery dropped: a receiver that may hold the message did not answer", "subscription", r.sub.id,
				"consumer", meta.Consumer, "seq", seq, "err", err)
			return false
		}
		if !r.pauseBeforeAsking() {
			return r.handBackUnasked(m)
		}
	}
}

// isTimeout reports whether err includes a request that timed out.
func isTimeout(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}

// traceKey logs, at debug level, a step of a key consumer delivery's
// way through the receiver: what a fault test's diagnosis reads to follow
// a message. It runs for every message, so the level is checked before
// anything is made of the arguments.
func (r *receiver) traceKey(msg, consumer string, seq, dseq, attempt uint64) {
	if !r.c.cfg.logger.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	r.c.cfg.logger.Debug(msg, "subscription", r.sub.id, "consumer", consumer, "seq", seq, "dseq", dseq, "attempt", attempt)
}

// confirmedAckTrace is what traceFinished says of an ack the server
// confirmed (AckWithResult).
var confirmedAckTrace = []byte("+ACK, confirmed")

// traceFinished logs, at debug level, how a per-key delivery ended.
func (r *receiver) traceFinished(d *delivery, payload []byte) {
	if !r.c.cfg.logger.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	r.c.cfg.logger.Debug("key consumer delivery finished", "subscription", r.sub.id, "consumer", d.key.consumer, "seq", d.key.seq, "payload", string(payload))
}

// pauseBeforeAsking waits a little before a delivery's check asks again;
// false when Receive ended meanwhile.
func (r *receiver) pauseBeforeAsking() bool {
	select {
	case <-r.hctx.Done():
		return false
	case <-time.After(250 * time.Millisecond):
		return true
	}
}

// handBackUnasked hands back a key consumer's delivery that Receive ended
// before it was found due or not: redelivered at once, not after its ack
// deadline, and asked about by whoever gets it. It returns false.
func (r *receiver) handBackUnasked(m *nats.Msg) bool {
	_ = r.c.nc.Publish(m.Reply, handBackPayload)
	return false
}

// deliveryHeldElsewhere asks the other receivers of the subscription
// whether they hold m's message (perKeyMode.heldElsewhere); acked by one,
// m is acked again unseen.
func (r *receiver) deliveryHeldElsewhere(m *nats.Msg, meta *nats.MsgMetadata) (holdAnswer, error) {
	pk, ok := r.mode.(*perKeyMode)
	if !ok {
		return heldByNone, nil
	}
	ctx, cancel := context.WithTimeout(r.hctx, min(r.rec.ackDeadline()/4, time.Second))
	defer cancel()
	held, err := pk.heldElsewhere(ctx, holdCheck{consumer: meta.Consumer, seq: meta.Sequence.Stream, dseq: meta.Sequence.Consumer})
	if err == nil && held == ackedByPeer {
		_, _ = r.c.nc.RequestWithContext(ctx, m.Reply, ackPayload[ackAck])
	}
	return held, err
}

// arrive takes a pushed message in: held, and handed to a handler.
func (r *receiver) arrive(m *nats.Msg, meta *nats.MsgMetadata) {
	d := r.newDelivery(r, arrival{subject: m.Subject, reply: m.Reply, header: m.Header, data: m.Data,
		consumer: meta.Consumer, seq: meta.Sequence.Stream, attempt: meta.NumDelivered, published: meta.Timestamp})
	r.mu.Lock()
	if r.isKeyConsumer(meta.Consumer) && r.ackedHereLocked(meta.Consumer, meta.Sequence.Stream, meta.Timestamp) {
		// Checked here, under the lock noteAck takes, as well as on
		// arrival: an ack sent while keyDeliveryDue asked about this
		// copy is seen.
		r.mu.Unlock()
		r.dropAckedHere(m, meta)
		return
	}
	if r.revokedLocked(d.key, meta.Sequence.Consumer) {
		// Handed back by a take-over while on its way here: its next
		// delivery runs, here or elsewhere.
		r.mu.Unlock()
		r.traceKey("key consumer delivery dropped: handed back while on its way", meta.Consumer, meta.Sequence.Stream, meta.Sequence.Consumer, meta.NumDelivered)
		return
	}
	if _, dup := r.held[d.key]; dup {
		// A redelivery of a message this process still holds (its deadline
		// passed while it waited): keep the copy we have. Even when
		// stopping: a nack would let it run elsewhere beside our handler.
		r.mu.Unlock()
		r.traceKey("delivery dropped: a copy of a message held here", meta.Consumer, meta.Sequence.Stream, meta.Sequence.Consumer, meta.NumDelivered)
		return
	}
	if r.stopping {
		r.mu.Unlock()
		_ = r.c.nc.Publish(d.reply, handBackPayload)
		return
	}
	r.held[d.key] = d
	now, queued := r.launchLocked([]*delivery{d})
	r.mu.Unlock()
	r.afterLaunch(now, queued)
}

// launch hands ds, which may start now, to handlers.
func (r *receiver) launch(ds []*delivery) {
	if len(ds) == 0 {
		return
	}
	r.mu.Lock()
	now, queued := r.launchLocked(ds)
	r.mu.Unlock()
	r.afterLaunch(now, queued)
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
		r.startHandler(d)
	}
	if queued {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

// The receiver holds the pushed messages (holder): JetStream itself holds
// back a key's next message, so a release starts nothing.

var _ holder = (*receiver)(nil)

func (r *receiver) current(d *delivery) *delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.held[d.key]
}

// release lets d go. settled: its ack was confirmed (AckWithResult), and
// for a per-key delivery it is recorded as finishWith records Ack's, now
// that the server has it (before, the message comes back if the ack was
// lost, as AckWithResult's error says it may).
func (r *receiver) release(d *delivery, settled bool) {
	if _, perKey := r.mode.(*perKeyMode); perKey && settled {
		r.noteAck(d)
		r.traceFinished(d, confirmedAckTrace)
	}
	r.mu.Lock()
	if r.held[d.key] == d {
		delete(r.held, d.key)
	}
	r.mu.Unlock()
}

func (r *receiver) confirmsAcks() bool       { return false }
func (r *receiver) ackSending(*delivery)     {}
func (r *receiver) confirmLater(d *delivery) { r.release(d, true) }

// handOver: JetStream's per-key consumers (MaxAckPending 1) deliver a
// key's next message only once this one is acked, so a message not acked
// by now comes back after its deadline (strict ordering only).
func (r *receiver) handOver(d *delivery) { r.release(d, false) }

// pipelines: never. The keyed messages the receiver holds are per-key
// delivery's, strict for the reason above; the rest have no key whose
// next message could start.
func (r *receiver) pipelines() bool { return false }

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
			r.startHandler(d)
		}
	}
}

// handlerIdle is how long a handler goroutine waits for another message
// before it ends.
const handlerIdle = time.Second

// startHandler runs d's handler on a handler goroutine that is waiting
// for work, or on a new one. While messages flow the goroutines are
// reused: a new goroutine per message grew its stack anew for every
// handler, which the profiles of partitioned delivery put at 5-9% of the CPU.
func (r *receiver) startHandler(d *delivery) {
	select {
	case r.work <- d:
	default:
		go r.handlerLoop(d)
	}
}

// handlerLoop handles d, then the messages startHandler gives it, until
// none comes for handlerIdle or Receive stops.
func (r *receiver) handlerLoop(d *delivery) {
	idle := time.NewTimer(handlerIdle)
	defer idle.Stop()
	for {
		r.handle(d)
		idle.Reset(handlerIdle)
		select {
		case d = <-r.work:
		case <-idle.C:
			return
		case <-r.stopped:
			return
		}
	}
}

func (r *receiver) handle(d *delivery) {
	defer r.workers.Done()
	defer func() { <-r.slots }()
	if r.pipelined {
		// However the handler ends, its key learns it is done with d: a
		// key whose message was revoked before or while it ran waits for
		// that. (Deferred first, so it runs after a panic's nack.)
		defer d.home.handOver(d)
	}
	defer func() {
		if p := recover(); p != nil {
			d.finish(ackNak)
			r.fail(fmt.Errorf("%w: %v (message %s, ordering key %q)", ErrHandlerPanic, p, d.msg.ID, d.msg.OrderingKey))
		}
	}()
	select {
	case <-d.revokedC: // nil without pipelining
		return // handed back with an earlier message of its key before it started: it comes again after it
	default:
	}
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
	if !r.pipelined {
		d.home.handOver(d)
	}
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
	d.finish(ackTerminate)
	if h := r.settings.Hooks; h != nil {
		h.DeadLettered(r.sub, m)
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

// extendDeadlines keeps the deadline of every held message from passing while
// it waits for, or runs in, a handler.
func (r *receiver) extendDeadlines(stop <-chan struct{}) {
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
		extend := func(d *delivery) {
			if now.Sub(time.Unix(0, d.lastExtend.Load())) >= deadline/2 && now.Sub(d.arrived) < r.settings.MaxExtension {
				d.lastExtend.Store(now.UnixNano())
				due = append(due, d.reply)
			}
		}
		r.mu.Lock()
		for _, d := range r.held {
			extend(d)
		}
		r.mu.Unlock()
		if r.mode != nil {
			r.mode.eachHeld(extend)
		}
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
		keyStreams := 1
		if err == nil {
			keyStreams, err = r.c.checkTopicStreams(cctx, r.rec)
		}
		if err == nil && r.mode != nil {
			r.mode.check(cctx)
		}
		if err == nil && keyStreams > 1 && !r.rec.split() {
			// The topic moved onto key streams: once every keyed message of
			// its own stream is acked, so does the subscription (a new
			// epoch, which the next tick finds).
			if _, merr := r.sub.moveToKeyStreams(cctx, nil); merr != nil && !errors.Is(merr, errNotTopics) {
				r.c.cfg.logger.Warn("could not move the subscription onto its topic's key streams; will retry", "subscription", r.sub.String(), "err", merr)
			}
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
