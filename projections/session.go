// Package projections folds a session's events into its state and checks
// the invariants of DESIGN.md ("Invariants the projections check"): every
// turn ends exactly once (1); the message history follows the Anthropic
// Messages API rules for tool_use and tool_result blocks and for roles (2);
// no distillation runs during a foreign turn or over a dirty history (3);
// the same error, or the same assistant output, in a row is counted as a
// streak, and each turn's failed attempts as its budget spent (4). It also
// keeps the
// recovery side's record of the session: the recovery commands run on it
// (recovery.*), its rewinds and forks, and the circuit breakers
// (breaker.changed).
//
// The fold (Session.Apply) is pure: no I/O, no clock (time only comes from
// the events), no map iteration order in its results. Folding the same
// events always yields the same state and the same JSON, and a state
// restored from its JSON (a snapshot) folds on exactly like the original.
// One event needs more than the state: a session.rewound that undoes
// events the state holds, which Apply cannot take back (rewind.go:
// NeedsRefold, Refold, FoldLog).
//
// SnapshotStore (snapshot.go) keeps a bounded number of snapshots of each
// session on JetStream, so that restoring a session is "last snapshot + the
// events after it".
package projections

import (
	"time"

	"github.com/turnstone-dev/turnstone/events"
)

// Version is the version of the Session JSON schema. A snapshot of another
// version is ignored and the session is replayed from its first event.
// Bump it whenever the fold's rules or the state's shape change.
//
// Version 2: recovery commands, rewinds, forks, breakers; repaired
// orphans and resolved violations.
//
// Version 3: invariant 4's counts (the output streak and message hashes,
// turns' failed attempts, flaky-suspected tool runs) and violation times.
const Version = 3

// Retention bounds: the state keeps the latest entries of the lists that
// grow with a session's length, so that a snapshot stays small whatever
// the session's age. Totals counts every entry ever made.
const (
	// KeepTurns is how many ended turns the state keeps (in-flight turns
	// are always kept).
	KeepTurns = 200
	// KeepToolCalls is how many tool calls the state keeps (pending ones
	// are always kept). Tool calls are also dropped when a distillation
	// resets the history.
	KeepToolCalls = 500
	// KeepAnomalies is how many entries each of Violations, Orphans,
	// UnmatchedResults, InvalidEvents and Flaky keeps.
	KeepAnomalies = 500
	// KeepDistillations is how many distillations the state keeps.
	KeepDistillations = 50
	// KeepCommands is how many recovery commands the state keeps (the ones
	// without an outcome or a park are always kept).
	KeepCommands = 200
	// KeepRewinds is how many entries each of Rewinds and Forks keeps.
	KeepRewinds = 50
	// KeepOutputSeqs is how many sequences OutputStreak.Seqs keeps: those
	// of the run's first messages.
	KeepOutputSeqs = 10
	// PreviewRunes is the length, in runes, of the text previews of blocks
	// and prompts.
	PreviewRunes = 200
)

