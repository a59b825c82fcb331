package worker

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/erasure"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// DefaultProvider is the provider assumed for a session whose events name
// none.
const DefaultProvider = "default"

// runtimeEffect executes a command that needs the agent runtime. For
// retry_turn, switch_provider, distill and pivot_strategy it runs a
// strategy chain (Run) whose attempts are control requests; for
// resume_session, abandon_turn and abort_session it records the effect in
// the log and then tells the runtime. Every attempt is a recovery.attempted
// event; the end is recovery.completed; a chain that ends failed pauses the
// session.
func (w *Worker) runtimeEffect(ctx context.Context, cmd recovery.Command, state *projections.Session) (events.Outcome, int, error) {
	offset := 0
	if rec := state.Command(cmd.ID); rec != nil {
		offset = rec.Attempts
	}
	switch cmd.Kind {
	case recovery.KindResumeSession, recovery.KindAbandonTurn, recovery.KindAbortSession:
		return w.logThenNotice(ctx, cmd, state, offset)
	}
	provider := cmd.Params.Provider
	if provider == "" {
		provider = state.Provider
	}
	if provider == "" {
		provider = DefaultProvider
	}
	chain, class := w.chainFor(cmd, state)
	var appendErr error
	var lastFailed recovery.Class // the class of the latest failed attempt
	pauseFor := func() (events.PauseCause, string) {
		if lastFailed == recovery.ClassRuntimeUnavailable {
			return events.CauseRuntimeUnavailable, fmt.Sprintf("%s: no runtime answers for %s/%s; the session resumes, and the command runs again, when its runtime is back",
				cmd.Kind, cmd.Tenant, cmd.Session)
		}
		why := fmt.Sprintf("%s needs a person: %s", cmd.Kind, cmd.Reason)
		if cmd.Params.Recommendation != "" {
			why += "; recommended: " + cmd.Params.Recommendation
		}
		return events.CauseNeedsPerson, why
	}
	record := func(evs ...events.Event) {
		if appendErr != nil {
			return
		}
		if _, err := w.append(ctx, evs); err != nil {
			appendErr = err
		}
	}
	opts := RunOptions{
		Clock:         w.cfg.Clock,
		Breaker:       w.breakers.Get(cmd.Tenant, provider),
		AttemptOffset: offset,
		OnAttempt: func(r AttemptRecord) {
			if r.Result != AttemptOK {
				lastFailed = r.Class
			}
			record(w.attempted(cmd, r.Attempt, r.Strategy, r.Result, string(r.Class), r.Err, r.Duration))
		},
	}
	res := Run(ctx, chain, func(ctx context.Context, s recovery.Strategy, n int) AttemptResult {
		if appendErr != nil {
			return AttemptResult{Err: &events.ErrorInfo{Message: "event log: " + appendErr.Error(), Kind: events.KindTransient}, Class: recovery.ClassResource}
		}
		switch s.Action {
		case recovery.ActionPause:
			cause, why := pauseFor()
			if err := w.pauseSession(ctx, cmd, cause, why); err != nil {
				return AttemptResult{Err: &events.ErrorInfo{Message: err.Error(), Kind: events.KindTransient}, Class: recovery.ClassResource}
			}
			return AttemptResult{OK: true, Detail: "session paused"}
		case recovery.ActionAbort:
			if err := w.pauseSession(ctx, cmd, events.CauseAborted, fmt.Sprintf("aborted by %s: %s", cmd.ID, cmd.Reason)); err != nil {
				return AttemptResult{Err: &events.ErrorInfo{Message: err.Error(), Kind: events.KindTransient}, Class: recovery.ClassResource}
			}
			return AttemptResult{OK: true, Detail: "session aborted"}
		}
		return w.control(ctx, cmd, s.Action, n, "")
	}, opts)
	if appendErr != nil {
		return "", 0, appendErr
	}
	if res.Err != nil {
		return "", 0, res.Err
	}
	detail := completionDetail(cmd, chain, class, res)
	evs := []events.Event{w.completed(cmd, res.Outcome, res.Strategy, offset+res.Attempts, detail)}
	if _, err := w.append(ctx, evs); err != nil {
		return "", 0, err
	}
	if res.Outcome == events.OutcomeFailed {
		cause, _ := pauseFor()
		if err := w.pauseSession(ctx, cmd, cause, fmt.Sprintf("recovery %s failed: %s", cmd.ID, res.Detail)); err != nil {
			return "", 0, err
		}
	}
	w.l.Info().Str("command", cmd.ID).Str("session", cmd.Tenant+"/"+cmd.Session).Str("outcome", string(res.Outcome)).
		Str("strategy", res.Strategy).Int("attempts", res.Attempts).Msg(detail)
	return res.Outcome, offset + res.Attempts, nil
}

