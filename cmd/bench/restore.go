package main

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
)

// restoreTail is how many events the restored sessions hold after their
// last snapshot: about half of the projector's default SnapshotEvery, the
// mean tail a restore finds.
const restoreTail = projections.DefaultSnapshotEvery / 2

// restoreFigure is figure 3: the time projections.Restore takes (latest
// snapshot + the events after it) for one session of 1k, 10k and 100k
// events, p50 and p99 over Restores restores each; the target is p99 under
// 5 ms and flat across the sizes.
func (r *runner) restoreFigure(ctx context.Context) error {
	srv, err := startServer(false)
	if err != nil {
		return err
	}
	defer srv.close()
	c, l, err := openLog(ctx, srv.url, "bench-restore")
	if err != nil {
		return err
	}
	defer c.nc.Close()
	store, err := projections.NewSnapshotStore(c.js, projections.SnapshotConfig{})
	if err != nil {
		return err
	}
	sz := r.sizes
	type result struct {
		n             int
		p50, p99, max time.Duration
		snapBytes     int
	}
	var results []result
	for _, n := range sz.RestoreSizes {
		session := fmt.Sprintf("r%d", n)
		evs := sessionEvents(session, n, sz.DistillEvery)
		for i := 0; i < len(evs); i += 500 {
			if _, err := l.Append(ctx, evs[i:min(i+500, len(evs))]); err != nil {
				return fmt.Errorf("write session %s: %w", session, err)
			}
		}
		last, err := l.LastSeq(ctx, benchTenant, session)
		if err != nil {
			return err
		}
		// The snapshot the projector would have written: the state up to
		// restoreTail events before the end.
		tail := min(restoreTail, n-1)
		state := &projections.Session{}
		seen := 0
		err = l.ReadSession(ctx, benchTenant, session, events.ReadOptions{}, func(ev events.Event) error {
			if seen < n-tail {
				state.Apply(ev)
			}
			seen++
			return nil
		})
		if err != nil {
			return err
		}
		if err := store.Save(ctx, state); err != nil {
			return fmt.Errorf("save the snapshot of %s: %w", session, err)
		}
		snap, _ := json.Marshal(state)

		restore := func() (time.Duration, error) {
			start := time.Now()
			s, err := projections.Restore(ctx, l, store, benchTenant, session)
			d := time.Since(start)
			if err == nil && (s.LastSeq != last || s.Events != n) {
				err = fmt.Errorf("restored %s to seq %d with %d events, want %d and %d", session, s.LastSeq, s.Events, last, n)
			}
			return d, err
		}
		for i := 0; i < 10; i++ { // warm up
			if _, err := restore(); err != nil {
				return err
			}
		}
		runtime.GC()
		ds := make([]time.Duration, 0, sz.Restores)
		for i := 0; i < sz.Restores; i++ {
			d, err := restore()
			if err != nil {
				return err
			}
			ds = append(ds, d)
		}
		res := result{n: n, p50: percentile(ds, 50), p99: percentile(ds, 99), max: percentile(ds, 100), snapBytes: len(snap)}
		results = append(results, res)
		r.logf("   %d events: p50 %s p99 %s max %s, snapshot %d bytes, tail %d events", n, ms(res.p50), ms(res.p99), ms(res.max), len(snap), tail)
	}
	// Flat: the slowest size's p50 within 1.5x of the fastest's (medians:
	// p99s of a few hundred samples on a shared machine are too noisy to
	// compare).
	lo, hi := results[0].p50, results[0].p50
	for _, res := range results {
		lo, hi = min(lo, res.p50), max(hi, res.p50)
	}
	flat := float64(hi) <= 1.5*float64(lo)
	for _, res := range results {
		r.add(Row{
			Bench:  "restore",
			Figure: fmt.Sprintf("restore one session of %s events (snapshot of %s KiB + %d-event tail)", commas(int64(res.n)), commas(int64(res.snapBytes>>10)), min(restoreTail, res.n-1)),
			Value:  fmt.Sprintf("p50 %s, p99 %s", ms(res.p50), ms(res.p99)),
			Target: "p99 < 5 ms, flat",
			Status: status(res.p99 < 5*time.Millisecond && flat),
			Metrics: map[string]float64{"events": float64(res.n), "p50_ms": msf(res.p50), "p99_ms": msf(res.p99), "max_ms": msf(res.max),
				"snapshot_bytes": float64(res.snapBytes), "restores": float64(sz.Restores)},
		})
	}
	r.note("restore: p50 spread across sizes %.2fx (flat means <= 1.5x)", float64(hi)/float64(lo))
	return nil
}

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
