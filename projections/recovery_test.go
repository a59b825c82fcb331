package projections

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/turnstone-dev/turnstone/events"
)

func synthetic(blocks ...events.ContentBlock) *events.MessageAppended {
	return &events.MessageAppended{Role: events.RoleUser, Synthetic: true, Content: blocks}
}

func failed(msg string) *events.TurnFailed {
	return &events.TurnFailed{Stage: events.StageExecute, Error: errInfo(msg)}
}

func repairCases() []foldCase {
	return []foldCase{
		{
			name: "a synthetic result repairs the orphan a failed turn left",
			steps: []step{
				in("t1", started("go")),
				in("t1", user(text("go"))),
				in("t1", asst(use("a", "Bash"))),
				in("t1", failed("worker killed")),
				at(synthetic(result("a"))),
			},
			want:   []string{"4:tool_use_without_result"},
			status: StatusIdle,
			check: func(t *testing.T, s *Session) {
				if tc := s.ToolCall("a"); tc.Status != ToolRepaired || tc.ResultSeq != 5 {
					t.Errorf("tool call = %+v", tc)
				}
				if o := s.Orphans[0]; !o.Repaired || o.RepairedSeq != 5 || o.LateResultSeq != 0 {
					t.Errorf("orphan = %+v", o)
				}
				if v := s.Violations[0]; !v.Resolved || v.ResolvedSeq != 5 || s.Totals.Resolved != 1 {
					t.Errorf("violation = %+v, resolved %d", v, s.Totals.Resolved)
				}
				if ids := s.OrphanedToolUseIDs(); len(ids) != 0 {
					t.Errorf("OrphanedToolUseIDs = %v", ids)
				}
				if len(s.UnmatchedResults) != 0 || len(s.Messages) != 3 || !s.Messages[2].Synthetic {
					t.Errorf("unmatched %+v messages %+v", s.UnmatchedResults, s.Messages)
				}
			},
		},
		{
			name: "a repair joins a user message that holds text, among its results",
			steps: []step{
				in("t1", started("go")),
				in("t1", user(text("go"))),
				in("t1", asst(use("a", "Bash"), use("b", "Read"))),
				in("t1", user(result("b"), text("and?"))),
				in("t1", completed()),
				at(synthetic(result("a"))),
			},
			want:   []string{"5:tool_use_without_result"},
			status: StatusIdle,
			check: func(t *testing.T, s *Session) {
				m := s.Messages[2]
				var got []string
				for _, b := range m.Blocks {
					got = append(got, b.Type+":"+b.ToolUseID)
				}
				if want := []string{"tool_result:b", "tool_result:a", "text:"}; !slices.Equal(got, want) || !slices.Equal(m.Seqs, []uint64{4, 6}) {
					t.Errorf("merged message blocks %v seqs %v, want %v", got, m.Seqs, want)
				}
			},
		},
		{
			name: "a repair after the next turn's prompt still repairs",
			steps: []step{
				in("t1", started("go")),
				in("t1", user(text("go"))),
				in("t1", asst(use("a", "Bash"))),
				in("t1", failed("worker killed")),
				in("t2", started("are you there?")),
				in("t2", user(text("are you there?"))),
				at(synthetic(result("a"))),
				in("t2", asst(text("yes"))),
				in("t2", completed()),
			},
			want:   []string{"4:tool_use_without_result"},
			status: StatusIdle,
			check: func(t *testing.T, s *Session) {
				if s.ToolCall("a").Status != ToolRepaired || len(s.OrphanedToolUseIDs()) != 0 {
					t.Errorf("a = %+v", s.ToolCall("a"))
				}
			},
		},
		{
			name: "a synthetic result after a later assistant message is late",
			steps: []step{
				in("t1", started("go")),
				in("t1", user(text("go"))),
				in("t1", asst(use("a", "Bash"))),
				in("t1", failed("worker killed")),
				in("t2", started("again")),
				in("t2", user(text("again"))),
				in("t2", asst(text("ok"))),
				in("t2", completed()),
				at(synthetic(result("a"))),
			},
			want:   []string{"4:tool_use_without_result", "9:late_tool_result"},
			status: StatusBroken,
			check: func(t *testing.T, s *Session) {
				if s.ToolCall("a").Status != ToolOrphaned || s.Orphans[0].Repaired || s.Orphans[0].LateResultSeq != 9 || s.Violations[0].Resolved {
					t.Errorf("a = %+v, orphan %+v", s.ToolCall("a"), s.Orphans[0])
				}
				if ids := s.OrphanedToolUseIDs(); !slices.Equal(ids, []string{"a"}) {
					t.Errorf("OrphanedToolUseIDs = %v", ids)
				}
			},
		},
		{
			name: "a second synthetic result for a repaired tool_use is a duplicate",
			steps: []step{
				in("t1", started("go")),
				in("t1", user(text("go"))),
				in("t1", asst(use("a", "Bash"))),
				in("t1", failed("worker killed")),
				at(synthetic(result("a"))),
				at(synthetic(result("a"))),
			},
			want:   []string{"4:tool_use_without_result", "6:duplicate_tool_result"},
			status: StatusBroken,
		},
		{
			name: "a synthetic result after a late one is late too",
			steps: []step{
				in("t1", started("go")),
				in("t1", user(text("go"))),
				in("t1", asst(use("a", "Bash"))),
				in("t1", failed("worker killed")),
				at(user(result("a"))),
				at(synthetic(result("a"))),
			},
			want:   []string{"4:tool_use_without_result", "5:late_tool_result", "6:late_tool_result"},
			status: StatusBroken,
		},
	}
}

