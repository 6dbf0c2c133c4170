package adapter

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// The gates and the fence, driven directly: each step is what a partition
// hands them (an arrival, a release, the server's answer), and each check
// is what may start.

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// msg is a delivery of key's message at stream sequence seq, delivered
// with consumer delivery sequence dseq.
func msg(key string, seq, dseq uint64) *delivery {
	return &delivery{key: heldKey{consumer: "p0", seq: seq}, subject: key, dseq: dseq}
}

func seqs(ds []*delivery) []uint64 {
	out := []uint64{}
	for _, d := range ds {
		out = append(out, d.key.seq)
	}
	return out
}

// book is gates under test with helpers that fail the test on surprises.
type book struct {
	t *testing.T
	g *gates
}

func newBook(t *testing.T) *book { return &book{t: t, g: newGates(1)} }

// arrive delivers d in the term of pin and checks what starts.
func (b *book) arrive(d *delivery, pin string, want arrivalVerdict, start ...uint64) fenceCause {
	b.t.Helper()
	v, got, cause := b.g.arrive(d, pin)
	if v != want {
		b.t.Fatalf("arrive %s|%d (pin %q): verdict %d, want %d", d.subject, d.key.seq, pin, v, want)
	}
	b.wantStart("arrive", got, start)
	return cause
}

func (b *book) release(d *delivery, settled bool, start ...uint64) {
	b.t.Helper()
	got, revoked := b.g.release(d, settled, t0)
	b.wantStart("release", got, start)
	if len(revoked) > 0 {
		b.t.Fatalf("release %s|%d revoked %v", d.subject, d.key.seq, seqs(revoked))
	}
}

// ack is a confirmed ack of d: sent, then the server has it.
func (b *book) ack(d *delivery, start ...uint64) {
	b.t.Helper()
	b.g.markAckSent(d)
	b.release(d, true, start...)
}

// lift answers the current fence check with a.
func (b *book) lift(a consumerAnswer, want bool, start ...uint64) {
	b.t.Helper()
	lifted, got := b.g.lift(b.g.fences, a)
	if lifted != want {
		b.t.Fatalf("lift %+v: lifted %v, want %v (held %d unacked)", a, lifted, want, b.g.unacked(a.delivered, 0))
	}
	b.wantStart("lift", got, start)
}

func (b *book) wantStart(step string, got []*delivery, want []uint64) {
	b.t.Helper()
	g := seqs(got)
	slices.Sort(g)
	w := slices.Clone(want)
	slices.Sort(w)
	if w == nil {
		w = []uint64{}
	}
	if !slices.Equal(g, w) {
		b.t.Fatalf("%s: started %v, want %v", step, g, w)
	}
}

// owned is a book that owns the partition under pin "A" with the fence of
// its first term lifted.
func owned(t *testing.T) *book {
	b := newBook(t)
	b.arrive(msg("warm", 1, 1), "A", admitted)
	b.lift(consumerAnswer{unacked: 1, delivered: 1, first: 1}, true, 1)
	b.ack(b.g.held[1])
	return b
}

func TestGatesOneMessagePerKey(t *testing.T) {
	b := owned(t)
	k1, k2, j3 := msg("k", 10, 2), msg("k", 11, 3), msg("j", 12, 4)
	b.arrive(k1, "A", admitted, 10)
	b.arrive(k2, "A", admitted)     // waits behind k1
	b.arrive(j3, "A", admitted, 12) // another key flows
	b.ack(k1, 11)
	b.ack(k2)
	b.ack(j3)
	if len(b.g.keys) != 0 || len(b.g.held) != 0 {
		t.Fatalf("book not empty after every ack: %d keys, %d held", len(b.g.keys), len(b.g.held))
	}
}

func TestGatesStartInStreamOrder(t *testing.T) {
	// A redelivery of an earlier message arriving after a later one (the
	// server sends a nacked message again after newer ones) goes first.
	b := owned(t)
	a := msg("k", 10, 2)
	b.arrive(a, "A", admitted, 10)
	b.release(a, false) // nacked: the key waits for it
	b.arrive(msg("k", 11, 3), "A", admitted)
	b.arrive(msg("k", 10, 4), "A", admitted, 10)
}

