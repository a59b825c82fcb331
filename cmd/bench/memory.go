package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/turnstone-dev/turnstone/internal/engine"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
)

// memoryFigure is figure 5: the engine's memory per tracked idle session.
// Each measurement runs in a child process of its own (memoryChild), and
// the server in another, so that the heap measured is the engine's alone
// (a projector and a reconciler, as `engine serve` runs them), not the
// server's nor what the benchmarks before it left behind. Sessions
// (session.started and one completed short turn each) are appended by
// another connection; once the projector has folded every event, the heap
// in use after a GC, less the heap in use before the sessions came, is
// divided by the sessions.
//
// It measures twice: MemSessions sessions with the projector's defaults
// (it keeps at most DefaultMaxSessions states, the least recently active
// leave first, and idle ones leave after DefaultIdleEvict), which is the
// issue's figure; and MemHeldSessions sessions with every state kept,
// which is what one state the projector holds costs.
func (r *runner) memoryFigure(ctx context.Context) error {
	if err := r.memoryRun(ctx, r.sizes.MemSessions, false); err != nil {
		return err
	}
	if r.sizes.MemHeldSessions > 0 {
		return r.memoryRun(ctx, r.sizes.MemHeldSessions, true)
	}
	return nil
}

func (r *runner) memoryRun(ctx context.Context, sessions int, holdAll bool) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	profile := r.memProfile
	if holdAll && profile != "" {
		profile += ".held"
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), childEnv+"=memory",
		fmt.Sprintf("%s=%d,%d,%t,%s", memEnv, sessions, r.sizes.AppendWriters, holdAll, profile))
	cmd.Stderr = r.out
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("memory child: %w", err)
	}
	var res memoryResult
	if err := json.Unmarshal(out, &res); err != nil {
		return fmt.Errorf("memory child: %w: %q", err, out)
	}
	// The child logged them as it went.
	r.rep.Rows = append(r.rep.Rows, res.Row)
	r.rep.Notes = append(r.rep.Notes, res.Notes...)
	return nil
}

// memEnv passes a memory measurement to its child: "sessions,writers,
// hold all,heap profile path".
const memEnv = "TURNSTONE_BENCH_MEMORY"

// memoryResult is what the memory child writes to stdout.
type memoryResult struct {
	Row   Row      `json:"row"`
	Notes []string `json:"notes"`
}

// memoryChild is the memory child's main.
func memoryChild() error {
	parts := strings.SplitN(os.Getenv(memEnv), ",", 4)
	if len(parts) != 4 {
		return fmt.Errorf("%s=%q: want sessions,writers,hold all,profile", memEnv, os.Getenv(memEnv))
	}
	sessions, _ := strconv.Atoi(parts[0])
	writers, _ := strconv.Atoi(parts[1])
	holdAll := parts[2] == "true"
	profile := parts[3]
	if profile != "" {
		runtime.MemProfileRate = 512 // fine-grained: the figure divides by the sessions
	}
	rep := &Report{}
	r := &runner{sizes: Sizes{AppendWriters: max(1, writers)}, out: os.Stderr, rep: rep, memProfile: profile}
	if err := r.memoryInProcess(context.Background(), sessions, holdAll); err != nil {
		return err
	}
	if len(rep.Rows) != 1 {
		return fmt.Errorf("memory figure: %d rows", len(rep.Rows))
	}
	return json.NewEncoder(os.Stdout).Encode(memoryResult{Row: rep.Rows[0], Notes: rep.Notes})
}

