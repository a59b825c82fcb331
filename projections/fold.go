package projections

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/turnstone-dev/turnstone/events"
)

// Fold is FoldLog, under the name it had before rewinds: it folds a
// session's events, in stream order, into a new Session and returns it.
func Fold(evs []events.Event) *Session { return FoldLog(evs) }

// Apply folds one event into the state and returns the violations it gave
// rise to (nil for none), in the order they arose; orphans show as
// tool_use_without_result violations naming the tool_use, invalid events
// as invalid_event ones. The returned slice shares the state's memory:
// read it before the next Apply and do not change it. A caller that replays
// a session event by event (`engine replay`) flags each returned violation
// at ev.
//
// Apply never panics and never stops: an event whose Err is set, whose
// payload does not decode, that lacks what the fold needs (a turn id on a
// turn event, a message role) or that belongs to another session becomes
// an InvalidEvent and an invalid_event violation; an event of an unknown
// type is counted in UnknownTypes. Either way the fold goes on.
//
// An event whose Seq is not above LastSeq (already folded: a redelivery,
// or a tail that overlaps a snapshot) is ignored; events with Seq 0 are
// always folded. Apply uses no clock: times come from the events.
//
// A session.rewound that undoes events the state holds sets NeedsRefold:
// call Refold or RefoldLog before the next Apply (see rewind.go).
func (s *Session) Apply(ev events.Event) []Violation {
	if ev.Seq != 0 && ev.Seq <= s.LastSeq {
		return nil
	}
	before := s.Totals.Violations
	s.Version = Version
	s.track(ev)
	s.apply(ev)
	s.trim()
	n := s.Totals.Violations - before
	if n == 0 {
		return nil
	}
	if n > len(s.Violations) {
		n = len(s.Violations)
	}
	v := s.Violations[len(s.Violations)-n:]
	return v[:n:n]
}

// track updates the identity, counters and positions every event moves.
func (s *Session) track(ev events.Event) {
	s.Events++
	if s.FirstSeq == 0 {
		s.FirstSeq = ev.Seq
	}
	if !ev.Time.IsZero() {
		t := ev.Time.Round(0)
		if s.FirstTime.IsZero() || t.Before(s.FirstTime) {
			s.FirstTime = t
		}
		if t.After(s.LastTime) {
			s.LastTime = t
		}
	}
	if s.Tenant == "" && s.Session == "" {
		s.Tenant, s.Session = ev.Tenant, ev.Session
	}
}

// apply dispatches ev to its type's rule. s.LastSeq still holds the
// sequence of the previous event while it runs.
func (s *Session) apply(ev events.Event) {
	defer func() {
		if ev.Seq != 0 {
			s.LastSeq = ev.Seq
		}
	}()
	if ev.Err != nil {
		s.invalid(ev, ev.Err.Error())
		return
	}
	if ev.Tenant != s.Tenant || ev.Session != s.Session {
		s.invalid(ev, fmt.Sprintf("event of session %s/%s folded into %s/%s", ev.Tenant, ev.Session, s.Tenant, s.Session))
		return
	}
	p, err := ev.Payload()
	if errors.Is(err, events.ErrUnknownType) {
		s.unknown(ev)
		return
	}
	if err != nil {
		s.invalid(ev, err.Error())
		return
	}
	turn := validKey(ev.Turn)
	switch p := p.(type) {
	case *events.SessionStarted:
		s.sessionStarted(p)
	case *events.SessionPaused:
		s.Paused, s.PauseReason, s.PausedSeq = true, p.Reason, ev.Seq
	case *events.SessionResumed:
		s.Paused, s.PauseReason, s.PausedSeq = false, "", 0
	case *events.TurnStarted:
		if turn == "" {
			s.invalid(ev, "turn.started without a turn id")
			return
		}
		s.turnStarted(ev, turn, p)
	case *events.TurnStageCompleted:
		if t := s.turnEvent(ev, turn); t != nil {
			t.LastStage = p.Stage
		}
	case *events.TurnCompleted:
		if t := s.turnEvent(ev, turn); t != nil {
			reason := p.Reason
			if reason == "" {
				reason = "end_turn"
			}
			s.endTurn(ev, t, TurnCompleted, reason, p.DurationMS)
			s.Errors.Streak = Streak{}
		}
	case *events.TurnFailed:
		if t := s.turnEvent(ev, turn); t != nil {
			info := shortError(p.Error)
			t.FailedStage, t.Error = p.Stage, &info
			s.endTurn(ev, t, TurnFailed, "", 0)
			s.recordError(ev, turn, p.Stage, p.Error, 0)
		}
	case *events.TurnAbandoned:
		if t := s.turnEvent(ev, turn); t != nil {
			if p.LastStage != "" {
				t.LastStage = p.LastStage
			}
			s.endTurn(ev, t, TurnAbandoned, p.Reason, 0)
		}
	case *events.MessageAppended:
		if p.Role != events.RoleUser && p.Role != events.RoleAssistant {
			s.invalid(ev, fmt.Sprintf("message role %q is neither user nor assistant", p.Role))
			return
		}
		s.appendMessage(ev, turn, p)
	case *events.ToolCallStarted:
		if tc := s.toolCallEvent(ev, turn, p.ToolUseID, p.Name); tc != nil && tc.StartedSeq == 0 {
			tc.StartedSeq = ev.Seq
		}
	case *events.ToolCallCompleted:
		if tc := s.toolCallEvent(ev, turn, p.ToolUseID, p.Name); tc != nil {
			tc.CompletedSeq, tc.DurationMS = ev.Seq, p.DurationMS
			tc.IsError = tc.IsError || p.IsError
		}
	case *events.ErrorRecorded:
		s.recordError(ev, turn, p.Stage, p.ErrorInfo, p.Consecutive)
		if t := s.turn(turn); t != nil {
			t.FailedAttempts++
		}
	case *events.DistillationRequested:
		s.distillationRequested(ev, turn, p)
	case *events.DistillationStarted:
		s.distillationStarted(ev, turn, p)
	case *events.DistillationCompleted:
		s.distillationCompleted(ev, turn, p)
	case *events.DistillationSkipped:
		d := s.openDistillation(turn, anyDistillation)
		d.SkippedSeq, d.Skipped = ev.Seq, p.Reason
	case *events.SnapshotTaken:
		s.LastSnapshotSeq = p.CoversSeq
	case *events.SessionRewound:
		s.sessionRewound(ev, p)
	case *events.SessionForked:
		s.sessionForked(ev, p)
	case *events.RecoveryAttempted:
		s.recoveryAttempted(ev, p)
	case *events.RecoveryCompleted:
		s.recoveryCompleted(ev, p)
	case *events.RecoveryParked:
		s.recoveryParked(ev, p)
	case *events.BreakerChanged:
		s.breakerChanged(ev, p)
	default:
		s.invalid(ev, fmt.Sprintf("no rule for %s events", ev.Type))
	}
}

