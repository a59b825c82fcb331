package projections

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
)

// The worst values each kind of field the state holds can take: the
// longest JSON the fold can write for it.
var (
	worstKey    = strings.Repeat("k", MaxKeyBytes)        // IDKey: at most MaxKeyBytes plain bytes
	worstToken  = strings.Repeat("t", events.MaxTokenLen) // tokenKey of a valid token
	worstDetail = detail(strings.Repeat("<", 4*DetailBytes))
	worstText   = preview(strings.Repeat("😀", 4*PreviewRunes), PreviewRunes)
	worstSeq    = uint64(math.MaxUint64)
	worstInt    = math.MaxInt
	worstTime   = time.Date(2999, 12, 31, 23, 59, 59, 999999999, time.FixedZone("x", -(11*3600+59*60)))
)

// worstState returns a state with every list at the longest the fold lets
// it be after an event (its Keep bound and the trim's quarter of slack,
// or what it must keep), every string at its bound with the characters
// that cost JSON the most, and every number at its widest: an upper bound
// of any state's size.
func worstState() *Session {
	seqs := func(n int) []uint64 {
		out := make([]uint64, n)
		for i := range out {
			out[i] = worstSeq
		}
		return out
	}
	list := func(keep int) int { return keep + keep/4 }
	errInfo := events.ErrorInfo{Message: worstDetail, Kind: events.ErrorKind(worstKey), Provider: worstKey, HTTPStatus: 599, Code: worstKey}
	s := &Session{
		Version: Version, Tenant: worstToken, Session: worstToken, Kind: worstKey,
		ParentSession: worstToken, ParentToolUseID: worstKey, Runtime: worstKey, Provider: worstKey, Model: worstKey,
		Labels: map[string]string{}, LabelsDropped: worstInt,
		ForkedFrom: worstToken, ForkSeq: worstSeq,
		Events: worstInt, FirstSeq: worstSeq, LastSeq: worstSeq,
		FirstTime: worstTime, LastTime: worstTime, FirstStored: worstTime, LastStored: worstTime, LastLiveStored: worstTime,
		History: true,
		Totals: Totals{worstInt, worstInt, worstInt, worstInt, worstInt, worstInt, worstInt, worstInt, worstInt,
			worstInt, worstInt, worstInt, worstInt, worstInt, worstInt, worstInt, worstInt, worstInt, worstInt},
		HistoryStart:    HistoryMark{Seq: worstSeq, Violations: worstInt, Orphans: worstInt, Resolved: worstInt, ToolCalls: worstInt},
		MessagesDropped: worstInt,
		HistoryBroken:   map[Rule]int{},
		Errors: ErrorStats{Total: worstInt,
			Last: &ErrorRecord{Error: events.ErrorInfo{Message: clip(strings.Repeat("<", 9*ErrorRunes), ErrorRunes, 2*ErrorRunes),
				Stack: clip(strings.Repeat("<", 9*StackRunes), StackRunes, 2*StackRunes), Kind: events.ErrorKind(worstKey),
				Provider: worstKey, HTTPStatus: 599, Code: worstKey}, Seq: worstSeq, Turn: worstToken, Stage: events.Stage(worstKey), Consecutive: worstInt},
			Streak: Streak{Key: worstKey, Count: worstInt, FirstSeq: worstSeq}},
		Outputs:  OutputStreak{Hash: emptyOutputHash, Input: emptyOutputHash, Count: worstInt, Seqs: seqs(KeepOutputSeqs), LastSeq: worstSeq, Message: worstInt},
		LastTool: &ToolRun{ToolUseID: worstKey, Name: worstKey, Turn: worstToken, UseSeq: worstSeq, InputHash: emptyOutputHash, ResultSeq: worstSeq, IsError: true, RerunOf: worstSeq},
		Paused:   true, PauseReason: worstDetail, PauseCause: events.PauseCause(worstKey), PauseCommand: worstKey, PauseKind: worstKey,
		PausedSeq: worstSeq, LastSnapshotSeq: worstSeq,
		RewoundEvents: worstInt, NeedsRefold: true,
		UnknownOther: worstInt,
	}
	for i := range MaxLabels {
		s.Labels[fmt.Sprintf("%0*d", MaxKeyBytes, i)] = worstDetail
	}
	for _, r := range historyRules {
		s.HistoryBroken[r] = worstInt
	}
	for range list(KeepTurns) {
		te := errInfo
		s.Turns = append(s.Turns, Turn{ID: worstToken, Index: worstInt, Status: TurnAbandoned, Reason: worstDetail, AbandonCause: worstKey, Prompt: worstText,
			Trigger: worstKey, DeadlineMS: math.MaxInt64, StartedSeq: worstSeq, EndedSeq: worstSeq, StartedAt: worstTime, SeenAt: worstTime,
			EndedAt: worstTime, LastStage: events.Stage(worstKey), FailedStage: events.Stage(worstKey), Error: &te,
			DurationMS: math.MaxInt64, FailedAttempts: worstInt})
	}
	for range MaxInFlightTurns {
		s.InFlight = append(s.InFlight, worstToken)
	}
	for range list(KeepMessages) {
		m := Message{Index: worstInt, Role: events.RoleAssistant, Seqs: seqs(MaxMessageSeqs), SeqsDropped: worstInt, Turn: worstToken,
			BlocksDropped: worstInt, ToolUses: worstInt, UntrackedToolUses: worstInt, NonResult: true, ResultsNotFirst: true,
			StopReason: worstKey, Meta: true, Synthetic: true, Hash: emptyOutputHash}
		for range MaxMessageBlocks {
			m.Blocks = append(m.Blocks, Block{Type: worstKey, Seq: worstSeq, ID: worstKey, Name: worstKey, ToolUseID: worstKey,
				IsError: true, Text: worstText, Size: worstInt})
		}
		s.Messages = append(s.Messages, m)
	}
	for range MaxToolUsesPerMessage {
		s.Pending = append(s.Pending, worstKey)
	}
	for range max(list(KeepToolCalls), MaxToolUsesPerMessage) {
		s.ToolCalls = append(s.ToolCalls, ToolCall{ToolUseID: worstKey, Name: worstKey, Turn: worstToken, Step: emptyOutputHash, Message: worstInt, UseSeq: worstSeq,
			ResultSeq: worstSeq, IsError: true, Status: CallOnly, StartedSeq: worstSeq, CompletedSeq: worstSeq, DurationMS: math.MaxInt64})
	}
	for range list(KeepOrphans) {
		s.Orphans = append(s.Orphans, Orphan{ToolUseID: worstKey, Name: worstKey, Seq: worstSeq, Turn: worstToken, DeclaredSeq: worstSeq,
			LateResultSeq: worstSeq, Repaired: true, RepairedSeq: worstSeq})
	}
	for range list(KeepAnomalies) {
		s.UnmatchedResults = append(s.UnmatchedResults, UnmatchedResult{ToolUseID: worstKey, Seq: worstSeq, Reason: UnmatchedUntracked})
		s.Violations = append(s.Violations, Violation{Seq: worstSeq, Rule: RuleDistillationDirtyHistory, Detail: worstDetail, ToolUseID: worstKey,
			Turn: worstToken, Resolved: true, ResolvedSeq: worstSeq, Time: worstTime})
		s.InvalidEvents = append(s.InvalidEvents, InvalidEvent{Seq: worstSeq, ID: worstKey, Type: events.Type(worstKey), Error: worstDetail})
		s.Flaky = append(s.Flaky, Flaky{Tool: worstKey, InputHash: emptyOutputHash, FailSeq: worstSeq, PassSeq: worstSeq, Turn: worstToken})
	}
	for range MaxSteps {
		s.Steps = append(s.Steps, FailedStep{Turn: worstToken, Key: emptyOutputHash, Name: worstKey, Failures: worstInt, FirstSeq: worstSeq, LastSeq: worstSeq})
	}
	dirty := []string{DirtyTurnInFlight, DirtyUnansweredToolUse}
	for _, r := range historyRules {
		dirty = append(dirty, string(r))
	}
	for range list(KeepDistillations) {
		s.Distillations = append(s.Distillations, Distillation{RequestedSeq: worstSeq, StartedSeq: worstSeq, CompletedSeq: worstSeq, SkippedSeq: worstSeq,
			RequestReason: worstDetail, Skipped: worstDetail, FromSeq: worstSeq, ToSeq: worstSeq, TokensBefore: math.MaxInt64, TokensAfter: math.MaxInt64,
			Trigger: worstKey, Turn: worstToken, DirtyReasons: dirty})
	}
	for range list(KeepCommands + MaxOpenCommands) {
		s.Commands = append(s.Commands, CommandRecord{ID: worstKey, Kind: worstKey, Attempts: worstInt, LastResult: events.AttemptResult(worstKey), LastClass: worstKey,
			LastError: worstDetail, Strategy: worstKey, Outcome: events.Outcome(worstKey), Detail: worstDetail, OutcomeSeq: worstSeq, Parked: true,
			ParkReason: worstDetail, Deliveries: worstInt, PauseCause: events.PauseCause(worstKey), FirstSeq: worstSeq, LastSeq: worstSeq})
	}
	for range MaxBreakers {
		s.Breakers = append(s.Breakers, Breaker{Provider: worstKey, State: worstKey, From: worstKey, Failures: worstInt, Reason: worstDetail,
			Seq: worstSeq, Since: worstTime})
	}
	for range list(KeepRewinds) {
		s.Forks = append(s.Forks, Fork{Session: worstToken, AtSeq: worstSeq, Seq: worstSeq, CommandID: worstKey})
		s.Rewinds = append(s.Rewinds, Rewind{AtSeq: worstSeq, ToSeq: worstSeq, Reason: worstDetail, CommandID: worstKey})
	}
	for range MaxRewoundRanges {
		s.Rewound = append(s.Rewound, SeqRange{From: worstSeq, To: worstSeq})
	}
	for range MaxUnknownTypes {
		s.UnknownTypes = append(s.UnknownTypes, UnknownType{Type: events.Type(worstKey), Count: worstInt, FirstSeq: worstSeq})
	}
	return s
}

