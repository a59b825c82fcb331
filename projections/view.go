package projections

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/turnstone-dev/turnstone/events"
)

// SessionStatus is a session's status in one word (Session.Status,
// View.Status).
type SessionStatus string

// The session statuses, in precedence order: a paused session with a turn
// in flight and an open violation is paused.
const (
	// StatusPaused: between session.paused and session.resumed; new turns
	// are violations (turn_while_paused) and most recovery waits.
	StatusPaused SessionStatus = "paused"
	// StatusBroken: a violation is open (Counts.ViolationsOpen > 0).
	StatusBroken SessionStatus = "broken"
	// StatusInterrupted: a history session (an import: Session.History)
	// whose turn is in flight and whose last event is older than the live
	// horizon: the transcript ends mid-turn, its runtime long gone (or it
	// was copied mid-turn). It is computed when the session is read
	// (Session.StatusAt, Summary.StatusAt), never written to the log: a
	// later import of the grown file continues the turn. The reconciler
	// never acts on history, so nothing else would end such a turn.
	StatusInterrupted SessionStatus = "interrupted"
	// StatusInTurn: a turn is in flight.
	StatusInTurn SessionStatus = "in_turn"
	// StatusIdle: none of the above.
	StatusIdle SessionStatus = "idle"
	// StatusInvalid: not a session but events stored under a subject the
	// wire contract forbids (InvalidSubjectView); no Session has it.
	StatusInvalid SessionStatus = "invalid"
)

// Statuses lists every SessionStatus, in precedence order (StatusInvalid
// last: it is not a Session's).
var Statuses = []SessionStatus{StatusPaused, StatusBroken, StatusInterrupted, StatusInTurn, StatusIdle, StatusInvalid}

// DefaultLiveHorizon is the reconciler's default live horizon
// (docs/policy.md, live.horizon): what a reader that knows no policy
// (View, the CLI) takes for StatusInterrupted.
const DefaultLiveHorizon = 30 * time.Minute

// Interrupted reports whether a session with these facts is
// StatusInterrupted at now: history, a turn in flight, and its last
// event (last: the latest event time, else the latest store time) more
// than horizon before now. A horizon of 0 or less is DefaultLiveHorizon.
func Interrupted(history bool, inFlight int, last, now time.Time, horizon time.Duration) bool {
	if horizon <= 0 {
		horizon = DefaultLiveHorizon
	}
	return history && inFlight > 0 && !last.IsZero() && now.Sub(last) > horizon
}

// lastEvent is the time Interrupted reads of a session: its latest event
// time, else its latest store time.
func lastEvent(lastTime, lastStored time.Time) time.Time {
	if !lastTime.IsZero() {
		return lastTime
	}
	return lastStored
}

// Valid reports whether st is one of Statuses.
func (st SessionStatus) Valid() bool {
	for _, s := range Statuses {
		if st == s {
			return true
		}
	}
	return false
}

// The states of an orphan or a violation in a View: each orphan and each
// violation the session ever had is in exactly one of them.
const (
	// StateOpen: it counts: the orphan awaits its repair, the violation
	// makes the session broken.
	StateOpen = "open"
	// StateRepaired (orphans) and StateResolved (violations): a later
	// event fixed it (a synthetic tool_result written by a repair); it no
	// longer counts but stays on record.
	StateRepaired = "repaired"
	StateResolved = "resolved"
	// StateReset: it arose in a history that a distillation has since
	// replaced (see Session.HistoryStart) and was never fixed; it no
	// longer counts.
	StateReset = "reset"
)

// The kinds of a ViewAnomaly that are not a violation's Rule.
const (
	AnomalyTurnFailed     = "turn_failed"
	AnomalyTurnAbandoned  = "turn_abandoned"
	AnomalyOutputLoop     = "output_loop"
	AnomalyErrorLoop      = "error_loop"
	AnomalyFlaky          = "flaky_suspected"
	AnomalyRecovery       = "recovery"
	AnomalyInvalidSubject = "invalid_subject"
)

