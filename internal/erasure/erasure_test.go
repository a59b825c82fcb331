package erasure_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/internal/erasure"
)

// TestGate: what a gate allows and skips before, during and after an
// erase, and after one given up, for sessions in and out of its scope.
func TestGate(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	type check struct {
		tenant, session string
		since           string // "before" (an epoch taken before the erase began) or "after"
		seq             uint64 // a delivered event's sequence (watermark 100)
		enter, skip     bool
	}
	scopeOne := erasure.Scope{Tenant: "acme", Sessions: []string{"s1"}}
	scopeTenant := erasure.Scope{Tenant: "acme"}
	tests := []struct {
		name   string
		scope  erasure.Scope
		phase  string // "begun", "ended", "aborted", "expired"
		checks []check
	}{
		{"session being erased", scopeOne, "begun", []check{
			{"acme", "s1", "after", 500, false, true},
			{"acme", "s2", "before", 5, true, false},
			{"beta", "s1", "before", 5, true, false},
		}},
		{"tenant being erased", scopeTenant, "begun", []check{
			{"acme", "s1", "after", 500, false, true},
			{"acme", "anything", "after", 500, false, true},
			{"beta", "s1", "before", 5, true, false},
		}},
		{"session erased", scopeOne, "ended", []check{
			{"acme", "s1", "before", 50, false, true}, // work from the erased state; a buffered erased event
			{"acme", "s1", "after", 100, true, true},  // the watermark itself was erased
			{"acme", "s1", "after", 101, true, false}, // a new event of the session
			{"acme", "s2", "before", 50, true, false},
		}},
		{"tenant erased", scopeTenant, "ended", []check{
			{"acme", "x", "before", 50, false, true},
			{"acme", "x", "after", 101, true, false},
			{"beta", "x", "before", 50, true, false},
		}},
		{"erase given up", scopeOne, "aborted", []check{
			{"acme", "s1", "before", 50, true, false},
		}},
		{"eraser died: the block lifts", scopeOne, "expired", []check{
			{"acme", "s1", "before", 50, true, false},
			{"acme", "s1", "after", 500, true, false},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now = time.Unix(1000, 0)
			g := erasure.NewGate(erasure.Config{BlockFor: time.Minute, RememberFor: 10 * time.Minute, Now: clock})
			before := g.Epoch()
			n := erasure.Notice{ID: "e1", Phase: erasure.PhaseBegin, Scope: tt.scope}
			if err := g.Begin(context.Background(), n); err != nil {
				t.Fatal(err)
			}
			switch tt.phase {
			case "ended":
				n.EventsSeq, n.CommandsSeq = 100, 100
				g.End(n)
			case "aborted":
				g.Abort(n)
			case "expired":
				now = now.Add(2 * time.Minute)
			}
			after := g.Epoch()
			for _, c := range tt.checks {
				since := before
				if c.since == "after" {
					since = after
				}
				if got := g.Enter(c.tenant, c.session, since); got != c.enter {
					t.Errorf("Enter(%s/%s, %s) = %v, want %v", c.tenant, c.session, c.since, got, c.enter)
				} else if got {
					g.Leave(c.tenant, c.session)
				}
				if got := g.Skip(c.tenant, c.session, c.seq); got != c.skip {
					t.Errorf("Skip(%s/%s, %d) = %v, want %v", c.tenant, c.session, c.seq, got, c.skip)
				}
			}
		})
	}
	// Ended erases are forgotten after RememberFor.
	now = time.Unix(1000, 0)
	g := erasure.NewGate(erasure.Config{RememberFor: time.Minute, Now: clock})
	n := erasure.Notice{ID: "e", Phase: erasure.PhaseBegin, Scope: scopeOne}
	_ = g.Begin(context.Background(), n)
	n.EventsSeq = 100
	g.End(n)
	now = now.Add(2 * time.Minute)
	if g.Skip("acme", "s1", 50) {
		t.Fatal("an erase ended long ago still skips")
	}
}

// TestGateBeginWaitsForWritesInFlight: Begin returns only once the writes
// of its scope in flight have left; writes of other sessions do not hold
// it; and it gives up with ctx.
func TestGateBeginWaitsForWritesInFlight(t *testing.T) {
	g := erasure.NewGate(erasure.Config{})
	if !g.Enter("acme", "s1", g.Epoch()) || !g.Enter("acme", "other", g.Epoch()) {
		t.Fatal("enter refused with no erase")
	}
	done := make(chan error, 1)
	go func() {
		done <- g.Begin(context.Background(), erasure.Notice{ID: "e", Phase: erasure.PhaseBegin, Scope: erasure.Scope{Tenant: "acme", Sessions: []string{"s1"}}})
	}()
	select {
	case err := <-done:
		t.Fatalf("Begin returned with a write of its scope in flight: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	if g.Enter("acme", "s1", g.Epoch()) {
		t.Fatal("a new write of a session being erased was allowed")
	}
	g.Leave("acme", "s1")
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Begin did not return once the write left")
	}
	g.Leave("acme", "other")

	// ctx ends first.
	g = erasure.NewGate(erasure.Config{})
	g.Enter("acme", "s1", 0)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := g.Begin(ctx, erasure.Notice{ID: "e", Phase: erasure.PhaseBegin, Scope: erasure.Scope{Tenant: "acme"}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Begin with a write that never leaves: %v", err)
	}
}

// TestScope: validation and coverage.
func TestScope(t *testing.T) {
	for _, tt := range []struct {
		scope erasure.Scope
		valid bool
	}{
		{erasure.Scope{Tenant: "acme"}, true},
		{erasure.Scope{Tenant: "acme", Sessions: []string{"s-1", "s_2"}}, true},
		{erasure.Scope{}, false},
		{erasure.Scope{Tenant: "a.b"}, false},
		{erasure.Scope{Tenant: "acme", Sessions: []string{"*"}}, false},
		{erasure.Scope{Tenant: "acme", Sessions: []string{">"}}, false},
	} {
		if err := tt.scope.Validate(); (err == nil) != tt.valid {
			t.Errorf("Validate(%+v) = %v, want valid %v", tt.scope, err, tt.valid)
		}
	}
	s := erasure.Scope{Tenant: "acme", Sessions: []string{"s1"}}
	if !s.Covers("acme", "s1") || s.Covers("acme", "s2") || s.Covers("beta", "s1") || !(erasure.Scope{Tenant: "acme"}).Covers("acme", "x") {
		t.Fatal("Covers")
	}
}
