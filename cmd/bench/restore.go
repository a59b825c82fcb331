package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/nats-io/nats.go"
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
// 5 ms and flat across the sizes. Its baseline, timed in turns with it, is
// what JetStream alone takes to hand over the same bytes (rawRestore): a
// direct get of the snapshot and a batched direct get of the tail, with no
// decoding. It also reports the snapshot's stored size at each length
// against its bound, projections.MaxSnapshotBytes of JSON.
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
		n                   int
		p50, p99, max       time.Duration
		raw50, raw99        time.Duration
		snapBytes, snapJSON int
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
		stored, err := projections.EncodeSnapshot(state, time.Now())
		if err != nil {
			return err
		}
		snap, err := json.Marshal(state)
		if err != nil {
			return err
		}
		subject, covers := l.SessionSubject(benchTenant, session), state.LastSeq

		restore := func() (time.Duration, error) {
			start := time.Now()
			s, err := projections.Restore(ctx, l, store, benchTenant, session)
			d := time.Since(start)
			if err == nil && (s.LastSeq != last || s.Events != n) {
				err = fmt.Errorf("restored %s to seq %d with %d events, want %d and %d", session, s.LastSeq, s.Events, last, n)
			}
			return d, err
		}
		raw := func() (time.Duration, error) {
			start := time.Now()
			k, err := rawRestore(ctx, c.nc, session, subject, covers)
			d := time.Since(start)
			if err == nil && k != tail {
				err = fmt.Errorf("raw read of %s's tail: %d messages, want %d", session, k, tail)
			}
			return d, err
		}
		for i := 0; i < 10; i++ { // warm up
			if _, err := restore(); err != nil {
				return err
			}
			if _, err := raw(); err != nil {
				return err
			}
		}
		runtime.GC()
		ds := make([]time.Duration, 0, sz.Restores)
		raws := make([]time.Duration, 0, sz.Restores)
		for i := 0; i < sz.Restores; i++ {
			d, err := restore()
			if err != nil {
				return err
			}
			ds = append(ds, d)
			if d, err = raw(); err != nil {
				return err
			}
			raws = append(raws, d)
		}
		res := result{n: n, p50: percentile(ds, 50), p99: percentile(ds, 99), max: percentile(ds, 100),
			raw50: percentile(raws, 50), raw99: percentile(raws, 99), snapBytes: len(stored), snapJSON: len(snap)}
		results = append(results, res)
		r.logf("   %d events: p50 %s p99 %s max %s (raw p50 %s p99 %s), snapshot %d bytes stored (%d of JSON), tail %d events",
			n, ms(res.p50), ms(res.p99), ms(res.max), ms(res.raw50), ms(res.raw99), len(stored), len(snap), tail)
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
			Bench:    "restore",
			Figure:   fmt.Sprintf("restore one session of %s events (snapshot of %s KiB stored + %d-event tail)", commas(int64(res.n)), commas(int64(res.snapBytes>>10)), min(restoreTail, res.n-1)),
			Value:    fmt.Sprintf("p50 %s, p99 %s", ms(res.p50), ms(res.p99)),
			Baseline: fmt.Sprintf("p50 %s, p99 %s raw direct gets of the same bytes", ms(res.raw50), ms(res.raw99)),
			Target:   "p99 < 5 ms, flat",
			Status:   status(res.p99 < 5*time.Millisecond && flat),
			Metrics: map[string]float64{"events": float64(res.n), "p50_ms": msf(res.p50), "p99_ms": msf(res.p99), "max_ms": msf(res.max),
				"raw_p50_ms": msf(res.raw50), "raw_p99_ms": msf(res.raw99),
				"snapshot_bytes": float64(res.snapBytes), "snapshot_json_bytes": float64(res.snapJSON), "restores": float64(sz.Restores)},
		})
	}
	r.note("restore: p50 spread across sizes %.2fx (flat means <= 1.5x)", float64(hi)/float64(lo))
	// The snapshot's size: bounded (MaxSnapshotBytes of JSON, which the
	// state's Keep* limits keep it under) and flat once the kept lists
	// are full.
	big := results[len(results)-1]
	bounded := true
	for _, res := range results {
		bounded = bounded && res.snapJSON <= projections.MaxSnapshotBytes
	}
	r.add(Row{
		Bench:    "restore",
		Figure:   fmt.Sprintf("snapshot of the longest session (%s events), stored (S2) and as JSON", commas(int64(big.n))),
		Value:    fmt.Sprintf("%.1f KiB stored, %.1f KiB JSON", float64(big.snapBytes)/1024, float64(big.snapJSON)/1024),
		Baseline: fmt.Sprintf("%.1f KiB stored at %s events", float64(results[0].snapBytes)/1024, commas(int64(results[0].n))),
		Target:   fmt.Sprintf("JSON <= %d KiB (MaxSnapshotBytes)", projections.MaxSnapshotBytes>>10),
		Status:   status(bounded),
		Metrics: map[string]float64{"events": float64(big.n), "snapshot_bytes": float64(big.snapBytes), "snapshot_json_bytes": float64(big.snapJSON),
			"bound_bytes": projections.MaxSnapshotBytes},
	})
	return nil
}

// rawRestore is the restore figure's baseline: the bytes a restore of
// session reads, handed over by JetStream and not decoded. One direct get
// of the latest message on the session's snapshot subject, then batched
// direct gets (JetStream ADR-31) of its events on subject after covers.
// It returns how many events it received.
func rawRestore(ctx context.Context, nc *nats.Conn, session, subject string, covers uint64) (int, error) {
	if _, err := rawDirectGet(ctx, nc, events.SnapshotsStream, map[string]any{"last_by_subj": events.SnapshotSubject(benchTenant, session)}); err != nil {
		return 0, fmt.Errorf("snapshot: %w", err)
	}
	// The tail is restoreTail events: one batch holds it.
	const batch = 512
	k, err := rawDirectGet(ctx, nc, events.EventsStream, map[string]any{"seq": covers + 1, "next_by_subj": subject, "batch": batch})
	if err == nil && k == batch {
		err = errors.New("tail longer than one batch")
	}
	return k, err
}

// rawDirectGet sends one direct get request to stream and reads its
// replies (one message, or a batch ended by a status reply), touching
// each body. It returns how many messages came.
func rawDirectGet(ctx context.Context, nc *nats.Conn, stream string, req map[string]any) (int, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return 0, err
	}
	replies := make(chan *nats.Msg, 600)
	inbox := nats.NewInbox()
	sub, err := nc.ChanSubscribe(inbox, replies)
	if err != nil {
		return 0, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest("$JS.API.DIRECT.GET."+stream, inbox, body); err != nil {
		return 0, err
	}
	_, batched := req["batch"]
	timer := time.NewTimer(5 * time.Second)
	defer timer.Stop()
	got := 0
	for {
		select {
		case m := <-replies:
			if st := m.Header.Get("Status"); st != "" {
				if got == 0 && st != "204" {
					return 0, fmt.Errorf("direct get: status %s %s", st, m.Header.Get("Description"))
				}
				return got, nil
			}
			if len(m.Data) == 0 {
				return got, errors.New("direct get: an empty message")
			}
			got++
			if !batched {
				return got, nil
			}
		case <-timer.C:
			return got, errors.New("direct get: timed out")
		case <-ctx.Done():
			return got, ctx.Err()
		}
	}
}

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
