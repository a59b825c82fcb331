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
// every event with FoldLog. It checks 12 random cuts of each session
// besides the first two and the last two. Under the race detector and
// -short it checks 4, and seed 1's session has its first 200 turns (14
// rewinds, 20 distillations and 30 commands: still past every window);
// the full-size pass of .ci/run checks the 12, with seed 1's 400 turns.
func TestSnapshotRoundTrip(t *testing.T) {
	t.Parallel()
	random, long := 12, 400
	if sampled() {
		random, long = 4, 200
	}
	for _, tc := range []struct {
		seed  uint64
		turns int
	}{
		{1, long}, // past KeepTurns: exercises the trims
		{2, 120},
		{3, 120},
	} {
		evs := synth(t, tc.seed, tc.turns, true)
		full := fingerprint(t, Fold(evs))
		r := newRand(tc.seed)
		cuts := []int{0, 1, len(evs) - 1, len(evs)}
		for range random {
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
// rewind and invalid event), then a short synthetic session. Under the
// race detector and -short it checks the sample sampleCuts gives (every
// 20th cut, and the cuts around each rewind and right after the first
// event of each kind); otherwise every cut (the full-size pass of
// .ci/run).
func TestSnapshotRoundTripEveryCut(t *testing.T) {
	t.Parallel()
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
	check := func(int) bool { return true }
	if sampled() {
		check = sampleCuts(evs, 20)
	}
	head := &Session{}
	hf := newFolder(head, evs)
	checked := 0
	for cut := 0; cut <= len(evs); cut++ {
		if !check(cut) {
			if cut < len(evs) {
				hf.apply(evs[cut])
			}
			continue
		}
		checked++
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
	t.Logf("%d of %d cuts checked", checked, len(evs)+1)
}

// sampleCuts picks the cuts of evs a sampled test checks
// (cut k snapshots evs[:k] and folds evs[k:] on top): every k-th, the
// first and the last, the cuts right before and right after each
// session.rewound (where a restored state is or is not the refold's
// base), and the cut right after the first event of each type and the
// first invalid event (so that a state holding each kind is snapshotted).
func sampleCuts(evs []events.Event, k int) func(cut int) bool {
	pick := map[int]bool{0: true, 1: true, len(evs) - 1: true, len(evs): true}
	seen := map[events.Type]bool{}
	invalid := false
	for i, ev := range evs {
		if i%k == 0 {
			pick[i] = true
		}
		if ev.Type == events.TypeSessionRewound {
			pick[i], pick[i+1] = true, true
		}
		if ev.Err != nil && !invalid {
			invalid, pick[i+1] = true, true
		}
		if !seen[ev.Type] {
			seen[ev.Type], pick[i+1] = true, true
		}
	}
	return func(cut int) bool { return pick[cut] }
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