// View is the one read model of a session: what `engine sessions`,
// `inspect`, `replay`, `incidents`, the engine's /metrics and the web view
// show of it, computed by Session.View alone, so that they agree and use
// the same names. Its JSON is version 1 of the shape docs/cli.md
// documents: keys are only ever added within a version, the arrays are
// always present (empty, never null), and first_anomaly and last_command
// are null when there is none.
//
// Orphans and violations are each in one of three states: open (they
// count), repaired or resolved (a repair fixed them), or reset (they
// arose in a history a distillation has since replaced, and no longer
// count). The counts are exact (from Session.Totals); the lists hold the
// ones the state keeps (the latest KeepAnomalies of each).
type View struct {
	// Tenant and Session identify the session (subject tokens). For an
	// invalid subject, they are the tokens where a session's would be, as
	// far as the subject has them.
	Tenant  string `json:"tenant"`
	Session string `json:"session"`
	// Subject is set only when Status is StatusInvalid: the stored subject
	// as it is, which names no valid session.
	Subject string `json:"subject,omitempty"`
	// Kind is "main", "subagent" or "compaction" (empty until
	// session.started is seen); ParentSession the session a subagent's
	// belongs to.
	Kind          string `json:"kind,omitempty"`
	ParentSession string `json:"parent_session,omitempty"`

	// Status is Session.StatusAt the View's time (or StatusInvalid);
	// StatusDetail says why, for people: the pause reason, the oldest
	// turn in flight, the first open violation, or what is wrong with an
	// invalid subject (empty when idle).
	Status       SessionStatus `json:"status"`
	StatusDetail string        `json:"status_detail,omitempty"`
	// Paused and PauseReason are the session's pause, whatever the
	// status shows first.
	Paused      bool   `json:"paused"`
	PauseReason string `json:"pause_reason,omitempty"`

	// Events is how many events were folded (invalid ones included);
	// FirstSeq and LastSeq the stream sequences of the first and the last;
	// FirstTime and LastTime the earliest and the latest event time (see
	// Session.FirstTime).
	Events    int       `json:"events"`
	FirstSeq  uint64    `json:"first_seq"`
	LastSeq   uint64    `json:"last_seq"`
	FirstTime time.Time `json:"first_time,omitzero"`
	LastTime  time.Time `json:"last_time,omitzero"`

	// Counts are the session's counts, by state.
	Counts Counts `json:"counts"`

	// InFlight lists the ids of the turns in flight, oldest first.
	InFlight []string `json:"in_flight"`
	// PendingToolUseIDs are the tool_use ids (IDKey) of the latest
	// assistant message that await their tool_result (Session.Pending):
	// the tools running, or, for an interrupted session, the calls the
	// transcript never answered.
	PendingToolUseIDs []string `json:"pending_tool_use_ids"`
	// OrphanedToolUseIDs are the ids of OpenOrphans, in order: the
	// tool_use blocks a repair would answer (Session.OrphanedToolUseIDs).
	OrphanedToolUseIDs []string `json:"orphaned_tool_use_ids"`
	// OpenOrphans and RepairedOrphans are the orphans in those states, in
	// the order they were declared.
	OpenOrphans     []Orphan `json:"open_orphans"`
	RepairedOrphans []Orphan `json:"repaired_orphans"`
	// OpenViolations and ResolvedViolations are the violations in those
	// states, in the order they arose (orphans show here too, as their
	// tool_use_without_result violation).
	OpenViolations     []Violation `json:"open_violations"`
	ResolvedViolations []Violation `json:"resolved_violations"`

	// FirstAnomaly is the earliest thing that went wrong that the state
	// keeps (see ViewAnomaly), whether or not it was since fixed; nil when
	// none.
	FirstAnomaly *ViewAnomaly `json:"first_anomaly"`
	// LastCommand is the record of the latest recovery command run on the
	// session (the last of Session.Commands); nil when none.
	LastCommand *CommandRecord `json:"last_command"`
	// Anomalous reports whether `engine incidents` lists the session
	// (Session.Anomalous; always true for an invalid subject).
	Anomalous bool `json:"anomalous"`
}

