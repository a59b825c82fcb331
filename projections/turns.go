package projections

import (
	"fmt"
	"time"

	"github.com/turnstone-dev/turnstone/events"
)

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
	// AbandonCause is turn.abandoned's cause (events.AbandonDeadline,
	// AbandonEngineRestart, AbandonManual; empty when it named none).
	AbandonCause string `json:"abandon_cause,omitempty"`
	// Prompt is a preview (PreviewRunes runes, 2 × PreviewRunes bytes of
	// JSON) of what started the turn
	// (the whole prompt is in the turn.started at StartedSeq); Trigger is
	// what kind of thing started it.
	Prompt  string `json:"prompt,omitempty"`
	Trigger string `json:"trigger,omitempty"`
	// DeadlineMS is how long the turn may run, in milliseconds (0: no
	// deadline was given).
	DeadlineMS int64 `json:"deadline_ms,omitzero"`
	// StartedSeq and EndedSeq are the sequences of turn.started and of the
	// event that ended the turn (0 while in flight).
	StartedSeq uint64 `json:"started_seq"`
	EndedSeq   uint64 `json:"ended_seq,omitzero"`
	// StartedAt and EndedAt are those events' times.
	StartedAt time.Time `json:"started_at,omitzero"`
	// SeenAt is when the log stored turn.started (Event.Stored, the
	// log's clock): what the turn's deadline counts from. Zero when the
	// event carried no store time.
	SeenAt time.Time `json:"seen_at,omitzero"`
	// ActiveAt is the turn's latest sign of life in the log: the store
	// time of its latest runtime event (RuntimeEvent: one that names the
	// turn, or names no turn while the turn is in flight), from SeenAt on.
	// The reconciler's turn_deadline counts from it (docs/policy.md).
	// Zero when the events carried no store time.
	ActiveAt time.Time `json:"active_at,omitzero"`
	EndedAt  time.Time `json:"ended_at,omitzero"`
	// LastStage is the last stage the turn completed (empty when none).
	LastStage events.Stage `json:"last_stage,omitempty"`
	// Stage is the stage the turn is in while in flight (the one after
	// LastStage: events.Stage.Next), or was in when it failed (the stage
	// that threw) or was abandoned (turn.abandoned's stage). It is
	// finalize once every stage completed, and means nothing for a turn
	// that completed.
	Stage events.Stage `json:"stage,omitempty"`
	// FailedStage and Error are set on a failed turn: the stage that threw
	// and what it threw (its message clipped to DetailRunes, no stack: the
	// whole error is in the event at EndedSeq, the latest one in
	// Session.Errors).
	FailedStage events.Stage      `json:"failed_stage,omitempty"`
	Error       *events.ErrorInfo `json:"error,omitempty"`
	// DurationMS is the turn's wall time in milliseconds: turn.completed's
	// duration_ms when given, else EndedAt - StartedAt.
	DurationMS int64 `json:"duration_ms,omitzero"`
	// FailedAttempts is the implementation budget the turn has spent
	// (invariant 4): the most attempts at one of its steps that failed in
	// a row, with no success of that step between them (see FailedStep: the
	// same tool on the same operand, or one stage). It counts the
	// tool_result blocks with is_error set that answer a tool_use block
	// of the turn (results that pair with their tool_use only; the
	// synthetic results a repair writes do not count, nor does
	// tool_call.completed's is_error) and the error.recorded events that
	// carry the turn while it is in flight; it falls back when the step
	// it counts succeeds, and keeps its value when the turn ends. Failures
	// at different steps do not add up: a long turn with a test run that
	// fails before it passes, a search with no match and a file that was
	// not there has spent nothing lasting. The turn.failed that ends a
	// turn is its outcome, not an attempt. The limit is the reconciler's
	// policy (budget.implementation_attempts).
	FailedAttempts int `json:"failed_attempts,omitzero"`
}

// Ended reports whether the turn has ended (completed, failed or
// abandoned).
func (t *Turn) Ended() bool { return t.Status != TurnInFlight }

