package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
)

// Sizes are the sizes of one run. FullSizes is the run BENCHMARKS.md
// reports; QuickSizes finishes in under a minute.
type Sizes struct {
	// AppendEvents is how many events each side of the append figure
	// writes per run, over AppendSessions sessions, AppendBatch events per
	// call and AppendWriters concurrent writers (the same window for both
	// sides). Runs is how many runs of each side alternate; the median
	// counts. AppendWarmup events are written by each side first.
	AppendEvents   int
	AppendSessions int
	AppendBatch    int
	AppendWriters  int
	AppendWarmup   int
	Runs           int
	// Settle is the pause before each timed run of the append figures.
	Settle time.Duration
	// SyncEvents is AppendEvents for the figure with fsync before every
	// ack, and for each case of the durability table.
	SyncEvents int
	// FoldEvents over FoldSessions sessions are folded (and read raw).
	FoldEvents   int
	FoldSessions int
	// RestoreSizes are the session lengths (events) of the restore figure;
	// Restores how many restores of each are timed; DistillEvery how often
	// (events) the long sessions distil their history (0: never).
	RestoreSizes []int
	Restores     int
	DistillEvery int
	// InspectEvents is the length of the session the inspect figure
	// restores and encodes (it never distils).
	InspectEvents int
	// Incidents is how many sessions break an invariant one after another
	// (and again all at once) in the incident figure.
	Incidents int
	// MemSessions is how many idle sessions the memory figure tracks with
	// the projector's defaults; MemHeldSessions how many with every state
	// kept in memory (0: not measured).
	MemSessions     int
	MemHeldSessions int
	// ImportPaths are the transcript files or directories imported;
	// ImportSyncAlways imports them a second time with fsync on every ack.
	ImportPaths      []string
	ImportSyncAlways bool
	// ScaleEvents are folded by one engine, then by two sharing the
	// partitions (over FoldSessions sessions); Handovers is how many
	// SIGKILLs the handover figure times per kind; NewSessions how many
	// brand-new sessions the newsessions figure projects; FleetSessions
	// how many summaries the fleet figure reads.
	ScaleEvents   int
	Handovers     int
	NewSessions   int
	FleetSessions int
	// OTelEvents are folded by an engine with its OpenTelemetry export on
	// and off (over FoldSessions sessions), then backfilled.
	OTelEvents int
}

// DefaultTranscripts is where the shipped Claude Code transcripts are, from
// the repository's root.
const DefaultTranscripts = "../shared/data/transcripts/claude-code"

// FullSizes are the sizes of the run BENCHMARKS.md reports.
func FullSizes() Sizes {
	return Sizes{
		AppendEvents: 100_000, AppendSessions: 10_000, AppendBatch: 100, AppendWriters: 4, AppendWarmup: 20_000, Runs: 5, Settle: time.Second,
		SyncEvents: 20_000,
		FoldEvents: 100_000, FoldSessions: 10_000,
		RestoreSizes: []int{1_000, 10_000, 100_000}, Restores: 200, DistillEvery: 300, InspectEvents: 200_000,
		Incidents:   200,
		MemSessions: 100_000, MemHeldSessions: 20_000,
		ImportPaths: []string{DefaultTranscripts}, ImportSyncAlways: true,
		ScaleEvents: 100_000, Handovers: 10, NewSessions: 20_000, FleetSessions: 100_000,
		OTelEvents: 100_000,
	}
}

// QuickSizes are smaller sizes that finish in under a minute.
func QuickSizes() Sizes {
	return Sizes{
		AppendEvents: 20_000, AppendSessions: 10_000, AppendBatch: 100, AppendWriters: 4, AppendWarmup: 5_000, Runs: 3, Settle: 200 * time.Millisecond,
		SyncEvents: 2_000,
		FoldEvents: 20_000, FoldSessions: 2_000,
		RestoreSizes: []int{1_000, 5_000, 20_000}, Restores: 50, DistillEvery: 300, InspectEvents: 20_000,
		Incidents:   30,
		MemSessions: 5_000, MemHeldSessions: 2_000,
		ImportPaths: []string{DefaultTranscripts},
		ScaleEvents: 20_000, Handovers: 2, NewSessions: 5_000, FleetSessions: 20_000,
		OTelEvents: 20_000,
	}
}

// Benchmarks are the names --only takes, in the order they run.
var Benchmarks = []string{"append", "ingest", "fold", "restore", "inspect", "incident", "memory", "import", "sync", "durability",
	"scale", "handover", "newsessions", "fleet", "otel"}

