package projections

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
)

// TestView checks the read model's rules, state by state: each orphan and
// violation is in exactly one of its states, the counts add up to the
// totals, the status agrees with the open violations, and the first
// anomaly is the earliest.
func TestView(t *testing.T) {
	repair := at(synthetic(events.ContentBlock{Type: events.BlockToolResult, ToolUseID: "toolu_1", IsError: true, Content: json.RawMessage(`"interrupted"`)}))
	orphaned := []step{
		in("t1", started("build it")),
		in("t1", user(text("build it"))),
		in("t1", asst(text("Building."), use("toolu_1", "Bash"))),
		in("t1", failed("worker killed")),
	}
	tests := []struct {
		name   string
		steps  []step
		status SessionStatus
		want   Counts
		first  string // FirstAnomaly.What ("" for none)
		state  string // FirstAnomaly.State
		check  func(t *testing.T, v View)
	}{
		{name: "clean", status: StatusIdle, steps: []step{
			in("t1", started("hi")), in("t1", user(text("hi"))), in("t1", asst(text("hello"))), in("t1", completed()),
		}, want: Counts{TurnsTotal: 1, TurnsCompleted: 1}},
		{name: "open orphan", status: StatusBroken, steps: orphaned,
			want:  Counts{TurnsTotal: 1, TurnsFailed: 1, OrphansOpen: 1, OrphansTotal: 1, ViolationsOpen: 1, ViolationsTotal: 1},
			first: string(RuleToolUseWithoutResult), state: StateOpen,
			check: func(t *testing.T, v View) {
				if !slices.Equal(v.OrphanedToolUseIDs, []string{"toolu_1"}) || len(v.OpenOrphans) != 1 || len(v.OpenViolations) != 1 ||
					!strings.Contains(v.StatusDetail, "tool_use_without_result") {
					t.Errorf("open orphan view: %+v", v)
				}
			}},
		{name: "repaired orphan", status: StatusIdle, steps: append(slices.Clone(orphaned), repair),
			want:  Counts{TurnsTotal: 1, TurnsFailed: 1, OrphansRepaired: 1, OrphansTotal: 1, ViolationsResolved: 1, ViolationsTotal: 1},
			first: string(RuleToolUseWithoutResult), state: StateResolved,
			check: func(t *testing.T, v View) {
				if len(v.OrphanedToolUseIDs) != 0 || len(v.RepairedOrphans) != 1 || len(v.ResolvedViolations) != 1 || len(v.OpenViolations) != 0 ||
					v.FirstAnomaly.ResolvedSeq != 5 {
					t.Errorf("repaired orphan view: %+v", v)
				}
			}},
		{name: "orphan reset by a distillation", status: StatusIdle, steps: append(slices.Clone(orphaned),
			at(&events.DistillationStarted{}), at(&events.DistillationCompleted{Trigger: "manual"})),
			want: Counts{TurnsTotal: 1, TurnsFailed: 1, OrphansReset: 1, OrphansTotal: 1,
				// The distillation over the orphan is dirty: a violation too, reset with the history.
				ViolationsReset: 2, ViolationsTotal: 2},
			first: string(RuleToolUseWithoutResult), state: StateReset},
		{name: "paused with an open violation", status: StatusPaused, steps: append(slices.Clone(orphaned), at(&events.SessionPaused{Reason: "needs a person"})),
			want:  Counts{TurnsTotal: 1, TurnsFailed: 1, OrphansOpen: 1, OrphansTotal: 1, ViolationsOpen: 1, ViolationsTotal: 1},
			first: string(RuleToolUseWithoutResult), state: StateOpen,
			check: func(t *testing.T, v View) {
				if !v.Paused || v.StatusDetail != "needs a person" {
					t.Errorf("paused view: %+v", v)
				}
			}},
		{name: "turn in flight", status: StatusInTurn, steps: []step{
			in("t1", started("long")), in("t1", &events.TurnStageCompleted{Stage: events.StageContext}),
		}, want: Counts{TurnsTotal: 1, TurnsInFlight: 1},
			check: func(t *testing.T, v View) {
				if !slices.Equal(v.InFlight, []string{"t1"}) || !strings.Contains(v.StatusDetail, "in stage history") {
					t.Errorf("in-flight view: %+v", v)
				}
			}},
		{name: "abandoned turn", status: StatusIdle, steps: []step{
			in("t1", started("long")), in("t1", &events.TurnStageCompleted{Stage: events.StageContext}),
			in("t1", &events.TurnAbandoned{LastStageCompleted: events.StageContext, Stage: events.StageHistory, Reason: "deadline"}),
		}, want: Counts{TurnsTotal: 1, TurnsAbandoned: 1}, first: AnomalyTurnAbandoned,
			check: func(t *testing.T, v View) {
				if !strings.Contains(v.FirstAnomaly.Detail, "abandoned in history (last stage completed: context)") {
					t.Errorf("abandoned turn: %+v", v.FirstAnomaly)
				}
			}},
		{name: "invalid event", status: StatusBroken, steps: []step{rawStep(rawEvent(events.TypeTurnStarted, "", `{}`))},
			want: Counts{ViolationsOpen: 1, ViolationsTotal: 1, InvalidEvents: 1}, first: string(RuleInvalidEvent), state: StateOpen},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := FoldLog(build(t, tt.steps))
			v := s.View()
			if v.Status != tt.status || v.Status != s.Status() {
				t.Errorf("status %s (Status() %s), want %s", v.Status, s.Status(), tt.status)
			}
			if v.Counts != tt.want || s.Counts() != tt.want {
				t.Errorf("counts\n got %+v\nwant %+v", v.Counts, tt.want)
			}
			c := v.Counts
			if c.OrphansOpen+c.OrphansRepaired+c.OrphansReset != c.OrphansTotal || c.ViolationsOpen+c.ViolationsResolved+c.ViolationsReset != c.ViolationsTotal {
				t.Errorf("the states do not add up to the totals: %+v", c)
			}
			if (v.Status == StatusBroken) != (c.ViolationsOpen > 0 && !v.Paused && c.TurnsInFlight == 0) {
				t.Errorf("status %s with %d open violations", v.Status, c.ViolationsOpen)
			}
			for i := range s.Violations {
				if st := s.ViolationState(i); (st == StateResolved) != s.Violations[i].Resolved {
					t.Errorf("violation %d: state %s, resolved %v", i, st, s.Violations[i].Resolved)
				}
			}
			switch {
			case tt.first == "" && v.FirstAnomaly != nil:
				t.Errorf("first anomaly %+v, want none", v.FirstAnomaly)
			case tt.first != "" && (v.FirstAnomaly == nil || v.FirstAnomaly.What != tt.first || v.FirstAnomaly.State != tt.state):
				t.Errorf("first anomaly %+v, want %s (%s)", v.FirstAnomaly, tt.first, tt.state)
			}
			if v.Anomalous != s.Anomalous() {
				t.Errorf("Anomalous %v, Session.Anomalous %v", v.Anomalous, s.Anomalous())
			}
			if tt.check != nil {
				tt.check(t, v)
			}
		})
	}
}

