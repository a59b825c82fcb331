package events

import "encoding/json"

// Type names what an event records. Types are lower-case, dot-separated
// nouns and past-tense verbs ("turn.started"). A type this version does not
// know is stored and kept (a newer publisher may send it) and flagged by the
// projections; see KnownType.
type Type string

// The event types of wire contract version 1. docs/events.md documents the
// data of each.
const (
	TypeSessionStarted Type = "session.started"
	TypeSessionPaused  Type = "session.paused"
	TypeSessionResumed Type = "session.resumed"
	TypeSessionRewound Type = "session.rewound"
	TypeSessionForked  Type = "session.forked"

	TypeTurnStarted        Type = "turn.started"
	TypeTurnStageCompleted Type = "turn.stage_completed"
	TypeTurnCompleted      Type = "turn.completed"
	TypeTurnFailed         Type = "turn.failed"
	TypeTurnAbandoned      Type = "turn.abandoned"

	TypeMessageAppended Type = "message.appended"

	TypeToolCallStarted   Type = "tool_call.started"
	TypeToolCallCompleted Type = "tool_call.completed"

	TypeErrorRecorded Type = "error.recorded"

	TypeDistillationRequested Type = "distillation.requested"
	TypeDistillationStarted   Type = "distillation.started"
	TypeDistillationCompleted Type = "distillation.completed"
	TypeDistillationSkipped   Type = "distillation.skipped"

	TypeSnapshotTaken Type = "snapshot.taken"

	TypeRecoveryAttempted Type = "recovery.attempted"
	TypeRecoveryCompleted Type = "recovery.completed"
	TypeRecoveryParked    Type = "recovery.parked"

	TypeBreakerChanged Type = "breaker.changed"
)

// Payload is the typed data of one event type.
type Payload interface {
	// EventType is the Type whose data this payload is.
	EventType() Type
	// validate reports every rule the payload breaks, with field paths
	// relative to "data".
	validate(v *validator)
}

func newPayload(t Type) Payload {
	switch t {
	case TypeSessionStarted:
		return &SessionStarted{}
	case TypeSessionPaused:
		return &SessionPaused{}
	case TypeSessionResumed:
		return &SessionResumed{}
	case TypeTurnStarted:
		return &TurnStarted{}
	case TypeTurnStageCompleted:
		return &TurnStageCompleted{}
	case TypeTurnCompleted:
		return &TurnCompleted{}
	case TypeTurnFailed:
		return &TurnFailed{}
	case TypeTurnAbandoned:
		return &TurnAbandoned{}
	case TypeMessageAppended:
		return &MessageAppended{}
	case TypeToolCallStarted:
		return &ToolCallStarted{}
	case TypeToolCallCompleted:
		return &ToolCallCompleted{}
	case TypeErrorRecorded:
		return &ErrorRecorded{}
	case TypeDistillationRequested:
		return &DistillationRequested{}
	case TypeDistillationStarted:
		return &DistillationStarted{}
	case TypeDistillationCompleted:
		return &DistillationCompleted{}
	case TypeDistillationSkipped:
		return &DistillationSkipped{}
	case TypeSnapshotTaken:
		return &SnapshotTaken{}
	case TypeSessionRewound:
		return &SessionRewound{}
	case TypeSessionForked:
		return &SessionForked{}
	case TypeRecoveryAttempted:
		return &RecoveryAttempted{}
	case TypeRecoveryCompleted:
		return &RecoveryCompleted{}
	case TypeRecoveryParked:
		return &RecoveryParked{}
	case TypeBreakerChanged:
		return &BreakerChanged{}
	}
	return nil
}

// KnownType reports whether t is a type of this version of the contract.
func KnownType(t Type) bool { return newPayload(t) != nil }

// Stage is a stage of a turn's pipeline, in order: context (gather the
// context), history (load and check the message history), execute (call the
// model and run tools), finalize (deliver and persist the result).
type Stage string

// The stages of a turn.
const (
	StageContext  Stage = "context"
	StageHistory  Stage = "history"
	StageExecute  Stage = "execute"
	StageFinalize Stage = "finalize"
)

func (s Stage) valid() bool {
	switch s {
	case StageContext, StageHistory, StageExecute, StageFinalize:
		return true
	}
	return false
}

