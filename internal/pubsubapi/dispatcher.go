package pubsubapi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/cloudevents"
	"github.com/jetorder/jetorder/internal/broker"
	"github.com/jetorder/jetorder/internal/metrics"
	jstatus "github.com/jetorder/jetorder/internal/status"
)

// maxHeldExtension bounds how long the adapter keeps a message's JetStream
// deadline extended while a lease holds it; the lease's own deadline (set
// and extended by the client) decides when it is redelivered.
const maxHeldExtension = 24 * time.Hour

// outcome is how a lease ended.
type outcome int

const (
	outAck      outcome = iota
	outNack             // ModifyAckDeadline 0
	outExpired          // the deadline passed
	outReturned         // never reached a client (refused, or the send failed): redelivered at once
)

// dispatcher runs one adapter Receive for a subscription and hands its
// messages to the streams and Pull calls attached to it.
type dispatcher struct {
	s        *Server
	name     string // projects/P/subscriptions/S
	ordering bool
	// pipelined: a key's next message goes to a client before the
	// previous one is acked (pipelinedOrdering); fixed when Receive starts.
	pipelined bool
	// cfg is the subscription's configuration, refreshed every second
	// (refresh) so updates made through any sidecar reach this one.
	cfg atomic.Pointer[adapter.SubscriptionConfig]
	// push is where cfg says to push the messages; nil for a pull
	// subscription (pushsubs.go).
	push atomic.Pointer[pushTarget]
	// didcomm is the subscription's DIDComm tracker, used while its labels
	// ask for tracking.
	didcomm didcommTracking
	// tracking is whether cfg's labels ask for DIDComm tracking;
	// trackingSwitched is closed when that changes. Both guarded by mu.
	tracking         bool
	trackingSwitched chan struct{}

	// ready passes each message from its Receive handler to whichever
	// stream or Pull call takes it first. It is unbuffered: a message waits
	// in its handler (its JetStream deadline extended) until a client has
	// room for it.
	ready    chan *lease
	cancel   context.CancelFunc
	draining chan struct{} // closed when no new message may be handed out
	drained  chan struct{} // closed when draining and no lease is out
	done     chan struct{} // closed when Receive has ended
	err      error         // why Receive ended; set before done closes

	// m is the subscription's counters and histograms.
	m *metrics.Subscription

	mu       sync.Mutex
	leases   map[uint64]*lease
	keys     map[string]int // ordering key -> messages held
	attached int            // streams and Pull calls
	streams  map[*pullStream]struct{}
	// Messages held (with a client or waiting for one) by delivery
	// attempt: below jstatus.PausedAttempt counted by attempt, from it on
	// listed (the status page shows the keys they hold back).
	byAttempt  [jstatus.PausedAttempt]int
	paused     map[*lease]struct{}
	pausedKeys map[string]int // the keys of paused, and how many each
	pipes      map[string]*keyPipe
	idle       *time.Timer
	stopped    bool
	drainSet   bool
	drainEnd   bool // drained is closed
}

// lease is one message held for a client, from the moment a stream or
// Pull call takes it until it is acked, nacked or its deadline passes.
type lease struct {
	d        *dispatcher
	msg      *adapter.Message
	size     int
	heldAt   time.Time   // when its handler got it
	leasedAt time.Time   // when it was handed to a client
	expireBy time.Time   // extensions stop here: the adapter's extension ends soon after
	id       uint64      // 0 until handed to a client
	flow     *flow       // the stream's flow control; nil for Pull
	st       *pullStream // the stream it went out on; nil for Pull
	// held: the client has shown it has the message (a deadline change,
	// such as the receipt every Google client sends). A lease of an ended
	// stream without it is handed back (releaseUnheld). Guarded by d.mu.
	held    bool
	piped   bool        // guarded by d.mu: counted in its key's keyPipe
	didcomm *tracked    // what DIDComm tracking made of it; nil when untracked
	timer   *time.Timer // guarded by d.mu
	gone    bool        // guarded by d.mu: the handler has handed the message back
	// returned: its handler has returned (guarded by d.mu). Until then an
	// ended lease stays counted in its key's pipe (unpipeLocked).
	returned bool
	// Exactly-once delivery (ackConfirmed): acking counts the acks of the
	// lease under way, and expired says its deadline passed meanwhile; the
	// lease ends then only if none of them is confirmed. Both guarded by
	// d.mu.
	acking  int
	expired bool
	result  chan outcome
}

