package recovery

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
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

// Policy is the retry policy of s's attempts: s.Retry with MaxAttempts set
// to the strategy's budget.
func (s Strategy) Policy() RetryPolicy {
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
	if err := s.Policy().Validate(); err != nil {
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
