package reconciler_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/reconciler"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// fold folds payloads into a session of tenant "acme", each event stored
// (Event.Stored) at stored and stamped with its own time at.
func fold(t *testing.T, stored, at time.Time, ps ...func() (string, events.Payload)) *projections.Session {
	t.Helper()
	s := &projections.Session{}
	for i, p := range ps {
		turn, payload := p()
		ev, err := events.NewAt(at, events.NewID(), "acme", "s1", turn, payload)
		if err != nil {
			t.Fatal(err)
		}
		ev.Seq, ev.Stored = uint64(i+1), stored
		ev.Source = "urn:agent:test"
		s.Apply(ev)
	}
	return s
}

func ev(turn string, p events.Payload) func() (string, events.Payload) {
	return func() (string, events.Payload) { return turn, p }
}

func TestDecideActsOnLiveSessionsOnly(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	policy := reconciler.DefaultPolicy()
	orphan := []func() (string, events.Payload){
		ev("t1", &events.TurnStarted{}),
		ev("t1", &events.MessageAppended{Role: events.RoleAssistant, Content: []events.ContentBlock{
			{Type: events.BlockToolUse, ID: "toolu_1", Name: "Bash", Input: json.RawMessage(`{}`)}}}),
		ev("t1", &events.TurnCompleted{}),
	}
	history := append([]func() (string, events.Payload){ev("", &events.SessionStarted{History: true})}, orphan...)
	cases := []struct {
		name    string
		state   *projections.Session
		present bool
		want    int
	}{
		{"recent activity", fold(t, now.Add(-time.Minute), now.Add(-time.Minute), orphan...), false, 1},
		{"beyond the horizon, no runtime", fold(t, now.Add(-2*time.Hour), now.Add(-2*time.Hour), orphan...), false, 0},
		{"beyond the horizon, runtime present", fold(t, now.Add(-2*time.Hour), now.Add(-2*time.Hour), orphan...), true, 1},
		{"history, recent", fold(t, now.Add(-time.Minute), now.Add(-time.Minute), history...), false, 0},
		{"history, runtime present", fold(t, now.Add(-time.Minute), now.Add(-time.Minute), history...), true, 0},
		{"no store time", fold(t, time.Time{}, now, orphan...), false, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			live := reconciler.Live(c.state, now, policy, c.present)
			got := reconciler.Decide(reconciler.Input{State: c.state, Now: now, Policy: policy, Live: live, RuntimePresent: c.present})
			if len(got) != c.want {
				t.Fatalf("live %v: %d actions %+v, want %d", live, len(got), got, c.want)
			}
		})
	}
}

// A turn stamped in year 9999 is abandoned by the log's clock: its
// deadline counts from when the log stored it.
func TestDeadlineCountsFromTheLogsClock(t *testing.T) {
	t.Parallel()
	stored := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	future := time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
	s := fold(t, stored, future, ev("t1", &events.TurnStarted{}))
	if n := len(s.Violations); n != 1 || s.Violations[0].Rule != projections.RuleClockSkew {
		t.Fatalf("violations %+v, want one clock_skew", s.Violations)
	}
	policy, err := reconciler.ParsePolicy([]byte("turn_deadline: 120s\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		after time.Duration
		want  int
	}{{time.Minute, 0}, {121 * time.Second, 1}} {
		now := stored.Add(c.after)
		got := reconciler.Decide(reconciler.Input{State: s, Now: now, Policy: policy, Live: true})
		if len(got) != c.want || (c.want == 1 && got[0].Command.Kind != recovery.KindAbandonTurn) {
			t.Fatalf("%s after it was stored: %+v, want %d abandon", c.after, got, c.want)
		}
	}
}

// A command that paused the session for runtime_unavailable: while the
// runtime is away only the pause stands; when it is back, the session is
// resumed with the paused command to issue again (the worker issues its
// next issue after the resume); once resumed, nothing more is decided.
func TestDecideResumesAndReissuesWhenTheRuntimeReturns(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	policy := reconciler.DefaultPolicy()
	distill := recovery.CommandID(recovery.KindDistill, "acme", "s1", "", []uint64{1}, 1)
	steps := []func() (string, events.Payload){
		ev("", &events.DistillationRequested{Reason: "full"}),
		ev("", &events.RecoveryAttempted{CommandID: distill, Kind: "distill", Attempt: 1, Result: "failed", Class: "runtime_unavailable"}),
		ev("", &events.SessionPaused{Reason: "no runtime", Cause: events.CauseRuntimeUnavailable, CommandID: distill, Kind: "distill"}),
		ev("", &events.RecoveryCompleted{CommandID: distill, Kind: "distill", Outcome: events.OutcomeFailed}),
	}
	paused := fold(t, now, now, steps...)
	in := reconciler.Input{State: paused, Now: now.Add(10 * time.Second), Policy: policy, Live: true,
		RequestSeenAt: func(uint64) time.Time { return now }}
	if got := reconciler.Decide(in); len(got) != 0 {
		t.Fatalf("runtime away: %+v, want nothing", got)
	}
	// Present, but known only from an answer to a ping sent before the
	// pause (the tracker had not yet seen the runtime go): not back.
	in.RuntimePresent, in.RuntimeAnsweredAt = true, now.Add(-time.Second)
	if got := reconciler.Decide(in); len(got) != 0 {
		t.Fatalf("present as of before the pause: %+v, want nothing", got)
	}
	in.RuntimeAnsweredAt = now.Add(5 * time.Second)
	got := reconciler.Decide(in)
	if len(got) != 1 || got[0].Command.Kind != recovery.KindResumeSession || got[0].Command.Params.Reissue != distill {
		t.Fatalf("runtime back: %+v, want resume_session reissuing %s", got, distill)
	}
	resumed := fold(t, now, now, append(steps, ev("", &events.SessionResumed{Reason: "runtime back"}))...)
	in.State = resumed
	if got := reconciler.Decide(in); len(got) != 0 {
		t.Fatalf("resumed: %+v, want nothing (the worker issues the distill again)", got)
	}
	again := recovery.Reissued(recovery.NewCommand(recovery.KindDistill, "acme", "s1", "", "distill", []uint64{1}), "reconciler", now)
	if again.Issue != 2 || again.ID == distill || again.ID != recovery.CommandID(recovery.KindDistill, "acme", "s1", "", []uint64{1}, 2) {
		t.Fatalf("reissued: %+v", again)
	}
}
