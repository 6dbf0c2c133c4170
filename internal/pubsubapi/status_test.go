package pubsubapi

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jetorder/jetorder/adapter"
	jstatus "github.com/jetorder/jetorder/internal/status"
)

// Recent counts cover the last window and forget what is older.
func TestRecentCounts(t *testing.T) {
	var r recentCounts
	r.add("s", recentRedelivered)
	r.add("s", recentRedelivered)
	r.add("s", recentDeadLettered)
	now := time.Now()
	if re, dl := r.sums("s", now); re != 2 || dl != 1 {
		t.Fatalf("sums now = %d, %d; want 2, 1", re, dl)
	}
	if re, dl := r.sums("other", now); re != 0 || dl != 0 {
		t.Fatalf("sums of another = %d, %d", re, dl)
	}
	later := now.Add(recentBucket * time.Duration(recentBuckets+1))
	if re, dl := r.sums("s", later); re != 0 || dl != 0 {
		t.Fatalf("sums after the window = %d, %d; want 0, 0", re, dl)
	}
	if len(r.subs) != 0 {
		t.Errorf("%d windows kept after the window passed", len(r.subs))
	}
}

// What a dispatcher holds, as the status shows it: keys in flight, the
// highest delivery attempt, and the paused keys, at most MaxPausedKeys of
// them, most deliveries first, each once.
func TestDispatcherLocal(t *testing.T) {
	d := &dispatcher{keys: map[string]int{}, leases: map[uint64]*lease{}, streams: map[*pullStream]struct{}{},
		paused: map[*lease]struct{}{}, pausedKeys: map[string]int{}}
	now := time.Now()
	var held []*lease
	hold := func(key string, attempt int) {
		l := &lease{msg: &adapter.Message{OrderingKey: key, DeliveryAttempt: attempt, ID: fmt.Sprint(key, attempt)}, heldAt: now}
		d.hold(l)
		held = append(held, l)
	}
	for i := range 30 {
		hold(fmt.Sprintf("k%02d", i), 3+i) // paused: k29 has the most deliveries
	}
	hold("k05", 40)  // a second message of k05, delivered the most of all
	hold("fresh", 1) // not paused
	hold("", 7)      // unkeyed: counts for the attempt, not as a key
	var sub jstatus.Subscription
	d.local(&sub, now)
	if sub.KeysInFlight != 31 || sub.PausedKeys != 30 || sub.MaxDeliveryAttempt != 40 {
		t.Fatalf("keys %d, paused keys %d, max attempt %d; want 31, 30, 40", sub.KeysInFlight, sub.PausedKeys, sub.MaxDeliveryAttempt)
	}
	var got []string
	for _, p := range sub.Paused {
		got = append(got, fmt.Sprintf("%s:%d", p.Key, p.DeliveryAttempt))
	}
	want := []string{"k05:40"}
	for i := 29; len(want) < jstatus.MaxPausedKeys; i-- {
		if i != 5 {
			want = append(want, fmt.Sprintf("k%02d:%d", i, 3+i))
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("paused = %v\nwant %v", got, want)
	}
	for _, l := range held {
		d.unhold(l)
	}
	sub = jstatus.Subscription{}
	d.local(&sub, now)
	if sub.KeysInFlight != 0 || sub.PausedKeys != 0 || sub.MaxDeliveryAttempt != 0 || len(sub.Paused) != 0 || len(d.paused) != 0 {
		t.Errorf("after every message went: %+v", sub)
	}
}
