package recovery

import (
	"errors"
	"fmt"
	"time"
)

// Defaults of RetryPolicy, applied to its zero fields.
const (
	DefaultInitialInterval = 500 * time.Millisecond
	DefaultMaxInterval     = 30 * time.Second
	DefaultMultiplier      = 2.0
	DefaultJitter          = 0.5
	DefaultMaxAttempts     = 3
	DefaultMaxElapsed      = 2 * time.Minute
)

// RetryPolicy is how an operation is retried: exponential backoff with
// jitter (github.com/cenkalti/backoff/v4), bounded by the number of
// attempts AND the elapsed time, whichever ends first.
//
// The wait before retry n (n >= 1) is InitialInterval * Multiplier^(n-1),
// capped at MaxInterval, then randomized within ±Jitter of itself (Jitter
// is backoff's RandomizationFactor: 0.5 gives [0.5x, 1.5x]). MaxAttempts
// counts every attempt, the first included (1 means no retry). MaxElapsed
// bounds the time from the first attempt's start: a wait that would end
// past it is not made. A zero field takes its Default; Jitter 0 therefore
// means the default, not "no jitter".
type RetryPolicy struct {
	InitialInterval time.Duration
	MaxInterval     time.Duration
	Multiplier      float64
	Jitter          float64
	MaxAttempts     int
	MaxElapsed      time.Duration
}

// DefaultRetryPolicy returns the default policy: 500ms, doubling, capped
// at 30s, ±50% jitter, 3 attempts, 2 minutes.
func DefaultRetryPolicy() RetryPolicy {
	var p RetryPolicy
	p.setDefaults()
	return p
}

func (p *RetryPolicy) setDefaults() {
	if p.InitialInterval == 0 {
		p.InitialInterval = DefaultInitialInterval
	}
	if p.MaxInterval == 0 {
		p.MaxInterval = DefaultMaxInterval
	}
	if p.Multiplier == 0 {
		p.Multiplier = DefaultMultiplier
	}
	if p.Jitter == 0 {
		p.Jitter = DefaultJitter
	}
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.MaxElapsed == 0 {
		p.MaxElapsed = DefaultMaxElapsed
	}
}

// WithDefaults returns p with its zero fields set to the defaults.
func (p RetryPolicy) WithDefaults() RetryPolicy {
	p.setDefaults()
	return p
}

// Validate reports every rule p breaks once its zero fields take the
// defaults, joined; each error wraps ErrInvalidPolicy. Intervals and
// MaxElapsed must be positive, MaxInterval at least InitialInterval,
// Multiplier at least 1, Jitter within [0, 1], MaxAttempts at least 1.
func (p RetryPolicy) Validate() error {
	p.setDefaults()
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: %s", ErrInvalidPolicy, fmt.Sprintf(format, a...)))
	}
	if p.InitialInterval < 0 {
		bad("initial_interval: must be positive, got %s", p.InitialInterval)
	}
	if p.MaxInterval < 0 {
		bad("max_interval: must be positive, got %s", p.MaxInterval)
	}
	if p.InitialInterval > 0 && p.MaxInterval > 0 && p.MaxInterval < p.InitialInterval {
		bad("max_interval: %s is less than initial_interval %s", p.MaxInterval, p.InitialInterval)
	}
	if p.Multiplier < 1 {
		bad("multiplier: must be at least 1, got %g", p.Multiplier)
	}
	if p.Jitter < 0 || p.Jitter > 1 {
		bad("jitter: must be within [0, 1], got %g", p.Jitter)
	}
	if p.MaxAttempts < 1 {
		bad("max_attempts: must be at least 1, got %d", p.MaxAttempts)
	}
	if p.MaxElapsed < 0 {
		bad("max_elapsed: must be positive, got %s", p.MaxElapsed)
	}
	return errors.Join(errs...)
}
