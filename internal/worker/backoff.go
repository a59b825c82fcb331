package worker

import (
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/turnstone-dev/turnstone/internal/clock"
	"github.com/turnstone-dev/turnstone/recovery"
)

// newBackOff returns the backoff.BackOff of policy p (its zero fields
// taking the defaults), measuring elapsed time on clock (nil: SystemClock).
// Its NextBackOff returns backoff.Stop once MaxAttempts-1 waits have been
// handed out or the next wait would end past MaxElapsed. Call Reset before
// the first attempt (backoff.Retry does).
func newBackOff(p recovery.RetryPolicy, clk backoff.Clock) *RetryBackOff {
	p = p.WithDefaults()
	if clk == nil {
		clk = clock.SystemClock
	}
	exp := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(p.InitialInterval),
		backoff.WithMaxInterval(p.MaxInterval),
		backoff.WithMultiplier(p.Multiplier),
		backoff.WithRandomizationFactor(p.Jitter),
		backoff.WithMaxElapsedTime(p.MaxElapsed),
		backoff.WithClockProvider(clk),
	)
	retries := uint64(0)
	if p.MaxAttempts > 1 {
		retries = uint64(p.MaxAttempts - 1)
	}
	return &RetryBackOff{policy: p, exp: exp, tries: backoff.WithMaxRetries(exp, retries)}
}

// RetryBackOff is the backoff.BackOff a RetryPolicy builds: exponential
// with jitter, bounded by attempts and elapsed time, and honouring a
// retry-after hint (SetRetryAfter). It is not safe for concurrent use (nor
// is backoff's ExponentialBackOff).
type RetryBackOff struct {
	policy recovery.RetryPolicy
	exp    *backoff.ExponentialBackOff
	tries  backoff.BackOff
	hint   time.Duration
}

var _ backoff.BackOff = (*RetryBackOff)(nil)

// SetRetryAfter makes the next wait at least d, the retry-after hint of
// the failure just seen (see RetryAfter). The hint is capped at
// MaxInterval (set MaxInterval to the longest wait you accept), and a
// wait that would end past MaxElapsed is not made: NextBackOff returns
// backoff.Stop instead. The hint applies to one wait only.
func (b *RetryBackOff) SetRetryAfter(d time.Duration) {
	b.hint = d
}

// NextBackOff returns the wait before the next attempt, or backoff.Stop
// when the attempts or the elapsed time are spent.
func (b *RetryBackOff) NextBackOff() time.Duration {
	hint := b.hint
	b.hint = 0
	next := b.tries.NextBackOff()
	if next == backoff.Stop || hint <= next {
		return next
	}
	hint = min(hint, b.policy.MaxInterval)
	if hint <= next {
		return next
	}
	if b.policy.MaxElapsed > 0 && b.exp.GetElapsedTime()+hint > b.policy.MaxElapsed {
		return backoff.Stop
	}
	return hint
}

// Reset starts over: the attempts and the elapsed time count from now,
// and any hint is dropped.
func (b *RetryBackOff) Reset() {
	b.hint = 0
	b.tries.Reset()
}

// Policy returns the policy b follows, its defaults applied.
func (b *RetryBackOff) Policy() recovery.RetryPolicy { return b.policy }

// backoffTimer adapts a Clock to backoff.Timer, so backoff's retry loop
// waits on the injected clock.
type backoffTimer struct {
	clock clock.Clock
	t     clock.Timer
}

func (b *backoffTimer) Start(d time.Duration) {
	if b.t != nil {
		b.t.Stop()
	}
	b.t = b.clock.NewTimer(d)
}

func (b *backoffTimer) Stop() {
	if b.t != nil {
		b.t.Stop()
	}
}

func (b *backoffTimer) C() <-chan time.Time { return b.t.C() }
