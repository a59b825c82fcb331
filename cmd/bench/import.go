package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/turnstone-dev/turnstone/claudecode"
	"github.com/turnstone-dev/turnstone/events"
)

// importFigure is figure 6: claudecode.Import of the shipped transcripts
// into the log, records per second; with ImportSyncAlways a second time on
// a server that fsyncs every write before its ack.
func (r *runner) importFigure(ctx context.Context) error {
	files, err := claudecode.Expand(r.sizes.ImportPaths)
	if err != nil {
		return fmt.Errorf("transcripts %v (run from the repository root, or set -transcripts): %w", r.sizes.ImportPaths, err)
	}
	if len(files) == 0 {
		return fmt.Errorf("no *.jsonl transcript in %v (run from the repository root, or set -transcripts)", r.sizes.ImportPaths)
	}
	modes := []bool{false}
	if r.sizes.ImportSyncAlways {
		modes = append(modes, true)
	}
	for _, syncAlways := range modes {
		srv, err := startServer(syncAlways)
		if err != nil {
			return err
		}
		c, l, err := openLog(ctx, srv.url, "bench-import")
		if err != nil {
			srv.close()
			return err
		}
		rep, err := claudecode.Import(ctx, logStore{l}, files, claudecode.Options{Tenant: benchTenant}, nil)
		c.nc.Close()
		srv.close()
		if err != nil {
			return err
		}
		if rep.Appended != rep.Events {
			return fmt.Errorf("import appended %d of %d events", rep.Appended, rep.Events)
		}
		setting := "default sync interval"
		if syncAlways {
			setting = "fsync before every ack"
		}
		recs := float64(rep.Records) / rep.Elapsed.Seconds()
		r.add(Row{
			Bench:    "import",
			Figure:   fmt.Sprintf("import %d transcript files, %s records -> %s events (%s)", rep.Files, commas(int64(rep.Records)), commas(int64(rep.Events)), setting),
			Value:    perSec(recs) + " records",
			Baseline: fmt.Sprintf("%s events/s, %.2f s", commas(int64(rep.EventsPerSecond()+0.5)), rep.Elapsed.Seconds()),
			Target:   "printed",
			Metrics: map[string]float64{"records_per_s": recs, "events_per_s": rep.EventsPerSecond(), "records": float64(rep.Records),
				"events": float64(rep.Events), "seconds": rep.Elapsed.Seconds(), "files": float64(rep.Files)},
		})
	}
	return nil
}

// logStore adapts the event log to the importer's Store, as `engine
// import` does.
type logStore struct{ log *events.Log }

func (s logStore) Append(ctx context.Context, evs []events.Event) error {
	_, err := s.log.Append(ctx, evs)
	return err
}

func (s logStore) EventIDs(ctx context.Context, tenant, session string) (map[string]struct{}, error) {
	ids := map[string]struct{}{}
	err := s.log.ReadSession(ctx, tenant, session, events.ReadOptions{}, func(ev events.Event) error {
		if ev.ID != "" {
			ids[ev.ID] = struct{}{}
		}
		return nil
	})
	if errors.Is(err, events.ErrSessionNotFound) {
		return ids, nil
	}
	return ids, err
}