// Next returns the stage a turn is in once s is the last stage it
// completed: context when s is empty (no stage completed yet), then
// history, execute and finalize; finalize stays finalize (the turn
// completed every stage but has not delivered its outcome). It returns ""
// for a value that is not a stage.
func (s Stage) Next() Stage {
	switch s {
	case "":
		return StageContext
	case StageContext:
		return StageHistory
	case StageHistory:
		return StageExecute
	case StageExecute, StageFinalize:
		return StageFinalize
	}
	return ""
}

// ErrorKind says whether an error is worth retrying: transient (the same
// call may succeed later: timeouts, 429, 5xx), logic (it will fail again
// until something changes: 400, a bug) or unknown.
type ErrorKind string

// The error kinds.
const (
	KindTransient ErrorKind = "transient"
	KindLogic     ErrorKind = "logic"
	KindUnknown   ErrorKind = "unknown"
)

func (k ErrorKind) valid() bool {
	return k == KindTransient || k == KindLogic || k == KindUnknown
}

// SessionStarted opens a session. Runtime names the agent runtime
// ("claude-code 2.1.38"), Model and Provider the defaults it starts with.
// ParentSession and ParentToolUseID link a sidechain (a subagent's session)
// to the session and the tool call that started it. Kind is "main" (the
// default), "subagent" or "compaction". Labels are free-form metadata (cwd,
// git branch); their values are masked. History marks a session recorded
// after the fact (an import of a transcript file): its events are history,
// not a runtime at work, and the reconciler never acts on it. A later
// session.started of the same session may change any of these (a followed
// transcript that was first imported as history sends History false).
type SessionStarted struct {
	// ForkedFrom and ForkSeq record a fork's lineage: the session it was
	// forked from and the last stream sequence of that session's prefix
	// it copies.
	ForkedFrom      string            `json:"forked_from,omitempty"`
	ForkSeq         uint64            `json:"fork_seq,omitzero"`
	Runtime         string            `json:"runtime,omitempty"`
	Model           string            `json:"model,omitempty"`
	Provider        string            `json:"provider,omitempty"`
	Kind            string            `json:"kind,omitempty"`
	ParentSession   string            `json:"parent_session,omitempty"`
	ParentToolUseID string            `json:"parent_tool_use_id,omitempty"`
	Labels          map[string]string `json:"labels,omitempty"`
	History         bool              `json:"history,omitzero"`
}

// PauseCause says, for machines, why a session was paused; Reason says it
// for people.
type PauseCause string

// The pause causes. A session paused for runtime_unavailable is resumed by
// the engine when its runtime is present again (docs/control.md).
const (
	// CauseRuntimeUnavailable: a command needed the agent runtime and no
	// runtime answered (NATS no responders).
	CauseRuntimeUnavailable PauseCause = "runtime_unavailable"
	// CauseNeedsPerson: a strategy chain ended in pause (authentication,
	// a spent retry chain) and a person must act, then resume.
	CauseNeedsPerson PauseCause = "needs_person"
	// CauseParked: a command failed on every delivery and was parked.
	CauseParked PauseCause = "parked"
	// CauseLoop: the reconciler saw a loop (the same output or error in a
	// row).
	CauseLoop PauseCause = "loop"
	// CauseAborted: abort_session gave up on the session.
	CauseAborted PauseCause = "aborted"
	// CauseManual: a person (or a pause_session command issued by hand)
	// paused it.
	CauseManual PauseCause = "manual"
)

// SessionPaused records that the session must not run new turns until it is
// resumed; Reason says why, for people. Cause, when set, says why for
// machines (a PauseCause; empty from older writers); CommandID and Kind name
// the recovery command that paused it or that could not run, when one did.
type SessionPaused struct {
	Reason    string     `json:"reason"`
	Cause     PauseCause `json:"cause,omitempty"`
	CommandID string     `json:"command_id,omitempty"`
	Kind      string     `json:"kind,omitempty"`
}

// SessionResumed ends a pause; Reason says who or what resumed it.
type SessionResumed struct {
	Reason string `json:"reason,omitempty"`
}