// completionDetail is recovery.completed's detail: what happened, in the
// words of docs/control.md. A chain that ended in its pause or abort says
// what was not done and why, then the effect ("retry_turn: not retried
// (authentication); session paused"); any other end is the run's detail
// and the strategies tried.
func completionDetail(cmd recovery.Command, chain []recovery.Strategy, class recovery.Class, res Result) string {
	var last *recovery.Strategy
	for i := range chain {
		if chain[i].Name == res.Strategy {
			last = &chain[i]
		}
	}
	if last == nil || (last.Action != recovery.ActionPause && last.Action != recovery.ActionAbort) {
		detail := res.Detail
		if len(res.Tried) > 0 {
			detail += " (tried " + strings.Join(res.Tried, ", ") + ")"
		}
		return detail
	}
	effect := "session paused"
	if last.Action == recovery.ActionAbort {
		effect = "session aborted"
	}
	var before []string
	for _, t := range res.Tried {
		if t != res.Strategy {
			before = append(before, t)
		}
	}
	if len(before) == 0 || res.LastError == nil {
		verb := "not run"
		if cmd.Kind == recovery.KindRetryTurn {
			verb = "not retried"
		}
		if class != "" {
			verb += " (" + string(class) + ")"
		}
		return fmt.Sprintf("%s: %s; %s", cmd.Kind, verb, effect)
	}
	return fmt.Sprintf("%s: %s failed (%s): %s; %s", cmd.Kind, strings.Join(before, ", "), res.Class, res.LastError.Message, effect)
}

// chainFor picks the strategy chain and the error class that chose it: a
// retry_turn follows the chain of its error's class (Params.ErrorClass,
// else the class of the turn's error); the other kinds try their own
// action, then pause (class ""). A command's own chain (Params.Chain)
// comes first.
func (w *Worker) chainFor(cmd recovery.Command, state *projections.Session) ([]recovery.Strategy, recovery.Class) {
	if len(cmd.Params.Chain) > 0 {
		if chain, err := recovery.ParseChain(cmd.Params.Chain); err == nil {
			return chain, cmd.Params.ErrorClass
		} else {
			w.l.Warn().Err(err).Str("command", cmd.ID).Msg("the command's chain is invalid; using the default")
		}
	}
	own := func(action string, attempts int, needsProvider bool) []recovery.Strategy {
		return []recovery.Strategy{
			{Name: string(cmd.Kind), Action: action, Attempts: attempts, NeedsProvider: needsProvider},
			{Name: recovery.StrategyPause, Action: recovery.ActionPause, Attempts: 1},
		}
	}
	switch cmd.Kind {
	case recovery.KindSwitchProvider:
		return own(recovery.ActionSwitchProvider, 2, false), ""
	case recovery.KindDistill:
		return own(recovery.ActionDistill, 2, true), ""
	case recovery.KindPivotStrategy:
		return own(recovery.ActionPivotStrategy, 1, true), ""
	}
	class := cmd.Params.ErrorClass
	if !class.Valid() {
		class = recovery.ClassUnknown
		if t := state.Turn(cmd.Turn); t != nil && t.Error != nil {
			class = recovery.Classify(*t.Error)
		} else if state.Errors.Last != nil {
			class = recovery.Classify(state.Errors.Last.Error)
		}
	}
	return w.chains.For(class), class
}

