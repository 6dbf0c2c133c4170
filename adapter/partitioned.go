package adapter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/keyrouter"
)

// Partitioned delivery (DeliveryPartitioned): the design is in doc.go; the
// gates and the fence, which decide when a message may start, are in
// gates.go.

// partitionGroup is the priority group every receiver pulls in.
const partitionGroup = "jetorder"

// minPinTTL is the shortest PinnedTTL of a partition consumer: an idle
// owner renews its pin with a pull request every third of it, and nats.go
// lets a pull request wait no less than a second.
const minPinTTL = 3 * time.Second

// pinHeader is the header the server adds to each message of a pinned
// consumer; the adapter removes it before a handler sees the message.
const pinHeader = "Nats-Pin-Id"

func (r *subRecord) partitionIndexes() []int {
	out := make([]int, r.Partitions)
	for i := range out {
		out[i] = i
	}
	return out
}

// partitionConsumerConfig is partition i's pull consumer.
func (r *subRecord) partitionConsumerConfig(pinTTL time.Duration, i int) jetstream.ConsumerConfig {
	_, filter, start := r.partitionStream(i)
	return jetstream.ConsumerConfig{
		Durable:        keyrouter.PartitionConsumer(r.Project, r.nameID(), i),
		Description:    fmt.Sprintf("%s partition %d of %d", r.consumerDescription(), i, r.Partitions),
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    start,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        r.ackDeadline(),
		MaxDeliver:     -1,
		FilterSubject:  filter,
		MaxAckPending:  r.PartitionBuffer,
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PriorityGroups: []string{partitionGroup},
		PinnedTTL:      pinTTL,
	}
}

// partitionedMode delivers a partitioned subscription's keyed messages to
// one Receive call: a pull consumer per partition, each partition with its
// own lock and book, and one loop that confirms acks for all of them.
type partitionedMode struct {
	r     *receiver
	parts []*partition // set by start, read-only after

	// The pulls follow the assignment (balance.go).
	pullMu      sync.Mutex // guards pullStopped and every partition's cc
	pullStopped bool
	// members are the subscription's receivers this one knows, by
	// presence id, with their records' revisions: start, then
	// watchMembers alone uses it.
	members map[string]uint64
	// unrecorded: join could not write this receiver's member record
	// (watchMembers alone uses it after start).
	unrecorded bool
	// recorded are the partitions' recorded owners (presence ids), as
	// watchOwners reads them and as this receiver writes them, for the
	// assignment to keep them; recordedRev their records' revisions.
	recordedMu  sync.Mutex
	recorded    []string
	recordedRev []uint64
	// rebalance wakes watchMembers to follow the assignment again: a
	// recorded owner changed.
	rebalance chan struct{}

	confirmMu   sync.Mutex
	confirmQ    []*delivery // acked, waiting for the server to have the ack
	confirmWake chan struct{}

	loops   sync.WaitGroup // confirmAcks, watchOwners, fence and pin checks
	stopped chan struct{}  // closed by stop: loops end

	// the partitions' owner records, for fast take-over (takeover.go)
	owners jetstream.KeyValue
	// the recorded owners found gone, by partition (ownerFoundGone)
	goneMu     sync.Mutex
	goneOwners map[int]ownerRecord
}

var _ keyedDelivery = (*partitionedMode)(nil)

func newPartitionedMode(r *receiver) *partitionedMode {
	return &partitionedMode{r: r, confirmWake: make(chan struct{}, 1), rebalance: make(chan struct{}, 1), stopped: make(chan struct{})}
}

// partition is one partition of a partitioned subscription, as one Receive
// call sees it.
type partition struct {
	m     *partitionedMode
	r     *receiver
	index int
	limit int
	name  string // of its consumer
	// cons is the partition's consumer, once looked up (consumer).
	consMu sync.Mutex
	cons   jetstream.Consumer
	// cc pulls the partition's messages while it is assigned to this
	// receiver; nil while not. draining is the one a yield drains. Both
	// under m.pullMu.
	cc, draining jetstream.ConsumeContext
	// stream is the stream the partition reads: unpin goes through it.
	stream jetstream.Stream

	mu sync.Mutex // guards everything below, and the partition fields of its deliveries
	g  *gates
	// recordedPin is the pin this receiver last wrote in the partition's
	// owner record.
	recordedPin string
	// checkingPin is set while checkPin asks the server who owns it.
	checkingPin bool
	// yielded is the pin of the term letGo ended to give the partition
	// up, until the server is found without it (unpinned).
	yielded string
	// what report last added to the shared stats
	owned    bool
	full     bool
	reported int
}

