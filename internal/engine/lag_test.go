package engine_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/internal/engine"
	"github.com/turnstone-dev/turnstone/internal/reconciler"
	"github.com/turnstone-dev/turnstone/internal/worker"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// bulk appends evs through async publishes (the order of one session's
// events is kept: one connection, one subject) and waits for every ack.
func bulk(t *testing.T, js jetstream.JetStream, log *events.Log, evs []events.Event) {
	t.Helper()
	msgs, err := log.Prepare(evs, false)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range msgs {
		if _, err := js.PublishMsgAsync(m); err != nil {
			t.Fatal(err)
		}
		if i%2000 == 1999 || i == len(msgs)-1 {
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(2 * time.Minute):
				t.Fatal("bulk append not acknowledged within 2 minutes")
			}
		}
	}
}

// TestNoDecisionOnStaleState is the lag test of issue 15: an engine
// holding 100,000 sessions receives a session of 200,000 events of
// completed turns while it still folds them, with turn_deadline 10s and
// a worker running. The projector lags the log by more than the
// deadline, so every turn it folds is, by the wall clock, silent longer
// than that; but the log already holds each turn's end. At most one
// abandon_turn may be issued for the session (none at all, in fact: each
// decision is checked against the log before it is issued, and a session
// whose projection is far behind its log is not judged until it catches
// up). Before the check, 48,675 were.
func TestNoDecisionOnStaleState(t *testing.T) {
	if testing.Short() {
		t.Skip("the lag test appends 500,000 events: run without -short")
	}
	ctx := context.Background()
	srv := embeddedtest.Start(t)
	nc, js := embeddedtest.Connect(t, srv)
	policy, err := reconciler.ParsePolicy([]byte("turn_deadline: 10s\n"))
	if err != nil {
		t.Fatal(err)
	}
	var abandons atomic.Int64
	const tenant, big = "lag", "big"
	e, err := engine.Open(ctx, nc, engine.Config{Name: "e1", Policy: policy, RetentionEvery: -1,
		OnIssue: func(c recovery.Command) {
			if c.Kind == recovery.KindAbandonTurn && c.Session == big {
				abandons.Add(1)
			}
		}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = e.Close(cctx)
	})
	wnc, _ := embeddedtest.Connect(t, srv)
	w, err := worker.New(wnc, e.Log, worker.Config{Name: "w1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = w.Close(cctx)
	})
	pnc, pjs := embeddedtest.Connect(t, srv)
	_ = pnc
	plog, err := events.Open(ctx, pjs, events.Config{UseExisting: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(session, turn string, p events.Payload) events.Event {
		ev, err := events.New(tenant, session, turn, p)
		if err != nil {
			t.Fatal(err)
		}
		ev.Source = "urn:test:lag"
		return ev
	}

	start := time.Now()
	const sessions = 100_000
	for lo := 0; lo < sessions; lo += 10_000 {
		var evs []events.Event
		for i := lo; i < lo+10_000; i++ {
			s := fmt.Sprintf("s%06d", i)
			evs = append(evs, mk(s, "", &events.SessionStarted{Runtime: "lag"}))
		}
		bulk(t, pjs, plog, evs)
	}
	t.Logf("%d sessions appended in %s", sessions, time.Since(start).Round(time.Millisecond))
	start = time.Now()
	const turns = 50_000 // 4 events each: 200,000
	for lo := 0; lo < turns; lo += 5_000 {
		var evs []events.Event
		if lo == 0 {
			evs = append(evs, mk(big, "", &events.SessionStarted{Runtime: "lag"}))
		}
		for i := lo; i < lo+5_000; i++ {
			turn := fmt.Sprintf("t%06d", i)
			evs = append(evs,
				mk(big, turn, &events.TurnStarted{Prompt: "go"}),
				mk(big, turn, &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: events.BlockText, Text: "go " + turn}}}),
				mk(big, turn, &events.MessageAppended{Role: events.RoleAssistant, Content: []events.ContentBlock{{Type: events.BlockText, Text: "done " + turn}}}),
				mk(big, turn, &events.TurnCompleted{}))
		}
		bulk(t, pjs, plog, evs)
	}
	appended := time.Now()
	t.Logf("%d events of %s appended in %s", 4*turns+1, big, appended.Sub(start).Round(time.Millisecond))

	// Wait for the projector to fold it all, measuring the lag it had.
	var lag time.Duration
	deadline := time.Now().Add(5 * time.Minute)
	for {
		s, ok := e.Projector.Session(tenant, big)
		if ok && s.Totals.Turns == turns && len(s.InFlight) == 0 {
			lag = time.Since(appended)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session was not folded within 5 minutes (%v)", ok)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("folded %s after the last append (the lag), %d actions dropped as stale", lag.Round(time.Millisecond), e.Reconciler.Stale())
	if lag < 10*time.Second {
		t.Logf("the projector lagged less than the deadline: the test shows less than it can")
	}
	// Let ticks pass: nothing is in flight, nothing more may come.
	time.Sleep(3 * time.Second)
	cmds, err := recovery.SessionCommands(ctx, js, tenant, big)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range cmds {
		if c.Kind == recovery.KindAbandonTurn {
			n++
		}
	}
	if n > 1 || abandons.Load() > 1 {
		t.Fatalf("%d abandon_turn stored (%d issued) for a session whose turns all completed, want at most 1", n, abandons.Load())
	}
	s, err := projections.Restore(ctx, e.Log, e.Store, tenant, big)
	if err != nil {
		t.Fatal(err)
	}
	if s.Totals.AbandonedTurns != 0 || s.Totals.Violations != 0 {
		t.Fatalf("the session: %d abandoned turns, %d violations", s.Totals.AbandonedTurns, s.Totals.Violations)
	}
}
