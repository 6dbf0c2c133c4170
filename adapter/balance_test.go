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
