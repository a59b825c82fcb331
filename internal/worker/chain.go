package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/clock"
	"github.com/turnstone-dev/turnstone/recovery"
)

// AttemptResult is what one attempt of a strategy came to: OK when it
// worked; Degraded when it worked with less than asked (the runtime's
// reply said so); Err, when it failed, the error; Class the error's class
// (when empty, Run classifies Err with Classify); Detail a note for people
// (the control reply's detail).
type AttemptResult struct {
	OK       bool
	Degraded bool
	Err      *events.ErrorInfo
	Class    recovery.Class
	Detail   string
}

// AttemptFunc performs attempt n of strategy s: a control request to the
// runtime or an effect in the log. n is the command-wide attempt number
// (RunOptions.AttemptOffset + 1 for the first attempt of the run, counting
// across strategies), so that a command id and n name one attempt. It
// must return promptly once ctx is done.
type AttemptFunc func(ctx context.Context, s recovery.Strategy, n int) AttemptResult

// Results of an AttemptRecord, as recovery.attempted stores them.
const (
	AttemptOK     = events.AttemptOK
	AttemptFailed = events.AttemptFailed
)

// AttemptRecord describes one attempt Run made, for recovery.attempted:
// the strategy's name and action, the command-wide attempt number
// (Attempt) and the number within the strategy (StrategyAttempt, 1 for
// the first), Result (AttemptOK or AttemptFailed), whether it was
// Degraded, the error's Class and Err, how long it took (Duration, on
// RunOptions.Clock), and the Detail the attempt returned.
type AttemptRecord struct {
	Strategy        string
	Action          string
	Attempt         int
	StrategyAttempt int
	Result          events.AttemptResult
	Degraded        bool
	Class           recovery.Class
	Err             *events.ErrorInfo
	Duration        time.Duration
	Detail          string
}

// RunOptions are the optional settings of Run.
//
// Clock times the attempts and the waits between them (nil: SystemClock).
// Breaker, when set, is the circuit breaker of the session's current
// provider: before each attempt of a strategy that NeedsProvider, Run asks
// Breaker.Allow (a refusal ends the strategy, which counts as skipped),
// and after it reports Success (the attempt worked), Failure (it failed
// with a class whose ProviderFault is set) or Release (any other failure:
// no verdict on the provider). BreakerOpen, when set and Breaker is nil,
// is asked instead before each such attempt; true skips the strategy.
// OnAttempt receives every attempt after it returns; OnSkip every
// strategy skipped because the breaker is open (reason says so). Both run
// in Run's goroutine. AttemptOffset is added to the attempt numbers (the
// attempts earlier deliveries of the command already made).
type RunOptions struct {
	Clock         clock.Clock
	Breaker       *Breaker
	BreakerOpen   func() bool
	OnAttempt     func(AttemptRecord)
	OnSkip        func(s recovery.Strategy, reason string)
	AttemptOffset int
}

// Result is how a chain run ended: Outcome (events.OutcomeRecovered,
// OutcomeDegraded or OutcomeFailed), the Strategy that ended it (empty
// when the chain ran out or was cancelled before any), Attempts (how many
// attempts this run made), Tried (the names of the strategies that made at
// least one attempt, in order), the Class and LastError of the last failed
// attempt, a Detail for people, and Err: non-nil only when the run was
// cancelled (it wraps ctx.Err()) or the chain is invalid (it wraps
// ErrInvalidPolicy).
type Result struct {
	Outcome   events.Outcome
	Strategy  string
	Attempts  int
	Tried     []string
	Class     recovery.Class
	LastError *events.ErrorInfo
	Detail    string
	Err       error
}

var (
	errAttemptFailed = errors.New("attempt failed")
	errNotRetryable  = errors.New("class not retryable")
	errBreakerOpen   = errors.New("provider breaker open")
)

// Run walks chain until a strategy succeeds or the chain runs out. Each
// strategy gets up to Attempts attempts, spaced by its RetryPolicy
// (backoff.RetryNotifyWithTimer waiting on opts.Clock) and bounded by its
// MaxElapsed. A failed attempt whose class is not Retryable ends the
// strategy at once; a class that HonoursRetryAfter makes the next wait at
// least the error's retry-after hint. A strategy that NeedsProvider is
// skipped while the provider's breaker is open (see RunOptions).
//
// The outcome: a strategy whose action is ActionPause or ActionAbort ends
// the run OutcomeFailed (the session waits for a person or is given up);
// ActionDegrade, or any attempt that returns Degraded, ends it
// OutcomeDegraded; any other success OutcomeRecovered. A chain that runs
// out ends OutcomeFailed.
//
// Cancellation: once ctx is done, no new attempt starts and a wait between
// attempts ends at once; an attempt in progress has ctx and Run waits for
// it to return (its record is still reported). The Result is then
// OutcomeFailed with Err wrapping ctx.Err() and Strategy the one that was
// running: the command did not finish, so the caller should not record a
// completion but leave the command to be delivered again. An invalid
// chain (ValidateChain) makes no attempt and returns OutcomeFailed with
// Err wrapping ErrInvalidPolicy.
func Run(ctx context.Context, chain []recovery.Strategy, attempt AttemptFunc, opts RunOptions) Result {
	var res Result
	if err := recovery.ValidateChain(chain); err != nil {
		res.Outcome, res.Err = events.OutcomeFailed, fmt.Errorf("run chain: %w", err)
		res.Detail = res.Err.Error()
		return res
	}
	clk := opts.Clock
	if clk == nil {
		clk = clock.SystemClock
	}
	cancelled := func(s string) Result {
		res.Outcome, res.Strategy = events.OutcomeFailed, s
		res.Err = fmt.Errorf("run chain: %w", ctx.Err())
		res.Detail = "cancelled: " + ctx.Err().Error()
		return res
	}
	for _, s := range chain {
		if ctx.Err() != nil {
			return cancelled(s.Name)
		}
		b := newBackOff(s.Policy(), clk)
		var (
			last  AttemptResult
			n     int
			tried bool
		)
		op := func() error {
			if ctx.Err() != nil {
				return backoff.Permanent(ctx.Err())
			}
			allowed := true
			if s.NeedsProvider {
				switch {
				case opts.Breaker != nil:
					allowed = opts.Breaker.Allow()
				case opts.BreakerOpen != nil:
					allowed = !opts.BreakerOpen()
				}
			}
			if !allowed {
				return backoff.Permanent(errBreakerOpen)
			}
			n++
			res.Attempts++
			if !tried {
				tried = true
				res.Tried = append(res.Tried, s.Name)
			}
			start := clk.Now()
			r := attempt(ctx, s, opts.AttemptOffset+res.Attempts)
			if !r.OK && r.Class == "" {
				r.Class = recovery.ClassUnknown
				if r.Err != nil {
					r.Class = recovery.Classify(*r.Err)
				}
			}
			info := recovery.Info(r.Class)
			if s.NeedsProvider && opts.Breaker != nil {
				switch {
				case r.OK:
					opts.Breaker.Success()
				case info.ProviderFault:
					opts.Breaker.Failure()
				default:
					opts.Breaker.Release()
				}
			}
			rec := AttemptRecord{
				Strategy: s.Name, Action: s.Action, Attempt: opts.AttemptOffset + res.Attempts, StrategyAttempt: n,
				Result: AttemptOK, Degraded: r.Degraded, Duration: clk.Now().Sub(start), Detail: r.Detail,
			}
			if !r.OK {
				rec.Result, rec.Class, rec.Err = AttemptFailed, r.Class, r.Err
				res.Class, res.LastError = r.Class, r.Err
			}
			if opts.OnAttempt != nil {
				opts.OnAttempt(rec)
			}
			last = r
			switch {
			case r.OK:
				return nil
			case ctx.Err() != nil:
				return backoff.Permanent(ctx.Err())
			case !info.Retryable:
				return backoff.Permanent(errNotRetryable)
			}
			if info.HonoursRetryAfter && r.Err != nil {
				if d, ok := recovery.RetryAfter(*r.Err); ok {
					b.SetRetryAfter(d)
				}
			}
			return errAttemptFailed
		}
		err := backoff.RetryNotifyWithTimer(op, backoff.WithContext(b, ctx), nil, &backoffTimer{clock: clk})
		switch {
		case err == nil:
			res.Strategy = s.Name
			res.Outcome, res.Detail = outcomeOf(s, last)
			return res
		case ctx.Err() != nil:
			return cancelled(s.Name)
		case errors.Is(err, errBreakerOpen) && !tried:
			if opts.OnSkip != nil {
				opts.OnSkip(s, "provider circuit breaker open")
			}
		}
	}
	res.Outcome = events.OutcomeFailed
	res.Detail = fmt.Sprintf("every strategy failed (%d attempts)", res.Attempts)
	if res.LastError != nil {
		res.Detail += "; last error (" + string(res.Class) + "): " + res.LastError.Message
	}
	return res
}

// outcomeOf is the outcome and detail of a run that strategy s ended with
// the successful attempt r.
func outcomeOf(s recovery.Strategy, r AttemptResult) (events.Outcome, string) {
	outcome := events.OutcomeRecovered
	switch {
	case s.Action == recovery.ActionPause || s.Action == recovery.ActionAbort:
		outcome = events.OutcomeFailed
	case s.Action == recovery.ActionDegrade || r.Degraded:
		outcome = events.OutcomeDegraded
	}
	detail := r.Detail
	if detail == "" {
		detail = "ended in " + s.Name
		if outcome != events.OutcomeFailed {
			detail = s.Name + ": " + string(outcome)
		}
	}
	return outcome, detail
}
