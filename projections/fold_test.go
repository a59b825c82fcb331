package projections

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/turnstone-dev/turnstone/events"
)

// foldCase is one table test of the fold: steps become events with
// sequences 1, 2, ...; want lists every violation Apply returns as
// "seq:rule", and the state's too unless kept (after a rewind) lists the
// state's.
type foldCase struct {
	name   string
	steps  []step
	want   []string
	kept   []string
	status SessionStatus
	check  func(t *testing.T, s *Session)
}

// allFoldCases returns every table case, for the properties that run over
// all of them at once. The rewinds come first: the later cut points then
// need no refold, which keeps the every-cut property quick.
func allFoldCases() []foldCase {
	return slices.Concat(rewindCases(), toolRuleCases(), turnCases(), distillationCases(), errorCases(), invalidCases(),
		repairCases(), recoveryCases(), loopCases(), budgetCases(), flakyCases(), pendingCases())
}

func runFoldCases(t *testing.T, cases []foldCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			evs := build(t, tc.steps)
			s := &Session{}
			var got []string
			for _, ev := range evs {
				got = append(got, rules(applyLog(t, s, ev, evs))...)
			}
			if got == nil {
				got = []string{}
			}
			want := tc.want
			if want == nil {
				want = []string{}
			}
			if !slices.Equal(got, want) {
				t.Errorf("violations returned by Apply = %v, want %v", got, want)
			}
			kept := want
			if tc.kept != nil {
				kept = tc.kept
			}
			if all := rules(s.Violations); !slices.Equal(all, kept) {
				t.Errorf("state violations = %v, want %v", all, kept)
			}
			if s.NeedsRefold {
				t.Errorf("NeedsRefold still set")
			}
			if tc.status != "" && s.Status() != tc.status {
				t.Errorf("Status() = %q, want %q", s.Status(), tc.status)
			}
			if s.Events != len(evs) {
				t.Errorf("Events = %d, want %d", s.Events, len(evs))
			}
			if tc.check != nil {
				tc.check(t, s)
			}
		})
	}
}

