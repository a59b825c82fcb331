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
type Action struct {
	Key       string
	Command   *recovery.Command
	Events    []events.Event
	ExpectSeq uint64
	Why       string
}

// Input is what Decide looks at: the session's projected state, the time
// now, the tenant's policy, when the reconciler first saw each pending
// distillation request (by its RequestedSeq) and each turn in flight (by
// its id, for turns whose turn.started carried no store time; zero time:
// just now), whether turns in flight are to be abandoned at once (the
// restart policy), whether the session is live (see Live; Decide issues
// nothing for a session that is not), and whether a runtime serving it is
// present (package presence).
type Input struct {
	State          *projections.Session
	Now            time.Time
	Policy         *Policy
	RequestSeenAt  func(seq uint64) time.Time
	TurnSeenAt     func(turn string) time.Time
	RestartAbandon bool
	Live           bool
	RuntimePresent bool
}

// Live reports whether the reconciler acts on session s at now
// (docs/policy.md, "Live sessions"): s is not history, and either a
// runtime serving it is present or its latest runtime activity was stored
// within the policy's live horizon (projections.Session.LastLiveStored,
// the log's clock).
func Live(s *projections.Session, now time.Time, p *Policy, runtimePresent bool) bool {
	if s == nil || s.History {
		return false
	}
	if runtimePresent {
		return true
	}
	return !s.LastLiveStored.IsZero() && now.Sub(s.LastLiveStored) <= time.Duration(p.Live.Horizon)
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
		c.Params = params
		out = append(out, Action{Key: c.ID, Command: &c, Why: reason})
	}

	// A session paused because no runtime answered resumes when its
	// runtime is back, and the command that could not reach it is issued
	// again, once, after the resume (recovery.Params.Reissue: the worker
	// issues its next issue, whoever issued it first).
	if s.Paused && s.PauseCause == events.CauseRuntimeUnavailable && in.RuntimePresent {
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

	// Invariant 1: every turn ends; one without an outcome past its
	// deadline is abandoned. The deadline runs from when the log stored
	// its turn.started (Turn.SeenAt, the log's clock: a publisher's clock,
	// or a time in year 9999, changes nothing), or, for a state without
	// store times, from when the reconciler first saw it in flight.
	for _, t := range s.Turns {
		if t.Status != projections.TurnInFlight {
			continue
		}
		deadline := time.Duration(p.TurnDeadline)
		if t.DeadlineMS > 0 {
			deadline = time.Duration(t.DeadlineMS) * time.Millisecond
		}
		stages := stagesOf(t)
		switch {
		case in.RestartAbandon:
			cmd(recovery.KindAbandonTurn, t.ID, "in flight when the engine restarted; "+stages, []uint64{t.StartedSeq}, recovery.Params{Cause: events.AbandonEngineRestart})
		case in.Now.Sub(turnSeen(t, in.TurnSeenAt, in.Now)) >= deadline:
			cmd(recovery.KindAbandonTurn, t.ID, fmt.Sprintf("no outcome within %s of its start; %s", deadline, stages), []uint64{t.StartedSeq}, recovery.Params{Cause: events.AbandonDeadline})
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
	return []Action{{Key: fmt.Sprintf("skip/%s/%s/%d", s.Tenant, s.Session, d.RequestedSeq), Events: []events.Event{ev}, ExpectSeq: s.LastSeq,
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

// turnSeen is when the deadline of turn t starts: its SeenAt, else when
// the reconciler first saw it.
func turnSeen(t projections.Turn, f func(string) time.Time, now time.Time) time.Time {
	if !t.SeenAt.IsZero() {
		return t.SeenAt
	}
	return seenAt(f, t.ID, now)
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