// Counts are a session's counts by state. Each total is every entry the
// session ever had, so open + repaired + reset = orphans_total and open +
// resolved + reset = violations_total. Turn outcomes count the turns the
// state keeps (every turn in flight and the latest KeepTurns ended ones),
// so in_flight + completed + failed + abandoned = turns_total until a
// session has more turns than that.
type Counts struct {
	TurnsTotal     int `json:"turns_total"`
	TurnsInFlight  int `json:"turns_in_flight"`
	TurnsCompleted int `json:"turns_completed"`
	TurnsFailed    int `json:"turns_failed"`
	TurnsAbandoned int `json:"turns_abandoned"`

	OrphansOpen     int `json:"orphans_open"`
	OrphansRepaired int `json:"orphans_repaired"`
	OrphansReset    int `json:"orphans_reset"`
	OrphansTotal    int `json:"orphans_total"`

	ViolationsOpen     int `json:"violations_open"`
	ViolationsResolved int `json:"violations_resolved"`
	ViolationsReset    int `json:"violations_reset"`
	ViolationsTotal    int `json:"violations_total"`

	// InvalidEvents counts the events that could not be folded (each is
	// also an invalid_event violation).
	InvalidEvents int `json:"invalid_events"`
}

// ViewAnomaly is one thing that went wrong in a session, at the event where
// it arose.
type ViewAnomaly struct {
	// What names it: a violation's Rule ("tool_use_without_result"), or
	// one of AnomalyTurnFailed, AnomalyTurnAbandoned, AnomalyOutputLoop,
	// AnomalyErrorLoop, AnomalyFlaky, AnomalyRecovery (a command parked
	// or failed), AnomalyInvalidSubject.
	What string `json:"what"`
	// Seq and Time are the sequence and the time of the event where it
	// arose (zero when unknown).
	Seq  uint64    `json:"seq,omitzero"`
	Time time.Time `json:"time,omitzero"`
	// Detail says what went wrong, for people.
	Detail string `json:"detail"`
	// Turn and ToolUseID name the turn and the tool_use concerned, when
	// there is one.
	Turn      string `json:"turn,omitempty"`
	ToolUseID string `json:"tool_use_id,omitempty"`
	// State is a violation's state (StateOpen, StateResolved, StateReset;
	// empty for the other kinds); ResolvedSeq the sequence of the event
	// that resolved it.
	State       string `json:"state,omitempty"`
	ResolvedSeq uint64 `json:"resolved_seq,omitzero"`
}

// View returns the session's read model (see View) now, with the
// default live horizon: ViewAt(time.Now(), DefaultLiveHorizon). It does
// not change the state, and the slices it returns are copies.
func (s *Session) View() View { return s.ViewAt(time.Now(), DefaultLiveHorizon) }

// ViewAt returns the session's read model as a reader at now sees it,
// with the live horizon horizon (the policy's live.horizon; 0 or less:
// DefaultLiveHorizon), which only StatusInterrupted depends on.
func (s *Session) ViewAt(now time.Time, horizon time.Duration) View {
	v := View{
		Tenant: s.Tenant, Session: s.Session, Kind: s.Kind, ParentSession: s.ParentSession,
		Status: s.StatusAt(now, horizon), Paused: s.Paused, PauseReason: s.PauseReason,
		Events: s.Events, FirstSeq: s.FirstSeq, LastSeq: s.LastSeq, FirstTime: s.FirstTime, LastTime: s.LastTime,
		Counts:    s.Counts(),
		Anomalous: s.Anomalous(),
	}
	if len(s.InFlight) > 0 {
		v.InFlight = append([]string(nil), s.InFlight...)
	}
	if len(s.Pending) > 0 {
		v.PendingToolUseIDs = append([]string(nil), s.Pending...)
	}
	first := since(s.HistoryStart.Orphans, s.Totals.Orphans, len(s.Orphans))
	for i, o := range s.Orphans {
		switch {
		case o.Repaired:
			v.RepairedOrphans = append(v.RepairedOrphans, o)
		case i >= first:
			v.OpenOrphans = append(v.OpenOrphans, o)
			v.OrphanedToolUseIDs = append(v.OrphanedToolUseIDs, o.ToolUseID)
		}
	}
	first = since(s.HistoryStart.Violations, s.Totals.Violations, len(s.Violations))
	for i, x := range s.Violations {
		switch {
		case x.Resolved:
			v.ResolvedViolations = append(v.ResolvedViolations, x)
		case i >= first:
			v.OpenViolations = append(v.OpenViolations, x)
		}
	}
	if n := len(s.Commands); n > 0 {
		c := s.Commands[n-1]
		v.LastCommand = &c
	}
	v.FirstAnomaly = s.firstAnomaly()
	v.StatusDetail = s.statusDetail(v)
	return v
}