// Session is the projected state of one session: what its events say, and
// what they break. The zero value is an empty session, ready for Apply.
// It marshals to JSON (snake_case) for snapshots and `engine inspect
// --json`; a Session unmarshalled from that JSON folds on exactly like the
// one it was marshalled from. Treat its fields as read-only: change it only
// with Apply.
//
// Sequences (…Seq) are JetStream stream sequences of the session's events;
// times come from the events' time attribute.
type Session struct {
	// Version is the schema version of this state (the package's Version).
	Version int `json:"version"`

	// Tenant and Session identify the session (subject tokens).
	Tenant  string `json:"tenant"`
	Session string `json:"session"`
	// Kind is "main", "subagent" or "compaction" (from session.started;
	// empty until it is seen).
	Kind string `json:"kind,omitempty"`
	// ParentSession and ParentToolUseID link a subagent's session to the
	// session and the tool call that started it.
	ParentSession   string `json:"parent_session,omitempty"`
	ParentToolUseID string `json:"parent_tool_use_id,omitempty"`
	// Runtime names the agent runtime ("claude-code 2.1.38").
	Runtime string `json:"runtime,omitempty"`
	// Provider is the model provider session.started named.
	Provider string `json:"provider,omitempty"`
	// Model is the model of the latest assistant message (or, before any,
	// the one session.started named).
	Model string `json:"model,omitempty"`
	// Labels are session.started's free-form metadata (masked values).
	Labels map[string]string `json:"labels,omitempty"`
	// ForkedFrom and ForkSeq are a fork's lineage, from the first
	// session.started that names them: the session (same tenant) it was
	// forked from, and the last stream sequence of that session's events
	// it copies (a sequence of the source session's log, not of this one).
	ForkedFrom string `json:"forked_from,omitempty"`
	ForkSeq    uint64 `json:"fork_seq,omitempty"`

	// Events is how many events were folded, invalid, unknown and rewound
	// ones included.
	Events int `json:"events"`
	// FirstSeq and LastSeq are the stream sequences of the first and the
	// last event folded (0 when the events carry none).
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
	// FirstTime and LastTime are the earliest and the latest event time
	// folded. Event times need not rise with sequences (an import, a
	// snapshot.taken stamped with the time of the event it covers), so
	// they are a minimum and a maximum, not the first and last events'.
	FirstTime time.Time `json:"first_time,omitzero"`
	LastTime  time.Time `json:"last_time,omitzero"`
	// Totals counts every entry ever made in the lists the state keeps
	// only the latest entries of.
	Totals Totals `json:"totals"`

	// Turns are the session's turns in start order: every in-flight turn
	// and the latest KeepTurns ended ones.
	Turns []Turn `json:"turns,omitempty"`
	// InFlight lists the ids of the turns in flight, in start order.
	InFlight []string `json:"in_flight,omitempty"`

	// Messages is the current message history in the model API's view:
	// consecutive records of one role merged into one message. A
	// distillation.completed empties it.
	Messages []Message `json:"messages,omitempty"`
	// HistoryStart marks where the current history began.
	HistoryStart HistoryMark `json:"history_start"`
	// Pending lists the tool_use ids of the latest assistant message that
	// still await their tool_result (the tool is running), in block order.
	Pending []string `json:"pending,omitempty"`
	// ToolCalls pairs the tool_use blocks of the current history with
	// their tool_result, in order of appearance (the latest KeepToolCalls,
	// pending ones always kept).
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// Orphans are the tool_use blocks judged to have no tool_result (the
	// latest KeepAnomalies).
	Orphans []Orphan `json:"orphans,omitempty"`
	// UnmatchedResults are the tool_result blocks that answer no tool_use
	// of the previous assistant message (the latest KeepAnomalies).
	UnmatchedResults []UnmatchedResult `json:"unmatched_results,omitempty"`
	// Violations are the broken invariants, each at the event where it
	// arose (the latest KeepAnomalies).
	Violations []Violation `json:"violations,omitempty"`

	// Distillations are the session's distillations (compactions), in
	// order (the latest KeepDistillations).
	Distillations []Distillation `json:"distillations,omitempty"`
	// Errors counts the errors recorded and the current streak.
	Errors ErrorStats `json:"errors"`
	// Outputs is the current run of identical assistant outputs
	// (invariant 4; see OutputStreak).
	Outputs OutputStreak `json:"outputs"`
	// LastTool is the session's latest tool_use and how it ran: what the
	// next tool_use is compared with to spot a re-run (see Flaky). Nil
	// before the first tool_use, and after a tool_use whose id the history
	// already held.
	LastTool *ToolRun `json:"last_tool,omitempty"`
	// Flaky are the flaky-suspected tool runs: a failed tool call whose
	// immediate identical re-run passed (the latest KeepAnomalies). They
	// are not violations.
	Flaky []Flaky `json:"flaky,omitempty"`

	// Paused is true between session.paused and session.resumed;
	// PauseReason and PausedSeq tell why and since when.
	Paused      bool   `json:"paused"`
	PauseReason string `json:"pause_reason,omitempty"`
	PausedSeq   uint64 `json:"paused_seq,omitempty"`
	// LastSnapshotSeq is the covers_seq of the latest snapshot.taken.
	LastSnapshotSeq uint64 `json:"last_snapshot_seq,omitempty"`

	// Commands are the recovery commands run on the session, by id, in
	// order of their first recovery.* event (the latest KeepCommands; the
	// ones without an outcome or a park are always kept). See CommandDone.
	Commands []CommandRecord `json:"commands,omitempty"`
	// Breakers is the latest state of each provider's circuit breaker that
	// a breaker.changed event named, sorted by provider. Breaker events
	// usually live in a pseudo-session of their own per tenant
	// (BreakersSession).
	Breakers []Breaker `json:"breakers,omitempty"`
	// Forks are the sessions forked from this one (session.forked), in
	// order (the latest KeepRewinds).
	Forks []Fork `json:"forks,omitempty"`

	// Rewinds are the session's rewinds (session.rewound), in order (the
	// latest KeepRewinds), including the ones a later rewind undid (see
	// IsRewound). A rewind is never undone from this list.
	Rewinds []Rewind `json:"rewinds,omitempty"`
	// Rewound are the ranges of stream sequences whose events rewinds
	// undid: they are kept in the log but no longer count. Sorted,
	// disjoint and not adjacent; never trimmed (each rewind adds at most
	// one range, and the state needs them all to refold).
	Rewound []SeqRange `json:"rewound,omitempty"`
	// RewoundEvents is how many of the session's events lie in Rewound,
	// as of the last refold.
	RewoundEvents int `json:"rewound_events,omitempty"`
	// NeedsRefold is set by Apply of a session.rewound that undoes events
	// the state holds: until Refold (or RefoldLog) runs, the recovery
	// record (Rewinds, Rewound) is current but the rest of the state still
	// shows the undone events. FoldLog, Restore and the Projector refold
	// at once; a caller of Apply must too.
	NeedsRefold bool `json:"needs_refold,omitempty"`

	// InvalidEvents are the events that could not be folded (the latest
	// KeepAnomalies); each also has an invalid_event violation.
	InvalidEvents []InvalidEvent `json:"invalid_events,omitempty"`
	// UnknownTypes counts the events of types this version does not know,
	// in order of first appearance. They are not violations: the wire
	// contract lets newer publishers send new types.
	UnknownTypes []UnknownType `json:"unknown_types,omitempty"`

	idx *index // lookups by id, rebuilt from the slices when nil
}