// TurnStarted opens a turn; the envelope's turn attribute names it and must
// be set. Prompt is a short preview of what started it (masked). DeadlineMS,
// when set, is how long the turn may run, in milliseconds, before it is
// abandoned.
type TurnStarted struct {
	Prompt     string `json:"prompt,omitempty"`
	Trigger    string `json:"trigger,omitempty"`
	DeadlineMS int64  `json:"deadline_ms,omitzero"`
}

// TurnStageCompleted records that a stage of the turn finished, after
// DurationMS milliseconds.
type TurnStageCompleted struct {
	Stage      Stage `json:"stage"`
	DurationMS int64 `json:"duration_ms,omitzero"`
}

// TurnCompleted ends a turn with an outcome the runtime delivered. Reason is
// "end_turn" (the default), "interrupted" (the user stopped it), or another
// stop reason of the runtime's; DurationMS is the turn's wall time.
type TurnCompleted struct {
	Reason     string `json:"reason,omitempty"`
	DurationMS int64  `json:"duration_ms,omitzero"`
}

// TurnFailed ends a turn that threw: Stage is the stage that failed, Error
// what it threw (masked).
type TurnFailed struct {
	Stage Stage     `json:"stage"`
	Error ErrorInfo `json:"error"`
}

// TurnAbandoned ends a turn that had no outcome by its deadline, or that
// a person or the engine gave up on. LastStageCompleted is the last stage
// it completed (empty if none); Stage is the stage it was in when it was
// abandoned (the one after LastStageCompleted: see Stage.Next); Reason
// says who abandoned it and why, for people; Cause says why for machines
// (AbandonDeadline, AbandonEngineRestart, AbandonManual, or empty); and
// CommandID names the recovery command that wrote it, when one did.
//
// LastStage is the key contract version 1 first wrote, "last_stage", with
// the same meaning as LastStageCompleted: it is still read (see
// Completed) but no longer written.
type TurnAbandoned struct {
	LastStageCompleted Stage  `json:"last_stage_completed,omitempty"`
	Stage              Stage  `json:"stage,omitempty"`
	LastStage          Stage  `json:"last_stage,omitempty"`
	Reason             string `json:"reason"`
	Cause              string `json:"cause,omitempty"`
	CommandID          string `json:"command_id,omitempty"`
}

// The causes of a turn.abandoned (TurnAbandoned.Cause).
const (
	// AbandonDeadline: the reconciler abandoned it when its deadline
	// passed with no outcome.
	AbandonDeadline = "deadline"
	// AbandonEngineRestart: the reconciler abandoned it because it was in
	// flight when the engine restarted (policy restart_abandon).
	AbandonEngineRestart = "engine_restart"
	// AbandonManual: a person issued the abandon_turn (engine recovery
	// issue).
	AbandonManual = "manual"
)

// Completed returns the last stage the turn completed: LastStageCompleted,
// or the older key LastStage when only that is set.
func (p *TurnAbandoned) Completed() Stage {
	if p.LastStageCompleted != "" {
		return p.LastStageCompleted
	}
	return p.LastStage
}

// InStage returns the stage the turn was in: Stage, or when the event does
// not say (an event written before the key existed), the stage after
// Completed.
func (p *TurnAbandoned) InStage() Stage {
	if p.Stage != "" {
		return p.Stage
	}
	return p.Completed().Next()
}

// ErrorInfo is an error as stored: Message and Stack are masked; Kind
// classifies it; Provider and HTTPStatus are set when a model provider
// answered the failed call; Code is the provider's error type
// ("overloaded_error") where known.
type ErrorInfo struct {
	Message    string    `json:"message"`
	Stack      string    `json:"stack,omitempty"`
	Kind       ErrorKind `json:"kind,omitempty"`
	Provider   string    `json:"provider,omitempty"`
	HTTPStatus int       `json:"http_status,omitzero"`
	Code       string    `json:"code,omitempty"`
}

// Role is the author of a message in the model API's terms.
type Role string

// The roles of the Anthropic Messages API.
const (
	RoleUser      Role = "user"
	RoleAssistant Role = "assistant"
)