// Counts returns the session's counts (View.Counts), without the rest of
// the View: what a caller that needs only numbers (the engine's metrics)
// takes after every event. It does not allocate.
func (s *Session) Counts() Counts {
	c := Counts{
		TurnsTotal:      s.Totals.Turns,
		TurnsInFlight:   len(s.InFlight),
		OrphansTotal:    s.Totals.Orphans,
		ViolationsTotal: s.Totals.Violations,
		InvalidEvents:   s.Totals.InvalidEvents,
	}
	for i := range s.Turns {
		switch s.Turns[i].Status {
		case TurnCompleted:
			c.TurnsCompleted++
		case TurnFailed:
			c.TurnsFailed++
		case TurnAbandoned:
			c.TurnsAbandoned++
		}
	}
	first := since(s.HistoryStart.Orphans, s.Totals.Orphans, len(s.Orphans))
	for i := range s.Orphans {
		switch {
		case s.Orphans[i].Repaired:
			c.OrphansRepaired++
		case i >= first:
			c.OrphansOpen++
		}
	}
	c.OrphansReset = max(c.OrphansTotal-c.OrphansOpen-c.OrphansRepaired, 0)
	c.ViolationsResolved = s.Totals.Resolved
	c.ViolationsReset = s.HistoryStart.Violations - s.HistoryStart.Resolved
	c.ViolationsOpen = c.ViolationsTotal - c.ViolationsResolved - c.ViolationsReset
	return c
}

// ViolationState returns the state (StateOpen, StateResolved, StateReset)
// of the i-th violation the state keeps (s.Violations[i]).
func (s *Session) ViolationState(i int) string {
	switch {
	case s.Violations[i].Resolved:
		return StateResolved
	case i >= since(s.HistoryStart.Violations, s.Totals.Violations, len(s.Violations)):
		return StateOpen
	}
	return StateReset
}

// OrphanState returns the state (StateOpen, StateRepaired, StateReset) of
// the i-th orphan the state keeps (s.Orphans[i]).
func (s *Session) OrphanState(i int) string {
	switch {
	case s.Orphans[i].Repaired:
		return StateRepaired
	case i >= since(s.HistoryStart.Orphans, s.Totals.Orphans, len(s.Orphans)):
		return StateOpen
	}
	return StateReset
}

