package projections

import (
	"errors"
	"testing"

	"github.com/turnstone-dev/turnstone/events"
)

// TestReplay replays a session with nested rewinds: the end state equals
// a fold of the whole log, each step's state is the fold up to its event,
// a range from a sequence shows only the steps from it (the earlier ones
// folded), a bound by time stops before the first later event, and
// ErrStopReplay ends it quietly.
func TestReplay(t *testing.T) {
	ctx := testContext(t)
	js := startJetStream(t)
	log, err := events.Open(ctx, js, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rewindScenario(t, ctx, log, nil)
	evs := readSession(t, ctx, log)
	full := FoldLog(evs)

	var seqs []uint64
	refolds := 0
	state, err := Replay(ctx, log, testTenant, testSession, ReplayRange{}, func(s Step) error {
		seqs = append(seqs, s.Event.Seq)
		if s.Refolded {
			refolds++
		}
		if want := FoldLog(evs[:len(seqs)]); s.State.Totals != want.Totals || s.State.LastSeq != want.LastSeq {
			t.Errorf("seq %d: state totals %+v, a fold up to it %+v", s.Event.Seq, s.State.Totals, want.Totals)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seqs) != len(evs) || refolds != 2 {
		t.Errorf("%d steps with %d refolds, want %d with 2", len(seqs), refolds, len(evs))
	}
	if state.Totals != full.Totals || state.Status() != full.Status() {
		t.Errorf("end state %+v %s, a fold of the log %+v %s", state.Totals, state.Status(), full.Totals, full.Status())
	}

	// From: the earlier events are folded, not shown.
	from := evs[5].Seq
	var first *Step
	if _, err := Replay(ctx, log, testTenant, testSession, ReplayRange{From: from, To: evs[8].Seq}, func(s Step) error {
		if first == nil {
			first = &Step{Event: s.Event, State: s.State.Clone()}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if first == nil || first.Event.Seq != from || first.State.Totals != FoldLog(evs[:6]).Totals {
		t.Errorf("the first step from seq %d: %+v", from, first)
	}

	// UntilTime stops before the first event after it, unfolded.
	until := evs[3].Time
	n := 0
	state, err = Replay(ctx, log, testTenant, testSession, ReplayRange{UntilTime: until}, func(Step) error { n++; return nil })
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, ev := range evs {
		if ev.Time.After(until) {
			break
		}
		want++
	}
	if n != want || state.LastSeq != evs[want-1].Seq {
		t.Errorf("until %s: %d steps, last seq %d; want %d, %d", until, n, state.LastSeq, want, evs[want-1].Seq)
	}

	// ErrStopReplay ends quietly; another error comes back wrapped.
	if _, err := Replay(ctx, log, testTenant, testSession, ReplayRange{}, func(Step) error { return ErrStopReplay }); err != nil {
		t.Errorf("ErrStopReplay: %v", err)
	}
	boom := errors.New("boom")
	if _, err := Replay(ctx, log, testTenant, testSession, ReplayRange{}, func(Step) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("a callback's error: %v", err)
	}
	if _, err := Replay(ctx, log, testTenant, "nosuch", ReplayRange{}, nil); !errors.Is(err, events.ErrSessionNotFound) {
		t.Errorf("a missing session: %v", err)
	}
}