func TestFoldRepair(t *testing.T) { runFoldCases(t, repairCases()) }

// TestRepairMakesHistoryValid folds a turn whose process died between a
// tool_use and its result, then the repair: the session is no longer
// broken, no orphan is left, and a distillation over it is clean.
func TestRepairMakesHistoryValid(t *testing.T) {
	evs := build(t, []step{
		in("t1", started("build it")),
		in("t1", user(text("build it"))),
		in("t1", asst(text("Building."), use("toolu_1", "Bash"))),
		in("t1", failed("worker killed")),
		at(synthetic(events.ContentBlock{Type: events.BlockToolResult, ToolUseID: "toolu_1", IsError: true, Content: json.RawMessage(`"interrupted"`)})),
		at(&events.DistillationStarted{}),
		at(&events.DistillationCompleted{Trigger: "manual"}),
	})
	before := FoldLog(evs[:4])
	if got, want := before.DirtyReasons(""), []string{DirtyUnansweredToolUse, string(RuleToolUseWithoutResult)}; !slices.Equal(got, want) {
		t.Errorf("DirtyReasons before the repair = %v, want %v", got, want)
	}
	s := FoldLog(evs[:5])
	if got := s.DirtyReasons(""); got != nil {
		t.Errorf("DirtyReasons after the repair = %v, want none", got)
	}
	if got := s.Status(); got == StatusBroken {
		t.Errorf("Status() = %s after the repair", got)
	}
	if ids := s.OrphanedToolUseIDs(); len(ids) != 0 {
		t.Errorf("OrphanedToolUseIDs() = %v after the repair", ids)
	}
	if s.tailUnanswered() {
		t.Error("the history's tail still holds an unanswered tool_use")
	}
	if tc := s.ToolCall("toolu_1"); tc.Status != ToolRepaired || !tc.IsError {
		t.Errorf("tool call = %+v", tc)
	}
	for _, ev := range evs[5:] {
		if vs := s.Apply(ev); len(vs) != 0 {
			t.Errorf("distillation over the repaired history: %v", rules(vs))
		}
	}
	if d := s.Distillations[0]; !d.Clean || len(d.DirtyReasons) != 0 {
		t.Errorf("distillation = %+v, want clean", d)
	}
	if s.Status() != StatusIdle {
		t.Errorf("Status() = %s", s.Status())
	}
}