// firstAnomaly is the earliest anomaly the state keeps: the one with the
// lowest sequence among the earliest violation, the first failed or
// abandoned turn, the loops in progress and the first flaky-suspected run
// (a violation first on a tie); else a parked or failed command; else nil.
func (s *Session) firstAnomaly() *ViewAnomaly {
	var best *ViewAnomaly
	consider := func(a ViewAnomaly) {
		if best == nil || a.Seq < best.Seq {
			best = &a
		}
	}
	if len(s.Violations) > 0 {
		x := s.Violations[0]
		consider(ViewAnomaly{What: string(x.Rule), Seq: x.Seq, Time: x.Time, Detail: x.Detail, Turn: x.Turn, ToolUseID: x.ToolUseID,
			State: s.ViolationState(0), ResolvedSeq: x.ResolvedSeq})
	}
	for i := range s.Turns {
		t := &s.Turns[i]
		switch t.Status {
		case TurnFailed:
			d := fmt.Sprintf("turn %s failed in %s", t.ID, t.FailedStage)
			if t.Error != nil {
				d += ": " + t.Error.Message
			}
			consider(ViewAnomaly{What: AnomalyTurnFailed, Seq: t.EndedSeq, Time: t.EndedAt, Detail: d, Turn: t.ID})
		case TurnAbandoned:
			consider(ViewAnomaly{What: AnomalyTurnAbandoned, Seq: t.EndedSeq, Time: t.EndedAt, Turn: t.ID,
				Detail: fmt.Sprintf("turn %s abandoned in %s (last stage completed: %s): %s", t.ID, orNone(string(t.Stage)), orNone(string(t.LastStage)), t.Reason)})
		default:
			continue
		}
		break
	}
	if s.Outputs.Count >= DefaultLoopLimit {
		a := ViewAnomaly{What: AnomalyOutputLoop, Detail: fmt.Sprintf("the same assistant output %d times in a row", s.Outputs.Count)}
		if len(s.Outputs.Seqs) > 0 {
			a.Seq = s.Outputs.Seqs[0]
		}
		consider(a)
	}
	if st := s.Errors.Streak; st.Count >= DefaultLoopLimit {
		a := ViewAnomaly{What: AnomalyErrorLoop, Seq: st.FirstSeq, Detail: fmt.Sprintf("the same error %d times in a row", st.Count)}
		if s.Errors.Last != nil {
			a.Detail += ": " + s.Errors.Last.Error.Message
		}
		consider(a)
	}
	if len(s.Flaky) > 0 {
		f := s.Flaky[0]
		consider(ViewAnomaly{What: AnomalyFlaky, Seq: f.FailSeq, Turn: f.Turn,
			Detail: fmt.Sprintf("%s failed at seq %d and passed when run again at seq %d", f.Tool, f.FailSeq, f.PassSeq)})
	}
	if best != nil {
		return best
	}
	for i := range s.Commands {
		c := &s.Commands[i]
		switch {
		case c.Parked:
			return &ViewAnomaly{What: AnomalyRecovery, Seq: c.LastSeq, Detail: fmt.Sprintf("%s %s parked: %s", c.Kind, c.ID, c.ParkReason)}
		case c.Outcome == events.OutcomeFailed:
			return &ViewAnomaly{What: AnomalyRecovery, Seq: c.OutcomeSeq, Detail: fmt.Sprintf("%s %s failed: %s", c.Kind, c.ID, c.Detail)}
		}
	}
	return nil
}

// The outcomes Triage.Outcome adds to events.Outcomes.
const (
	// OutcomeParked: the command was parked (CommandRecord.Parked).
	OutcomeParked = "parked"
	// OutcomeRunning: the command has neither an outcome nor a park yet.
	OutcomeRunning = "running"
)

// Triage returns the session's latest anomaly and latest recovery command
// (see Triage): the anomaly with the highest sequence among the latest
// violation the state keeps, the latest failed or abandoned turn, the
// loops in progress and the latest flaky-suspected run, or, when there is
// none of those, the latest parked or failed command; on a tie, a turn's
// end wins over the violations it declared (a crash's abandon over its
// orphans).
func (s *Session) Triage() Triage {
	var t Triage
	consider := func(what string, seq uint64, state, cause string, rank int) {
		// rank breaks ties: a turn's end (0) before a violation (1).
		if t.Anomaly != "" && (seq < t.AnomalySeq || (seq == t.AnomalySeq && rank >= t.rank())) {
			return
		}
		t = Triage{Anomaly: what, AnomalySeq: seq, AnomalyState: state, Cause: cause}
	}
	for i := len(s.Turns) - 1; i >= 0; i-- {
		tn := &s.Turns[i]
		if tn.Status == TurnFailed {
			consider(AnomalyTurnFailed, tn.EndedSeq, "", string(tn.FailedStage), 0)
			break
		}
		if tn.Status == TurnAbandoned {
			consider(AnomalyTurnAbandoned, tn.EndedSeq, "", tn.AbandonCause, 0)
			break
		}
	}
	if n := len(s.Violations); n > 0 {
		x := s.Violations[n-1]
		consider(string(x.Rule), x.Seq, s.ViolationState(n-1), "", 1)
	}
	if s.Outputs.Count >= DefaultLoopLimit && len(s.Outputs.Seqs) > 0 {
		consider(AnomalyOutputLoop, s.Outputs.Seqs[0], "", "", 1)
	}
	if st := s.Errors.Streak; st.Count >= DefaultLoopLimit {
		consider(AnomalyErrorLoop, st.FirstSeq, "", "", 1)
	}
	if n := len(s.Flaky); n > 0 {
		consider(AnomalyFlaky, s.Flaky[n-1].FailSeq, "", "", 1)
	}
	// A command that failed or was parked is the anomaly only when nothing
	// else went wrong: otherwise it answered that, and its outcome says
	// how it ended.
	for i := len(s.Commands) - 1; i >= 0 && t.Anomaly == ""; i-- {
		if c := &s.Commands[i]; c.Parked || c.Outcome == events.OutcomeFailed {
			consider(AnomalyRecovery, c.LastSeq, "", "", 1)
		}
	}
	if n := len(s.Commands); n > 0 {
		c := s.Commands[n-1]
		t.Recovery, t.Outcome = c.Kind, c.Result()
	}
	return t
}

