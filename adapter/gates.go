package adapter

import (
	"cmp"
	"slices"
	"time"
)

// gates is one partition's book as its owner keeps it: the messages it
// holds, a gate per ordering key that lets one message of the key into a
// handler at a time, and the take-over fence (doc.go has the argument).
//
// It does no I/O, reads no clock and takes no lock: the partition calls it
// under its own lock with what the server answered, and the unit tests in
// gates_test.go drive it the same way.
type gates struct {
	pin     string // pin id of the current term; "" when not the owner
	lostPin string // the pin of the last term that ended with a refusal
	// fences counts fence checks begun (at each new term and each delivery
	// gap), so a stale one stands down.
	fences int
	// fenced: no handler starts. The term is new, a delivery was lost on
	// the way, or the pin is lost.
	fenced bool
	// lastDseq is the consumer delivery sequence of the term's last
	// arrival.
	lastDseq uint64
	// stopping: Receive is ending, nothing more starts or is taken in.
	stopping bool

	held map[uint64]*delivery // by stream sequence
	keys map[string]*keyGate  // by subject

	// window is how many messages of a key may be started and not yet
	// settled: 1 is strict ordering (a key's next message starts once the
	// previous one is acked); more is pipelined ordering (it starts once
	// the previous one is handed over, its handler done with it).
	window int

	// done is, for keys whose messages were acked here lately, the
	// highest stream sequence acked (the server confirmed it); doneOrder
	// is those keys oldest first, so that done stays at most doneCap.
	done      map[string]uint64
	doneOrder []string
}

// doneCap bounds the keys a partition remembers acks of. A NATS server
// that restarts after a crash may have lost its latest acks, and then
// redelivers messages acked before it died: those of a key remembered are
// acked again and dropped instead of handed to a handler after later
// messages of their key.
const doneCap = 4096

// keyGate is one key's messages in an owned partition.
type keyGate struct {
	// out is the key's messages started and not yet settled (in a handler,
	// handed over, acked and waiting for confirmation), in stream order.
	// Strict ordering has at most one; pipelined ordering up to the
	// window, every one handed over but the last.
	out []*delivery
	// running is a message handed back while its handler still runs
	// (pipelined: an earlier message of its key was nacked): nothing of
	// the key starts until the handler is done with it.
	running *delivery
	// awaiting is the stream sequences of messages that were handed back
	// (nacked, or their handler returned without an ack), ascending; no
	// message of the key starts until they are all delivered again.
	awaiting      []uint64
	awaitingSince time.Time
	// goneOnce is an awaited message the stream's leader said once it does
	// not have; a second answer in a row lets the key move on.
	goneOnce uint64
	waiting  []*delivery // by stream sequence
}

func (g *keyGate) idle() bool {
	return len(g.out) == 0 && g.running == nil && len(g.awaiting) == 0 && len(g.waiting) == 0
}

// unawait forgets seq from the messages the key waits for.
func (g *keyGate) unawait(seq uint64) bool {
	i, found := slices.BinarySearch(g.awaiting, seq)
	if found {
		g.awaiting = slices.Delete(g.awaiting, i, i+1)
	}
	return found
}

// await adds seq to the messages the key waits for.
func (g *keyGate) await(seq uint64) {
	if i, found := slices.BinarySearch(g.awaiting, seq); !found {
		g.awaiting = slices.Insert(g.awaiting, i, seq)
	}
}

// newGates returns an empty book letting window messages of a key be
// started and unsettled at once (1: strict ordering).
func newGates(window int) *gates {
	return &gates{held: make(map[uint64]*delivery), keys: make(map[string]*keyGate), done: make(map[string]uint64), window: max(window, 1)}
}

// arrival is what the gates decided about a delivered message.
type arrivalVerdict int

const (
	admitted  arrivalVerdict = iota // held; start what was returned
	duplicate                       // a redelivery of a message held here: keep the copy we have
	acked                           // a redelivery of a message acked here, whose key has moved on: ack it again, unseen
	handBack                        // Receive is ending: hand it back for good
	staleTerm                       // sent in a term that ended: nack it, and ask who owns the partition
)

// fenceCause says why an arrival fenced the partition.
type fenceCause int

const (
	noFence fenceCause = iota
	newTerm            // a new pin id: the previous owner may still run messages
	lostGap            // a gap in the term's delivery sequence: a delivery was lost on the way
)