// TestWorstStateFitsMaxSnapshotBytes checks the arithmetic of
// docs/limits.md: the snapshot of the largest state the bounds allow is
// at most MaxSnapshotBytes.
func TestWorstStateFitsMaxSnapshotBytes(t *testing.T) {
	s := worstState()
	body, err := EncodeSnapshot(s, worstTime)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("worst-case snapshot: %d bytes of %d", len(body), MaxSnapshotBytes)
	if len(body) > MaxSnapshotBytes {
		t.Errorf("the worst-case snapshot is %d bytes, over MaxSnapshotBytes (%d)", len(body), MaxSnapshotBytes)
	}
	// Each list's share, largest first, for docs/limits.md.
	b, _ := json.Marshal(s)
	var parts map[string]json.RawMessage
	_ = json.Unmarshal(b, &parts)
	for k, v := range parts {
		if len(v) > 2<<10 {
			t.Logf("  %-18s %7d bytes", k, len(v))
		}
	}
}

// TestStateBounds folds adversarial sessions, one per bound, and checks
// that the state holds to the bound, that what the invariants need is
// still exact, that the snapshot fits MaxSnapshotBytes, and that a
// snapshot taken half-way folds on to the same state. Under the race
// detector the two floods and the huge labels are a tenth as many or
// fewer (6,000 unknown types for MaxUnknownTypes 32, 1,000 tool calls for
// KeepToolCalls 96, 100 labels of 10,000 bytes for MaxLabels 16) and the
// huge texts 600 KB (MaxSnapshotBytes is 512 KB), still far past their
// bounds; so under -short. The full-size pass of .ci/run folds 60,000,
// 5,000, 1,000 and 900 KB.
func TestStateBounds(t *testing.T) {
	t.Parallel()
	unknown, calls, labels, bigText := 60000, 5000, 1000, 900<<10
	if sampled() {
		unknown, calls, labels, bigText = 6000, 1000, 100, 600<<10
	}
	huge := func(c byte, n int) string { return strings.Repeat(string(c), n) }
	// hugeID is a 100 KB tool_use id, distinct per i.
	hugeID := func(i int) string { return fmt.Sprintf("toolu_%04d_%s", i, huge('x', 100<<10)) }
	type tc struct {
		name  string
		steps func() []step
		check func(t *testing.T, s *Session)
	}
	for _, c := range []tc{
		{
			name: "unknown types flood",
			steps: func() []step {
				var st []step
				for i := range unknown {
					st = append(st, rawStep(rawEvent(events.Type(fmt.Sprintf("x.type_%d", i)), "", `{}`)))
				}
				return st
			},
			check: func(t *testing.T, s *Session) {
				if len(s.UnknownTypes) != MaxUnknownTypes || s.UnknownOther != unknown-MaxUnknownTypes {
					t.Errorf("unknown types: %d named, %d other; want %d and %d", len(s.UnknownTypes), s.UnknownOther, MaxUnknownTypes, unknown-MaxUnknownTypes)
				}
				if s.Totals.Violations != 0 {
					t.Errorf("unknown types are not violations: %d", s.Totals.Violations)
				}
			},
		},
		{
			name: "history flood",
			steps: func() []step {
				st := []step{in("t1", started("go"))}
				for i := range calls {
					id := fmt.Sprintf("toolu_%d", i)
					st = append(st, in("t1", user(text("next"))), in("t1", asst(text("on it"), use(id, "Bash"))), in("t1", user(result(id))))
				}
				// The latest assistant message's tool call is pending when
				// the earlier ones are no longer held: its result pairs.
				st = append(st, in("t1", asst(use("toolu_last", "Bash"))), in("t1", user(result("toolu_last"))), in("t1", completed()))
				return st
			},
			check: func(t *testing.T, s *Session) {
				if len(s.Messages) > KeepMessages+KeepMessages/4 || s.HistoryLen() != s.Totals.Messages || s.MessagesDropped == 0 {
					t.Errorf("messages: %d kept, %d dropped, %d in all", len(s.Messages), s.MessagesDropped, s.Totals.Messages)
				}
				if len(s.ToolCalls) > KeepToolCalls+KeepToolCalls/4 || s.Totals.ToolCalls != calls+1 {
					t.Errorf("tool calls: %d kept of %d", len(s.ToolCalls), s.Totals.ToolCalls)
				}
				if tc := s.ToolCall("toolu_last"); tc == nil || tc.Status != ToolAnswered {
					t.Errorf("the latest tool call: %+v", tc)
				}
				if s.Totals.Violations != 0 || s.Status() != StatusIdle {
					t.Errorf("a clean history flagged: %v", rules(s.Violations))
				}
			},
		},
		{
			name: "one message of many records",
			steps: func() []step {
				st := []step{in("t1", started("go"))}
				for i := range 3000 {
					st = append(st, in("t1", user(text(fmt.Sprintf("line %d", i)))))
				}
				// A result after text in the same message: results_not_first,
				// read from the message's flags, not from its few blocks.
				return append(st, in("t1", user(result("toolu_nothing"))), in("t1", completed()))
			},
			check: func(t *testing.T, s *Session) {
				m := s.Messages[0]
				if len(m.Seqs) != MaxMessageSeqs || m.SeqsDropped != 3001-MaxMessageSeqs || len(m.Blocks) != MaxMessageBlocks || m.BlocksDropped != 3001-MaxMessageBlocks {
					t.Errorf("message: %d seqs (+%d), %d blocks (+%d)", len(m.Seqs), m.SeqsDropped, len(m.Blocks), m.BlocksDropped)
				}
				if got := rules(s.Violations); len(got) != 2 || !strings.HasSuffix(got[0], string(RuleResultsNotFirst)) || !strings.HasSuffix(got[1], string(RuleToolResultWithoutToolUse)) {
					t.Errorf("violations %v", got)
				}
			},
		},
		{
			name: "huge ids",
			steps: func() []step {
				st := []step{in("t1", started("go")), in("t1", user(text("do it")))}
				for r := range 12 {
					var blocks []events.ContentBlock
					for i := range 9 {
						blocks = append(blocks, use(hugeID(r*9+i), "Bash"))
					}
					st = append(st, in("t1", asst(blocks...)))
				}
				// One of them is answered, by its full id.
				st = append(st, in("t1", user(result(hugeID(0)))))
				return append(st, in("t1", &events.TurnFailed{Stage: events.StageExecute, Error: errInfo("died")}))
			},
			check: func(t *testing.T, s *Session) {
				ids := s.OrphanedToolUseIDs()
				if len(ids) != 107 {
					t.Fatalf("%d orphans, want 107", len(ids))
				}
				for _, id := range ids {
					if len(id) > MaxKeyBytes || !IsDigestKey(id) || !strings.HasPrefix(id, "toolu_") {
						t.Fatalf("orphan id %q: want a digest key of at most %d bytes", id, MaxKeyBytes)
					}
				}
				if tc := s.ToolCall(hugeID(0)); tc == nil || tc.Status != ToolAnswered || tc.ToolUseID != IDKey(hugeID(0)) {
					t.Errorf("the answered call, looked up by its full id: %+v", tc)
				}
				if s.ToolCall(hugeID(1)).Status != ToolOrphaned || s.Orphans[0].Seq != 3 {
					t.Errorf("orphan: %+v", s.Orphans[0])
				}
			},
		},
		{
			name: "huge texts",
			steps: func() []step {
				big := huge('a', bigText)
				labelMap := map[string]string{}
				for i := range labels {
					labelMap[fmt.Sprintf("label_%04d", i)] = big[:10000]
				}
				st := []step{
					at(&events.SessionStarted{Runtime: big, Model: big, Provider: big, Labels: labelMap}),
					in("t1", &events.TurnStarted{Prompt: big, Trigger: big}),
					in("t1", user(text(big))),
					in("t1", asst(events.ContentBlock{Type: events.BlockThinking, Thinking: big}, text(big))),
					in("t1", &events.ErrorRecorded{ErrorInfo: events.ErrorInfo{Message: big, Stack: big, Code: big, Provider: big, Kind: events.KindTransient}}),
					in("t1", &events.TurnFailed{Stage: events.StageExecute, Error: events.ErrorInfo{Message: big, Stack: big, Code: big}}),
					at(&events.SessionPaused{Reason: big, Cause: events.CauseManual}),
					at(&events.RecoveryParked{CommandID: big, Kind: big, Reason: big}),
					at(&events.DistillationRequested{Reason: big}),
					at(&events.DistillationSkipped{Reason: big, Detail: big}),
				}
				return st
			},
			check: func(t *testing.T, s *Session) {
				if len(s.Labels) != MaxLabels || s.LabelsDropped != labels-MaxLabels {
					t.Errorf("labels: %d kept, %d dropped", len(s.Labels), s.LabelsDropped)
				}
				for _, str := range []string{s.Runtime, s.Model, s.Provider, s.Turns[0].Trigger, s.Commands[0].ID, s.Commands[0].Kind, s.Turns[0].Error.Code} {
					if len(str) > MaxKeyBytes {
						t.Errorf("key of %d bytes", len(str))
					}
				}
				for _, str := range []string{s.PauseReason, s.Turns[0].Error.Message, s.Commands[0].ParkReason, s.Distillations[0].RequestReason, s.Distillations[0].Skipped} {
					if n := len([]rune(str)); n > DetailRunes+1 {
						t.Errorf("detail of %d runes", n)
					}
				}
				if n := len([]rune(s.Turns[0].Prompt)); n != PreviewRunes+1 {
					t.Errorf("prompt preview of %d runes", n)
				}
				if b := s.Messages[1].Blocks[1]; len([]rune(b.Text)) != PreviewRunes+1 || b.Size != bigText || b.Seq != 4 {
					t.Errorf("text block: %d runes, size %d, seq %d", len([]rune(b.Text)), b.Size, b.Seq)
				}
				if s.Turns[0].Error.Stack != "" || len([]rune(s.Errors.Last.Error.Stack)) != StackRunes+1 {
					t.Errorf("stacks: turn %d bytes, last error %d runes", len(s.Turns[0].Error.Stack), len([]rune(s.Errors.Last.Error.Stack)))
				}
			},
		},
		{
			name: "tool_use blocks past MaxToolUsesPerMessage",
			steps: func() []step {
				var blocks, results []events.ContentBlock
				for i := range MaxToolUsesPerMessage + 72 {
					id := fmt.Sprintf("toolu_%d", i)
					blocks = append(blocks, use(id, "Read"))
					if i%2 == 0 {
						results = append(results, result(id))
					}
				}
				return []step{in("t1", started("go")), in("t1", user(text("read all"))), in("t1", asst(blocks...)), in("t1", user(results...)), in("t1", completed())}
			},
			check: func(t *testing.T, s *Session) {
				if s.Totals.UntrackedToolUses != 72 || s.Messages[1].UntrackedToolUses != 72 || s.Messages[1].ToolUses != MaxToolUsesPerMessage+72 {
					t.Errorf("untracked: %d (message %+v)", s.Totals.UntrackedToolUses, s.Messages[1].UntrackedToolUses)
				}
				// The tracked half without results are orphans; the untracked
				// ones are not judged, and their results flag nothing.
				if n := len(s.OrphanedToolUseIDs()); n != MaxToolUsesPerMessage/2 {
					t.Errorf("%d orphans, want %d", n, MaxToolUsesPerMessage/2)
				}
				if s.Totals.Violations != MaxToolUsesPerMessage/2 || s.Totals.UnmatchedResults != 36 {
					t.Errorf("violations %d, unmatched %d", s.Totals.Violations, s.Totals.UnmatchedResults)
				}
			},
		},
		{
			name: "turns in flight past MaxInFlightTurns",
			steps: func() []step {
				var st []step
				for i := range MaxInFlightTurns + 4 {
					st = append(st, in(fmt.Sprintf("t%d", i), started("go")))
				}
				return st
			},
			check: func(t *testing.T, s *Session) {
				if len(s.InFlight) != MaxInFlightTurns || s.Totals.Turns != MaxInFlightTurns+4 {
					t.Errorf("in flight %d, turns %d", len(s.InFlight), s.Totals.Turns)
				}
				if got := rules(s.Violations); len(got) != 4 || !strings.HasSuffix(got[0], string(RuleTooManyTurns)) {
					t.Errorf("violations %v", got)
				}
			},
		},
		{
			name: "orphans and violations past their windows",
			steps: func() []step {
				var st []step
				// An orphan, then a long history after it: its message and
				// its tool call leave the windows, and it stays an orphan of
				// the history (and keeps the session broken).
				st = append(st, in("t0", started("go")), in("t0", user(text("x"))), in("t0", asst(use("toolu_old", "Bash"))), in("t0", completed()))
				for i := range 400 {
					turn := fmt.Sprintf("t%d", i+1)
					id := fmt.Sprintf("toolu_%d", i)
					st = append(st, in(turn, started("go")), in(turn, user(text("x"))), in(turn, asst(use(id, "Bash"))), in(turn, user(result(id))),
						in(turn, &events.TurnFailed{Stage: events.StageExecute, Error: errInfo("boom")}))
				}
				// Its late result is still late, though no message or tool
				// call the state keeps names it.
				return append(st, in("t401", started("go")), in("t401", user(result("toolu_old"))), in("t401", completed()))
			},
			check: func(t *testing.T, s *Session) {
				if len(s.Turns) > KeepTurns+KeepTurns/4 || s.Totals.FailedTurns != 400 || !s.Anomalous() {
					t.Errorf("turns: %d kept, %d failed", len(s.Turns), s.Totals.FailedTurns)
				}
				if ids := s.OrphanedToolUseIDs(); len(ids) != 1 || ids[0] != "toolu_old" || s.Status() != StatusBroken {
					t.Errorf("orphans %v, status %s", ids, s.Status())
				}
				if s.ToolCall("toolu_old") != nil {
					t.Errorf("the old tool call is still held")
				}
				last := s.Violations[len(s.Violations)-1]
				if last.Rule != RuleLateToolResult || s.Orphans[0].LateResultSeq == 0 {
					t.Errorf("the old orphan's result: %+v", last)
				}
				if s.HistoryBroken[RuleToolUseWithoutResult] != 1 || s.HistoryBroken[RuleLateToolResult] != 1 {
					t.Errorf("history broken: %v", s.HistoryBroken)
				}
			},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			evs := build(t, c.steps())
			s := FoldLog(evs)
			c.check(t, s)
			body, err := EncodeSnapshot(s, epoch)
			if err != nil {
				t.Fatal(err)
			}
			if len(body) > MaxSnapshotBytes {
				t.Errorf("snapshot of %d bytes, over MaxSnapshotBytes (%d)", len(body), MaxSnapshotBytes)
			}
			// Snapshot + tail = full fold, from half-way.
			half := FoldLog(evs[:len(evs)/2])
			restored := &Session{}
			if err := json.Unmarshal(mustJSON(t, half), restored); err != nil {
				t.Fatal(err)
			}
			for _, ev := range evs[len(evs)/2:] {
				restored.Apply(ev)
			}
			if got, want := fingerprint(t, restored), fingerprint(t, s); string(got) != string(want) {
				t.Errorf("snapshot + tail differs from the full fold\n got: %.300s\nwant: %.300s", diffAt(got, want), diffAt(want, got))
			}
		})
	}
}

// longSession returns n events of one session that never distills: turns
// with a prompt, a user message, a tool call and its result (a 24 KB
// output every 500th), the answer, an error every 50th turn, a failed
// turn every 97th, and an event of a new unknown type every 50th. The
// payloads are written straight as JSON, so that building 200,000 events
// costs little next to folding them.
func longSession(n int) []events.Event {
	out := make([]events.Event, 0, n)
	big, _ := json.Marshal(strings.Repeat("output line\n", 2000))
	add := func(typ events.Type, turn, data string) {
		seq := uint64(len(out) + 1)
		ev := rawEvent(typ, turn, data)
		ev.ID = events.DeterministicID(epoch, strconvU(seq))
		ev.Seq, ev.Time = seq, epoch.Add(time.Duration(seq)*time.Millisecond)
		out = append(out, ev)
	}
	for i := 0; len(out) < n; i++ {
		turn := "t" + strconvU(uint64(i))
		id := "toolu_" + strconvU(uint64(i))
		output := `"ok"`
		if i%500 == 0 {
			output = string(big)
		}
		add(events.TypeTurnStarted, turn, `{"prompt":"prompt `+strconvU(uint64(i))+`","trigger":"user"}`)
		add(events.TypeMessageAppended, turn, `{"role":"user","content":[{"type":"text","text":"please go on"}]}`)
		add(events.TypeMessageAppended, turn, `{"role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"running it"},{"type":"tool_use","id":"`+id+`","name":"Bash","input":{"command":"make test"}}]}`)
		add(events.TypeMessageAppended, turn, `{"role":"user","content":[{"type":"tool_result","tool_use_id":"`+id+`","content":`+output+`}]}`)
		if i%50 == 3 {
			add(events.TypeErrorRecorded, turn, `{"message":"overloaded `+strconvU(uint64(i))+`","kind":"transient","http_status":529,"consecutive":1}`)
		}
		if i%50 == 5 {
			add(events.Type("x.new_"+strconvU(uint64(i))), "", `{}`)
		}
		add(events.TypeMessageAppended, turn, `{"role":"assistant","content":[{"type":"text","text":"done `+strconvU(uint64(i))+`"}],"stop_reason":"end_turn"}`)
		if i%97 == 0 {
			add(events.TypeTurnFailed, turn, `{"stage":"execute","error":{"message":"boom","kind":"logic"}}`)
		} else {
			add(events.TypeTurnCompleted, turn, `{"reason":"end_turn"}`)
		}
	}
	return out[:n]
}