// MessageAppended adds one record to the session's message history. Several
// records of one role in a row form one API message (the projection merges
// them), as Claude Code writes one record per content block. MessageID is
// the provider's id of the API response ("msg_..."); Model is the model that
// wrote an assistant message; StopReason is the API's stop_reason. Meta
// marks records the runtime adds to the history that no person typed
// (command output, compaction summaries); Synthetic marks records Turnstone
// itself wrote (a repaired tool_result).
type MessageAppended struct {
	Role       Role           `json:"role"`
	Content    []ContentBlock `json:"content"`
	MessageID  string         `json:"message_id,omitempty"`
	Model      string         `json:"model,omitempty"`
	StopReason string         `json:"stop_reason,omitempty"`
	Meta       bool           `json:"meta,omitzero"`
	Synthetic  bool           `json:"synthetic,omitzero"`
	Usage      *Usage         `json:"usage,omitempty"`
}

// Usage is the token accounting of the model call (one API response) that
// wrote an assistant message, in tokens. Field names follow the Anthropic
// Messages API's usage object (input_tokens, output_tokens,
// cache_read_input_tokens, cache_creation_input_tokens); ReasoningTokens is
// OpenAI's reasoning_output_tokens (a part of OutputTokens, as Codex counts
// them). InputTokens excludes the cached tokens, as Anthropic's does; a
// runtime whose provider counts cached tokens inside its input (OpenAI)
// subtracts them. Every count is zero or more; zero fields are omitted.
type Usage struct {
	InputTokens      int64 `json:"input_tokens,omitzero"`
	OutputTokens     int64 `json:"output_tokens,omitzero"`
	CacheReadTokens  int64 `json:"cache_read_input_tokens,omitzero"`
	CacheWriteTokens int64 `json:"cache_creation_input_tokens,omitzero"`
	ReasoningTokens  int64 `json:"reasoning_output_tokens,omitzero"`
}

// ToolCallStarted records that the runtime began executing a tool_use block.
type ToolCallStarted struct {
	ToolUseID string `json:"tool_use_id"`
	Name      string `json:"name"`
}

// ToolCallCompleted records that a tool call ended, after DurationMS
// milliseconds, with IsError set when the tool reported a failure.
type ToolCallCompleted struct {
	ToolUseID  string `json:"tool_use_id"`
	Name       string `json:"name"`
	DurationMS int64  `json:"duration_ms,omitzero"`
	IsError    bool   `json:"is_error,omitzero"`
}

// ErrorRecorded stores an error the runtime hit. Consecutive is how many
// times in a row the runtime has now seen this error (1 for the first);
// Stage, when set, is the stage that was running.
type ErrorRecorded struct {
	ErrorInfo
	Consecutive int   `json:"consecutive,omitzero"`
	Stage       Stage `json:"stage,omitempty"`
}

// DistillationRequested asks for the session's history to be distilled
// (compacted); Reason is why ("auto: context 92% full", "manual").
type DistillationRequested struct {
	Reason string `json:"reason,omitempty"`
}

// DistillationStarted records that a distillation began over the events
// FromSeq..ToSeq (stream sequences, inclusive; zero when unknown).
type DistillationStarted struct {
	FromSeq uint64 `json:"from_seq,omitzero"`
	ToSeq   uint64 `json:"to_seq,omitzero"`
}

// DistillationCompleted records a finished distillation: the events it
// covers (FromSeq..ToSeq, stream sequences, inclusive; zero when unknown),
// the history's size in tokens before and after, and the summary that
// replaces the history (masked). Trigger is "auto" or "manual".
type DistillationCompleted struct {
	FromSeq      uint64 `json:"from_seq,omitzero"`
	ToSeq        uint64 `json:"to_seq,omitzero"`
	TokensBefore int64  `json:"tokens_before,omitzero"`
	TokensAfter  int64  `json:"tokens_after,omitzero"`
	Trigger      string `json:"trigger,omitempty"`
	Summary      string `json:"summary,omitempty"`
}

// DistillationSkipped records that a requested distillation did not run, and
// why ("turn_in_flight", "unanswered_tool_use").
type DistillationSkipped struct {
	Reason string `json:"reason"`
	Detail string `json:"detail,omitempty"`
}

// SnapshotTaken records that the session's projected state up to stream
// sequence CoversSeq was saved in the snapshot stream; Version is the
// projection's state version.
type SnapshotTaken struct {
	CoversSeq uint64 `json:"covers_seq"`
	Version   int    `json:"version,omitzero"`
}