// invalid records an event that cannot be folded.
func (s *Session) invalid(ev events.Event, why string) {
	why = preview(why, 500)
	s.InvalidEvents = append(s.InvalidEvents, InvalidEvent{Seq: ev.Seq, ID: ev.ID, Type: ev.Type, Error: why})
	s.Totals.InvalidEvents++
	s.violate(ev, RuleInvalidEvent, why, "", "")
}

// unknown counts an event of a type this version does not know.
func (s *Session) unknown(ev events.Event) {
	for i := range s.UnknownTypes {
		if s.UnknownTypes[i].Type == ev.Type {
			s.UnknownTypes[i].Count++
			return
		}
	}
	s.UnknownTypes = append(s.UnknownTypes, UnknownType{Type: ev.Type, Count: 1, FirstSeq: ev.Seq})
}

// violate records a violation at ev.
func (s *Session) violate(ev events.Event, rule Rule, detail, toolUseID, turn string) {
	s.Violations = append(s.Violations, Violation{Seq: ev.Seq, Rule: rule, Detail: detail, ToolUseID: toolUseID, Turn: turn, Time: ev.Time.Round(0)})
	s.Totals.Violations++
}

// turnStarted opens a turn. A turn that starts while another is in flight
// is tracked beside it (a second message mid-turn), and the tools that
// turn is running stay pending; pending tool_use blocks of turns that have
// ended, or of no turn, are judged.
func (s *Session) turnStarted(ev events.Event, id string, p *events.TurnStarted) {
	if t := s.turn(id); t != nil {
		s.violate(ev, RuleTurnDuplicateStart, fmt.Sprintf("turn %s started again (first at seq %d)", id, t.StartedSeq), "", id)
		return
	}
	if s.Paused {
		s.violate(ev, RuleTurnWhilePaused, fmt.Sprintf("turn %s started while the session is paused (%s)", id, s.PauseReason), "", id)
	}
	s.judgeStale(ev, "a new turn started")
	s.Totals.Turns++
	s.Turns = append(s.Turns, Turn{
		ID:         id,
		Index:      s.Totals.Turns,
		Status:     TurnInFlight,
		Prompt:     preview(p.Prompt, PreviewRunes),
		Trigger:    p.Trigger,
		DeadlineMS: p.DeadlineMS,
		StartedSeq: ev.Seq,
		StartedAt:  ev.Time.Round(0),
	})
	s.index().turns[id] = len(s.Turns) - 1
	s.InFlight = append(s.InFlight, id)
}