// keyPipe is where the messages of a pipelined key go while some of them
// are leased on a stream: to that stream, as the service sends a key's
// messages to one stream. A client runs a key's handlers one at a time,
// in order, only for the messages it gets on one stream.
type keyPipe struct {
	st   *pullStream
	out  int           // the key's leases out on st
	idle chan struct{} // closed when out drops to 0 and the pipe is gone
}

// ackResult is what became of one ack id of an ack or a deadline change;
// exactly-once delivery reports it to the client (pull.go).
type ackResult int

const (
	ackOK        ackResult = iota
	ackInvalid             // no lease has it here: it ended (acked, nacked, expired) or was never here
	ackTransient           // JetStream did not confirm the ack in time: the client may try again
)

// ackConfirmTimeout bounds the wait for JetStream's confirmation of one
// exactly-once ack; past it the client is told to try again.
const ackConfirmTimeout = 5 * time.Second

var leaseIDs atomic.Uint64

// attach returns the running dispatcher of a subscription, starting one if
// needed, and counts the caller as attached until detach.
func (s *Server) attach(ctx context.Context, project, id string) (*dispatcher, error) {
	name := subscriptionName(project, id)
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, errShuttingDown
		}
		d := s.dispatchers[name]
		s.mu.Unlock()
		if d == nil {
			break
		}
		if d.join() {
			return d, nil
		}
		select { // stopping: wait until it is gone, then start anew
		case <-d.done:
		case <-ctx.Done():
			return nil, toStatus(ctx.Err())
		}
	}
	c, err := s.client(project)
	if err != nil {
		return nil, err
	}
	sub := c.Subscription(id)
	cfg, err := sub.Config(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	if cfg.Detached {
		return nil, toStatus(fmt.Errorf("%w: %s", adapter.ErrDetached, name))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errShuttingDown
	}
	if d := s.dispatchers[name]; d != nil && d.join() {
		return d, nil // started meanwhile
	}
	rctx, cancel := context.WithCancel(context.Background())
	d := &dispatcher{
		s: s, name: name, ordering: cfg.EnableMessageOrdering, pipelined: s.pipelinedOrdering(&cfg), pipes: make(map[string]*keyPipe),
		ready: make(chan *lease), cancel: cancel,
		draining: make(chan struct{}), drained: make(chan struct{}), done: make(chan struct{}),
		leases: make(map[uint64]*lease), keys: make(map[string]int), attached: 1,
		streams: make(map[*pullStream]struct{}), paused: make(map[*lease]struct{}), pausedKeys: make(map[string]int),
		m: s.b.Metrics.Subscription(name),
	}
	d.setConfig(&cfg)
	d.didcomm.sub = sub
	s.dispatchers[name] = d
	sub.ReceiveSettings.MaxOutstandingMessages = s.cfg.MaxOutstandingMessages
	sub.ReceiveSettings.MaxExtension = maxHeldExtension
	sub.ReceiveSettings.Hooks = &s.partitions
	if d.pipelined {
		sub.ReceiveSettings.Ordering = adapter.PipelinedOrdering
		sub.ReceiveSettings.KeyWindow = s.cfg.MaxOutstandingMessages
	}
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		d.finish(sub.Receive(rctx, d.handle))
	}()
	go func() {
		defer s.wg.Done()
		d.refresh(sub)
	}()
	s.log.Debug("receiving", "subscription", name)
	return d, nil
}

// join counts one more attached caller, unless the dispatcher is stopping.
func (d *dispatcher) join() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return false
	}
	d.attached++
	if d.idle != nil {
		d.idle.Stop()
	}
	return true
}

func (d *dispatcher) detach() {
	d.mu.Lock()
	d.attached--
	d.checkIdle()
	d.mu.Unlock()
}

// checkIdle arms the idle stop when nothing is attached and no lease is
// out, and tells Drain when the last lease is settled. d.mu is held.
func (d *dispatcher) checkIdle() {
	if d.drainSet && !d.drainEnd && len(d.leases) == 0 {
		d.drainEnd = true
		close(d.drained)
	}
	if d.attached > 0 || len(d.leases) > 0 || d.stopped {
		return
	}
	if d.idle == nil {
		d.idle = time.AfterFunc(d.s.cfg.IdleStop, d.stopIfIdle)
	} else {
		d.idle.Reset(d.s.cfg.IdleStop)
	}
}

func (d *dispatcher) stopIfIdle() {
	d.mu.Lock()
	idle := d.attached == 0 && len(d.leases) == 0 && !d.stopped
	if idle {
		d.stopped = true
	}
	d.mu.Unlock()
	if idle {
		d.s.log.Debug("stopped receiving: idle", "subscription", d.name)
		d.cancel()
	}
}

// drain stops handing out messages; leases already out can still be
// settled.
func (d *dispatcher) drain() {
	d.mu.Lock()
	if !d.drainSet {
		d.drainSet = true
		close(d.draining)
		d.checkIdle()
	}
	d.mu.Unlock()
}

// stop ends Receive: messages not with a client, and leases still out, are
// handed back.
func (d *dispatcher) stop() {
	d.mu.Lock()
	d.stopped = true
	d.mu.Unlock()
	d.drain()
	d.cancel()
}

// finish records why Receive ended and forgets the dispatcher.
func (d *dispatcher) finish(err error) {
	d.mu.Lock()
	d.stopped = true
	d.err = err
	d.mu.Unlock()
	d.s.mu.Lock()
	if d.s.dispatchers[d.name] == d {
		delete(d.s.dispatchers, d.name)
	}
	d.s.mu.Unlock()
	if err != nil {
		d.s.log.Warn("receive ended", "subscription", d.name, "err", err)
	}
	close(d.done)
}

// endErr is what attached callers return once Receive has ended.
func (d *dispatcher) endErr() error {
	if d.err != nil {
		return toStatus(d.err)
	}
	return errShuttingDown
}

