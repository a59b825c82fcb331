package projections

import "time"

// Status is the session's status in one word, without the time a reader
// reads it at: StatusPaused while paused, else StatusBroken when a
// violation that is not resolved arose since the current history began
// (the session's start or the last distillation; orphans are violations
// too: Counts.ViolationsOpen > 0), else StatusInTurn while a turn is in
// flight, else StatusIdle. View carries StatusAt, which may say
// StatusInterrupted instead of StatusInTurn. Broken comes before in turn: a runtime that died mid-call and was
// prompted again has a turn in flight over a history the model will
// reject, and that is what an operator must see.
func (s *Session) Status() SessionStatus {
	return s.status(false)
}

// StatusAt is Status as a reader at now sees it with the live horizon
// horizon (0 or less: DefaultLiveHorizon): StatusInterrupted instead of
// StatusInTurn for a history session whose last event is older than the
// horizon (see Interrupted). The state is not changed: the status is
// computed, never written to the log.
func (s *Session) StatusAt(now time.Time, horizon time.Duration) SessionStatus {
	return s.status(Interrupted(s.History, len(s.InFlight), lastEvent(s.LastTime, s.LastStored), now, horizon))
}

func (s *Session) status(interrupted bool) SessionStatus {
	switch {
	case s.Paused:
		return StatusPaused
	case s.Totals.Violations-s.HistoryStart.Violations > s.Totals.Resolved-s.HistoryStart.Resolved:
		return StatusBroken
	case interrupted:
		return StatusInterrupted
	case len(s.InFlight) > 0:
		return StatusInTurn
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
// a failed or abandoned turn ever, a command ever parked or completed
// with outcome events.OutcomeFailed (Totals counts them all, whatever the
// lists still keep), or a loop: DefaultLoopLimit or more identical
// assistant outputs (Outputs) or identical errors (Errors.Streak) in a
// row.
func (s *Session) Anomalous() bool {
	t := &s.Totals
	return t.Violations > 0 || t.Orphans > 0 || t.InvalidEvents > 0 || t.Flaky > 0 ||
		t.FailedTurns > 0 || t.AbandonedTurns > 0 || t.ParkedCommands > 0 || t.FailedCommands > 0 ||
		s.Outputs.Count >= DefaultLoopLimit || s.Errors.Streak.Count >= DefaultLoopLimit
}

// HistoryLen is how many messages the current history holds: the ones
// Messages keeps and the older ones it dropped (MessagesDropped).
func (s *Session) HistoryLen() int { return len(s.Messages) + s.MessagesDropped }

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
func (s *Session) Turn(id string) *Turn { return s.turn(tokenKey(id)) }

// ToolCall returns the latest tool call with tool_use id, or nil. The
// pointer is into the state: read it, do not keep it across Apply.
func (s *Session) ToolCall(id string) *ToolCall { return s.toolCall(IDKey(id)) }

// OrphanedToolUseIDs returns the ids of the orphans of the current history
// (declared since the last distillation reset it) that no repair answered,
// in the order they were declared: the tool_use blocks a repair would
// answer. Orphans holds the older and the repaired ones too. The ids are
// keys (IDKey): an id longer than MaxKeyBytes is a digest, its full value
// in the record at the orphan's Seq.
func (s *Session) OrphanedToolUseIDs() []string {
	var ids []string
	for _, o := range s.Orphans[since(s.HistoryStart.Orphans, s.Totals.Orphans, len(s.Orphans)):] {
		if !o.Repaired {
			ids = append(ids, o.ToolUseID)
		}
	}
	return ids
}

// PendingDistillation returns the request for a distillation that has not
// run yet, or nil: the latest distillation that was requested
// (RequestedSeq != 0) and has neither started nor completed, provided no
// distillation started or completed after it (one that ran since answers
// it). A skipped request is still pending: the reconciler defers it and
// runs it once the history is clean (see DistillationDeferred). The
// pointer is into the state: read it, do not keep it across Apply.
func (s *Session) PendingDistillation() *Distillation {
	for i := len(s.Distillations) - 1; i >= 0; i-- {
		d := &s.Distillations[i]
		switch {
		case d.StartedSeq != 0 || d.CompletedSeq != 0:
			return nil
		case d.RequestedSeq != 0:
			return d
		}
	}
	return nil
}

// DistillationDeferred reports whether the pending distillation request
// (PendingDistillation) was skipped: it waits for a clean history.
func (s *Session) DistillationDeferred() bool {
	d := s.PendingDistillation()
	return d != nil && (d.SkippedSeq != 0 || d.Skipped != "")
}

// DirtyReasons returns why a distillation that started now, run by turn
// (the turn that compacts inline; "" for none), would not be clean
// (invariant 3), in the order Distillation.DirtyReasons lists them:
// DirtyTurnInFlight when a turn other than turn is in flight,
// DirtyUnansweredToolUse when the latest assistant message holds a
// tool_use without its tool_result (pending, or orphaned and not
// repaired), then each history Rule broken since the last distillation by
// a violation that is not resolved. It returns nil when the distillation
// would be clean. A runtime or the reconciler asks it before distilling.
func (s *Session) DirtyReasons(turn string) []string {
	var reasons []string
	for _, id := range s.InFlight {
		if id != turn {
			reasons = append(reasons, DirtyTurnInFlight)
			break
		}
	}
	return append(reasons, s.historyReasons()...)
}

// openOrphans counts OrphanedToolUseIDs without building the list.
func (s *Session) openOrphans() int {
	n := 0
	for _, o := range s.Orphans[since(s.HistoryStart.Orphans, s.Totals.Orphans, len(s.Orphans)):] {
		if !o.Repaired {
			n++
		}
	}
	return n
}
