package projections

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
)

// appendSteps appends steps to the session's log (with new ids) and
// returns their stored sequences.
func appendSteps(tb testing.TB, ctx context.Context, log *events.Log, steps []step) []uint64 {
	tb.Helper()
	evs := build(tb, steps)
	for i := range evs {
		evs[i].ID = events.NewID()
	}
	acks, err := log.Append(ctx, evs)
	if err != nil {
		tb.Fatalf("append: %v", err)
	}
	seqs := make([]uint64, len(acks))
	for i, a := range acks {
		seqs[i] = a.Seq
	}
	return seqs
}

// rewindScenario appends a session with two rewinds to log, in four
// appends (calling between, if set, after each): session.started; two
// turns, the
// second failing with an orphan; a rewind to the end of the first turn and
// two more turns; a rewind to right after session.started (before the
// first rewind's target: nested) and a last turn.
func rewindScenario(tb testing.TB, ctx context.Context, log *events.Log, between func()) {
	tb.Helper()
	if between == nil {
		between = func() {}
	}
	first := appendSteps(tb, ctx, log, []step{at(&events.SessionStarted{Runtime: "claude-code", Model: "claude-opus-4"})})
	between()
	first = append(first, appendSteps(tb, ctx, log, []step{
		in("t1", started("go")),
		in("t1", user(text("go"))),
		in("t1", asst(use("a", "Bash"))),
		in("t1", user(result("a"))),
		in("t1", asst(text("done"))),
		in("t1", completed()),
		in("t2", started("again")),
		in("t2", user(text("again"))),
		in("t2", asst(use("b", "Bash"))),
		in("t2", failed("worker killed")),
	})...)
	between()
	appendSteps(tb, ctx, log, []step{
		at(&events.RecoveryAttempted{CommandID: "rw-1", Kind: "rewind_session", Attempt: 1, Result: "ok"}),
		at(rewound(first[6], "rw-1")),
		at(&events.RecoveryCompleted{CommandID: "rw-1", Kind: "rewind_session", Outcome: events.OutcomeRecovered, Attempts: 1}),
		in("t3", started("hi")),
		in("t3", user(text("hi"))),
		in("t3", asst(text("hello"))),
		in("t3", completed()),
		in("t4", started("more")),
		in("t4", user(text("more"))),
		in("t4", asst(use("c", "Bash"))),
		in("t4", failed("worker killed")),
	})
	between()
	appendSteps(tb, ctx, log, []step{
		at(rewound(first[0], "rw-2")),
		in("t5", started("from the top")),
		in("t5", user(text("from the top"))),
		in("t5", asst(text("ok"))),
		in("t5", completed()),
	})
}