// turnStarted opens a turn. A turn that starts while another is in flight
// is tracked beside it (a second message mid-turn), and the tools that
// turn is running stay pending; pending tool_use blocks of turns that have
// ended, or of no turn, are judged.
func (s *Session) turnStarted(ev *events.Event, id string, p *events.TurnStarted) {
	if t := s.turn(id); t != nil {
		s.violate(ev, RuleTurnDuplicateStart, fmt.Sprintf("turn %s started again (first at seq %d)", id, t.StartedSeq), "", id)
		return
	}
	if s.Paused {
		s.violate(ev, RuleTurnWhilePaused, fmt.Sprintf("turn %s started while the session is paused (%s)", id, s.PauseReason), "", id)
	}
	s.judgeStale(ev, "a new turn started")
	s.Totals.Turns++
	if len(s.InFlight) >= MaxInFlightTurns {
		s.violate(ev, RuleTooManyTurns, fmt.Sprintf("turn %s started while %d turns are in flight (%s first); it is not tracked", id, len(s.InFlight), s.InFlight[0]), "", id)
		return
	}
	s.Turns = append(s.Turns, Turn{
		ID:         id,
		Index:      s.Totals.Turns,
		Status:     TurnInFlight,
		Stage:      events.StageContext,
		Prompt:     clip(p.Prompt, PreviewRunes, 2*PreviewRunes),
		Trigger:    IDKey(p.Trigger),
		DeadlineMS: p.DeadlineMS,
		StartedSeq: ev.Seq,
		StartedAt:  ev.Time.Round(0),
		SeenAt:     ev.Stored.Round(0),
		ActiveAt:   ev.Stored.Round(0),
	})
	if s.idx != nil {
		s.idx.turns[id] = len(s.Turns) - 1
	}
	s.InFlight = append(s.InFlight, id)
}

// turnEvent returns the in-flight turn a turn event names, or records why
// there is none (turn_unknown, turn_already_ended) and returns nil.
func (s *Session) turnEvent(ev *events.Event, id string) *Turn {
	if id == "" {
		s.invalid(ev, string(ev.Type)+" without a turn id")
		return nil
	}
	t := s.turn(id)
	if t == nil {
		s.violate(ev, RuleTurnUnknown, fmt.Sprintf("%s for turn %s, which never started", ev.Type, id), "", id)
		return nil
	}
	if t.Ended() {
		s.violate(ev, RuleTurnAlreadyEnded, fmt.Sprintf("%s for turn %s, which already ended (%s at seq %d)", ev.Type, id, t.Status, t.EndedSeq), "", id)
		return nil
	}
	return t
}

// endTurn ends an in-flight turn and judges the pending tool_use blocks of
// that turn: the user message that had to answer them is complete. The
// history's latest message, when it is an assistant message of the turn
// (or of no turn), is complete too: it counts in the output streak.
func (s *Session) endTurn(ev *events.Event, t *Turn, status TurnStatus, reason string, durationMS int64) {
	t.Status, t.Reason = status, detail(reason)
	switch status {
	case TurnFailed:
		s.Totals.FailedTurns++
	case TurnAbandoned:
		s.Totals.AbandonedTurns++
	}
	t.EndedSeq, t.EndedAt = ev.Seq, ev.Time.Round(0)
	t.DurationMS = durationMS
	if t.DurationMS == 0 && !t.StartedAt.IsZero() && !t.EndedAt.IsZero() && t.EndedAt.After(t.StartedAt) {
		t.DurationMS = t.EndedAt.Sub(t.StartedAt).Milliseconds()
	}
	id := t.ID
	for i, f := range s.InFlight {
		if f == id {
			s.InFlight = append(s.InFlight[:i:i], s.InFlight[i+1:]...)
			break
		}
	}
	s.endSteps(t)
	if len(s.Pending) > 0 { // the reason is built only when a tool_use may be judged
		s.judge(ev, id, fmt.Sprintf("turn %s %s", id, status))
	}
	s.completeOutput(func(m *Message) bool { return m.Turn == id || m.Turn == "" })
}

// signOfLife moves the ActiveAt of the turn in flight that turn names to
// at, or of every turn in flight when turn is empty (an event of the
// session, not of one turn).
func (s *Session) signOfLife(turn string, at time.Time) {
	if turn != "" {
		if t := s.turn(tokenKey(turn)); t != nil && !t.Ended() && at.After(t.ActiveAt) {
			t.ActiveAt = at
		}
		return
	}
	for _, id := range s.InFlight {
		if t := s.turn(id); t != nil && at.After(t.ActiveAt) {
			t.ActiveAt = at
		}
	}
}

// PendingToolCalls returns the tool calls of turn that await their
// tool_result (pointers into the state: read them, do not keep them
// across Apply).
func (s *Session) PendingToolCalls(turn string) []*ToolCall {
	var out []*ToolCall
	for _, id := range s.Pending {
		if tc := s.toolCall(id); tc != nil && tc.Status == ToolPending && tc.Turn == turn {
			out = append(out, tc)
		}
	}
	return out
}
