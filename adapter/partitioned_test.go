package adapter

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// The acks a reconnect sends again are those confirmed within
// recentAckAge, at most recentAckCap of them, oldest first, each of its
// kind (a term stays a term).
func TestRecentAcksKeepsTheLatest(t *testing.T) {
	subjects := func(a *recentAcks) []string {
		var out []string
		for _, e := range a.live() {
			out = append(out, e.subject)
		}
		return out
	}
	var a recentAcks
	t0 := time.Unix(1000, 0)
	a.add("old", ackAck, t0)
	a.add("older-than-age-soon", ackTerminate, t0.Add(time.Second))
	now := t0.Add(recentAckAge + 500*time.Millisecond)
	a.add("new", ackAck, now)
	if want := []string{"older-than-age-soon", "new"}; !slices.Equal(subjects(&a), want) {
		t.Fatalf("after an ack older than %v: %q, want %q", recentAckAge, subjects(&a), want)
	}
	if k := a.live()[0].kind; k != ackTerminate {
		t.Fatalf("a term kept as kind %v, want ackTerminate", k)
	}
	a.prune(now.Add(recentAckAge), 0)
	if want := []string{"new"}; !slices.Equal(subjects(&a), want) {
		t.Fatalf("pruned %v later: %q, want %q", recentAckAge, subjects(&a), want)
	}

	a = recentAcks{}
	for i := range recentAckCap + 10 {
		a.add(fmt.Sprint(i), ackAck, t0)
	}
	live := subjects(&a)
	if len(live) != recentAckCap || a.len() != recentAckCap {
		t.Fatalf("%d subjects kept (len %d), want %d", len(live), a.len(), recentAckCap)
	}
	if live[0] != "10" || live[recentAckCap-1] != fmt.Sprint(recentAckCap+9) {
		t.Fatalf("kept %s..%s, want the newest: 10..%d", live[0], live[recentAckCap-1], recentAckCap+9)
	}
}
