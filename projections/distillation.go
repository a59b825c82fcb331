package projections

import (
	"fmt"
	"strings"

	"github.com/turnstone-dev/turnstone/events"
)

// Distillation is one distillation (compaction) of the history, from its
// request to its end.
type Distillation struct {
	// RequestedSeq, StartedSeq, CompletedSeq and SkippedSeq are the
	// sequences of its events (0 when not seen).
	RequestedSeq uint64 `json:"requested_seq,omitzero"`
	StartedSeq   uint64 `json:"started_seq,omitzero"`
	CompletedSeq uint64 `json:"completed_seq,omitzero"`
	SkippedSeq   uint64 `json:"skipped_seq,omitzero"`
	// RequestReason is why it was requested ("auto: context 92% full").
	RequestReason string `json:"request_reason,omitempty"`
	// Skipped is why it did not run ("turn_in_flight"), when it did not.
	Skipped string `json:"skipped,omitempty"`
	// FromSeq..ToSeq (inclusive) are the events it covers: the event's
	// own range, or else from the previous distillation's end + 1 (or the
	// session's first sequence) to the sequence before it.
	FromSeq uint64 `json:"from_seq,omitzero"`
	ToSeq   uint64 `json:"to_seq,omitzero"`
	// TokensBefore and TokensAfter are the history's size in tokens.
	TokensBefore int64 `json:"tokens_before,omitzero"`
	TokensAfter  int64 `json:"tokens_after,omitzero"`
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

// HistoryMark is where the current message history began: at the
// session's start, or at the last distillation.completed, which empties
// the history.
type HistoryMark struct {
	// Seq is the sequence of the distillation.completed that reset the
	// history; 0 at the session's start.
	Seq uint64 `json:"seq"`
	// Violations, Orphans, Resolved and ToolCalls are Totals.Violations,
	// Totals.Orphans, Totals.Resolved and Totals.ToolCalls at that point:
	// the entries made after them belong to the current history.
	Violations int `json:"violations"`
	Orphans    int `json:"orphans"`
	Resolved   int `json:"resolved,omitzero"`
	ToolCalls  int `json:"tool_calls,omitzero"`
}

// The reason DirtyReasons lists when the history's tail holds a tool_use
// without result; the other reasons are the history Rules broken since the
// last distillation.
const DirtyUnansweredToolUse = "unanswered_tool_use"

// The reason Distillation.DirtyReasons lists when a turn other than the
// distillation's own was in flight.
const DirtyTurnInFlight = "turn_in_flight"

// distillationRequested records a request; a request while an earlier one
// has not started yet is the same request.
func (s *Session) distillationRequested(ev *events.Event, turn string, p *events.DistillationRequested) {
	d := s.openDistillation(turn, notStarted)
	if d.RequestedSeq == 0 {
		d.RequestedSeq, d.RequestReason = ev.Seq, detail(p.Reason)
	}
}

// distillationStarted records a start and checks invariant 3. The user
// message after the latest assistant message is complete: pending
// tool_use blocks are judged first, so they show as unanswered.
func (s *Session) distillationStarted(ev *events.Event, turn string, p *events.DistillationStarted) {
	d := s.openDistillation(turn, notStarted)
	d.StartedSeq = ev.Seq
	if turn != "" {
		d.Turn = turn
	}
	s.cover(d, p.FromSeq, p.ToSeq)
	s.judge(ev, "", "a distillation started")
	s.completeOutput(nil)
	s.checkDistillation(ev, d)
}

// distillationCompleted records the end of a distillation, checks
// invariant 3 if no start was seen, and resets the history (and the output
// streak, which compared its messages): the runtime appends the summary as
// the next message.
func (s *Session) distillationCompleted(ev *events.Event, turn string, p *events.DistillationCompleted) {
	d := s.openDistillation(turn, anyDistillation)
	started := d.StartedSeq != 0
	d.CompletedSeq = ev.Seq
	if d.Turn == "" {
		d.Turn = turn
	}
	d.TokensBefore, d.TokensAfter, d.Trigger = p.TokensBefore, p.TokensAfter, IDKey(p.Trigger)
	s.cover(d, p.FromSeq, p.ToSeq)
	s.judge(ev, "", "a distillation completed")
	if !started {
		s.checkDistillation(ev, d)
	}
	s.Messages, s.MessagesDropped, s.Pending, s.ToolCalls, s.idx = nil, 0, nil, nil, nil
	s.HistoryBroken = nil
	s.Outputs = OutputStreak{}
	s.HistoryStart = HistoryMark{Seq: ev.Seq, Violations: s.Totals.Violations, Orphans: s.Totals.Orphans, Resolved: s.Totals.Resolved, ToolCalls: s.Totals.ToolCalls}
}

func notStarted(d *Distillation) bool      { return d.StartedSeq == 0 }
func anyDistillation(d *Distillation) bool { return true }

// openDistillation returns the latest distillation if it is open and
// match accepts it, else a new one for turn.
func (s *Session) openDistillation(turn string, match func(*Distillation) bool) *Distillation {
	if n := len(s.Distillations); n > 0 {
		if d := &s.Distillations[n-1]; d.open() && match(d) {
			return d
		}
	}
	s.Distillations = append(s.Distillations, Distillation{Turn: turn})
	s.Totals.Distillations++
	return &s.Distillations[len(s.Distillations)-1]
}

// cover sets the range of events d covers: from and to when the event gave
// them; else, where d has none yet, from the previous distillation's end + 1
// (or the session's first sequence) to the sequence before this event.
func (s *Session) cover(d *Distillation, from, to uint64) {
	if from != 0 {
		d.FromSeq = from
	}
	if to != 0 {
		d.ToSeq = to
	}
	if d.FromSeq == 0 {
		d.FromSeq = s.FirstSeq
		for i := len(s.Distillations) - 1; i >= 0; i-- {
			if p := &s.Distillations[i]; p != d && p.CompletedSeq != 0 && p.ToSeq != 0 {
				d.FromSeq = p.ToSeq + 1
				break
			}
		}
	}
	if d.ToSeq == 0 {
		d.ToSeq = s.LastSeq
	}
}

// checkDistillation applies invariant 3 at the start of d (or at its
// completion when no start was seen): no turn other than d's own in
// flight, and a clean history.
func (s *Session) checkDistillation(ev *events.Event, d *Distillation) {
	d.Clean, d.DirtyReasons = true, nil
	for _, id := range s.InFlight {
		if id == d.Turn {
			continue
		}
		if d.Clean {
			d.DirtyReasons = append(d.DirtyReasons, DirtyTurnInFlight)
		}
		d.Clean = false
		s.violate(ev, RuleDistillationDuringTurn, fmt.Sprintf("distillation started while turn %s is in flight", id), "", id)
	}

	reasons := s.historyReasons()
	if len(reasons) == 0 {
		return
	}
	d.Clean = false
	d.DirtyReasons = append(d.DirtyReasons, reasons...)
	s.violate(ev, RuleDistillationDirtyHistory, "distillation over a dirty history: "+strings.Join(reasons, ", "), "", d.Turn)
}

// historyReasons returns the history's part of DirtyReasons.
func (s *Session) historyReasons() []string {
	var reasons []string
	if s.tailUnanswered() {
		reasons = append(reasons, DirtyUnansweredToolUse)
	}
	for _, r := range historyRules {
		if s.HistoryBroken[r] > 0 {
			reasons = append(reasons, string(r))
		}
	}
	return reasons
}

// tailUnanswered reports whether the latest assistant message holds a
// tracked tool_use without its tool_result (pending or orphaned, not
// repaired). The state keeps every tool call of that message (up to
// MaxToolUsesPerMessage), whatever its blocks' digests keep.
func (s *Session) tailUnanswered() bool {
	m := s.lastAssistant()
	if m == nil {
		return false
	}
	for i := len(s.ToolCalls) - 1; i >= 0; i-- {
		tc := &s.ToolCalls[i]
		if tc.Message == m.Index && tc.Status != ToolAnswered && tc.Status != ToolRepaired {
			return true
		}
	}
	return false
}