// TestViewJSON checks the promises of View's JSON: arrays are never null,
// first_anomaly and last_command are null when there is none, and the
// counts have their names.
func TestViewJSON(t *testing.T) {
	b, err := json.Marshal((&Session{}).View())
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"in_flight", "orphaned_tool_use_ids", "open_orphans", "repaired_orphans", "open_violations", "resolved_violations"} {
		if string(m[k]) != "[]" {
			t.Errorf("%s = %s, want []", k, m[k])
		}
	}
	for _, k := range []string{"first_anomaly", "last_command"} {
		if string(m[k]) != "null" {
			t.Errorf("%s = %s, want null", k, m[k])
		}
	}
	var counts map[string]int
	if err := json.Unmarshal(m["counts"], &counts); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"turns_total", "turns_in_flight", "orphans_open", "orphans_repaired", "orphans_reset", "orphans_total",
		"violations_open", "violations_resolved", "violations_reset", "violations_total", "invalid_events"} {
		if _, ok := counts[k]; !ok {
			t.Errorf("counts lack %s: %s", k, m["counts"])
		}
	}

	iv := InvalidSubjectView("agent.evt.acme.*", "acme", "*", 2, "4 tokens, want 5")
	if iv.Status != StatusInvalid || !iv.Anomalous || iv.FirstAnomaly.What != AnomalyInvalidSubject || !strings.Contains(iv.FirstAnomaly.Detail, "agent.evt.acme.*") {
		t.Errorf("invalid subject view: %+v", iv)
	}
}

