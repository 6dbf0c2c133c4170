package adapter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/keyrouter"
)

// Partitioned delivery (DeliveryPartitioned).
//
// The topic's keyed subjects carry a slot, 0..63, a hash of the key, as six
// one-bit tokens (keyrouter); a partitioned subscription has one pull
// consumer per partition, whose one filter is a prefix of those tokens,
// with the pinned-client priority policy: the
// server delivers a partition's messages to one receiving process at a time,
// the owner, and moves the pin to another when the owner sends no pull
// request for the consumer's PinnedTTL (the client's owner lease).
//
// The consumer's MaxAckPending is the partition's buffer: the owner holds
// every delivered message until it is settled, and lets one message per key
// into a handler at a time, the one with the lowest stream sequence. A key
// whose message was nacked or handed back waits until that message is
// delivered again, so later messages of the key never overtake it.
//
// Ownership terms. Every delivered message carries the pin id of the term
// it was sent in. When an owner sees a new pin id, it has just (re)gained
// the partition, and the previous owner may still have messages in its
// handlers. Within a term, a gap in the consumer's delivery sequence means
// a delivery was lost on the way: a message unacked at the server that no
// gate holds. Either way the owner fences: it starts no handler until the
// consumer's count of unacked messages equals the number it holds itself,
// unacked, and the first unacked message (the first of the partition after
// the consumer's ack floor) is one of them. Every message it holds and has
// not acked is unacked at the server, so from then on every unacked
// message of the partition is in its hands, and its gates see them all.
// An owner whose pull request is refused asks the server who is pinned; if
// another client is, it hands its waiting messages back at once and keeps
// extending those in handlers, so the new owner waits for them to be
// acked, or for their deadline to pass (a dead owner) and their
// redelivery, exactly as a per-key consumer would. (The count can be
// fooled by an owner that acks, late, a message its deadline let the
// server redeliver elsewhere; the first-message check catches that when
// the hidden message is the first unacked one. docs/RELIABILITY.md.)
//
// A key's next message starts only once the server has its predecessor's
// ack: acks are confirmed with a round trip to the server (one for all the
// acks sent meanwhile), so an ack lost with the connection cannot let a
// later message overtake its redelivery. (In a cluster the round trip
// reaches the server this client is connected to; an ack lost between it
// and the consumer's leader, in a fail-over, is not covered.)

// partitionGroup is the priority group every receiver pulls in.
const partitionGroup = "jetorder"

// minPinTTL is the shortest PinnedTTL of a partition consumer: an idle
// owner renews its pin with a pull request every third of it, and nats.go
// lets a pull request wait no less than a second.
const minPinTTL = 3 * time.Second

// pinHeader is the header the server adds to each message of a pinned
// consumer; the adapter removes it before a handler sees the message.
const pinHeader = "Nats-Pin-Id"

// ReceiveStats are gauges of the partitioned subscriptions Receive calls
// run; share one among Receive calls to add them up. Set it before Receive.
type ReceiveStats struct {
	// PartitionsOwned is how many partitions this process owns.
	PartitionsOwned atomic.Int64
	// PartitionBuffered is how many messages owned partitions hold: in
	// handlers or waiting behind an earlier message of their key.
	PartitionBuffered atomic.Int64
	// PartitionsFull is how many owned partitions hold as many messages as
	// their buffer allows: until one is acked, JetStream delivers nothing
	// more of them, for any key.
	PartitionsFull atomic.Int64
}

func (r *subRecord) partitionIndexes() []int {
	out := make([]int, r.Partitions)
	for i := range out {
		out[i] = i
	}
	return out
}

