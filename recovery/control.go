package recovery

import (
	"github.com/turnstone-dev/turnstone/events"
)

// ControlSubjectPrefix starts the subject of every runtime control request:
// agent.ctl.<tenant>.<session>.
const ControlSubjectPrefix = "agent.ctl"

// ControlSubject is the subject the runtime that owns a session answers
// control requests on.
func ControlSubject(tenant, session string) string {
	return ControlSubjectPrefix + "." + tenant + "." + session
}

// Actions a control request asks of the runtime. A command kind that needs
// the runtime sends its own name; a strategy of a chain sends the action
// it stands for; ActionNotice only informs (a turn was abandoned, a session
// paused or aborted) and expects an "ok".
const (
	ActionRetryTurn      = string(KindRetryTurn)
	ActionSwitchProvider = string(KindSwitchProvider)
	ActionResumeSession  = string(KindResumeSession)
	ActionDistill        = string(KindDistill)
	ActionPivotStrategy  = string(KindPivotStrategy)
	ActionDegrade        = "degrade"
	ActionNotice         = "notice"
)

// ControlRequest is the JSON body of a request on
// agent.ctl.<tenant>.<session> (docs/control.md). CommandID and Attempt
// identify the attempt (a runtime can use them to drop a repeat); Action is
// what to do; Turn the turn concerned; Params the command's parameters;
// Reason and Notice say why, for people; DeadlineMS is how long the caller
// waits for the reply, in milliseconds.
type ControlRequest struct {
	CommandID  string `json:"command_id"`
	Attempt    int    `json:"attempt"`
	Action     string `json:"action"`
	Tenant     string `json:"tenant"`
	Session    string `json:"session"`
	Turn       string `json:"turn,omitempty"`
	Params     Params `json:"params,omitzero"`
	Reason     string `json:"reason,omitempty"`
	Notice     string `json:"notice,omitempty"`
	DeadlineMS int64  `json:"deadline_ms,omitzero"`
}

// Reply outcomes of the control protocol.
const (
	// ReplyOK: the runtime did it.
	ReplyOK = "ok"
	// ReplyFailed: the runtime tried and failed; Error says how (its
	// class decides what comes next).
	ReplyFailed = "failed"
	// ReplyRejected: the runtime will not do it (unknown action, session
	// unknown to it); not retried.
	ReplyRejected = "rejected"
)

// ControlReply is the JSON reply to a ControlRequest: Outcome is ReplyOK,
// ReplyFailed or ReplyRejected; Detail says what happened; Error describes
// a failure (the provider's HTTP status and error type where known);
// Provider is the provider the session uses after the action; Degraded is
// set when the runtime did the action with less than asked (raw output
// instead of a parsed one, a smaller model).
type ControlReply struct {
	Outcome  string            `json:"outcome"`
	Detail   string            `json:"detail,omitempty"`
	Error    *events.ErrorInfo `json:"error,omitempty"`
	Provider string            `json:"provider,omitempty"`
	Degraded bool              `json:"degraded,omitzero"`
}

// PresenceReply is a ControlReply to a presence ping (ActionPing) that
// may also claim turns: Turns names the turns in flight the runtime is
// working on now (at most MaxClaimedTurns are read). Each is a sign of
// life of its turn, which the engine does not abandon while the claim
// lasts (docs/control.md, "Presence"). A runtime names a turn only while
// it works on it: one stuck behind a lock must not be named. A plain
// ControlReply is a PresenceReply that claims nothing.
type PresenceReply struct {
	ControlReply
	Turns []TurnRef `json:"turns,omitempty"`
}

// TurnRef names one turn of one session of the request's tenant.
type TurnRef struct {
	Session string `json:"session"`
	Turn    string `json:"turn"`
}

// MaxClaimedTurns bounds the turns one presence reply may claim; the
// engine reads no more.
const MaxClaimedTurns = 1000
