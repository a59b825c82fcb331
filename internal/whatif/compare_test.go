package whatif

import (
	"testing"
	"time"
)

// TestCompare: each decision is same, added, changed or removed against
// the baseline, ordered by seq, and the first divergence is the lowest
// seq at which they differ (a changed one's lower seq).
func TestCompare(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	d := func(id, kind string, seq uint64, at time.Duration) Decision {
		return Decision{ID: id, Kind: kind, Seq: seq, Time: t0.Add(at)}
	}
	tried := []Decision{d("a", "abandon_turn", 5, 0), d("r", "repair_orphans", 5, 0), d("x", "pause_session", 9, 0), d("c", "abandon_turn", 12, 0)}
	base := []Decision{d("a", "abandon_turn", 5, time.Second), d("r", "repair_orphans", 5, 10*time.Second), d("c", "abandon_turn", 20, 0), d("gone", "retry_turn", 7, 0)}
	out, first := compare(tried, base, 2*time.Second)
	want := []struct {
		id, change string
		seq        uint64
	}{{"a", Same, 5}, {"r", Changed, 5}, {"gone", Removed, 7}, {"x", Added, 9}, {"c", Changed, 12}}
	if len(out) != len(want) {
		t.Fatalf("%+v", out)
	}
	for i, w := range want {
		if out[i].ID != w.id || out[i].Change != w.change || out[i].Seq != w.seq {
			t.Errorf("%d: %+v, want %s %s at %d", i, out[i], w.id, w.change, w.seq)
		}
	}
	if out[4].BaselineSeq != 20 || out[1].BaselineTime != t0.Add(10*time.Second) {
		t.Errorf("baseline of the changed ones: %+v %+v", out[1], out[4])
	}
	if first == nil || first.Seq != 5 || first.ID != "r" {
		t.Errorf("first divergence %v, want r at 5", first)
	}
	if _, first := compare(tried[:2], tried[:2], 0); first != nil {
		t.Errorf("a policy against itself: %v", first)
	}
}
