package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/internal/engine"
	"github.com/turnstone-dev/turnstone/internal/ingestserver"
	"github.com/turnstone-dev/turnstone/internal/pgroup"
	"github.com/turnstone-dev/turnstone/internal/worker"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// The figures of issue 9 (engines and workers sharing the partitions):
//
//   - "scale": events folded per second by one engine, and by two engines
//     sharing the partitions, each engine a process of its own, with each
//     process's CPU time (on 2 cores two engines mostly share the CPU: the
//     figure says so rather than hides it);
//   - "handover": how long after a SIGKILL of an engine (and of a worker)
//     the survivor owns every partition, p50 and p99;
//   - "newsessions": brand-new sessions projected per second (one event
//     each; target at least 5,000/s);
//   - "fleet": `engine sessions` (the fleet index read) at 100,000 sessions
//     (target under 1 s), and how long an engine takes to be ready with
//     that fleet (target under 5 s).

// memberEnv passes a member child its NATS URL and name: "url,name".
const memberEnv = "TURNSTONE_BENCH_MEMBER"

// memberChild runs an engine ("engine") or a worker ("worker") until its
// stdin closes; it writes "ready" and a newline once it joined its group.
func memberChild(kind string) error {
	url, name, _ := strings.Cut(os.Getenv(memberEnv), ",")
	nc, err := nats.Connect(url, nats.Name("bench-"+kind))
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx := context.Background()
	var stop func(context.Context) error
	var stats memberStats
	switch kind {
	case "engine":
		e, err := engine.Open(ctx, nc, engine.Config{Name: name, UseExisting: true, Ingest: ingestserver.Config{
			OnReceive: func(_, bytes int, mapped bool) {
				if mapped {
					stats.Requests.Add(1)
					stats.Bytes.Add(int64(bytes))
				} else {
					stats.Unmapped.Add(1)
				}
			}}}, nil)
		if err != nil {
			return err
		}
		stop = e.Close
	case "worker":
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		l, err := events.Open(ctx, js, events.Config{UseExisting: true}, nil)
		if err != nil {
			return err
		}
		w, err := worker.New(nc, l, worker.Config{Name: name}, nil)
		if err != nil {
			return err
		}
		if err := w.Open(ctx); err != nil {
			return err
		}
		stop = w.Close
	default:
		return fmt.Errorf("member child %q", kind)
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = stop(cctx)
	b, merr := json.Marshal(map[string]int64{"requests": stats.Requests.Load(), "bytes": stats.Bytes.Load(), "unmapped": stats.Unmapped.Load()})
	if merr != nil {
		return errors.Join(err, merr)
	}
	fmt.Println(string(b))
	return err
}

// memberStats are what an engine child took off the ingest subjects:
// appends mapped to its partitions (and their bytes), and appends that
// came unmapped (a server without the ingest mapping).
type memberStats struct {
	Requests, Bytes, Unmapped atomic.Int64
}

// member is a running member child.
type member struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
}

// startMember starts an engine or worker child on url and waits until it
// is ready.
func (r *runner) startMember(ctx context.Context, kind, url, name string) (*member, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), childEnv+"="+kind, memberEnv+"="+url+","+name)
	cmd.Stderr = r.out
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	out := bufio.NewReader(stdout)
	line, err := out.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("%s child %s: %q %v", kind, name, line, err)
	}
	return &member{cmd: cmd, stdin: stdin, stdout: out}, nil
}

// startEngines starts n engine children (e0, e1, …) on url and waits
// until each owns its share of the partitions.
func (r *runner) startEngines(ctx context.Context, url string, js jetstream.JetStream, n, partitions int) ([]*member, error) {
	var ms []*member
	for i := 0; i < n; i++ {
		m, err := r.startMember(ctx, "engine", url, fmt.Sprintf("e%d", i))
		if err != nil {
			for _, m := range ms {
				m.kill()
			}
			return nil, err
		}
		ms = append(ms, m)
	}
	for i := range ms {
		if err := waitOwned(ctx, js, engine.Group, fmt.Sprintf("e%d", i), partitions/n, 30*time.Second); err != nil {
			for _, m := range ms {
				m.kill()
			}
			return nil, err
		}
	}
	return ms, nil
}

