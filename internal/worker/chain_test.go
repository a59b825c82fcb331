package worker

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/clock"
	"github.com/turnstone-dev/turnstone/recovery"
)

// script is an AttemptFunc that answers from a table keyed by strategy
// name: the i-th attempt of a strategy gets the i-th result, and the last
// result repeats. It records the calls.
type script struct {
	mu      sync.Mutex
	results map[string][]AttemptResult
	counts  map[string]int
	calls   []string
	nums    []int
}

func newScript(results map[string][]AttemptResult) *script {
	return &script{results: results, counts: map[string]int{}}
}

func (s *script) attempt(_ context.Context, st recovery.Strategy, n int) AttemptResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, st.Name)
	s.nums = append(s.nums, n)
	rs := s.results[st.Name]
	if len(rs) == 0 {
		return AttemptResult{OK: true}
	}
	i := min(s.counts[st.Name], len(rs)-1)
	s.counts[st.Name]++
	return rs[i]
}

func failWith(status int, code, msg string) AttemptResult {
	return AttemptResult{Err: &events.ErrorInfo{Message: msg, HTTPStatus: status, Code: code}}
}

var (
	overloaded = failWith(529, "overloaded_error", "Overloaded")
	invalid    = failWith(400, "invalid_request_error", "messages: text content blocks must be non-empty")
	ok         = AttemptResult{OK: true, Detail: "done"}
)

// sleepClock is the system clock that records the duration of every
// timer made: what the code under test waited. Inside a synctest bubble
// the system clock is the bubble's fake one, so a wait passes at once
// once every goroutine of the bubble is blocked.
type sleepClock struct {
	mu     sync.Mutex
	sleeps []time.Duration
}

func (c *sleepClock) Now() time.Time { return clock.SystemClock.Now() }

func (c *sleepClock) NewTimer(d time.Duration) clock.Timer {
	c.mu.Lock()
	c.sleeps = append(c.sleeps, d)
	c.mu.Unlock()
	return clock.SystemClock.NewTimer(d)
}

// Sleeps returns the duration of every timer made so far, in order.
func (c *sleepClock) Sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.sleeps...)
}

func autoClock() *sleepClock { return &sleepClock{} }