func TestGatesAckNotConfirmedHoldsKey(t *testing.T) {
	// An ack sent but not yet confirmed keeps the key's next message back.
	b := owned(t)
	k1 := msg("k", 10, 2)
	b.arrive(k1, "A", admitted, 10)
	b.g.markAckSent(k1)
	b.arrive(msg("k", 11, 3), "A", admitted)
	b.release(k1, true, 11)
}

func TestGatesNackedWaitsForRedelivery(t *testing.T) {
	b := owned(t)
	k1 := msg("k", 10, 2)
	b.arrive(k1, "A", admitted, 10)
	b.arrive(msg("k", 11, 3), "A", admitted)
	b.release(k1, false) // nacked: 11 must not overtake it
	if got := b.g.keys["k"].awaiting; !slices.Equal(got, []uint64{10}) {
		t.Fatalf("awaiting %v, want [10]", got)
	}
	b.arrive(msg("k", 10, 4), "A", admitted, 10)
}

func TestGatesLateAckOfAbandonedMessage(t *testing.T) {
	// The handler returned without an ack (abandoned), then the app acked
	// it: the key no longer waits for it to come back.
	b := owned(t)
	k1 := msg("k", 10, 2)
	b.arrive(k1, "A", admitted, 10)
	b.arrive(msg("k", 11, 3), "A", admitted)
	b.release(k1, false)
	b.release(k1, true, 11) // the late ack, confirmed
	// The server lost that ack (a restart after a crash) and delivers
	// k|10 again: acked again unseen, as an ack made in the handler is.
	b.arrive(msg("k", 10, 4), "A", acked)
}

func TestGatesRedeliveredHeldMessage(t *testing.T) {
	// A message whose deadline passed while it waited here comes again:
	// the copy held is kept, under the newest delivery sequence, and
	// nothing starts twice.
	b := owned(t)
	k1, k2 := msg("k", 10, 2), msg("k", 11, 3)
	b.arrive(k1, "A", admitted, 10)
	b.arrive(k2, "A", admitted)
	b.arrive(msg("k", 11, 4), "A", duplicate)
	if k2.dseq != 4 {
		t.Fatalf("held copy has dseq %d, want the redelivery's 4", k2.dseq)
	}
	// The fence counts it by that sequence: an info from before the
	// redelivery does not count it.
	if n := b.g.unacked(3, 0); n != 1 {
		t.Fatalf("unacked up to dseq 3: %d, want 1 (only k|10)", n)
	}
	b.ack(k1, 11)
}

func TestGatesNewTermFences(t *testing.T) {
	// A new pin: the previous owner may still run a message of any key,
	// so nothing starts until the server counts no unacked message
	// outside our hands.
	b := owned(t)
	k1 := msg("k", 10, 1)
	if cause := b.arrive(k1, "B", admitted); cause != newTerm {
		t.Fatalf("cause %d, want newTerm", cause)
	}
	// The old owner still holds k|9: the server counts 2 unacked.
	b.lift(consumerAnswer{unacked: 2, delivered: 1, first: 9}, false)
	// k|9 acked by the old owner: only ours is left.
	b.lift(consumerAnswer{unacked: 1, delivered: 1, first: 10}, true, 10)
}

func TestGatesFenceFirstUnackedMustBeOurs(t *testing.T) {
	// A late ack elsewhere fools the count: the old owner acked 12 after
	// the server had redelivered it here (so the server counts it acked,
	// while we hold it unacked), and it still runs 11. The server counts
	// 11 and 14 unacked; we hold 12 and 14 at or after 11: the count
	// matches, but the first unacked message, 11, is not ours.
	b := owned(t)
	b.arrive(msg("k", 12, 2), "B", admitted)
	b.arrive(msg("j", 14, 3), "B", admitted)
	b.lift(consumerAnswer{unacked: 2, delivered: 3, first: 11}, false)
	b.lift(consumerAnswer{unacked: 2, delivered: 3}, false) // first not looked up
	b.lift(consumerAnswer{unacked: 1, delivered: 3, first: 14}, true, 12, 14)
}

func TestGatesFenceIgnoresOursBelowFirst(t *testing.T) {
	// We hold 10, which the server counts acked (a late ack elsewhere),
	// and 12, the first unacked; the old owner still runs 13. Counting 10
	// would match the server's 2.
	b := owned(t)
	b.arrive(msg("k", 10, 2), "B", admitted)
	b.arrive(msg("j", 12, 3), "B", admitted)
	b.lift(consumerAnswer{unacked: 2, delivered: 3, first: 12}, false)
	b.lift(consumerAnswer{unacked: 1, delivered: 3, first: 12}, true, 10, 12)
}