func toolRuleCases() []foldCase {
	return []foldCase{
		{
			name: "tool round trip is clean",
			steps: []step{
				at(&events.SessionStarted{Runtime: "claude-code", Model: "claude-opus-4"}),
				in("t1", started("list files")),
				in("t1", user(text("list files"))),
				in("t1", asst(text("Let me look."), use("a", "Bash"))),
				in("t1", &events.ToolCallStarted{ToolUseID: "a", Name: "Bash"}),
				in("t1", &events.ToolCallCompleted{ToolUseID: "a", Name: "Bash", DurationMS: 40}),
				in("t1", user(result("a"))),
				in("t1", asst(text("Two files."))),
				in("t1", completed()),
			},
			status: StatusIdle,
			check: func(t *testing.T, s *Session) {
				if len(s.Messages) != 4 || len(s.Orphans) != 0 || len(s.Pending) != 0 {
					t.Fatalf("messages %d orphans %d pending %v", len(s.Messages), len(s.Orphans), s.Pending)
				}
				tc := s.ToolCall("a")
				if tc == nil || tc.Status != ToolAnswered || tc.UseSeq != 4 || tc.ResultSeq != 7 ||
					tc.StartedSeq != 5 || tc.CompletedSeq != 6 || tc.DurationMS != 40 || tc.Name != "Bash" || tc.Turn != "t1" || tc.Message != 2 {
					t.Errorf("tool call = %+v", tc)
				}
				if s.Model != "claude-sonnet-4-5" || s.Runtime != "claude-code" || s.Kind != "main" {
					t.Errorf("identity: model %q runtime %q kind %q", s.Model, s.Runtime, s.Kind)
				}
				b := s.Messages[1].Blocks[1]
				if b.Type != "tool_use" || b.ID != "a" || b.Text != `{"command":"ls -la","timeout":30}` || b.Size != 33 {
					t.Errorf("tool_use digest = %+v", b)
				}
				if r := s.Messages[2].Blocks[0]; r.Text != "total 0\nfile.go" || r.ToolUseID != "a" {
					t.Errorf("tool_result digest = %+v", r)
				}
			},
		},
		{
			name: "unanswered tool_use is pending while the tool runs",
			steps: []step{
				in("t1", started("go")),
				in("t1", user(text("go"))),
				in("t1", asst(use("a", "Bash"), use("b", "Read"))),
				in("t1", &events.ToolCallStarted{ToolUseID: "a", Name: "Bash"}),
				in("t1", user(result("b"))),
			},
			status: StatusInTurn,
			check: func(t *testing.T, s *Session) {
				if !slices.Equal(s.Pending, []string{"a"}) || len(s.Orphans) != 0 {
					t.Errorf("pending %v orphans %v", s.Pending, s.Orphans)
				}
				if st := s.ToolCall("a").Status; st != ToolPending {
					t.Errorf("a is %s, want pending", st)
				}
			},
		},
		{
			name: "orphan when the next assistant message starts",
			steps: []step{
				in("t1", started("go")),
				in("t1", user(text("go"))),
				in("t1", asst(use("a", "Bash"), use("b", "Read"))),
				in("t1", user(result("b"), text("and then?"))),
				in("t1", asst(text("hm"))),
				in("t1", completed()),
			},
			want:   []string{"5:tool_use_without_result"},
			status: StatusBroken,
			check: func(t *testing.T, s *Session) {
				if got := s.OrphanedToolUseIDs(); !slices.Equal(got, []string{"a"}) {
					t.Errorf("OrphanedToolUseIDs = %v", got)
				}
				o := s.Orphans[0]
				if o.Seq != 3 || o.DeclaredSeq != 5 || o.Name != "Bash" || o.Turn != "t1" {
					t.Errorf("orphan = %+v", o)
				}
				if v := s.Violations[0]; v.ToolUseID != "a" || v.Turn != "t1" {
					t.Errorf("violation = %+v", v)
				}
			},
		},
		{
			name: "orphan when the turn holding it ends",
			steps: []step{
				in("t1", started("go")),
				in("t1", user(text("go"))),
				in("t1", asst(use("a", "Bash"))),
				in("t1", &events.TurnFailed{Stage: events.StageExecute, Error: errInfo("boom")}),
			},
			want:   []string{"4:tool_use_without_result"},
			status: StatusBroken,
		},
		{
			name: "a turn's end judges only its own tool_use blocks",
			steps: []step{
				in("t1", started("first")),
				in("t1", user(text("first"))),
				in("t2", started("second, mid-turn")),
				in("t2", asst(use("a", "Bash"))),
				in("t1", completed()),
				in("t2", completed()),
			},
			want: []string{"6:tool_use_without_result"},
			check: func(t *testing.T, s *Session) {
				if s.Orphans[0].DeclaredSeq != 6 {
					t.Errorf("orphan declared at %d, want 6", s.Orphans[0].DeclaredSeq)
				}
			},
		},
		{
			name: "a second message mid-turn leaves the running tool pending",
			steps: []step{
				in("t1", started("go")),
				in("t1", user(text("go"))),
				in("t1", asst(use("a", "Bash"))),
				in("t2", started("are you there?")),
			},
			want:   nil,
			status: StatusInTurn,
			check: func(t *testing.T, s *Session) {
				if len(s.InFlight) != 2 || s.InFlightTurn().ID != "t1" {
					t.Errorf("in flight %v", s.InFlight)
				}
				if len(s.Pending) != 1 || s.Pending[0] != "a" {
					t.Errorf("pending %v, want [a]: its turn is still running", s.Pending)
				}
			},
		},
		{
			name: "orphan of no turn when a new turn starts",
			steps: []step{
				in("", user(text("go"))),
				in("", asst(use("a", "Bash"))),
				in("t2", started("are you there?")),
			},
			want:   []string{"3:tool_use_without_result"},
			status: StatusBroken,
		},
		{
			name: "tool_result for an unknown tool_use",
			steps: []step{
				at(user(text("hi"))),
				at(asst(text("hello"))),
				at(user(result("zz"))),
			},
			want:   []string{"3:tool_result_without_tool_use"},
			status: StatusBroken,
			check: func(t *testing.T, s *Session) {
				if u := s.UnmatchedResults; len(u) != 1 || u[0] != (UnmatchedResult{ToolUseID: "zz", Seq: 3, Reason: UnmatchedUnknown}) {
					t.Errorf("unmatched = %+v", u)
				}
			},
		},
		{
			name: "duplicate tool_result in merged user records",
			steps: []step{
				at(user(text("hi"))),
				at(asst(use("a", "Bash"))),
				at(user(result("a"))),
				at(user(result("a"))),
			},
			want: []string{"4:duplicate_tool_result"},
			check: func(t *testing.T, s *Session) {
				if s.UnmatchedResults[0].Reason != UnmatchedDuplicate || s.ToolCall("a").ResultSeq != 3 {
					t.Errorf("unmatched %+v, call %+v", s.UnmatchedResults, s.ToolCall("a"))
				}
				if len(s.Messages) != 3 || !slices.Equal(s.Messages[2].Seqs, []uint64{3, 4}) {
					t.Errorf("messages %+v", s.Messages)
				}
			},
		},
		{
			name: "tool_result for a tool_use of an earlier message",
			steps: []step{
				at(user(text("hi"))),
				at(asst(use("a", "Bash"))),
				at(user(result("a"))),
				at(asst(use("b", "Bash"))),
				at(user(result("a"), result("b"))),
			},
			want: []string{"5:tool_result_without_tool_use"},
			check: func(t *testing.T, s *Session) {
				if s.UnmatchedResults[0].Reason != UnmatchedNotPrevious || s.ToolCall("b").Status != ToolAnswered {
					t.Errorf("unmatched %+v, b %+v", s.UnmatchedResults, s.ToolCall("b"))
				}
			},
		},
		{
			// A result the runtime itself sends after the orphan was
			// declared is late (only a synthetic one repairs).
			name: "late result for a declared orphan",
			steps: []step{
				in("t1", started("go")),
				in("t1", user(text("go"))),
				in("t1", asst(use("a", "Bash"))),
				in("t1", &events.TurnAbandoned{Reason: "deadline passed"}),
				at(user(result("a"))),
			},
			want:   []string{"4:tool_use_without_result", "5:late_tool_result"},
			status: StatusBroken,
			check: func(t *testing.T, s *Session) {
				if len(s.Orphans) != 1 || s.Orphans[0].LateResultSeq != 5 || s.ToolCall("a").Status != ToolOrphaned {
					t.Errorf("orphans %+v call %+v", s.Orphans, s.ToolCall("a"))
				}
				if s.UnmatchedResults[0].Reason != UnmatchedLate || s.Messages[2].Synthetic {
					t.Errorf("unmatched %+v", s.UnmatchedResults)
				}
			},
		},
		{
			name: "results not first in the merged user message",
			steps: []step{
				at(user(text("hi"))),
				at(asst(use("a", "Bash"), use("b", "Bash"))),
				at(user(text("note"))),
				at(user(result("a"), result("b"))),
				at(user(result("c"))),
			},
			want: []string{"4:results_not_first", "5:tool_result_without_tool_use"},
			check: func(t *testing.T, s *Session) {
				if s.ToolCall("a").Status != ToolAnswered || s.ToolCall("b").Status != ToolAnswered {
					t.Errorf("results not paired: %+v", s.ToolCalls)
				}
			},
		},
		{
			name: "results first then text is fine",
			steps: []step{
				at(user(text("hi"))),
				at(asst(use("a", "Bash"))),
				at(user(result("a"), text("and also..."))),
				at(asst(text("ok"))),
			},
			status: StatusIdle,
		},
		{
			name: "first message not user",
			steps: []step{
				at(asst(text("hello, I start"))),
				at(user(text("hi"))),
			},
			want:   []string{"1:first_message_not_user"},
			status: StatusBroken,
		},
		{
			name: "assistant records with different message ids merge silently",
			steps: []step{
				at(user(text("hi"))),
				at(&events.MessageAppended{Role: events.RoleAssistant, MessageID: "msg_1", Content: []events.ContentBlock{text("a")}}),
				at(&events.MessageAppended{Role: events.RoleAssistant, MessageID: "msg_2", Content: []events.ContentBlock{use("a", "Bash")}, StopReason: "tool_use"}),
				at(user(result("a"))),
			},
			check: func(t *testing.T, s *Session) {
				if len(s.Messages) != 3 || len(s.Messages[1].Blocks) != 2 || s.Messages[1].StopReason != "tool_use" {
					t.Errorf("messages %+v", s.Messages)
				}
			},
		},
		{
			name: "duplicate tool_use id",
			steps: []step{
				at(user(text("hi"))),
				at(asst(use("a", "Bash"))),
				at(user(result("a"))),
				at(asst(use("a", "Bash"))),
			},
			want: []string{"4:duplicate_tool_use"},
			check: func(t *testing.T, s *Session) {
				if len(s.ToolCalls) != 1 || len(s.Pending) != 0 {
					t.Errorf("tool calls %+v pending %v", s.ToolCalls, s.Pending)
				}
			},
		},
		{
			name: "tool_call events before the tool_use block",
			steps: []step{
				at(user(text("hi"))),
				at(&events.ToolCallStarted{ToolUseID: "a", Name: "Bash"}),
				at(&events.ToolCallStarted{ToolUseID: "x", Name: "Read"}),
				at(asst(use("a", "Bash"))),
				at(user(result("a"))),
				at(user(result("x"))),
			},
			want: []string{"6:tool_result_without_tool_use"},
			check: func(t *testing.T, s *Session) {
				if a := s.ToolCall("a"); a.Status != ToolAnswered || a.StartedSeq != 2 || a.UseSeq != 4 {
					t.Errorf("a = %+v", a)
				}
				if x := s.ToolCall("x"); x.Status != CallOnly || x.Message != 0 {
					t.Errorf("x = %+v", x)
				}
			},
		},
	}
}