// handle is the Receive handler: it offers the message to the clients and
// waits for the lease to end. The adapter starts the next message of the
// key only after this returns with an ack. On an exactly-once
// subscription the client's ack has been confirmed by then
// (ackConfirmed: the adapter's AckWithResult), and the m.Ack here does
// nothing.
func (d *dispatcher) handle(ctx context.Context, m *adapter.Message) {
	now := time.Now()
	l := &lease{d: d, msg: m, heldAt: now, expireBy: now.Add(maxHeldExtension - time.Minute), result: make(chan outcome, 1)}
	if d.s.stale.take(d.name, m.StreamSequence) && (m.OrderingKey == "" || !d.ordering) {
		// Acked through an earlier process's ack id before it came back.
		// Not a message of an ordered key: if an earlier message of its key
		// was delivered again after the restart, this one must be too, as
		// Pub/Sub redelivers every later message of a key after a
		// redelivery, acked or not.
		d.s.b.Metrics.StaleAcks.Inc()
		m.Ack()
		return
	}
	d.hold(l)
	defer d.unhold(l)
	defer d.handlerReturned(l)
	// Closed when the adapter hands the message back on its own: an
	// earlier message of its key was nacked (pipelined ordering), and it
	// comes again after that one.
	revoked := m.Revoked()
	for offered := false; !offered; {
		// DIDComm tracking observes the message before a client gets it,
		// also when it is switched on while the message waits here.
		tracking, switched := d.didcommState()
		if tracking && l.didcomm == nil {
			tr, deliver := d.observeDIDComm(ctx, m)
			if !deliver {
				return
			}
			l.didcomm = tr
		}
		l.size = messageSize(m, l.didcomm)
		ready, moved, stopped := d.readyFor(l)
		select {
		case ready <- l:
			offered = true
		case <-moved:
		case <-stopped:
		case <-switched:
		case <-ctx.Done():
			m.Release()
			return
		case <-m.Superseded():
			// Sought before any client took it: the adapter acks it, and the
			// new epoch delivers it again if the seek says so.
			m.Release()
			return
		case <-revoked:
			return
		}
	}
	tr := l.didcomm
	select {
	case <-revoked:
		// Handed back by the adapter with an earlier message of its key
		// (pipelined ordering); the client's outcome no longer counts.
	case o := <-l.result:
		switch o {
		case outAck:
			tr.release(d)
			m.Ack()
		case outReturned:
			m.Release()
		default: // a nack or an expired deadline: the retry policy applies
			m.Nack()
		}
	case <-ctx.Done():
		// Receive is ending (shutdown, or the subscription is gone): the
		// client can no longer settle the lease, so the message goes back,
		// unless the client settled it in the meantime.
		if !d.drop(l) {
			if o := <-l.result; o == outAck {
				tr.release(d)
				m.Ack()
				return
			}
		}
		m.Release()
	}
}

// setConfig stores the subscription's configuration and tells messages
// waiting for a client when DIDComm tracking is switched on or off.
func (d *dispatcher) setConfig(cfg *adapter.SubscriptionConfig) {
	d.cfg.Store(cfg)
	d.push.Store(newPushTarget(cfg))
	tracking := broker.DIDCommTracked(cfg.Labels)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.trackingSwitched == nil {
		d.trackingSwitched = make(chan struct{})
	} else if tracking != d.tracking {
		close(d.trackingSwitched)
		d.trackingSwitched = make(chan struct{})
	}
	d.tracking = tracking
}

// didcommState says whether DIDComm tracking is on, and returns a channel
// closed when that changes.
func (d *dispatcher) didcommState() (bool, <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.tracking, d.trackingSwitched
}

// refresh keeps d.cfg up to date until Receive ends.
func (d *dispatcher) refresh(sub *adapter.Subscription) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-d.done:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		cfg, err := sub.Config(ctx)
		cancel()
		if err == nil {
			d.setConfig(&cfg)
		}
	}
}

// reload reads the subscription's configuration now, after an update
// through this sidecar.
func (d *dispatcher) reload(ctx context.Context, sub *adapter.Subscription) {
	if cfg, err := sub.Config(ctx); err == nil {
		d.setConfig(&cfg)
	}
}

// dispatcherOf returns the running dispatcher of a subscription, or nil.
func (s *Server) dispatcherOf(name string) *dispatcher {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dispatchers[name]
}

// ackDeadline is the subscription's ack deadline: the lease of a Pull, and
// of a stream that sets none.
func (d *dispatcher) ackDeadline() time.Duration { return d.cfg.Load().AckDeadline }

// readyFor is where l waits for a taker: d.ready, or, for a pipelined key
// with leases out on a stream, that stream's own channel. The choice may
// change when moved or stopped closes (the key's last lease ended, or the
// stream stopped taking).
func (d *dispatcher) readyFor(l *lease) (ready chan<- *lease, moved, stopped <-chan struct{}) {
	if !d.pipelined || l.msg.OrderingKey == "" {
		return d.ready, nil, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.pipes[l.msg.OrderingKey]
	switch {
	case p == nil:
		return d.ready, nil, nil
	case closed(p.st.stopped):
		// Its stream is gone with leases out: the key's next message waits
		// until the client settles them (Acknowledge) or they expire.
		return nil, p.idle, nil
	}
	return p.st.own, p.idle, p.st.stopped
}

// pipeLocked counts l, leased on the stream st, in its key's pipe when its
// key is pipelined, and reports whether it was: the adapter may then start
// the key's next message. Messages leased through Pull are not pipelined
// (their key's next message waits for their ack). d.mu is held.
func (d *dispatcher) pipeLocked(l *lease, st *pullStream) bool {
	key := l.msg.OrderingKey
	if !d.pipelined || key == "" || st == nil {
		return false
	}
	p := d.pipes[key]
	if p == nil {
		p = &keyPipe{st: st, idle: make(chan struct{})}
		d.pipes[key] = p
	}
	p.st = st
	p.out++
	l.piped = true
	return true
}

// unpipeLocked uncounts the ended lease l from its key's pipe. d.mu is
// held.
//
// A lease that ends while its handler runs is uncounted when the handler
// returns (handlerReturned), once it has handed the outcome to the
// adapter: a nack then has revoked the key's later messages before the
// pipe lets them go to another stream. Uncounted at once, a later message
// waiting for the pipe of an ended stream could go out before the
// adapter learnt of the nack of an earlier one.
func (d *dispatcher) unpipeLocked(l *lease) {
	if !l.piped {
		return
	}
	l.piped = false
	key := l.msg.OrderingKey
	if p := d.pipes[key]; p != nil {
		if p.out--; p.out <= 0 {
			delete(d.pipes, key)
			close(p.idle)
		}
	}
}

// handlerReturned uncounts l from its key's pipe if its lease has ended
// (the handler has carried out its outcome), and otherwise lets the
// lease's end do it.
func (d *dispatcher) handlerReturned(l *lease) {
	d.mu.Lock()
	defer d.mu.Unlock()
	l.returned = true
	if l.id == 0 || d.leases[l.id] != l {
		d.unpipeLocked(l)
	}
}

// refuse hands back a message taken from ready that will not be leased
// (the taker is ending, or handing out has stopped): its handler hands it
// back for redelivery at once.
func (d *dispatcher) refuse(l *lease) { l.result <- outReturned }

// hold counts l's message as held until unhold: its key, and its delivery
// attempt.
func (d *dispatcher) hold(l *lease) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if k := l.msg.OrderingKey; k != "" {
		d.keys[k]++
	}
	if a := l.msg.DeliveryAttempt; a >= jstatus.PausedAttempt {
		d.paused[l] = struct{}{}
		if k := l.msg.OrderingKey; k != "" {
			d.pausedKeys[k]++
		}
	} else {
		d.byAttempt[max(a, 0)]++
	}
}

func (d *dispatcher) unhold(l *lease) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if k := l.msg.OrderingKey; k != "" {
		if d.keys[k]--; d.keys[k] <= 0 {
			delete(d.keys, k)
		}
	}
	if a := l.msg.DeliveryAttempt; a >= jstatus.PausedAttempt {
		delete(d.paused, l)
		if k := l.msg.OrderingKey; k != "" {
			if d.pausedKeys[k]--; d.pausedKeys[k] <= 0 {
				delete(d.pausedKeys, k)
			}
		}
	} else {
		d.byAttempt[max(a, 0)]--
	}
}

