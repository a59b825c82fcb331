package worker

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/clock"
	"github.com/turnstone-dev/turnstone/recovery"
)

// step is one action on a breaker in a state-machine table: advance the
// clock, then call op ("fail", "ok", "allow", "deny", "release"; "allow"
// and "deny" assert what Allow returns), then check the state.
type step struct {
	advance time.Duration
	op      string
	want    BreakerState
}

func TestBreakerStateMachine(t *testing.T) {
	t.Parallel()
	cfg := BreakerConfig{Failures: 3, Window: 10 * time.Second, Cooldown: 30 * time.Second, HalfOpenProbes: 2}
	tests := []struct {
		name    string
		cfg     BreakerConfig
		steps   []step
		changes []string // "from>to"
	}{
		{
			name:    "opens at N failures within the window",
			steps:   []step{{0, "fail", BreakerClosed}, {time.Second, "fail", BreakerClosed}, {time.Second, "fail", BreakerOpen}, {0, "deny", BreakerOpen}},
			changes: []string{"closed>open"},
		},
		{
			name:  "N failures spread beyond the window stay closed",
			steps: []step{{0, "fail", BreakerClosed}, {6 * time.Second, "fail", BreakerClosed}, {6 * time.Second, "fail", BreakerClosed}, {6 * time.Second, "fail", BreakerClosed}, {0, "allow", BreakerClosed}},
		},
		{
			name:    "successes do not reset the window",
			steps:   []step{{0, "fail", BreakerClosed}, {0, "ok", BreakerClosed}, {0, "fail", BreakerClosed}, {0, "ok", BreakerClosed}, {0, "fail", BreakerOpen}},
			changes: []string{"closed>open"},
		},
		{
			name: "half-open after the cool-down",
			steps: []step{{0, "fail", BreakerClosed}, {0, "fail", BreakerClosed}, {0, "fail", BreakerOpen},
				{29 * time.Second, "deny", BreakerOpen}, {time.Second, "allow", BreakerHalfOpen}},
			changes: []string{"closed>open", "open>half_open"},
		},
		{
			name: "half-open hands out at most K probes",
			steps: []step{{0, "fail", BreakerClosed}, {0, "fail", BreakerClosed}, {0, "fail", BreakerOpen},
				{30 * time.Second, "allow", BreakerHalfOpen}, {0, "allow", BreakerHalfOpen}, {0, "deny", BreakerHalfOpen},
				{0, "release", BreakerHalfOpen}, {0, "allow", BreakerHalfOpen}, {0, "deny", BreakerHalfOpen}},
			changes: []string{"closed>open", "open>half_open"},
		},
		{
			name: "a probe success closes it",
			steps: []step{{0, "fail", BreakerClosed}, {0, "fail", BreakerClosed}, {0, "fail", BreakerOpen},
				{30 * time.Second, "allow", BreakerHalfOpen}, {0, "ok", BreakerClosed}, {0, "allow", BreakerClosed},
				{0, "fail", BreakerClosed}, {0, "fail", BreakerClosed}},
			changes: []string{"closed>open", "open>half_open", "half_open>closed"},
		},
		{
			name: "a probe failure re-opens it for another cool-down",
			steps: []step{{0, "fail", BreakerClosed}, {0, "fail", BreakerClosed}, {0, "fail", BreakerOpen},
				{30 * time.Second, "allow", BreakerHalfOpen}, {0, "fail", BreakerOpen},
				{29 * time.Second, "deny", BreakerOpen}, {time.Second, "allow", BreakerHalfOpen}},
			changes: []string{"closed>open", "open>half_open", "half_open>open", "open>half_open"},
		},
		{
			name: "M probe successes needed to close",
			cfg:  BreakerConfig{Failures: 1, Window: time.Second, Cooldown: time.Second, HalfOpenProbes: 1, HalfOpenSuccesses: 2},
			steps: []step{{0, "fail", BreakerOpen}, {time.Second, "allow", BreakerHalfOpen}, {0, "ok", BreakerHalfOpen},
				{0, "allow", BreakerHalfOpen}, {0, "ok", BreakerClosed}},
			changes: []string{"closed>open", "open>half_open", "half_open>closed"},
		},
		{
			name:    "late results while open are ignored",
			cfg:     BreakerConfig{Failures: 1, Window: time.Second, Cooldown: time.Minute},
			steps:   []step{{0, "fail", BreakerOpen}, {0, "ok", BreakerOpen}, {0, "fail", BreakerOpen}, {0, "release", BreakerOpen}},
			changes: []string{"closed>open"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := tt.cfg
				if c.Failures == 0 {
					c = cfg
				}
				var changes []string
				c.Clock = clock.SystemClock // inside the bubble: synctest's fake time
				c.OnChange = func(ch BreakerChange) {
					if ch.Tenant != "acme" || ch.Provider != "anthropic" || !ch.At.Equal(time.Now()) {
						t.Errorf("change %+v", ch)
					}
					changes = append(changes, string(ch.From)+">"+string(ch.To))
				}
				b, err := NewBreaker("acme", "anthropic", c)
				if err != nil {
					t.Fatal(err)
				}
				for i, s := range tt.steps {
					time.Sleep(s.advance)
					switch s.op {
					case "fail":
						b.Failure()
					case "ok":
						b.Success()
					case "release":
						b.Release()
					case "allow", "deny":
						if got := b.Allow(); got != (s.op == "allow") {
							t.Fatalf("step %d: Allow() = %v", i, got)
						}
					}
					if got := b.State(); got != s.want {
						t.Fatalf("step %d (%s after %s): state %s, want %s", i, s.op, s.advance, got, s.want)
					}
				}
				if !slices.Equal(changes, tt.changes) {
					t.Fatalf("changes %v, want %v", changes, tt.changes)
				}

			})
		})
	}
}