func strconvU(u uint64) string { return fmt.Sprint(u) }

// TestLongSessionSnapshotStaysBounded folds a 200,000-event session and
// checks its snapshot at every 20,000 events: under MaxSnapshotBytes, and
// no larger at the end than a tenth of the way (the state is a window, not
// the history). The last one is saved to a real snapshot store and loaded
// back. Under the race detector and -short the session has 40,000
// events, checked every 4,000 (some 6,500 turns, two hundred times the
// longest window, and 24 KB outputs); the full-size pass of .ci/run folds
// the 200,000.
func TestLongSessionSnapshotStaysBounded(t *testing.T) {
	t.Parallel()
	n := 200000
	if sampled() {
		n = 40000
	}
	every := n / 10
	evs := longSession(n)
	s := &Session{}
	var first, largest int
	for i, ev := range evs {
		s.Apply(ev)
		if (i+1)%every != 0 {
			continue
		}
		body, err := EncodeSnapshot(s, epoch)
		if err != nil {
			t.Fatal(err)
		}
		if first == 0 {
			first = len(body)
		}
		largest = max(largest, len(body))
		if len(body) > MaxSnapshotBytes {
			t.Fatalf("after %d events the snapshot is %d bytes, over MaxSnapshotBytes (%d)", i+1, len(body), MaxSnapshotBytes)
		}
	}
	t.Logf("snapshot of a %d-event session: %d bytes after %d events, at most %d after", n, first, every, largest)
	if largest > first+first/4 {
		t.Errorf("the snapshot grew with the session: %d bytes after %d events, %d later", first, every, largest)
	}
	if s.Events != n || s.Totals.Turns < n/7 || s.Totals.FailedTurns == 0 || s.UnknownOther == 0 {
		t.Fatalf("the session folded to %d events, %d turns, %d failed, %d other unknown", s.Events, s.Totals.Turns, s.Totals.FailedTurns, s.UnknownOther)
	}

	ctx := testContext(t)
	store := newStore(t, startJetStream(t))
	if err := store.EnsureStream(ctx); err != nil {
		t.Fatal(err)
	}
	if err := store.Save(ctx, s); err != nil {
		t.Fatalf("save: %v", err)
	}
	got, err := store.Load(ctx, testTenant, testSession)
	if err != nil {
		t.Fatal(err)
	}
	if string(fingerprint(t, got)) != string(fingerprint(t, s)) {
		t.Errorf("the loaded snapshot differs from the state saved")
	}
	// A state the fold could not make (a field set by hand past its
	// bound) is refused before it is sent.
	s.PauseReason = strings.Repeat("x", MaxSnapshotBytes)
	s.LastSeq++
	if err := store.Save(ctx, s); !errors.Is(err, ErrSnapshotTooLarge) {
		t.Errorf("save of an oversized state: %v, want ErrSnapshotTooLarge", err)
	}
	if snap, err := store.Latest(ctx, testTenant, testSession); err != nil || snap.CoversSeq != s.LastSeq-1 {
		t.Errorf("after the refused save, the latest snapshot is %+v, %v", snap, err)
	}
}
