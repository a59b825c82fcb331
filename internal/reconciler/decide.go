package reconciler

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// Action is one thing the reconciler does for a session: issue a recovery
// command, or append events to the session's log conditionally on its last
// sequence being ExpectSeq (a distillation.skipped answer). Key identifies
// the action so that a repeat is dropped: the command's id, or the id of
// the first event.
//
// StateSeq is the LastSeq of the state it was decided from: before it is
// carried out, the reconciler checks that the session's log holds nothing
// after it that changes the decision (Reconciler, "Never act on stale
// state").
type Action struct {
	Key       string
	Command   *recovery.Command
	Events    []events.Event
	ExpectSeq uint64
	StateSeq  uint64
	Why       string
}

// Input is what Decide looks at: the session's projected state, the time
// now, the tenant's policy, when the reconciler first saw each pending
// distillation request (by its RequestedSeq) and each turn in flight (by
// its id, for turns whose turn.started carried no store time; zero time:
// just now), whether turns in flight are to be abandoned at once (the
// restart policy), whether the session is live (see Live; Decide issues
// nothing for a session that is not), and whether a runtime serving it is
// present (package presence) and when it last answered.
//
// Activity holds the signs of life of turns in flight that the state does
// not carry, by turn id: the latest activity of a subagent session the
// turn started, or (Now) a runtime's claim that it works on the turn.
// RuntimeAnsweredAt is when the latest presence ping that a runtime
// serving the session answered was sent (zero: none): a session paused
// because its runtime was away is resumed only on an answer after the
// pause was stored.
type Input struct {
	State             *projections.Session
	Now               time.Time
	Policy            *Policy
	RequestSeenAt     func(seq uint64) time.Time
	TurnSeenAt        func(turn string) time.Time
	RestartAbandon    bool
	Live              bool
	RuntimePresent    bool
	RuntimeAnsweredAt time.Time
	Activity          map[string]time.Time
}

// Live reports whether the reconciler acts on session s at now
// (docs/policy.md, "Live sessions"): s is not history, and either a
// runtime serving it is present or its latest runtime activity was stored
// within LiveFor (projections.Session.LastLiveStored, the log's clock;
// or its latest abandoned turn, LastAbandonStored, when later).
func Live(s *projections.Session, now time.Time, p *Policy, runtimePresent bool) bool {
	if s == nil || s.History {
		return false
	}
	if runtimePresent {
		return true
	}
	since := s.LastLiveStored
	if s.LastAbandonStored.After(since) && !since.IsZero() {
		// A turn the reconciler abandoned: what the abandon declared
		// (orphans) is repaired within the horizon after it.
		since = s.LastAbandonStored
	}
	return !since.IsZero() && now.Sub(since) <= LiveFor(s, p)
}

// LiveFor is how long after its latest runtime activity a session with
// no runtime present is live: the policy's live horizon, or, while a
// turn is in flight, long enough for the turn's deadline to pass
// (turn_deadline, tool_deadline, the turn's own deadline_ms, a pending
// call's declared timeout and grace), so that every turn ends
// (invariant 1) however long its deadline.
func LiveFor(s *projections.Session, p *Policy) time.Duration {
	d := time.Duration(p.Live.Horizon)
	if len(s.InFlight) == 0 {
		return d
	}
	d = max(d, time.Duration(p.TurnDeadline), time.Duration(p.ToolDeadline))
	for _, id := range s.InFlight {
		t := s.Turn(id)
		if t == nil {
			continue
		}
		d = max(d, time.Duration(t.DeadlineMS)*time.Millisecond)
		for _, tc := range s.PendingToolCalls(t.ID) {
			d = max(d, time.Duration(tc.TimeoutMS)*time.Millisecond+time.Duration(p.ToolTimeoutGrace))
		}
	}
	return d
}

// transientClasses are the error classes the transient policy covers.
var transientClasses = []recovery.Class{
	recovery.ClassNetwork, recovery.ClassTimeout, recovery.ClassRateLimit, recovery.ClassOverloaded, recovery.ClassServer,
}

