package projections

import (
	"encoding/json"
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
			worstInt, worstInt, worstInt, worstInt, worstInt, worstInt, worstInt, worstInt, worstInt},
		HistoryStart:    HistoryMark{Seq: worstSeq, Violations: worstInt, Orphans: worstInt, Resolved: worstInt, ToolCalls: worstInt},
		MessagesDropped: worstInt,
		HistoryBroken:   map[Rule]int{},
		Errors: ErrorStats{Total: worstInt,
			Last: &ErrorRecord{Error: events.ErrorInfo{Message: clip(strings.Repeat("<", 9*ErrorRunes), ErrorRunes, 2*ErrorRunes),
				Stack: clip(strings.Repeat("<", 9*StackRunes), StackRunes, 2*StackRunes), Kind: events.ErrorKind(worstKey),
				Provider: worstKey, HTTPStatus: 599, Code: worstKey}, Seq: worstSeq, Turn: worstToken, Stage: events.Stage(worstKey), Consecutive: worstInt},
			Streak: Streak{Key: worstKey, Count: worstInt, FirstSeq: worstSeq}},
		Outputs:  OutputStreak{Hash: emptyOutputHash, Count: worstInt, Seqs: seqs(KeepOutputSeqs), LastSeq: worstSeq, Message: worstInt},
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
		s.Turns = append(s.Turns, Turn{ID: worstToken, Index: worstInt, Status: TurnAbandoned, Reason: worstDetail, Prompt: worstText,
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
		s.ToolCalls = append(s.ToolCalls, ToolCall{ToolUseID: worstKey, Name: worstKey, Turn: worstToken, Message: worstInt, UseSeq: worstSeq,
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
		s.Commands = append(s.Commands, CommandRecord{ID: worstKey, Kind: worstKey, Attempts: worstInt, LastResult: worstKey, LastClass: worstKey,
			LastError: worstDetail, Strategy: worstKey, Outcome: worstKey, Detail: worstDetail, OutcomeSeq: worstSeq, Parked: true,
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
	body, err := encodeSnapshot(s, worstTime)
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
		if len(v) > 8<<10 {
			t.Logf("  %-18s %7d bytes", k, len(v))
		}
	}
}
