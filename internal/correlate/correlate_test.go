package correlate_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/correlate"
	"github.com/turnstone-dev/turnstone/projections"
)

var t0 = time.Date(2026, 11, 22, 16, 7, 0, 0, time.UTC)

func overloaded(tenant, session string, seq uint64, at time.Time) correlate.Signal {
	return correlate.Signal{Tenant: tenant, Session: session, Seq: seq, Time: at, Kind: correlate.KindError, Class: "overloaded",
		Code: "overloaded_error", Status: 529, Provider: "anthropic", Model: "claude-opus-4-6", Runtime: "refruntime 1", Detail: "Overloaded"}
}

func TestKeyOf(t *testing.T) {
	base := correlate.Signal{Provider: "anthropic", Model: "claude-opus-4-6", Runtime: "claude-code 2.1.38", Tool: "Bash", Code: "Overloaded_Error"}
	cases := []struct {
		kind   correlate.Kind
		class  string
		status int
		want   string
	}{
		{correlate.KindError, "overloaded", 529, "kind=error class=overloaded code=529 provider=anthropic"},
		{correlate.KindError, "overloaded", 0, "kind=error class=overloaded code=overloaded_error provider=anthropic"},
		{correlate.KindError, "rate_limit", 429, "kind=error class=rate_limit code=429 provider=anthropic"},
		{correlate.KindError, "authentication", 401, "kind=error class=authentication code=401 provider=anthropic"},
		{correlate.KindError, "invalid_request", 400, "kind=error class=invalid_request code=400 provider=anthropic model=claude-opus-4-6"},
		{correlate.KindError, "context_length", 413, "kind=error class=context_length code=413 provider=anthropic model=claude-opus-4-6"},
		{correlate.KindError, "tool_error", 0, "kind=error class=tool_error runtime=claude-code 2.1.38 tool=Bash"},
		{correlate.KindError, "unknown", 0, "kind=error class=unknown code=overloaded_error runtime=claude-code 2.1.38"},
		{correlate.KindError, "runtime_unavailable", 0, "kind=error class=runtime_unavailable code=overloaded_error runtime=claude-code 2.1.38"},
		{correlate.KindAnomaly, "tool_use_without_result", 0, "kind=anomaly class=tool_use_without_result runtime=claude-code 2.1.38"},
		{correlate.KindAnomaly, correlate.ClassTurnAbandoned, 0, "kind=anomaly class=turn_abandoned runtime=claude-code 2.1.38"},
		{correlate.KindAnomaly, correlate.ClassFlakyTool, 0, "kind=anomaly class=flaky_tool tool=Bash"},
		{correlate.KindAnomaly, correlate.ClassLoop, 0, "kind=anomaly class=loop runtime=claude-code 2.1.38"},
		{correlate.KindAnomaly, correlate.ClassRecoveryFailed, 0, "kind=anomaly class=recovery_failed code=overloaded_error runtime=claude-code 2.1.38"},
	}
	for _, c := range cases {
		s := base
		s.Kind, s.Class, s.Status = c.kind, c.class, c.status
		if got := correlate.KeyOf(s).String(); got != c.want {
			t.Errorf("%s %s %d: key %q, want %q", c.kind, c.class, c.status, got, c.want)
		}
	}
}