func TestFoldToolRules(t *testing.T) { runFoldCases(t, toolRuleCases()) }

func turnCases() []foldCase {
	return []foldCase{
		{
			name: "completed turn",
			steps: []step{
				in("t1", &events.TurnStarted{Prompt: strings.Repeat("é", 300), Trigger: "user", DeadlineMS: 60000}),
				in("t1", &events.TurnStageCompleted{Stage: events.StageContext}),
				in("t1", &events.TurnStageCompleted{Stage: events.StageExecute}),
				in("t1", &events.TurnCompleted{Reason: "interrupted"}),
			},
			status: StatusIdle,
			check: func(t *testing.T, s *Session) {
				tu := s.Turn("t1")
				if tu.Status != TurnCompleted || tu.Reason != "interrupted" || tu.LastStage != events.StageExecute ||
					tu.StartedSeq != 1 || tu.EndedSeq != 4 || tu.DurationMS != 3000 || tu.Index != 1 || tu.DeadlineMS != 60000 {
					t.Errorf("turn = %+v", tu)
				}
				if n := len([]rune(tu.Prompt)); n != PreviewRunes+1 {
					t.Errorf("prompt preview has %d runes", n)
				}
			},
		},
		{
			name: "default reason and given duration",
			steps: []step{
				in("t1", started("x")),
				in("t1", &events.TurnCompleted{DurationMS: 1234}),
			},
			check: func(t *testing.T, s *Session) {
				if tu := s.Turn("t1"); tu.Reason != "end_turn" || tu.DurationMS != 1234 {
					t.Errorf("turn = %+v", tu)
				}
			},
		},
		{
			name: "failed turn records its stage and error",
			steps: []step{
				in("t1", started("x")),
				in("t1", &events.TurnStageCompleted{Stage: events.StageContext}),
				in("t1", &events.TurnFailed{Stage: events.StageHistory, Error: errInfo("history load failed")}),
			},
			status: StatusIdle,
			check: func(t *testing.T, s *Session) {
				tu := s.Turn("t1")
				if tu.Status != TurnFailed || tu.FailedStage != events.StageHistory || tu.Error == nil || tu.Error.Message != "history load failed" || tu.LastStage != events.StageContext {
					t.Errorf("turn = %+v", tu)
				}
				if s.Errors.Total != 1 || s.Errors.Last.Seq != 3 || s.Errors.Last.Turn != "t1" || s.Errors.Streak.Count != 1 {
					t.Errorf("errors = %+v", s.Errors)
				}
			},
		},
		{
			name: "abandoned turn",
			steps: []step{
				in("t1", started("x")),
				in("t1", &events.TurnStageCompleted{Stage: events.StageContext}),
				in("t1", &events.TurnAbandoned{LastStage: events.StageHistory, Reason: "deadline 60s passed"}),
			},
			check: func(t *testing.T, s *Session) {
				if tu := s.Turn("t1"); tu.Status != TurnAbandoned || tu.Reason != "deadline 60s passed" || tu.LastStage != events.StageHistory {
					t.Errorf("turn = %+v", tu)
				}
			},
		},
		{
			name: "unknown turn",
			steps: []step{
				in("t9", &events.TurnStageCompleted{Stage: events.StageContext}),
				in("t9", completed()),
			},
			want:   []string{"1:turn_unknown", "2:turn_unknown"},
			status: StatusBroken,
		},
		{
			name: "second end and stage after the end",
			steps: []step{
				in("t1", started("x")),
				in("t1", completed()),
				in("t1", &events.TurnFailed{Stage: events.StageFinalize, Error: errInfo("late")}),
				in("t1", &events.TurnStageCompleted{Stage: events.StageFinalize}),
				in("t1", &events.TurnAbandoned{Reason: "deadline"}),
			},
			want: []string{"3:turn_already_ended", "4:turn_already_ended", "5:turn_already_ended"},
			check: func(t *testing.T, s *Session) {
				if tu := s.Turn("t1"); tu.Status != TurnCompleted || tu.EndedSeq != 2 {
					t.Errorf("the first end must stand: %+v", tu)
				}
				if s.Errors.Total != 0 {
					t.Errorf("a rejected turn.failed must not count its error")
				}
			},
		},
		{
			name: "duplicate start",
			steps: []step{
				in("t1", started("x")),
				in("t1", started("x")),
			},
			want:   []string{"2:turn_duplicate_start"},
			status: StatusBroken,
			check: func(t *testing.T, s *Session) {
				if len(s.Turns) != 1 || len(s.InFlight) != 1 {
					t.Errorf("turns %+v", s.Turns)
				}
			},
		},
		{
			name: "second turn mid-turn is tracked beside the first",
			steps: []step{
				in("t1", started("one")),
				in("t2", started("two")),
				in("t2", completed()),
			},
			status: StatusInTurn,
			check: func(t *testing.T, s *Session) {
				if s.InFlightTurn().ID != "t1" || s.Turn("t2").Index != 2 || !slices.Equal(s.InFlight, []string{"t1"}) {
					t.Errorf("in flight %v", s.InFlight)
				}
			},
		},
		{
			name: "pause, turn while paused, resume",
			steps: []step{
				at(&events.SessionPaused{Reason: "provider down"}),
				in("t1", started("x")),
				at(&events.SessionResumed{}),
			},
			want:   []string{"2:turn_while_paused"},
			status: StatusBroken,
		},
		{
			name: "paused wins over in_turn",
			steps: []step{
				in("t1", started("x")),
				at(&events.SessionPaused{Reason: "budget"}),
			},
			status: StatusPaused,
			check: func(t *testing.T, s *Session) {
				if !s.Paused || s.PauseReason != "budget" || s.PausedSeq != 2 {
					t.Errorf("pause = %v %q %d", s.Paused, s.PauseReason, s.PausedSeq)
				}
			},
		},
		{
			name:   "empty session is idle",
			steps:  []step{at(&events.SessionStarted{Kind: "subagent", ParentSession: "p1", ParentToolUseID: "toolu_1", Labels: map[string]string{"cwd": "/"}})},
			status: StatusIdle,
			check: func(t *testing.T, s *Session) {
				if s.Kind != "subagent" || s.ParentSession != "p1" || s.ParentToolUseID != "toolu_1" || s.Labels["cwd"] != "/" {
					t.Errorf("identity %+v", s)
				}
				if s.InFlightTurn() != nil {
					t.Errorf("InFlightTurn() = %+v, want nil", s.InFlightTurn())
				}
			},
		},
	}
}

func TestFoldTurns(t *testing.T) { runFoldCases(t, turnCases()) }

func distillationCases() []foldCase {
	cleanTurn := []step{
		in("t1", started("go")),
		in("t1", user(text("go"))),
		in("t1", asst(use("a", "Bash"))),
		in("t1", user(result("a"))),
	}
	return []foldCase{
		{
			name: "inline compaction of the in-flight turn over a clean history",
			steps: append(slices.Clip(cleanTurn),
				in("t1", &events.DistillationRequested{Reason: "auto"}),
				in("t1", &events.DistillationStarted{}),
				in("t1", &events.DistillationCompleted{TokensBefore: 1000, TokensAfter: 100, Trigger: "auto"}),
				in("t1", user(text("summary"))),
				in("t1", asst(text("continuing"))),
				in("t1", completed()),
			),
			status: StatusIdle,
			check: func(t *testing.T, s *Session) {
				d := s.Distillations[0]
				want := Distillation{RequestedSeq: 5, StartedSeq: 6, CompletedSeq: 7, RequestReason: "auto", FromSeq: 1, ToSeq: 5,
					TokensBefore: 1000, TokensAfter: 100, Trigger: "auto", Turn: "t1", Clean: true}
				if !distEqual(d, want) {
					t.Errorf("distillation = %+v\nwant %+v", d, want)
				}
				if len(s.Messages) != 2 || s.Messages[0].Index != 4 || len(s.ToolCalls) != 0 || s.HistoryStart.Seq != 7 {
					t.Errorf("history not reset: %+v, mark %+v", s.Messages, s.HistoryStart)
				}
			},
		},
		{
			name: "distillation during a foreign turn",
			steps: append(slices.Clip(cleanTurn),
				at(&events.DistillationStarted{}),
				at(&events.DistillationCompleted{}),
			),
			want: []string{"5:distillation_during_turn"},
			check: func(t *testing.T, s *Session) {
				if got := s.DirtyReasons(""); !slices.Equal(got, []string{DirtyTurnInFlight}) {
					t.Errorf("DirtyReasons(\"\") = %v", got)
				}
				if got := s.DirtyReasons("t1"); got != nil {
					t.Errorf("DirtyReasons(t1) = %v", got)
				}
				d := s.Distillations[0]
				if d.Clean || !slices.Equal(d.DirtyReasons, []string{DirtyTurnInFlight}) || s.Violations[0].Turn != "t1" {
					t.Errorf("distillation = %+v", d)
				}
			},
		},
		{
			name: "distillation over a pending tool_use",
			steps: []step{
				at(user(text("go"))),
				at(asst(use("a", "Bash"))),
				at(&events.DistillationStarted{FromSeq: 1, ToSeq: 2}),
			},
			want:   []string{"3:tool_use_without_result", "3:distillation_dirty_history"},
			status: StatusBroken,
			check: func(t *testing.T, s *Session) {
				d := s.Distillations[0]
				if d.Clean || !slices.Equal(d.DirtyReasons, []string{DirtyUnansweredToolUse, string(RuleToolUseWithoutResult)}) || d.FromSeq != 1 || d.ToSeq != 2 {
					t.Errorf("distillation = %+v", d)
				}
				if s.ToolCall("a").Status != ToolOrphaned {
					t.Errorf("a = %+v", s.ToolCall("a"))
				}
			},
		},
		{
			name: "distillation after a history violation",
			steps: []step{
				at(user(text("go"))),
				at(asst(use("a", "Bash"))),
				at(user(text("x"), result("a"))),
				at(asst(text("ok"))),
				at(&events.DistillationCompleted{}),
			},
			want:   []string{"3:results_not_first", "5:distillation_dirty_history"},
			status: StatusIdle, // the reset history holds no violation
			check: func(t *testing.T, s *Session) {
				if d := s.Distillations[0]; d.Clean || !slices.Equal(d.DirtyReasons, []string{string(RuleResultsNotFirst)}) || d.StartedSeq != 0 || d.CompletedSeq != 5 {
					t.Errorf("distillation = %+v", d)
				}
			},
		},
		{
			name: "violations before the last distillation do not dirty the next",
			steps: []step{
				at(asst(text("no user first"))),
				at(&events.DistillationCompleted{}),
				at(user(text("summary"))),
				at(asst(text("ok"))),
				at(&events.DistillationStarted{}),
				at(&events.DistillationCompleted{}),
			},
			want: []string{"1:first_message_not_user", "2:distillation_dirty_history"},
			check: func(t *testing.T, s *Session) {
				if d := s.Distillations[1]; !d.Clean || d.FromSeq != 2 || d.ToSeq != 4 {
					t.Errorf("second distillation = %+v", d)
				}
				if d := s.Distillations[0]; d.FromSeq != 1 || d.ToSeq != 1 {
					t.Errorf("first distillation = %+v", d)
				}
			},
		},
		{
			name: "first message after a reset must be user",
			steps: []step{
				at(user(text("go"))),
				at(&events.DistillationCompleted{}),
				at(asst(text("summary as assistant"))),
			},
			want: []string{"3:first_message_not_user"},
		},
		{
			name: "result after a reset answers nothing",
			steps: []step{
				at(user(text("go"))),
				at(asst(use("a", "Bash"))),
				at(&events.DistillationCompleted{}),
				at(user(result("a"))),
			},
			want: []string{"3:tool_use_without_result", "3:distillation_dirty_history", "4:tool_result_without_tool_use"},
			check: func(t *testing.T, s *Session) {
				if got := s.OrphanedToolUseIDs(); len(got) != 0 {
					t.Errorf("orphans of the reset history are gone from OrphanedToolUseIDs: %v", got)
				}
				if len(s.Orphans) != 1 {
					t.Errorf("Orphans keeps them: %+v", s.Orphans)
				}
			},
		},
		{
			name: "requests, skips and repeated requests",
			steps: []step{
				at(&events.DistillationRequested{Reason: "auto"}),
				at(&events.DistillationRequested{Reason: "auto again"}),
				at(&events.DistillationSkipped{Reason: "turn_in_flight", Detail: "t1"}),
				at(&events.DistillationRequested{Reason: "manual"}),
			},
			check: func(t *testing.T, s *Session) {
				if len(s.Distillations) != 2 {
					t.Fatalf("distillations = %+v", s.Distillations)
				}
				if d := s.Distillations[0]; d.RequestedSeq != 1 || d.RequestReason != "auto" || d.Skipped != "turn_in_flight" || d.SkippedSeq != 3 {
					t.Errorf("first = %+v", d)
				}
				if d := s.Distillations[1]; d.RequestedSeq != 4 || d.Skipped != "" {
					t.Errorf("second = %+v", d)
				}
			},
		},
		{
			name: "snapshot taken",
			steps: []step{
				at(user(text("go"))),
				at(&events.SnapshotTaken{CoversSeq: 1, Version: Version}),
			},
			check: func(t *testing.T, s *Session) {
				if s.LastSnapshotSeq != 1 {
					t.Errorf("LastSnapshotSeq = %d", s.LastSnapshotSeq)
				}
			},
		},
	}
}