// control sends one control request and turns the reply (or its absence)
// into an AttemptResult.
func (w *Worker) control(ctx context.Context, cmd recovery.Command, action string, attempt int, notice string) AttemptResult {
	req := recovery.ControlRequest{
		CommandID: cmd.ID, Attempt: attempt, Action: action, Tenant: cmd.Tenant, Session: cmd.Session,
		Turn: cmd.Turn, Params: cmd.Params, Reason: cmd.Reason, Notice: notice,
		DeadlineMS: w.cfg.ControlTimeout.Milliseconds(),
	}
	body, err := json.Marshal(req)
	if err != nil {
		// A reason or notice that is not UTF-8 (the command was decoded
		// strictly, so not from the stream): the request cannot be sent.
		return AttemptResult{Class: recovery.ClassInvalidRequest, Err: &events.ErrorInfo{Message: "control request not encodable: " + err.Error(), Kind: events.KindLogic}}
	}
	rctx, cancel := context.WithTimeout(ctx, w.cfg.ControlTimeout)
	defer cancel()
	msg, err := w.nc.RequestWithContext(rctx, recovery.ControlSubject(cmd.Tenant, cmd.Session), body)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return AttemptResult{Class: recovery.ClassRuntimeUnavailable, Err: &events.ErrorInfo{
			Message: "no runtime answers " + recovery.ControlSubject(cmd.Tenant, cmd.Session) + ": nats: no responders", Kind: events.KindTransient}}
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout):
		if ctx.Err() != nil {
			return AttemptResult{Err: &events.ErrorInfo{Message: ctx.Err().Error(), Kind: events.KindTransient}, Class: recovery.ClassTimeout}
		}
		return AttemptResult{Class: recovery.ClassTimeout, Err: &events.ErrorInfo{
			Message: fmt.Sprintf("the runtime did not answer %s within %s", action, w.cfg.ControlTimeout), Kind: events.KindTransient}}
	case err != nil:
		return AttemptResult{Class: recovery.ClassNetwork, Err: &events.ErrorInfo{Message: err.Error(), Kind: events.KindTransient}}
	}
	var reply recovery.ControlReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return AttemptResult{Class: recovery.ClassParseError, Err: &events.ErrorInfo{Message: "control reply is not a reply object (docs/control.md): " + err.Error(), Kind: events.KindLogic}}
	}
	switch reply.Outcome {
	case recovery.ReplyOK:
		return AttemptResult{OK: true, Degraded: reply.Degraded, Detail: reply.Detail}
	case recovery.ReplyRejected:
		return AttemptResult{Class: recovery.ClassInvalidRequest, Detail: reply.Detail, Err: &events.ErrorInfo{
			Message: "the runtime rejected " + action + ": " + reply.Detail, Kind: events.KindLogic}}
	}
	e := reply.Error
	if e == nil {
		e = &events.ErrorInfo{Message: "the runtime failed " + action + ": " + reply.Detail, Kind: events.KindUnknown}
	}
	return AttemptResult{Err: e, Detail: reply.Detail}
}

// logThenNotice records a resume, an abandoned turn or an abort in the log
// and then tells the runtime. The log effect is the recovery; a runtime
// that does not hear of it makes the outcome degraded, not failed (an
// abort is failed by nature: the session is given up).
func (w *Worker) logThenNotice(ctx context.Context, cmd recovery.Command, state *projections.Session, offset int) (events.Outcome, int, error) {
	var evs []events.Event
	var detail, action, notice string
	switch cmd.Kind {
	case recovery.KindResumeSession:
		action, detail = recovery.ActionResumeSession, "resumed"
		if state.Paused {
			evs = append(evs, w.event(cmd, cmd.Session, "", "resume", &events.SessionResumed{Reason: cmd.Reason}))
		} else {
			detail = "was not paused"
		}
	case recovery.KindAbandonTurn:
		action = recovery.ActionNotice
		t := state.Turn(cmd.Turn)
		switch {
		case t == nil:
			detail = "turn " + cmd.Turn + " is not in the log"
		case t.Ended():
			detail = fmt.Sprintf("turn %s already ended (%s)", cmd.Turn, t.Status)
		default:
			in := t.Stage
			if in == "" {
				in = t.LastStage.Next()
			}
			evs = append(evs, w.event(cmd, cmd.Session, cmd.Turn, "abandon", &events.TurnAbandoned{LastStageCompleted: t.LastStage, Stage: in, Reason: cmd.Reason,
				Cause: abandonCause(cmd), CommandID: cmd.ID}))
			last := string(t.LastStage)
			if last == "" {
				last = "none"
			}
			detail = fmt.Sprintf("turn %s abandoned in stage %s (last stage completed: %s): %s", cmd.Turn, in, last, cmd.Reason)
			notice = detail
		}
	case recovery.KindAbortSession:
		action = recovery.ActionNotice
		d := cmd.Diagnostics
		detail = fmt.Sprintf("aborted: %s; tried: %s; config: %s", d.Failed, strings.Join(d.Tried, ", "), configLine(d.Config))
		notice = detail
		evs = append(evs, w.event(cmd, cmd.Session, "", "abort", &events.SessionPaused{Reason: events.MaskString("aborted: " + d.Failed),
			Cause: events.CauseAborted, CommandID: cmd.ID, Kind: string(cmd.Kind)}))
	}
	n := offset + 1
	if len(evs) > 0 {
		if _, err := w.append(ctx, evs, events.ExpectLastSeq(state.LastSeq)); err != nil {
			return "", 0, err
		}
	}
	outcome := events.OutcomeRecovered
	if cmd.Kind == recovery.KindAbortSession {
		outcome = events.OutcomeFailed
	}
	start := time.Now()
	var res AttemptResult
	if notice != "" || cmd.Kind == recovery.KindResumeSession {
		res = w.control(ctx, cmd, action, n, notice)
	} else {
		res = AttemptResult{OK: true}
	}
	result, class := AttemptOK, ""
	if !res.OK {
		result, class = AttemptFailed, string(res.Class)
		if outcome == events.OutcomeRecovered {
			outcome = events.OutcomeDegraded
			detail += fmt.Sprintf("; the runtime was not told (%s): %s", res.Class, res.Err.Message)
		}
	}
	if cmd.Kind == recovery.KindResumeSession && cmd.Params.Reissue != "" {
		// The runtime is back: what could not reach it goes again, after
		// this resume (commands of a session run in order).
		if again, err := w.reissue(ctx, cmd); err != nil {
			detail += "; " + cmd.Params.Reissue + " not issued again: " + err.Error()
		} else {
			detail += "; " + cmd.Params.Reissue + " issued again as " + again
		}
	}
	done := []events.Event{
		w.attempted(cmd, n, string(cmd.Kind), result, class, res.Err, time.Since(start)),
		w.completed(cmd, outcome, string(cmd.Kind), n, detail),
	}
	if _, err := w.append(ctx, done, events.Atomic()); err != nil {
		return "", 0, err
	}
	return outcome, n, nil
}

