package forensics

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/correlate"
	"github.com/turnstone-dev/turnstone/projections"
)

// IncidentsConfig selects the sessions and signals Incidents correlates.
type IncidentsConfig struct {
	// Since keeps the signals at or after it, and the sessions whose last
	// event is (zero: all).
	Since time.Time
	// Tenant keeps one tenant's sessions (empty: all).
	Tenant string
	// Correlate sets the windows and what counts as open.
	Correlate correlate.Config
	// Workers is how many sessions are restored at once (default 8).
	Workers int
}

// Candidates are the summaries whose sessions can hold a signal: those
// the index marks anomalous (a violation, an orphan, an invalid event, a
// failed or abandoned turn, a parked or failed command, a flaky tool, a
// loop: Session.Anomalous), of cfg.Tenant, with a last event at or after
// cfg.Since. A session whose only errors the runtime recovered from by
// itself (error.recorded, then the turn completed) is not one.
func Candidates(all []projections.Summary, cfg IncidentsConfig) []projections.Summary {
	var out []projections.Summary
	for _, s := range all {
		if !s.Anomalous || (cfg.Tenant != "" && s.Tenant != cfg.Tenant) || (!cfg.Since.IsZero() && s.LastTime.Before(cfg.Since)) {
			continue
		}
		out = append(out, s)
	}
	return out
}

// Incidents correlates the incidents of the sessions of summaries (the
// fleet index, as projections.ReadIndex returns it): it restores each
// candidate session (Candidates) from its snapshot and tail, derives its
// signals and outcomes (correlate.FromSession), and correlates them. It
// never restores a session the index does not mark anomalous. Errors: the
// log's and the snapshot store's, wrapped; a session that vanished since
// the index was read (erased) is skipped.
func Incidents(ctx context.Context, log projections.SessionReader, store *projections.SnapshotStore, summaries []projections.Summary, cfg IncidentsConfig) ([]correlate.Incident, error) {
	got, err := collect(ctx, log, store, Candidates(summaries, cfg), cfg.Workers)
	if err != nil {
		return nil, err
	}
	var sigs []correlate.Signal
	var outs []correlate.Outcome
	for _, c := range got {
		sigs = append(sigs, c.sigs...)
		outs = append(outs, c.outs...)
	}
	return correlate.Correlate(since(sigs, cfg.Since), outs, cfg.Correlate), nil
}

// collect restores sessions, workers at a time, and derives their signals.
func collect(ctx context.Context, log projections.SessionReader, store *projections.SnapshotStore, sums []projections.Summary, workers int) (map[ref]cachedSignals, error) {
	if workers <= 0 {
		workers = 8
	}
	out := make(map[ref]cachedSignals, len(sums))
	if len(sums) == 0 {
		return out, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	jobs := make(chan projections.Summary)
	for range min(workers, len(sums)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for sum := range jobs {
				s, err := projections.Restore(ctx, log, store, sum.Tenant, sum.Session)
				if errors.Is(err, events.ErrSessionNotFound) {
					continue
				}
				mu.Lock()
				if err != nil {
					if first == nil {
						first = fmt.Errorf("incidents: %w", err)
						cancel()
					}
				} else {
					if s.Tenant == "" {
						s.Tenant, s.Session = sum.Tenant, sum.Session
					}
					sigs, outs := correlate.FromSession(s)
					out[ref{sum.Tenant, sum.Session}] = cachedSignals{lastSeq: sum.LastSeq, sigs: sigs, outs: outs}
				}
				mu.Unlock()
			}
		}()
	}
	for _, s := range sums {
		select {
		case jobs <- s:
		case <-ctx.Done():
		}
	}
	close(jobs)
	wg.Wait()
	return out, first
}

// since keeps the signals at or after t (all when t is zero).
func since(sigs []correlate.Signal, t time.Time) []correlate.Signal {
	if t.IsZero() {
		return sigs
	}
	out := sigs[:0:0]
	for _, s := range sigs {
		if !s.Time.Before(t) {
			out = append(out, s)
		}
	}
	return out
}

// OpenByClass counts the open incidents by their key's class.
func OpenByClass(incs []correlate.Incident) map[string]int {
	out := map[string]int{}
	for _, in := range incs {
		if in.Open {
			out[in.Key.Class]++
		}
	}
	return out
}