func recoveryCases() []foldCase {
	return []foldCase{
		{
			name: "commands: attempts, outcomes and parks",
			steps: []step{
				at(user(text("hi"))),
				at(&events.RecoveryAttempted{CommandID: "c1", Kind: "retry_turn", Attempt: 1, Result: "failed", Class: "transient", Strategy: "same_provider",
					Error: &events.ErrorInfo{Message: "overloaded"}}),
				at(&events.RecoveryAttempted{CommandID: "c1", Kind: "retry_turn", Attempt: 2, Result: "ok", Strategy: "fallback_provider"}),
				at(&events.RecoveryCompleted{CommandID: "c1", Kind: "retry_turn", Outcome: events.OutcomeDegraded, Strategy: "fallback_provider", Attempts: 2, Detail: "on bedrock"}),
				at(&events.RecoveryAttempted{CommandID: "c2", Kind: "switch_provider", Attempt: 1, Result: "failed"}),
				at(&events.RecoveryParked{CommandID: "c2", Kind: "switch_provider", Reason: "no runtime answered", Deliveries: 5}),
				at(&events.RecoveryAttempted{CommandID: "c3", Kind: "distill", Attempt: 1, Result: "failed"}),
				at(&events.RecoveryCompleted{CommandID: "c1", Kind: "retry_turn", Outcome: events.OutcomeFailed}),
			},
			status: StatusIdle,
			check: func(t *testing.T, s *Session) {
				for id, done := range map[string]bool{"c1": true, "c2": true, "c3": false, "c9": false} {
					if s.CommandDone(id) != done {
						t.Errorf("CommandDone(%s) = %v, want %v", id, !done, done)
					}
				}
				want := CommandRecord{ID: "c1", Kind: "retry_turn", Attempts: 2, LastResult: "ok", Strategy: "fallback_provider",
					Outcome: events.OutcomeDegraded, Detail: "on bedrock", OutcomeSeq: 4, FirstSeq: 2, LastSeq: 8}
				if got := *s.Command("c1"); got != want {
					t.Errorf("c1 = %+v\nwant %+v", got, want)
				}
				if c := s.Command("c2"); !c.Parked || c.ParkReason != "no runtime answered" || c.Deliveries != 5 || c.Outcome != "" {
					t.Errorf("c2 = %+v", c)
				}
				if len(s.Commands) != 3 || s.Totals.Commands != 3 || s.Commands[2].ID != "c3" {
					t.Errorf("commands = %+v", s.Commands)
				}
			},
		},
		{
			name: "breakers: the latest state per provider, sorted",
			steps: []step{
				at(&events.BreakerChanged{Provider: "bedrock", From: "closed", To: "open", Failures: 5}),
				at(&events.BreakerChanged{Provider: "anthropic", From: "closed", To: "open", Failures: 7, Reason: "529s"}),
				at(&events.BreakerChanged{Provider: "anthropic", From: "open", To: "half_open", Reason: "cooldown over"}),
			},
			status: StatusIdle,
			check: func(t *testing.T, s *Session) {
				if len(s.Breakers) != 2 || s.Breakers[0].Provider != "anthropic" || s.Breakers[1].Provider != "bedrock" {
					t.Fatalf("breakers = %+v", s.Breakers)
				}
				if b := s.Breaker("anthropic"); b.State != "half_open" || b.From != "open" || b.Seq != 3 || b.Reason != "cooldown over" || b.Since.IsZero() {
					t.Errorf("anthropic = %+v", b)
				}
				if b := s.Breaker("bedrock"); b.State != "open" || b.Failures != 5 {
					t.Errorf("bedrock = %+v", b)
				}
				if s.Breaker("openai") != nil {
					t.Error("Breaker(openai) must be nil")
				}
			},
		},
		{
			name: "fork: the source records it",
			steps: []step{
				at(user(text("hi"))),
				at(&events.SessionForked{ForkSession: "s1-fork", AtSeq: 1, CommandID: "fork-1"}),
			},
			status: StatusIdle,
			check: func(t *testing.T, s *Session) {
				want := []Fork{{Session: "s1-fork", AtSeq: 1, Seq: 2, CommandID: "fork-1"}}
				if !slices.Equal(s.Forks, want) || s.ForkByCommand("fork-1") == nil || s.ForkByCommand("x") != nil || s.Totals.Forks != 1 {
					t.Errorf("forks = %+v", s.Forks)
				}
			},
		},
		{
			name: "fork: the new session's lineage, and the copied events fold cleanly",
			steps: []step{
				at(&events.SessionStarted{ForkedFrom: "s0", ForkSeq: 40}),
				at(&events.SessionStarted{Runtime: "claude-code", Model: "claude-opus-4", Provider: "anthropic", ForkedFrom: "s-origin", ForkSeq: 3}),
				in("t1", started("go")),
				in("t1", user(text("go"))),
				in("t1", asst(use("a", "Bash"))),
				in("t1", user(result("a"))),
				in("t1", asst(text("done"))),
				in("t1", completed()),
			},
			status: StatusIdle,
			check: func(t *testing.T, s *Session) {
				if s.ForkedFrom != "s0" || s.ForkSeq != 40 || s.Runtime != "claude-code" || s.Kind != "main" || s.Provider != "anthropic" {
					t.Errorf("identity: forked from %s@%d, runtime %q kind %q", s.ForkedFrom, s.ForkSeq, s.Runtime, s.Kind)
				}
			},
		},
		{
			name: "recovery events without what the fold needs are invalid",
			steps: []step{
				at(&events.RecoveryAttempted{Kind: "distill", Attempt: 1, Result: "ok"}),
				at(&events.RecoveryCompleted{Kind: "distill", Outcome: events.OutcomeRecovered}),
				at(&events.RecoveryParked{Kind: "distill", Reason: "x"}),
				at(&events.BreakerChanged{From: "closed", To: "open"}),
				at(&events.SessionForked{AtSeq: 1}),
			},
			want: []string{"1:invalid_event", "2:invalid_event", "3:invalid_event", "4:invalid_event", "5:invalid_event"},
			check: func(t *testing.T, s *Session) {
				if len(s.Commands) != 0 || len(s.Breakers) != 0 || len(s.Forks) != 0 {
					t.Errorf("commands %+v breakers %+v forks %+v", s.Commands, s.Breakers, s.Forks)
				}
			},
		},
	}
}