// TestOneProviderOutageIsOneIncident: 30 sessions of three tenants fail
// on one provider with 529 inside a minute, 5 others with unrelated
// errors at the same time: one incident holds the 30, the 5 stay apart.
func TestOneProviderOutageIsOneIncident(t *testing.T) {
	var sigs []correlate.Signal
	var outs []correlate.Outcome
	for i := range 30 {
		tenant := []string{"acme", "beta", "gamma"}[i%3]
		session := fmt.Sprintf("s%02d", i)
		at := t0.Add(time.Duration(i*2) * time.Second)
		// error.recorded, then turn.failed with the same error.
		sigs = append(sigs, overloaded(tenant, session, 10, at), overloaded(tenant, session, 11, at.Add(time.Second)))
		switch {
		case i < 26:
			outs = append(outs, correlate.Outcome{Tenant: tenant, Session: session, CommandID: "c" + session, Kind: "retry_turn", Strategy: "switch_provider", Outcome: string(events.OutcomeRecovered), Seq: 12})
		case i < 28:
			outs = append(outs, correlate.Outcome{Tenant: tenant, Session: session, CommandID: "c" + session, Kind: "retry_turn", Strategy: "pause", Outcome: string(events.OutcomeFailed), Seq: 12})
		case i == 28:
			// A command from before the failure does not count.
			outs = append(outs, correlate.Outcome{Tenant: tenant, Session: session, CommandID: "old", Kind: "retry_turn", Strategy: "retry", Outcome: string(events.OutcomeRecovered), Seq: 3})
		}
	}
	other := []correlate.Signal{
		{Tenant: "acme", Session: "o1", Kind: correlate.KindError, Class: "invalid_request", Status: 400, Provider: "anthropic", Model: "claude-opus-4-6", Detail: "bad request"},
		{Tenant: "acme", Session: "o2", Kind: correlate.KindError, Class: "authentication", Status: 401, Provider: "openai", Detail: "invalid api key"},
		{Tenant: "beta", Session: "o3", Kind: correlate.KindAnomaly, Class: "tool_use_without_result", Runtime: "claude-code 2.1.38", Tool: "Bash"},
		{Tenant: "beta", Session: "o4", Kind: correlate.KindError, Class: "rate_limit", Status: 429, Provider: "openai"},
		{Tenant: "gamma", Session: "o5", Kind: correlate.KindAnomaly, Class: correlate.ClassFlakyTool, Tool: "pytest"},
	}
	for i := range other {
		other[i].Seq, other[i].Time = 5, t0.Add(time.Duration(i*5)*time.Second)
	}
	sigs = append(sigs, other...)

	incs := correlate.Correlate(sigs, outs, correlate.Config{Now: t0.Add(5 * time.Minute)})
	if len(incs) != 6 {
		t.Fatalf("%d incidents, want 6 (the outage and the 5 unrelated): %+v", len(incs), titles(incs))
	}
	var outage *correlate.Incident
	for i := range incs {
		in := &incs[i]
		if in.Key.Class == "overloaded" {
			if outage != nil {
				t.Fatalf("two overloaded incidents: %v", titles(incs))
			}
			outage = in
			continue
		}
		if len(in.Sessions) != 1 || !strings.HasPrefix(in.Sessions[0].Session, "o") {
			t.Errorf("incident %s holds %+v, want one of the unrelated sessions", in.Title, in.Sessions)
		}
	}
	if outage == nil {
		t.Fatal("no overloaded incident")
	}
	if len(outage.Sessions) != 30 || outage.Signals != 60 || len(outage.Tenants) != 3 || outage.Recurring || len(outage.Windows) != 1 {
		t.Fatalf("outage: %d sessions, %d signals, tenants %v, recurring %v, windows %+v", len(outage.Sessions), outage.Signals, outage.Tenants, outage.Recurring, outage.Windows)
	}
	for _, a := range outage.Sessions {
		if strings.HasPrefix(a.Session, "o") {
			t.Errorf("unrelated session %s in the outage", a.Session)
		}
	}
	if !outage.FirstSeen.Equal(t0) || !outage.LastSeen.Equal(t0.Add(59*time.Second)) || !outage.Open {
		t.Errorf("outage seen %s..%s, open %v", outage.FirstSeen, outage.LastSeen, outage.Open)
	}
	want := "30 sessions on provider anthropic (3 tenants) failed with overloaded_error (529) at 2026-11-22 16:07 UTC; " +
		"26 recovered by switch_provider, 2 failed to recover (pause), 2 with no recovery"
	if outage.Hypothesis != want {
		t.Errorf("hypothesis\n got %q\nwant %q", outage.Hypothesis, want)
	}
	if len(outage.Breakdown.Models) != 1 || outage.Breakdown.Providers != nil || outage.Code != "overloaded_error (529)" {
		t.Errorf("breakdown %+v, code %q", outage.Breakdown, outage.Code)
	}
}

func titles(incs []correlate.Incident) []string {
	var out []string
	for _, in := range incs {
		out = append(out, fmt.Sprintf("%s (%d sessions)", in.Title, len(in.Sessions)))
	}
	return out
}

