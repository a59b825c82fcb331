package projections

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/turnstone-dev/turnstone/events"
)

// TestSnapshotRoundTrip is the snapshot property: for random cut points,
// marshalling the state at the cut, unmarshalling it and folding the rest
// (refolding at rewinds from the restored state when it is a base, else
// from the first event, as Restore does) gives the same JSON as folding
// every event with FoldLog.
func TestSnapshotRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		seed  uint64
		turns int
	}{
		{1, 400}, // past KeepTurns: exercises the trims
		{2, 120},
		{3, 120},
	} {
		evs := synth(t, tc.seed, tc.turns, true)
		full := fingerprint(t, Fold(evs))
		r := newRand(tc.seed)
		cuts := []int{0, 1, len(evs) - 1, len(evs)}
		for range 12 {
			cuts = append(cuts, r.IntN(len(evs)+1))
		}
		slices.Sort(cuts)

		head := &Session{}
		hf := newFolder(head, evs)
		done := 0
		for _, cut := range cuts {
			for _, ev := range evs[done:cut] {
				hf.apply(ev)
			}
			done = cut
			var restored Session
			if err := json.Unmarshal(mustJSON(t, head), &restored); err != nil {
				t.Fatalf("seed %d cut %d: unmarshal: %v", tc.seed, cut, err)
			}
			rf := newFolder(&restored, evs)
			for _, ev := range evs[cut:] {
				rf.apply(ev)
			}
			if got := fingerprint(t, &restored); string(got) != string(full) {
				t.Fatalf("seed %d cut %d of %d: snapshot + tail differs from the full fold\n got: %.400s\nwant: %.400s",
					tc.seed, cut, len(evs), diffAt(got, full), diffAt(full, got))
			}
		}
	}
}

// diffAt returns a from a little before where it starts to differ from b.
func diffAt(a, b []byte) []byte {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return a[max(0, i-80):]
}

// TestSnapshotRoundTripEveryCut checks the snapshot property at every cut
// point of a dense corpus: the steps of every table case in a row (each
// rule, orphan, late result, repair, recovery record, distillation,
// rewind and invalid event), then a short synthetic session.
func TestSnapshotRoundTripEveryCut(t *testing.T) {
	var steps []step
	for i, c := range allFoldCases() {
		// A case's rewinds name sequences of the case: move them to
		// where the case lands in the corpus.
		offset := uint64(len(steps))
		// Each case gets its own turn ids, so that its turns start,
		// overlap and end as in the case.
		for _, st := range c.steps {
			if st.raw != nil {
				ev := *st.raw
				if ev.Turn != "" {
					ev.Turn = fmt.Sprintf("c%d%s", i, ev.Turn)
				}
				st.raw = &ev
			} else if st.turn != "" {
				st.turn = fmt.Sprintf("c%d%s", i, st.turn)
			}
			if r, ok := st.p.(*events.SessionRewound); ok && r.ToSeq != 0 {
				moved := *r
				moved.ToSeq += offset
				st.p = &moved
			}
			steps = append(steps, st)
		}
	}
	evs := build(t, steps)
	last := evs[len(evs)-1].Seq
	for _, ev := range synth(t, 5, 15, true) {
		ev.Seq += last
		evs = append(evs, ev)
	}
	full := fingerprint(t, Fold(evs))
	head := &Session{}
	hf := newFolder(head, evs)
	for cut := 0; cut <= len(evs); cut++ {
		var restored Session
		if err := json.Unmarshal(mustJSON(t, head), &restored); err != nil {
			t.Fatalf("cut %d: unmarshal: %v", cut, err)
		}
		rf := newFolder(&restored, evs)
		for _, ev := range evs[cut:] {
			rf.apply(ev)
		}
		if got := fingerprint(t, &restored); string(got) != string(full) {
			t.Fatalf("cut %d of %d (%s): snapshot + tail differs from the full fold\n got: %.400s\nwant: %.400s",
				cut, len(evs), evs[cut].Type, diffAt(got, full), diffAt(full, got))
		}
		if cut < len(evs) {
			hf.apply(evs[cut])
		}
	}
}

// fingerprint is the state's JSON and what its methods derive from it.
func fingerprint(tb testing.TB, s *Session) []byte {
	tb.Helper()
	return mustJSON(tb, struct {
		State     *Session
		Status    SessionStatus
		Orphaned  []string
		InFlight  *Turn
		Pending   *Distillation
		Deferred  bool
		First     *Violation
		Anomalous bool
	}{s, s.Status(), s.OrphanedToolUseIDs(), s.InFlightTurn(), s.PendingDistillation(), s.DistillationDeferred(), s.FirstAnomaly(), s.Anomalous()})
}