func TestRunOutcomes(t *testing.T) {
	t.Parallel()
	chain := recovery.DefaultChains()[recovery.ClassOverloaded] // retry×2 → switch_provider → resume_from_snapshot → degrade → abort
	fail := []AttemptResult{overloaded}
	tests := []struct {
		name         string
		results      map[string][]AttemptResult
		wantOutcome  events.Outcome
		wantStrategy string
		wantCalls    []string
	}{
		{
			name:         "retry recovers on its second attempt",
			results:      map[string][]AttemptResult{recovery.StrategyRetry: {overloaded, ok}},
			wantOutcome:  events.OutcomeRecovered,
			wantStrategy: recovery.StrategyRetry,
			wantCalls:    []string{"retry", "retry"},
		},
		{
			name:         "switch provider recovers",
			results:      map[string][]AttemptResult{recovery.StrategyRetry: fail},
			wantOutcome:  events.OutcomeRecovered,
			wantStrategy: recovery.StrategySwitchProvider,
			wantCalls:    []string{"retry", "retry", "switch_provider"},
		},
		{
			name:         "degrade strategy ends degraded",
			results:      map[string][]AttemptResult{recovery.StrategyRetry: fail, recovery.StrategySwitchProvider: fail, recovery.StrategyResumeFromSnapshot: fail},
			wantOutcome:  events.OutcomeDegraded,
			wantStrategy: recovery.StrategyDegrade,
			wantCalls:    []string{"retry", "retry", "switch_provider", "resume_from_snapshot", "degrade"},
		},
		{
			name:         "degraded reply ends degraded",
			results:      map[string][]AttemptResult{recovery.StrategyRetry: fail, recovery.StrategySwitchProvider: {{OK: true, Degraded: true}}},
			wantOutcome:  events.OutcomeDegraded,
			wantStrategy: recovery.StrategySwitchProvider,
			wantCalls:    []string{"retry", "retry", "switch_provider"},
		},
		{
			name:         "abort ends failed",
			results:      map[string][]AttemptResult{recovery.StrategyRetry: fail, recovery.StrategySwitchProvider: fail, recovery.StrategyResumeFromSnapshot: fail, recovery.StrategyDegrade: fail},
			wantOutcome:  events.OutcomeFailed,
			wantStrategy: recovery.StrategyAbort,
			wantCalls:    []string{"retry", "retry", "switch_provider", "resume_from_snapshot", "degrade", "abort"},
		},
		{
			name:         "chain runs out",
			results:      map[string][]AttemptResult{recovery.StrategyRetry: fail, recovery.StrategySwitchProvider: fail, recovery.StrategyResumeFromSnapshot: fail, recovery.StrategyDegrade: fail, recovery.StrategyAbort: fail},
			wantOutcome:  events.OutcomeFailed,
			wantStrategy: "",
			wantCalls:    []string{"retry", "retry", "switch_provider", "resume_from_snapshot", "degrade", "abort"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newScript(tt.results)
				var recs []AttemptRecord
				res := Run(context.Background(), chain, s.attempt, RunOptions{Clock: autoClock(), OnAttempt: func(r AttemptRecord) { recs = append(recs, r) }})
				if res.Outcome != tt.wantOutcome || res.Strategy != tt.wantStrategy {
					t.Fatalf("outcome %s by %q, want %s by %q (%+v)", res.Outcome, res.Strategy, tt.wantOutcome, tt.wantStrategy, res)
				}
				if !slices.Equal(s.calls, tt.wantCalls) {
					t.Fatalf("calls %v, want %v", s.calls, tt.wantCalls)
				}
				if res.Attempts != len(tt.wantCalls) || len(recs) != len(tt.wantCalls) {
					t.Fatalf("attempts %d, records %d, want %d", res.Attempts, len(recs), len(tt.wantCalls))
				}
				if res.Err != nil {
					t.Fatalf("err = %v", res.Err)
				}
				for i, r := range recs {
					if r.Attempt != i+1 || s.nums[i] != i+1 {
						t.Fatalf("record %d has attempt %d (func got %d)", i, r.Attempt, s.nums[i])
					}
				}

			})
		})
	}
}

func TestRunRecords(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		chain := []recovery.Strategy{
			{Name: "retry", Action: recovery.ActionRetryTurn, Attempts: 3},
			{Name: "switch_provider", Action: recovery.ActionSwitchProvider, Attempts: 1},
		}
		s := newScript(map[string][]AttemptResult{"retry": {overloaded, {Err: &events.ErrorInfo{Message: "context deadline exceeded"}}, invalid}})
		var recs []AttemptRecord
		res := Run(context.Background(), chain, s.attempt, RunOptions{Clock: autoClock(), AttemptOffset: 4, OnAttempt: func(r AttemptRecord) { recs = append(recs, r) }})
		want := []AttemptRecord{
			{Strategy: "retry", Action: recovery.ActionRetryTurn, Attempt: 5, StrategyAttempt: 1, Result: AttemptFailed, Class: recovery.ClassOverloaded, Err: overloaded.Err},
			{Strategy: "retry", Action: recovery.ActionRetryTurn, Attempt: 6, StrategyAttempt: 2, Result: AttemptFailed, Class: recovery.ClassTimeout, Err: recs[1].Err},
			{Strategy: "retry", Action: recovery.ActionRetryTurn, Attempt: 7, StrategyAttempt: 3, Result: AttemptFailed, Class: recovery.ClassInvalidRequest, Err: invalid.Err},
			{Strategy: "switch_provider", Action: recovery.ActionSwitchProvider, Attempt: 8, StrategyAttempt: 1, Result: AttemptOK},
		}
		if !slices.Equal(recs, want) {
			t.Fatalf("records\n%+v\nwant\n%+v", recs, want)
		}
		if !slices.Equal(s.nums, []int{5, 6, 7, 8}) {
			t.Fatalf("attempt numbers %v", s.nums)
		}
		if !slices.Equal(res.Tried, []string{"retry", "switch_provider"}) || res.Class != recovery.ClassInvalidRequest {
			t.Fatalf("result %+v", res)
		}
	})
}