// TestWindowsAndRecurrence: the same key in two runs further apart than
// the gap is one incident with two windows, recurring.
func TestWindowsAndRecurrence(t *testing.T) {
	cases := []struct {
		name      string
		offsets   []time.Duration // one session each
		gap       time.Duration
		windows   []int // sessions per window
		recurring bool
	}{
		{"one burst", []time.Duration{0, 10 * time.Second, 50 * time.Second}, 0, []int{3}, false},
		{"two bursts an hour apart", []time.Duration{0, 30 * time.Second, time.Hour, time.Hour + 5*time.Second}, 0, []int{2, 2}, true},
		{"a slow drip stays one window", []time.Duration{0, 9 * time.Minute, 18 * time.Minute, 27 * time.Minute}, 0, []int{4}, false},
		{"a gap just over the bound splits", []time.Duration{0, 10*time.Minute + time.Second}, 0, []int{1, 1}, true},
		{"a shorter gap splits more", []time.Duration{0, 2 * time.Minute, 4 * time.Minute}, time.Minute, []int{1, 1, 1}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var sigs []correlate.Signal
			for i, off := range c.offsets {
				sigs = append(sigs, overloaded("acme", fmt.Sprint("s", i), 1, t0.Add(off)))
			}
			incs := correlate.Correlate(sigs, nil, correlate.Config{Gap: c.gap, Now: t0.Add(2 * time.Hour)})
			if len(incs) != 1 {
				t.Fatalf("%d incidents, want 1", len(incs))
			}
			in := incs[0]
			var got []int
			for _, w := range in.Windows {
				got = append(got, w.Sessions)
			}
			if fmt.Sprint(got) != fmt.Sprint(c.windows) || in.Recurring != c.recurring {
				t.Fatalf("windows %v recurring %v, want %v %v", got, in.Recurring, c.windows, c.recurring)
			}
			if c.recurring && !strings.Contains(in.Hypothesis, fmt.Sprintf("in %d windows: ", len(c.windows))) {
				t.Errorf("hypothesis %q does not name the windows", in.Hypothesis)
			}
		})
	}
}

func TestOutcomeAndOpen(t *testing.T) {
	sig := overloaded("acme", "s", 10, t0)
	cases := []struct {
		name    string
		outs    []correlate.Outcome
		now     time.Time
		outcome string
		by      string
		open    bool
	}{
		{"no command", nil, t0.Add(time.Minute), correlate.OutcomeNone, "", true},
		{"a command before the signal", []correlate.Outcome{{Outcome: "recovered", Kind: "retry_turn", Seq: 9}}, t0.Add(time.Minute), correlate.OutcomeNone, "", true},
		{"running", []correlate.Outcome{{Outcome: correlate.OutcomeRunning, Kind: "retry_turn", Seq: 11}}, t0.Add(time.Minute), correlate.OutcomeRunning, "retry_turn", true},
		{"the latest done wins", []correlate.Outcome{
			{Outcome: "failed", Kind: "retry_turn", Strategy: "retry", Seq: 11},
			{Outcome: "recovered", Kind: "switch_provider", Seq: 20},
			{Outcome: correlate.OutcomeRunning, Kind: "distill", Seq: 30},
		}, t0.Add(time.Minute), "recovered", "switch_provider", false},
		{"degraded closes it", []correlate.Outcome{{Outcome: "degraded", Kind: "retry_turn", Strategy: "degrade", Seq: 11}}, t0.Add(time.Minute), "degraded", "degrade", false},
		{"parked", []correlate.Outcome{{Outcome: correlate.OutcomeParked, Kind: "retry_turn", Seq: 11}}, t0.Add(time.Minute), correlate.OutcomeParked, "retry_turn", true},
		{"quiet past OpenFor", nil, t0.Add(31 * time.Minute), correlate.OutcomeNone, "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for i := range c.outs {
				c.outs[i].Tenant, c.outs[i].Session = "acme", "s"
			}
			incs := correlate.Correlate([]correlate.Signal{sig}, c.outs, correlate.Config{Now: c.now})
			a := incs[0].Sessions[0]
			if a.Outcome != c.outcome || a.By != c.by || incs[0].Open != c.open {
				t.Errorf("outcome %q by %q open %v, want %q by %q open %v", a.Outcome, a.By, incs[0].Open, c.outcome, c.by, c.open)
			}
		})
	}
}

