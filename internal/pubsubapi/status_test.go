package pubsubapi

import (
	"testing"
	"time"
)

func TestConsumerOf(t *testing.T) {
	for _, tc := range []struct {
		desc      string
		sub       string
		partition int
		ok        bool
	}{
		{"jetorder projects/p/subscriptions/sub", "projects/p/subscriptions/sub", -1, true},
		{"jetorder projects/p/subscriptions/sub partition 5 of 8", "projects/p/subscriptions/sub", 5, true},
		{"jetorder projects/p/subscriptions/sub partition x of 8", "projects/p/subscriptions/sub", -1, true},
		{"jetorder projects/p/topics/t", "", 0, false},
		{"someone else's", "", 0, false},
		{"", "", 0, false},
	} {
		sub, partition, ok := consumerOf(tc.desc)
		if sub != tc.sub || partition != tc.partition || ok != tc.ok {
			t.Errorf("consumerOf(%q) = %q, %d, %v; want %q, %d, %v", tc.desc, sub, partition, ok, tc.sub, tc.partition, tc.ok)
		}
	}
}

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
