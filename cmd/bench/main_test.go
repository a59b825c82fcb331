package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	if IsChild() { // the memory figure re-executes this test binary as its server
		if err := RunChild(); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	removeEngineBinary() // the engine the scaling figures built
	os.Exit(code)
}

// tinySizes run every benchmark in a few seconds.
func tinySizes(t *testing.T) Sizes {
	t.Helper()
	transcript := filepath.Join("..", "..", "..", "shared", "data", "transcripts", "claude-code", "spotter", "short.jsonl")
	if _, err := os.Stat(transcript); err != nil {
		t.Fatalf("the Claude Code transcript corpus is missing: want %s (shared/data beside the repository): %v", transcript, err)
	}
	return Sizes{
		AppendEvents: 600, AppendSessions: 50, AppendBatch: 100, AppendWriters: 2, AppendWarmup: 100, Runs: 1,
		SyncEvents: 120,
		FoldEvents: 300, FoldSessions: 30,
		RestoreSizes: []int{120, 400}, Restores: 3, DistillEvery: 100, InspectEvents: 500,
		Incidents:   3,
		MemSessions: 50, MemHeldSessions: 30,
		ImportPaths: []string{transcript}, CodexImportPaths: []string{filepath.Join("..", "..", "..", "shared", "data", "wild", "codex", "madshn__localpush", "sessions")},
		ScaleEvents: 300, NewSessions: 200, FleetSessions: 300,
		OTelEvents: 300,
	}
}

// TestRunProducesEveryFigure runs every benchmark on tiny sizes and checks
// that the report holds each figure of the table, with numbers, and
// that the markdown and JSON outputs carry them. It asserts nothing about
// speed: the machine is shared. The benchmarks run at once, each through a
// Main.Run of its own (its own servers and children, as Run gives it):
// most of a tiny figure's time is spent waiting for processes and servers
// to start, for the engine binary's build and for the projector's idle
// timers, and those waits overlap (76 s one after another under the race
// detector on 2 cores; the time of the longest, fleet or memory, at once).
// Each one's report is then checked in a subtest of its own.
func TestRunProducesEveryFigure(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several servers")
	}
	// Every figure but handover, whose SIGKILLs each wait the group's TTL
	// (5 s): pgroup's and engine's tests cover the takeover. The rows
	// each one gives.
	want := map[string]int{"append": 1, "ingest": 2, "fold": 1, "restore": 3, "inspect": 1, "incident": 2, "memory": 2, "import": 2, "sync": 1, "durability": 5,
		"scale": 1, "ingestscale": 1, "newsessions": 1, "fleet": 3, "otel": 2}
	var order []string
	for _, b := range Benchmarks {
		if _, ok := want[b]; ok {
			order = append(order, b)
		} else if b != "handover" {
			t.Errorf("benchmark %s: no expected row count here, so this test does not run it", b)
		}
	}
	if len(order) != len(want) {
		t.Fatalf("benchmarks %v, want rows for %v", Benchmarks, want)
	}
	sizes := tinySizes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	runs := make([]figureRun, len(order))
	var wg sync.WaitGroup
	for i, bench := range order {
		runs[i].jsonPath = filepath.Join(t.TempDir(), bench+".json")
		wg.Add(1)
		go func(fr *figureRun) {
			defer wg.Done()
			m := &Main{Stdout: &fr.stdout, Stderr: &fr.stderr, Sizes: sizes, JSONPath: fr.jsonPath, Only: []string{bench}}
			start := time.Now()
			fr.rep, fr.err = m.Run(ctx)
			fr.took = time.Since(start)
		}(&runs[i])
	}
	wg.Wait()
	for i, bench := range order {
		t.Run(bench, func(t *testing.T) { checkFigure(t, bench, want[bench], &runs[i]) })
	}
}

// figureRun is what one benchmark's Main.Run gave.
type figureRun struct {
	stdout, stderr bytes.Buffer
	jsonPath       string
	rep            *Report
	err            error
	took           time.Duration
}