// stopStats ends an engine child and returns its CPU time and what it
// took off the ingest subjects: requests, bytes, and unmapped requests.
func (m *member) stopStats() (time.Duration, map[string]int64) {
	_ = m.stdin.Close()
	line, _ := m.stdout.ReadString('\n')
	stats := map[string]int64{}
	_ = json.Unmarshal([]byte(line), &stats)
	return m.stop(), stats
}

// stop ends the child and returns the CPU time (user and system) it used.
func (m *member) stop() time.Duration {
	_ = m.stdin.Close()
	_ = m.cmd.Wait()
	if m.cmd.ProcessState == nil {
		return 0
	}
	return m.cmd.ProcessState.UserTime() + m.cmd.ProcessState.SystemTime()
}

// kill SIGKILLs the child.
func (m *member) kill() {
	_ = m.cmd.Process.Kill()
	_ = m.cmd.Wait()
}

// setupServer starts a server in a child process and sets up the streams
// (as `engine setup` does), returning it with a client and the log.
func setupServer(ctx context.Context) (*server, *client, *events.Log, error) {
	srv, _, err := childServer(false)
	if err != nil {
		return nil, nil, nil, err
	}
	c, err := connect(srv.url, "bench-setup")
	if err != nil {
		srv.close()
		return nil, nil, nil, err
	}
	l, err := engine.Setup(ctx, c.js, engine.SetupConfig{}, nil)
	if err != nil {
		c.nc.Close()
		srv.close()
		return nil, nil, nil, err
	}
	return srv, c, l, nil
}

