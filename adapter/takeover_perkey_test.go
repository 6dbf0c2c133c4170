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
	r := &receiver{held: map[heldKey]*delivery{}, revoked: map[heldKey]revocation{}, lastAcks: map[string]lastAck{}}
	d := &delivery{key: heldKey{consumer: "c1", seq: 10}}
	r.held[d.key] = d
	r.noteAck(d)
	if got := parseHoldAnswer(r.answerHoldCheck([]byte("c1 10 3\n"))); len(got) != 1 || got[d.key] {
		t.Fatalf("held and acked: answer %v, want held", got)
	}
	delete(r.held, d.key)
	got := parseHoldAnswer(r.answerHoldCheck([]byte("c1 10 3\nc1 9 2\nc1 11 4\nc2 10 3\n")))
	before := heldKey{consumer: "c1", seq: 9}
	if len(got) != 2 || !got[d.key] || !got[before] {
		t.Fatalf("acked: answer %v, want messages 9 and 10 of c1 acked, and nothing else", got)
	}
	r.lastAcks["c1"] = lastAck{seq: 10, at: time.Now().Add(-revocationLife - time.Second)}
	r.forgetRevocations()
	if got := r.answerHoldCheck([]byte("c1 10 3\n")); len(got) != 0 {
		t.Fatalf("an old ack was kept: answer %q", got)
	}
}
