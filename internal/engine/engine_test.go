package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/internal/engine"
	"github.com/turnstone-dev/turnstone/internal/telemetry"
	"github.com/turnstone-dev/turnstone/projections"
)

func openEngine(t *testing.T, nc *nats.Conn, name string) *engine.Engine {
	t.Helper()
	e, _ := openEngineWithMetrics(t, nc, name)
	return e
}

// openEngineWithMetrics is openEngine, with the engine's metrics.
func openEngineWithMetrics(t *testing.T, nc *nats.Conn, name string) (*engine.Engine, *telemetry.Metrics) {
	t.Helper()
	m := telemetry.NewMetrics("turnstone")
	e, err := engine.Open(context.Background(), nc, engine.Config{Name: name, Heartbeat: 100 * time.Millisecond, TTL: 600 * time.Millisecond, Metrics: m}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.Close(ctx)
	})
	return e, m
}

// pinMoves is how many times a partition's pin moved away from the engine
// of m (its held states dropped): turnstone_partition_pin_moves_total.
func pinMoves(t *testing.T, m *telemetry.Metrics) float64 {
	t.Helper()
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0.0
	for _, f := range families {
		if f.GetName() == "turnstone_partition_pin_moves_total" {
			for _, c := range f.GetMetric() {
				n += c.GetCounter().GetValue()
			}
		}
	}
	return n
}

