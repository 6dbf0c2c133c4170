package adapter

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// The acks a reconnect sends again are those confirmed within
// recentAckAge, at most recentAckCap of them, oldest first.
func TestRecentAcksKeepsTheLatest(t *testing.T) {
	var a recentAcks
	t0 := time.Unix(1000, 0)
	a.add("old", t0)
	a.add("older-than-age-soon", t0.Add(time.Second))
	now := t0.Add(recentAckAge + 500*time.Millisecond)
	a.add("new", now)
	if want := []string{"older-than-age-soon", "new"}; !slices.Equal(a.live(), want) {
		t.Fatalf("after an ack older than %v: %q, want %q", recentAckAge, a.live(), want)
	}
	a.prune(now.Add(recentAckAge), 0)
	if want := []string{"new"}; !slices.Equal(a.live(), want) {
		t.Fatalf("pruned %v later: %q, want %q", recentAckAge, a.live(), want)
	}

	a = recentAcks{}
	for i := range recentAckCap + 10 {
		a.add(fmt.Sprint(i), t0)
	}
	live := a.live()
	if len(live) != recentAckCap || len(a.at)-a.head != recentAckCap {
		t.Fatalf("%d subjects, %d times kept, want %d", len(live), len(a.at)-a.head, recentAckCap)
	}
	if live[0] != "10" || live[recentAckCap-1] != fmt.Sprint(recentAckCap+9) {
		t.Fatalf("kept %s..%s, want the newest: 10..%d", live[0], live[recentAckCap-1], recentAckCap+9)
	}
}
