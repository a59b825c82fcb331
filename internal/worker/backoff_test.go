package worker

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/turnstone-dev/turnstone/internal/clock"
	"github.com/turnstone-dev/turnstone/recovery"
)

func TestRetryBackOffBoundedByAttempts(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := recovery.RetryPolicy{InitialInterval: 100 * time.Millisecond, MaxInterval: 10 * time.Second, MaxAttempts: 5, MaxElapsed: time.Hour}
		for range 50 {
			ws := waits(p)
			if len(ws) != 4 {
				t.Fatalf("5 attempts gave %d waits, want 4: %v", len(ws), ws)
			}
			// Wait i is 100ms*2^i ±50%.
			for i, w := range ws {
				base := float64(100*time.Millisecond) * float64(int(1)<<i)
				if float64(w) < 0.5*base || float64(w) > 1.5*base {
					t.Fatalf("wait %d = %s, outside [%s, %s]", i, w, time.Duration(0.5*base), time.Duration(1.5*base))
				}
			}
		}
	})
}

func TestRetryBackOffBoundedByElapsed(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := recovery.RetryPolicy{InitialInterval: time.Second, MaxInterval: time.Second, Multiplier: 1, Jitter: 0.01, MaxAttempts: 100, MaxElapsed: 5 * time.Second}
		ws := waits(p)
		var total time.Duration
		for _, w := range ws {
			total += w
		}
		if total > 5*time.Second || len(ws) < 4 || len(ws) > 5 {
			t.Fatalf("waits %v (total %s) do not fit MaxElapsed 5s", ws, total)
		}
	})
}

func TestRetryBackOffSingleAttempt(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		if ws := waits(recovery.RetryPolicy{MaxAttempts: 1}); len(ws) != 0 {
			t.Fatalf("one attempt gave waits %v", ws)
		}
	})
}

func TestRetryBackOffRetryAfter(t *testing.T) {
	t.Parallel()
	p := recovery.RetryPolicy{InitialInterval: 100 * time.Millisecond, MaxInterval: 20 * time.Second, MaxAttempts: 5, MaxElapsed: time.Minute}
	tests := []struct {
		name string
		hint time.Duration
		min  time.Duration
		max  time.Duration
		stop bool
	}{
		{"hint longer than backoff is waited", 12 * time.Second, 12 * time.Second, 12 * time.Second, false},
		{"hint shorter than backoff changes nothing", time.Millisecond, 50 * time.Millisecond, 150 * time.Millisecond, false},
		{"hint capped at MaxInterval", 45 * time.Second, 20 * time.Second, 20 * time.Second, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBackOff(p, clock.SystemClock)
				b.Reset()
				b.SetRetryAfter(tt.hint)
				d := b.NextBackOff()
				if d < tt.min || d > tt.max {
					t.Fatalf("wait = %s, want within [%s, %s]", d, tt.min, tt.max)
				}
				// The hint applies once.
				if d2 := b.NextBackOff(); d2 > time.Second {
					t.Fatalf("second wait %s still follows the hint", d2)
				}

			})
		})
	}
	t.Run("hint past MaxElapsed stops", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := newBackOff(recovery.RetryPolicy{InitialInterval: 100 * time.Millisecond, MaxInterval: time.Minute, MaxAttempts: 5, MaxElapsed: 30 * time.Second}, clock.SystemClock)
			b.Reset()
			time.Sleep(25 * time.Second)
			b.SetRetryAfter(10 * time.Second)
			if d := b.NextBackOff(); d != backoff.Stop {
				t.Fatalf("wait = %s, want Stop", d)
			}

		})
	})
}

// waits draws every wait of a fresh backoff of p, sleeping each (in a
// synctest bubble: at once, the bubble's time moving), until Stop.
func waits(p recovery.RetryPolicy) []time.Duration {
	b := newBackOff(p, clock.SystemClock)
	b.Reset()
	var out []time.Duration
	for {
		d := b.NextBackOff()
		if d == backoff.Stop {
			return out
		}
		out = append(out, d)
		time.Sleep(d)
	}
}