// arrive takes in d, delivered in the term of pin with consumer delivery
// sequence d.dseq. It returns the verdict, what may start now, and whether
// (and why) the partition fenced: the caller then runs fence check number
// g.fences.
//
// A new pin starts an ownership term. Within a term the server numbers its
// deliveries of the consumer 1, 2, 3, ... and sends them all here, so a gap
// means a delivery was lost on the way: the server counts that message as
// delivered here while no gate holds it, and its key's next message must
// not start before it. Either way the partition fences.
func (g *gates) arrive(d *delivery, pin string) (v arrivalVerdict, start []*delivery, cause fenceCause) {
	ignored := g.stopping || (pin != "" && pin == g.lostPin) // handed back, unseen
	if !ignored {
		switch {
		case pin != g.pin:
			g.pin = pin
			g.fence()
			cause = newTerm
		case d.dseq != g.lastDseq+1:
			g.fence()
			cause = lostGap
		}
		g.lastDseq = d.dseq
	}
	if held, dup := g.held[d.key.seq]; dup {
		// Its deadline passed while it waited here: keep the copy we
		// have, under the server's newest delivery sequence, which the
		// fence counts it by. Even when stopping: a nack would let it run
		// elsewhere beside our handler.
		held.dseq = d.dseq
		return duplicate, nil, cause
	}
	if done, ok := g.done[d.subject]; ok && d.key.seq <= done {
		// The key's later message was acked here after this one was, and
		// the server confirmed it: the server lost this one's ack (a
		// restart after a crash). Handing it to a handler now would put
		// it after its successors.
		return acked, nil, cause
	}
	if g.stopping {
		return handBack, nil, cause
	}
	if pin != "" && pin == g.lostPin {
		// The new owner's fence counts it; it must not start here beside
		// the new owner's handlers (unless the server has that pin again:
		// the caller asks).
		return staleTerm, nil, cause
	}
	g.held[d.key.seq] = d
	k := g.keys[d.subject]
	if k == nil {
		k = &keyGate{}
		g.keys[d.subject] = k
	}
	k.unawait(d.key.seq)
	i, _ := slices.BinarySearchFunc(k.waiting, d.key.seq, func(w *delivery, seq uint64) int {
		return cmp.Compare(w.key.seq, seq)
	})
	k.waiting = slices.Insert(k.waiting, i, d)
	return admitted, g.pump(d.subject, k, nil), cause
}

// fence stops handlers from starting until fence check number g.fences
// finds every unacked message of the partition held here.
func (g *gates) fence() {
	g.fences++
	g.fenced = true
}

// pump moves the first waiting message of the key subject (gate k) into a
// handler if the key may start one, appending it to out, and forgets the
// gate once it holds nothing. A key may start a message when nothing it
// waits for is missing, the window has room, and every message it started
// is handed over (one handler of a key at a time).
func (g *gates) pump(subject string, k *keyGate, out []*delivery) []*delivery {
	free := k.running == nil && len(k.awaiting) == 0 && len(k.out) < g.window &&
		(len(k.out) == 0 || k.out[len(k.out)-1].handedOver)
	if !g.fenced && !g.stopping && free && len(k.waiting) > 0 {
		d := k.waiting[0]
		k.waiting[0] = nil
		k.waiting = k.waiting[1:]
		k.out = append(k.out, d)
		out = append(out, d)
	}
	if k.idle() {
		delete(g.keys, subject)
	}
	return out
}

// holds reports whether d is the delivery of its message held here.
func (g *gates) holds(d *delivery) bool { return g.held[d.key.seq] == d }

// current is the delivery of d's message held here, or nil.
func (g *gates) current(d *delivery) *delivery { return g.held[d.key.seq] }

// release forgets d and returns what may start now. settled says the
// server has d's ack (or terminate); otherwise d comes back, and its key waits
// for it. A d no longer held whose ack the server has (its handler
// returned without one, then it was acked) unblocks its key.
//
// A d handed back takes with it every later message of its key started
// here (pipelined ordering): they leave the book and are returned as
// revoked, for the caller to hand back (nack) too, so that they come again
// after d, in order. Their acks, made or to come, are not sent.
func (g *gates) release(d *delivery, settled bool, now time.Time) (start, revoked []*delivery) {
	if !g.holds(d) {
		if !settled {
			return nil, nil
		}
		// Acked after its handler returned (the sidecar acks this way):
		// remembered as any ack.
		g.ackedHere(d)
		k := g.keys[d.subject]
		if k == nil || !k.unawait(d.key.seq) {
			return nil, nil
		}
		return g.pump(d.subject, k, nil), nil
	}
	delete(g.held, d.key.seq)
	if settled {
		g.ackedHere(d)
	}
	k := g.keys[d.subject]
	if k == nil {
		return nil, nil
	}
	if i := slices.Index(k.out, d); i >= 0 {
		if !settled {
			revoked = slices.Clone(k.out[i+1:])
			for _, e := range revoked {
				delete(g.held, e.key.seq)
				e.revoked = true
				if !e.handedOver {
					k.running = e
				}
			}
			clear(k.out[i:])
			k.out = k.out[:i]
			if !g.fenced {
				k.await(d.key.seq)
				for _, e := range revoked {
					k.await(e.key.seq)
				}
				k.awaitingSince = now
			}
		} else {
			k.out = slices.Delete(k.out, i, i+1)
		}
	} else if i := slices.Index(k.waiting, d); i >= 0 {
		k.waiting = slices.Delete(k.waiting, i, i+1)
	}
	return g.pump(d.subject, k, nil), revoked
}

