package recovery

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/turnstone-dev/turnstone/events"
)

// Log-only actions of a strategy: they need no runtime, and a chain that
// ends in one of them ends failed (the session is paused for a person, or
// given up on).
const (
	// ActionPause pauses the session (session.paused) until a person or
	// the runtime's return resumes it.
	ActionPause = "pause"
	// ActionAbort gives up on the session (abort_session with its
	// diagnostics).
	ActionAbort = "abort"
)

// StrategyActions lists the actions a Strategy may take: the control
// actions of control.go and the log-only ActionPause and ActionAbort.
var StrategyActions = []string{
	ActionRetryTurn, ActionSwitchProvider, ActionResumeSession, ActionDistill, ActionPivotStrategy,
	ActionDegrade, ActionPause, ActionAbort,
}

// The strategy names DefaultChains uses.
const (
	StrategyRetry              = "retry"
	StrategySwitchProvider     = "switch_provider"
	StrategyResumeFromSnapshot = "resume_from_snapshot"
	StrategyDistill            = "distill"
	StrategyPivot              = "pivot_strategy"
	StrategyDegrade            = "degrade"
	StrategyPause              = "pause"
	StrategyAbort              = "abort"
)

// Strategy is one step of a recovery chain: Name (for the record), the
// Action it takes (one of StrategyActions), its attempt budget (Attempts;
// 0 means 1; it overrides Retry.MaxAttempts), the RetryPolicy that spaces
// its attempts, and NeedsProvider: the strategy calls the session's
// current model provider, so it is skipped while that provider's circuit
// breaker is open.
type Strategy struct {
	Name          string
	Action        string
	Attempts      int
	Retry         RetryPolicy
	NeedsProvider bool
}

// policy is the retry policy of s's attempts: s.Retry with MaxAttempts set
// to the strategy's budget.
func (s Strategy) policy() RetryPolicy {
	p := s.Retry
	p.MaxAttempts = max(s.Attempts, 1)
	return p.WithDefaults()
}

// Validate reports every rule s breaks, joined; each error wraps
// ErrInvalidPolicy.
func (s Strategy) Validate() error {
	var errs []error
	if s.Name == "" {
		errs = append(errs, fmt.Errorf("%w: name: required", ErrInvalidPolicy))
	}
	if !slices.Contains(StrategyActions, s.Action) {
		errs = append(errs, fmt.Errorf("%w: action: %q is not one of %v", ErrInvalidPolicy, s.Action, StrategyActions))
	}
	if s.Attempts < 0 {
		errs = append(errs, fmt.Errorf("%w: attempts: must not be negative, got %d", ErrInvalidPolicy, s.Attempts))
	}
	if err := s.policy().Validate(); err != nil {
		errs = append(errs, fmt.Errorf("retry: %w", err))
	}
	return errors.Join(errs...)
}

// ValidateChain reports every rule the strategies of chain break, each
// prefixed with its index and name, joined; an empty chain is invalid.
func ValidateChain(chain []Strategy) error {
	if len(chain) == 0 {
		return fmt.Errorf("%w: chain: no strategy", ErrInvalidPolicy)
	}
	var errs []error
	for i, s := range chain {
		if err := s.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("strategy %d (%s): %w", i, s.Name, err))
		}
	}
	return errors.Join(errs...)
}

// Chains maps an error class to its strategy chain, tried in order.
type Chains map[Class][]Strategy

// For returns the chain of class c, or that of ClassUnknown when c has
// none (nil when neither is set; Run refuses an empty chain).
func (c Chains) For(class Class) []Strategy {
	if chain, ok := c[class]; ok {
		return chain
	}
	return c[ClassUnknown]
}

// Override returns a copy of c in which every chain of o replaces the
// chain of its class (the reconciler's policy file sets them so).
func (c Chains) Override(o Chains) Chains {
	out := maps.Clone(c)
	if out == nil {
		out = Chains{}
	}
	maps.Copy(out, o)
	return out
}

// Validate reports every rule the chains break, joined: a key that is
// not one of Classes, and the rules of each chain (ValidateChain). It does
// not require every class, so an override map (see Override) validates
// on its own.
func (c Chains) Validate() error {
	var errs []error
	for _, class := range slices.Sorted(maps.Keys(c)) {
		if !class.Valid() {
			errs = append(errs, fmt.Errorf("%w: chains: %q is not an error class", ErrInvalidPolicy, class))
		}
		if err := ValidateChain(c[class]); err != nil {
			errs = append(errs, fmt.Errorf("chain %s: %w", class, err))
		}
	}
	return errors.Join(errs...)
}

// DefaultChains returns the built-in strategy chains, a fresh map the
// caller may change:
//
//	network             retry×3 → switch_provider → resume_from_snapshot → abort
//	timeout             retry×3 → switch_provider → abort
//	rate_limit          retry×3 (retry-after, waits up to 60s) → switch_provider → degrade → abort
//	overloaded          retry×2 → switch_provider → resume_from_snapshot → degrade → abort
//	server              retry×3 → switch_provider → resume_from_snapshot → abort
//	authentication      pause (needs a person) → abort
//	invalid_request     pause (needs a person) → abort
//	context_length      distill×2 → retry → abort
//	tool_error          retry×2 → pivot_strategy → pause
//	parse_error         retry×2 → degrade → abort
//	resource            resume_from_snapshot → pause
//	runtime_unavailable pause (until the runtime is back)
//	unknown             retry×2 → pause
//
// retry is retry_turn, resume_from_snapshot is resume_session, and every
// strategy that calls the model (retry, resume, distill, pivot) needs the
// provider; switch_provider, degrade, pause and abort do not. The
// default RetryPolicy spaces the attempts; a strategy's later step only
// runs when the earlier ones failed. pause and abort always succeed unless
// the log cannot be written, so a chain that reaches them ends failed.
func DefaultChains() Chains {
	retry := func(n int) Strategy {
		return Strategy{Name: StrategyRetry, Action: ActionRetryTurn, Attempts: n, NeedsProvider: true}
	}
	var (
		switchProvider = Strategy{Name: StrategySwitchProvider, Action: ActionSwitchProvider, Attempts: 1}
		resume         = Strategy{Name: StrategyResumeFromSnapshot, Action: ActionResumeSession, Attempts: 1, NeedsProvider: true}
		degrade        = Strategy{Name: StrategyDegrade, Action: ActionDegrade, Attempts: 1}
		pivot          = Strategy{Name: StrategyPivot, Action: ActionPivotStrategy, Attempts: 1, NeedsProvider: true}
		distill        = Strategy{Name: StrategyDistill, Action: ActionDistill, Attempts: 2, NeedsProvider: true}
		pause          = Strategy{Name: StrategyPause, Action: ActionPause, Attempts: 1}
		abort          = Strategy{Name: StrategyAbort, Action: ActionAbort, Attempts: 1}
	)
	rateLimited := retry(3)
	rateLimited.Retry = RetryPolicy{InitialInterval: time.Second, MaxInterval: time.Minute, MaxElapsed: 3 * time.Minute}
	return Chains{
		ClassNetwork:            {retry(3), switchProvider, resume, abort},
		ClassTimeout:            {retry(3), switchProvider, abort},
		ClassRateLimit:          {rateLimited, switchProvider, degrade, abort},
		ClassOverloaded:         {retry(2), switchProvider, resume, degrade, abort},
		ClassServer:             {retry(3), switchProvider, resume, abort},
		ClassAuthentication:     {pause, abort},
		ClassInvalidRequest:     {pause, abort},
		ClassContextLength:      {distill, retry(1), abort},
		ClassToolError:          {retry(2), pivot, pause},
		ClassParseError:         {retry(2), degrade, abort},
		ClassResource:           {resume, pause},
		ClassRuntimeUnavailable: {pause},
		ClassUnknown:            {retry(2), pause},
	}
}

// AttemptResult is what one attempt of a strategy came to: OK when it
// worked; Degraded when it worked with less than asked (the runtime's
// reply said so); Err, when it failed, the error; Class the error's class
// (when empty, Run classifies Err with Classify); Detail a note for people
// (the control reply's detail).
type AttemptResult struct {
	OK       bool
	Degraded bool
	Err      *events.ErrorInfo
	Class    Class
	Detail   string
}

// AttemptFunc performs attempt n of strategy s: a control request to the
// runtime or an effect in the log. n is the command-wide attempt number
// (RunOptions.AttemptOffset + 1 for the first attempt of the run, counting
// across strategies), so that a command id and n name one attempt. It
// must return promptly once ctx is done.
type AttemptFunc func(ctx context.Context, s Strategy, n int) AttemptResult

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
	Class           Class
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
	Clock         Clock
	Breaker       *Breaker
	BreakerOpen   func() bool
	OnAttempt     func(AttemptRecord)
	OnSkip        func(s Strategy, reason string)
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
	Class     Class
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
func Run(ctx context.Context, chain []Strategy, attempt AttemptFunc, opts RunOptions) Result {
	var res Result
	if err := ValidateChain(chain); err != nil {
		res.Outcome, res.Err = events.OutcomeFailed, fmt.Errorf("run chain: %w", err)
		res.Detail = res.Err.Error()
		return res
	}
	clock := opts.Clock
	if clock == nil {
		clock = SystemClock
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
		b := s.policy().NewBackOff(clock)
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
			start := clock.Now()
			r := attempt(ctx, s, opts.AttemptOffset+res.Attempts)
			if !r.OK && r.Class == "" {
				r.Class = ClassUnknown
				if r.Err != nil {
					r.Class = Classify(*r.Err)
				}
			}
			info := Info(r.Class)
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
				Result: AttemptOK, Degraded: r.Degraded, Duration: clock.Now().Sub(start), Detail: r.Detail,
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
				if d, ok := RetryAfter(*r.Err); ok {
					b.SetRetryAfter(d)
				}
			}
			return errAttemptFailed
		}
		err := backoff.RetryNotifyWithTimer(op, backoff.WithContext(b, ctx), nil, &backoffTimer{clock: clock})
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
func outcomeOf(s Strategy, r AttemptResult) (events.Outcome, string) {
	outcome := events.OutcomeRecovered
	switch {
	case s.Action == ActionPause || s.Action == ActionAbort:
		outcome = events.OutcomeFailed
	case s.Action == ActionDegrade || r.Degraded:
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

// ParseChain builds a chain from its specs, as a command's Params.Chain or a
// policy file writes them: a strategy name (StrategyRetry,
// StrategySwitchProvider, StrategyResumeFromSnapshot, StrategyDistill,
// StrategyPivot, StrategyDegrade, StrategyPause, StrategyAbort), optionally
// followed by "*N" for N attempts ("retry*2"). Strategies that call the
// model need the provider, as in DefaultChains. Errors wrap
// ErrInvalidPolicy and name the spec.
func ParseChain(specs []string) ([]Strategy, error) {
	var out []Strategy
	var errs []error
	for i, spec := range specs {
		name, n := spec, 1
		if base, count, ok := strings.Cut(spec, "*"); ok {
			v, err := strconv.Atoi(count)
			if err != nil || v < 1 {
				errs = append(errs, fmt.Errorf("%w: chain[%d] %q: attempts after '*' must be a positive number", ErrInvalidPolicy, i, spec))
				continue
			}
			name, n = base, v
		}
		s, ok := namedStrategies[name]
		if !ok {
			errs = append(errs, fmt.Errorf("%w: chain[%d] %q: not a strategy (one of %s)", ErrInvalidPolicy, i, spec, strings.Join(strategyNames(), ", ")))
			continue
		}
		s.Attempts = n
		out = append(out, s)
	}
	if len(out) == 0 && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("%w: chain: empty", ErrInvalidPolicy))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

var namedStrategies = map[string]Strategy{
	StrategyRetry:              {Name: StrategyRetry, Action: ActionRetryTurn, NeedsProvider: true},
	StrategySwitchProvider:     {Name: StrategySwitchProvider, Action: ActionSwitchProvider},
	StrategyResumeFromSnapshot: {Name: StrategyResumeFromSnapshot, Action: ActionResumeSession, NeedsProvider: true},
	StrategyDistill:            {Name: StrategyDistill, Action: ActionDistill, NeedsProvider: true},
	StrategyPivot:              {Name: StrategyPivot, Action: ActionPivotStrategy, NeedsProvider: true},
	StrategyDegrade:            {Name: StrategyDegrade, Action: ActionDegrade},
	StrategyPause:              {Name: StrategyPause, Action: ActionPause},
	StrategyAbort:              {Name: StrategyAbort, Action: ActionAbort},
}

func strategyNames() []string {
	names := make([]string, 0, len(namedStrategies))
	for n := range namedStrategies {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