// TestInterruptedHistory: a history session whose transcript ends with a
// tool_use in flight reads interrupted once its last event is older than
// the horizon, naming the pending tool_use; a live session, or a recent
// one, reads in_turn; the grown transcript continues the turn (nothing
// was written), and the index row says the same as the View.
func TestInterruptedHistory(t *testing.T) {
	cut := []step{
		at(&events.SessionStarted{History: true}),
		in("t1", started("build it")),
		in("t1", user(text("build it"))),
		in("t1", asst(text("Building."), use("toolu_1", "Bash"), use("toolu_2", "Read"))),
	}
	s := FoldLog(build(t, cut))
	last := s.LastTime
	if got := s.StatusAt(last.Add(29*time.Minute), 0); got != StatusInTurn {
		t.Fatalf("29 minutes after its last event: %s, want in_turn", got)
	}
	later := last.Add(31 * time.Minute)
	v := s.ViewAt(later, DefaultLiveHorizon)
	if v.Status != StatusInterrupted || !slices.Equal(v.PendingToolUseIDs, []string{"toolu_1", "toolu_2"}) ||
		!strings.Contains(v.StatusDetail, "toolu_1, toolu_2") || !strings.Contains(v.StatusDetail, "mid-turn") {
		t.Fatalf("31 minutes on: %+v", v)
	}
	if got := s.StatusAt(later, time.Hour); got != StatusInTurn {
		t.Fatalf("with a horizon of an hour: %s, want in_turn", got)
	}
	if got := s.Summary(0).StatusAt(later, 0); got != StatusInterrupted {
		t.Fatalf("index row: %s, want interrupted", got)
	}
	if s.Status() != StatusInTurn || s.Summary(0).Status != StatusInTurn {
		t.Fatal("the stored status changed: interrupted must be computed, not folded")
	}
	live := FoldLog(build(t, cut[1:]))
	if got := live.StatusAt(later, 0); got != StatusInTurn {
		t.Fatalf("a live session: %s, want in_turn (the reconciler ends its turns)", got)
	}
	grown := FoldLog(build(t, append(cut, in("t1", user(result("toolu_1"), result("toolu_2"))), in("t1", asst(text("done"))), in("t1", completed()))))
	if got := grown.StatusAt(later.Add(time.Hour), 0); got != StatusIdle || grown.Counts().OrphansTotal != 0 {
		t.Fatalf("the grown transcript: %s, %+v, want idle with no orphan", got, grown.Counts())
	}
}

// TestTriage: the fleet list's few words name the latest anomaly (a
// turn's end before the orphans it declared), how an abandoned turn was
// abandoned, a violation's state, and the latest recovery with its
// outcome; a session that counts a tool error counts it once.
func TestTriage(t *testing.T) {
	crash := []step{
		in("t1", started("build it")),
		in("t1", user(text("build it"))),
		in("t1", asst(text("Building."), use("toolu_1", "Bash"))),
		in("t1", &events.TurnAbandoned{Reason: "runtime crashed", Cause: events.AbandonManual, Stage: events.StageExecute}),
	}
	s := Fold(build(t, crash))
	if got := s.Triage().Text(); got != "turn abandoned by hand" {
		t.Errorf("crash: %q", got)
	}
	if m := s.Summary(0); !m.NeedsAttention() || m.Triage.Anomaly != AnomalyTurnAbandoned {
		t.Errorf("crash summary: %+v", m)
	}
	repaired := append(crash,
		at(&events.RecoveryAttempted{CommandID: "c1", Kind: "repair_orphans", Attempt: 1, Result: events.AttemptOK}),
		at(synthetic(events.ContentBlock{Type: events.BlockToolResult, ToolUseID: "toolu_1", IsError: true, Content: json.RawMessage(`"interrupted"`)})),
		at(&events.RecoveryCompleted{CommandID: "c1", Kind: "repair_orphans", Outcome: events.OutcomeRecovered, Attempts: 1}))
	s = Fold(build(t, repaired))
	if got := s.Triage().Text(); got != "turn abandoned by hand · repair_orphans recovered" {
		t.Errorf("repaired crash: %q", got)
	}
	if m := s.Summary(0); m.NeedsAttention() || s.Totals.ToolErrors != 0 {
		t.Errorf("a repaired crash needs attention (%+v) or counts the synthetic result as a tool error (%d)", m, s.Totals.ToolErrors)
	}
	// A tool error counts once, whatever reports it.
	s = Fold(build(t, []step{
		in("t1", started("go")), in("t1", user(text("go"))), in("t1", asst(use("toolu_1", "Bash"))),
		in("t1", user(events.ContentBlock{Type: events.BlockToolResult, ToolUseID: "toolu_1", IsError: true, Content: json.RawMessage(`"exit 1"`)})),
		in("t1", &events.ToolCallCompleted{ToolUseID: "toolu_1", Name: "Bash", IsError: true}),
		in("t1", completed()),
	}))
	if s.Totals.ToolErrors != 1 || s.Triage().Text() != "" {
		t.Errorf("tool errors %d, triage %q", s.Totals.ToolErrors, s.Triage().Text())
	}
}