// Decide compares one session's state with the invariants and deadlines
// and returns what to do, in the order it must happen: an orphan's repair
// first (so nothing else of the session runs over a broken history), then
// abandoned turns, the distillation guard, the answer to a failed turn,
// and loop and budget breaks. It is pure: the same input gives the same
// actions with the same deterministic command ids, so deciding twice (a
// tick, a restart, a second engine) issues nothing new.
func Decide(in Input) []Action {
	s, p := in.State, in.Policy
	if s == nil || s.Session == "" || strings.HasPrefix(s.Session, "_") || !in.Live {
		return nil
	}
	var out []Action
	cmd := func(kind recovery.Kind, turn, reason string, evidence []uint64, params recovery.Params) {
		c := recovery.NewCommand(kind, s.Tenant, s.Session, turn, reason, evidence)
		if rec := s.Command(c.ID); rec != nil && rec.Done() {
			return // decided before, and carried out: nothing new
		}
		c.IssuedAt = in.Now.UTC()
		c.IssuedBy = recovery.IssuerReconciler
		c.DecidedSeq = s.LastRuntimeSeq
		c.Params = params
		out = append(out, Action{Key: c.ID, Command: &c, StateSeq: s.LastSeq, Why: reason})
	}

	// A session paused because no runtime answered resumes when its
	// runtime is back, and the command that could not reach it is issued
	// again, once, after the resume (recovery.Params.Reissue: the worker
	// issues its next issue, whoever issued it first).
	if s.Paused && s.PauseCause == events.CauseRuntimeUnavailable && RuntimeBack(s, in) {
		cmd(recovery.KindResumeSession, "", fmt.Sprintf("the runtime of %s/%s is back (paused at seq %d: %s)", s.Tenant, s.Session, s.PausedSeq, oneLine(s.PauseReason)),
			[]uint64{s.PausedSeq}, recovery.Params{Reissue: s.PauseCommand})
	}

	// Invariant 2: an orphaned tool_use is repaired before anything else.
	// The command names the orphans by their keys (projections.IDKey: an
	// id too long for one is a digest, which the worker reads back whole
	// from the record at the orphan's sequence) and its reason names a
	// few, so that it stays small whatever the ids.
	if *p.Orphans.Repair {
		if ids := s.OrphanedToolUseIDs(); len(ids) > 0 {
			var seqs []uint64
			for _, o := range s.Orphans {
				if !o.Repaired && slices.Contains(ids, o.ToolUseID) {
					seqs = append(seqs, o.Seq)
				}
			}
			slices.Sort(seqs)
			seqs = slices.Compact(seqs)
			cmd(recovery.KindRepairOrphans, "", fmt.Sprintf("orphaned tool_use %s: no tool_result before the history moved on", nameSome(ids)),
				seqs, recovery.Params{ToolUseIDs: ids})
		}
	}

	// Invariant 1: every turn ends; one with no sign of life for its
	// deadline is abandoned (TurnDue: the deadline counts from the turn's
	// latest sign of life, a pending call that declared its own timeout
	// gets that plus a grace, and turn_max_duration, when set, bounds the
	// whole turn). Times are the log's clock (Turn.SeenAt, ActiveAt), or,
	// for a state without store times, when the reconciler first saw the
	// turn in flight.
	for _, t := range s.Turns {
		if t.Status != projections.TurnInFlight {
			continue
		}
		switch {
		case in.RestartAbandon:
			cmd(recovery.KindAbandonTurn, t.ID, "in flight when the engine restarted; "+stagesOf(t), []uint64{t.StartedSeq}, recovery.Params{Cause: events.AbandonEngineRestart})
		default:
			if due, why := TurnDue(s, &t, in); !in.Now.Before(due) {
				cmd(recovery.KindAbandonTurn, t.ID, why+"; "+stagesOf(t), []uint64{t.StartedSeq}, recovery.Params{Cause: events.AbandonDeadline})
			}
		}
	}

	// Invariant 3: a distillation request is answered: skipped while a
	// turn is in flight or the history is dirty, run once it is clean.
	if *p.Distillation.Guard {
		if d := s.PendingDistillation(); d != nil {
			seen := in.Now
			if in.RequestSeenAt != nil {
				if t := in.RequestSeenAt(d.RequestedSeq); !t.IsZero() {
					seen = t
				}
			}
			if in.Now.Sub(seen) >= time.Duration(p.Distillation.Grace) {
				out = append(out, distillation(s, d, in.Now, cmd)...)
			}
		}
	}

	if s.Paused {
		return out // a paused session waits for a person; only repairs and deadlines act
	}

	// A failed turn is answered by its error's class.
	if t := lastTurn(s); t != nil && t.Status == projections.TurnFailed && t.Error != nil && t.Trigger != "retry" {
		class := recovery.Classify(*t.Error)
		reason := fmt.Sprintf("turn %s failed in %s: %s (%s)", t.ID, t.FailedStage, oneLine(t.Error.Message), class)
		switch {
		case slices.Contains(transientClasses, class):
			cmd(recovery.KindRetryTurn, t.ID, reason, []uint64{t.EndedSeq},
				recovery.Params{Chain: p.Transient.Chain, Recommendation: p.Transient.Recommendation, ErrorClass: class, Provider: t.Error.Provider})
		case class == recovery.ClassAuthentication:
			cmd(recovery.KindRetryTurn, t.ID, reason, []uint64{t.EndedSeq},
				recovery.Params{Chain: p.Authentication, Recommendation: "fix the credentials, then resume the session", ErrorClass: class})
		case class == recovery.ClassParseError:
			cmd(recovery.KindRetryTurn, t.ID, reason, []uint64{t.EndedSeq},
				recovery.Params{Chain: p.ParseFailure, ErrorClass: class})
		}
	}

	// Invariant 4: loops and budgets.
	if o := s.Outputs; o.Count >= p.Budget.SameOutputLimit && len(o.Seqs) > 0 {
		cmd(recovery.KindPauseSession, "", fmt.Sprintf("loop: the same assistant output %d times in a row (hash %s, seq %v)", o.Count, o.Hash, o.Seqs),
			[]uint64{o.Seqs[0]}, recovery.Params{})
	}
	if st := s.Errors.Streak; st.Count >= p.Budget.SameErrorLimit {
		cmd(recovery.KindPivotStrategy, "", fmt.Sprintf("loop: the same error %d times in a row since seq %d", st.Count, st.FirstSeq),
			[]uint64{st.FirstSeq}, recovery.Params{Strategy: "different approach after a repeated error"})
	}
	// The implementation budget: attempts at one step of the turn in
	// flight that failed in a row (projections.Step). One command per run
	// of failures (its first failure is the evidence); a turn that ended
	// needs no pivot.
	if t := lastTurn(s); t != nil && t.Status == projections.TurnInFlight && t.FailedAttempts >= p.Budget.ImplementationAttempts {
		if st := s.BudgetStep(t.ID); st != nil {
			cmd(recovery.KindPivotStrategy, t.ID, fmt.Sprintf("turn %s spent its implementation budget: %d failed attempts in a row at one step (%s, seq %d to %d)",
				t.ID, st.Failures, st.Name, st.FirstSeq, st.LastSeq), []uint64{st.FirstSeq}, recovery.Params{Strategy: "budget spent"})
		}
	}
	return out
}