// handOver records that d's handler is done with it (pipelined ordering:
// it may still be acked or nacked later), and returns what may start now.
func (g *gates) handOver(d *delivery) []*delivery {
	k := g.keys[d.subject]
	if k == nil {
		return nil
	}
	if k.running == d {
		k.running = nil // revoked while in its handler: its key may go on
	} else if !g.holds(d) {
		return nil
	}
	d.handedOver = true
	return g.pump(d.subject, k, nil)
}

// ackMade records the ack (or terminate) the application made of d, and
// returns the acks that may go to the server now, in order: a key's acks
// reach the server in its messages' order, so that a later message's ack
// waits for the earlier ones' (pipelined ordering: a nack of an earlier one
// brings the later ones back). revoked: d was handed back meanwhile, its
// ack must not be sent (a nack instead).
func (g *gates) ackMade(d *delivery) (send []*delivery, revoked bool) {
	if d.revoked {
		return nil, true
	}
	k := g.keys[d.subject]
	if !g.holds(d) || k == nil || d.ackSent || !slices.Contains(k.out, d) {
		// Not held (acked after its handler returned, or after the
		// partition was lost), sent already (AckWithResult), or never
		// started: it goes as it is.
		d.ackSent = d.ackSent || g.holds(d)
		return []*delivery{d}, false
	}
	d.ackMade = true
	for _, e := range k.out {
		if e.ackSent {
			continue
		}
		if !e.ackMade {
			break
		}
		e.ackSent = true
		send = append(send, e)
	}
	return send, false
}

// ackedHere remembers that d was acked here and the server confirmed it.
func (g *gates) ackedHere(d *delivery) {
	prev, ok := g.done[d.subject]
	if ok && prev >= d.key.seq {
		return
	}
	if !ok {
		if len(g.doneOrder) >= doneCap {
			delete(g.done, g.doneOrder[0])
			g.doneOrder[0] = ""
			g.doneOrder = g.doneOrder[1:]
		}
		g.doneOrder = append(g.doneOrder, d.subject)
	}
	g.done[d.subject] = d.key.seq
}

// markAckSent records that d's ack is on its way (AckWithResult sends it
// itself): the fence no longer counts it as unacked. Before the ack can
// reach the server, so the fence never counts it as unacked after the
// server has it.
func (g *gates) markAckSent(d *delivery) {
	if g.holds(d) {
		d.ackSent = true
	}
}

// consumerAnswer is what the fence reads of a consumer info.
type consumerAnswer struct {
	unacked   int    // NumAckPending
	delivered uint64 // Delivered.Consumer: the last delivery sequence
	// first is the first unacked message, the partition's first after the
	// consumer's ack floor; 0 when not looked up.
	first uint64
}

// needsFirst reports whether the fence must look up the first unacked
// message: only when the count can match, as it costs the stream's leader
// a message read.
func (g *gates) needsFirst(a consumerAnswer) bool {
	return a.unacked > 0 && a.unacked <= g.unacked(a.delivered, 0)
}

// othersSettled is the fence's test: every unacked message of the
// partition is held here.
//
// Every message held here and not yet acked is unacked at the server: if
// the server counts no more (of those it had delivered when it counted,
// and still has), and its first unacked message is one of ours, nobody
// else holds one. (The count alone is fooled by a late ack, elsewhere, of
// a message redelivered here; the first unacked message catches what that
// hides most often. Counting a message the stream has removed meanwhile
// would hide one more.)
func (g *gates) othersSettled(a consumerAnswer) bool {
	if a.unacked == 0 {
		return true
	}
	return a.first != 0 && g.holdsUnacked(a.first) && a.unacked <= g.unacked(a.delivered, a.first)
}