func TestGatesNewTermForgetsAwaited(t *testing.T) {
	// k|10 was nacked in our term A; the partition went elsewhere, where
	// 10 was acked, and came back (term B). Once the fence lifts, k does
	// not wait for 10 to come back: it is held here or acked.
	b := owned(t)
	k10 := msg("k", 10, 2)
	b.arrive(k10, "A", admitted, 10)
	b.arrive(msg("k", 11, 3), "A", admitted)
	b.release(k10, false)
	b.arrive(msg("j", 20, 6), "B", admitted)
	b.lift(consumerAnswer{unacked: 2, delivered: 6, first: 11}, true, 11, 20)
}

func TestGatesFenceCountsOnlyWhatTheInfoSaw(t *testing.T) {
	// Messages delivered after the consumer info was taken are not in its
	// count: counting them would let a message of the old owner hide.
	b := owned(t)
	b.arrive(msg("k", 10, 1), "B", admitted)
	b.arrive(msg("j", 11, 2), "B", admitted)
	// The info saw delivery 1 only, and 2 unacked: 10 (ours) and 9 (the
	// old owner's), whose place 11 would take if counted.
	a := consumerAnswer{unacked: 2, delivered: 1, first: 10}
	if b.g.needsFirst(a) {
		t.Fatalf("needsFirst: the count cannot match (1 of ours seen by the info, 2 unacked)")
	}
	b.lift(a, false)
}

func TestGatesAckSentIsNotCountedUnacked(t *testing.T) {
	// j|12 runs in a handler of our term A. The partition went to another
	// process for a moment (which was sent 13, still in its handler) and
	// came back to us in term B with k|11. Our handler acks 12: the server
	// has the ack and counts 11 and 13 unacked. Counting 12 as unacked
	// would match that count, and start 11's key beside 13.
	b := owned(t)
	m12 := msg("j", 12, 2)
	b.arrive(m12, "A", admitted, 12)
	b.arrive(msg("k", 11, 4), "B", admitted)
	b.g.markAckSent(m12)
	b.lift(consumerAnswer{unacked: 2, delivered: 4, first: 11}, false)
	b.release(m12, true) // confirmed
	b.lift(consumerAnswer{unacked: 1, delivered: 4, first: 11}, true, 11)
}

func TestGatesLostDeliveryFences(t *testing.T) {
	// Within a term a gap in the delivery sequence means a delivery was
	// lost on the way: the server counts it as ours while no gate holds
	// it. The next message of its key must not start.
	b := owned(t) // term A, last dseq 1
	k1 := msg("k", 10, 2)
	b.arrive(k1, "A", admitted, 10)
	b.ack(k1)
	// dseq 3 (k|11) was lost; 4 (k|12) arrives.
	if cause := b.arrive(msg("k", 12, 4), "A", admitted); cause != lostGap {
		t.Fatalf("cause %d, want lostGap", cause)
	}
	// 11 is unacked at the server and not here.
	b.lift(consumerAnswer{unacked: 2, delivered: 4, first: 11}, false)
	// 11 comes back at its deadline.
	b.arrive(msg("k", 11, 5), "A", admitted)
	b.lift(consumerAnswer{unacked: 2, delivered: 5, first: 11}, true, 11)
}

func TestGatesStaleFenceCheckStandsDown(t *testing.T) {
	b := owned(t)
	b.arrive(msg("k", 10, 1), "B", admitted)
	stale := b.g.fences
	b.arrive(msg("k", 11, 1), "C", admitted) // another term began
	if lifted, _ := b.g.lift(stale, consumerAnswer{}); lifted {
		t.Fatal("a stale fence check lifted the fence of a newer term")
	}
}