// EventType returns TypeSessionStarted: the Payload interface.
func (*SessionStarted) EventType() Type { return TypeSessionStarted }

// EventType returns TypeSessionPaused: the Payload interface.
func (*SessionPaused) EventType() Type { return TypeSessionPaused }

// EventType returns TypeSessionResumed: the Payload interface.
func (*SessionResumed) EventType() Type { return TypeSessionResumed }

// EventType returns TypeTurnStarted: the Payload interface.
func (*TurnStarted) EventType() Type { return TypeTurnStarted }

// EventType returns TypeTurnStageCompleted: the Payload interface.
func (*TurnStageCompleted) EventType() Type { return TypeTurnStageCompleted }

// EventType returns TypeTurnCompleted: the Payload interface.
func (*TurnCompleted) EventType() Type { return TypeTurnCompleted }

// EventType returns TypeTurnFailed: the Payload interface.
func (*TurnFailed) EventType() Type { return TypeTurnFailed }

// EventType returns TypeTurnAbandoned: the Payload interface.
func (*TurnAbandoned) EventType() Type { return TypeTurnAbandoned }

// EventType returns TypeMessageAppended: the Payload interface.
func (*MessageAppended) EventType() Type { return TypeMessageAppended }

// EventType returns TypeToolCallStarted: the Payload interface.
func (*ToolCallStarted) EventType() Type { return TypeToolCallStarted }

// EventType returns TypeToolCallCompleted: the Payload interface.
func (*ToolCallCompleted) EventType() Type { return TypeToolCallCompleted }

// EventType returns TypeErrorRecorded: the Payload interface.
func (*ErrorRecorded) EventType() Type { return TypeErrorRecorded }

// EventType returns TypeDistillationRequested: the Payload interface.
func (*DistillationRequested) EventType() Type { return TypeDistillationRequested }

// EventType returns TypeDistillationStarted: the Payload interface.
func (*DistillationStarted) EventType() Type { return TypeDistillationStarted }

// EventType returns TypeDistillationCompleted: the Payload interface.
func (*DistillationCompleted) EventType() Type { return TypeDistillationCompleted }

// EventType returns TypeDistillationSkipped: the Payload interface.
func (*DistillationSkipped) EventType() Type { return TypeDistillationSkipped }

// EventType returns TypeSnapshotTaken: the Payload interface.
func (*SnapshotTaken) EventType() Type { return TypeSnapshotTaken }

// EventType returns TypeSessionRewound: the Payload interface.
func (*SessionRewound) EventType() Type { return TypeSessionRewound }

// EventType returns TypeSessionForked: the Payload interface.
func (*SessionForked) EventType() Type { return TypeSessionForked }

// EventType returns TypeRecoveryAttempted: the Payload interface.
func (*RecoveryAttempted) EventType() Type { return TypeRecoveryAttempted }

// EventType returns TypeRecoveryCompleted: the Payload interface.
func (*RecoveryCompleted) EventType() Type { return TypeRecoveryCompleted }

// EventType returns TypeRecoveryParked: the Payload interface.
func (*RecoveryParked) EventType() Type { return TypeRecoveryParked }

// EventType returns TypeBreakerChanged: the Payload interface.
func (*BreakerChanged) EventType() Type { return TypeBreakerChanged }

// SessionRewound rewinds the session to stream sequence ToSeq: its state is
// the state as of ToSeq, and the events after ToSeq up to this one are kept
// in the log but marked rewound (they no longer count). CommandID names the
// recovery command that rewound it, when one did.
type SessionRewound struct {
	ToSeq     uint64 `json:"to_seq"`
	Reason    string `json:"reason"`
	CommandID string `json:"command_id,omitempty"`
}

// SessionForked records, in the source session, that a new session
// (ForkSession, same tenant) was started from its events up to AtSeq.
type SessionForked struct {
	ForkSession string `json:"fork_session"`
	AtSeq       uint64 `json:"at_seq"`
	CommandID   string `json:"command_id,omitempty"`
}

// Outcome is how a recovery command ended (recovery.completed's outcome):
// one of Outcomes. docs/control.md shows each with an example.
type Outcome string