// TestFromSession folds a small session and reads its signals: the
// error.recorded and the turn.failed of one 529 give one key, the orphan
// a failed turn declared is counted in that turn's signal (one cause),
// and the recovery command gives an outcome.
func TestFromSession(t *testing.T) {
	var evs []events.Event
	seq := uint64(0)
	add := func(turn string, p events.Payload) {
		seq++
		ev, err := events.NewAt(t0.Add(time.Duration(seq)*time.Second), events.NewID(), "acme", "s1", turn, p)
		if err != nil {
			t.Fatal(err)
		}
		ev.Seq = seq
		evs = append(evs, ev)
	}
	e529 := events.ErrorInfo{Message: "Overloaded", Kind: events.KindTransient, Provider: "anthropic", HTTPStatus: 529, Code: "overloaded_error"}
	add("", &events.SessionStarted{Runtime: "refruntime 1", Model: "m1", Provider: "anthropic"})
	add("t1", &events.TurnStarted{Prompt: "go"})
	add("t1", &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: "text", Text: "go"}}})
	add("t1", &events.ErrorRecorded{ErrorInfo: e529, Consecutive: 1, Stage: events.StageExecute})
	add("t1", &events.TurnFailed{Stage: events.StageExecute, Error: e529})
	add("", &events.RecoveryAttempted{CommandID: "c1", Kind: "retry_turn", Attempt: 1, Strategy: "switch_provider", Result: "ok"})
	add("", &events.RecoveryCompleted{CommandID: "c1", Kind: "retry_turn", Outcome: events.OutcomeRecovered, Strategy: "switch_provider", Attempts: 1})
	add("t2", &events.TurnStarted{Prompt: "again"})
	add("t2", &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: "text", Text: "again"}}})
	add("t2", &events.MessageAppended{Role: events.RoleAssistant, Content: []events.ContentBlock{{Type: "tool_use", ID: "toolu_1", Name: "Bash", Input: []byte(`{}`)}}})
	add("t2", &events.TurnFailed{Stage: events.StageExecute, Error: events.ErrorInfo{Message: "runtime died", Kind: events.KindUnknown}})

	s := projections.Fold(evs)
	sigs, outs := correlate.FromSession(s)
	var got []string
	for _, sg := range sigs {
		line := fmt.Sprintf("%d %s %s tool=%s", sg.Seq, sg.Kind, correlate.KeyOf(sg), sg.Tool)
		if sg.Orphans > 0 {
			line += fmt.Sprintf(" orphans=%d", sg.Orphans)
		}
		got = append(got, line)
	}
	want := []string{
		"5 error kind=error class=overloaded code=529 provider=anthropic tool=",
		"11 error kind=error class=unknown runtime=refruntime 1 tool= orphans=1",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("signals\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, sg := range sigs {
		if sg.Time.IsZero() {
			t.Errorf("signal %+v has no time", sg)
		}
	}
	if len(outs) != 1 || outs[0].Outcome != string(events.OutcomeRecovered) || outs[0].By() != "switch_provider" || outs[0].Seq != 6 {
		t.Errorf("outcomes %+v", outs)
	}
}

// fold folds the payloads as events of session acme/<session>, one a
// second from t0, and returns the state.
func fold(t *testing.T, session string, steps ...struct {
	turn string
	p    events.Payload
}) *projections.Session {
	t.Helper()
	var evs []events.Event
	for i, st := range steps {
		ev, err := events.NewAt(t0.Add(time.Duration(i)*time.Second), events.NewID(), "acme", session, st.turn, st.p)
		if err != nil {
			t.Fatal(err)
		}
		ev.Seq = uint64(i + 1)
		evs = append(evs, ev)
	}
	return projections.Fold(evs)
}

type step = struct {
	turn string
	p    events.Payload
}

// incidentsOf correlates the sessions' signals.
func incidentsOf(now time.Time, states ...*projections.Session) []correlate.Incident {
	var sigs []correlate.Signal
	var outs []correlate.Outcome
	for _, s := range states {
		sg, o := correlate.FromSession(s)
		sigs, outs = append(sigs, sg...), append(outs, o...)
	}
	return correlate.Correlate(sigs, outs, correlate.Config{Now: now})
}

// crashed is a session whose runtime died between two parallel tool_use
// blocks and their results; the turn is abandoned (cause), which
// declares both orphans, and a repair answers them (repaired).
func crashed(t *testing.T, session, cause string, repaired bool) *projections.Session {
	t.Helper()
	steps := []step{
		{"", &events.SessionStarted{Runtime: "refruntime 1", Model: "m1", Provider: "anthropic"}},
		{"t1", &events.TurnStarted{Prompt: "go"}},
		{"t1", &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: "text", Text: "go"}}}},
		{"t1", &events.MessageAppended{Role: events.RoleAssistant, Content: []events.ContentBlock{
			{Type: "tool_use", ID: "toolu_1", Name: "Bash", Input: []byte(`{}`)}, {Type: "tool_use", ID: "toolu_2", Name: "Read", Input: []byte(`{}`)}}}},
		{"t1", &events.TurnAbandoned{Reason: "runtime crashed", Cause: cause, Stage: events.StageExecute, LastStageCompleted: events.StageHistory}},
	}
	if repaired {
		steps = append(steps,
			step{"", &events.RecoveryAttempted{CommandID: "c1", Kind: "repair_orphans", Attempt: 1, Result: "ok"}},
			step{"", &events.MessageAppended{Role: events.RoleUser, Synthetic: true, Content: []events.ContentBlock{
				{Type: "tool_result", ToolUseID: "toolu_1", Text: "interrupted", IsError: true}, {Type: "tool_result", ToolUseID: "toolu_2", Text: "interrupted", IsError: true}}}},
			step{"", &events.RecoveryCompleted{CommandID: "c1", Kind: "repair_orphans", Outcome: events.OutcomeRecovered, Attempts: 1}})
	}
	s := fold(t, session, steps...)
	if len(s.Orphans) != 2 || s.Turns[0].Status != projections.TurnAbandoned {
		t.Fatalf("the crash folds to orphans %+v, turns %+v", s.Orphans, s.Turns)
	}
	return s
}

