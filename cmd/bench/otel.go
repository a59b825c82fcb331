package main

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/engine"
	"github.com/turnstone-dev/turnstone/internal/otel"
	"github.com/turnstone-dev/turnstone/internal/otel/otlptest"
)

// otelFigure measures the OpenTelemetry export (internal/otel) beside raw
// JetStream and beside the engine without it, in one run:
//
//   - the engine's fold rate with the live export on and off: OTelEvents
//     events over FoldSessions sessions are stored, then an engine folds
//     them from its start, with its export (to a real OTLP receiver in
//     this process, over OTLP/HTTP) reading the same events through its
//     own consumers at the same time, or without it; on must stay at
//     least 0.9 of off;
//   - the backfill's spans exported per second (Backfill of every session
//     to the receiver), beside a raw ordered read of the same events.
func (r *runner) otelFigure(ctx context.Context) error {
	n := r.sizes.OTelEvents
	rcv, err := otlptest.New(false)
	if err != nil {
		return err
	}
	defer rcv.Stop()
	env := map[string]string{otel.EnvEndpoint: rcv.HTTP, otel.EnvScheduleDelay: "200"}
	xc, err := otel.ConfigFromEnv(func(k string) string { return env[k] })
	if err != nil {
		return err
	}
	// fold stores the workload in a fresh server, then times an engine
	// (its export on or off) folding it from its start.
	var backfillRun func() error
	fold := func(on bool) (float64, error) {
		srv, err := startServer(false)
		if err != nil {
			return 0, err
		}
		defer srv.close()
		c, l, err := openLog(ctx, srv.url, "bench-otel")
		if err != nil {
			return 0, err
		}
		defer c.nc.Close()
		if on {
			// The export's consumers exist before the events, as on an
			// engine that exported all along.
			if _, err := engine.Setup(ctx, c.js, events.Config{}, nil, engine.WithOTelExport()); err != nil {
				return 0, err
			}
		}
		evs := spreadEvents("o", n, r.sizes.FoldSessions)
		if _, err := appendConcurrently(ctx, l, evs, r.sizes.AppendBatch, r.sizes.AppendWriters); err != nil {
			return 0, err
		}
		settle(r.sizes.Settle)
		runtime.GC()
		cfg := engine.Config{Name: "bench"}
		before := rcv.SpanCount()
		if on {
			exp, err := otel.NewSpanExporter(ctx, xc)
			if err != nil {
				return 0, err
			}
			cfg.OTel = &engine.OTelConfig{Exporter: exp, Export: otel.ExporterConfig{Map: xc.Map, Batch: xc.Batch}}
		}
		start := time.Now()
		e, err := engine.Open(ctx, c.nc, cfg, nil)
		if err != nil {
			return 0, err
		}
		err = drained(ctx, c.js, l.Partitions(), 5*time.Minute)
		d := time.Since(start)
		if err == nil && on {
			// The export finishes too (it is not timed): every span arrives.
			err = waitUntil(ctx, 5*time.Minute, func() bool {
				lags, err := e.OTel.Lags(ctx)
				if err != nil {
					return false
				}
				for _, lag := range lags {
					if lag > 0 {
						return false
					}
				}
				return true
			})
			if err == nil {
				r.note("otel: the live export sent %d spans for %s events", rcv.SpanCount()-before, commas(int64(n)))
			}
		}
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_ = e.Close(cctx)
		cancel()
		if err != nil {
			return 0, err
		}
		if on && backfillRun == nil {
			backfillRun = func() error { return r.otelBackfill(ctx, l, c, xc, rcv, n) }
			if err := backfillRun(); err != nil {
				return 0, err
			}
		}
		return rate(n, d), nil
	}
	var ons, offs []float64
	for run := 0; run < r.sizes.Runs; run++ {
		order := []bool{true, false}
		if run%2 == 1 {
			order = []bool{false, true}
		}
		for _, on := range order {
			v, err := fold(on)
			if err != nil {
				return err
			}
			if on {
				ons = append(ons, v)
			} else {
				offs = append(offs, v)
			}
			r.logf("   fold with the export %v: %s", map[bool]string{true: "on", false: "off"}[on], perSec(v))
		}
	}
	on, off := median(ons), median(offs)
	ratio := on / off
	r.add(Row{Bench: "otel", Figure: fmt.Sprintf("engine fold rate with the live OpenTelemetry export on (%s events, %s sessions, from the engine's start)", commas(int64(n)), commas(int64(r.sizes.FoldSessions))),
		Value: perSec(on), Baseline: perSec(off) + " (export off)", Ratio: ratio, Target: "at least 0.9 of off", Status: passIf(ratio >= 0.9),
		Metrics: map[string]float64{"on": on, "off": off, "on_min": minf(ons), "on_max": maxf(ons), "off_min": minf(offs), "off_max": maxf(offs)},
	})
	return nil
}

// otelBackfill times Backfill of every session of l to rcv, beside a raw
// ordered read of the same n events.
func (r *runner) otelBackfill(ctx context.Context, l *events.Log, c *client, xc otel.ExportConfig, rcv *otlptest.Receiver, n int) error {
	refs, err := l.Sessions(ctx, benchTenant)
	if err != nil {
		return err
	}
	sessions := make([]otel.SessionRef, len(refs))
	for i, ref := range refs {
		sessions[i] = otel.SessionRef{Tenant: ref.Tenant, Session: ref.Session, Events: ref.Events}
	}
	exp, err := otel.NewSpanExporter(ctx, xc)
	if err != nil {
		return err
	}
	defer func() { _ = exp.Shutdown(context.Background()) }()
	runtime.GC()
	start := time.Now()
	stats, err := otel.Backfill(ctx, l, exp, sessions, otel.BackfillConfig{Map: xc.Map, Batch: xc.Batch})
	d := time.Since(start)
	if err != nil {
		return err
	}
	rd, got, err := readOrdered(ctx, c.js, n)
	if err != nil {
		return err
	}
	spans, evRate, raw := rate(stats.Spans, d), rate(stats.Events, d), rate(got, rd)
	r.add(Row{Bench: "otel", Figure: fmt.Sprintf("spans exported per second in backfill (%s sessions, %s events, %s spans, over OTLP/HTTP)", commas(int64(len(sessions))), commas(int64(stats.Events)), commas(int64(stats.Spans))),
		Value: perSec(spans), Baseline: perSec(raw) + " events raw read", Ratio: evRate / raw,
		Metrics: map[string]float64{"spans_per_s": spans, "events_per_s": evRate, "raw_events_per_s": raw, "seconds": d.Seconds()},
	})
	return nil
}