// partitionConsumerConfig is partition i's pull consumer.
func (r *subRecord) partitionConsumerConfig(pinTTL time.Duration, i int) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        keyrouter.PartitionConsumer(r.Project, r.nameID(), i),
		Description:    fmt.Sprintf("%s partition %d of %d", r.consumerDescription(), i, r.Partitions),
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    r.StartSeq,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        r.ackDeadline(),
		MaxDeliver:     -1,
		FilterSubject:  keyrouter.PartitionFilter(r.TopicProject, r.Topic, r.Partitions, i),
		MaxAckPending:  r.PartitionBuffer,
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PriorityGroups: []string{partitionGroup},
		PinnedTTL:      pinTTL,
	}
}

// partition is one partition of a partitioned subscription, as one Receive
// call sees it. Every field after stream is guarded by r.mu.
type partition struct {
	r     *receiver
	index int
	limit int
	cons  jetstream.Consumer
	// stream is the topic's stream: unpin goes through it.
	stream jetstream.Stream

	pin     string // pin id of the current term; "" when not the owner
	lostPin string // the pin of the last term that ended with a refusal
	// fences counts fence checks begun (at each new term and each
	// delivery gap), so a stale one stands down.
	fences int
	// fenced: no handler starts. The term is new, a delivery was lost on
	// the way, or the pin is lost.
	fenced bool
	// lastDseq is the consumer delivery sequence of the term's last
	// arrival.
	lastDseq uint64
	held     int // messages of the partition this process holds
	// checkingPin is set while checkPin asks the server who owns it.
	checkingPin bool
	keys        map[string]*keyGate

	// what reportLocked last added to the shared stats
	owned    bool
	full     bool
	reported int
}

// keyGate is one key's messages in an owned partition.
type keyGate struct {
	active *delivery // in a handler, or acked and waiting for confirmation
	// awaiting is the stream sequence of a message that was handed back
	// (nacked, or its handler returned without an ack); no later message of
	// the key starts until it is delivered again.
	awaiting      uint64
	awaitingSince time.Time
	// goneOnce is an awaited message the stream's leader said once it does
	// not have; a second answer in a row lets the key move on.
	goneOnce uint64
	waiting  []*delivery // by stream sequence
}

func (g *keyGate) idle() bool { return g.active == nil && g.awaiting == 0 && len(g.waiting) == 0 }

// startPartitions opens the subscription's partition consumers and starts
// pulling from each.
func (r *receiver) startPartitions(ctx context.Context) ([]jetstream.ConsumeContext, error) {
	stream, err := r.c.js.Stream(ctx, r.rec.stream())
	if err != nil {
		return nil, err
	}
	var ccs []jetstream.ConsumeContext
	stop := func() {
		for _, cc := range ccs {
			cc.Stop()
		}
	}
	for i := range r.rec.Partitions {
		cons, err := stream.Consumer(ctx, keyrouter.PartitionConsumer(r.rec.Project, r.rec.nameID(), i))
		if err != nil {
			stop()
			return nil, fmt.Errorf("partition %d: %w", i, err)
		}
		p := &partition{r: r, index: i, limit: r.rec.PartitionBuffer, cons: cons, stream: stream, keys: make(map[string]*keyGate)}
		r.mu.Lock()
		r.partitions = append(r.partitions, p)
		r.mu.Unlock()
		// A pull request must reach the server well within the pin's TTL,
		// or an idle owner loses its partition.
		expiry := max(cons.CachedInfo().Config.PinnedTTL/3, time.Second)
		cc, err := cons.Consume(p.onMsg,
			jetstream.PullPriorityGroup(partitionGroup),
			jetstream.PullExpiry(expiry),
			jetstream.PullMaxMessages(min(r.rec.PartitionBuffer, 1000)),
			jetstream.ConsumeErrHandler(p.onErr))
		if err != nil {
			stop()
			return nil, fmt.Errorf("partition %d: %w", i, err)
		}
		ccs = append(ccs, cc)
	}
	return ccs, nil
}