// turnEvent returns the in-flight turn a turn event names, or records why
// there is none (turn_unknown, turn_already_ended) and returns nil.
func (s *Session) turnEvent(ev events.Event, id string) *Turn {
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
func (s *Session) endTurn(ev events.Event, t *Turn, status TurnStatus, reason string, durationMS int64) {
	t.Status, t.Reason = status, reason
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
	s.judge(ev, id, fmt.Sprintf("turn %s %s", id, status))
	s.completeOutput(func(m *Message) bool { return m.Turn == id || m.Turn == "" })
}

// recordError counts an error and moves the streak.
func (s *Session) recordError(ev events.Event, turn string, stage events.Stage, info events.ErrorInfo, consecutive int) {
	s.Errors.Total++
	s.Errors.Last = &ErrorRecord{Error: shortError(info), Seq: ev.Seq, Turn: turn, Stage: stage, Consecutive: consecutive}
	key := ErrorKey(info)
	if s.Errors.Streak.Key == key && s.Errors.Streak.Count > 0 {
		s.Errors.Streak.Count++
		return
	}
	s.Errors.Streak = Streak{Key: key, Count: 1, FirstSeq: ev.Seq}
}

// ErrorKey returns the key that makes two errors "the same error" for a
// Streak: "kind|code|http_status|hash", the hash being the first 8 bytes
// (hex) of the SHA-256 of the message normalized: lower case, every run of
// digits folded to one '#', runs of white space collapsed to one space,
// trimmed. Normalizing keeps ids, counts and timestamps in messages from
// hiding a loop.
func ErrorKey(e events.ErrorInfo) string {
	sum := sha256.Sum256([]byte(normalizeMessage(e.Message)))
	return fmt.Sprintf("%s|%s|%d|%s", e.Kind, e.Code, e.HTTPStatus, hex.EncodeToString(sum[:8]))
}

func normalizeMessage(m string) string {
	var b strings.Builder
	b.Grow(len(m))
	prev := ' ' // so that leading space is trimmed
	for _, r := range m {
		switch {
		case unicode.IsDigit(r):
			r = '#'
		case unicode.IsSpace(r):
			r = ' '
		default:
			r = unicode.ToLower(r)
		}
		if (r == '#' || r == ' ') && r == prev {
			continue
		}
		b.WriteRune(r)
		prev = r
	}
	return strings.TrimRight(b.String(), " ")
}

// shortError returns e with its message and stack shortened for the state
// (the full error stays in the log).
func shortError(e events.ErrorInfo) events.ErrorInfo {
	e.Message = preview(e.Message, 500)
	e.Stack = preview(e.Stack, 1000)
	return e
}

// trim drops the oldest entries of the lists over their Keep bound. It
// runs only when a list is a quarter over its bound, so that its cost is
// spread over many events; the result depends only on the state, so a
// restored state trims exactly like the original.
func (s *Session) trim() {
	var n int
	if s.Turns, n = trimFront(s.Turns, KeepTurns, func(t *Turn) bool { return t.Ended() }); n > 0 {
		s.idx = nil
	}
	if s.ToolCalls, n = trimFront(s.ToolCalls, KeepToolCalls, func(tc *ToolCall) bool { return tc.Status != ToolPending }); n > 0 {
		s.idx = nil
	}
	all := func(*Violation) bool { return true }
	s.Violations, _ = trimFront(s.Violations, KeepAnomalies, all)
	s.Orphans, _ = trimFront(s.Orphans, KeepAnomalies, func(*Orphan) bool { return true })
	s.UnmatchedResults, _ = trimFront(s.UnmatchedResults, KeepAnomalies, func(*UnmatchedResult) bool { return true })
	s.InvalidEvents, _ = trimFront(s.InvalidEvents, KeepAnomalies, func(*InvalidEvent) bool { return true })
	s.Flaky, _ = trimFront(s.Flaky, KeepAnomalies, func(*Flaky) bool { return true })
	s.Distillations, _ = trimFront(s.Distillations, KeepDistillations, func(d *Distillation) bool { return !d.open() })
	if s.Commands, n = trimFront(s.Commands, KeepCommands, func(c *CommandRecord) bool { return c.Done() }); n > 0 {
		s.idx = nil
	}
	s.Rewinds, _ = trimFront(s.Rewinds, KeepRewinds, func(*Rewind) bool { return true })
	s.Forks, _ = trimFront(s.Forks, KeepRewinds, func(*Fork) bool { return true })
}

// trimFront returns xs without its oldest removable entries once xs is a
// quarter over keep, down to keep entries (fewer are dropped when too few
// are removable), in a new slice; and how many it dropped.
func trimFront[T any](xs []T, keep int, removable func(*T) bool) ([]T, int) {
	if len(xs) <= keep+keep/4 {
		return xs, 0
	}
	drop := len(xs) - keep
	out := make([]T, 0, keep+keep/4+1)
	dropped := 0
	for i := range xs {
		if dropped < drop && removable(&xs[i]) {
			dropped++
			continue
		}
		out = append(out, xs[i])
	}
	return out, dropped
}

// preview returns the first n runes of s, with invalid UTF-8 replaced, and
// "…" when it cut.
func preview(s string, n int) string {
	s = validKey(s)
	i := 0
	for j := range s {
		if i == n {
			return s[:j] + "…"
		}
		i++
	}
	return s
}

// validKey returns s with every byte of invalid UTF-8 replaced by U+FFFD,
// exactly as encoding/json does, so that ids compare the same before and
// after a JSON round trip.
func validKey(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}