func TestRunRetryBudgetAndBackoff(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		policy := recovery.RetryPolicy{InitialInterval: time.Second, MaxInterval: time.Minute, Multiplier: 2, Jitter: 0.25, MaxElapsed: time.Hour}
		chain := []recovery.Strategy{{Name: "retry", Action: recovery.ActionRetryTurn, Attempts: 4, Retry: policy}}
		for range 20 {
			clock := autoClock()
			s := newScript(map[string][]AttemptResult{"retry": {overloaded}})
			res := Run(context.Background(), chain, s.attempt, RunOptions{Clock: clock})
			if res.Outcome != events.OutcomeFailed || res.Attempts != 4 || len(s.calls) != 4 {
				t.Fatalf("4-attempt budget: %+v, calls %v", res, s.calls)
			}
			sleeps := clock.Sleeps()
			if len(sleeps) != 3 {
				t.Fatalf("sleeps %v, want 3", sleeps)
			}
			for i, d := range sleeps {
				base := time.Second << i // 1s, 2s, 4s
				lo, hi := time.Duration(0.75*float64(base)), time.Duration(1.25*float64(base))
				if d < lo || d > hi {
					t.Fatalf("sleep %d = %s, outside [%s, %s]", i, d, lo, hi)
				}
				if i > 0 && d <= sleeps[i-1] {
					t.Fatalf("sleeps do not grow: %v", sleeps)
				}
			}
		}
	})
}

func TestRunJitter(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		chain := []recovery.Strategy{{Name: "retry", Action: recovery.ActionRetryTurn, Attempts: 2}}
		seen := map[time.Duration]bool{}
		for range 20 {
			clock := autoClock()
			Run(context.Background(), chain, newScript(map[string][]AttemptResult{"retry": {overloaded}}).attempt, RunOptions{Clock: clock})
			seen[clock.Sleeps()[0]] = true
		}
		if len(seen) < 2 {
			t.Fatalf("20 runs waited the same %v: no jitter", seen)
		}
	})
}

func TestRunMaxElapsed(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		chain := []recovery.Strategy{{Name: "retry", Action: recovery.ActionRetryTurn, Attempts: 10,
			Retry: recovery.RetryPolicy{InitialInterval: 10 * time.Second, MaxInterval: 10 * time.Second, Multiplier: 1, Jitter: 0.01, MaxElapsed: 35 * time.Second}}}
		s := newScript(map[string][]AttemptResult{"retry": {overloaded}})
		res := Run(context.Background(), chain, s.attempt, RunOptions{Clock: autoClock()})
		if res.Attempts != 4 {
			t.Fatalf("attempts = %d, want 4 (3 waits of ~10s fit in 35s)", res.Attempts)
		}
	})
}

func TestRunNonRetryableSkipsRetries(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		chain := recovery.DefaultChains()[recovery.ClassOverloaded]
		clock := autoClock()
		s := newScript(map[string][]AttemptResult{recovery.StrategyRetry: {invalid}})
		res := Run(context.Background(), chain, s.attempt, RunOptions{Clock: clock})
		if !slices.Equal(s.calls, []string{"retry", "switch_provider"}) {
			t.Fatalf("calls %v: a non-retryable error must end the strategy at once", s.calls)
		}
		if len(clock.Sleeps()) != 0 {
			t.Fatalf("waited %v before giving up a non-retryable error", clock.Sleeps())
		}
		if res.Outcome != events.OutcomeRecovered || res.Strategy != recovery.StrategySwitchProvider {
			t.Fatalf("result %+v", res)
		}
	})
}

func TestRunHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		chain := recovery.DefaultChains()[recovery.ClassRateLimit]
		clock := autoClock()
		limited := failWith(429, "rate_limit_error", "This request would exceed your organization's rate limit; retry-after: 12")
		s := newScript(map[string][]AttemptResult{recovery.StrategyRetry: {limited, ok}})
		res := Run(context.Background(), chain, s.attempt, RunOptions{Clock: clock})
		if res.Outcome != events.OutcomeRecovered || res.Attempts != 2 {
			t.Fatalf("result %+v", res)
		}
		if sl := clock.Sleeps(); len(sl) != 1 || sl[0] < 12*time.Second {
			t.Fatalf("sleeps %v, want one of at least 12s", sl)
		}
		// A class that does not honour the hint ignores it.
		clock = autoClock()
		timeout := failWith(504, "", "gateway timeout; retry-after: 50")
		Run(context.Background(), chain, newScript(map[string][]AttemptResult{recovery.StrategyRetry: {timeout, ok}}).attempt, RunOptions{Clock: clock})
		if sl := clock.Sleeps(); len(sl) != 1 || sl[0] >= 12*time.Second {
			t.Fatalf("sleeps %v: a timeout must not wait for the hint", sl)
		}
	})
}