func (p *partition) onMsg(m jetstream.Msg) {
	meta, err := m.Metadata()
	if err != nil {
		// Not a JetStream delivery: nothing to ack. (Should one be lost this
		// way, the partition fences at the gap it leaves.)
		p.r.c.cfg.logger.Warn("partition message without JetStream metadata dropped", "subscription", p.r.sub.id, "partition", p.index, "err", err)
		return
	}
	h := m.Headers()
	pin := h.Get(pinHeader)
	h.Del(pinHeader)
	if len(h) == 0 {
		h = nil
	}
	p.r.deliver(p, arrival{
		subject:   m.Subject(),
		reply:     m.Reply(),
		header:    h,
		data:      m.Data(),
		consumer:  meta.Consumer,
		seq:       meta.Sequence.Stream,
		attempt:   meta.NumDelivered,
		published: meta.Timestamp,
		dseq:      meta.Sequence.Consumer,
		pin:       pin,
	})
}

// onErr hears of pull requests the server refused because they carried a
// pin id other than the current one. That may be an older pin of ours (a
// request sent before the server pinned us anew), so the server is asked
// who owns the partition now.
func (p *partition) onErr(_ jetstream.ConsumeContext, err error) {
	r := p.r
	switch {
	case errors.Is(err, jetstream.ErrPinIDMismatch):
		r.mu.Lock()
		defer r.mu.Unlock()
		// onErr and onMsg run on the same goroutine: p.pin is the pin of
		// the refused request, or a newer one that fences by itself.
		p.checkPinLocked(p.pin)
	case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrBadRequest):
		// nats.go stops pulling for good after these.
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.stopping {
			return
		}
		r.loops.Add(1)
		go func() {
			defer r.loops.Done()
			ctx, cancel := r.c.withTimeout(context.Background())
			defer cancel()
			// Gone with its subscription or its topic, or a seek's settle
			// removed it (the old epoch's), most likely: say so.
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
			r.fail(fmt.Errorf("receive %s: partition %d: %w", r.sub, p.index, err))
		}()
	default:
		r.c.cfg.logger.Debug("partition pull", "subscription", r.sub.id, "partition", p.index, "err", err)
	}
}

// checkPinLocked asks the server, in the background, whether pin (a pin of
// ours, or lostPin) is still the partition's.
func (p *partition) checkPinLocked(pin string) {
	if pin == "" || p.checkingPin || p.r.stopping {
		return
	}
	p.checkingPin = true
	p.r.loops.Add(1)
	go p.checkPin(pin)
}

