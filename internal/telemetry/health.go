package telemetry

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// CheckTimeout bounds each registered check in Health.Status: a check that
// has not returned by then fails with an error wrapping
// context.DeadlineExceeded.
const CheckTimeout = 5 * time.Second

// The values of Report.Status and CheckResult.Status.
const (
	StatusOK      = "ok"
	StatusFailing = "failing"
)

// Health is a set of named health checks. A check is either polled (a
// function Register adds, run by every Status) or pushed (a status Set
// records, for components that know when they break, such as a
// connection's disconnect handler). A name holds one check: Register and
// Set replace what the name held.
//
// The zero value is an empty set, ready to use; a nil *Health has no checks
// (Status reports ok, Register and Set do nothing). It is safe for
// concurrent use.
type Health struct {
	mu     sync.RWMutex
	checks map[string]healthEntry
}

type healthEntry struct {
	check func(context.Context) error // nil for a pushed status
	err   error
}

// Report is the result of Health.Status, as /healthz serves it:
// {"status":"ok","checks":{"nats":{"status":"ok"}}}, or
// {"status":"failing","checks":{"nats":{"status":"failing","error":"..."}}}.
type Report struct {
	// Status is StatusOK when every check passes (or there is none), else
	// StatusFailing.
	Status string `json:"status"`
	// Checks holds every check by name; never nil.
	Checks map[string]CheckResult `json:"checks"`
}

// OK reports whether every check passed.
func (r Report) OK() bool { return r.Status == StatusOK }

// CheckResult is one check's result: Status is StatusOK or StatusFailing,
// Error the failing check's error message.
type CheckResult struct {
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
}

// NewHealth returns an empty set of checks.
func NewHealth() *Health { return &Health{} }

// Register adds the polled check name: Status runs check with a context
// bounded by CheckTimeout and the caller's, and the check fails when it
// returns an error (or panics). check must honour its context. A nil check
// removes name.
func (h *Health) Register(name string, check func(ctx context.Context) error) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if check == nil {
		delete(h.checks, name)
		return
	}
	if h.checks == nil {
		h.checks = map[string]healthEntry{}
	}
	h.checks[name] = healthEntry{check: check}
}

// Set records the pushed status of check name: failing with err, or
// passing when err is nil. It stays until the next Set, Register or
// Remove of name.
func (h *Health) Set(name string, err error) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.checks == nil {
		h.checks = map[string]healthEntry{}
	}
	h.checks[name] = healthEntry{err: err}
}

// Remove drops check name, if there is one.
func (h *Health) Remove(name string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.checks, name)
}

// Status runs every polled check, concurrently, and reports them with the
// pushed ones. A polled check that does not return within CheckTimeout (or
// before ctx ends) fails with an error wrapping the context's error; its
// goroutine is left to return on its own.
func (h *Health) Status(ctx context.Context) Report {
	rep := Report{Status: StatusOK, Checks: map[string]CheckResult{}}
	if h == nil {
		return rep
	}
	h.mu.RLock()
	entries := make(map[string]healthEntry, len(h.checks))
	for name, e := range h.checks {
		entries[name] = e
	}
	h.mu.RUnlock()

	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	record := func(name string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			rep.Status = StatusFailing
			rep.Checks[name] = CheckResult{Status: StatusFailing, Error: err.Error()}
			return
		}
		rep.Checks[name] = CheckResult{Status: StatusOK}
	}
	for name, e := range entries {
		if e.check == nil {
			record(name, e.err)
			continue
		}
		wg.Go(func() { record(name, runCheck(ctx, e.check)) })
	}
	wg.Wait()
	return rep
}

// runCheck runs check under CheckTimeout, turning a panic into an error.
func runCheck(ctx context.Context, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, CheckTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Errorf("check panicked: %v", r)
			}
		}()
		done <- check(ctx)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("check did not answer: %w", ctx.Err())
	}
}