func TestBreakerOpenChangeCountsFailures(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var got BreakerChange
		b, _ := NewBreaker("acme", "openai", BreakerConfig{Failures: 2, Clock: clock.SystemClock, OnChange: func(c BreakerChange) { got = c }})
		b.Failure()
		b.Failure()
		if got.Failures != 2 || got.Reason == "" {
			t.Fatalf("change %+v", got)
		}
		ev := got.Event()
		if ev.Provider != "openai" || ev.From != "closed" || ev.To != "open" || ev.Failures != 2 {
			t.Fatalf("event %+v", ev)
		}
		if ev.EventType() != events.TypeBreakerChanged {
			t.Fatalf("event type %s", ev.EventType())
		}
	})
}

func TestBreakerOnChangeMayCallTheBreaker(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var b *Breaker
		var seen []string
		b, _ = NewBreaker("acme", "anthropic", BreakerConfig{Failures: 1, Cooldown: time.Second, Clock: clock.SystemClock, OnChange: func(c BreakerChange) {
			// Not called under the lock: reading the breaker works, and a
			// change made from here is reported after this one.
			seen = append(seen, fmt.Sprintf("%s>%s (state %s)", c.From, c.To, b.State()))
			if c.To == BreakerOpen && len(seen) == 1 {
				time.Sleep(time.Second)
				b.Allow() // cool-down passed: open -> half_open
			}
		}})
		b.Failure()
		want := []string{"closed>open (state open)", "open>half_open (state half_open)"}
		if !slices.Equal(seen, want) {
			t.Fatalf("seen %v, want %v", seen, want)
		}
	})
}

