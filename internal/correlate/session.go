package correlate

import (
	"slices"
	"strconv"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// FromSession derives a session's signals and recovery outcomes from its
// projected state. The state is bounded (docs/limits.md), so these are
// what it keeps:
//
//   - each failed turn it keeps: an error signal (its error, classified by
//     recovery.Classify) at the turn.failed, at the turn's end time;
//   - the latest error.recorded (Errors.Last), unless a failed turn of
//     the same turn already gave a signal of the same key: at the time of
//     its turn's start when the state keeps the turn, else at the
//     session's last event time (the state keeps no time for it);
//   - each abandoned turn it keeps: an anomaly turn_abandoned, with its
//     cause (Turn.AbandonCause);
//   - each violation it keeps (the latest projections.KeepAnomalies): an
//     anomaly of its rule, at its time, naming the tool of its tool_use;
//     except the tool_use_without_result violations a failed or
//     abandoned turn declared (at its turn.failed or turn.abandoned: a
//     crash's abandon and its orphans): one cause, one signal, they are
//     counted in that turn's Signal.Orphans;
//   - each flaky-suspected tool run it keeps: an anomaly flaky_tool, at
//     its turn's start time (skipped when the state no longer keeps the
//     turn);
//   - a loop in progress (projections.DefaultLoopLimit or more identical
//     assistant outputs, or identical errors, in a row): an anomaly loop,
//     at the start time of the turn of the run's first message when the
//     state keeps it, else at the session's last event time;
//   - each recovery command it keeps that failed or was parked: an anomaly
//     recovery_failed or recovery_parked, its code the command's kind, at
//     the session's last event time (the state keeps no time for it);
//     unless another signal of the session came before the command: the
//     command answered that signal, and its failure is the outcome of
//     that signal's incident (a 401's retry that pauses the session for
//     a person is one incident, authentication), not an incident of its
//     own.
//
// An error of kind logic that names no provider, code or status, and
// whose message says nothing recovery.Classify recognises, is the
// runtime's own failure: class ClassLogic, with no provider.
//
// Outcomes are its recovery commands (the latest projections.KeepCommands
// done ones and the open ones).
func FromSession(s *projections.Session) ([]Signal, []Outcome) {
	var sigs []Signal
	base := Signal{Tenant: s.Tenant, Session: s.Session, Provider: s.Provider, Model: s.Model, Runtime: s.Runtime}
	turnTime := func(id string) time.Time {
		if t := s.Turn(id); t != nil {
			return t.StartedAt
		}
		return time.Time{}
	}
	failed := map[string]Key{} // turn -> key of its turn.failed signal
	ended := map[string]int{}  // turn -> index of the signal of its turn.failed or turn.abandoned
	for i := range s.Turns {
		t := &s.Turns[i]
		switch {
		case t.Status == projections.TurnFailed && t.Error != nil:
			sig := errorSignal(base, *t.Error)
			sig.Seq, sig.Time, sig.Turn, sig.Stage = t.EndedSeq, firstSet(t.EndedAt, t.StartedAt), t.ID, string(t.FailedStage)
			failed[t.ID] = KeyOf(sig)
			ended[t.ID] = len(sigs)
			sigs = append(sigs, sig)
		case t.Status == projections.TurnAbandoned:
			sig := base
			sig.Kind, sig.Class, sig.Detail, sig.Cause = KindAnomaly, ClassTurnAbandoned, t.Reason, t.AbandonCause
			sig.Seq, sig.Time, sig.Turn, sig.Stage = t.EndedSeq, firstSet(t.EndedAt, t.StartedAt), t.ID, string(t.LastStage)
			ended[t.ID] = len(sigs)
			sigs = append(sigs, sig)
		}
	}
	if last := s.Errors.Last; last != nil {
		sig := errorSignal(base, last.Error)
		sig.Seq, sig.Turn, sig.Stage = last.Seq, last.Turn, string(last.Stage)
		sig.Time = firstSet(turnTime(last.Turn), s.LastTime)
		if k, ok := failed[last.Turn]; !ok || last.Turn == "" || k != KeyOf(sig) {
			sigs = append(sigs, sig)
		}
	}
	for i := range s.Violations {
		v := &s.Violations[i]
		if j, ok := ended[v.Turn]; ok && v.Rule == projections.RuleToolUseWithoutResult && v.Seq == sigs[j].Seq {
			sigs[j].Orphans++ // declared by the turn's end: its consequence
			continue
		}
		sig := base
		sig.Kind, sig.Class, sig.Detail = KindAnomaly, string(v.Rule), v.Detail
		sig.Seq, sig.Turn, sig.Time = v.Seq, v.Turn, firstSet(v.Time, turnTime(v.Turn), s.LastTime)
		sig.Tool = toolName(s, v.ToolUseID)
		sigs = append(sigs, sig)
	}
	for i := range s.Flaky {
		f := &s.Flaky[i]
		at := turnTime(f.Turn)
		if at.IsZero() {
			continue
		}
		sig := base
		sig.Kind, sig.Class, sig.Tool, sig.Turn = KindAnomaly, ClassFlakyTool, f.Tool, f.Turn
		sig.Seq, sig.Time, sig.Detail = f.PassSeq, at, "tool "+f.Tool+" failed at seq "+itoa(f.FailSeq)+" and passed on an identical re-run at seq "+itoa(f.PassSeq)
		sigs = append(sigs, sig)
	}
	if loop := loopSignal(s, base); loop != nil {
		sigs = append(sigs, *loop)
	}
	// The earliest signal so far: a command that came after it answered
	// it.
	var earliest uint64
	for _, sig := range sigs {
		if sig.Seq != 0 && (earliest == 0 || sig.Seq < earliest) {
			earliest = sig.Seq
		}
	}
	outs := make([]Outcome, 0, len(s.Commands))
	for i := range s.Commands {
		c := &s.Commands[i]
		answered := earliest != 0 && earliest < c.FirstSeq
		if (c.Parked || c.Outcome == events.OutcomeFailed) && !answered {
			sig := base
			sig.Kind, sig.Class, sig.Code, sig.Seq, sig.Time = KindAnomaly, ClassRecoveryFailed, c.Kind, c.FirstSeq, s.LastTime
			sig.Detail = c.Kind + " failed after " + strconv.Itoa(c.Attempts) + " attempt(s)"
			if c.Parked {
				sig.Class, sig.Detail = ClassRecoveryParked, c.Kind+" parked: "+c.ParkReason
			} else if c.LastError != "" {
				sig.Detail += ": " + c.LastError
			}
			sigs = append(sigs, sig)
		}
		outs = append(outs, Outcome{Tenant: s.Tenant, Session: s.Session, CommandID: c.ID, Kind: c.Kind, Strategy: c.Strategy,
			Seq: c.FirstSeq, Attempts: c.Attempts, Outcome: c.Result()})
	}
	return sigs, outs
}

// loopSignal is the session's loop in progress, or nil.
func loopSignal(s *projections.Session, base Signal) *Signal {
	var seq uint64
	var detail string
	switch {
	case s.Outputs.Count >= projections.DefaultLoopLimit && len(s.Outputs.Seqs) > 0:
		seq, detail = s.Outputs.Seqs[0], "the same assistant output "+strconv.Itoa(s.Outputs.Count)+" times in a row"
	case s.Errors.Streak.Count >= projections.DefaultLoopLimit:
		seq, detail = s.Errors.Streak.FirstSeq, "the same error "+strconv.Itoa(s.Errors.Streak.Count)+" times in a row"
	default:
		return nil
	}
	at := s.LastTime
	for _, m := range s.Messages {
		if slices.Contains(m.Seqs, seq) {
			if t := s.Turn(m.Turn); t != nil && !t.StartedAt.IsZero() {
				at = t.StartedAt
			}
		}
	}
	sig := base
	sig.Kind, sig.Class, sig.Seq, sig.Time, sig.Detail = KindAnomaly, ClassLoop, seq, at, detail
	return &sig
}

// errorSignal is base with the error's fields: its class, code, status,
// its own provider when it names one, and its message as the detail.
func errorSignal(base Signal, e events.ErrorInfo) Signal {
	sig := base
	sig.Kind, sig.Class = KindError, string(recovery.Classify(e))
	sig.Code, sig.Status, sig.Detail = e.Code, e.HTTPStatus, e.Message
	if e.Provider != "" {
		sig.Provider = e.Provider
	}
	if e.Kind == events.KindLogic && e.Provider == "" && e.Code == "" && e.HTTPStatus == 0 &&
		(sig.Class == string(recovery.ClassInvalidRequest) || sig.Class == string(recovery.ClassUnknown)) {
		sig.Class, sig.Provider = ClassLogic, ""
	}
	return sig
}

// toolName is the tool name of a tool_use id, from the orphans or the
// tool calls the state keeps ("" when it keeps neither).
func toolName(s *projections.Session, id string) string {
	if id == "" {
		return ""
	}
	for i := len(s.Orphans) - 1; i >= 0; i-- {
		if s.Orphans[i].ToolUseID == id {
			return s.Orphans[i].Name
		}
	}
	if tc := s.ToolCall(id); tc != nil {
		return tc.Name
	}
	return ""
}

func firstSet(ts ...time.Time) time.Time {
	for _, t := range ts {
		if !t.IsZero() {
			return t
		}
	}
	return time.Time{}
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }
