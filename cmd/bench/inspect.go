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

// inspectFigure is the latency of `engine inspect --json` on one long
// session (issue 9: a 200,000-event session took 4.2 s and 248 MB when its
// snapshots were too large to store): its snapshot and the tail after it
// restored (projections.Restore), then the state encoded as JSON, p50 and
// p99 over Restores runs, with the bytes allocated per run; against
// folding the whole session from its first event (what a restore cost
// when no snapshot could be stored), once. The session never distils, so
// its history only grows: the state's bounds (docs/limits.md) are what
// keep the snapshot small. The target is under 1 s.
func (r *runner) inspectFigure(ctx context.Context) error {
	n := r.sizes.InspectEvents
	srv, err := startServer(false)
	if err != nil {
		return err
	}
	defer srv.close()
	c, l, err := openLog(ctx, srv.url, "bench-inspect")
	if err != nil {
		return err
	}
	defer c.nc.Close()
	store, err := projections.NewSnapshotStore(c.js, projections.SnapshotConfig{})
	if err != nil {
		return err
	}
	session := fmt.Sprintf("long%d", n)
	evs := sessionEvents(session, n, 0)
	for i := 0; i < len(evs); i += 500 {
		if _, err := l.Append(ctx, evs[i:min(i+500, len(evs))]); err != nil {
			return fmt.Errorf("write session %s: %w", session, err)
		}
	}
	evs = nil
	// The snapshot the projector would have written, restoreTail events
	// before the end.
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
	snap, err := json.Marshal(projections.Snapshot{Version: projections.Version, CoversSeq: state.LastSeq, State: state})
	if err != nil {
		return err
	}

	inspect := func(store *projections.SnapshotStore) (time.Duration, uint64, error) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		start := time.Now()
		s, err := projections.Restore(ctx, l, store, benchTenant, session)
		if err == nil {
			_, err = json.Marshal(s)
		}
		d := time.Since(start)
		runtime.ReadMemStats(&after)
		if err == nil && s.Events != n {
			err = fmt.Errorf("restored %s with %d events, want %d", session, s.Events, n)
		}
		return d, after.TotalAlloc - before.TotalAlloc, err
	}
	full, fullAlloc, err := inspect(nil)
	if err != nil {
		return err
	}
	for range 3 { // warm up
		if _, _, err := inspect(store); err != nil {
			return err
		}
	}
	runs := max(r.sizes.Restores/10, 5)
	ds := make([]time.Duration, 0, runs)
	var alloc uint64
	for range runs {
		d, a, err := inspect(store)
		if err != nil {
			return err
		}
		ds = append(ds, d)
		alloc = max(alloc, a)
	}
	p50, p99 := percentile(ds, 50), percentile(ds, 99)
	r.add(Row{
		Bench:    "inspect",
		Figure:   fmt.Sprintf("inspect one session of %s events (snapshot of %s KiB + %d-event tail, encoded as JSON)", commas(int64(n)), commas(int64(len(snap)>>10)), tail),
		Value:    fmt.Sprintf("p50 %s, p99 %s, %s KiB allocated", ms(p50), ms(p99), commas(int64(alloc>>10))),
		Baseline: fmt.Sprintf("every event folded: %s, %s MiB allocated", ms(full), commas(int64(fullAlloc>>20))),
		Target:   "< 1 s",
		Status:   status(p99 < time.Second),
		Metrics: map[string]float64{"events": float64(n), "p50_ms": msf(p50), "p99_ms": msf(p99), "alloc_bytes": float64(alloc),
			"full_fold_ms": msf(full), "full_fold_alloc_bytes": float64(fullAlloc), "snapshot_bytes": float64(len(snap)),
			"max_snapshot_bytes": projections.MaxSnapshotBytes, "runs": float64(runs)},
	})
	return nil
}