func TestFoldRecovery(t *testing.T) { runFoldCases(t, recoveryCases()) }

func rewound(to uint64, cmd string) *events.SessionRewound {
	return &events.SessionRewound{ToSeq: to, Reason: "back to a clean point", CommandID: cmd}
}

func rewindCases() []foldCase {
	return []foldCase{
		{
			name: "a rewind undoes a failed turn",
			steps: []step{
				at(&events.SessionStarted{Runtime: "claude-code"}),
				in("t1", started("go")),
				in("t1", user(text("go"))),
				in("t1", asst(text("ok"))),
				in("t1", completed()),
				in("t2", started("again")),
				in("t2", user(text("again"))),
				in("t2", asst(use("a", "Bash"))),
				in("t2", failed("worker killed")),
				at(&events.RecoveryAttempted{CommandID: "rw", Kind: "rewind_session", Attempt: 1, Result: "ok"}),
				at(rewound(5, "rw")),
				at(&events.RecoveryCompleted{CommandID: "rw", Kind: "rewind_session", Outcome: events.OutcomeRecovered, Attempts: 1}),
				in("t3", started("hi")),
				in("t3", user(text("hi"))),
				in("t3", asst(text("hello"))),
				in("t3", completed()),
			},
			want:   []string{"9:tool_use_without_result"},
			kept:   []string{},
			status: StatusIdle,
			check: func(t *testing.T, s *Session) {
				var ids []string
				for _, tu := range s.Turns {
					ids = append(ids, tu.ID)
				}
				if !slices.Equal(ids, []string{"t1", "t3"}) || s.Turn("t3").Index != 2 || s.Totals.Turns != 2 {
					t.Errorf("turns %v, t3 %+v", ids, s.Turn("t3"))
				}
				if !slices.Equal(s.Rewound, []SeqRange{{6, 10}}) || s.RewoundEvents != 5 || s.Events != 16 {
					t.Errorf("rewound %v (%d events), events %d", s.Rewound, s.RewoundEvents, s.Events)
				}
				if want := []Rewind{{AtSeq: 11, ToSeq: 5, Reason: "back to a clean point", CommandID: "rw"}}; !slices.Equal(s.Rewinds, want) {
					t.Errorf("rewinds %+v", s.Rewinds)
				}
				for seq := uint64(1); seq <= 16; seq++ {
					if got, want := s.IsRewound(seq), seq >= 6 && seq <= 10; got != want {
						t.Errorf("IsRewound(%d) = %v", seq, got)
					}
				}
				if s.Errors.Total != 0 || len(s.Orphans) != 0 || len(s.ToolCalls) != 0 || len(s.Messages) != 4 || s.Runtime != "claude-code" {
					t.Errorf("errors %d orphans %v tool calls %v messages %d", s.Errors.Total, s.Orphans, s.ToolCalls, len(s.Messages))
				}
				if s.RewindByCommand("rw") == nil || !s.CommandDone("rw") || s.Command("rw").Attempts != 1 || s.Command("rw").FirstSeq != 12 {
					t.Errorf("command rw: %+v", s.Command("rw"))
				}
				if s.LastSeq != 16 || s.FirstSeq != 1 || s.NeedsRefold {
					t.Errorf("last %d first %d refold %v", s.LastSeq, s.FirstSeq, s.NeedsRefold)
				}
			},
		},
		{
			name: "nested: a rewind to before an earlier rewind undoes it too",
			steps: []step{
				at(user(text("a"))),
				at(asst(text("b"))),
				at(user(text("c"))),
				at(asst(text("d"))),
				at(rewound(3, "")),
				at(asst(text("e"))),
				at(user(text("f"))),
				at(rewound(1, "")),
				at(asst(text("g"))),
			},
			status: StatusIdle,
			check: func(t *testing.T, s *Session) {
				if len(s.Messages) != 2 || s.Messages[1].Blocks[0].Text != "g" || !slices.Equal(s.Messages[1].Seqs, []uint64{9}) {
					t.Errorf("messages %+v", s.Messages)
				}
				if !slices.Equal(s.Rewound, []SeqRange{{2, 7}}) || s.RewoundEvents != 6 || len(s.Rewinds) != 2 || !s.IsRewound(5) || s.IsRewound(8) {
					t.Errorf("rewound %v (%d), rewinds %+v", s.Rewound, s.RewoundEvents, s.Rewinds)
				}
			},
		},
		{
			name: "a rewind into a rewound range does not bring it back",
			steps: []step{
				at(user(text("a"))),
				at(asst(text("b"))),
				at(user(text("c"))),
				at(asst(text("d"))),
				at(rewound(2, "")),
				at(user(text("e"))),
				at(rewound(3, "")),
				at(user(text("f"))),
			},
			check: func(t *testing.T, s *Session) {
				var texts []string
				for _, m := range s.Messages {
					for _, b := range m.Blocks {
						texts = append(texts, b.Text)
					}
				}
				if !slices.Equal(texts, []string{"a", "b", "f"}) || !slices.Equal(s.Rewound, []SeqRange{{3, 6}}) || s.RewoundEvents != 4 {
					t.Errorf("texts %v rewound %v (%d)", texts, s.Rewound, s.RewoundEvents)
				}
			},
		},
		{
			name: "a rewind to the latest event undoes nothing",
			steps: []step{
				at(user(text("a"))),
				at(asst(text("b"))),
				at(rewound(2, "")),
			},
			check: func(t *testing.T, s *Session) {
				if len(s.Rewinds) != 1 || s.Rewound != nil || s.RewoundEvents != 0 || len(s.Messages) != 2 {
					t.Errorf("rewinds %+v rewound %v messages %d", s.Rewinds, s.Rewound, len(s.Messages))
				}
			},
		},
		{
			name: "a rewind lifts the pause and forgets the commands it undoes",
			steps: []step{
				at(user(text("hi"))),
				at(&events.RecoveryAttempted{CommandID: "p1", Kind: "pause_session", Attempt: 1, Result: "ok"}),
				at(&events.SessionPaused{Reason: "loop"}),
				at(&events.RecoveryCompleted{CommandID: "p1", Kind: "pause_session", Outcome: events.OutcomeRecovered}),
				at(&events.BreakerChanged{Provider: "anthropic", From: "closed", To: "open"}),
				at(rewound(1, "rw")),
			},
			status: StatusIdle,
			check: func(t *testing.T, s *Session) {
				if s.Paused || s.CommandDone("p1") || len(s.Commands) != 0 || len(s.Breakers) != 0 {
					t.Errorf("paused %v commands %+v breakers %+v", s.Paused, s.Commands, s.Breakers)
				}
			},
		},
		{
			name: "rewinds without what the fold needs are invalid",
			steps: []step{
				at(user(text("a"))),
				at(&events.SessionRewound{Reason: "no to_seq"}),
				at(rewound(3, "")),
				at(rewound(9, "")),
			},
			want: []string{"2:invalid_event", "3:invalid_event", "4:invalid_event"},
			check: func(t *testing.T, s *Session) {
				if len(s.Rewinds) != 0 || s.Rewound != nil || len(s.Messages) != 1 {
					t.Errorf("rewinds %+v rewound %v", s.Rewinds, s.Rewound)
				}
			},
		},
	}
}

