package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/pprof"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
)

// foldFigure is figure 2: events folded per second when every session is
// rebuilt from the log (Log.ReadAll, each event applied to its session's
// state), against a raw ordered consumer that only receives the bytes of
// the same stream.
func (r *runner) foldFigure(ctx context.Context) error {
	srv, err := startServer(false)
	if err != nil {
		return err
	}
	defer srv.close()
	c, l, err := openLog(ctx, srv.url, "bench-fold")
	if err != nil {
		return err
	}
	defer c.nc.Close()
	sz := r.sizes
	evs := spreadEvents("f", sz.FoldEvents, sz.FoldSessions)
	if _, err := appendConcurrently(ctx, l, evs, sz.AppendBatch, sz.AppendWriters); err != nil {
		return fmt.Errorf("write the log: %w", err)
	}
	n := len(evs)
	evs = nil

	var foldCPU, rawCPU []float64 // CPU-µs of the process per event, by run
	fold := func() (float64, int, error) {
		states := map[string]*projections.Session{}
		got := 0
		cpu0 := cpuTime()
		start := time.Now()
		var err error
		pprof.Do(ctx, pprof.Labels("side", "fold"), func(ctx context.Context) {
			err = l.ReadAll(ctx, events.ReadOptions{}, func(ev events.Event) error {
				// The look-up's key is built on the stack; only a new
				// session's is kept.
				s := states[ev.Tenant+"/"+ev.Session]
				if s == nil {
					s = &projections.Session{}
					states[ev.Tenant+"/"+ev.Session] = s
				}
				s.Apply(ev)
				got++
				return nil
			})
		})
		d := time.Since(start)
		foldCPU = append(foldCPU, perEventMicros(cpuTime()-cpu0, got))
		if err == nil && got != n {
			err = fmt.Errorf("folded %d events, want %d", got, n)
		}
		return rate(got, d), len(states), err
	}
	raw := func() (float64, error) {
		cpu0 := cpuTime()
		var d time.Duration
		var got int
		var err error
		pprof.Do(ctx, pprof.Labels("side", "raw"), func(ctx context.Context) { d, got, err = readOrdered(ctx, c.js, n) })
		rawCPU = append(rawCPU, perEventMicros(cpuTime()-cpu0, got))
		return rate(got, d), err
	}
	// Warm up both (the server's block cache, the client's buffers).
	if _, _, err := fold(); err != nil {
		return err
	}
	if _, err := raw(); err != nil {
		return err
	}
	var folds, raws []float64
	sessions := 0
	for run := 0; run < sz.Runs; run++ {
		order := []bool{true, false}
		if run%2 == 1 {
			order = []bool{false, true}
		}
		for _, isFold := range order {
			runtime.GC()
			if isFold {
				v, s, err := fold()
				if err != nil {
					return err
				}
				sessions = s
				folds = append(folds, v)
				r.logf("   run %d fold %s (%.1f CPU-µs/event)", run+1, perSec(v), foldCPU[len(foldCPU)-1])
			} else {
				v, err := raw()
				if err != nil {
					return err
				}
				raws = append(raws, v)
				r.logf("   run %d raw  %s (%.1f CPU-µs/event)", run+1, perSec(v), rawCPU[len(rawCPU)-1])
			}
		}
	}
	f, rw := median(folds), median(raws)
	r.add(Row{
		Bench:    "fold",
		Figure:   fmt.Sprintf("events folded/s rebuilding all %s sessions (ReadAll + Apply), %s events", commas(int64(sessions)), commas(int64(n))),
		Value:    perSec(f),
		Baseline: perSec(rw) + " raw ordered consumer",
		Ratio:    f / rw,
		Target:   ">= 0.7",
		Status:   status(f/rw >= 0.7),
		Metrics: map[string]float64{"fold_events_per_s": f, "raw_events_per_s": rw, "ratio": f / rw, "events": float64(n), "sessions": float64(sessions),
			"fold_min": minf(folds), "fold_max": maxf(folds), "raw_min": minf(raws), "raw_max": maxf(raws),
			// The process's CPU (client and embedded server) per event.
			"fold_cpu_us_per_event": median(foldCPU), "raw_cpu_us_per_event": median(rawCPU)},
	})
	return nil
}

// perEventMicros is d in microseconds per event of n.
func perEventMicros(d time.Duration, n int) float64 {
	if n == 0 {
		return 0
	}
	return float64(d.Microseconds()) / float64(n)
}

// readOrdered reads the first n messages of AGENT_EVENTS with an ordered
// consumer, touching each body, and returns the time it took.
func readOrdered(ctx context.Context, js jetstream.JetStream, n int) (time.Duration, int, error) {
	start := time.Now()
	cons, err := js.OrderedConsumer(ctx, events.EventsStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{events.EventSubjectPrefix + ".>"}})
	if err != nil {
		return 0, 0, err
	}
	it, err := cons.Messages()
	if err != nil {
		return 0, 0, err
	}
	defer it.Stop()
	got, bytes := 0, 0
	for got < n {
		msg, err := it.Next()
		if err != nil {
			return 0, got, fmt.Errorf("ordered consumer after %d messages: %w", got, err)
		}
		bytes += len(msg.Data())
		got++
	}
	d := time.Since(start)
	if bytes == 0 {
		return d, got, fmt.Errorf("ordered consumer read no bytes")
	}
	return d, got, nil
}
