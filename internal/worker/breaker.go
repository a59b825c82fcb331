package worker

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/clock"
	"github.com/turnstone-dev/turnstone/recovery"
)

// BreakerState is the state of a circuit breaker, as breaker.changed
// stores it (events.BreakerChanged's From and To).
type BreakerState string

// The breaker states. The names are part of the wire contract.
const (
	// BreakerClosed: calls go through; failures are counted.
	BreakerClosed BreakerState = "closed"
	// BreakerOpen: calls are refused until the cool-down has passed.
	BreakerOpen BreakerState = "open"
	// BreakerHalfOpen: a few probe calls go through; their results decide
	// between closed and open.
	BreakerHalfOpen BreakerState = "half_open"
)

// Valid reports whether s is one of the three breaker states.
func (s BreakerState) Valid() bool {
	return s == BreakerClosed || s == BreakerOpen || s == BreakerHalfOpen
}

// Defaults of BreakerConfig, applied to its zero fields.
const (
	DefaultBreakerFailures          = 5
	DefaultBreakerWindow            = 60 * time.Second
	DefaultBreakerCooldown          = 30 * time.Second
	DefaultBreakerHalfOpenProbes    = 1
	DefaultBreakerHalfOpenSuccesses = 1
)

// BreakerConfig configures the circuit breakers of a tenant's providers.
//
// A closed breaker opens when Failures failures happen within Window (a
// failure counts for Window after it happened; successes do not reset the
// count). An open breaker refuses calls for Cooldown, then turns half-open
// on the next Allow or State. A half-open breaker lets at most
// HalfOpenProbes calls through at once; HalfOpenSuccesses successful
// probes close it, one failed probe opens it again for another Cooldown.
// Zero fields take the defaults (5 failures, 60s, 30s, 1 probe, 1
// success).
//
// Clock is the time source (nil: SystemClock). OnChange, when set,
// receives every change of state the breaker makes itself (not those
// Apply mirrors), one at a time and in the order they happened. It is
// called without the breaker's lock, so it may do I/O (append a
// breaker.changed event) while other calls go on, and it may call the
// breaker; a change made while another goroutine is reporting earlier
// ones is reported by that goroutine, after them, so the method that made
// it may return before its change is reported.
type BreakerConfig struct {
	Failures          int
	Window            time.Duration
	Cooldown          time.Duration
	HalfOpenProbes    int
	HalfOpenSuccesses int
	Clock             clock.Clock         `json:"-"`
	OnChange          func(BreakerChange) `json:"-"`
}

func (c *BreakerConfig) setDefaults() {
	if c.Failures == 0 {
		c.Failures = DefaultBreakerFailures
	}
	if c.Window == 0 {
		c.Window = DefaultBreakerWindow
	}
	if c.Cooldown == 0 {
		c.Cooldown = DefaultBreakerCooldown
	}
	if c.HalfOpenProbes == 0 {
		c.HalfOpenProbes = DefaultBreakerHalfOpenProbes
	}
	if c.HalfOpenSuccesses == 0 {
		c.HalfOpenSuccesses = DefaultBreakerHalfOpenSuccesses
	}
	if c.Clock == nil {
		c.Clock = clock.SystemClock
	}
}

// Validate reports every rule c breaks once its zero fields take the
// defaults, joined; each error wraps ErrInvalidPolicy. Counts must be at
// least 1 and durations positive.
func (c BreakerConfig) Validate() error {
	c.setDefaults()
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: %s", recovery.ErrInvalidPolicy, fmt.Sprintf(format, a...)))
	}
	if c.Failures < 1 {
		bad("breaker failures: must be at least 1, got %d", c.Failures)
	}
	if c.Window < 0 {
		bad("breaker window: must be positive, got %s", c.Window)
	}
	if c.Cooldown < 0 {
		bad("breaker cooldown: must be positive, got %s", c.Cooldown)
	}
	if c.HalfOpenProbes < 1 {
		bad("breaker half_open_probes: must be at least 1, got %d", c.HalfOpenProbes)
	}
	if c.HalfOpenSuccesses < 1 {
		bad("breaker half_open_successes: must be at least 1, got %d", c.HalfOpenSuccesses)
	}
	return errors.Join(errs...)
}

// BreakerChange is one change of a breaker's state: the Tenant and
// Provider it guards, From and To, the number of failures in the window
// when it opened (Failures), why (Reason), and when (At, on the breaker's
// clock; for Apply, the time of the recorded event, zero meaning now).
type BreakerChange struct {
	Tenant   string
	Provider string
	From     BreakerState
	To       BreakerState
	Failures int
	Reason   string
	At       time.Time
}

// Event returns the breaker.changed payload of the change.
func (c BreakerChange) Event() *events.BreakerChanged {
	return &events.BreakerChanged{
		Provider: c.Provider, From: string(c.From), To: string(c.To), Failures: c.Failures, Reason: c.Reason,
	}
}