// drained waits until every partition's projector consumer has delivered
// and seen acknowledged every event: the engines folded the log.
func drained(ctx context.Context, js jetstream.JetStream, partitions int, within time.Duration) error {
	all := make([]int, partitions)
	for i := range all {
		all[i] = i
	}
	deadline := time.Now().Add(within)
	for {
		states, err := projections.PartitionStates(ctx, js, "", all)
		if err == nil {
			done := true
			for _, s := range states {
				if s.Pending > 0 || s.AckPending > 0 {
					done = false
				}
			}
			if done {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the engines did not fold the log within %s: %w", within, errTimeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// scaleFigure folds ScaleEvents events over FoldSessions sessions with one
// engine, then (on a fresh log) with two sharing the partitions.
func (r *runner) scaleFigure(ctx context.Context) error {
	n, sessions := r.sizes.ScaleEvents, r.sizes.FoldSessions
	type result struct {
		d   time.Duration
		cpu []time.Duration
	}
	run := func(engines int) (result, error) {
		srv, c, l, err := setupServer(ctx)
		if err != nil {
			return result{}, err
		}
		defer srv.close()
		defer c.nc.Close()
		// The engines run first and share the partitions; then the events
		// come, as they would from runtimes, and the group folds them.
		ms, err := r.startEngines(ctx, srv.url, c.js, engines, l.Partitions())
		if err != nil {
			return result{}, err
		}
		settle(r.sizes.Settle)
		start := time.Now()
		if _, err := appendConcurrently(ctx, l, spreadEvents(fmt.Sprintf("sc%d-", engines), n, sessions), r.sizes.AppendBatch, r.sizes.AppendWriters); err != nil {
			return result{}, err
		}
		err = drained(ctx, c.js, l.Partitions(), 5*time.Minute)
		d := time.Since(start)
		res := result{d: d}
		for _, m := range ms {
			res.cpu = append(res.cpu, m.stop())
		}
		return res, err
	}
	one, err := run(1)
	if err != nil {
		return err
	}
	two, err := run(2)
	if err != nil {
		return err
	}
	fmtCPU := func(cs []time.Duration) string {
		var parts []string
		for _, c := range cs {
			parts = append(parts, fmt.Sprintf("%.1fs", c.Seconds()))
		}
		return strings.Join(parts, " + ")
	}
	r.add(Row{Bench: "scale", Figure: fmt.Sprintf("events folded per second by the engines' group sharing the partitions, %s events over %s sessions appended while they run (from the first append to the last event folded)", commas(int64(n)), commas(int64(sessions))),
		Value:    fmt.Sprintf("2 engines: %s (CPU %s)", perSec(rate(n, two.d)), fmtCPU(two.cpu)),
		Baseline: fmt.Sprintf("1 engine: %s (CPU %s)", perSec(rate(n, one.d)), fmtCPU(one.cpu)),
		Ratio:    rate(n, two.d) / rate(n, one.d),
		Metrics:  map[string]float64{"one_s": one.d.Seconds(), "two_s": two.d.Seconds(), "one_rate": rate(n, one.d), "two_rate": rate(n, two.d)},
	})
	r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("scale: with 2 cores, two engine processes and the NATS server share the same CPUs; the group's rate shows what sharing the partitions costs or gains here, the per-process CPU time what each engine did (1 engine %s, 2 engines %s).", fmtCPU(one.cpu), fmtCPU(two.cpu)))
	return nil
}

// handoverFigure SIGKILLs one of two engines (then one of two workers)
// Handovers times and measures how long until the survivor's heartbeat
// says it owns every partition.
func (r *runner) handoverFigure(ctx context.Context) error {
	for _, kind := range []string{"engine", "worker"} {
		group := engine.Group
		if kind == "worker" {
			group = recovery.WorkerGroup
		}
		srv, c, l, err := setupServer(ctx)
		if err != nil {
			return err
		}
		var times []time.Duration
		survivor, err := r.startMember(ctx, kind, srv.url, "survivor")
		if err == nil {
			for i := 0; i < r.sizes.Handovers && err == nil; i++ {
				var victim *member
				name := fmt.Sprintf("victim%d", i)
				victim, err = r.startMember(ctx, kind, srv.url, name)
				if err != nil {
					break
				}
				// Wait for the victim to own its share, then kill it.
				if err = waitOwned(ctx, c.js, group, name, 1, 15*time.Second); err != nil {
					break
				}
				victim.kill()
				start := time.Now()
				if err = waitOwned(ctx, c.js, group, "survivor", l.Partitions(), 30*time.Second); err != nil {
					break
				}
				times = append(times, time.Since(start))
			}
			survivor.stop()
		}
		c.nc.Close()
		srv.close()
		if err != nil {
			return fmt.Errorf("handover %s: %w", kind, err)
		}
		r.add(Row{Bench: "handover", Figure: fmt.Sprintf("a SIGKILLed %s's partitions owned again by the survivor (%d kills)", kind, len(times)),
			Value:  fmt.Sprintf("p50 %s, p99 %s", percentile(times, 50).Round(time.Millisecond), percentile(times, 99).Round(time.Millisecond)),
			Target: "within pgroup's bound: TTL + 2 heartbeats (7 s), as the survivor's next heartbeat shows it", Status: passIf(percentile(times, 99) <= pgroup.DefaultTTL+2*pgroup.DefaultHeartbeat),
			Metrics: map[string]float64{"p50_s": percentile(times, 50).Seconds(), "p99_s": percentile(times, 99).Seconds()},
		})
	}
	return nil
}

// waitOwned waits until member's heartbeat in group says it owns at least
// n partitions.
func waitOwned(ctx context.Context, js jetstream.JetStream, group, name string, n int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		recs, err := pgroup.List(ctx, js, "", group)
		if err == nil {
			for _, rec := range recs {
				if rec.Member == name && len(rec.Partitions) >= n {
					return nil
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s %s does not own %d partitions within %s: %w", group, name, n, within, errTimeout)
}

// newSessionsFigure folds NewSessions brand-new sessions of one event each
// with one engine.
func (r *runner) newSessionsFigure(ctx context.Context) error {
	n := r.sizes.NewSessions
	srv, c, l, err := setupServer(ctx)
	if err != nil {
		return err
	}
	defer srv.close()
	defer c.nc.Close()
	evs := make([]events.Event, n)
	for i := range evs {
		ev, err := events.New(benchTenant, sessionName("new", i), "", &events.SessionStarted{Runtime: "bench"})
		if err != nil {
			return err
		}
		evs[i] = ev
	}
	if _, err := appendConcurrently(ctx, l, evs, r.sizes.AppendBatch, r.sizes.AppendWriters); err != nil {
		return err
	}
	settle(r.sizes.Settle)
	start := time.Now()
	m, err := r.startMember(ctx, "engine", srv.url, "e0")
	if err != nil {
		return err
	}
	err = drained(ctx, c.js, l.Partitions(), 5*time.Minute)
	d := time.Since(start)
	cpu := m.stop()
	if err != nil {
		return err
	}
	got := rate(n, d)
	r.add(Row{Bench: "newsessions", Figure: fmt.Sprintf("brand-new sessions projected per second (%s sessions of one event, one engine, from its start)", commas(int64(n))),
		Value: perSec(got), Target: "at least 5,000/s", Status: passIf(got >= 5000),
		Metrics: map[string]float64{"rate": got, "seconds": d.Seconds(), "engine_cpu_s": cpu.Seconds()},
	})
	return nil
}

// fleetFigure writes FleetSessions summaries to the fleet index and times
// reading them all (what `engine sessions` does), and an engine's start
// with that fleet.
func (r *runner) fleetFigure(ctx context.Context) error {
	n := r.sizes.FleetSessions
	srv, c, l, err := setupServer(ctx)
	if err != nil {
		return err
	}
	defer srv.close()
	defer c.nc.Close()
	js, err := jetstream.New(c.nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return err
	}
	now := time.Now().UTC()
	var futs []jetstream.PubAckFuture
	for i := 0; i < n; i++ {
		s := sessionName("fleet", i)
		p := events.Partition(benchTenant, s, l.Partitions())
		b, err := json.Marshal(projections.Summary{Tenant: benchTenant, Session: s, Partition: p, Status: projections.StatusIdle,
			Runtime: "bench", Counts: projections.Counts{TurnsTotal: 3, TurnsCompleted: 3}, Events: 12, FirstSeq: uint64(i*12 + 1), LastSeq: uint64(i*12 + 12), LastTime: now, LastStored: now})
		if err != nil {
			return err
		}
		f, err := js.PublishAsync("$KV."+projections.IndexBucket+"."+projections.IndexKey(p, benchTenant, s), b)
		if err != nil {
			return err
		}
		futs = append(futs, f)
		if len(futs) == 2000 {
			for _, f := range futs {
				if err := waitFuture(ctx, f); err != nil {
					return err
				}
			}
			futs = futs[:0]
		}
	}
	for _, f := range futs {
		if err := waitFuture(ctx, f); err != nil {
			return err
		}
	}
	settle(r.sizes.Settle)
	// `engine sessions` itself, as a process (built from this module),
	// the way an operator runs it: the table's default page, and --json.
	exe, err := engineBinary()
	if err != nil {
		return fmt.Errorf("fleet: build cmd/engine: %w", err)
	}
	for _, c := range []struct {
		args   []string
		figure string
		check  func([]byte) error
	}{
		{[]string{"sessions"}, "`engine sessions`: the table's first page (1,000 rows of the fleet index, sorted by tenant and session; the process's whole run)",
			func(out []byte) error {
				if lines := strings.Count(string(out), "\n"); lines < min(n, 1000)+1 {
					return fmt.Errorf("%d lines", lines)
				}
				return nil
			}},
		{[]string{"sessions", "--json"}, "`engine sessions --json`: every row of the fleet index (the process's whole run)",
			func(out []byte) error {
				if rows := strings.Count(string(out), "\n{"); rows != n {
					return fmt.Errorf("%d rows, want %d", rows, n)
				}
				return nil
			}},
	} {
		var runs []time.Duration
		for i := 0; i < 3; i++ {
			start := time.Now()
			cmd := exec.CommandContext(ctx, exe, append(c.args, "--nats-url", srv.url)...)
			out, err := cmd.Output()
			runs = append(runs, time.Since(start))
			if err == nil {
				err = c.check(out)
			}
			if err != nil {
				return fmt.Errorf("fleet: engine %v: %w", c.args, err)
			}
		}
		d := percentile(runs, 50)
		r.add(Row{Bench: "fleet", Figure: fmt.Sprintf("%s, %s sessions (median of 3)", c.figure, commas(int64(n))),
			Value: d.Round(time.Millisecond).String(), Target: "under 1 s", Status: passIf(d < time.Second),
			Metrics: map[string]float64{"read_s": d.Seconds()}})
	}

	start := time.Now()
	m, err := r.startMember(ctx, "engine", srv.url, "e0")
	if err != nil {
		return err
	}
	ready := time.Since(start)
	m.stop()
	r.add(Row{Bench: "fleet", Figure: fmt.Sprintf("an engine process ready (joined, every partition taken, serving) with %s sessions in the index", commas(int64(n))),
		Value: ready.Round(time.Millisecond).String(), Target: "under 5 s", Status: passIf(ready < 5*time.Second),
		Metrics: map[string]float64{"ready_s": ready.Seconds()}})
	return nil
}

func waitFuture(ctx context.Context, f jetstream.PubAckFuture) error {
	select {
	case <-f.Ok():
		return nil
	case err := <-f.Err():
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(30 * time.Second):
		return errTimeout
	}
}

// passIf is PASS or MISS.
func passIf(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

// ingestScaleFigure sends ScaleEvents events over FoldSessions sessions
// through the ingest (ingest.Client from this process: the publishers)
// to one engine, then (on a fresh log) to two sharing the partitions,
// each engine a process of its own on a server with the ingest mapping.
// It reports the bytes each engine took off the ingest subjects (with two,
// each should take about half: the server routes each append to its
// partition's owner) and the engines' CPU seconds per 100,000 events,
// summed (with two, within 10% of one's: nothing is received twice).
func (r *runner) ingestScaleFigure(ctx context.Context) error {
	n, sessions := r.sizes.ScaleEvents, r.sizes.FoldSessions
	type result struct {
		d     time.Duration
		cpu   []time.Duration
		bytes []int64
	}
	run := func(engines int) (result, error) {
		srv, c, l, err := setupServer(ctx)
		if err != nil {
			return result{}, err
		}
		defer srv.close()
		defer c.nc.Close()
		ms, err := r.startEngines(ctx, srv.url, c.js, engines, l.Partitions())
		if err != nil {
			return result{}, err
		}
		pc, err := connect(srv.url, "bench-publisher")
		if err != nil {
			return result{}, err
		}
		defer pc.nc.Close()
		cl, err := ingest.NewClient(pc.nc, ingest.ClientConfig{})
		if err != nil {
			return result{}, err
		}
		settle(r.sizes.Settle)
		start := time.Now()
		if _, err := appendConcurrently(ctx, cl, spreadEvents(fmt.Sprintf("is%d-", engines), n, sessions), r.sizes.AppendBatch, r.sizes.AppendWriters); err != nil {
			return result{}, err
		}
		d := time.Since(start)
		// The engines fold what they stored before they stop, so the CPU
		// counted is the whole of their work on these events.
		err = drained(ctx, c.js, l.Partitions(), 5*time.Minute)
		res := result{d: d}
		var requests, unmapped int64
		for _, m := range ms {
			cpu, st := m.stopStats()
			res.cpu = append(res.cpu, cpu)
			res.bytes = append(res.bytes, st["bytes"])
			requests += st["requests"]
			unmapped += st["unmapped"]
		}
		if err == nil && (requests != int64(n) || unmapped != 0) {
			err = fmt.Errorf("%d engines took %d appends mapped and %d unmapped, %d were sent", engines, requests, unmapped, n)
		}
		return res, err
	}
	one, err := run(1)
	if err != nil {
		return err
	}
	two, err := run(2)
	if err != nil {
		return err
	}
	per100k := func(res result) float64 {
		var sum time.Duration
		for _, c := range res.cpu {
			sum += c
		}
		return sum.Seconds() * 100_000 / float64(n)
	}
	shares := func(res result) string {
		var total int64
		for _, b := range res.bytes {
			total += b
		}
		var parts []string
		for _, b := range res.bytes {
			parts = append(parts, fmt.Sprintf("%.1f MB (%.0f%%)", float64(b)/1e6, 100*float64(b)/float64(max(total, 1))))
		}
		return strings.Join(parts, " + ")
	}
	maxShare := 0.0
	var total int64
	for _, b := range two.bytes {
		total += b
	}
	for _, b := range two.bytes {
		maxShare = max(maxShare, float64(b)/float64(max(total, 1)))
	}
	ratio := per100k(two) / per100k(one)
	r.add(Row{Bench: "ingestscale", Figure: fmt.Sprintf("the ingest shared by the engines: bytes each engine took off the ingest subjects, and the engines' CPU seconds per 100,000 events summed (receive, validate, append, fold), %s events over %s sessions through ingest.Client",
		commas(int64(n)), commas(int64(sessions))),
		Value:    fmt.Sprintf("2 engines: %s; %.2f CPU s/100k (%s)", shares(two), per100k(two), perSec(rate(n, two.d))),
		Baseline: fmt.Sprintf("1 engine: %s; %.2f CPU s/100k (%s)", shares(one), per100k(one), perSec(rate(n, one.d))),
		Ratio:    ratio,
		Target:   "each engine about half the bytes; summed CPU within 10% of one engine's",
		Status:   passIf(maxShare < 0.65 && ratio <= 1.1),
		Metrics: map[string]float64{"one_cpu_per_100k": per100k(one), "two_cpu_per_100k": per100k(two), "two_max_share": maxShare,
			"one_rate": rate(n, one.d), "two_rate": rate(n, two.d)},
	})
	return nil
}

var (
	engineMu  sync.Mutex
	engineDir string // the temporary directory engineExe is in, or ""
	engineExe string
	engineErr error
)

// engineBinary builds cmd/engine of this module once per process, into a
// temporary directory that removeEngineBinary deletes, and returns its
// path (about 45 MB; every Run of the process shares it).
func engineBinary() (string, error) {
	engineMu.Lock()
	defer engineMu.Unlock()
	if engineExe == "" && engineErr == nil {
		engineDir, engineExe, engineErr = buildEngine()
	}
	return engineExe, engineErr
}

// buildEngine builds cmd/engine into a new temporary directory and returns
// the directory (to remove, even on error) and the binary's path.
func buildEngine() (dir, exe string, err error) {
	dir, err = os.MkdirTemp("", "turnstone-bench-engine-")
	if err != nil {
		return "", "", err
	}
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return dir, "", fmt.Errorf("go list -m: %w", err)
	}
	exe = filepath.Join(dir, "engine")
	build := exec.Command("go", "build", "-o", exe, "./cmd/engine")
	build.Dir = strings.TrimSpace(string(root))
	if out, err := build.CombinedOutput(); err != nil {
		return dir, "", fmt.Errorf("%w: %s", err, out)
	}
	return dir, exe, nil
}

// removeEngineBinary deletes the directory engineBinary built into, if it
// did; the next engineBinary builds again. The bench command and its tests
// call it as they end, so that no run leaves a binary behind.
func removeEngineBinary() {
	engineMu.Lock()
	defer engineMu.Unlock()
	if engineDir != "" {
		_ = os.RemoveAll(engineDir)
	}
	engineDir, engineExe, engineErr = "", "", nil
}