// Totals counts every entry ever made, including the ones the state no
// longer keeps (see the Keep constants).
type Totals struct {
	// Turns is how many turns started; Turn.Index counts from it.
	Turns int `json:"turns"`
	// Messages is how many API messages the history ever held (before and
	// after distillations); Message.Index counts from it.
	Messages int `json:"messages"`
	// ToolCalls, Orphans, UnmatchedResults, Violations, InvalidEvents and
	// Distillations count the entries ever made in the lists of the same
	// names.
	ToolCalls        int `json:"tool_calls"`
	Orphans          int `json:"orphans"`
	UnmatchedResults int `json:"unmatched_results"`
	Violations       int `json:"violations"`
	InvalidEvents    int `json:"invalid_events"`
	Distillations    int `json:"distillations"`
	// Resolved counts the violations a repair resolved (Violation.Resolved).
	Resolved int `json:"resolved,omitempty"`
	// Commands, Forks, Rewinds and Flaky count the entries ever made in
	// the lists of the same names.
	Commands int `json:"commands,omitempty"`
	Forks    int `json:"forks,omitempty"`
	Rewinds  int `json:"rewinds,omitempty"`
	Flaky    int `json:"flaky,omitempty"`
}

// HistoryMark is where the current message history began: at the
// session's start, or at the last distillation.completed, which empties
// the history.
type HistoryMark struct {
	// Seq is the sequence of the distillation.completed that reset the
	// history; 0 at the session's start.
	Seq uint64 `json:"seq"`
	// Violations, Orphans and Resolved are Totals.Violations,
	// Totals.Orphans and Totals.Resolved at that point: the entries made
	// after them belong to the current history.
	Violations int `json:"violations"`
	Orphans    int `json:"orphans"`
	Resolved   int `json:"resolved,omitempty"`
}