func eventually(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// Two engines share the partitions; each session is folded by the engine
// that owns its partition, and the index summarises every session. When
// one engine dies, the other owns every partition within the group's
// bound and goes on from where the dead one stopped.
func TestEnginesShareThePartitionsAndTakeOver(t *testing.T) {
	// Not parallel: it bounds a handover in time, which other tests would take CPU from.
	srv := embeddedtest.Start(t)
	ncA, _ := embeddedtest.Connect(t, srv)
	ncB, _ := embeddedtest.Connect(t, srv)
	_, js := embeddedtest.Connect(t, srv)
	a, ma := openEngineWithMetrics(t, ncA, "a")
	b, mb := openEngineWithMetrics(t, ncB, "b")
	eventually(t, "4 partitions each", 5*time.Second, func() bool {
		return len(a.Partitions()) == 4 && len(b.Partitions()) == 4
	})

	ctx := context.Background()
	log, err := events.Open(ctx, js, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const sessions = 40
	appendTurn := func(round int) {
		for i := 0; i < sessions; i++ {
			s := fmt.Sprintf("s%02d", i)
			turn := fmt.Sprintf("t%d", round)
			var evs []events.Event
			for _, p := range []struct {
				turn string
				p    events.Payload
			}{{turn, &events.TurnStarted{Prompt: "go"}}, {turn, &events.TurnCompleted{}}} {
				ev, err := events.New("acme", s, p.turn, p.p)
				if err != nil {
					t.Fatal(err)
				}
				evs = append(evs, ev)
			}
			if _, err := log.Append(ctx, evs); err != nil {
				t.Fatal(err)
			}
		}
	}
	indexed := func(turns int) func() bool {
		return func() bool {
			sums, err := projections.ReadIndex(ctx, js, projections.IndexFilter{Tenant: "acme"})
			if err != nil || len(sums) != sessions {
				return false
			}
			for _, m := range sums {
				if m.Counts.TurnsTotal != turns || m.Status != projections.StatusIdle {
					return false
				}
			}
			return true
		}
	}
	appendTurn(1)
	eventually(t, "the index summarises every session", 10*time.Second, indexed(1))
	// A partition named twice is read once (a rescan that merged two
	// lists once named one twice, and every read of it failed).
	p0 := events.Partition("acme", "s00", log.Partitions())
	if sums, err := projections.ReadIndex(ctx, js, projections.IndexFilter{Partitions: []int{p0, p0}}); err != nil || len(sums) == 0 {
		t.Fatalf("the index of partition %d named twice: %d rows, %v", p0, len(sums), err)
	}

	// Each session is held by the engine of its partition only. The
	// owner may hold none of a partition whose consumer's pin moved (a
	// leader elected again under a starved CPU): it drops the states, and
	// refolds them from snapshots when asked.
	for i := 0; i < sessions; i++ {
		s := fmt.Sprintf("s%02d", i)
		p := events.Partition("acme", s, log.Partitions())
		_, inA := a.Projector.Session("acme", s)
		_, inB := b.Projector.Session("acme", s)
		owner, moves := "a", pinMoves(t, ma)
		if b.Member().Owns(p) {
			owner, moves = "b", pinMoves(t, mb)
		}
		switch {
		case inA && inB, inA && owner != "a", inB && owner != "b":
			t.Fatalf("session %s (partition %d, owner %s): held by a %v, by b %v", s, p, owner, inA, inB)
		case !inA && !inB && moves == 0:
			t.Fatalf("session %s (partition %d): held by neither engine, and no pin of owner %s moved", s, p, owner)
		case !inA && !inB:
			t.Logf("session %s (partition %d): held by neither engine; %v pins of owner %s moved", s, p, moves, owner)
		}
	}

	// a dies: its connection drops without leaving the group.
	ncA.Close()
	start := time.Now()
	eventually(t, "b owns every partition", 5*time.Second, func() bool { return len(b.Partitions()) == 8 })
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("takeover took %s, over the bound (TTL 600ms + heartbeats)", took)
	}
	appendTurn(2)
	eventually(t, "b folds what a would have", 15*time.Second, indexed(2))
	for i := 0; i < sessions; i++ {
		s := fmt.Sprintf("s%02d", i)
		got, err := b.Session(ctx, "acme", s)
		if err != nil {
			t.Fatal(err)
		}
		want, err := projections.Restore(ctx, log, nil, "acme", s)
		if err != nil {
			t.Fatal(err)
		}
		if got.LastSeq != want.LastSeq || got.Totals.Turns != want.Totals.Turns || got.Events != want.Events {
			t.Fatalf("%s: b's state (last seq %d, turns %d, events %d) differs from a fresh fold (%d, %d, %d)",
				s, got.LastSeq, got.Totals.Turns, got.Events, want.LastSeq, want.Totals.Turns, want.Events)
		}
	}
}

// Settings that were not asked for never change an existing stream: an
// engine restarted without --replicas keeps the stream's, and one asking
// for another value is refused unless it says --update-streams.
func TestRestartKeepsTheStreamsSettings(t *testing.T) {
	t.Parallel()
	srv := embeddedtest.Start(t)
	nc, js := embeddedtest.Connect(t, srv)
	ctx := context.Background()
	if _, err := events.Open(ctx, js, events.Config{DuplicateWindow: 7 * time.Minute}, nil); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Open(ctx, nc, engine.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.Log.Config().DuplicateWindow; got != 7*time.Minute {
		t.Fatalf("duplicate window %s after a restart without it, want 7m kept", got)
	}
	_ = e.Close(ctx)
	if _, err := engine.Open(ctx, nc, engine.Config{Log: events.Config{DuplicateWindow: time.Minute}}, nil); err == nil {
		t.Fatal("a differing setting was applied without UpdateStreams")
	}
	e, err = engine.Open(ctx, nc, engine.Config{Log: events.Config{DuplicateWindow: time.Minute, UpdateStreams: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	st, _ := js.Stream(ctx, events.EventsStream)
	if info, _ := st.Info(ctx); info.Config.Duplicates != time.Minute {
		t.Fatalf("duplicates %s, want 1m after --update-streams", info.Config.Duplicates)
	}
}

// TestUseExistingCreatesNoProjectorConsumer: an engine that may create
// nothing (UseExisting: engine serve --nats-url) refuses to open when a
// partition's projector consumer is missing, naming it (the error wraps
// jetstream.ErrConsumerNotFound, which engine serve turns into "run
// engine setup"), and creates none; and refuses one that reads another
// partition's events. Before, the projector created a missing consumer
// itself when it acquired the partition, with its own defaults. Once
// setup made them again, it opens.
func TestUseExistingCreatesNoProjectorConsumer(t *testing.T) {
	t.Parallel()
	srv := embeddedtest.Start(t)
	nc, js := embeddedtest.Connect(t, srv)
	ctx := context.Background()
	if _, err := engine.Setup(ctx, js, engine.SetupConfig{}, nil); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, events.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	missing := projections.ProjectorConsumerName("", 2)
	if err := st.DeleteConsumer(ctx, missing); err != nil {
		t.Fatal(err)
	}
	cfg := engine.Config{UseExisting: true, RetentionEvery: -1}
	if e, err := engine.Open(ctx, nc, cfg, nil); err == nil {
		_ = e.Close(ctx)
		t.Fatal("an engine with UseExisting opened without its projector consumer")
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("open without %s: %v, want jetstream.ErrConsumerNotFound naming it", missing, err)
	}
	if _, err := st.Consumer(ctx, missing); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("consumer %s after the refused open: %v, want still missing", missing, err)
	}

	// One that reads another partition's events.
	wrong := projections.ProjectorConsumerConfig(projections.ProjectorConfig{}, 2)
	wrong.FilterSubject = events.StoredPartitionFilter(3)
	if _, err := st.CreateConsumer(ctx, wrong); err != nil {
		t.Fatal(err)
	}
	if e, err := engine.Open(ctx, nc, cfg, nil); err == nil {
		_ = e.Close(ctx)
		t.Fatal("an engine with UseExisting opened with a consumer reading another partition")
	} else if !strings.Contains(err.Error(), missing+" filters") {
		t.Fatalf("open with %s reading partition 3: %v, want it named", missing, err)
	}

	if err := st.DeleteConsumer(ctx, missing); err != nil {
		t.Fatal(err)
	}
	if _, err := engine.Setup(ctx, js, engine.SetupConfig{}, nil); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Open(ctx, nc, cfg, nil)
	if err != nil {
		t.Fatalf("open after setup: %v", err)
	}
	_ = e.Close(ctx)
}