func TestFoldDistillation(t *testing.T) { runFoldCases(t, distillationCases()) }

func distEqual(a, b Distillation) bool {
	return reflect.DeepEqual(a, b)
}

func errorCases() []foldCase {
	same := func(msg string) step {
		return in("t1", &events.ErrorRecorded{ErrorInfo: errInfo(msg), Stage: events.StageExecute})
	}
	return []foldCase{
		{
			name: "same error in a row is a streak; digits do not matter",
			steps: []step{
				in("t1", started("x")),
				same("Overloaded (request 123)"),
				same("overloaded  (request 98765)"),
				same("overloaded (request 4)"),
			},
			check: func(t *testing.T, s *Session) {
				if s.Errors.Total != 3 || s.Errors.Streak.Count != 3 || s.Errors.Streak.FirstSeq != 2 || s.Errors.Last.Seq != 4 {
					t.Errorf("errors = %+v", s.Errors)
				}
			},
		},
		{
			name: "a different error restarts the streak",
			steps: []step{
				same("overloaded"),
				same("overloaded"),
				at(&events.ErrorRecorded{ErrorInfo: events.ErrorInfo{Message: "invalid request", Kind: events.KindLogic, HTTPStatus: 400}}),
			},
			check: func(t *testing.T, s *Session) {
				if s.Errors.Streak.Count != 1 || s.Errors.Streak.FirstSeq != 3 || s.Errors.Total != 3 {
					t.Errorf("errors = %+v", s.Errors)
				}
			},
		},
		{
			name: "a completed turn resets the streak; a failed turn extends it",
			steps: []step{
				in("t1", started("x")),
				same("overloaded"),
				in("t1", completed()),
				in("t2", started("y")),
				same("overloaded"),
				in("t2", &events.TurnFailed{Stage: events.StageExecute, Error: errInfo("overloaded")}),
			},
			check: func(t *testing.T, s *Session) {
				if s.Errors.Streak.Count != 2 || s.Errors.Streak.FirstSeq != 5 || s.Errors.Total != 3 {
					t.Errorf("errors = %+v", s.Errors)
				}
			},
		},
	}
}

func TestFoldErrors(t *testing.T) { runFoldCases(t, errorCases()) }

func TestErrorKey(t *testing.T) {
	tests := []struct {
		a, b events.ErrorInfo
		same bool
	}{
		{errInfo("Timeout after 30s"), errInfo("timeout after 45s"), true},
		{errInfo("timeout\tafter  30s "), errInfo("timeout after 1s"), true},
		{errInfo("timeout"), errInfo("refused"), false},
		{events.ErrorInfo{Message: "x", HTTPStatus: 500}, events.ErrorInfo{Message: "x", HTTPStatus: 502}, false},
		{events.ErrorInfo{Message: "x", Code: "a"}, events.ErrorInfo{Message: "x", Code: "b"}, false},
		{events.ErrorInfo{Message: "x", Kind: events.KindLogic}, events.ErrorInfo{Message: "x", Kind: events.KindTransient}, false},
	}
	for _, tt := range tests {
		if got := ErrorKey(tt.a) == ErrorKey(tt.b); got != tt.same {
			t.Errorf("ErrorKey(%q) == ErrorKey(%q): %v, want %v", tt.a.Message, tt.b.Message, got, tt.same)
		}
	}
}

func invalidCases() []foldCase {
	badErr := &events.EventError{Tenant: testTenant, Session: testSession, Seq: 2, Err: events.ErrMalformed}
	return []foldCase{
		{
			name: "invalid events are recorded and the fold goes on",
			steps: []step{
				at(user(text("hi"))),
				rawStep(events.Event{Data: []byte(`{"type": garbage`), Err: badErr}),
				rawStep(rawEvent(events.TypeTurnStarted, "t1", `{"deadline_ms": "soon"}`)),
				rawStep(rawEvent(events.TypeMessageAppended, "", `{"role": "system", "content": [{"type": "text", "text": "x"}]}`)),
				rawStep(rawEvent(events.TypeMessageAppended, "", `{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "x"}]}`)),
				rawStep(rawEvent(events.TypeTurnCompleted, "", `{}`)),
				rawStep(rawEvent(events.TypeMessageAppended, "", `{"role": "assistant", "content": []}`)),
				at(asst(text("hello"))),
			},
			want: []string{"2:invalid_event", "3:invalid_event", "4:invalid_event", "5:invalid_event", "6:invalid_event", "7:invalid_event"},
			check: func(t *testing.T, s *Session) {
				if len(s.InvalidEvents) != 6 || s.InvalidEvents[0].Seq != 2 || !strings.Contains(s.InvalidEvents[0].Error, "malformed") {
					t.Errorf("invalid events = %+v", s.InvalidEvents)
				}
				if len(s.Messages) != 2 || len(s.Turns) != 0 {
					t.Errorf("valid events around invalid ones must be kept: %+v", s.Messages)
				}
			},
		},
		{
			name: "unknown types are counted, not violations",
			steps: []step{
				rawStep(rawEvent("agent.heartbeat", "", `{}`)),
				at(user(text("hi"))),
				rawStep(rawEvent("agent.heartbeat", "", `{}`)),
				rawStep(rawEvent("agent.budget_updated", "", `{"tokens": 5}`)),
			},
			status: StatusIdle,
			check: func(t *testing.T, s *Session) {
				want := []UnknownType{{Type: "agent.heartbeat", Count: 2, FirstSeq: 1}, {Type: "agent.budget_updated", Count: 1, FirstSeq: 4}}
				if !slices.Equal(s.UnknownTypes, want) {
					t.Errorf("unknown types = %+v", s.UnknownTypes)
				}
			},
		},
		{
			name: "an event of another session is invalid",
			steps: []step{
				at(user(text("hi"))),
				rawStep(func() events.Event {
					e := rawEvent(events.TypeSessionPaused, "", `{"reason":"x"}`)
					e.Session = "other"
					return e
				}()),
			},
			want:   []string{"2:invalid_event"},
			status: StatusBroken,
		},
	}
}

func TestFoldInvalidAndUnknown(t *testing.T) { runFoldCases(t, invalidCases()) }

func TestApplyIgnoresRedelivery(t *testing.T) {
	evs := build(t, []step{at(user(text("hi"))), at(asst(text("a"))), at(user(text("b")))})
	s := &Session{}
	for _, ev := range evs {
		s.Apply(ev)
	}
	want := mustJSON(t, s)
	if v := s.Apply(evs[1]); v != nil {
		t.Errorf("redelivered event gave violations %v", v)
	}
	s.Apply(evs[2])
	if got := mustJSON(t, s); string(got) != string(want) {
		t.Errorf("redelivery changed the state:\n%s\n%s", got, want)
	}
}

func TestApplyReturnedViolationsAreStable(t *testing.T) {
	evs := build(t, []step{at(asst(text("a"))), at(user(result("x"))), at(user(result("y")))})
	s := &Session{}
	first := s.Apply(evs[0])
	s.Apply(evs[1])
	s.Apply(evs[2])
	if len(first) != 1 || first[0].Rule != RuleFirstMessageNotUser {
		t.Fatalf("first = %+v", first)
	}
	_ = append(first, Violation{Rule: "x"}) // must not write into the state
	if len(s.Violations) != 3 || s.Violations[1].Rule != RuleToolResultWithoutToolUse {
		t.Errorf("state violations = %+v", s.Violations)
	}
}

func TestFoldDeterministic(t *testing.T) {
	evs := synth(t, 7, 120, true)
	a, b := Fold(evs), Fold(evs)
	ja, jb := mustJSON(t, a), mustJSON(t, b)
	if string(ja) != string(jb) {
		t.Fatal("two folds of the same events differ")
	}
	if a.Events != len(evs) || a.LastSeq != evs[len(evs)-1].Seq || a.FirstSeq != evs[0].Seq {
		t.Errorf("events %d last %d first %d", a.Events, a.LastSeq, a.FirstSeq)
	}
	// Rewinds undo some of them: the unknown types need only be in the
	// log.
	unknown := 0
	for _, ev := range evs {
		if !events.KnownType(ev.Type) && ev.Err == nil {
			unknown++
		}
	}
	if len(a.Violations) == 0 || len(a.InvalidEvents) == 0 || len(a.Distillations) == 0 || unknown == 0 || len(a.Rewinds) == 0 || a.RewoundEvents == 0 {
		t.Errorf("the synthetic session should exercise anomalies: %d violations, %d invalid, %d distillations, %d unknown, %d rewinds",
			len(a.Violations), len(a.InvalidEvents), len(a.Distillations), unknown, len(a.Rewinds))
	}
	// And invariant 4's counts: flaky re-runs, failed attempts, streaks.
	attempts, streak := 0, 0
	for _, tu := range a.Turns {
		attempts += tu.FailedAttempts
	}
	s := &Session{}
	for _, ev := range evs {
		applyLog(t, s, ev, evs)
		streak = max(streak, s.Outputs.Count)
	}
	if a.Totals.Flaky == 0 || attempts == 0 || streak < DefaultLoopLimit {
		t.Errorf("the synthetic session should exercise invariant 4: %d flaky, %d failed attempts, longest output streak %d", a.Totals.Flaky, attempts, streak)
	}
}

func TestFoldCleanSynthetic(t *testing.T) {
	s := Fold(synth(t, 3, 200, false))
	if len(s.Violations) != 0 {
		t.Fatalf("a clean session must have no violations, got %d: %+v", len(s.Violations), s.Violations[:min(5, len(s.Violations))])
	}
	if s.Status() != StatusIdle {
		t.Errorf("status %s", s.Status())
	}
}

// TestFoldRetention checks that the lists of a long session stay bounded.
func TestFoldRetention(t *testing.T) {
	var steps []step
	for i := range 3 * KeepTurns {
		id := "t" + strings.Repeat("x", i%3) + string(rune('a'+i%26)) + itoa(i)
		steps = append(steps, in(id, started("x")), in(id, completed()), in(id, completed()))
	}
	s := Fold(build(t, steps))
	if len(s.Turns) > KeepTurns+KeepTurns/4 || s.Totals.Turns != 3*KeepTurns {
		t.Errorf("turns kept %d of %d", len(s.Turns), s.Totals.Turns)
	}
	if len(s.Violations) > KeepAnomalies+KeepAnomalies/4 || s.Totals.Violations != 3*KeepTurns {
		t.Errorf("violations kept %d of %d", len(s.Violations), s.Totals.Violations)
	}
	if s.Turns[len(s.Turns)-1].Index != 3*KeepTurns {
		t.Errorf("last turn index %d", s.Turns[len(s.Turns)-1].Index)
	}
	// The lookups still work after a trim.
	last := s.Turns[len(s.Turns)-1].ID
	if s.Turn(last) == nil {
		t.Errorf("Turn(%q) = nil after trim", last)
	}
	b := mustJSON(t, s)
	if len(b) > 256<<10 {
		t.Errorf("state of a long session is %d bytes", len(b))
	}
}

func itoa(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}

func TestPreviewAndDigest(t *testing.T) {
	long := strings.Repeat("😀", 500)
	raw, _ := json.Marshal(long)
	b := digest(&events.ContentBlock{Type: events.BlockToolResult, ToolUseID: "a", Content: raw}, 0)
	if n := len([]rune(b.Text)); n != PreviewRunes+1 || b.Size != len(raw) {
		t.Errorf("string result preview: %d runes, size %d", n, b.Size)
	}
	esc := []byte(`"` + strings.Repeat(`\ud83d\ude00`, 400) + `"`)
	if b := digest(&events.ContentBlock{Type: events.BlockToolResult, ToolUseID: "a", Content: esc}, 0); !strings.HasPrefix(b.Text, "😀😀") || len([]rune(b.Text)) != PreviewRunes+1 {
		t.Errorf("escaped result preview: %q", b.Text)
	}
	arr := json.RawMessage(`[{"type":"text","text":"one"},{"type":"image","source":{"type":"base64","data":"AAAA"}},{"type":"text","text":"two"}]`)
	if b := digest(&events.ContentBlock{Type: events.BlockToolResult, ToolUseID: "a", Content: arr}, 0); b.Text != "one\ntwo" {
		t.Errorf("array result preview: %q", b.Text)
	}
	in := json.RawMessage(`{ "a" : "x  y", "b" : [1, 2] }`)
	if b := digest(&events.ContentBlock{Type: events.BlockToolUse, ID: "a", Name: "n", Input: in}, 0); b.Text != `{"a":"x  y","b":[1,2]}` {
		t.Errorf("tool_use preview: %q", b.Text)
	}
	if got := preview("a\xffb", 10); got != "a\uFFFDb" {
		t.Errorf("preview of invalid UTF-8 = %q", got)
	}
	if b := digest(&events.ContentBlock{Type: "image", Source: json.RawMessage(`{"data":"AAAA"}`)}, 0); b.Size != 15 {
		t.Errorf("image size %d", b.Size)
	}
}

// TestApplyNeverPanics folds random mixtures of valid, broken and unknown
// events in random orders.
func TestApplyNeverPanics(t *testing.T) {
	base := synth(t, 11, 40, true)
	datas := []string{`{}`, `null`, `[]`, `{"role":"user","content":[{"type":"tool_result"}]}`, `{"tool_use_id":""}`,
		`{"stage":"nope"}`, `{"covers_seq":-1}`, `{"content":[{"type":"tool_use","id":"a","input":"x"}],"role":"assistant"}`,
		`{"to_seq":3,"reason":"x"}`, `{"to_seq":900}`, `{"command_id":"c","kind":"k","attempt":1,"result":"ok"}`,
		`{"provider":"p","from":"closed","to":"open"}`, `{"role":"user","synthetic":true,"content":[{"type":"tool_result","tool_use_id":"toolu_00003"}]}`}
	types := []events.Type{events.TypeMessageAppended, events.TypeToolCallStarted, events.TypeTurnFailed, events.TypeSnapshotTaken,
		events.TypeDistillationCompleted, events.TypeTurnStarted, "x.y", events.TypeSessionRewound, events.TypeRecoveryCompleted,
		events.TypeRecoveryParked, events.TypeBreakerChanged, events.TypeSessionForked, events.TypeSessionStarted}
	for seed := range uint64(20) {
		evs := slices.Clone(base)
		r := newRand(seed)
		r.Shuffle(len(evs), func(i, j int) { evs[i], evs[j] = evs[j], evs[i] })
		for i := range evs {
			if r.IntN(10) == 0 {
				evs[i] = rawEvent(types[r.IntN(len(types))], []string{"", "t1", "t2"}[r.IntN(3)], datas[r.IntN(len(datas))])
			}
			if r.IntN(20) == 0 {
				evs[i].Err = errors.New("broken")
			}
			evs[i].Seq = uint64(i + 1)
		}
		s := Fold(evs)
		if s.Events != len(evs) || s.NeedsRefold {
			t.Fatalf("seed %d: folded %d of %d (refold pending: %v)", seed, s.Events, len(evs), s.NeedsRefold)
		}
		_ = s.Status()
		_ = s.OrphanedToolUseIDs()
	}
}