// Row is one line of the results table.
type Row struct {
	// Bench is the benchmark that produced it (one of Benchmarks).
	Bench string `json:"bench"`
	// Figure says what was measured.
	Figure string `json:"figure"`
	// Value is the figure, formatted; Baseline what it is compared with
	// (empty when nothing).
	Value    string `json:"value"`
	Baseline string `json:"baseline,omitempty"`
	// Ratio is Value / Baseline where both are rates (0: none).
	Ratio float64 `json:"ratio,omitempty"`
	// Target is the target; Status is PASS, MISS or empty (no
	// target).
	Target string `json:"target,omitempty"`
	Status string `json:"status,omitempty"`
	// Metrics are the raw numbers behind Value and Baseline.
	Metrics map[string]float64 `json:"metrics"`
}

// Report is the result of a run.
type Report struct {
	Started time.Time `json:"started"`
	Elapsed string    `json:"elapsed"`
	Quick   bool      `json:"quick"`
	Machine Machine   `json:"machine"`
	Sizes   Sizes     `json:"sizes"`
	Rows    []Row     `json:"rows"`
	// Notes are observations worth keeping with the figures (what the
	// profile of a miss shows, counts of the workload).
	Notes []string `json:"notes,omitempty"`
}

// Machine describes where the run ran.
type Machine struct {
	CPUs      int    `json:"cpus"`
	CPUModel  string `json:"cpu_model"`
	MemoryGiB int    `json:"memory_gib"`
	Go        string `json:"go"`
	OS        string `json:"os"`
}

// Main is the bench command: its command (or ParseFlags), then Run.
type Main struct {
	Stdout, Stderr io.Writer
	Quick          bool
	// Only, when set, names the benchmarks to run (see Benchmarks).
	Only []string
	// JSONPath, when set, receives the report as JSON.
	JSONPath string
	// CPUProfile and MemProfile, when set, receive a CPU profile of the
	// whole run and a heap profile taken when the memory figure measures.
	CPUProfile, MemProfile string
	// Sizes are the sizes of the run (FullSizes unless Quick).
	Sizes Sizes

	transcripts string
	only        string // --only, split into Only
}

// NewMain returns a Main writing to os.Stdout and os.Stderr, with FullSizes.
func NewMain() *Main {
	return &Main{Stdout: os.Stdout, Stderr: os.Stderr, Sizes: FullSizes()}
}

// command returns the bench command: its flags set m's fields, and
// running it checks them (check) and runs m (Run).
func (m *Main) command() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench [--quick] [--only NAME,...] [--json FILE]",
		Short: "Measure Turnstone against raw JetStream",
		Long: `Measure Turnstone against raw JetStream on this machine, in one run, and
print each figure, its ratio to the baseline and its target, then a markdown
table for BENCHMARKS.md on stdout.

benchmarks: ` + strings.Join(Benchmarks, ", "),
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		PreRunE:       func(*cobra.Command, []string) error { return m.check() },
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := m.Run(cmd.Context())
			return err
		},
	}
	cmd.SetOut(m.Stdout)
	cmd.SetErr(m.Stderr)
	fs := cmd.Flags()
	fs.StringVar(&m.only, "only", "", "run only these benchmarks (comma-separated): "+strings.Join(Benchmarks, ", "))
	fs.BoolVar(&m.Quick, "quick", false, "smaller sizes: finishes in under a minute")
	fs.StringVar(&m.JSONPath, "json", "", "also write the report as JSON to FILE")
	fs.StringVar(&m.CPUProfile, "cpuprofile", "", "write a CPU profile of the run to FILE")
	fs.StringVar(&m.MemProfile, "memprofile", "", "write a heap profile, taken when the memory figure measures, to FILE")
	fs.StringVar(&m.transcripts, "transcripts", DefaultTranscripts, "Claude Code transcripts (file or directory) to import")
	return cmd
}

// ParseFlags reads the command line (without the program name) as the
// command does, without running it. It returns pflag.ErrHelp for -h and
// --help.
func (m *Main) ParseFlags(args []string) error {
	cmd := m.command()
	if err := cmd.ParseFlags(args); err != nil {
		return err
	}
	if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
		return err
	}
	return m.check()
}

// check validates the flags and sets the fields derived from them.
func (m *Main) check() error {
	if m.Quick {
		m.Sizes = QuickSizes()
	}
	m.Sizes.ImportPaths = []string{m.transcripts}
	if m.only != "" {
		for _, name := range strings.Split(m.only, ",") {
			name = strings.TrimSpace(name)
			if !slices.Contains(Benchmarks, name) {
				return fmt.Errorf("--only %q: not one of %s", name, strings.Join(Benchmarks, ", "))
			}
			m.Only = append(m.Only, name)
		}
	}
	return nil
}