func TestRunBreakerOpenSkipsProviderStrategies(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		chain := recovery.DefaultChains()[recovery.ClassOverloaded]
		var skipped []string
		s := newScript(map[string][]AttemptResult{recovery.StrategySwitchProvider: {overloaded}})
		res := Run(context.Background(), chain, s.attempt, RunOptions{
			Clock:       autoClock(),
			BreakerOpen: func() bool { return true },
			OnSkip:      func(st recovery.Strategy, _ string) { skipped = append(skipped, st.Name) },
		})
		if !slices.Equal(s.calls, []string{"switch_provider", "degrade"}) {
			t.Fatalf("calls %v", s.calls)
		}
		if !slices.Equal(skipped, []string{"retry", "resume_from_snapshot"}) {
			t.Fatalf("skipped %v", skipped)
		}
		if res.Outcome != events.OutcomeDegraded {
			t.Fatalf("result %+v", res)
		}
	})
}

func TestRunWithBreaker(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		clock := autoClock()
		var changes []BreakerChange
		b, err := NewBreaker("acme", "anthropic", BreakerConfig{Failures: 2, Window: time.Hour, Cooldown: time.Hour, Clock: clock,
			OnChange: func(c BreakerChange) { changes = append(changes, c) }})
		if err != nil {
			t.Fatal(err)
		}
		chain := []recovery.Strategy{
			{Name: "retry", Action: recovery.ActionRetryTurn, Attempts: 5, NeedsProvider: true},
			{Name: "switch_provider", Action: recovery.ActionSwitchProvider},
		}
		s := newScript(map[string][]AttemptResult{"retry": {overloaded}})
		res := Run(context.Background(), chain, s.attempt, RunOptions{Clock: clock, Breaker: b})
		// Two provider failures open the breaker; the retry strategy stops there.
		if !slices.Equal(s.calls, []string{"retry", "retry", "switch_provider"}) {
			t.Fatalf("calls %v", s.calls)
		}
		if b.State() != BreakerOpen || len(changes) != 1 || changes[0].To != BreakerOpen {
			t.Fatalf("breaker %s, changes %+v", b.State(), changes)
		}
		if res.Outcome != events.OutcomeRecovered {
			t.Fatalf("result %+v", res)
		}
	})
}

func TestRunPauseEndsFailed(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		for _, class := range []recovery.Class{recovery.ClassAuthentication, recovery.ClassInvalidRequest, recovery.ClassRuntimeUnavailable} {
			s := newScript(nil)
			res := Run(context.Background(), recovery.DefaultChains().For(class), s.attempt, RunOptions{Clock: autoClock()})
			if res.Outcome != events.OutcomeFailed || res.Strategy != recovery.StrategyPause || res.Attempts != 1 {
				t.Errorf("%s: result %+v", class, res)
			}
		}
	})
}

