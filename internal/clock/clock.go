package clock

import (
	"sort"
	"sync"
	"time"
)

// Clock is the time source of retry policies, strategy chains and circuit
// breakers: Now for reading the time, NewTimer for waiting. It is a
// backoff.Clock too. SystemClock is the real one.
//
// Tests of code that does no network I/O run with SystemClock inside a
// testing/synctest bubble, whose time is fake and moves when every
// goroutine of the bubble is blocked (the worker's chain, backoff and
// breaker tests). FakeClock is for the tests synctest cannot hold: those
// that run an engine or a worker against a real NATS server, whose I/O
// is not durably blocking, so the bubble's time would never move; there
// the test moves the reconciler's time itself (Advance), or lets every
// back-off pass at once (SetAutoAdvance).
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTimer returns a timer that sends the time on its channel once d
	// has passed (at once when d <= 0).
	NewTimer(d time.Duration) Timer
}

// Timer is a one-shot timer made by a Clock.
type Timer interface {
	// C is the channel the timer sends on when it fires.
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it stopped
	// it (false: it had fired or was stopped already).
	Stop() bool
}

// SystemClock is the Clock of the real time (time.Now, time.NewTimer).
var SystemClock Clock = systemClock{}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) NewTimer(d time.Duration) Timer { return sysTimer{time.NewTimer(d)} }

type sysTimer struct{ t *time.Timer }

func (t sysTimer) C() <-chan time.Time { return t.t.C }
func (t sysTimer) Stop() bool          { return t.t.Stop() }

// FakeClock is a Clock for tests against real servers (see Clock), safe
// for concurrent use: its time moves
// only when Advance is called, and its timers fire when the time reaches
// them. With SetAutoAdvance(true), every new timer moves the time to its
// deadline and fires at once, so code that waits runs instantly while the
// time it would have waited is still measured (Sleeps).
type FakeClock struct {
	mu     sync.Mutex
	now    time.Time
	auto   bool
	timers []*fakeTimer
	sleeps []time.Duration
}

// NewFakeClock returns a FakeClock set to start.
func NewFakeClock(start time.Time) *FakeClock {
	return &FakeClock{now: start}
}

// SetAutoAdvance turns on or off the mode in which each new timer moves
// the clock to its deadline and fires at once.
func (c *FakeClock) SetAutoAdvance(on bool) {
	c.mu.Lock()
	c.auto = on
	c.mu.Unlock()
}

// Now returns the fake time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the fake time forward by d and fires every timer whose
// deadline it reaches, earliest first.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.fireLocked()
}

// NewTimer returns a timer that fires when the fake time reaches now+d. It
// records d in Sleeps.
func (c *FakeClock) NewTimer(d time.Duration) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), ch: make(chan time.Time, 1)}
	c.sleeps = append(c.sleeps, d)
	c.timers = append(c.timers, t)
	if c.auto && d > 0 {
		c.now = t.at
	}
	c.fireLocked()
	return t
}

// Sleeps returns the duration of every timer made so far, in order: what
// the code under test waited, or would have.
func (c *FakeClock) Sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.sleeps...)
}

// Pending returns the number of timers that have neither fired nor been
// stopped.
func (c *FakeClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

func (c *FakeClock) fireLocked() {
	sort.SliceStable(c.timers, func(i, j int) bool { return c.timers[i].at.Before(c.timers[j].at) })
	keep := c.timers[:0]
	for _, t := range c.timers {
		if !t.at.After(c.now) {
			t.ch <- c.now
			continue
		}
		keep = append(keep, t)
	}
	c.timers = keep
}

type fakeTimer struct {
	c  *FakeClock
	at time.Time
	ch chan time.Time
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	for i, x := range t.c.timers {
		if x == t {
			t.c.timers = append(t.c.timers[:i], t.c.timers[i+1:]...)
			return true
		}
	}
	return false
}