func TestFoldRewind(t *testing.T) { runFoldCases(t, rewindCases()) }

// TestRewindToBeforeTheFirstEvent rewinds a session (whose sequences
// start at 10) to before its first event: only the identity, the
// position and the rewind record are left.
func TestRewindToBeforeTheFirstEvent(t *testing.T) {
	evs := build(t, []step{at(&events.SessionStarted{Runtime: "x"}), at(user(text("a"))), at(rewound(5, ""))})
	for i := range evs {
		evs[i].Seq += 9
	}
	s := FoldLog(evs)
	if s.Tenant != testTenant || s.Session != testSession || s.Runtime != "" || s.Kind != "" || len(s.Messages) != 0 {
		t.Errorf("state %+v", s)
	}
	if s.Events != 3 || s.FirstSeq != 10 || s.LastSeq != 12 || !slices.Equal(s.Rewound, []SeqRange{{6, 11}}) || s.RewoundEvents != 2 {
		t.Errorf("events %d first %d last %d rewound %v (%d)", s.Events, s.FirstSeq, s.LastSeq, s.Rewound, s.RewoundEvents)
	}
}

// liveFold is the definition of a rewound session's state, computed
// without Refold: mark every event that a valid session.rewound lies after
// and whose sequence is above its to_seq, then Apply the unmarked events in
// order. It returns the state and the marked sequences.
func liveFold(tb testing.TB, evs []events.Event) (*Session, map[uint64]bool) {
	tb.Helper()
	marked := map[uint64]bool{}
	for i, ev := range evs {
		p, err := ev.Payload()
		r, ok := p.(*events.SessionRewound)
		if ev.Err != nil || err != nil || !ok || r.ToSeq == 0 || r.ToSeq >= ev.Seq {
			continue
		}
		for _, e := range evs[:i] {
			if e.Seq > r.ToSeq {
				marked[e.Seq] = true
			}
		}
	}
	s := &Session{}
	for _, ev := range evs {
		if !marked[ev.Seq] {
			s.Apply(ev)
		}
	}
	if s.NeedsRefold {
		tb.Fatal("a fold of live events needs a refold")
	}
	return s, marked
}