func TestBreakerApplyMirrorsWithoutEmitting(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var emitted []BreakerChange
		b, _ := NewBreaker("acme", "anthropic", BreakerConfig{Cooldown: 30 * time.Second, Clock: clock.SystemClock, OnChange: func(c BreakerChange) { emitted = append(emitted, c) }})

		// Another worker opened it 10s ago: the cool-down runs from then.
		opened := time.Now().Add(-10 * time.Second)
		if err := b.Apply(ChangeFromEvent("acme", opened, &events.BreakerChanged{Provider: "anthropic", From: "closed", To: "open", Failures: 5})); err != nil {
			t.Fatal(err)
		}
		if b.Allow() || b.State() != BreakerOpen {
			t.Fatalf("mirrored open breaker allows calls (state %s)", b.State())
		}
		// Reading back the same change again changes nothing.
		if err := b.Apply(BreakerChange{Provider: "anthropic", From: BreakerClosed, To: BreakerOpen, At: time.Now()}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Second)
		if !b.Allow() || b.State() != BreakerHalfOpen {
			t.Fatalf("cool-down did not run from the event's time (state %s)", b.State())
		}
		// The cool-down transition is this breaker's own: it is emitted.
		if len(emitted) != 1 || emitted[0].To != BreakerHalfOpen {
			t.Fatalf("emitted %+v", emitted)
		}
		// Another worker's probe closed it.
		if err := b.Apply(BreakerChange{Tenant: "acme", Provider: "anthropic", From: BreakerHalfOpen, To: BreakerClosed}); err != nil {
			t.Fatal(err)
		}
		if b.State() != BreakerClosed || len(emitted) != 1 {
			t.Fatalf("state %s, emitted %d", b.State(), len(emitted))
		}

		for _, c := range []BreakerChange{
			{Provider: "openai", To: BreakerOpen},
			{Tenant: "other", Provider: "anthropic", To: BreakerOpen},
			{Provider: "anthropic", To: "ajar"},
		} {
			if err := b.Apply(c); !errors.Is(err, ErrBreakerMismatch) {
				t.Errorf("Apply(%+v) = %v, want ErrBreakerMismatch", c, err)
			}
		}
	})
}

func TestBreakerConfigValidate(t *testing.T) {
	t.Parallel()
	if err := (BreakerConfig{}).Validate(); err != nil {
		t.Fatalf("zero config (defaults) invalid: %v", err)
	}
	err := BreakerConfig{Failures: -1, Window: -time.Second, Cooldown: -time.Second, HalfOpenProbes: -1, HalfOpenSuccesses: -2}.Validate()
	if !errors.Is(err, recovery.ErrInvalidPolicy) {
		t.Fatalf("err = %v", err)
	}
	if n := len(err.(interface{ Unwrap() []error }).Unwrap()); n != 5 {
		t.Fatalf("%d problems reported, want 5: %v", n, err)
	}
	if _, err := NewBreaker("a", "b", BreakerConfig{Failures: -1}); !errors.Is(err, recovery.ErrInvalidPolicy) {
		t.Fatalf("NewBreaker: %v", err)
	}
	if _, err := NewBreakers(BreakerConfig{Failures: -1}); !errors.Is(err, recovery.ErrInvalidPolicy) {
		t.Fatalf("NewBreakers: %v", err)
	}
}

func TestBreakersRegistry(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var changes []BreakerChange
		r, err := NewBreakers(BreakerConfig{Failures: 3, Clock: clock.SystemClock, OnChange: func(c BreakerChange) {
			mu.Lock()
			changes = append(changes, c)
			mu.Unlock()
		}})
		if err != nil {
			t.Fatal(err)
		}
		if r.Get("acme", "anthropic") != r.Get("acme", "anthropic") {
			t.Fatal("Get returned two breakers for one key")
		}
		if r.Get("acme", "anthropic") == r.Get("globex", "anthropic") {
			t.Fatal("tenants share a breaker")
		}

		// Concurrent use: 8 goroutines hammer 4 keys.
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for i := range 100 {
					b := r.Get(fmt.Sprintf("t%d", g%4), "p")
					if b.Allow() {
						if i%2 == 0 {
							b.Failure()
						} else {
							b.Success()
						}
					}
					_ = b.State()
					_ = r.States()
				}
			})
		}
		wg.Wait()
		states := r.States()
		for g := range 4 {
			if s := states[fmt.Sprintf("t%d/p", g)]; s != BreakerOpen {
				t.Errorf("t%d/p is %s, want open", g, s)
			}
		}
		mu.Lock()
		n := len(changes)
		mu.Unlock()
		if n != 4 {
			t.Errorf("%d changes, want 4 (one open per key)", n)
		}

		if err := r.Apply(BreakerChange{Tenant: "acme", Provider: "openai", From: BreakerClosed, To: BreakerOpen}); err != nil {
			t.Fatal(err)
		}
		if r.Get("acme", "openai").State() != BreakerOpen {
			t.Fatal("registry Apply did not reach the breaker")
		}
	})
}
