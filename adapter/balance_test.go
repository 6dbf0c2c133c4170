package adapter

import (
	"fmt"
	"slices"
	"testing"
)

// Every member gets at most its share rounded up, every caller computes
// the same assignment whatever the order of the members, and a member
// that joins takes partitions mostly from the others' surplus rather than
// reshuffling them.
func TestAssignPartitions(t *testing.T) {
	for _, c := range []struct{ members, partitions int }{{1, 8}, {2, 8}, {3, 8}, {3, 64}, {16, 16}, {16, 64}, {5, 3}} {
		var members []string
		for i := range c.members {
			members = append(members, fmt.Sprintf("receiver-%d", i))
		}
		owners := assignPartitions(members, c.partitions, nil)
		load := map[string]int{}
		for _, o := range owners {
			if !slices.Contains(members, o) {
				t.Fatalf("%d members, %d partitions: owner %q is not a member", c.members, c.partitions, o)
			}
			load[o]++
		}
		share := (c.partitions + c.members - 1) / c.members
		for m, n := range load {
			if n > share {
				t.Errorf("%d members, %d partitions: %s holds %d, more than %d", c.members, c.partitions, m, n, share)
			}
		}
		if c.partitions >= c.members && len(load) != c.members {
			t.Errorf("%d members, %d partitions: only %d members hold any", c.members, c.partitions, len(load))
		}
		reversed := slices.Clone(members)
		slices.Reverse(reversed)
		if got := assignPartitions(reversed, c.partitions, nil); !slices.Equal(got, owners) {
			t.Errorf("%d members, %d partitions: the order of the members changed the assignment", c.members, c.partitions)
		}
	}
	// A fourth member takes its share and nothing else moves: every
	// partition keeps its current owner while that owner has room.
	before := assignPartitions([]string{"a", "b", "c"}, 64, nil)
	after := assignPartitions([]string{"a", "b", "c", "d"}, 64, before)
	moved, toD := 0, 0
	for i := range before {
		switch {
		case after[i] == "d":
			toD++
		case before[i] != after[i]:
			moved++
		}
	}
	if moved != 0 || toD != 16 {
		t.Errorf("a fourth member: %d partitions moved to it (want 16), %d between the other three (want 0)", toD, moved)
	}
	// The owner of everything keeps its share when a second member joins.
	all := []string{"a", "a", "a", "a", "a", "a", "a", "a"}
	if got := assignPartitions([]string{"a", "b"}, 8, all); !slices.Equal(got[:4], all[:4]) || slices.Contains(got[4:], "a") {
		t.Errorf("a second member: %v, want a keeping partitions 0-3", got)
	}
	// A current owner that is no longer a member keeps nothing.
	if got := assignPartitions([]string{"b"}, 2, []string{"a", "a"}); !slices.Equal(got, []string{"b", "b"}) {
		t.Errorf("owner gone: %v", got)
	}
}

// A receiver's view of the recorded owners takes its own write at once and
// keeps the latest revision whatever order the watch brings them in; a
// change of owner, and only that, wakes the assignment.
func TestSetRecordedKeepsTheLatest(t *testing.T) {
	m := &partitionedMode{recorded: make([]string, 2), recordedRev: make([]uint64, 2), rebalance: make(chan struct{}, 1)}
	woke := func() bool {
		select {
		case <-m.rebalance:
			return true
		default:
			return false
		}
	}
	for _, step := range []struct {
		i     int
		rid   string
		rev   uint64
		owner string // partition 0's owner after
		woke  bool
	}{
		{0, "b", 3, "b", true},  // another receiver's record
		{0, "a", 5, "a", true},  // this receiver's own write, before the watch has it
		{0, "b", 4, "a", false}, // an older record the watch brings after it
		{0, "a", 5, "a", false}, // the watch brings the own write back
		{0, "a", 6, "a", false}, // a new pin, the same owner
		{0, "c", 8, "c", true},
		{2, "d", 9, "c", false}, // no such partition
	} {
		m.setRecorded(step.i, step.rid, step.rev)
		if got := m.currentOwners()[0]; got != step.owner {
			t.Errorf("after %s at revision %d: owner %q, want %q", step.rid, step.rev, got, step.owner)
		}
		if w := woke(); w != step.woke {
			t.Errorf("after %s at revision %d: woke %v, want %v", step.rid, step.rev, w, step.woke)
		}
	}
}
