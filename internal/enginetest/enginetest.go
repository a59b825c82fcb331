// Package enginetest runs a whole engine inside a test: a real embedded
// NATS server, the event log, the projector with the reconciler on a fake
// clk, a recovery worker, and the reference agent runtime, each on its
// own NATS connection as separate processes would be. Tests drive time
// with Clock.Advance.
package enginetest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/internal/clock"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/internal/engine"
	"github.com/turnstone-dev/turnstone/internal/presence"
	"github.com/turnstone-dev/turnstone/internal/reconciler"
	"github.com/turnstone-dev/turnstone/internal/worker"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
	"github.com/turnstone-dev/turnstone/refruntime"
)

// Options change the engine a test starts; the zero value is the defaults.
type Options struct {
	// Policy is the reconciler's policy file (YAML; empty: defaults).
	Policy string
	// Log configures the event log.
	Log events.Config
	// Runtime configures the reference runtime (Tenant defaults to "acme").
	Runtime refruntime.Config
	// MaxCommandBytes is the reconciler's (0: its default).
	MaxCommandBytes int
	// SnapshotEvery is the projector's (0: its default).
	SnapshotEvery int
	// RetentionEvery is the engine's retention sweep period (0: its
	// default; negative: off).
	RetentionEvery time.Duration
}

// Engine is a running engine in a test.
type Engine struct {
	URL        string
	JS         jetstream.JetStream
	Log        *events.Log
	Projector  *projections.Projector
	Reconciler *reconciler.Reconciler
	// Clock is the reconciler's clock; the worker's back-off waits pass at
	// once.
	Clock   *clock.FakeClock
	Runtime *refruntime.Runtime
	// Presence is the engine's runtime presence tracker (a round every
	// 200 ms).
	Presence *presence.Tracker
	// Engine is the engine itself.
	Engine *engine.Engine
	// Worker is the recovery worker.
	Worker *worker.Worker
	// NewRuntime starts another reference runtime (for another tenant)
	// on its own connection, closed at test end.
	NewRuntime func(tb testing.TB, cfg refruntime.Config) *refruntime.Runtime
}

// Start starts the engine and stops it in tb.Cleanup.
func Start(tb testing.TB, o Options) *Engine {
	tb.Helper()
	ctx := context.Background()
	srv := embeddedtest.Start(tb)
	nc, js := embeddedtest.Connect(tb, srv)
	policy, err := reconciler.ParsePolicy([]byte(o.Policy))
	if err != nil {
		tb.Fatal(err)
	}
	// The workers' delivery settings, as an operator sets them (engine
	// setup, their one writer): a command of a dead worker comes back
	// after 5 s. The engine's own setup keeps them.
	delivery := recovery.DeliveryConfig{AckWait: 5 * time.Second}
	if _, err := engine.Setup(ctx, js, engine.SetupConfig{Log: o.Log, Delivery: delivery}, nil); err != nil {
		tb.Fatal(err)
	}
	clk := clock.NewFakeClock(time.Now())
	eng, err := engine.Open(ctx, nc, engine.Config{Log: o.Log, Policy: policy, Clock: clk, MaxCommandBytes: o.MaxCommandBytes,
		SnapshotEvery: o.SnapshotEvery, RetentionEvery: o.RetentionEvery,
		Presence:  presence.Config{Interval: 200 * time.Millisecond, Wait: 200 * time.Millisecond},
		MapIngest: func(p int) error { return srv.AddMapping(ingest.IngestMapping(p)) }}, nil)
	if err != nil {
		tb.Fatal(err)
	}
	log := eng.Log
	wclock := clock.NewFakeClock(time.Now())
	wclock.SetAutoAdvance(true)
	wnc, _ := embeddedtest.Connect(tb, srv)
	wjs, _ := jetstream.New(wnc)
	wlog, err := events.Open(ctx, wjs, events.Config{}, nil)
	if err != nil {
		tb.Fatal(err)
	}
	w, err := worker.New(wnc, wlog, worker.Config{Name: "w", Clock: wclock, ControlTimeout: 2 * time.Second, Delivery: delivery}, nil)
	if err != nil {
		tb.Fatal(err)
	}
	if err := w.Open(ctx); err != nil {
		tb.Fatal(err)
	}
	rcfg := o.Runtime
	if rcfg.Tenant == "" {
		rcfg.Tenant = "acme"
	}
	rtnc, _ := embeddedtest.Connect(tb, srv)
	rt, err := refruntime.New(rtnc, log, rcfg, nil)
	if err != nil {
		tb.Fatal(err)
	}
	if err := rt.Open(ctx); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = rt.Close(c)
		_ = w.Close(c)
		_ = eng.Close(c)
	})
	newRuntime := func(tb testing.TB, cfg refruntime.Config) *refruntime.Runtime {
		tb.Helper()
		c, _ := embeddedtest.Connect(tb, srv)
		r, err := refruntime.New(c, log, cfg, nil)
		if err != nil {
			tb.Fatal(err)
		}
		if err := r.Open(ctx); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = r.Close(cctx)
		})
		return r
	}
	return &Engine{URL: srv.ClientURL(), JS: js, Log: log, Projector: eng.Projector, Reconciler: eng.Reconciler, Clock: clk, Runtime: rt,
		Presence: eng.Presence, Engine: eng, Worker: w, NewRuntime: newRuntime}
}

// State restores a session of the runtime's tenant from the log.
func (e *Engine) State(tb testing.TB, tenant, session string) *projections.Session {
	tb.Helper()
	s, err := projections.Restore(context.Background(), e.Log, nil, tenant, session)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// Eventually polls cond on the session's state (real time, up to 30 s),
// advancing the reconciler's clk by step each round so deadlines and
// ticks come due, and returns the state that met it; on time-out it logs
// the session's timeline and fails.
func (e *Engine) Eventually(tb testing.TB, what, tenant, session string, step time.Duration, cond func(*projections.Session) bool) *projections.Session {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		s := e.State(tb, tenant, session)
		if cond(s) {
			return s
		}
		e.Clock.Advance(step)
		time.Sleep(30 * time.Millisecond)
	}
	_ = e.Log.ReadSession(context.Background(), tenant, session, events.ReadOptions{}, func(ev events.Event) error {
		tb.Logf("%5d %-22s %s", ev.Seq, ev.Type, ev.Summary())
		return nil
	})
	tb.Fatalf("%s: not reached", what)
	return nil
}