func readSession(tb testing.TB, ctx context.Context, log *events.Log) []events.Event {
	tb.Helper()
	var evs []events.Event
	if err := log.ReadSession(ctx, testTenant, testSession, events.ReadOptions{}, func(ev events.Event) error {
		evs = append(evs, ev)
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
	return evs
}

// TestRestoreRewind restores a session with nested rewinds from a
// snapshot at every one of its sequences (so the rewinds reach back before
// the snapshot, or not), and from a snapshot of a state whose refold is
// pending: each equals FoldLog of the whole log. The second rewind undoes
// the first (and its recovery.completed: the command no longer counts as
// done, but the rewind record keeps it).
func TestRestoreRewind(t *testing.T) {
	ctx := testContext(t)
	js := startJetStream(t)
	log, err := events.Open(ctx, js, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	store := newStore(t, js)
	rewindScenario(t, ctx, log, nil)
	evs := readSession(t, ctx, log)

	full := FoldLog(evs)
	var turns []string
	for _, tu := range full.Turns {
		turns = append(turns, tu.ID)
	}
	if !slices.Equal(turns, []string{"t5"}) || len(full.Rewinds) != 2 || full.Status() != StatusIdle || full.Runtime != "claude-code" ||
		full.RewoundEvents != len(evs)-6 || full.CommandDone("rw-1") || full.RewindByCommand("rw-1") == nil || full.RewindByCommand("rw-2") == nil {
		t.Fatalf("full fold: turns %v, rewinds %+v, status %s, rewound %d of %d events", turns, full.Rewinds, full.Status(), full.RewoundEvents, len(evs))
	}
	want := fingerprint(t, full)

	got, err := Restore(ctx, log, store, testTenant, testSession)
	if err != nil {
		t.Fatalf("restore without a snapshot: %v", err)
	}
	if g := fingerprint(t, got); string(g) != string(want) {
		t.Fatalf("restore without a snapshot differs from FoldLog:\n got %.300s\nwant %.300s", diffAt(g, want), diffAt(want, g))
	}
	for i := range evs {
		head := FoldLog(evs[:i+1])
		if err := store.Save(ctx, head); err != nil {
			t.Fatalf("save at %d: %v", evs[i].Seq, err)
		}
		got, err := Restore(ctx, log, store, testTenant, testSession)
		if err != nil {
			t.Fatalf("restore from the snapshot at %d: %v", evs[i].Seq, err)
		}
		if g := fingerprint(t, got); string(g) != string(want) {
			t.Fatalf("snapshot at %d + tail differs from FoldLog:\n got %.300s\nwant %.300s", evs[i].Seq, diffAt(g, want), diffAt(want, g))
		}
	}

	// A snapshot of a state whose refold is pending (a caller of Apply that
	// did not refold) is refolded first.
	stale := &Session{}
	for _, ev := range evs[:len(evs)-3] {
		stale.Apply(ev)
	}
	if !stale.NeedsRefold {
		t.Fatal("no refold pending")
	}
	if err := store.Save(ctx, stale); err != nil {
		t.Fatal(err)
	}
	if got, err = Restore(ctx, log, store, testTenant, testSession); err != nil {
		t.Fatal(err)
	}
	if g := fingerprint(t, got); string(g) != string(want) {
		t.Fatalf("restore from a stale snapshot differs from FoldLog:\n got %.300s\nwant %.300s", diffAt(g, want), diffAt(want, g))
	}

	// RefoldLog reads the log itself.
	stale = &Session{}
	for _, ev := range evs {
		stale.Apply(ev)
	}
	if err := stale.RefoldLog(ctx, log); err != nil {
		t.Fatal(err)
	}
	if g := fingerprint(t, stale); string(g) != string(want) {
		t.Fatalf("RefoldLog differs from FoldLog:\n got %.300s\nwant %.300s", diffAt(g, want), diffAt(want, g))
	}
}

// TestProjectorRewind runs the projector (snapshotting every 4 events)
// over a session with nested rewinds, appended while it runs: its state
// ends equal to FoldLog of the session's log (snapshot.taken events
// included), and the anomalies it reported include the orphans the
// rewinds later undid.
func TestProjectorRewind(t *testing.T) {
	ctx := testContext(t)
	js := startJetStream(t)
	log, err := events.Open(ctx, js, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	store := newStore(t, js)
	var mu sync.Mutex
	var anomalies []string
	p, err := NewProjector(log, store, ProjectorConfig{SnapshotEvery: 4, Durable: "test-projector", OnAnomaly: func(a Anomaly) {
		mu.Lock()
		anomalies = append(anomalies, string(a.Rule)+":"+a.ToolUseID)
		mu.Unlock()
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := p.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	}()

	// Let the projector catch up between the appends, so that it meets
	// each rewind in a session it holds.
	caughtUp := func() {
		t.Helper()
		waitProjector(t, ctx, p, log)
	}
	rewindScenario(t, ctx, log, caughtUp)
	got := waitProjector(t, ctx, p, log)
	if len(got.Rewinds) != 2 || got.NeedsRefold || got.Turns[0].ID != "t5" {
		t.Errorf("projector state: rewinds %+v, refold %v, turns %+v", got.Rewinds, got.NeedsRefold, got.Turns)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(anomalies, "tool_use_without_result:b") || !slices.Contains(anomalies, "tool_use_without_result:c") {
		t.Errorf("anomalies reported: %v", anomalies)
	}
}

// waitProjector waits until the projector's state of the test session
// equals FoldLog of its log, and returns it.
func waitProjector(tb testing.TB, ctx context.Context, p *Projector, log *events.Log) *Session {
	tb.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		want := fingerprint(tb, FoldLog(readSession(tb, ctx, log)))
		s, ok := p.Session(testTenant, testSession)
		if ok {
			if g := fingerprint(tb, s); string(g) == string(want) {
				return s
			} else if time.Now().After(deadline) {
				tb.Fatalf("the projector's state differs from FoldLog:\n got %.300s\nwant %.300s", diffAt(g, want), diffAt(want, g))
			}
		} else if time.Now().After(deadline) {
			tb.Fatal("the projector holds no state for the session")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