// TestOneCauseIsOneIncident: a crash's abandon and the orphans it declared
// are one incident, labelled with how the turn was abandoned; a 401 and
// the retry that paused the session for a person are one incident; a
// logic error of the runtime is not a provider's.
func TestOneCauseIsOneIncident(t *testing.T) {
	now := t0.Add(time.Minute)
	t.Run("crash", func(t *testing.T) {
		incs := incidentsOf(now, crashed(t, "s1", events.AbandonManual, true))
		if len(incs) != 1 {
			t.Fatalf("a crash makes %d incidents: %+v", len(incs), incs)
		}
		in := incs[0]
		if in.Key.Class != correlate.ClassTurnAbandoned || in.Orphans != 2 || in.Label != "turn abandoned by hand, 2 orphaned tool_uses" ||
			!strings.Contains(in.Hypothesis, "had a turn abandoned by hand, leaving 2 orphaned tool_uses") ||
			!strings.Contains(in.Hypothesis, "1 recovered by repair_orphans") || in.Severity != correlate.SeverityLow {
			t.Errorf("crash incident: label %q, hypothesis %q, orphans %d, severity %s", in.Label, in.Hypothesis, in.Orphans, in.Severity)
		}
		if strings.Contains(in.Hypothesis, "deadline") {
			t.Errorf("an abandon by hand reads as a deadline's: %q", in.Hypothesis)
		}
		// By deadline, unrepaired and recent: high; the words say so.
		in = incidentsOf(now, crashed(t, "s2", events.AbandonDeadline, false))[0]
		if in.Label != "turn abandoned by its deadline, 2 orphaned tool_uses" || in.Severity != correlate.SeverityHigh || !in.Open {
			t.Errorf("deadline incident: label %q, severity %s, open %v", in.Label, in.Severity, in.Open)
		}
		// Mixed causes are counted.
		in = incidentsOf(now, crashed(t, "s3", events.AbandonManual, true), crashed(t, "s4", events.AbandonDeadline, true), crashed(t, "s5", events.AbandonDeadline, true))[0]
		if !strings.Contains(in.Hypothesis, "had a turn abandoned (2 by their deadline, 1 by hand), leaving 6 orphaned tool_uses") || in.Label != "turn abandoned, 6 orphaned tool_uses" {
			t.Errorf("mixed causes: label %q, hypothesis %q", in.Label, in.Hypothesis)
		}
	})
	t.Run("401", func(t *testing.T) {
		e401 := events.ErrorInfo{Message: "invalid x-api-key", Kind: events.KindLogic, Provider: "anthropic", HTTPStatus: 401, Code: "authentication_error"}
		s := fold(t, "auth",
			step{"", &events.SessionStarted{Runtime: "refruntime 1", Model: "m1", Provider: "anthropic"}},
			step{"t1", &events.TurnStarted{Prompt: "go"}},
			step{"t1", &events.ErrorRecorded{ErrorInfo: e401, Consecutive: 1, Stage: events.StageExecute}},
			step{"t1", &events.TurnFailed{Stage: events.StageExecute, Error: e401}},
			step{"", &events.SessionPaused{Reason: "needs a person", Cause: events.CauseNeedsPerson, CommandID: "c1", Kind: "retry_turn"}},
			step{"", &events.RecoveryAttempted{CommandID: "c1", Kind: "retry_turn", Attempt: 1, Strategy: "pause", Result: "ok"}},
			step{"", &events.RecoveryCompleted{CommandID: "c1", Kind: "retry_turn", Outcome: events.OutcomeFailed, Strategy: "pause", Attempts: 1,
				Detail: "retry_turn: not retried (authentication); session paused"}},
		)
		incs := incidentsOf(now, s)
		if len(incs) != 1 {
			for _, in := range incs {
				t.Logf("%s: %s", in.Title, in.Hypothesis)
			}
			t.Fatalf("a 401 makes %d incidents", len(incs))
		}
		in := incs[0]
		if in.Key.Class != "authentication" || in.Severity != correlate.SeverityHigh || in.Label != "authentication: authentication_error (401)" ||
			!strings.Contains(in.Hypothesis, "1 failed to recover (pause)") {
			t.Errorf("401 incident: %+v", in)
		}
		// A command that failed with nothing before it is an incident of
		// its own.
		lone := fold(t, "lone",
			step{"", &events.SessionStarted{Runtime: "refruntime 1"}},
			step{"", &events.RecoveryAttempted{CommandID: "c9", Kind: "distill", Attempt: 1, Result: "failed", Class: "runtime_unavailable"}},
			step{"", &events.RecoveryCompleted{CommandID: "c9", Kind: "distill", Outcome: events.OutcomeFailed, Attempts: 1}},
		)
		if incs := incidentsOf(now, lone); len(incs) != 1 || incs[0].Key.Class != correlate.ClassRecoveryFailed || incs[0].Label != "recovery distill failed" {
			t.Errorf("a lone failed command: %+v", incs)
		}
	})
	t.Run("logic", func(t *testing.T) {
		s := fold(t, "logic",
			step{"", &events.SessionStarted{Runtime: "refruntime 1", Model: "m1", Provider: "anthropic"}},
			step{"t1", &events.TurnStarted{Prompt: "go"}},
			step{"t1", &events.TurnFailed{Stage: events.StageHistory, Error: events.ErrorInfo{Message: "refruntime: injected failure in the history stage", Kind: events.KindLogic}}},
		)
		incs := incidentsOf(now, s)
		if len(incs) != 1 {
			t.Fatalf("%d incidents", len(incs))
		}
		in := incs[0]
		if in.Key.Class != correlate.ClassLogic || in.Key.Provider != "" || in.Key.Stage != "history" || in.Label != "logic error in stage history" ||
			strings.Contains(in.Title, "provider") || strings.Contains(in.Hypothesis, "anthropic") ||
			!strings.Contains(in.Hypothesis, "failed in stage history with a logic error of its own (not a provider's)") {
			t.Errorf("logic incident: key %+v, title %q, label %q, hypothesis %q", in.Key, in.Title, in.Label, in.Hypothesis)
		}
		// A provider's 400 stays the provider's.
		p := fold(t, "bad",
			step{"", &events.SessionStarted{Runtime: "refruntime 1", Model: "m1", Provider: "anthropic"}},
			step{"t1", &events.TurnStarted{Prompt: "go"}},
			step{"t1", &events.TurnFailed{Stage: events.StageExecute, Error: events.ErrorInfo{Message: "bad", Kind: events.KindLogic, HTTPStatus: 400, Code: "invalid_request_error"}}},
		)
		if in := incidentsOf(now, p)[0]; in.Key.Class != "invalid_request" || in.Key.Provider != "anthropic" {
			t.Errorf("a provider's 400: %+v", in.Key)
		}
	})
}
