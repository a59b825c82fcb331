package test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/enginetest"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/refruntime"
)

// TestIncident20260219 replays the 2026-02-19 incident end to end: a turn
// runs a multi-tool loop; a second message for the session arrives while
// the next turn is in flight; the runtime dies between that turn's tool_use
// and its result; the history stage of the second message's turn throws;
// distillation is requested while the orphan is still there. No turn may
// end silently, the orphan must be repaired before anything else of the
// session runs, the distillation must be skipped with its reason and run
// only after the repair, and `engine replay` must show the chain in order.
func TestIncident20260219(t *testing.T) {
	skipShort(t, "replays an incident through engine processes")
	parallel(t)
	ctx := context.Background()
	// The deadlines of the policy before issue 15's calibration: the
	// crashed turn (a tool call pending) falls due 2 minutes after its
	// last event.
	eng := enginetest.Start(t, enginetest.Options{Policy: "turn_deadline: 120s\ntool_deadline: 120s\n", Runtime: refruntime.Config{StageDelay: 20 * time.Millisecond}})
	log, rt, clock := eng.Log, eng.Runtime, eng.Clock
	const session = "incident"

	// 1. A turn runs a multi-tool loop.
	if r, err := rt.RunTurn(ctx, session, refruntime.TurnSpec{Prompt: "fix the flaky test",
		Tools: []refruntime.ToolSpec{{Name: "Read"}, {Name: "Grep"}, {Name: "Bash"}}}); err != nil || r.Outcome != refruntime.OutcomeCompleted {
		t.Fatalf("turn 1: %+v, %v", r, err)
	}
	// 2. The next turn is in flight when a second message arrives; the
	// runtime dies between that turn's tool_use and its result.
	crashing, err := rt.StartTurnAsync(ctx, session, refruntime.TurnSpec{Prompt: "now run the whole suite",
		Tools: []refruntime.ToolSpec{{Name: "Bash"}}, Fault: refruntime.FaultCrashMidTool{}})
	if err != nil {
		t.Fatal(err)
	}
	// 3. The second message's turn: its history stage throws.
	second, err := rt.RunTurn(ctx, session, refruntime.TurnSpec{Prompt: "also update the changelog",
		Fault: refruntime.FaultStageThrows{Stage: events.StageHistory}})
	if err != nil || second.Outcome != refruntime.OutcomeFailed {
		t.Fatalf("second message's turn: %+v, %v", second, err)
	}
	crashed, err := crashing.Wait(ctx)
	if err != nil || crashed.Outcome != refruntime.OutcomeCrashed {
		t.Fatalf("crashing turn: %+v, %v", crashed, err)
	}
	// 4. Distillation is requested while the orphan is still there.
	ev, _ := events.New("acme", session, "", &events.DistillationRequested{Reason: "context 91% full"})
	if _, err := log.Append(ctx, []events.Event{ev}); err != nil {
		t.Fatal(err)
	}

	// Time passes on the reconciler's clock: the grace of the request,
	// then the crashed turn's deadline.
	state := func() *projections.Session {
		s, err := projections.Restore(ctx, log, nil, "acme", session)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		s := state()
		d := s.Distillations[len(s.Distillations)-1]
		if len(s.InFlight) == 0 && len(s.OrphanedToolUseIDs()) == 0 && d.CompletedSeq != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the incident did not resolve: in flight %v, orphans %v, distillations %+v", s.InFlight, s.OrphanedToolUseIDs(), s.Distillations)
		}
		clock.Advance(5 * time.Second)
		time.Sleep(40 * time.Millisecond)
	}

	// Read the log back and check the chain.
	var all []events.Event
	if err := log.ReadSession(ctx, "acme", session, events.ReadOptions{}, func(e events.Event) error {
		all = append(all, e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	seqOf := func(match func(events.Event, events.Payload) bool) uint64 {
		for _, e := range all {
			if p, err := e.Payload(); err == nil && match(e, p) {
				return e.Seq
			}
		}
		return 0
	}
	skipped := seqOf(func(e events.Event, _ events.Payload) bool { return e.Type == events.TypeDistillationSkipped })
	abandoned := seqOf(func(e events.Event, _ events.Payload) bool {
		return e.Type == events.TypeTurnAbandoned && e.Turn == crashed.Turn
	})
	repaired := seqOf(func(e events.Event, p events.Payload) bool {
		m, ok := p.(*events.MessageAppended)
		return ok && m.Synthetic
	})
	distilled := seqOf(func(e events.Event, _ events.Payload) bool { return e.Type == events.TypeDistillationStarted })
	if skipped == 0 || abandoned == 0 || repaired == 0 || distilled == 0 {
		t.Fatalf("missing link: skipped %d, abandoned %d, repaired %d, distillation started %d", skipped, abandoned, repaired, distilled)
	}
	if !(skipped < repaired && abandoned < repaired && repaired < distilled) {
		t.Fatalf("out of order: skipped %d, abandoned %d, repaired %d, distillation started %d", skipped, abandoned, repaired, distilled)
	}
	// Nothing else of the session ran between the orphan's declaration
	// and its repair: only the abandon command's own records.
	for _, e := range all {
		if e.Seq <= abandoned || e.Seq >= repaired {
			continue
		}
		if e.Type != events.TypeRecoveryAttempted && e.Type != events.TypeRecoveryCompleted {
			t.Errorf("seq %d %s ran before the orphan was repaired", e.Seq, e.Type)
		}
	}

	s := state()
	// The distillation was skipped with its reason, then ran clean.
	first, last := s.Distillations[0], s.Distillations[len(s.Distillations)-1]
	if first.Skipped != projections.DirtyTurnInFlight && first.Skipped != projections.DirtyUnansweredToolUse {
		t.Errorf("skipped with %q", first.Skipped)
	}
	if !last.Clean {
		t.Errorf("the distillation that ran was not clean: %+v", last)
	}
	// No turn ended silently.
	for _, tn := range s.Turns {
		switch tn.Status {
		case projections.TurnCompleted:
		case projections.TurnFailed:
			if tn.FailedStage == "" {
				t.Errorf("turn %s failed without its stage", tn.ID)
			}
		case projections.TurnAbandoned:
			if !strings.Contains(tn.Reason, "last stage") {
				t.Errorf("turn %s abandoned without its last stage: %q", tn.ID, tn.Reason)
			}
		default:
			t.Errorf("turn %s has no outcome: %s", tn.ID, tn.Status)
		}
	}
	if s.Status() == projections.StatusBroken {
		t.Errorf("session still broken: %+v", s.Violations)
	}

	// engine replay, as a separate process, shows the chain in order.
	out := run(t, eng.URL, "replay", "acme/"+session)
	pos := 0
	for _, want := range []string{"FAILED in history", "SKIPPED", "ABANDONED", "!! tool_use_without_result", "(synthetic)", "distillation.completed"} {
		i := strings.Index(out[pos:], want)
		if i < 0 {
			t.Fatalf("replay lacks %q after position %d:\n%s", want, pos, out)
		}
		pos += i
	}
}