// checkFigure checks one benchmark's run: its rows (wantRows of them,
// named bench), the markdown table and the JSON report.
func checkFigure(t *testing.T, bench string, wantRows int, fr *figureRun) {
	t.Logf("%s ran in %s:\n%s", bench, fr.took.Round(time.Millisecond), fr.stderr.String())
	if fr.err != nil {
		t.Fatalf("run: %v", fr.err)
	}
	rep, stdout, jsonPath := fr.rep, &fr.stdout, fr.jsonPath
	got := 0
	for _, row := range rep.Rows {
		if row.Bench == bench {
			got++
		}
		if row.Figure == "" || row.Value == "" || len(row.Metrics) == 0 {
			t.Errorf("row %+v: empty", row)
		}
		for k, v := range row.Metrics {
			if v < 0 && row.Bench != "memory" { // a tiny heap may shrink
				t.Errorf("%s %s: %s = %v", row.Bench, row.Figure, k, v)
			}
		}
		if row.Target != "" && row.Target != "printed" && row.Status != "PASS" && row.Status != "MISS" {
			t.Errorf("%s: target %q without a PASS or MISS", row.Figure, row.Target)
		}
	}
	if got != wantRows || len(rep.Rows) != wantRows {
		t.Errorf("%s: %d rows of its own, %d in all, want %d", bench, got, len(rep.Rows), wantRows)
	}
	for _, row := range rep.Rows {
		switch row.Bench {
		case "append", "ingest", "sync":
			if row.Metrics["turnstone_events_per_s"] <= 0 || row.Metrics["raw_events_per_s"] <= 0 || row.Ratio <= 0 {
				t.Errorf("%s: no rates: %+v", row.Bench, row.Metrics)
			}
		case "fold":
			if row.Metrics["fold_events_per_s"] <= 0 || row.Metrics["raw_events_per_s"] <= 0 {
				t.Errorf("fold: no rates: %+v", row.Metrics)
			}
		case "restore", "incident", "inspect":
			for k, v := range row.Metrics {
				if strings.HasSuffix(k, "_ms") && v <= 0 {
					t.Errorf("%s: %s = %v", row.Figure, k, v)
				}
			}
		case "memory":
			if s := row.Metrics["sessions"]; (s != 50 && s != 30) || row.Metrics["states_held"] != s {
				t.Errorf("memory: %+v", row.Metrics)
			}
		case "import":
			if row.Metrics["records"] <= 0 || row.Metrics["records_per_s"] <= 0 {
				t.Errorf("import: %+v", row.Metrics)
			}
		case "otel":
			if row.Metrics["on"] <= 0 && row.Metrics["spans_per_s"] <= 0 {
				t.Errorf("otel: no rates: %+v", row.Metrics)
			}
		}
	}
	table := stdout.String()
	if !strings.HasPrefix(table, "| # | figure |") || strings.Count(table, "\n| ") < len(rep.Rows)+1 {
		t.Errorf("markdown table:\n%s", table)
	}
	var fromJSON Report
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &fromJSON); err != nil || len(fromJSON.Rows) != len(rep.Rows) {
		t.Errorf("JSON report: %v, %d rows", err, len(fromJSON.Rows))
	}
}

func TestParseFlags(t *testing.T) {
	m := NewMain()
	m.Stderr = &bytes.Buffer{}
	if err := m.ParseFlags([]string{"--quick", "--only", "append,restore", "--json", "x.json"}); err != nil {
		t.Fatal(err)
	}
	if !m.Quick || m.Sizes.AppendEvents != QuickSizes().AppendEvents || len(m.Only) != 2 || m.JSONPath != "x.json" {
		t.Fatalf("parsed %+v", m)
	}
	if err := NewMain().ParseFlags([]string{"--only", "nope"}); err == nil {
		t.Fatal("--only nope: no error")
	}
}

// TestEngineBinaryIsRemoved checks that the engine the scaling figures
// build (45 MB) goes with removeEngineBinary, which the command and
// TestMain call as they end: each run used to leave one in the temporary
// directory.
func TestEngineBinaryIsRemoved(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/engine")
	}
	exe, err := engineBinary()
	if err != nil {
		t.Fatal(err)
	}
	again, err := engineBinary()
	if err != nil || again != exe {
		t.Fatalf("second engineBinary: %q, %v; want the first build, %q", again, err, exe)
	}
	if _, err := os.Stat(exe); err != nil {
		t.Fatal(err)
	}
	removeEngineBinary()
	if _, err := os.Stat(filepath.Dir(exe)); !os.IsNotExist(err) {
		t.Fatalf("%s after removeEngineBinary: %v, want it gone", filepath.Dir(exe), err)
	}
}