// lease hands l to a client for deadline: it gets an ack id and a timer.
// It returns nil, and the message goes back, when handing out has stopped
// (Drain) or the handler has given the message up (Receive ending): a
// client must never hold a message its handler no longer waits for.
func (d *dispatcher) lease(l *lease, st *pullStream, f *flow, deadline time.Duration) *pb.ReceivedMessage {
	id := leaseIDs.Add(1)
	d.mu.Lock()
	if l.gone || d.drainSet || closed(l.msg.Revoked()) {
		gone := l.gone
		d.mu.Unlock()
		if !gone {
			d.refuse(l)
		}
		return nil
	}
	if f != nil {
		f.take(l.size)
	}
	l.id, l.flow, l.st, l.leasedAt = id, f, st, time.Now()
	d.leases[id] = l
	l.timer = time.AfterFunc(deadline, func() { d.expire(id) })
	handOver := d.pipeLocked(l, st)
	d.mu.Unlock()
	if handOver {
		// On the stream: the key's next message may follow it there.
		l.msg.HandOver()
	}

	d.m.Delivered.Inc()
	if l.msg.DeliveryAttempt > 1 {
		d.m.Redelivered.Inc()
		d.s.recent.add(d.name, recentRedelivered)
	} else if !l.msg.PublishTime.IsZero() {
		d.m.DeliveryLat.Observe(max(l.leasedAt.Sub(l.msg.PublishTime), 0).Seconds())
	}
	rm := &pb.ReceivedMessage{AckId: d.s.ackID(d.name, id, l.msg.StreamSequence), Message: messageProto(l.msg)}
	if l.didcomm != nil {
		attrs := maps.Clone(rm.Message.Attributes) // the adapter message's own: not to be written
		if attrs == nil {
			attrs = make(map[string]string, len(l.didcomm.attrs))
		}
		maps.Copy(attrs, l.didcomm.attrs)
		rm.Message.Attributes = attrs
	}
	if d.cfg.Load().DeadLetterPolicy != nil {
		// As the service: delivery_attempt is set only with a dead-letter
		// policy, and is 0 (absent) otherwise.
		rm.DeliveryAttempt = int32(l.msg.DeliveryAttempt)
	}
	return rm
}

// Settling a lease. A lease ends once, with one outcome, which its handler
// carries out (handle). How:
//   - settle ends it at once: an ack without exactly-once (the fast path:
//     the adapter's Ack, no waiting), a nack, a message that never reached
//     its client, and a deadline that passed (expire);
//   - ackConfirmed, on an exactly-once subscription, acks it through the
//     adapter's AckWithResult first and ends it once JetStream has
//     confirmed the ack. Meanwhile the lease stays, so a retried ack finds
//     it, and its deadline does not end it: an ack that came in time is not
//     overtaken by the deadline unless it fails.
// The id of a lease that has ended is unknown from then on: with
// exactly-once an ack or deadline change of it is reported invalid, as the
// service does; without, it is ignored.

// settle ends the lease id with o; it reports false for a lease that has
// ended already (or never existed here).
func (d *dispatcher) settle(id uint64, o outcome) bool {
	d.mu.Lock()
	l := d.takeLocked(id)
	d.mu.Unlock()
	if l == nil {
		return false
	}
	d.ended(l, o)
	return true
}

// expire is the lease's timer: it ends lease id with outExpired, unless an
// ack of it is being confirmed (ackConfirmed ends it then if need be).
func (d *dispatcher) expire(id uint64) {
	d.mu.Lock()
	l := d.leases[id]
	if l != nil && l.acking > 0 {
		l.expired = true
		l = nil
	} else {
		l = d.takeLocked(id)
	}
	d.mu.Unlock()
	if l != nil {
		d.ended(l, outExpired)
	}
}

// ackConfirmed acks lease id on an exactly-once subscription: ackOK only
// once JetStream has confirmed the ack, which it then never redelivers;
// ackInvalid when no lease has the id, or the ack cannot take effect (the
// adapter's ErrAckInvalid: the message comes back); ackTransient when no
// confirmation came in time (the lease stays for a retry, unless its
// deadline passed meanwhile). It waits for the confirmation, up to
// ackConfirmTimeout or the end of ctx.
func (d *dispatcher) ackConfirmed(ctx context.Context, id uint64) ackResult {
	d.mu.Lock()
	l := d.leases[id]
	if l == nil {
		d.mu.Unlock()
		return ackInvalid
	}
	l.acking++
	d.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, ackConfirmTimeout)
	err := l.msg.AckWithResult(cctx)
	cancel()
	res, o := ackOK, outAck
	switch {
	case err == nil:
	case errors.Is(err, adapter.ErrAckInvalid):
		res, o = ackInvalid, outNack // unacked at the server: it comes back
	default:
		res, o = ackTransient, outExpired
		d.s.log.Debug("exactly-once ack not confirmed; the client may retry", "subscription", d.name, "err", err)
	}
	d.mu.Lock()
	l.acking--
	var ended *lease
	if d.leases[id] == l && (res != ackTransient || (l.expired && l.acking == 0)) {
		ended = d.takeLocked(id)
	}
	d.mu.Unlock()
	if ended != nil {
		d.ended(ended, o)
	}
	// An ack JetStream confirmed succeeded even if the lease ended
	// meanwhile (a nack or the end of Receive after the ack went): the
	// message is not delivered again.
	return res
}