// memoryInProcess measures the engine's memory for n sessions in this
// process; holdAll makes the projector keep every state.
func (r *runner) memoryInProcess(ctx context.Context, n int, holdAll bool) error {
	srv, pid, err := childServer(false)
	if err != nil {
		return err
	}
	defer srv.close()

	ec, _, err := openLog(ctx, srv.url, "bench-engine")
	if err != nil {
		return err
	}
	defer ec.nc.Close()
	var applied atomic.Int64
	ecfg := engine.Config{OnApply: func(*projections.Session, events.Event, bool, []projections.Violation) { applied.Add(1) }}
	if holdAll {
		ecfg.MaxSessions, ecfg.IdleEvict = n+1, time.Hour
	}
	eng, err := engine.Open(ctx, ec.nc, ecfg, nil)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = eng.Close(cctx)
	}()
	proj := eng.Projector

	before := heap()
	rssBefore, srvBefore := rssBytes(0), rssBytes(pid)

	ac, al, err := openLog(ctx, srv.url, "bench-runtime")
	if err != nil {
		return err
	}
	start := time.Now()
	const perBatch = 100 // sessions per Append: 500 events
	batches := (n + perBatch - 1) / perBatch
	var next atomic.Int64
	err = parallel(r.sizes.AppendWriters, func(int) error {
		at := time.Now().UTC()
		for {
			b := int(next.Add(1) - 1)
			if b >= batches {
				return nil
			}
			var evs []events.Event
			for i := b * perBatch; i < min((b+1)*perBatch, n); i++ {
				evs = append(evs, idleSession(sessionName("m", i), at)...)
			}
			if _, err := al.Append(ctx, evs); err != nil {
				return err
			}
		}
	})
	ac.nc.Close()
	if err != nil {
		return fmt.Errorf("write the sessions: %w", err)
	}
	appended := time.Since(start)
	want := int64(n * 5)
	if err := waitUntil(ctx, 20*time.Minute, func() bool { return applied.Load() >= want }); err != nil {
		return fmt.Errorf("projector folding %d events (%d so far): %w", want, applied.Load(), err)
	}
	folded := time.Since(start)
	// Idle states go to compressed form after CompressAfter: the figure is
	// what an idle state costs once it is there.
	held0 := min(n, projections.DefaultMaxSessions)
	if holdAll {
		held0 = n
	}
	if err := waitUntil(ctx, 2*time.Minute, func() bool { return proj.Compressed() >= held0 }); err != nil {
		r.note("memory: %d of %d states in compressed form after 2 minutes", proj.Compressed(), held0)
	}
	compacted := proj.Compressed()

	after := heap()
	if r.memProfile != "" {
		f, err := os.Create(r.memProfile)
		if err != nil {
			return err
		}
		err = pprof.Lookup("heap").WriteTo(f, 0)
		f.Close()
		if err != nil {
			return err
		}
		r.note("memory: heap profile written to %s (go tool pprof -sample_index=inuse_space %s)", r.memProfile, r.memProfile)
	}
	rssAfter, srvAfter := rssBytes(0), rssBytes(pid)
	// How many states the projector holds (after the measurement: each
	// look-up makes a copy).
	held := 0
	for i := 0; i < n; i++ {
		if _, ok := proj.Session(benchTenant, sessionName("m", i)); ok {
			held++
		}
	}
	delta := float64(int64(after.HeapInuse) - int64(before.HeapInuse))
	inuse := delta / float64(n)
	alloc := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
	rss := float64(rssAfter-rssBefore) / float64(n)
	srvRSS := float64(srvAfter-srvBefore) / float64(n)
	perHeld := 0.0
	if held > 0 {
		perHeld = delta / float64(held)
	}
	row := Row{
		Bench: "memory",
		Metrics: map[string]float64{"sessions": float64(n), "states_held": float64(held), "heap_inuse_per_session": inuse,
			"heap_inuse_per_held_state": perHeld, "heap_alloc_per_session": alloc, "rss_per_session": rss,
			"server_rss_per_session": srvRSS, "append_s": appended.Seconds(), "fold_s": folded.Seconds(), "compacted": float64(compacted)},
	}
	if holdAll {
		row.Figure = fmt.Sprintf("engine heap per session state held, %s idle sessions, every state kept (MaxSessions %s, IdleEvict 1h; %s in compressed form)",
			commas(int64(n)), commas(int64(n+1)), commas(int64(compacted)))
		row.Value = fmt.Sprintf("%.2f KiB (HeapInuse)", perHeld/1024)
		row.Baseline = fmt.Sprintf("HeapAlloc %.2f KiB, RSS %.2f KiB per session", alloc/1024, rss/1024)
		row.Target = "<= 1 KiB"
		row.Status = status(perHeld <= 1024)
	} else {
		row.Figure = fmt.Sprintf("engine heap per tracked idle session, %s sessions, projector defaults (holds at most %s states; %s held)",
			commas(int64(n)), commas(projections.DefaultMaxSessions), commas(int64(held)))
		row.Value = fmt.Sprintf("%.2f KiB (HeapInuse)", inuse/1024)
		row.Baseline = fmt.Sprintf("HeapAlloc %.2f KiB, RSS %.2f KiB; %.2f KiB per state held", alloc/1024, rss/1024, perHeld/1024)
		row.Target = "< 2 KiB"
		row.Status = status(inuse < 2048)
	}
	r.add(row)
	r.note("memory (%s sessions%s): the projector folded them in %s (%.0f new sessions/s: each new session costs it a restore, a snapshot look-up and a log read); the NATS server's RSS grew %.2f KiB per session",
		commas(int64(n)), map[bool]string{true: ", every state kept", false: ""}[holdAll], folded.Round(time.Millisecond), float64(n)/folded.Seconds(), srvRSS/1024)
	return nil
}

// heap returns the memory statistics after two garbage collections.
func heap() runtime.MemStats {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m
}