// The recovery outcomes.
const (
	// OutcomeRecovered: the command did what it was for; the session
	// works again.
	OutcomeRecovered Outcome = "recovered"
	// OutcomeDegraded: it did it with less than asked: another provider,
	// raw output, a skipped step, or an effect recorded in the log that
	// the runtime could not be told of.
	OutcomeDegraded Outcome = "degraded"
	// OutcomeFailed: nothing worked, or the command's chain ended in a
	// pause or an abort: the session is paused for a person or given up.
	OutcomeFailed Outcome = "failed"
)

// Outcomes lists every Outcome.
var Outcomes = []Outcome{OutcomeRecovered, OutcomeDegraded, OutcomeFailed}

// Valid reports whether o is one of Outcomes.
func (o Outcome) Valid() bool {
	return o == OutcomeRecovered || o == OutcomeDegraded || o == OutcomeFailed
}

// AttemptResult is how one recovery attempt went (recovery.attempted's
// result): AttemptOK or AttemptFailed.
type AttemptResult string

// The attempt results.
const (
	AttemptOK     AttemptResult = "ok"
	AttemptFailed AttemptResult = "failed"
)

// RecoveryAttempted records one attempt at a recovery command: the
// command's id and kind, the attempt number (1 for the first) and the
// strategy tried. Result is AttemptOK or AttemptFailed; Error, when it
// failed, what went wrong (masked); Class the error class it fell into (a
// recovery.Class name, such as "runtime_unavailable": docs/control.md
// lists them); DurationMS how long the attempt took.
type RecoveryAttempted struct {
	CommandID  string        `json:"command_id"`
	Kind       string        `json:"kind"`
	Attempt    int           `json:"attempt"`
	Strategy   string        `json:"strategy,omitempty"`
	Worker     string        `json:"worker,omitempty"`
	Result     AttemptResult `json:"result"`
	Class      string        `json:"class,omitempty"`
	Error      *ErrorInfo    `json:"error,omitempty"`
	DurationMS int64         `json:"duration_ms,omitzero"`
}

// RecoveryCompleted records how a recovery command ended: its Outcome
// (OutcomeRecovered, OutcomeDegraded or OutcomeFailed), the strategy that
// ended it, the number of attempts, and a Detail for people.
type RecoveryCompleted struct {
	CommandID string  `json:"command_id"`
	Kind      string  `json:"kind"`
	Outcome   Outcome `json:"outcome"`
	Strategy  string  `json:"strategy,omitempty"`
	Attempts  int     `json:"attempts,omitzero"`
	Detail    string  `json:"detail,omitempty"`
}

// RecoveryParked records that a command was set aside after its last
// delivery (Deliveries) failed, and why; the session is paused rather than
// left with a gap in its command order.
type RecoveryParked struct {
	CommandID  string `json:"command_id"`
	Kind       string `json:"kind"`
	Reason     string `json:"reason"`
	Deliveries int    `json:"deliveries,omitzero"`
}

// BreakerChanged records a circuit breaker's change of state for a tenant's
// provider: From and To are "closed", "open" or "half_open"; Failures is
// the failure count in the window when it opened; Reason says why.
type BreakerChanged struct {
	Provider string `json:"provider"`
	From     string `json:"from"`
	To       string `json:"to"`
	Failures int    `json:"failures,omitzero"`
	Reason   string `json:"reason,omitempty"`
}

// ContentBlock is one block of a message's content, in the shapes of the
// Anthropic Messages API: "text" (Text), "thinking" (Thinking, Signature),
// "redacted_thinking" (Data), "tool_use" (ID, Name, Input: a JSON object),
// "tool_result" (ToolUseID, IsError, Content: a string or an array of
// blocks), and "image" or "document" (Source). Other types are kept as they
// are.
type ContentBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text,omitempty"`
	Thinking  string          `json:"thinking,omitempty"`
	Signature string          `json:"signature,omitempty"`
	Data      string          `json:"data,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
	ToolUseID string          `json:"tool_use_id,omitempty"`
	IsError   bool            `json:"is_error,omitzero"`
	Content   json.RawMessage `json:"content,omitempty"`
	Source    json.RawMessage `json:"source,omitempty"`
}

// The content block types the projections reason about.
const (
	BlockText       = "text"
	BlockThinking   = "thinking"
	BlockToolUse    = "tool_use"
	BlockToolResult = "tool_result"
)