// reissue issues again the command cmd.Params.Reissue names and returns
// the new issue's id. Its id is deterministic (Reissued), so a resume run
// twice issues it once.
func (w *Worker) reissue(ctx context.Context, cmd recovery.Command) (string, error) {
	orig, err := recovery.FindCommand(ctx, w.log.JetStream(), cmd.Tenant, cmd.Session, cmd.Params.Reissue)
	if err != nil {
		return "", err
	}
	again := recovery.Reissued(orig, orig.IssuedBy, time.Now())
	if !w.gate.Enter(again.Tenant, again.Session, epochOf(ctx)) {
		return "", fmt.Errorf("reissue %s: %w", again.ID, erasure.ErrErasing)
	}
	_, _, err = recovery.Issue(ctx, w.log.JetStream(), again)
	w.gate.Leave(again.Tenant, again.Session)
	if err != nil {
		return "", err
	}
	return again.ID, nil
}

func configLine(c map[string]string) string {
	if len(c) == 0 {
		return "none"
	}
	var parts []string
	for k, v := range c {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return events.MaskString(strings.Join(parts, " "))
}

// pauseSession appends session.paused, with its cause and cmd as the
// command concerned, unless the session is paused.
func (w *Worker) pauseSession(ctx context.Context, cmd recovery.Command, cause events.PauseCause, reason string) error {
	state, err := w.restore(ctx, cmd.Tenant, cmd.Session)
	if err != nil {
		return err
	}
	if state.Paused {
		return nil
	}
	_, err = w.append(ctx, []events.Event{w.event(cmd, cmd.Session, "", "pause/"+reasonKey(reason),
		&events.SessionPaused{Reason: events.MaskString(reason), Cause: cause, CommandID: cmd.ID, Kind: string(cmd.Kind)})})
	return err
}

func reasonKey(s string) string {
	if len(s) > 16 {
		s = s[:16]
	}
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, strings.ToLower(s))
}

// abandonCause is the cause a turn.abandoned written for cmd names: the
// reconciler's (Params.Cause; its deadline when it named none), or
// events.AbandonManual for a command anyone else issued.
func abandonCause(cmd recovery.Command) string {
	if cmd.IssuedBy != recovery.IssuerReconciler {
		return events.AbandonManual
	}
	if cmd.Params.Cause != "" {
		return cmd.Params.Cause
	}
	return events.AbandonDeadline
}