func TestRunCancellation(t *testing.T) {
	t.Parallel()
	chain := recovery.DefaultChains()[recovery.ClassOverloaded]

	t.Run("during a wait", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			clock := autoClock()
			ctx, cancel := context.WithCancel(context.Background())
			s := newScript(map[string][]AttemptResult{recovery.StrategyRetry: {overloaded}})
			done := make(chan Result, 1)
			go func() { done <- Run(ctx, chain, s.attempt, RunOptions{Clock: clock}) }()
			// Every goroutine of the bubble is blocked: Run waits on its
			// timer (the bubble's time does not move while this one runs).
			synctest.Wait()
			if len(clock.Sleeps()) != 1 || len(done) != 0 {
				t.Fatalf("Run is not waiting: sleeps %v", clock.Sleeps())
			}
			cancel()
			synctest.Wait()
			select {
			case res := <-done:
				if !errors.Is(res.Err, context.Canceled) || res.Outcome != events.OutcomeFailed || res.Attempts != 1 || res.Strategy != recovery.StrategyRetry {
					t.Fatalf("result %+v", res)
				}
			default:
				t.Fatal("Run did not return after cancellation")
			}

		})
	})

	t.Run("during an attempt", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			var calls int
			attempt := func(ctx context.Context, s recovery.Strategy, n int) AttemptResult {
				calls++
				cancel()
				<-ctx.Done()
				return AttemptResult{Err: &events.ErrorInfo{Message: ctx.Err().Error()}}
			}
			var recs int
			res := Run(ctx, chain, attempt, RunOptions{Clock: autoClock(), OnAttempt: func(AttemptRecord) { recs++ }})
			if calls != 1 || recs != 1 || !errors.Is(res.Err, context.Canceled) || res.Outcome != events.OutcomeFailed {
				t.Fatalf("calls %d, records %d, result %+v", calls, recs, res)
			}

		})
	})

	t.Run("before the run", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			s := newScript(nil)
			res := Run(ctx, chain, s.attempt, RunOptions{Clock: autoClock()})
			if len(s.calls) != 0 || !errors.Is(res.Err, context.Canceled) {
				t.Fatalf("calls %v, result %+v", s.calls, res)
			}

		})
	})
}

func TestRunInvalidChain(t *testing.T) {
	t.Parallel()
	s := newScript(nil)
	res := Run(context.Background(), []recovery.Strategy{{Name: "x", Action: "reboot"}}, s.attempt, RunOptions{})
	if !errors.Is(res.Err, recovery.ErrInvalidPolicy) || len(s.calls) != 0 || res.Outcome != events.OutcomeFailed {
		t.Fatalf("result %+v", res)
	}
	if res := Run(context.Background(), nil, s.attempt, RunOptions{}); !errors.Is(res.Err, recovery.ErrInvalidPolicy) {
		t.Fatalf("empty chain: %+v", res)
	}
}

func TestDefaultChains(t *testing.T) {
	t.Parallel()
	c := recovery.DefaultChains()
	if err := c.Validate(); err != nil {
		t.Fatalf("default chains invalid: %v", err)
	}
	for _, class := range recovery.Classes {
		if _, ok := c[class]; !ok {
			t.Errorf("no default chain for %s", class)
		}
	}
	if got := c.For("no_such_class"); !slices.Equal(got, c[recovery.ClassUnknown]) {
		t.Errorf("For(unknown class) = %v", got)
	}
	o := c.Override(recovery.Chains{recovery.ClassRateLimit: {{Name: "pause", Action: recovery.ActionPause}}})
	if len(o[recovery.ClassRateLimit]) != 1 || len(c[recovery.ClassRateLimit]) != 4 {
		t.Errorf("override changed the original or did not apply")
	}
	if err := (recovery.Chains{recovery.ClassRateLimit: {{Name: "pause", Action: recovery.ActionPause}}}).Validate(); err != nil {
		t.Errorf("an override map must validate on its own: %v", err)
	}
	bad := recovery.Chains{"bogus": {{Name: "", Action: "x", Attempts: -1}}}
	if err := bad.Validate(); !errors.Is(err, recovery.ErrInvalidPolicy) {
		t.Errorf("bad chains: %v", err)
	}
}

func TestParseChain(t *testing.T) {
	t.Parallel()
	chain, err := recovery.ParseChain([]string{"retry*2", "switch_provider", "pause"})
	if err != nil {
		t.Fatal(err)
	}
	if len(chain) != 3 || chain[0].Action != recovery.ActionRetryTurn || chain[0].Attempts != 2 || !chain[0].NeedsProvider || chain[2].Action != recovery.ActionPause {
		t.Fatalf("chain %+v", chain)
	}
	for _, bad := range [][]string{{}, {"retry*0"}, {"retry*x"}, {"explode"}} {
		if _, err := recovery.ParseChain(bad); !errors.Is(err, recovery.ErrInvalidPolicy) {
			t.Errorf("ParseChain(%q): want ErrInvalidPolicy, got %v", bad, err)
		}
	}
}
