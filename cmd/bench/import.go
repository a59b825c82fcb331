package main

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/turnstone-dev/turnstone/internal/claudecode"
	"github.com/turnstone-dev/turnstone/internal/codex"
	"github.com/turnstone-dev/turnstone/internal/importer"
)

// importFigure is figure 6: importer.Import of the shipped Claude Code
// transcripts, then of the shipped Codex rollouts, into the log, records
// per second; with ImportSyncAlways a second time on a server that fsyncs
// every write before its ack.
func (r *runner) importFigure(ctx context.Context) error {
	files, err := claudecode.Expand(r.sizes.ImportPaths)
	if err != nil {
		return fmt.Errorf("transcripts %v (run from the repository root, or set --transcripts): %w", r.sizes.ImportPaths, err)
	}
	if len(files) == 0 {
		return fmt.Errorf("no *.jsonl transcript in %v (run from the repository root, or set --transcripts)", r.sizes.ImportPaths)
	}
	formats := []struct {
		f     importer.Format
		what  string
		files []string
	}{{claudecode.Format, "Claude Code transcript", files}}
	if len(r.sizes.CodexImportPaths) > 0 {
		rollouts, err := jsonlFiles(r.sizes.CodexImportPaths)
		if err != nil || len(rollouts) == 0 {
			return fmt.Errorf("Codex rollouts in %v (run from the repository root, or set --rollouts): %d files, %v", r.sizes.CodexImportPaths, len(rollouts), err)
		}
		formats = append(formats, struct {
			f     importer.Format
			what  string
			files []string
		}{codex.Format, "Codex rollout", rollouts})
	}
	modes := []bool{false}
	if r.sizes.ImportSyncAlways {
		modes = append(modes, true)
	}
	for _, syncAlways := range modes {
		for _, fm := range formats {
			if err := r.importOnce(ctx, fm.f, fm.what, fm.files, syncAlways); err != nil {
				return err
			}
		}
	}
	return nil
}

// importOnce imports files of format f on a fresh server and adds the row.
func (r *runner) importOnce(ctx context.Context, f importer.Format, what string, files []string, syncAlways bool) error {
	srv, err := startServer(syncAlways)
	if err != nil {
		return err
	}
	c, l, err := openLog(ctx, srv.url, "bench-import")
	if err != nil {
		srv.close()
		return err
	}
	rep, err := importer.Import(ctx, importer.LogStore(l), f, files, importer.Options{Tenant: benchTenant}, nil)
	c.nc.Close()
	srv.close()
	if err != nil {
		return err
	}
	if rep.Appended != rep.Events || len(rep.Diagnostics) > 0 {
		return fmt.Errorf("import appended %d of %d events, %d lines skipped", rep.Appended, rep.Events, len(rep.Diagnostics))
	}
	setting := "default sync interval"
	if syncAlways {
		setting = "fsync before every ack"
	}
	recs := rep.RecordsPerSecond()
	r.add(Row{
		Bench:    "import",
		Figure:   fmt.Sprintf("import %d %s files, %s records -> %s events (%s)", rep.Files, what, commas(int64(rep.Records)), commas(int64(rep.Events)), setting),
		Value:    perSec(recs) + " records",
		Baseline: fmt.Sprintf("%s events/s, %.2f s", commas(int64(rep.EventsPerSecond()+0.5)), rep.Elapsed.Seconds()),
		Target:   "printed",
		Metrics: map[string]float64{"records_per_s": recs, "events_per_s": rep.EventsPerSecond(), "records": float64(rep.Records),
			"events": float64(rep.Events), "seconds": rep.Elapsed.Seconds(), "files": float64(rep.Files)},
	})
	return nil
}

// jsonlFiles lists the *.jsonl files that paths name (a directory's at any
// depth, whatever their names), sorted.
func jsonlFiles(paths []string) ([]string, error) {
	var out []string
	for _, p := range paths {
		err := filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && strings.HasSuffix(q, ".jsonl") {
				out = append(out, q)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	if len(out) == 0 {
		if _, err := os.Stat(paths[0]); err != nil {
			return nil, err
		}
	}
	sort.Strings(out)
	return out, nil
}