// unacked counts the messages held here, not acked, delivered by the time
// of a consumer info whose last delivery sequence is upTo, and at or after
// the stream sequence from (the first unacked message: those before it are
// acked or gone from the stream): what that info's unacked count should
// include of ours.
func (g *gates) unacked(upTo, from uint64) int {
	n := 0
	for _, d := range g.held {
		if !d.ackSent && d.dseq <= upTo && d.key.seq >= from {
			n++
		}
	}
	return n
}

// holdsUnacked reports whether the message seq is held here and not acked.
func (g *gates) holdsUnacked(seq uint64) bool {
	d, ok := g.held[seq]
	return ok && !d.ackSent
}

// liftable reports whether lift(n, a) would lift the fence.
func (g *gates) liftable(n int, a consumerAnswer) bool {
	return g.fences == n && !g.stopping && g.othersSettled(a)
}

// lift ends fence n if it is still the current one and a, the server's
// answer, shows every unacked message held here. It returns whether the
// fence was lifted and what may start now.
func (g *gates) lift(n int, a consumerAnswer) (lifted bool, start []*delivery) {
	if !g.liftable(n, a) {
		return false, nil
	}
	g.fenced = false
	for subject, k := range g.keys {
		// A message handed back before the fence is either held here now
		// or was acked meanwhile.
		k.awaiting = nil
		start = g.pump(subject, k, start)
	}
	return true, start
}

// pinAnswer applies the server's answer to "is pin, refused or stale, the
// partition's pin?": current is the pin the server has. A pin of ours the
// server no longer has means the partition is lost: what no handler has
// started is returned, to be handed back to the new owner, and leaves the
// book. A lost pin the server has again (the refusal was for an older
// request) is ours again.
func (g *gates) pinAnswer(pin, current string) (lost bool, back []*delivery) {
	if pin == g.lostPin {
		if current == pin {
			g.lostPin = "" // its next message starts a term
		}
		return false, nil
	}
	if g.pin != pin || current == pin {
		return false, nil
	}
	g.lostPin = g.pin
	g.pin = ""
	g.fence() // a running fence check stands down
	for subject, k := range g.keys {
		for _, d := range k.waiting {
			delete(g.held, d.key.seq)
			back = append(back, d)
		}
		k.waiting = nil
		k.awaiting = nil // the new owner gets them back
		if len(k.out) == 0 && k.running == nil {
			delete(g.keys, subject)
		}
	}
	return true, back
}

// awaited is a key waiting for a handed-back message to come back.
type awaited struct {
	subject string
	seq     uint64
	since   time.Time
}

// overdue lists the keys that have waited longer than limit for a message
// to come back (unless fenced: then nothing starts anyway).
func (g *gates) overdue(now time.Time, limit time.Duration) []awaited {
	if g.fenced {
		return nil
	}
	var out []awaited
	for subject, k := range g.keys {
		if len(k.awaiting) > 0 && now.Sub(k.awaitingSince) > limit {
			out = append(out, awaited{subject, k.awaiting[0], k.awaitingSince})
		}
	}
	return out
}

// goneAnswer applies the stream leader's answer on whether the message w
// waits for still exists (exists, gone: neither when the leader did not
// answer). Retention may have removed it: it will never
// come back. It takes two "gone" answers in a row, a check apart (the
// server answers "not found" for a store error too), for the key to move
// on: moved reports it did, and start what may start now.
//
// A message that exists and has not come back in the time overdue allows
// may be acked at the server (an ack an earlier owner sent late, after
// the message was delivered here again): it would never come back. The
// partition then fences (fenced reports it; the caller runs the check),
// and the lift forgets what keys wait for, once every unacked message is
// held here.
func (g *gates) goneAnswer(w awaited, exists, gone bool) (moved bool, start []*delivery, fenced bool) {
	k := g.keys[w.subject]
	switch {
	case k == nil || len(k.awaiting) == 0 || k.awaiting[0] != w.seq:
	case !gone:
		k.goneOnce = 0
		if exists && !g.fenced && !g.stopping && g.pin != "" {
			g.fence()
			return false, nil, true
		}
	case k.goneOnce != w.seq:
		k.goneOnce = w.seq
	default:
		k.unawait(w.seq)
		k.goneOnce = 0
		return true, g.pump(w.subject, k, nil), false
	}
	return false, nil, false
}

// stop marks the partition ending: nothing more starts or is taken in.
func (g *gates) stop() { g.stopping = true }

// resign gives the term up, once Receive has ended, and returns the pin it
// had ("" if none).
func (g *gates) resign() (pin string) {
	pin, g.pin = g.pin, ""
	return pin
}

// each calls f for every message held here.
func (g *gates) each(f func(*delivery)) {
	for _, d := range g.held {
		f(d)
	}
}