// statusDetail says why the session has v.Status.
func (s *Session) statusDetail(v View) string {
	switch v.Status {
	case StatusPaused:
		return s.PauseReason
	case StatusInterrupted:
		t := s.InFlightTurn()
		if t == nil {
			return ""
		}
		d := fmt.Sprintf("the history ends mid-turn: turn %s in flight since seq %d, in stage %s, its last event at %s",
			t.ID, t.StartedSeq, orNone(string(t.Stage)), lastEvent(s.LastTime, s.LastStored).UTC().Format(time.RFC3339))
		if len(v.PendingToolUseIDs) > 0 {
			d += "; tool_use without its result: " + nameFew(v.PendingToolUseIDs)
		}
		return d
	case StatusInTurn:
		t := s.InFlightTurn()
		if t == nil {
			return ""
		}
		d := fmt.Sprintf("turn %s in flight since seq %d, in stage %s", t.ID, t.StartedSeq, orNone(string(t.Stage)))
		if n := len(s.InFlight); n > 1 {
			d += fmt.Sprintf(" (and %d more)", n-1)
		}
		return d
	case StatusBroken:
		if len(v.OpenViolations) > 0 {
			x := v.OpenViolations[0]
			d := fmt.Sprintf("seq %d %s: %s", x.Seq, x.Rule, x.Detail)
			if n := v.Counts.ViolationsOpen; n > 1 {
				d += fmt.Sprintf(" (and %d more)", n-1)
			}
			return d
		}
		return fmt.Sprintf("%d open violations", v.Counts.ViolationsOpen)
	}
	return ""
}

// InvalidSubjectView returns the View of the events stored under a subject
// that names no valid session (a literal "*" token, a token the contract
// forbids, the wrong number of tokens), so that every reader shows them
// rather than none: Status StatusInvalid, StatusDetail the reason, and an
// AnomalyInvalidSubject first anomaly. tenant and session are the tokens
// where a session's would be (possibly empty); n is how many events the
// subject holds.
func InvalidSubjectView(subject, tenant, session string, n int, reason string) View {
	d := fmt.Sprintf("%d event(s) under subject %q: %s", n, subject, reason)
	return View{
		Tenant: tenant, Session: session, Subject: subject,
		Status: StatusInvalid, StatusDetail: reason, Events: n,
		FirstAnomaly: &ViewAnomaly{What: AnomalyInvalidSubject, Detail: d},
		Anomalous:    true,
	}
}

// MarshalJSON writes the View with every array present (empty, not null).
func (v View) MarshalJSON() ([]byte, error) {
	type plain View
	p := plain(v)
	p.InFlight = nonNil(p.InFlight)
	p.PendingToolUseIDs = nonNil(p.PendingToolUseIDs)
	p.OrphanedToolUseIDs = nonNil(p.OrphanedToolUseIDs)
	p.OpenOrphans = nonNil(p.OpenOrphans)
	p.RepairedOrphans = nonNil(p.RepairedOrphans)
	p.OpenViolations = nonNil(p.OpenViolations)
	p.ResolvedViolations = nonNil(p.ResolvedViolations)
	return json.Marshal(p)
}

func nonNil[T any](xs []T) []T {
	if xs == nil {
		return []T{}
	}
	return xs
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// nameFew joins at most 5 of ids and says how many more there are.
func nameFew(ids []string) string {
	const most = 5
	if len(ids) <= most {
		return strings.Join(ids, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(ids[:most], ", "), len(ids)-most)
}