var _ holder = (*partition)(nil)

// start opens the subscription's partition consumers and starts pulling
// from each.
func (m *partitionedMode) start(ctx context.Context) error {
	r := m.r
	streams := map[string]jetstream.Stream{}
	for i := range r.rec.Partitions {
		name, _, _ := r.rec.partitionStream(i)
		if streams[name] != nil {
			continue
		}
		err := r.c.retryAPI(ctx, func(ctx context.Context) (err error) {
			streams[name], err = r.c.js.Stream(ctx, name)
			return err
		})
		if err != nil {
			return err
		}
	}
	if err := m.openOwners(ctx); err != nil {
		return err
	}
	for i := range r.rec.Partitions {
		name, _, _ := r.rec.partitionStream(i)
		stream := streams[name]
		p := &partition{m: m, r: r, index: i, limit: r.rec.PartitionBuffer, name: keyrouter.PartitionConsumer(r.rec.Project, r.rec.nameID(), i),
			stream: stream, g: newGates(r.keyWindow())}
		// A consumer without a leader for now (a node of the cluster
		// down) is looked up again when needed; one that is gone ends
		// Receive.
		if _, err := p.consumer(ctx); err != nil && !transient(err) {
			return fmt.Errorf("partition %d: %w", i, err)
		}
		m.parts = append(m.parts, p)
	}
	m.recorded, m.recordedRev = make([]string, len(m.parts)), make([]uint64, len(m.parts))
	// Tried again while it fails for a reason that goes away by itself (a
	// reconnect whose buffer filled, the bucket's leader being elected):
	// a receiver started during a fault waits for it.
	var w *lastingWatch
	err := r.c.retryAPI(ctx, func(ctx context.Context) (err error) {
		w, err = m.join(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("record member: %w", err)
	}
	m.follow(m.assignment())
	m.loops.Add(3)
	go m.confirmAcks()
	go m.watchOwners()
	go m.watchMembers(w)
	return nil
}

// consumer is the partition's consumer, looked up the first time it is
// needed: a partition whose consumer has no leader for a while does not
// hold up the others.
func (p *partition) consumer(ctx context.Context) (jetstream.Consumer, error) {
	p.consMu.Lock()
	defer p.consMu.Unlock()
	if p.cons == nil {
		cons, err := p.stream.Consumer(ctx, p.name)
		if err != nil {
			return nil, err
		}
		p.cons = cons
	}
	return p.cons, nil
}

// info asks the server for the partition's consumer info.
func (p *partition) info(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	p.consMu.Lock()
	cons := p.cons
	p.consMu.Unlock()
	if cons == nil {
		cons, err := p.consumer(ctx) // which asks for it
		if err != nil {
			return nil, err
		}
		return cons.CachedInfo(), nil
	}
	return cons.Info(ctx)
}

// pull starts pulling the partition's messages.
func (p *partition) pull() (jetstream.ConsumeContext, error) {
	ctx, cancel := context.WithTimeout(context.Background(), p.r.c.takeOverTimeout())
	defer cancel()
	cons, err := p.consumer(ctx)
	if err != nil {
		return nil, err
	}
	// A pull request must reach the server well within the pin's TTL, or
	// an idle owner loses its partition.
	expiry := max(cons.CachedInfo().Config.PinnedTTL/3, time.Second)
	return cons.Consume(p.onMsg,
		jetstream.PullPriorityGroup(partitionGroup),
		jetstream.PullExpiry(expiry),
		jetstream.PullMaxMessages(min(p.r.rec.PartitionBuffer, 1000)),
		jetstream.ConsumeErrHandler(p.onErr))
}

// check unblocks keys waiting for a message the stream no longer has.
func (m *partitionedMode) check(ctx context.Context) {
	for _, p := range m.parts {
		p.checkAwaiting(ctx)
	}
}

func (m *partitionedMode) eachHeld(f func(*delivery)) {
	for _, p := range m.parts {
		p.mu.Lock()
		p.g.each(f)
		p.mu.Unlock()
	}
}

// stop marks every partition stopping, drains the consumers (what the
// client buffered reaches onMsg, which hands it back) and ends the loops.
func (m *partitionedMode) stop(deadline time.Time) {
	for _, p := range m.parts {
		p.mu.Lock()
		p.g.stop()
		p.mu.Unlock()
	}
	m.pullMu.Lock()
	m.pullStopped = true
	var ccs []jetstream.ConsumeContext
	for _, p := range m.parts {
		if p.cc != nil {
			ccs = append(ccs, p.cc)
			p.cc = nil
		}
		if p.draining != nil { // drained already: wait for it too
			ccs = append(ccs, p.draining)
		}
	}
	m.pullMu.Unlock()
	for _, cc := range ccs {
		cc.Drain()
	}
	for _, cc := range ccs {
		select {
		case <-cc.Closed():
		case <-time.After(time.Until(deadline)):
		}
	}
	close(m.stopped)
	m.loops.Wait()
}

// end confirms the acks handlers sent since stop, hands back what is still
// held, and gives up the partitions this process owns, so another receiver
// takes them over without waiting for the pin's TTL.
func (m *partitionedMode) end(deadline time.Time) {
	m.leave(deadline)
	m.confirmRemaining(nil)
	var left []*delivery
	m.eachHeld(func(d *delivery) { left = append(left, d) })
	for _, d := range left {
		d.finish(ackNak)
	}
	for _, p := range m.parts {
		p.mu.Lock()
		pin := p.g.resign()
		p.reportLocked()
		p.mu.Unlock()
		if pin == "" {
			continue
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		if info, err := p.info(ctx); err == nil && pinnedIn(info) == pin {
			_ = p.stream.UnpinConsumer(ctx, p.name, partitionGroup)
		}
		cancel()
	}
}

func (p *partition) onMsg(msg jetstream.Msg) {
	r := p.r
	meta, err := msg.Metadata()
	if err != nil {
		// Not a JetStream delivery: nothing to ack. (Should one be lost this
		// way, the partition fences at the gap it leaves.)
		r.c.cfg.logger.Warn("partition message without JetStream metadata dropped", "subscription", r.sub.id, "partition", p.index, "err", err)
		return
	}
	h := msg.Headers()
	pin := h.Get(pinHeader)
	h.Del(pinHeader)
	if len(h) == 0 {
		h = nil
	}
	d := r.newDelivery(p, arrival{
		subject:   msg.Subject(),
		reply:     msg.Reply(),
		header:    h,
		data:      msg.Data(),
		consumer:  meta.Consumer,
		seq:       meta.Sequence.Stream,
		attempt:   meta.NumDelivered,
		published: meta.Timestamp,
	})
	d.dseq = meta.Sequence.Consumer

	p.mu.Lock()
	expected := p.g.lastDseq + 1
	verdict, start, cause := p.g.arrive(d, pin)
	switch cause {
	case lostGap:
		r.c.cfg.logger.Info("partition delivery gap: a delivery was lost on the way; fenced until it comes back", "subscription", r.sub.id, "partition", p.index,
			"expected", expected, "got", d.dseq)
		fallthrough
	case newTerm:
		p.m.loops.Add(1)
		go p.fence(p.g.fences)
	}
	switch verdict {
	case staleTerm:
		p.checkPinLocked(pin)
	case admitted:
		p.reportLocked()
	}
	p.mu.Unlock()
	switch verdict {
	case handBack:
		_ = r.c.nc.Publish(d.reply, handBackPayload)
	case staleTerm:
		_ = r.c.nc.Publish(d.reply, ackPayload[ackNak])
	case acked:
		r.c.cfg.logger.Debug("message acked before delivered again (the server lost its ack): acked again", "subscription", r.sub.id,
			"partition", p.index, "seq", d.key.seq)
		// Through confirmAcks: the server may lose this ack too.
		d.acked = ackAck
		p.m.confirmQueue(d)
	}
	r.launch(start)
}

// onErr hears of pull requests the server refused because they carried a
// pin id other than the current one. That may be an older pin of ours (a
// request sent before the server pinned us anew), so the server is asked
// who owns the partition now.
func (p *partition) onErr(_ jetstream.ConsumeContext, err error) {
	r := p.r
	switch {
	case errors.Is(err, jetstream.ErrPinIDMismatch):
		p.mu.Lock()
		defer p.mu.Unlock()
		// onErr and onMsg run on the same goroutine: the pin is the pin of
		// the refused request, or a newer one that fences by itself.
		p.checkPinLocked(p.g.pin)
	case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrBadRequest):
		// nats.go stops pulling for good after these.
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.g.stopping {
			return
		}
		p.m.loops.Add(1)
		go func() {
			defer p.m.loops.Done()
			r.failPartitionGone(p.index, err)
		}()
	default:
		r.c.cfg.logger.Debug("partition pull", "subscription", r.sub.id, "partition", p.index, "err", err)
	}
}

// failPartitionGone ends Receive when a partition consumer went away: gone
// with its subscription or its topic, or a seek's settle removed it (the
// old epoch's), most likely; it says which.
func (r *receiver) failPartitionGone(index int, err error) {
	ctx, cancel := r.c.withTimeout(context.Background())
	defer cancel()
	rec, lerr := r.sub.load(ctx)
	if errors.Is(lerr, ErrSubscriptionNotFound) {
		r.fail(lerr)
		return
	}
	if lerr == nil && rec.Epoch != r.rec.Epoch && !rec.Settling {
		r.supersede()
		r.fail(errEpochChanged)
		return
	}
	if terr := r.c.checkTopic(ctx, r.rec); errors.Is(terr, ErrTopicDeleted) {
		r.fail(terr)
		return
	}
	r.fail(fmt.Errorf("receive %s: partition %d: %w", r.sub, index, err))
}

// checkPinLocked asks the server, in the background, whether pin (a pin of
// ours, or the lost pin) is still the partition's.
func (p *partition) checkPinLocked(pin string) {
	if pin == "" || p.checkingPin || p.g.stopping {
		return
	}
	p.checkingPin = true
	p.m.loops.Add(1)
	go p.checkPin(pin)
}

// checkPin settles whether pin is the partition's pin at the server,
// asking until it gets an answer (gates.pinAnswer applies it).
func (p *partition) checkPin(pin string) {
	r := p.r
	defer p.m.loops.Done()
	backoff := 100 * time.Millisecond
	var info *jetstream.ConsumerInfo
	for {
		ctx, cancel := context.WithTimeout(context.Background(), r.c.takeOverTimeout())
		var err error
		info, err = p.info(ctx)
		cancel()
		if err == nil {
			break
		}
		select {
		case <-time.After(backoff):
			backoff = min(2*backoff, 2*time.Second)
		case <-p.m.stopped:
			p.mu.Lock()
			p.checkingPin = false
			p.mu.Unlock()
			return
		}
	}
	p.mu.Lock()
	p.checkingPin = false
	lost, back := p.g.pinAnswer(pin, pinnedIn(info))
	if lost {
		p.reportLocked()
	}
	p.mu.Unlock()
	if !lost {
		return
	}
	// What no handler has started goes back, to the new owner; it starts
	// none of it before the messages in our handlers are settled.
	r.c.cfg.logger.Info("lost partition to another receiver", "subscription", r.sub.id, "partition", p.index)
	for _, d := range back {
		_ = r.c.nc.Publish(d.reply, ackPayload[ackNak])
	}
}

// pinnedIn is the pin id the server gives the partition's group.
func pinnedIn(info *jetstream.ConsumerInfo) string {
	for _, g := range info.PriorityGroups {
		if g.Group == partitionGroup {
			return g.PinnedClientID
		}
	}
	return ""
}

// pinnedAt is when the server pinned the partition's group (zero if it
// does not say).
func pinnedAt(info *jetstream.ConsumerInfo) time.Time {
	for _, g := range info.PriorityGroups {
		if g.Group == partitionGroup {
			return g.PinnedTS
		}
	}
	return time.Time{}
}

// fence waits until the consumer's unacked messages are all held here,
// then lets handlers start (gates.lift).
func (p *partition) fence(n int) {
	r := p.r
	defer p.m.loops.Done()
	began := time.Now()
	polls := 0
	var freeChecked time.Time // when freeGoneOwners last looked
	// Soon at first: a clean take-over (the first term, or an owner that
	// handed everything back) clears as soon as the pulled batch is in.
	wait := 2 * time.Millisecond
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		// Short: while a cluster elects the consumer's leader, a request
		// can go unanswered; the next one finds the new leader.
		ctx, cancel := context.WithTimeout(context.Background(), min(r.c.cfg.apiTimeout, time.Second))
		info, err := p.info(ctx)
		var a consumerAnswer
		if err == nil {
			a = consumerAnswer{unacked: info.NumAckPending, delivered: info.Delivered.Consumer}
			p.mu.Lock()
			needsFirst := p.g.needsFirst(a)
			p.mu.Unlock()
			if needsFirst {
				a.first, err = r.c.leaderMsgSeq(ctx, info.Stream, msgGetRequest{Seq: info.AckFloor.Stream + 1, NextBySubj: cmp.Or(info.Config.FilterSubject, ">")})
			}
		}
		cancel()
		p.mu.Lock()
		if p.g.fences != n || p.g.stopping {
			p.mu.Unlock()
			return
		}
		liftable := err == nil && p.g.liftable(n, a)
		pin, recorded := p.g.pin, p.recordedPin
		if err == nil && pinnedIn(info) != pin {
			// The server has moved the pin on, or unpinned the partition
			// (a yield, a take-over): nothing of this term starts, and
			// checkPin settles whether it is over.
			liftable = false
			p.checkPinLocked(pin)
		}
		p.mu.Unlock()
		if liftable && pin != recorded {
			// Recorded before any handler of the term starts, so that a
			// later owner asks whether this receiver is gone, not the one
			// before it.
			rctx, rcancel := context.WithTimeout(context.Background(), r.c.takeOverTimeout())
			if err = p.recordOwner(rctx, pin); err == nil {
				// And the pin still ours once the record is written: a
				// receiver pinned after the unpin that may have come
				// meanwhile could have looked for the record before it
				// was there, and, finding none, hands back every message
				// it does not hold, those this term would start too. One
				// pinned after this look finds the record.
				var now *jetstream.ConsumerInfo
				if now, err = p.info(rctx); err == nil && pinnedIn(now) != pin {
					liftable = false
					p.mu.Lock()
					p.checkPinLocked(pin)
					p.mu.Unlock()
				}
			}
			if err != nil {
				liftable = false
				r.c.cfg.logger.Debug("owner record not written, or the pin not confirmed after it; the fence stays", "subscription", r.sub.id, "partition", p.index, "err", err)
			}
			rcancel()
		}
		p.mu.Lock()
		if liftable {
			p.recordedPin = pin
		}
		if liftable {
			if lifted, start := p.g.lift(n, a); lifted {
				p.reportLocked()
				p.mu.Unlock()
				r.launch(start)
				if waited := time.Since(began); waited > time.Second {
					r.c.cfg.logger.Info("took over partition after the previous owner's messages were settled",
						"subscription", r.sub.id, "partition", p.index, "waited", waited.Round(time.Millisecond))
				}
				return
			}
		}
		// Once the term's first pulled batch is in (what is in flight to us
		// would be delivered twice), and again every second.
		if err == nil && !liftable && time.Since(began) > 100*time.Millisecond && time.Since(freeChecked) > time.Second {
			p.mu.Unlock()
			freeChecked = time.Now()
			fctx, fcancel := context.WithTimeout(context.Background(), r.c.takeOverTimeout())
			if p.freeGoneOwners(fctx, info) {
				wait = time.Millisecond // they come back at once
			}
			fcancel()
			p.mu.Lock()
		}
		if polls++; polls%40 == 0 {
			r.c.cfg.logger.Debug("partition waits for the previous owner's messages", "subscription", r.sub.id, "partition", p.index,
				"server_unacked", a.unacked, "held", len(p.g.held), "waited", time.Since(began), "err", err)
		}
		p.mu.Unlock()
		select {
		case <-t.C:
		case <-p.m.stopped:
			return
		}
		// A fence that waits for an ack deadline (a dead owner's messages,
		// a delivery lost on the way) polls less often.
		most := 50 * time.Millisecond
		if time.Since(began) > time.Second {
			most = 250 * time.Millisecond
		}
		wait = min(2*wait, most)
		t.Reset(wait)
	}
}

// takeOverTimeout bounds each call a partition's pull, fence and take-over
// make: a round trip when the server answers at all, far under an ack
// deadline. A request lost with a connection that a NATS server's crash
// broke is never answered, and waiting the client's API timeout for it
// (10 s) stalls the partition as long as an ack deadline would. A call
// that times out is made again on a later look.
func (c *Client) takeOverTimeout() time.Duration {
	return min(c.cfg.apiTimeout, 2*time.Second)
}

// checkAwaiting unblocks keys waiting for a message that will never come
// back: one the stream no longer has (removed by the topic's retention),
// or one the server has acked (gates.goneAnswer fences for that).
func (p *partition) checkAwaiting(ctx context.Context) {
	r := p.r
	p.mu.Lock()
	due := p.g.overdue(time.Now(), 2*r.rec.ackDeadline())
	for _, w := range due {
		r.c.cfg.logger.Debug("key waits for a message to come back", "subscription", r.sub.id, "partition", p.index,
			"subject", w.subject, "seq", w.seq, "for", time.Since(w.since), "held", len(p.g.held))
	}
	p.mu.Unlock()
	for _, w := range due {
		_, err := r.c.leaderMsgSeq(ctx, p.stream.CachedInfo().Config.Name, msgGetRequest{Seq: w.seq})
		p.mu.Lock()
		moved, start, fenced := p.g.goneAnswer(w, err == nil, errors.Is(err, jetstream.ErrMsgNotFound))
		if fenced {
			r.c.cfg.logger.Info("key waited two ack deadlines for a message the stream still has; fenced, in case the server has it acked", "subscription", r.sub.id, "partition", p.index,
				"subject", w.subject, "seq", w.seq)
			p.m.loops.Add(1)
			go p.fence(p.g.fences)
		}
		p.mu.Unlock()
		if moved {
			r.c.cfg.logger.Warn("key no longer waits for a message the stream does not have", "subscription", r.sub.id, "partition", p.index,
				"subject", w.subject, "seq", w.seq)
		}
		r.launch(start)
	}
}

// The partition holds its deliveries (holder).

func (p *partition) current(d *delivery) *delivery {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.g.current(d)
}

func (p *partition) release(d *delivery, settled bool) {
	p.mu.Lock()
	start, revoked := p.g.release(d, settled, time.Now())
	p.reportLocked()
	var undecided []*delivery
	for _, e := range revoked {
		if e.revokedC != nil {
			close(e.revokedC)
		}
		if e.ackMade {
			// Its ack waited for d's: it is not sent.
			_ = p.r.c.nc.Publish(e.reply, handBackPayload)
		} else {
			undecided = append(undecided, e)
		}
	}
	p.mu.Unlock()
	for _, e := range undecided {
		// Should its handler ack it meanwhile, confirmLater finds it
		// revoked and nacks it instead: one way or the other, one nack.
		e.finishWith(ackNak, handBackPayload)
	}
	p.r.launch(start)
}

func (p *partition) confirmsAcks() bool { return true }

func (p *partition) ackSending(d *delivery) {
	p.mu.Lock()
	p.g.markAckSent(d)
	p.mu.Unlock()
}

func (p *partition) confirmLater(d *delivery) {
	p.mu.Lock()
	send, revoked := p.g.ackMade(d)
	// Queued under the partition's lock: a key's acks reach confirmAcks in
	// the order the gates let them go.
	late := p.m.confirmQueueLocked(send)
	p.mu.Unlock()
	if revoked {
		_ = p.r.c.nc.Publish(d.reply, handBackPayload)
		return
	}
	if late {
		// confirmAcks has ended (Receive is ending): sent and confirmed
		// here, outside the lock, which releasing them takes.
		p.m.sendAndConfirm(send)
	}
}

func (p *partition) pipelines() bool { return p.g.window > 1 }

func (p *partition) handOver(d *delivery) {
	if p.g.window == 1 {
		p.release(d, false) // strict: not acked by now, it comes back
		return
	}
	p.mu.Lock()
	start := p.g.handOver(d)
	p.mu.Unlock()
	p.r.launch(start)
}

// confirmQueueLocked has confirmAcks send ds' acks and release them once
// confirmed, unless confirmAcks has ended: it then reports late, for the
// caller to send and confirm them itself. It takes no partition lock.
func (m *partitionedMode) confirmQueueLocked(ds []*delivery) (late bool) {
	if len(ds) == 0 {
		return false
	}
	select {
	case <-m.stopped:
		return true
	default:
	}
	m.confirmMu.Lock()
	m.confirmQ = append(m.confirmQ, ds...)
	m.confirmMu.Unlock()
	select {
	case m.confirmWake <- struct{}{}:
	default:
	}
	return false
}

// confirmQueue has confirmAcks send d's ack and release d once confirmed.
func (m *partitionedMode) confirmQueue(d *delivery) {
	select {
	case <-m.stopped:
		// confirmAcks has ended (Receive is ending): an ack made since is
		// sent and confirmed here.
		m.sendAndConfirm([]*delivery{d})
		return
	default:
	}
	m.confirmMu.Lock()
	m.confirmQ = append(m.confirmQ, d)
	m.confirmMu.Unlock()
	select {
	case m.confirmWake <- struct{}{}:
	default:
	}
}

// confirmAcks sends the partitions' acks and confirms them in groups: one
// flush (a PING the server answers after everything sent before it) for
// all the acks sent meanwhile. Acks that cannot be confirmed (the
// connection is down) are sent again until they are: their keys wait, as
// the server may or may not have them. While the connection is down it
// sends nothing.
//
// A NATS server that restarts after a crash can come back without the
// acks it took in its last moments (it writes a consumer's state about ten
// times a second), acks this loop saw confirmed and whose keys have moved
// on. Were a later message's ack to reach it before the earlier ones were
// taken again, and this process to die meanwhile, the receiver that takes
// the partition over would deliver the earlier message after the later
// one. So after each reconnect the loop first sends again the acks
// confirmed lately (recentAcks), then the others, in the order they were
// made.
func (m *partitionedMode) confirmAcks() {
	defer m.loops.Done()
	r := m.r
	var batch, queued []*delivery // batch: sent or to send, not confirmed
	var recent recentAcks
	reconnects := r.c.nc.Stats().Reconnects
	failing := false // warned about this run of failures
	fail := func(err error) {
		if !failing {
			failing = true
			r.c.cfg.logger.Warn("acks not confirmed; sending them again until they are, their keys wait", "subscription", r.sub.id, "messages", len(batch), "err", err)
		}
	}
	retry := time.NewTimer(0)
	<-retry.C
	for {
		select {
		case <-m.confirmWake:
		case <-retry.C:
		case <-m.stopped:
			m.confirmRemaining(batch)
			return
		}
		m.confirmMu.Lock()
		queued, m.confirmQ = m.confirmQ, queued[:0]
		m.confirmMu.Unlock()
		batch = append(batch, queued...)
		clear(queued)
		if !r.c.nc.IsConnected() {
			fail(nats.ErrConnectionClosed)
			retry.Reset(250 * time.Millisecond)
			continue
		}
		if n := r.c.nc.Stats().Reconnects; n != reconnects {
			reconnects = n
			if sent := recent.resend(r.c.nc, time.Now()); sent > 0 {
				r.c.cfg.logger.Debug("acks confirmed before the reconnect sent again, before any other (the server may have lost them)",
					"subscription", r.sub.id, "acks", sent)
			}
		}
		for _, d := range batch {
			_ = r.c.nc.Publish(d.reply, ackPayload[d.acked])
		}
		if err := r.c.nc.FlushTimeout(r.c.cfg.apiTimeout); err != nil {
			fail(err)
			retry.Reset(250 * time.Millisecond)
			continue
		}
		failing = false
		now := time.Now()
		for i, d := range batch {
			recent.add(d.reply, d.acked, now)
			d.home.release(d, true)
			batch[i] = nil
		}
		batch = batch[:0]
	}
}

// recentAcks are the acks (and terms) confirmed in the last recentAckAge
// (at most recentAckCap of them), oldest first: what a server that
// restarted after a crash may have lost. The live ones are acks[head:];
// the slice is compacted once half of it is dead.
type recentAcks struct {
	acks []recentAck
	head int
}

type recentAck struct {
	subject string // the message's reply subject
	kind    ackKind
	at      time.Time
}

const (
	// recentAckAge is far beyond how stale a restarted server's consumer
	// state can be (nats-server writes it within 100 ms of a change).
	recentAckAge = 5 * time.Second
	recentAckCap = 1 << 15
)

func (a *recentAcks) add(subject string, kind ackKind, now time.Time) {
	a.prune(now, a.len()-recentAckCap+1)
	a.acks = append(a.acks, recentAck{subject, kind, now})
}

func (a *recentAcks) len() int { return len(a.acks) - a.head }

// live is the acks kept, oldest first.
func (a *recentAcks) live() []recentAck { return a.acks[a.head:] }

// prune forgets the acks older than recentAckAge, and at least the oldest
// atLeast.
func (a *recentAcks) prune(now time.Time, atLeast int) {
	end := a.head + max(atLeast, 0)
	for end < len(a.acks) && now.Sub(a.acks[end].at) > recentAckAge {
		end++
	}
	clear(a.acks[a.head:end])
	a.head = end
	if a.head > len(a.acks)/2 {
		a.acks = slices.Delete(a.acks, 0, a.head)
		a.head = 0
	}
}

// resend sends the recent acks again, each as it was (an ack or a term),
// oldest first, and returns how many. One the server has already is
// ignored by it.
func (a *recentAcks) resend(nc *nats.Conn, now time.Time) int {
	a.prune(now, 0)
	for _, e := range a.live() {
		_ = nc.Publish(e.subject, ackPayload[e.kind])
	}
	return a.len()
}

// confirmRemaining is the last round of confirmAcks, once Receive is
// stopping, so the books (and what the hooks were told) end square.
func (m *partitionedMode) confirmRemaining(unconfirmed []*delivery) {
	m.confirmMu.Lock()
	batch := append(unconfirmed, m.confirmQ...)
	m.confirmQ = nil
	m.confirmMu.Unlock()
	m.sendAndConfirm(batch)
}

// sendAndConfirm sends batch's acks and releases each delivery, settled if
// a flush confirmed the server has them.
func (m *partitionedMode) sendAndConfirm(batch []*delivery) {
	if len(batch) == 0 {
		return
	}
	nc := m.r.c.nc
	for _, d := range batch {
		_ = nc.Publish(d.reply, ackPayload[d.acked])
	}
	err := nc.FlushTimeout(m.r.c.cfg.apiTimeout)
	for _, d := range batch {
		d.home.release(d, err == nil)
	}
}

// reportLocked tells the hooks what changed in p since it last did.
func (p *partition) reportLocked() {
	h := p.r.settings.Hooks
	if h == nil {
		return
	}
	owned := p.g.pin != ""
	full := owned && len(p.g.held) >= p.limit
	var c PartitionChange
	c.Owned = flagDelta(&p.owned, owned)
	c.Full = flagDelta(&p.full, full)
	c.Buffered = len(p.g.held) - p.reported
	p.reported = len(p.g.held)
	if c != (PartitionChange{}) {
		c.Partition = p.index
		h.PartitionChanged(p.r.sub, c)
	}
}

// flagDelta is +1 when a property a partition did not have (*had) it has
// now, -1 when it lost it, else 0; *had becomes now.
func flagDelta(had *bool, now bool) int {
	d := 0
	switch {
	case now && !*had:
		d = 1
	case !now && *had:
		d = -1
	}
	*had = now
	return d
}