// checkPin settles whether pin is the partition's pin at the server,
// asking until it gets an answer: a pin of ours that the server no longer
// has means the partition is lost; a lost pin the server has again (the
// refusal was for an older request) is ours again.
func (p *partition) checkPin(pin string) {
	r := p.r
	defer r.loops.Done()
	backoff := 100 * time.Millisecond
	var info *jetstream.ConsumerInfo
	for {
		ctx, cancel := context.WithTimeout(context.Background(), min(r.c.cfg.apiTimeout, 2*time.Second))
		var err error
		info, err = p.cons.Info(ctx)
		cancel()
		if err == nil {
			break
		}
		select {
		case <-time.After(backoff):
			backoff = min(2*backoff, 2*time.Second)
		case <-r.stopped:
			r.mu.Lock()
			p.checkingPin = false
			r.mu.Unlock()
			return
		}
	}
	r.mu.Lock()
	p.checkingPin = false
	current := pinnedIn(info)
	if pin == p.lostPin {
		if current == pin {
			p.lostPin = "" // its next message starts a term
		}
		r.mu.Unlock()
		return
	}
	if p.pin != pin || current == pin {
		r.mu.Unlock()
		return
	}
	r.c.cfg.logger.Info("lost partition to another receiver", "subscription", r.sub.id, "partition", p.index)
	p.lostPin = p.pin
	p.pin = ""
	p.fences++ // a running fence check stands down
	p.fenced = true
	// What no handler has started goes back, to the new owner; it starts
	// none of it before the messages in our handlers are settled. It
	// leaves our books now, so nothing of it can start here.
	var back []string
	for subject, g := range p.keys {
		for _, d := range g.waiting {
			delete(r.held, d.key)
			p.held--
			back = append(back, d.reply)
		}
		g.waiting = nil
		g.awaiting = 0 // the new owner gets it back
		if g.active == nil {
			delete(p.keys, subject)
		}
	}
	p.reportLocked()
	r.mu.Unlock()
	for _, reply := range back {
		_ = r.c.nc.Publish(reply, ackPayload[ackNak])
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

// addLocked takes a new delivery into its key's gate and returns what may
// start now.
func (p *partition) addLocked(d *delivery) []*delivery {
	p.held++
	g := p.keys[d.subject]
	if g == nil {
		g = &keyGate{}
		p.keys[d.subject] = g
	}
	if g.awaiting == d.key.seq {
		g.awaiting = 0
	}
	i, _ := slices.BinarySearchFunc(g.waiting, d.key.seq, func(w *delivery, seq uint64) int {
		return cmp.Compare(w.key.seq, seq)
	})
	g.waiting = slices.Insert(g.waiting, i, d)
	p.reportLocked()
	return p.pumpLocked(d.subject, g, nil)
}

// pumpLocked moves the first waiting message of the key subject (gate g)
// into a handler if the key is free, appending it to out, and forgets the
// gate once it holds nothing.
func (p *partition) pumpLocked(subject string, g *keyGate, out []*delivery) []*delivery {
	if !p.fenced && !p.r.stopping && g.active == nil && g.awaiting == 0 && len(g.waiting) > 0 {
		d := g.waiting[0]
		g.waiting[0] = nil
		g.waiting = g.waiting[1:]
		g.active = d
		out = append(out, d)
	}
	if g.idle() {
		delete(p.keys, subject)
	}
	return out
}

// releaseLocked forgets d, held until now, and returns what may start now.
// settled says the server has d's ack (or term); otherwise d comes back.
func (p *partition) releaseLocked(d *delivery, settled bool) []*delivery {
	p.held--
	p.reportLocked()
	g := p.keys[d.subject]
	if g == nil {
		return nil
	}
	if g.active == d {
		g.active = nil
		if !settled && !p.fenced {
			g.awaiting = d.key.seq
			g.awaitingSince = time.Now()
		}
	} else if i := slices.Index(g.waiting, d); i >= 0 {
		g.waiting = slices.Delete(g.waiting, i, i+1)
	}
	return p.pumpLocked(d.subject, g, nil)
}

// settledLateLocked handles the ack of a message whose handler returned
// without one: its key no longer waits for it to come back.
func (p *partition) settledLateLocked(d *delivery) []*delivery {
	g := p.keys[d.subject]
	if g == nil || g.awaiting != d.key.seq {
		return nil
	}
	g.awaiting = 0
	return p.pumpLocked(d.subject, g, nil)
}

// arrivedLocked notes a delivery of the partition, sent in the term of
// pin with consumer delivery sequence dseq, before it is taken in.
//
// A new pin starts an ownership term. Within a term the server numbers
// its deliveries of the consumer 1, 2, 3, ... and sends them all here, so
// a gap means a delivery was lost on the way: with a connection that
// dropped, say, or a subscription that fell behind. The server counts that
// message as delivered here while no gate holds it, and its key's next
// message must not start before it. Either way the partition fences: the
// check passes once every unacked message is in our hands again (the lost
// one comes back when its ack deadline passes).
func (p *partition) arrivedLocked(pin string, dseq uint64) {
	switch {
	case p.r.stopping || (pin != "" && pin == p.lostPin):
		return // the delivery is handed back, unseen
	case pin != p.pin:
		p.pin = pin
		p.fenceLocked()
	case dseq != p.lastDseq+1:
		p.r.c.cfg.logger.Info("partition delivery gap: a delivery was lost on the way; fenced until it comes back", "subscription", p.r.sub.id, "partition", p.index,
			"expected", p.lastDseq+1, "got", dseq)
		p.fenceLocked()
	}
	p.lastDseq = dseq
}

// fenceLocked stops handlers from starting until the fence check finds
// every unacked message of the partition in our hands.
func (p *partition) fenceLocked() {
	p.fences++
	p.fenced = true
	p.r.loops.Add(1)
	go p.fence(p.fences)
}

// fence waits until the consumer's unacked messages are all held here,
// then lets handlers start.
func (p *partition) fence(n int) {
	r := p.r
	defer r.loops.Done()
	began := time.Now()
	polls := 0
	// Soon at first: a clean take-over (the first term, or an owner that
	// handed everything back) clears as soon as the pulled batch is in.
	wait := 2 * time.Millisecond
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		// Short: while a cluster elects the consumer's leader, a request
		// can go unanswered; the next one finds the new leader.
		ctx, cancel := context.WithTimeout(context.Background(), min(r.c.cfg.apiTimeout, time.Second))
		info, err := p.cons.Info(ctx)
		// The first unacked message: the first of the partition after the
		// consumer's ack floor. Looked up only when the count can match:
		// it costs the stream's leader a message read.
		var first uint64
		if err == nil && info.NumAckPending > 0 {
			r.mu.Lock()
			ours := p.unackedLocked(info.Delivered.Consumer, 0)
			r.mu.Unlock()
			if info.NumAckPending <= ours {
				first, err = r.c.leaderMsgSeq(ctx, r.rec.stream(), msgGetRequest{Seq: info.AckFloor.Stream + 1, NextBySubj: info.Config.FilterSubject})
			}
		}
		cancel()
		r.mu.Lock()
		if p.fences != n || r.stopping {
			r.mu.Unlock()
			return
		}
		if err == nil && p.othersSettledLocked(info, first) {
			p.fenced = false
			var start []*delivery
			for subject, g := range p.keys {
				// A message handed back before the fence is either held
				// here now or was acked meanwhile.
				g.awaiting = 0
				start = p.pumpLocked(subject, g, start)
			}
			p.reportLocked()
			now, queued := r.launchLocked(start)
			r.mu.Unlock()
			r.afterLaunch(now, queued)
			if waited := time.Since(began); waited > time.Second {
				r.c.cfg.logger.Info("took over partition after the previous owner's messages were settled",
					"subscription", r.sub.id, "partition", p.index, "waited", waited.Round(time.Millisecond))
			}
			return
		}
		if polls++; polls%40 == 0 {
			pending := -1
			if err == nil {
				pending = info.NumAckPending
			}
			r.c.cfg.logger.Debug("partition waits for the previous owner's messages", "subscription", r.sub.id, "partition", p.index,
				"server_unacked", pending, "held", p.held, "waited", time.Since(began), "err", err)
		}
		r.mu.Unlock()
		select {
		case <-t.C:
		case <-r.stopped:
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

// othersSettledLocked is the fence's test, on a consumer info and the
// first unacked message it implies (0 if not looked up): every unacked
// message of the partition is held here.
//
// Every message held here and not yet acked is unacked at the server: if
// the server counts no more (of those it had delivered when it counted,
// and still has), and its first unacked message is one of ours, nobody
// else holds one. (The count alone is fooled by a late ack, elsewhere, of
// a message redelivered here; the first unacked message catches what that
// hides most often. Counting a message the stream has removed meanwhile
// would hide one more.)
func (p *partition) othersSettledLocked(info *jetstream.ConsumerInfo, first uint64) bool {
	if info.NumAckPending == 0 {
		return true
	}
	return first != 0 && p.holdsUnackedLocked(first) && info.NumAckPending <= p.unackedLocked(info.Delivered.Consumer, first)
}

// unackedLocked counts the partition's messages held here, not acked,
// delivered by the time of a consumer info whose last delivery sequence
// is upTo, and at or after the stream sequence from (the first unacked
// message: those before it are acked or gone from the stream): what that
// info's unacked count should include of ours.
func (p *partition) unackedLocked(upTo, from uint64) int {
	n := 0
	for _, d := range p.r.held {
		if d.part == p && !d.ackSent && d.dseq <= upTo && d.key.seq >= from {
			n++
		}
	}
	return n
}

// holdsUnackedLocked reports whether this process holds the partition's
// message seq and has not acked it.
func (p *partition) holdsUnackedLocked(seq uint64) bool {
	d, ok := p.r.held[heldKey{consumer: p.cons.CachedInfo().Name, seq: seq}]
	return ok && !d.ackSent
}

// reportLocked brings the shared gauges up to date with p.
func (p *partition) reportLocked() {
	s := p.r.settings.Stats
	if s == nil {
		return
	}
	owned := p.pin != ""
	reportFlag(&s.PartitionsOwned, &p.owned, owned)
	reportFlag(&s.PartitionsFull, &p.full, owned && p.held >= p.limit)
	s.PartitionBuffered.Add(int64(p.held - p.reported))
	p.reported = p.held
}

// reportFlag counts a partition in gauge while it has a property: reported
// is what was last added for it, now whether it has the property now.
func reportFlag(gauge *atomic.Int64, reported *bool, now bool) {
	switch {
	case now && !*reported:
		gauge.Add(1)
	case !now && *reported:
		gauge.Add(-1)
	}
	*reported = now
}

// checkAwaiting unblocks keys waiting for a message the stream no longer
// has (removed by the topic's retention): it will never come back. It
// takes two answers in a row, a check apart: the server answers "not
// found" for a store error too.
func (r *receiver) checkAwaiting(ctx context.Context) {
	type wait struct {
		p       *partition
		subject string
		seq     uint64
	}
	var due []wait
	limit := 2 * r.rec.ackDeadline()
	r.mu.Lock()
	for _, p := range r.partitions {
		if p.fenced {
			continue
		}
		for subject, g := range p.keys {
			if g.awaiting != 0 && time.Since(g.awaitingSince) > limit {
				due = append(due, wait{p, subject, g.awaiting})
				r.c.cfg.logger.Debug("key waits for a message to come back", "subscription", r.sub.id, "partition", p.index,
					"subject", subject, "seq", g.awaiting, "for", time.Since(g.awaitingSince), "held", p.held)
			}
		}
	}
	r.mu.Unlock()
	if len(due) == 0 {
		return
	}
	for _, w := range due {
		_, err := r.c.leaderMsgSeq(ctx, r.rec.stream(), msgGetRequest{Seq: w.seq})
		gone := errors.Is(err, jetstream.ErrMsgNotFound)
		r.mu.Lock()
		var start []*delivery
		switch g := w.p.keys[w.subject]; {
		case g == nil || g.awaiting != w.seq:
		case !gone:
			g.goneOnce = 0
		case g.goneOnce != w.seq:
			g.goneOnce = w.seq
		default:
			r.c.cfg.logger.Warn("key no longer waits for a message the stream does not have", "subscription", r.sub.id, "partition", w.p.index,
				"subject", w.subject, "seq", w.seq)
			g.awaiting, g.goneOnce = 0, 0
			start = w.p.pumpLocked(w.subject, g, nil)
		}
		now, queued := r.launchLocked(start)
		r.mu.Unlock()
		r.afterLaunch(now, queued)
	}
}

// unpin gives up the partitions this process owns, at the end of Receive,
// so another receiver takes them over without waiting for the pin's TTL.
func (r *receiver) unpin() {
	for _, p := range r.partitions {
		r.mu.Lock()
		pin := p.pin
		p.pin = ""
		p.reportLocked()
		r.mu.Unlock()
		if pin == "" {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), r.c.cfg.apiTimeout)
		if info, err := p.cons.Info(ctx); err == nil && pinnedIn(info) == pin {
			_ = p.stream.UnpinConsumer(ctx, p.cons.CachedInfo().Name, partitionGroup)
		}
		cancel()
	}
}