// Run runs the benchmarks, writes their progress to Stderr and the table to
// Stdout, and returns the report. It stops at the first benchmark that
// fails.
func (m *Main) Run(ctx context.Context) (*Report, error) {
	rep := &Report{Started: time.Now().UTC(), Quick: m.Quick, Machine: machine(), Sizes: m.Sizes}
	if m.CPUProfile != "" {
		f, err := os.Create(m.CPUProfile)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, err
		}
		defer pprof.StopCPUProfile()
	}
	r := &runner{sizes: m.Sizes, out: &lockedWriter{w: m.Stderr}, rep: rep, memProfile: m.MemProfile}
	steps := map[string]func(context.Context) error{
		"append":      r.appendFigure,
		"ingest":      r.ingestFigure,
		"fold":        r.foldFigure,
		"restore":     r.restoreFigure,
		"inspect":     r.inspectFigure,
		"incident":    r.incidentFigure,
		"memory":      r.memoryFigure,
		"import":      r.importFigure,
		"sync":        r.syncFigure,
		"durability":  r.durabilityFigure,
		"scale":       r.scaleFigure,
		"handover":    r.handoverFigure,
		"newsessions": r.newSessionsFigure,
		"fleet":       r.fleetFigure,
		"otel":        r.otelFigure,
	}
	for _, name := range Benchmarks {
		if len(m.Only) > 0 && !slices.Contains(m.Only, name) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		r.logf("== %s", name)
		start := time.Now()
		if err := steps[name](ctx); err != nil {
			return rep, fmt.Errorf("%s: %w", name, err)
		}
		r.logf("   %s done in %s", name, time.Since(start).Round(time.Millisecond))
	}
	rep.Elapsed = time.Since(rep.Started).Round(time.Second).String()
	fmt.Fprint(m.Stdout, rep.Markdown())
	if m.JSONPath != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(m.JSONPath, append(b, '\n'), 0o644); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// runner holds what the benchmarks share.
type runner struct {
	sizes      Sizes
	out        io.Writer
	rep        *Report
	memProfile string
}

// lockedWriter serialises writes: child processes write their stderr to
// the runner's output from goroutines of their own.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (r *runner) logf(format string, args ...any) {
	fmt.Fprintf(r.out, format+"\n", args...)
}

func (r *runner) add(row Row) {
	r.rep.Rows = append(r.rep.Rows, row)
	line := fmt.Sprintf("   %s: %s", row.Figure, row.Value)
	if row.Baseline != "" {
		line += " vs " + row.Baseline
	}
	if row.Ratio != 0 {
		line += fmt.Sprintf(" = %.2f", row.Ratio)
	}
	if row.Target != "" {
		line += fmt.Sprintf(" (target %s: %s)", row.Target, row.Status)
	}
	r.logf("%s", line)
}

func (r *runner) note(format string, args ...any) {
	n := fmt.Sprintf(format, args...)
	r.rep.Notes = append(r.rep.Notes, n)
	r.logf("   note: %s", n)
}

func status(pass bool) string {
	if pass {
		return "PASS"
	}
	return "MISS"
}

// Markdown is the results table, then the notes.
func (rep *Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "| # | figure | Turnstone | baseline | ratio | target | result |\n| --- | --- | --- | --- | --- | --- | --- |\n")
	for _, row := range rep.Rows {
		ratio := ""
		if row.Ratio != 0 {
			ratio = fmt.Sprintf("%.2f", row.Ratio)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", row.Bench, row.Figure, row.Value, row.Baseline, ratio, row.Target, row.Status)
	}
	if len(rep.Notes) > 0 {
		b.WriteString("\n")
		for _, n := range rep.Notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
	}
	return b.String()
}

func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				m.CPUModel = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				var kb int64
				_, _ = fmt.Sscan(strings.TrimSpace(v), &kb)
				m.MemoryGiB = int((kb + 1<<19) >> 20)
			}
		}
	}
	return m
}

// errTimeout is returned when a benchmark waits too long for the engine.
var errTimeout = errors.New("timed out")

// rate is events per second.
func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// percentile is the p-th percentile (0..100) of ds, nearest rank.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.999999) - 1
	i = max(0, min(i, len(s)-1))
	return s[i]
}

// perSec formats a rate: "41,200/s".
func perSec(x float64) string { return commas(int64(x+0.5)) + "/s" }

func commas(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + commas(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }
