package pgroup_test

import (
	"fmt"
	"testing"

	"github.com/turnstone-dev/turnstone/internal/pgroup"
)

func TestAssignIsBalancedAndDeterministic(t *testing.T) {
	for _, c := range []struct{ members, partitions int }{{1, 8}, {2, 8}, {3, 8}, {3, 16}, {4, 10}, {5, 3}, {7, 64}} {
		t.Run(fmt.Sprintf("%d members, %d partitions", c.members, c.partitions), func(t *testing.T) {
			var ms []string
			for i := 0; i < c.members; i++ {
				ms = append(ms, fmt.Sprintf("m%d", i))
			}
			owner := pgroup.Assign("engines", ms, c.partitions)
			if len(owner) != c.partitions {
				t.Fatalf("%d owners for %d partitions", len(owner), c.partitions)
			}
			load := map[string]int{}
			for _, o := range owner {
				load[o]++
			}
			lo, hi := c.partitions/c.members, (c.partitions+c.members-1)/c.members
			for _, m := range ms {
				if load[m] < lo || load[m] > hi {
					t.Errorf("member %s owns %d partitions, want %d..%d (%v)", m, load[m], lo, hi, owner)
				}
			}
			// The order members are listed in (and duplicates) change nothing.
			rev := append([]string{ms[0]}, ms...)
			for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
				rev[i], rev[j] = rev[j], rev[i]
			}
			if again := pgroup.Assign("engines", rev, c.partitions); fmt.Sprint(again) != fmt.Sprint(owner) {
				t.Fatalf("not deterministic: %v vs %v", owner, again)
			}
		})
	}
}

// A member that joins takes about its share; the others keep most of
// theirs.
func TestAssignMovesLittleWhenAMemberJoins(t *testing.T) {
	before := pgroup.Assign("workers", []string{"a", "b", "c"}, 64)
	after := pgroup.Assign("workers", []string{"a", "b", "c", "d"}, 64)
	moved := 0
	for p := range before {
		if before[p] != after[p] {
			moved++
		}
	}
	// d's share is 16; a balanced scheme moves at least that many.
	if moved < 16 || moved > 28 {
		t.Fatalf("%d of 64 partitions moved when a 4th member joined, want about 16", moved)
	}
	if got := pgroup.Assign("workers", nil, 8); got != nil {
		t.Fatalf("no members: %v", got)
	}
}