// takeLocked removes lease id from the books and returns it, or nil when
// it has ended already. d.mu is held.
func (d *dispatcher) takeLocked(id uint64) *lease {
	l := d.leases[id]
	if l == nil {
		return nil
	}
	delete(d.leases, id)
	l.timer.Stop()
	if l.returned {
		d.unpipeLocked(l)
	}
	d.checkIdle()
	return l
}

// ended completes the end of lease l, taken from the books, with outcome
// o: flow control, metrics, and the outcome to its handler.
func (d *dispatcher) ended(l *lease, o outcome) {
	if l.flow != nil {
		l.flow.release(l.size)
	}
	switch o {
	case outAck:
		d.m.Acked.Inc()
		d.m.AckLat.Observe(time.Since(l.leasedAt).Seconds())
	case outNack, outReturned:
		d.m.Nacked.Inc()
	case outExpired:
		d.m.Expired.Inc()
	}
	l.result <- o // buffered, and a lease is settled once
}

// extend moves the deadline of lease id to now+deadline, but not past the
// lease's expireBy; it reports false for a lease that has ended.
func (d *dispatcher) extend(id uint64, deadline time.Duration) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	l := d.leases[id]
	if l == nil {
		return false
	}
	l.timer.Reset(min(deadline, time.Until(l.expireBy)))
	l.held = true
	l.expired = false // a deadline moved while an ack is being confirmed has not passed
	return true
}

// drop forgets a lease whose message its handler hands back itself. It
// returns false when the lease was settled already: its outcome is in
// l.result.
func (d *dispatcher) drop(l *lease) bool {
	d.mu.Lock()
	if l.id == 0 {
		l.gone = true // a taker that has it must not lease it now
		d.mu.Unlock()
		return true
	}
	if d.leases[l.id] != l {
		d.mu.Unlock()
		return false
	}
	delete(d.leases, l.id)
	l.timer.Stop()
	// Its key's pipe lets go of it when the handler returns, after the
	// hand-back (handlerReturned).
	d.checkIdle()
	d.mu.Unlock()
	if l.flow != nil {
		l.flow.release(l.size)
	}
	d.m.Nacked.Inc()
	return true
}

// unheldGrace is how long the leases of an ended stream wait for a sign
// that its client has them. Google's clients confirm each message they
// read with a deadline change (a receipt), sent within 100 ms: Go's
// receipt ticker, Node's batched modacks. A message the client read before
// its stream ended is confirmed by then, with room for the call's latency.
const unheldGrace = 500 * time.Millisecond

// streamEnded hands back, once unheldGrace has passed, the leases that
// went out on st and that its client never showed it has. A client that
// stops reading leaves them unread in its stream (the Go client, stopping,
// sends its nacks before it closes its streams, and the messages nacked
// come back on them at once): they go to the next subscriber now, not at
// their deadlines. Leases the client has keep their deadlines, as in
// Pub/Sub: it may still ack, nack or extend them.
//
// Whatever ended the stream: a message the client read and confirmed
// keeps its lease, and its confirmation reaches the sidecar within 100 ms
// of the read (unheldGrace leaves room for that) unless the connection
// broke in that moment under a client that goes on. Such a message, read
// in the last 100 ms before the break, goes back too, as Google's service
// redelivers every unacked message of a closed stream (docs/SIDECAR.md,
// Stopping and starting subscribers). gRPC does not tell a stream its
// client cancelled from one whose connection broke, nor a clean close
// from a break.
//
// Handing back is safe for order: a key's later message waits for the
// earlier ones still out, and a lease handed back brings its key's later
// ones back after it (adapter, gates.release).
func (d *dispatcher) streamEnded(st *pullStream) {
	time.AfterFunc(unheldGrace, func() { d.releaseUnheld(st) })
}