// TurnStatus is where a turn is in its life.
type TurnStatus string

// The turn statuses. Every turn.started ends in exactly one of completed,
// failed or abandoned (invariant 1).
const (
	TurnInFlight  TurnStatus = "in_flight"
	TurnCompleted TurnStatus = "completed"
	TurnFailed    TurnStatus = "failed"
	TurnAbandoned TurnStatus = "abandoned"
)

// Turn is one turn of the session.
type Turn struct {
	// ID is the turn's id (the envelope's turn attribute).
	ID string `json:"id"`
	// Index is the turn's number in the session, from 1.
	Index int `json:"index"`
	// Status is in_flight until one end event arrives.
	Status TurnStatus `json:"status"`
	// Reason is turn.completed's stop reason ("end_turn", "interrupted")
	// or turn.abandoned's reason.
	Reason string `json:"reason,omitempty"`
	// Prompt is a preview (PreviewRunes runes) of what started the turn;
	// Trigger is what kind of thing started it.
	Prompt  string `json:"prompt,omitempty"`
	Trigger string `json:"trigger,omitempty"`
	// DeadlineMS is how long the turn may run, in milliseconds (0: no
	// deadline was given).
	DeadlineMS int64 `json:"deadline_ms,omitempty"`
	// StartedSeq and EndedSeq are the sequences of turn.started and of the
	// event that ended the turn (0 while in flight).
	StartedSeq uint64 `json:"started_seq"`
	EndedSeq   uint64 `json:"ended_seq,omitempty"`
	// StartedAt and EndedAt are those events' times.
	StartedAt time.Time `json:"started_at,omitzero"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	// LastStage is the last stage the turn completed.
	LastStage events.Stage `json:"last_stage,omitempty"`
	// FailedStage and Error are set on a failed turn: the stage that threw
	// and what it threw (message and stack shortened).
	FailedStage events.Stage      `json:"failed_stage,omitempty"`
	Error       *events.ErrorInfo `json:"error,omitempty"`
	// DurationMS is the turn's wall time in milliseconds: turn.completed's
	// duration_ms when given, else EndedAt - StartedAt.
	DurationMS int64 `json:"duration_ms,omitempty"`
	// FailedAttempts is the implementation budget the turn spent
	// (invariant 4): its failed attempts. It counts the tool_result blocks
	// with is_error set that answer a tool_use block of the turn (results
	// that pair with their tool_use only; the synthetic results a repair
	// writes do not count, nor does tool_call.completed's is_error), plus
	// the error.recorded events that carry the turn, whether or not it is
	// still in flight. The turn.failed that ends a turn is its outcome,
	// not an attempt. The limit is the reconciler's policy.
	FailedAttempts int `json:"failed_attempts,omitempty"`
}

// Ended reports whether the turn has ended (completed, failed or
// abandoned).
func (t *Turn) Ended() bool { return t.Status != TurnInFlight }

// Message is one message of the history in the model API's view: one or
// more consecutive message.appended records of one role, merged.
type Message struct {
	// Index is the message's number in the session, from 1, counting the
	// messages distillations removed.
	Index int `json:"index"`
	// Role is user or assistant.
	Role events.Role `json:"role"`
	// Seqs are the sequences of the records merged into it, in order.
	Seqs []uint64 `json:"seqs"`
	// Turn is the turn of its first record.
	Turn string `json:"turn,omitempty"`
	// Blocks digest its content blocks, in order.
	Blocks []Block `json:"blocks"`
	// StopReason is the latest record's stop_reason (assistant messages).
	StopReason string `json:"stop_reason,omitempty"`
	// Meta is true when a record of it was added by the runtime (command
	// output, a compaction summary); Synthetic when one was written by
	// Turnstone (a repaired tool_result).
	Meta      bool `json:"meta,omitempty"`
	Synthetic bool `json:"synthetic,omitempty"`
	// Hash is an assistant message's output hash: OutputHash of the
	// content blocks of all its records, in order (empty for user
	// messages). The OutputStreak compares it.
	Hash string `json:"hash,omitempty"`
}

// Block is a digest of one content block; the full content stays in the
// log.
type Block struct {
	// Type is the block's type ("text", "tool_use", "tool_result", ...).
	Type string `json:"type"`
	// ID and Name are a tool_use block's id and tool name.
	ID   string `json:"id,omitempty"`
	Name string `json:"name,omitempty"`
	// ToolUseID and IsError are a tool_result block's.
	ToolUseID string `json:"tool_use_id,omitempty"`
	IsError   bool   `json:"is_error,omitempty"`
	// Text is a preview (PreviewRunes runes) of the text, the thinking,
	// the tool_result's text content, or the tool_use's input as compact
	// JSON.
	Text string `json:"text,omitempty"`
	// Size is the size, in bytes, of the original content (text,
	// thinking, input, result content, data or source).
	Size int `json:"size"`
}

// ToolStatus is where a tool_use stands.
type ToolStatus string

// The tool call statuses.
const (
	// ToolPending: no tool_result yet, and the user message that must hold
	// it is not complete: the tool is running.
	ToolPending ToolStatus = "pending"
	// ToolAnswered: exactly one tool_result answered it in the next user
	// message.
	ToolAnswered ToolStatus = "answered"
	// ToolOrphaned: the user message that had to hold its tool_result is
	// complete without it.
	ToolOrphaned ToolStatus = "orphaned"
	// ToolRepaired: it was orphaned, then a synthetic tool_result (written
	// by a repair_orphans command) answered it while its assistant message
	// was still the history's latest, so the history is valid again.
	ToolRepaired ToolStatus = "repaired"
)

// ToolCall is one tool_use of the current history paired with its
// tool_result, and the tool_call.* events that tell its execution.
type ToolCall struct {
	// ToolUseID is the tool_use block's id ("toolu_..."); Name the tool's
	// name.
	ToolUseID string `json:"tool_use_id"`
	Name      string `json:"name"`
	// Turn is the turn of the event that holds the tool_use.
	Turn string `json:"turn,omitempty"`
	// Message is the Index of the assistant message that holds the
	// tool_use; 0 when only tool_call.* events named the id so far.
	Message int `json:"message"`
	// UseSeq is the sequence of the record holding the tool_use; ResultSeq
	// the one holding its tool_result (0 until answered).
	UseSeq    uint64 `json:"use_seq"`
	ResultSeq uint64 `json:"result_seq,omitempty"`
	// IsError is true when the tool_result or tool_call.completed reported
	// a failure.
	IsError bool `json:"is_error,omitempty"`
	// Status is pending, answered, orphaned, repaired, or CallOnly.
	Status ToolStatus `json:"status"`
	// StartedSeq, CompletedSeq and DurationMS (milliseconds) come from
	// tool_call.started and tool_call.completed, when the runtime sends
	// them.
	StartedSeq   uint64 `json:"started_seq,omitempty"`
	CompletedSeq uint64 `json:"completed_seq,omitempty"`
	DurationMS   int64  `json:"duration_ms,omitempty"`
}

// Orphan is a tool_use judged to have no tool_result: the user message
// that had to hold it was complete without it.
type Orphan struct {
	// ToolUseID and Name are the tool_use block's id and tool name.
	ToolUseID string `json:"tool_use_id"`
	Name      string `json:"name"`
	// Seq is the sequence of the assistant record holding the tool_use.
	Seq uint64 `json:"seq"`
	// Turn is the turn of that record.
	Turn string `json:"turn,omitempty"`
	// DeclaredSeq is the sequence of the event that completed the user
	// message without the result.
	DeclaredSeq uint64 `json:"declared_seq"`
	// LateResultSeq is the sequence of a tool_result that arrived after
	// the orphan was declared and could not repair it (the orphan is kept;
	// the result is unmatched).
	LateResultSeq uint64 `json:"late_result_seq,omitempty"`
	// Repaired is set when a synthetic tool_result repaired it (see
	// ToolRepaired); RepairedSeq is the sequence of the record holding it.
	// A repaired orphan leaves OrphanedToolUseIDs.
	Repaired    bool   `json:"repaired,omitempty"`
	RepairedSeq uint64 `json:"repaired_seq,omitempty"`
}

// The reasons of an UnmatchedResult.
const (
	// UnmatchedUnknown: no tool_use with that id is in the history.
	UnmatchedUnknown = "unknown_tool_use"
	// UnmatchedNotPrevious: the tool_use is in an earlier message, not the
	// previous assistant message.
	UnmatchedNotPrevious = "not_in_previous_message"
	// UnmatchedDuplicate: the tool_use was already answered.
	UnmatchedDuplicate = "duplicate"
	// UnmatchedLate: the tool_use was already declared an orphan.
	UnmatchedLate = "late_result"
)

// UnmatchedResult is a tool_result that answers no open tool_use of the
// previous assistant message.
type UnmatchedResult struct {
	// ToolUseID is the id the tool_result names.
	ToolUseID string `json:"tool_use_id"`
	// Seq is the sequence of the user record holding it.
	Seq uint64 `json:"seq"`
	// Reason is one of the Unmatched constants.
	Reason string `json:"reason"`
}

// Rule names a broken invariant in a Violation.
type Rule string

// The rules the fold checks. Invariant 1 (turns): TurnUnknown,
// TurnAlreadyEnded, TurnDuplicateStart, TurnWhilePaused. Invariant 2 (the
// Anthropic Messages API rules on tool_use, tool_result and roles):
// ToolUseWithoutResult, ToolResultWithoutToolUse, DuplicateToolResult,
// LateToolResult, DuplicateToolUse, ResultsNotFirst, FirstMessageNotUser.
// Invariant 3 (distillation): DistillationDuringTurn,
// DistillationDirtyHistory. And InvalidEvent for events that could not be
// folded.
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
	// Detail says what broke, for people.
	Detail string `json:"detail"`
	// ToolUseID and Turn name the tool_use and the turn concerned, when
	// there is one.
	ToolUseID string `json:"tool_use_id,omitempty"`
	Turn      string `json:"turn,omitempty"`
	// Resolved is set when a later event fixed what broke: a repair of the
	// orphan a tool_use_without_result names. ResolvedSeq is that event's
	// sequence. A resolved violation stays in the list but no longer
	// counts for Status or for a distillation's history check.
	Resolved    bool   `json:"resolved,omitempty"`
	ResolvedSeq uint64 `json:"resolved_seq,omitempty"`
	// Time is the time attribute of the event where it arose (zero when
	// the event had none).
	Time time.Time `json:"time,omitzero"`
}

// The reason DirtyReasons lists when the history's tail holds a tool_use
// without result; the other reasons are the history Rules broken since the
// last distillation.
const DirtyUnansweredToolUse = "unanswered_tool_use"

// Distillation is one distillation (compaction) of the history, from its
// request to its end.
type Distillation struct {
	// RequestedSeq, StartedSeq, CompletedSeq and SkippedSeq are the
	// sequences of its events (0 when not seen).
	RequestedSeq uint64 `json:"requested_seq,omitempty"`
	StartedSeq   uint64 `json:"started_seq,omitempty"`
	CompletedSeq uint64 `json:"completed_seq,omitempty"`
	SkippedSeq   uint64 `json:"skipped_seq,omitempty"`
	// RequestReason is why it was requested ("auto: context 92% full").
	RequestReason string `json:"request_reason,omitempty"`
	// Skipped is why it did not run ("turn_in_flight"), when it did not.
	Skipped string `json:"skipped,omitempty"`
	// FromSeq..ToSeq (inclusive) are the events it covers: the event's
	// own range, or else from the previous distillation's end + 1 (or the
	// session's first sequence) to the sequence before it.
	FromSeq uint64 `json:"from_seq,omitempty"`
	ToSeq   uint64 `json:"to_seq,omitempty"`
	// TokensBefore and TokensAfter are the history's size in tokens.
	TokensBefore int64 `json:"tokens_before,omitempty"`
	TokensAfter  int64 `json:"tokens_after,omitempty"`
	// Trigger is "auto" or "manual".
	Trigger string `json:"trigger,omitempty"`
	// Turn is the envelope's turn: the turn that compacts inline.
	Turn string `json:"turn,omitempty"`
	// Clean is true when it started in no foreign turn and over a clean
	// history; DirtyReasons say what was wrong otherwise. Both are set
	// once it started (or completed without a started event).
	Clean        bool     `json:"clean"`
	DirtyReasons []string `json:"dirty_reasons,omitempty"`
}

// open reports whether the distillation has neither completed nor been
// skipped.
func (d *Distillation) open() bool {
	return d.CompletedSeq == 0 && d.Skipped == "" && d.SkippedSeq == 0
}

// ErrorStats counts the session's errors: error.recorded events and the
// errors of failed turns.
type ErrorStats struct {
	// Total is how many errors were recorded.
	Total int `json:"total"`
	// Last is the latest error, if any.
	Last *ErrorRecord `json:"last,omitempty"`
	// Streak is the run of identical errors in a row (invariant 4: the
	// same error N times in a row is a loop, not progress).
	Streak Streak `json:"streak"`
}

// ErrorRecord is one error as the state keeps it.
type ErrorRecord struct {
	// Error is the error, its message and stack shortened.
	Error events.ErrorInfo `json:"error"`
	// Seq is the sequence of the event that carried it.
	Seq uint64 `json:"seq"`
	// Turn and Stage are the turn and stage it happened in, when known.
	Turn  string       `json:"turn,omitempty"`
	Stage events.Stage `json:"stage,omitempty"`
	// Consecutive is error.recorded's own count of this error in a row.
	Consecutive int `json:"consecutive,omitempty"`
}

// Streak is a run of identical errors. Two errors are identical when they
// have the same Key: their kind, code, HTTP status and a hash of their
// normalized message (lower case, digits folded, spaces collapsed). The
// streak restarts at 1 when a different error arrives and resets to zero
// when a turn completes.
type Streak struct {
	// Key is the ErrorKey of the streak's error (empty when Count is 0).
	Key string `json:"key,omitempty"`
	// Count is how many times in a row it arrived.
	Count int `json:"count"`
	// FirstSeq is the sequence of the streak's first error.
	FirstSeq uint64 `json:"first_seq,omitempty"`
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

// The session statuses Status returns, in precedence order.
const (
	StatusPaused = "paused"
	StatusInTurn = "in_turn"
	StatusBroken = "broken"
	StatusIdle   = "idle"
)

// Status is the session's status in one word: "paused" while paused, else
// "in_turn" while a turn is in flight, else "broken" when a violation
// that is not resolved arose since the current history began (the
// session's start or the last distillation; orphans are violations too),
// else "idle".
func (s *Session) Status() string {
	switch {
	case s.Paused:
		return StatusPaused
	case len(s.InFlight) > 0:
		return StatusInTurn
	case s.Totals.Violations-s.HistoryStart.Violations > s.Totals.Resolved-s.HistoryStart.Resolved:
		return StatusBroken
	}
	return StatusIdle
}

// FirstAnomaly returns the earliest violation the state keeps, resolved
// or not, or nil when it keeps none (Violations keeps the latest
// KeepAnomalies: in a long session, older ones are gone). The pointer is
// into the state: read it, do not keep it across Apply.
func (s *Session) FirstAnomaly() *Violation {
	if len(s.Violations) == 0 {
		return nil
	}
	return &s.Violations[0]
}

// Anomalous reports whether the session has something for `engine
// incidents` to show: a violation ever (orphans and invalid events are
// violations too; resolved ones count), a flaky-suspected tool run ever,
// a failed or abandoned turn, a parked command or a command whose
// outcome is events.OutcomeFailed among those the state keeps (see
// KeepTurns, KeepCommands), or a loop: DefaultLoopLimit or more
// identical assistant outputs (Outputs) or identical errors
// (Errors.Streak) in a row.
func (s *Session) Anomalous() bool {
	if s.Totals.Violations > 0 || s.Totals.Orphans > 0 || s.Totals.InvalidEvents > 0 || s.Totals.Flaky > 0 ||
		s.Outputs.Count >= DefaultLoopLimit || s.Errors.Streak.Count >= DefaultLoopLimit {
		return true
	}
	for i := range s.Turns {
		if st := s.Turns[i].Status; st == TurnFailed || st == TurnAbandoned {
			return true
		}
	}
	for i := range s.Commands {
		if c := &s.Commands[i]; c.Parked || c.Outcome == events.OutcomeFailed {
			return true
		}
	}
	return false
}

// InFlightTurn returns the oldest turn in flight (the one most likely past
// its deadline), or nil when none is. The pointer is into the state: read
// it, do not keep it across Apply.
func (s *Session) InFlightTurn() *Turn {
	if len(s.InFlight) == 0 {
		return nil
	}
	return s.turn(s.InFlight[0])
}

// Turn returns the turn with id, or nil when the state holds none. The
// pointer is into the state: read it, do not keep it across Apply.
func (s *Session) Turn(id string) *Turn { return s.turn(id) }

// ToolCall returns the latest tool call with tool_use id, or nil. The
// pointer is into the state: read it, do not keep it across Apply.
func (s *Session) ToolCall(id string) *ToolCall { return s.toolCall(id) }

// OrphanedToolUseIDs returns the ids of the orphans of the current history
// (declared since the last distillation reset it) that no repair answered,
// in the order they were declared: the tool_use blocks a repair would
// answer. Orphans holds the older and the repaired ones too.
func (s *Session) OrphanedToolUseIDs() []string {
	var ids []string
	for _, o := range s.Orphans[since(s.HistoryStart.Orphans, s.Totals.Orphans, len(s.Orphans)):] {
		if !o.Repaired {
			ids = append(ids, o.ToolUseID)
		}
	}
	return ids
}

// since returns the index in a list of n kept entries (out of total ever
// made) of the first entry made after mark entries.
func since(mark, total, n int) int {
	i := n - (total - mark)
	if i < 0 {
		return 0
	}
	if i > n {
		return n
	}
	return i
}

// index holds lookups by id over the state's slices. It is not marshalled:
// it is rebuilt from the slices when nil (after a JSON round trip) or
// after a slice is trimmed.
type index struct {
	turns     map[string]int // turn id -> index in Turns
	toolCalls map[string]int // tool_use id -> index in ToolCalls (the latest)
	commands  map[string]int // command id -> index in Commands
}

func (s *Session) index() *index {
	if s.idx == nil {
		s.idx = &index{
			turns:     make(map[string]int, len(s.Turns)),
			toolCalls: make(map[string]int, len(s.ToolCalls)),
			commands:  make(map[string]int, len(s.Commands)),
		}
		for i := range s.Turns {
			s.idx.turns[s.Turns[i].ID] = i
		}
		for i := range s.ToolCalls {
			s.idx.toolCalls[s.ToolCalls[i].ToolUseID] = i
		}
		for i := range s.Commands {
			s.idx.commands[s.Commands[i].ID] = i
		}
	}
	return s.idx
}

func (s *Session) turn(id string) *Turn {
	if i, ok := s.index().turns[id]; ok {
		return &s.Turns[i]
	}
	return nil
}

func (s *Session) toolCall(id string) *ToolCall {
	if i, ok := s.index().toolCalls[id]; ok {
		return &s.ToolCalls[i]
	}
	return nil
}