// ChangeFromEvent returns the change a breaker.changed event of tenant
// records, at the event's time, for Apply.
func ChangeFromEvent(tenant string, at time.Time, p *events.BreakerChanged) BreakerChange {
	return BreakerChange{
		Tenant: tenant, Provider: p.Provider, From: BreakerState(p.From), To: BreakerState(p.To),
		Failures: p.Failures, Reason: p.Reason, At: at,
	}
}

// ErrBreakerMismatch is returned by Apply for a change that is not for
// the breaker's tenant and provider, or whose To is not a breaker state.
var ErrBreakerMismatch = errors.New("breaker change does not apply")

// Breaker is the circuit breaker of one tenant's provider (see
// BreakerConfig for the state machine). It is safe for concurrent use.
// Every state change it makes goes to OnChange, so a worker can record it
// as breaker.changed; Apply mirrors a change another worker recorded.
type Breaker struct {
	tenant, provider string
	cfg              BreakerConfig

	mu        sync.Mutex
	state     BreakerState
	failures  []time.Time // failures within the window, oldest first (closed)
	openedAt  time.Time
	probes    int             // probes handed out and not yet reported (half-open)
	successes int             // successful probes (half-open)
	pending   []BreakerChange // changes not yet given to OnChange
	reporting bool            // a goroutine is giving pending to OnChange
}

// NewBreaker returns a closed breaker for tenant's provider, or the
// errors of cfg.Validate.
func NewBreaker(tenant, provider string, cfg BreakerConfig) (*Breaker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("new breaker: %w", err)
	}
	cfg.setDefaults()
	return &Breaker{tenant: tenant, provider: provider, cfg: cfg, state: BreakerClosed}, nil
}

// Tenant returns the tenant the breaker belongs to.
func (b *Breaker) Tenant() string { return b.tenant }

// Provider returns the provider the breaker guards.
func (b *Breaker) Provider() string { return b.provider }

// State returns the breaker's state. An open breaker whose cool-down has
// passed turns half-open here (and reports the change).
func (b *Breaker) State() BreakerState {
	defer b.report()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.coolLocked(b.cfg.Clock.Now())
	return b.state
}

// Failures returns the number of failures within the window (closed), or
// 0.
func (b *Breaker) Failures() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pruneLocked(b.cfg.Clock.Now())
	return len(b.failures)
}

// Allow reports whether a call may go to the provider now. Closed: yes.
// Open: no, until the cool-down has passed, when the breaker turns
// half-open. Half-open: yes while fewer than HalfOpenProbes probes are out,
// and the caller then holds a probe slot it must give back with Success,
// Failure or Release.
func (b *Breaker) Allow() bool {
	defer b.report()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.coolLocked(b.cfg.Clock.Now())
	switch b.state {
	case BreakerClosed:
		return true
	case BreakerHalfOpen:
		if b.probes < b.cfg.HalfOpenProbes {
			b.probes++
			return true
		}
	}
	return false
}

// Success reports a call that worked. Half-open: it counts as a successful
// probe, and HalfOpenSuccesses of them close the breaker. Closed or open:
// nothing changes (the failure window is not reset; a late success after
// the breaker opened is ignored).
func (b *Breaker) Success() {
	defer b.report()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state != BreakerHalfOpen {
		return
	}
	b.probes = max(b.probes-1, 0)
	b.successes++
	if b.successes >= b.cfg.HalfOpenSuccesses {
		b.setLocked(BreakerClosed, 0, fmt.Sprintf("%d probe(s) succeeded", b.successes), b.cfg.Clock.Now(), true)
	}
}

// Failure reports a call that failed because of the provider. Closed: it
// is counted, and the Failures-th failure within the window opens the
// breaker. Half-open: the probe failed and the breaker opens again for a
// new cool-down. Open: ignored.
func (b *Breaker) Failure() {
	defer b.report()
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.cfg.Clock.Now()
	switch b.state {
	case BreakerClosed:
		b.failures = append(b.failures, now)
		b.pruneLocked(now)
		if n := len(b.failures); n >= b.cfg.Failures {
			b.setLocked(BreakerOpen, n, fmt.Sprintf("%d failures within %s", n, b.cfg.Window), now, true)
		}
	case BreakerHalfOpen:
		b.probes = max(b.probes-1, 0)
		b.setLocked(BreakerOpen, 0, "probe failed", now, true)
	}
}

// Release gives back a half-open probe slot without a verdict (the call
// failed for a reason that says nothing about the provider, or never
// went out). Otherwise it does nothing.
func (b *Breaker) Release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == BreakerHalfOpen {
		b.probes = max(b.probes-1, 0)
	}
}