func (d *dispatcher) releaseUnheld(st *pullStream) {
	d.mu.Lock()
	var unheld []*lease
	for id, l := range d.leases {
		if l.st == st && !l.held && l.acking == 0 {
			unheld = append(unheld, d.takeLocked(id))
		}
	}
	d.mu.Unlock()
	if len(unheld) == 0 {
		return
	}
	slices.SortFunc(unheld, func(a, b *lease) int { return cmp.Compare(a.msg.StreamSequence, b.msg.StreamSequence) })
	for _, l := range unheld {
		d.ended(l, outReturned)
	}
	d.m.Unread.Add(float64(len(unheld)))
	d.s.log.Debug("handed back the messages of an ended stream that its client never confirmed", "subscription", d.name, "messages", len(unheld), "peer", st.peer)
}

// messageProto is the Pub/Sub form of a delivered message. Headers written
// by other NATS publishers and protocol bindings (CloudEvents' ce-*,
// content-type) are added as attributes, plain as the Pub/Sub binding wants
// them, and an event without a sequence gets one (cloudevents.ToPubSub). A message another NATS
// publisher stored without a Nats-Msg-Id has its stream sequence as its
// id: Pub/Sub's ids are never empty, and are unique in their topic.
func messageProto(m *adapter.Message) *pb.PubsubMessage {
	id := m.ID
	if id == "" {
		id = strconv.FormatUint(m.StreamSequence, 10)
	}
	data, attrs := cloudevents.ToPubSub(m)
	out := &pb.PubsubMessage{Data: data, Attributes: attrs, MessageId: id, OrderingKey: m.OrderingKey}
	if !m.PublishTime.IsZero() {
		out.PublishTime = timestamppb.New(m.PublishTime)
	}
	return out
}

func messageSize(m *adapter.Message, tr *tracked) int {
	n := len(m.Data) + len(m.OrderingKey) + len(m.ID)
	for k, v := range m.Attributes {
		n += len(k) + len(v)
	}
	if tr != nil {
		for k, v := range tr.attrs {
			n += len(k) + len(v)
		}
	}
	return n
}

// flow is a stream's flow control: the client's limits on messages and
// bytes outstanding (handed over and not settled). Zero or less means no
// limit, as the API says (the Go client sends -1 for "no limit").
type flow struct {
	maxMsgs, maxBytes int64

	mu          sync.Mutex
	msgs, bytes int64
	wake        chan struct{}
}

func newFlow(maxMsgs, maxBytes int64) *flow {
	return &flow{maxMsgs: maxMsgs, maxBytes: maxBytes, wake: make(chan struct{}, 1)}
}

func (f *flow) room() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return (f.maxMsgs <= 0 || f.msgs < f.maxMsgs) && (f.maxBytes <= 0 || f.bytes < f.maxBytes)
}

// wait returns true when there is room for one more message, false when
// stop or ended closes first.
func (f *flow) wait(stop, ended <-chan struct{}) bool {
	for !f.room() {
		select {
		case <-f.wake:
		case <-stop:
			return false
		case <-ended:
			return false
		}
	}
	return true
}

func (f *flow) take(size int) {
	f.mu.Lock()
	f.msgs++
	f.bytes += int64(size)
	f.mu.Unlock()
}

func (f *flow) release(size int) {
	f.mu.Lock()
	f.msgs--
	f.bytes -= int64(size)
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}