func TestGatesPinRefused(t *testing.T) {
	t.Run("older pin of ours: still the owner", func(t *testing.T) {
		b := owned(t)
		lost, back := b.g.pinAnswer("A", "A")
		if lost || back != nil || b.g.pin != "A" {
			t.Fatalf("lost %v, back %d, pin %q: want the partition kept", lost, len(back), b.g.pin)
		}
	})
	t.Run("another owner: waiting messages go back", func(t *testing.T) {
		b := owned(t)
		k1, k2, k3 := msg("k", 10, 2), msg("k", 11, 3), msg("j", 12, 4)
		b.arrive(k1, "A", admitted, 10)
		b.arrive(k2, "A", admitted)
		b.arrive(k3, "A", admitted, 12)
		b.release(k3, false) // j awaits 12's return
		lost, back := b.g.pinAnswer("A", "B")
		if !lost {
			t.Fatal("partition not lost to B")
		}
		if got := seqs(back); !slices.Equal(got, []uint64{11}) {
			t.Fatalf("handed back %v, want [11] (k|10 stays in its handler)", got)
		}
		if !b.g.fenced || b.g.pin != "" || b.g.lostPin != "A" {
			t.Fatalf("fenced %v pin %q lostPin %q", b.g.fenced, b.g.pin, b.g.lostPin)
		}
		// Its handler's message is still extended here until acked.
		if !b.g.holds(k1) {
			t.Fatal("k|10 no longer held: its deadline would pass while its handler runs")
		}
		// A late arrival of the lost term is nacked, not started.
		b.arrive(msg("x", 13, 5), "A", staleTerm)
		// The ack of k|10 starts nothing here.
		b.ack(k1)
	})
	t.Run("lost pin given back", func(t *testing.T) {
		b := owned(t)
		b.g.pinAnswer("A", "B")
		lost, _ := b.g.pinAnswer("A", "A")
		if lost || b.g.lostPin != "" {
			t.Fatalf("lostPin %q after the server gave A back", b.g.lostPin)
		}
		// The next message of A starts a term, fenced.
		if cause := b.arrive(msg("k", 20, 6), "A", admitted); cause != newTerm {
			t.Fatalf("cause %d, want newTerm", cause)
		}
	})
	t.Run("answer about a pin no longer current", func(t *testing.T) {
		b := owned(t)
		b.arrive(msg("k", 10, 1), "C", admitted)
		if lost, _ := b.g.pinAnswer("A", "B"); lost {
			t.Fatal("an answer about an older pin gave up the current term")
		}
	})
}

func TestGatesMessageRemovedByRetention(t *testing.T) {
	b := owned(t)
	k1 := msg("k", 10, 2)
	b.arrive(k1, "A", admitted, 10)
	b.arrive(msg("k", 11, 3), "A", admitted)
	b.release(k1, false)
	if got := b.g.overdue(t0.Add(time.Second), 2*time.Second); len(got) != 0 {
		t.Fatalf("overdue before the limit: %v", got)
	}
	due := b.g.overdue(t0.Add(3*time.Second), 2*time.Second)
	if len(due) != 1 || due[0].seq != 10 {
		t.Fatalf("overdue %v, want k|10", due)
	}
	w := due[0]
	if moved, _, _ := b.g.goneAnswer(w, false, true); moved {
		t.Fatal("moved on after one 'not found' (a store error answers that too)")
	}
	if moved, _, fenced := b.g.goneAnswer(w, false, false); moved || fenced {
		t.Fatalf("no answer: moved %v, fenced %v, want neither", moved, fenced)
	}
	b.g.goneAnswer(w, false, true)
	moved, start, _ := b.g.goneAnswer(w, false, true)
	if !moved || !slices.Equal(seqs(start), []uint64{11}) {
		t.Fatalf("moved %v, started %v: want k|11 after two 'not found' in a row", moved, seqs(start))
	}
}

func TestGatesAwaitedMessageAckedAtTheServer(t *testing.T) {
	// k|10 was nacked here, but the server has it acked (an earlier
	// owner's ack that arrived late): it never comes back. Once overdue,
	// the stream still having it, the partition fences; the lift, every
	// unacked message held here, lets k|11 start.
	b := owned(t)
	k1 := msg("k", 10, 2)
	b.arrive(k1, "A", admitted, 10)
	b.arrive(msg("k", 11, 3), "A", admitted)
	b.release(k1, false)
	w := b.g.overdue(t0.Add(3*time.Second), 2*time.Second)[0]
	moved, start, fenced := b.g.goneAnswer(w, true, false)
	if moved || len(start) != 0 || !fenced {
		t.Fatalf("the message exists: moved %v, started %v, fenced %v; want a fence only", moved, seqs(start), fenced)
	}
	if _, _, again := b.g.goneAnswer(w, true, false); again {
		t.Fatal("fenced again while fenced")
	}
	// While the server still counts k|10 unacked (not held here), the
	// fence stays: it comes back, and starts first.
	b.lift(consumerAnswer{unacked: 2, delivered: 3, first: 10}, false)
	// The server has k|10 acked: only k|11, held here, is unacked.
	b.lift(consumerAnswer{unacked: 1, delivered: 3, first: 11}, true, 11)
}