// distillation answers a pending request d.
func distillation(s *projections.Session, d *projections.Distillation, now time.Time, cmd func(recovery.Kind, string, string, []uint64, recovery.Params)) []Action {
	reasons := s.DirtyReasons(d.Turn)
	if len(reasons) == 0 {
		cmd(recovery.KindDistill, "", fmt.Sprintf("distillation requested at seq %d; the history is clean", d.RequestedSeq), []uint64{d.RequestedSeq}, recovery.Params{})
		return nil
	}
	if d.SkippedSeq != 0 {
		return nil // answered; it runs once the history is clean
	}
	id := events.DeterministicID(s.FirstTime, fmt.Sprintf("%s/%s/skip/%d", s.Tenant, s.Session, d.RequestedSeq))
	ev, err := events.NewAt(now.UTC(), id, s.Tenant, s.Session, d.Turn, &events.DistillationSkipped{
		Reason: reasons[0],
		Detail: "deferred until the history is clean: " + strings.Join(reasons, ", "),
	})
	if err != nil {
		return nil
	}
	ev.Source = "urn:turnstone:reconciler"
	return []Action{{Key: fmt.Sprintf("skip/%s/%s/%d", s.Tenant, s.Session, d.RequestedSeq), Events: []events.Event{ev}, ExpectSeq: s.LastSeq, StateSeq: s.LastSeq,
		Why: "distillation skipped: " + strings.Join(reasons, ", ")}}
}

// lastTurn is the session's latest turn, or nil.
func lastTurn(s *projections.Session) *projections.Turn {
	if len(s.Turns) == 0 {
		return nil
	}
	return &s.Turns[len(s.Turns)-1]
}

