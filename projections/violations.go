package projections

import (
	"time"

	"github.com/turnstone-dev/turnstone/events"
)

// Rule names a broken invariant in a Violation.
type Rule string

// The rules the fold checks. Invariant 1 (turns): TurnUnknown,
// TurnAlreadyEnded, TurnDuplicateStart, TurnWhilePaused, TooManyTurns.
// Invariant 2 (the
// Anthropic Messages API rules on tool_use, tool_result and roles):
// ToolUseWithoutResult, ToolResultWithoutToolUse, DuplicateToolResult,
// LateToolResult, DuplicateToolUse, ResultsNotFirst, FirstMessageNotUser.
// Invariant 3 (distillation): DistillationDuringTurn,
// DistillationDirtyHistory. And ClockSkew for an event time the log's
// clock contradicts, InvalidEvent for events that could not be folded.
const (
	// RuleTurnUnknown: a turn.* event (other than turn.started) names a
	// turn that never started.
	RuleTurnUnknown Rule = "turn_unknown"
	// RuleTurnAlreadyEnded: a turn event arrives for a turn that already
	// ended (a second end, or a stage after the end).
	RuleTurnAlreadyEnded Rule = "turn_already_ended"
	// RuleTurnDuplicateStart: turn.started names a turn that already
	// started.
	RuleTurnDuplicateStart Rule = "turn_duplicate_start"
	// RuleTurnWhilePaused: a turn started while the session was paused.
	RuleTurnWhilePaused Rule = "turn_while_paused"
	// RuleTooManyTurns: a turn started while MaxInFlightTurns turns were
	// in flight; the state does not track it.
	RuleTooManyTurns Rule = "too_many_turns_in_flight"

	// RuleToolUseWithoutResult: the user message after a tool_use is
	// complete without its tool_result (the tool_use is an orphan).
	RuleToolUseWithoutResult Rule = "tool_use_without_result"
	// RuleToolResultWithoutToolUse: a tool_result names no tool_use of the
	// previous assistant message.
	RuleToolResultWithoutToolUse Rule = "tool_result_without_tool_use"
	// RuleDuplicateToolResult: a second tool_result for one tool_use.
	RuleDuplicateToolResult Rule = "duplicate_tool_result"
	// RuleLateToolResult: a tool_result for a tool_use already declared an
	// orphan that does not repair it (not synthetic, or after a later
	// assistant message).
	RuleLateToolResult Rule = "late_tool_result"
	// RuleDuplicateToolUse: a tool_use id that the history already holds
	// (the API requires unique ids).
	RuleDuplicateToolUse Rule = "duplicate_tool_use"
	// RuleResultsNotFirst: a user message holds a block other than
	// tool_result before a tool_result.
	RuleResultsNotFirst Rule = "results_not_first"
	// RuleFirstMessageNotUser: the history (at the session's start or
	// after a distillation) starts with an assistant message.
	RuleFirstMessageNotUser Rule = "first_message_not_user"

	// RuleDistillationDuringTurn: a distillation started while a turn
	// other than its own was in flight.
	RuleDistillationDuringTurn Rule = "distillation_during_turn"
	// RuleDistillationDirtyHistory: a distillation started over a history
	// whose tail holds an unanswered tool_use, or that broke a history
	// rule since the last distillation (resolved violations aside).
	RuleDistillationDirtyHistory Rule = "distillation_dirty_history"

	// RuleClockSkew: the event's own time lies more than MaxClockSkew
	// ahead of the time the log stored it.
	RuleClockSkew Rule = "clock_skew"

	// RuleInvalidEvent: an event could not be folded (its Err was set, its
	// payload did not decode, or it lacks what the fold needs).
	RuleInvalidEvent Rule = "invalid_event"
)

// historyRules are the rules about the message history, in the order
// Distillation.DirtyReasons lists them.
var historyRules = []Rule{
	RuleToolUseWithoutResult,
	RuleToolResultWithoutToolUse,
	RuleDuplicateToolResult,
	RuleLateToolResult,
	RuleDuplicateToolUse,
	RuleResultsNotFirst,
	RuleFirstMessageNotUser,
}

// Violation is one broken invariant, at the event where it arose.
type Violation struct {
	// Seq is the sequence of the event where it arose.
	Seq uint64 `json:"seq"`
	// Rule is the rule broken (a Rule constant).
	Rule Rule `json:"rule"`
	// Detail says what broke, for people (DetailRunes runes at most).
	Detail string `json:"detail"`
	// ToolUseID and Turn name the tool_use and the turn concerned, when
	// there is one.
	ToolUseID string `json:"tool_use_id,omitempty"`
	Turn      string `json:"turn,omitempty"`
	// Resolved is set when a later event fixed what broke: a repair of the
	// orphan a tool_use_without_result names. ResolvedSeq is that event's
	// sequence. A resolved violation stays in the list but no longer
	// counts for Status or for a distillation's history check.
	Resolved    bool   `json:"resolved,omitzero"`
	ResolvedSeq uint64 `json:"resolved_seq,omitzero"`
	// Time is the time attribute of the event where it arose (zero when
	// the event had none).
	Time time.Time `json:"time,omitzero"`
}

// InvalidEvent is an event the fold could not apply.
type InvalidEvent struct {
	// Seq, ID and Type are the event's sequence, id and type, as far as
	// they are known.
	Seq  uint64      `json:"seq"`
	ID   string      `json:"id,omitempty"`
	Type events.Type `json:"type,omitempty"`
	// Error says why (shortened).
	Error string `json:"error"`
}

// UnknownType counts the events of one type this version does not know.
type UnknownType struct {
	// Type is the unknown type.
	Type events.Type `json:"type"`
	// Count is how many events of it were folded.
	Count int `json:"count"`
	// FirstSeq is the sequence of the first one.
	FirstSeq uint64 `json:"first_seq"`
}

// violate records a violation at ev. toolUseID and turn are keys
// already (IDKey, tokenKey); why is clipped (DetailRunes).
func (s *Session) violate(ev *events.Event, rule Rule, why, toolUseID, turn string) {
	s.Violations = append(s.Violations, Violation{Seq: ev.Seq, Rule: rule, Detail: detail(why), ToolUseID: toolUseID, Turn: turn, Time: ev.Time.Round(0)})
	s.Totals.Violations++
	if isHistoryRule(rule) {
		if s.HistoryBroken == nil {
			s.HistoryBroken = map[Rule]int{}
		}
		s.HistoryBroken[rule]++
	}
}

func isHistoryRule(r Rule) bool {
	for _, h := range historyRules {
		if r == h {
			return true
		}
	}
	return false
}

// invalid records an event that cannot be folded.
func (s *Session) invalid(ev *events.Event, why string) {
	why = detail(why)
	s.InvalidEvents = append(s.InvalidEvents, InvalidEvent{Seq: ev.Seq, ID: IDKey(ev.ID), Type: events.Type(IDKey(string(ev.Type))), Error: why})
	s.Totals.InvalidEvents++
	s.violate(ev, RuleInvalidEvent, why, "", "")
}

// unknown counts an event of a type this version does not know.
func (s *Session) unknown(ev *events.Event) {
	typ := events.Type(IDKey(string(ev.Type)))
	for i := range s.UnknownTypes {
		if s.UnknownTypes[i].Type == typ {
			s.UnknownTypes[i].Count++
			return
		}
	}
	if len(s.UnknownTypes) >= MaxUnknownTypes {
		s.UnknownOther++
		return
	}
	s.UnknownTypes = append(s.UnknownTypes, UnknownType{Type: typ, Count: 1, FirstSeq: ev.Seq})
}