// Apply mirrors a change recorded elsewhere (a breaker.changed event of
// another worker): the breaker takes c.To without reporting a change. An
// open state's cool-down runs from c.At (zero: now). A change whose To is
// the current state is ignored, so a worker reading back its own events
// changes nothing. It returns an error wrapping ErrBreakerMismatch when c
// is for another tenant or provider (empty fields match) or c.To is not a
// state.
func (b *Breaker) Apply(c BreakerChange) error {
	if !c.To.Valid() {
		return fmt.Errorf("apply breaker change: %w: to %q is not a state", ErrBreakerMismatch, c.To)
	}
	if (c.Tenant != "" && c.Tenant != b.tenant) || (c.Provider != "" && c.Provider != b.provider) {
		return fmt.Errorf("apply breaker change: %w: it is for %s/%s, not %s/%s", ErrBreakerMismatch, c.Tenant, c.Provider, b.tenant, b.provider)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if c.To == b.state {
		return nil
	}
	at := c.At
	if at.IsZero() {
		at = b.cfg.Clock.Now()
	}
	b.setLocked(c.To, c.Failures, c.Reason, at, false)
	return nil
}

// coolLocked turns an open breaker half-open once its cool-down has
// passed.
func (b *Breaker) coolLocked(now time.Time) {
	if b.state == BreakerOpen && now.Sub(b.openedAt) >= b.cfg.Cooldown {
		b.setLocked(BreakerHalfOpen, 0, fmt.Sprintf("cool-down of %s passed", b.cfg.Cooldown), now, true)
	}
}

// pruneLocked drops failures older than the window.
func (b *Breaker) pruneLocked(now time.Time) {
	i := 0
	for i < len(b.failures) && now.Sub(b.failures[i]) > b.cfg.Window {
		i++
	}
	b.failures = b.failures[i:]
}

// setLocked moves the breaker to state to, resetting what that state
// counts, and reports the change when emit is set.
func (b *Breaker) setLocked(to BreakerState, failures int, reason string, at time.Time, emit bool) {
	from := b.state
	b.state = to
	b.probes, b.successes = 0, 0
	b.failures = nil
	if to == BreakerOpen {
		b.openedAt = at
	}
	if emit && b.cfg.OnChange != nil {
		b.pending = append(b.pending, BreakerChange{
			Tenant: b.tenant, Provider: b.provider, From: from, To: to, Failures: failures, Reason: reason, At: at,
		})
	}
}

// report gives the pending changes to OnChange, in order, without holding
// the lock while OnChange runs. Only one goroutine reports at a time; a
// goroutine that finds another reporting leaves its changes to it.
func (b *Breaker) report() {
	b.mu.Lock()
	if b.reporting {
		b.mu.Unlock()
		return
	}
	b.reporting = true
	defer func() {
		b.reporting = false
		b.mu.Unlock()
	}()
	for len(b.pending) > 0 {
		c := b.pending[0]
		b.pending = b.pending[1:]
		b.mu.Unlock()
		func() {
			defer b.mu.Lock()
			b.cfg.OnChange(c)
		}()
	}
}

// Breakers holds one Breaker per tenant and provider, made on first use
// with one BreakerConfig. It is safe for concurrent use.
type Breakers struct {
	cfg BreakerConfig
	mu  sync.Mutex
	m   map[breakerKey]*Breaker
}

type breakerKey struct{ tenant, provider string }

// NewBreakers returns an empty registry whose breakers follow cfg, or the
// errors of cfg.Validate.
func NewBreakers(cfg BreakerConfig) (*Breakers, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("new breakers: %w", err)
	}
	cfg.setDefaults()
	return &Breakers{cfg: cfg, m: map[breakerKey]*Breaker{}}, nil
}

// Get returns the breaker of tenant's provider, making a closed one on
// first use.
func (r *Breakers) Get(tenant, provider string) *Breaker {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := breakerKey{tenant, provider}
	b, ok := r.m[k]
	if !ok {
		b = &Breaker{tenant: tenant, provider: provider, cfg: r.cfg, state: BreakerClosed}
		r.m[k] = b
	}
	return b
}

// Apply mirrors c (a change another worker recorded) on the breaker of
// c.Tenant and c.Provider; see Breaker.Apply.
func (r *Breakers) Apply(c BreakerChange) error {
	return r.Get(c.Tenant, c.Provider).Apply(c)
}

// States returns the current state of every breaker made so far, keyed
// "<tenant>/<provider>".
func (r *Breakers) States() map[string]BreakerState {
	r.mu.Lock()
	all := make([]*Breaker, 0, len(r.m))
	for _, b := range r.m {
		all = append(all, b)
	}
	r.mu.Unlock()
	out := make(map[string]BreakerState, len(all))
	for _, b := range all {
		out[b.tenant+"/"+b.provider] = b.State()
	}
	return out
}
