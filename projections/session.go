package projections

import (
	"encoding/json"
	"errors"
	"fmt"
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
//
// Version 4: the stage a turn is in (Turn.Stage), from turn.abandoned's
// stage; typed recovery outcomes.
const Version = 4

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

// Clone returns a deep copy of the state, made through its JSON form (which
// holds everything the fold needs; see Session).
func (s *Session) Clone() *Session {
	b, err := json.Marshal(s)
	if err != nil {
		return &Session{}
	}
	c := &Session{}
	if err := json.Unmarshal(b, c); err != nil {
		return &Session{}
	}
	return c
}

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
			t.LastStage, t.Stage = p.Stage, p.Stage.Next()
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
			t.FailedStage, t.Error, t.Stage = p.Stage, &info, p.Stage
			s.endTurn(ev, t, TurnFailed, "", 0)
			s.recordError(ev, turn, p.Stage, p.Error, 0)
		}
	case *events.TurnAbandoned:
		if t := s.turnEvent(ev, turn); t != nil {
			if c := p.Completed(); c != "" {
				t.LastStage = c
			}
			t.Stage = p.InStage()
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
