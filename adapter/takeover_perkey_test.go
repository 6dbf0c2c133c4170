package adapter

import (
	"testing"
	"time"
)

// A sweep's hold check: the receiver answers for what it holds, whatever
// delivery of it; every other message it revokes up to the delivery the
// sweep saw, so a late arrival of that delivery is dropped and only the
// redelivery the nack brings runs.
func TestAnswerHoldCheck(t *testing.T) {
	r := &receiver{held: map[heldKey]*delivery{}, revoked: map[heldKey]revocation{}, lastAcks: map[string]lastAck{}}
	heldMsg := heldKey{consumer: "c1", seq: 10}
	r.held[heldMsg] = &delivery{}

	got := string(r.answerHoldCheck([]byte("c1 10 3\nc2 20 7\nbroken line\nc3 x 1\n")))
	if got != "c1 10\n" {
		t.Fatalf("answer %q, want only the held message", got)
	}
	onTheWay := heldKey{consumer: "c2", seq: 20}
	for _, tt := range []struct {
		key  heldKey
		dseq uint64
		want bool
	}{
		{onTheWay, 7, true},  // the delivery the sweep saw, arriving late
		{onTheWay, 6, true},  // an older one
		{onTheWay, 8, false}, // the redelivery after the nack
		{heldMsg, 3, false},  // held: nothing revoked
		{heldKey{"c3", 1}, 1, false},
	} {
		if got := r.revokedLocked(tt.key, tt.dseq); got != tt.want {
			t.Errorf("revoked(%v, dseq %d) = %v, want %v", tt.key, tt.dseq, got, tt.want)
		}
	}

	// A later check of the same message never lowers what is revoked.
	r.answerHoldCheck([]byte("c2 20 5\n"))
	if !r.revokedLocked(onTheWay, 7) {
		t.Fatal("a later check with an older delivery lowered the revocation")
	}

	// Revocations are forgotten after revocationLife.
	rv := r.revoked[onTheWay]
	rv.at = time.Now().Add(-revocationLife - time.Second)
	r.revoked[onTheWay] = rv
	r.forgetRevocations()
	if r.revokedLocked(onTheWay, 7) {
		t.Fatal("an old revocation was kept")
	}
}

// A message a handler acked lately, or one before it of its key, is
// answered as acked, so a receiver given its redelivery acks that again
// unseen; a sweep counts it as not held (its ack may be one a restarted
// server lost). A later message of the key is not.
func TestAnswerHoldCheckAcked(t *testing.T) {
	r := &receiver{held: map[heldKey]*delivery{}, revoked: map[heldKey]revocation{}, lastAcks: map[string]lastAck{}, checking: map[heldKey]uint64{}}
	d := &delivery{key: heldKey{consumer: "c1", seq: 10}}
	r.held[d.key] = d
	r.noteAck(d)
	if got := parseHoldAnswer(r.answerHoldCheck([]byte("c1 10 3\n"))); len(got) != 1 || !got[d.key].held() {
		t.Fatalf("held and acked: answer %v, want held", got)
	}
	delete(r.held, d.key)
	got := parseHoldAnswer(r.answerHoldCheck([]byte("c1 10 3\nc1 9 2\nc1 11 4\nc2 10 3\n")))
	before := heldKey{consumer: "c1", seq: 9}
	if len(got) != 2 || !got[d.key].acked || !got[before].acked {
		t.Fatalf("acked: answer %v, want messages 9 and 10 of c1 acked, and nothing else", got)
	}
	r.lastAcks["c1"] = lastAck{seq: 10, at: time.Now().Add(-revocationLife - time.Second)}
	r.forgetRevocations()
	if got := r.answerHoldCheck([]byte("c1 10 3\n")); len(got) != 0 {
		t.Fatalf("an old ack was kept: answer %q", got)
	}
}

// Two receivers checking copies of one message at once (a deposed
// consumer leader's and its successor's) answer "checking" with their
// delivery number, revoke nothing, and settle it alike from both ends:
// the later delivery runs, and of two with one number the copy of the
// receiver whose id sorts first.
func TestHoldCheckWhileChecking(t *testing.T) {
	k := heldKey{consumer: "c1", seq: 10}
	newReceiver := func(id string) *receiver {
		return &receiver{presence: &presence{id: id}, held: map[heldKey]*delivery{}, revoked: map[heldKey]revocation{},
			lastAcks: map[string]lastAck{}, checking: map[heldKey]uint64{k: 7}}
	}
	a, b := newReceiver("a"), newReceiver("b")
	got := parseHoldAnswer(a.answerHoldCheck([]byte("c1 10 7\n")))
	if l := got[k]; len(got) != 1 || !l.checking || l.dseq != 7 || l.acked || !l.held() {
		t.Fatalf("answer %+v, want c1 10 checking 7", got)
	}
	if a.revokedLocked(k, 7) {
		t.Fatal("a hold check revoked the copy being checked")
	}
	// Asked about a later delivery (a redelivery elsewhere), the copy
	// being checked is stale: not named (a sweep nacks the message) and
	// revoked, so it is dropped should its own check let it through; a
	// twin asked about then is not held here either.
	if got := a.answerHoldCheck([]byte("c1 10 8\n")); len(got) != 0 || !a.revokedLocked(k, 7) {
		t.Fatalf("asked about delivery 8 while checking 7: answer %q, revoked %v; want none, and revoked", got, a.revokedLocked(k, 7))
	}
	if got := a.answerHoldCheck([]byte("c1 10 7\n")); len(got) != 0 {
		t.Fatalf("asked about a twin of a revoked copy: answer %q, want none", got)
	}
	for _, tt := range []struct {
		mine, theirs uint64
		aYields      bool
	}{
		{7, 7, false}, // one number: "a" sorts first and keeps its copy
		{7, 8, true},  // the later delivery runs
		{8, 7, false},
	} {
		if got := a.yields(tt.theirs, "b", tt.mine); got != tt.aYields {
			t.Errorf("a (dseq %d) yields to b (dseq %d): %v, want %v", tt.mine, tt.theirs, got, tt.aYields)
		}
		if got := b.yields(tt.mine, "a", tt.theirs); got == tt.aYields {
			t.Errorf("b (dseq %d) yields to a (dseq %d): %v, want %v", tt.theirs, tt.mine, got, !tt.aYields)
		}
	}
	// A sweep (askMembers) counts a member checking a copy as holding
	// the message: it does not nack it.
	if l := parseHoldAnswer([]byte("c1 10 checking 7\n"))[k]; !l.held() {
		t.Error("a checking line is not held")
	}
}