func TestGatesServerLostAcks(t *testing.T) {
	// The NATS server restarted after a crash with an older state of the
	// consumer: k|10 and k|11 were acked here (and confirmed), but the
	// server delivers them again while k|12 is in a handler. Handing them
	// to a handler would put them after k|12: they are acked again, unseen.
	b := owned(t)
	k10, k11, k12 := msg("k", 10, 2), msg("k", 11, 3), msg("k", 12, 4)
	b.arrive(k10, "A", admitted, 10)
	b.ack(k10)
	b.arrive(k11, "A", admitted, 11)
	b.ack(k11)
	b.arrive(k12, "A", admitted, 12)
	b.arrive(msg("k", 10, 1), "B", acked)
	b.arrive(msg("k", 11, 2), "B", acked)
	b.arrive(msg("k", 12, 3), "B", duplicate)
	// Another key's messages are not affected, nor k's later ones.
	b.arrive(msg("j", 9, 4), "B", admitted)
	b.arrive(msg("k", 13, 5), "B", admitted)
	// A message nacked (not acked) comes back as itself.
	b.lift(consumerAnswer{unacked: 3, delivered: 5, first: 9}, true, 9)
	b.release(k12, false)
	b.arrive(msg("k", 12, 6), "B", admitted, 12)
}

func TestGatesRemembersAcksOfBoundedKeys(t *testing.T) {
	b := owned(t)
	for i := range doneCap + 1 {
		d := msg(fmt.Sprintf("key-%d", i), uint64(100+i), uint64(2+i))
		b.arrive(d, "A", admitted, d.key.seq)
		b.ack(d)
	}
	if len(b.g.done) != doneCap || len(b.g.doneOrder) != doneCap {
		t.Fatalf("remembers %d keys (%d in order), want at most %d", len(b.g.done), len(b.g.doneOrder), doneCap)
	}
	if _, ok := b.g.done["key-0"]; ok {
		t.Fatal("the oldest key was not forgotten")
	}
}

func TestGatesStopping(t *testing.T) {
	b := owned(t)
	k1 := msg("k", 10, 2)
	b.arrive(k1, "A", admitted, 10)
	b.arrive(msg("k", 11, 3), "A", admitted)
	b.g.stop()
	b.ack(k1) // nothing more starts
	b.arrive(msg("j", 12, 4), "A", handBack)
	b.arrive(msg("k", 11, 5), "A", duplicate) // still held: not handed back beside nothing
	if pin := b.g.resign(); pin != "A" {
		t.Fatalf("resign: pin %q, want A", pin)
	}
}

func TestGatesFencedHandBackDoesNotAwait(t *testing.T) {
	// A message handed back while fenced (a handler of the last term) is
	// either held again or acked by the time the fence lifts: the key does
	// not wait for it.
	b := owned(t)
	k1 := msg("k", 10, 2)
	b.arrive(k1, "A", admitted, 10)
	b.arrive(msg("k", 11, 1), "B", admitted)
	b.release(k1, false)
	b.lift(consumerAnswer{unacked: 1, delivered: 1, first: 11}, true, 11)
}

// pipelined is an owned partition's book with a key window of window.
func pipelined(t *testing.T, window int) *book {
	b := owned(t)
	b.g.window = window
	return b
}

func (b *book) handOver(d *delivery, start ...uint64) {
	b.t.Helper()
	b.wantStart("hand over", b.g.handOver(d), start)
}

// ackMade is the application's ack of d; want is the acks that may go.
func (b *book) ackMade(d *delivery, want ...uint64) {
	b.t.Helper()
	send, revoked := b.g.ackMade(d)
	if revoked {
		b.t.Fatalf("ack of %s|%d: revoked", d.subject, d.key.seq)
	}
	if got := seqs(send); !slices.Equal(got, append([]uint64{}, want...)) {
		b.t.Fatalf("ack of %s|%d sends %v, want %v", d.subject, d.key.seq, got, want)
	}
}

func TestGatesPipelinedStartsOnHandOverUpToWindow(t *testing.T) {
	b := pipelined(t, 3)
	k := []*delivery{msg("k", 10, 2), msg("k", 11, 3), msg("k", 12, 4), msg("k", 13, 5)}
	b.arrive(k[0], "A", admitted, 10)
	b.arrive(k[1], "A", admitted) // 10 is still in its handler
	b.arrive(k[2], "A", admitted)
	b.arrive(k[3], "A", admitted)
	b.handOver(k[0], 11) // unacked: 11 starts all the same
	b.handOver(k[1], 12)
	b.handOver(k[2]) // the window (3) is full
	b.ackMade(k[0], 10)
	b.release(k[0], true, 13) // confirmed: room for 13
	if got := seqs(b.g.keys["k"].out); !slices.Equal(got, []uint64{11, 12, 13}) {
		t.Fatalf("out %v, want [11 12 13]", got)
	}
}

func TestGatesPipelinedAcksGoInOrder(t *testing.T) {
	b := pipelined(t, 10)
	k10, k11, k12 := msg("k", 10, 2), msg("k", 11, 3), msg("k", 12, 4)
	b.arrive(k10, "A", admitted, 10)
	b.arrive(k11, "A", admitted)
	b.arrive(k12, "A", admitted)
	b.handOver(k10, 11)
	b.handOver(k11, 12)
	b.ackMade(k12)             // waits for 10 and 11
	b.ackMade(k11)             // waits for 10
	b.ackMade(k10, 10, 11, 12) // all three go, in order
	if n := b.g.unacked(10, 0); n != 0 {
		t.Fatalf("fence counts %d unacked after the acks went", n)
	}
}

func TestGatesPipelinedNackBringsBackTheLaterOnes(t *testing.T) {
	b := pipelined(t, 10)
	k10, k11, k12, k13 := msg("k", 10, 2), msg("k", 11, 3), msg("k", 12, 4), msg("k", 13, 5)
	for _, d := range []*delivery{k10, k11, k12, k13} {
		b.g.arrive(d, "A")
	}
	b.handOver(k10, 11)
	b.handOver(k11, 12) // 12 is in its handler; 13 waits
	b.ackMade(k11)      // waits for 10

	start, revoked := b.g.release(k10, false, t0) // 10 nacked
	if len(start) != 0 || !slices.Equal(seqs(revoked), []uint64{11, 12}) {
		t.Fatalf("nack of 10: start %v, revoked %v; want none, [11 12]", seqs(start), seqs(revoked))
	}
	if !k11.revoked || !k12.revoked {
		t.Fatal("11 and 12 not marked revoked")
	}
	if send, rev := b.g.ackMade(k12); len(send) != 0 || !rev {
		t.Fatalf("ack of revoked 12: sends %v, revoked %v", seqs(send), rev)
	}
	if got := b.g.keys["k"].awaiting; !slices.Equal(got, []uint64{10, 11, 12}) {
		t.Fatalf("awaiting %v, want [10 11 12]", got)
	}
	// The redeliveries come back in any order; nothing starts until all
	// are here and 12's old handler is done.
	b.arrive(msg("k", 12, 6), "A", admitted)
	b.arrive(msg("k", 10, 7), "A", admitted)
	b.arrive(msg("k", 11, 8), "A", admitted)
	b.handOver(k12, 10) // the old 12's handler returns: 10 starts again
	if got := seqs(b.g.keys["k"].waiting); !slices.Equal(got, []uint64{11, 12, 13}) {
		t.Fatalf("waiting %v, want [11 12 13]", got)
	}
}

func TestGatesPipelinedNackOfTheLastRevokesNothing(t *testing.T) {
	b := pipelined(t, 10)
	k10, k11 := msg("k", 10, 2), msg("k", 11, 3)
	b.arrive(k10, "A", admitted, 10)
	b.arrive(k11, "A", admitted)
	b.handOver(k10, 11)
	b.release(k11, false) // 11 nacked; 10 stays out
	b.ackMade(k10, 10)
	b.release(k10, true)
	b.arrive(msg("k", 11, 4), "A", admitted, 11)
}