// nameSome names at most 5 of ids (keys, each short) and how many more
// there are.
func nameSome(ids []string) string {
	const most = 5
	if len(ids) <= most {
		return strings.Join(ids, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(ids[:most], ", "), len(ids)-most)
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > 120 {
		return string(r[:120]) + "..."
	}
	return s
}

func seenAt(f func(string) time.Time, id string, now time.Time) time.Time {
	if f == nil {
		return time.Time{}
	}
	if t := f(id); !t.IsZero() {
		return t
	}
	return now
}

// turnSeen is when turn t started for its deadline: its SeenAt, else when
// the reconciler first saw it.
func turnSeen(t *projections.Turn, f func(string) time.Time, now time.Time) time.Time {
	if !t.SeenAt.IsZero() {
		return t.SeenAt
	}
	return seenAt(f, t.ID, now)
}

// RuntimeBack reports whether the runtime of session s, paused because no
// runtime answered, is back: a runtime serving it is present and answered
// a presence ping sent after the pause was stored (a runtime started after
// the one that was gone), or, for a pause without a store time, is
// present. A presence known from before the pause (the tracker had not
// yet seen the runtime die) is not a return.
func RuntimeBack(s *projections.Session, in Input) bool {
	if !in.RuntimePresent {
		return false
	}
	if s.PausedAt.IsZero() {
		return true
	}
	return in.RuntimeAnsweredAt.After(s.PausedAt)
}

// LastSignOfLife returns turn t's latest sign of life under in and what it
// was: its start (turnSeen), its latest event (Turn.ActiveAt), or the
// activity in.Activity holds for it (a subagent's, a runtime's claim).
func LastSignOfLife(t *projections.Turn, in Input) (time.Time, string) {
	at, what := turnSeen(t, in.TurnSeenAt, in.Now), "its start"
	if t.ActiveAt.After(at) {
		at, what = t.ActiveAt, "its latest event"
	}
	if a := in.Activity[t.ID]; a.After(at) {
		at, what = a, "activity outside its session (a subagent, or its runtime's claim)"
	}
	return at, what
}

// TurnDue returns when turn t, in flight in s, is due to be abandoned
// under in (docs/policy.md, "Every turn ends") and why it would be:
//
//   - its deadline after its last sign of life (LastSignOfLife): the
//     turn.started's deadline_ms, else tool_deadline while a tool call
//     of the turn is pending, else turn_deadline;
//   - but no earlier than each pending tool call of the turn that declared
//     its own timeout (projections.ToolCall.TimeoutMS) may take: its
//     start plus that timeout plus tool_timeout_grace;
//   - and, when turn_max_duration is set, no later than that after the
//     turn's start, whatever the signs of life.
func TurnDue(s *projections.Session, t *projections.Turn, in Input) (time.Time, string) {
	p := in.Policy
	pending := s.PendingToolCalls(t.ID)
	deadline, which := time.Duration(p.TurnDeadline), "turn_deadline"
	switch {
	case t.DeadlineMS > 0:
		deadline, which = time.Duration(t.DeadlineMS)*time.Millisecond, "the turn's deadline_ms"
	case len(pending) > 0:
		deadline, which = time.Duration(p.ToolDeadline), "tool_deadline, a tool call pending"
	}
	life, what := LastSignOfLife(t, in)
	due := life.Add(deadline)
	why := fmt.Sprintf("no sign of life for %s (%s) since %s", deadline, which, what)
	for _, tc := range pending {
		if tc.TimeoutMS <= 0 {
			continue
		}
		from := tc.UsedAt
		if from.IsZero() {
			from = life
		}
		timeout := time.Duration(tc.TimeoutMS) * time.Millisecond
		if d := from.Add(timeout + time.Duration(p.ToolTimeoutGrace)); d.After(due) {
			due = d
			why = fmt.Sprintf("tool call %s (%s) declared a timeout of %s and was given %s more, with no sign of life since", tc.ToolUseID, tc.Name, timeout, time.Duration(p.ToolTimeoutGrace))
		}
	}
	if max := time.Duration(p.TurnMaxDuration); max > 0 {
		if d := turnSeen(t, in.TurnSeenAt, in.Now).Add(max); d.Before(due) {
			due, why = d, fmt.Sprintf("ran for turn_max_duration (%s)", max)
		}
	}
	return due, why
}

// NextDue returns the earliest time after in.Now at which Decide, given
// the same state, may decide something new because time passed: a turn
// in flight falls due (TurnDue), or a distillation request's grace ends;
// zero when nothing waits on time. `engine whatif` decides again at each
// such time between two events.
func NextDue(in Input) time.Time {
	s, p := in.State, in.Policy
	var next time.Time
	consider := func(t time.Time) {
		if t.After(in.Now) && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	if s == nil {
		return next
	}
	for i := range s.Turns {
		if t := &s.Turns[i]; t.Status == projections.TurnInFlight {
			due, _ := TurnDue(s, t, in)
			consider(due)
		}
	}
	if *p.Distillation.Guard {
		if d := s.PendingDistillation(); d != nil && in.RequestSeenAt != nil {
			if seen := in.RequestSeenAt(d.RequestedSeq); !seen.IsZero() {
				consider(seen.Add(time.Duration(p.Distillation.Grace)))
			}
		}
	}
	return next
}

// stagesOf says where an in-flight turn is, in turn.abandoned's words:
// "in stage execute, last stage completed: history".
func stagesOf(t projections.Turn) string {
	in, last := t.Stage, t.LastStage
	if in == "" {
		in = last.Next()
	}
	done := string(last)
	if done == "" {
		done = "none"
	}
	return fmt.Sprintf("in stage %s, last stage completed: %s", in, done)
}