// withoutRecord returns the JSON of s without the fields a refold keeps
// from before it (the position and the rewind record), which a fold of the
// live events alone cannot know.
func withoutRecord(tb testing.TB, s *Session) []byte {
	tb.Helper()
	c := *s
	c.Events, c.FirstSeq, c.LastSeq, c.LastSnapshotSeq = 0, 0, 0, 0
	c.FirstTime, c.LastTime = epoch, epoch
	c.Rewinds, c.Rewound, c.RewoundEvents, c.Totals.Rewinds = nil, nil, 0, 0
	return fingerprint(tb, &c)
}

// TestRewindIsFoldOfLiveEvents checks FoldLog against the definition of
// a rewound state (liveFold) right after every rewind of synthetic
// sessions full of them (nested ones included), one event later, at five
// random cuts and at the end. Under the race detector and -short it
// checks right after every rewind and at the end; the full-size pass of
// .ci/run checks every cut.
func TestRewindIsFoldOfLiveEvents(t *testing.T) {
	t.Parallel()
	for _, seed := range []uint64{2, 3} {
		evs := synth(t, seed, 100, seed%2 == 1)
		var cuts []int
		rewinds := 0
		for i, ev := range evs {
			if ev.Type == events.TypeSessionRewound {
				rewinds++
				cuts = append(cuts, i+1)
				if !sampled() {
					cuts = append(cuts, i+2)
				}
			}
		}
		if rewinds < 3 {
			t.Fatalf("seed %d: only %d rewinds", seed, rewinds)
		}
		r := newRand(seed)
		for range 5 {
			if cut := r.IntN(len(evs) + 1); !sampled() {
				cuts = append(cuts, cut)
			}
		}
		cuts = append(cuts, len(evs))
		nested := 0
		for _, cut := range cuts {
			cut = min(cut, len(evs))
			got := FoldLog(evs[:cut])
			want, marked := liveFold(t, evs[:cut])
			if g, w := withoutRecord(t, got), withoutRecord(t, want); string(g) != string(w) {
				t.Fatalf("seed %d cut %d: FoldLog differs from the fold of the live events\n got: %.400s\nwant: %.400s", seed, cut, diffAt(g, w), diffAt(w, g))
			}
			if got.RewoundEvents != len(marked) || got.Events != cut {
				t.Fatalf("seed %d cut %d: RewoundEvents %d, want %d; Events %d", seed, cut, got.RewoundEvents, len(marked), got.Events)
			}
			for _, ev := range evs[:cut] {
				if got.IsRewound(ev.Seq) != marked[ev.Seq] {
					t.Fatalf("seed %d cut %d: IsRewound(%d) = %v", seed, cut, ev.Seq, !marked[ev.Seq])
				}
			}
			for _, rw := range got.Rewinds {
				if got.IsRewound(rw.AtSeq) {
					nested++
				}
			}
		}
		if seed == 3 && nested == 0 {
			t.Errorf("seed %d: no nested rewind", seed)
		}
		t.Logf("seed %d: %d events, %d rewinds, %d rewinds undone by later ones over the cuts", seed, len(evs), rewinds, nested)
	}
}

