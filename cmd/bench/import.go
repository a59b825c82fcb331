package main

import (
	"context"
	"fmt"

	"github.com/turnstone-dev/turnstone/internal/claudecode"
)

// importFigure is figure 6: claudecode.Import of the shipped transcripts
// into the log, records per second; with ImportSyncAlways a second time on
// a server that fsyncs every write before its ack.
func (r *runner) importFigure(ctx context.Context) error {
	files, err := claudecode.Expand(r.sizes.ImportPaths)
	if err != nil {
		return fmt.Errorf("transcripts %v (run from the repository root, or set --transcripts): %w", r.sizes.ImportPaths, err)
	}
	if len(files) == 0 {
		return fmt.Errorf("no *.jsonl transcript in %v (run from the repository root, or set --transcripts)", r.sizes.ImportPaths)
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
		rep, err := claudecode.Import(ctx, claudecode.LogStore(l), files, claudecode.Options{Tenant: benchTenant}, nil)
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
