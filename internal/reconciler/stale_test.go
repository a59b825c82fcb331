package reconciler_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/clock"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/internal/reconciler"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// TestNoCommandOnStaleState hands the reconciler a state of a session
// taken before its turn ended (as a lagging projector, or an engine that
// just took the partition over, would), long past the deadline: the log
// already holds the turn's end, so no abandon_turn is issued, and none
// names the ended turn. The same state with nothing after it in the log
// is abandoned: the check drops only what the log contradicts.
func TestNoCommandOnStaleState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js, log := setUpLog(t)
	policy, err := reconciler.ParsePolicy([]byte("turn_deadline: 10s\n"))
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFakeClock(time.Now().Add(time.Hour)) // every deadline long past
	rec := reconciler.New(log, nil, reconciler.Config{Policy: policy, Clock: clk, Tick: time.Hour}, nil)
	if err := rec.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rec.Close(context.Background()) })

	// stale folds the session's first n events, as read from the log.
	stale := func(session string, n int) *projections.Session {
		t.Helper()
		s := &projections.Session{}
		i := 0
		err := log.ReadSession(ctx, "acme", session, events.ReadOptions{}, func(ev events.Event) error {
			if i++; i <= n {
				s.Apply(ev)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	add := func(session, turn string, p events.Payload) {
		t.Helper()
		ev, err := events.New("acme", session, turn, p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := log.Append(ctx, []events.Event{ev}); err != nil {
			t.Fatal(err)
		}
	}
	abandons := func(session string) int {
		t.Helper()
		cmds, err := recovery.SessionCommands(ctx, js, "acme", session)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, c := range cmds {
			if c.Kind == recovery.KindAbandonTurn {
				n++
			}
		}
		return n
	}
	for _, s := range []string{"ended", "silent"} {
		add(s, "", &events.SessionStarted{Runtime: "r"})
		add(s, "t1", &events.TurnStarted{Prompt: "go"})
	}
	add("ended", "t1", &events.TurnCompleted{})

	rec.Observe(stale("ended", 2), events.Event{}, true, nil)
	deadline := time.Now().Add(10 * time.Second)
	for rec.Stale() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the stale decision was not dropped")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := abandons("ended"); n != 0 {
		t.Fatalf("%d abandon_turn for a turn the log already ended", n)
	}
	rec.Observe(stale("silent", 2), events.Event{}, true, nil)
	for abandons("silent") != 1 {
		if time.Now().After(deadline) {
			t.Fatal("a silent turn past its deadline was not abandoned")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := rec.Stale(); n != 1 {
		t.Fatalf("%d decisions dropped, want only the stale one", n)
	}
}

// TestOnTickCountsEachPass: OnTick (the engine's reconciler_ticks_total)
// is called once at the end of each tick, and only then: a fake clock
// advanced by three ticks makes three calls.
func TestOnTickCountsEachPass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, log := setUpLog(t)
	clk := clock.NewFakeClock(time.Now())
	ticks := make(chan struct{}, 10)
	rec := reconciler.New(log, nil, reconciler.Config{Clock: clk, Tick: time.Minute, OnTick: func() { ticks <- struct{}{} }}, nil)
	if err := rec.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rec.Close(context.Background()) })
	for i := range 3 {
		// The loop's timer for the next tick is set once the last tick
		// ended: wait for it before advancing.
		deadline := time.Now().Add(10 * time.Second)
		for clk.Pending() == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("tick %d: the reconciler set no timer", i+1)
			}
			time.Sleep(time.Millisecond)
		}
		select {
		case <-ticks:
			t.Fatalf("tick %d: OnTick before the clock reached the tick", i+1)
		default:
		}
		clk.Advance(time.Minute)
		select {
		case <-ticks:
		case <-time.After(10 * time.Second):
			t.Fatalf("tick %d: no OnTick within 10 s of the clock reaching it", i+1)
		}
	}
}

// setUpLog starts an embedded server of the test's own and sets up the
// event log and the recovery stream on it, as engine setup would.
func setUpLog(t *testing.T) (jetstream.JetStream, *events.Log) {
	t.Helper()
	ctx := context.Background()
	_, js := embeddedtest.Connect(t, embeddedtest.Start(t))
	log, err := events.Open(ctx, js, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := recovery.Setup(ctx, log, recovery.DeliveryConfig{}); err != nil {
		t.Fatal(err)
	}
	return js, log
}