// TestRefoldLate applies events past a rewind without refolding, through a
// JSON round trip, and refolds at the end: the state equals FoldLog's.
func TestRefoldLate(t *testing.T) {
	evs := synth(t, 2, 80, true)
	want := fingerprint(t, FoldLog(evs))
	s := &Session{}
	for i, ev := range evs {
		s.Apply(ev)
		if i == len(evs)/2 {
			var c Session
			if err := json.Unmarshal(mustJSON(t, s), &c); err != nil {
				t.Fatal(err)
			}
			s = &c
		}
	}
	if !s.NeedsRefold {
		t.Fatal("no rewind left a refold pending")
	}
	if err := s.Refold(sliceSource(evs)); err != nil {
		t.Fatal(err)
	}
	if got := fingerprint(t, s); string(got) != string(want) {
		t.Fatalf("late refold differs from FoldLog\n got: %.400s\nwant: %.400s", diffAt(got, want), diffAt(want, got))
	}
	if err := s.Refold(nil); err != nil {
		t.Errorf("Refold without a pending rewind: %v", err)
	}
}

func TestAddRange(t *testing.T) {
	tests := []struct {
		have []SeqRange
		add  SeqRange
		want []SeqRange
	}{
		{nil, SeqRange{5, 9}, []SeqRange{{5, 9}}},
		{[]SeqRange{{5, 9}}, SeqRange{1, 2}, []SeqRange{{1, 2}, {5, 9}}},
		{[]SeqRange{{5, 9}}, SeqRange{12, 20}, []SeqRange{{5, 9}, {12, 20}}},
		{[]SeqRange{{5, 9}}, SeqRange{10, 11}, []SeqRange{{5, 11}}},
		{[]SeqRange{{5, 9}}, SeqRange{1, 4}, []SeqRange{{1, 9}}},
		{[]SeqRange{{1, 2}, {5, 9}, {20, 30}}, SeqRange{3, 21}, []SeqRange{{1, 30}}},
		{[]SeqRange{{1, 2}, {5, 9}, {20, 30}}, SeqRange{6, 7}, []SeqRange{{1, 2}, {5, 9}, {20, 30}}},
		{[]SeqRange{{1, 2}, {20, 30}}, SeqRange{5, 9}, []SeqRange{{1, 2}, {5, 9}, {20, 30}}},
	}
	for _, tt := range tests {
		if got := addRange(slices.Clone(tt.have), tt.add); !slices.Equal(got, tt.want) {
			t.Errorf("addRange(%v, %v) = %v, want %v", tt.have, tt.add, got, tt.want)
		}
	}
}

// TestRewindEqualsFoldOfPrefix: right after a rewind to T, the state is the
// fold of the events up to T, plus the rewind record and the position.
func TestRewindEqualsFoldOfPrefix(t *testing.T) {
	steps := rewindCases()[0].steps
	evs := build(t, steps)
	at := slices.IndexFunc(evs, func(ev events.Event) bool { return ev.Type == events.TypeSessionRewound })
	p, _ := evs[at].Payload()
	to := p.(*events.SessionRewound).ToSeq
	got := FoldLog(evs[:at+1])
	want := FoldLog(evs[:to])
	if g, w := withoutRecord(t, got), withoutRecord(t, want); string(g) != string(w) {
		t.Fatalf("state after the rewind differs from the fold of the prefix\n got: %.400s\nwant: %.400s", diffAt(g, w), diffAt(w, g))
	}
	if got.Events != at+1 || got.LastSeq != evs[at].Seq || got.RewoundEvents != at-int(to) || !got.LastTime.Equal(evs[at].Time) {
		t.Errorf("position: events %d last %d rewound %d time %s", got.Events, got.LastSeq, got.RewoundEvents, got.LastTime)
	}
}
