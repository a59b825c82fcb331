package test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
)

// binDir holds the commands built once for the whole package.
var binDir string

// defaultParallel is how many of this package's tests run at once unless
// -parallel says otherwise. Most of them wait on processes (engines,
// nats-server nodes, Chromium) and on timers, not on this process's CPU,
// so more than GOMAXPROCS (go test's default) overlap well on 2 cores;
// more than 4 starved the timing-bound ones when CI ran them under race.
// TestClusterKills runs its two cluster tests in one of the 4 slots.
// The slots are admission's (parallel_test.go).
const defaultParallel = 4

func TestMain(m *testing.M) {
	flag.Parse()
	// The package's slots: -parallel as given, or defaultParallel. They
	// are handed out by admission (parallel_test.go), longest tests
	// first; go test's own semaphore is opened wide so that it never
	// picks among them. Not when fuzzing, where -parallel is the count
	// of fuzz workers.
	admission.slots = defaultParallel
	fuzzing := false
	flag.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "test.parallel":
			admission.slots, _ = strconv.Atoi(f.Value.String())
		case "test.fuzz", "test.fuzzworker":
			fuzzing = fuzzing || f.Value.String() != "" && f.Value.String() != "false"
		}
	})
	if fuzzing {
		admission.off = true
		_ = flag.Set("test.parallel", strconv.Itoa(admission.slots))
	} else {
		_ = flag.Set("test.parallel", "1000")
	}
	dir, err := os.MkdirTemp("", "turnstone-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	// -s -w: no DWARF or symbol table, which halves the link; panics
	// still name every function and line. The three the tests run (not
	// cmd/bench, which its own package tests).
	build := exec.Command("go", "build", "-ldflags=-s -w", "-o", binDir, "../cmd/engine", "../cmd/worker", "../cmd/refruntime")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build commands:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// skipShort skips a test under -short (go test -short: the developer's
// loop, under a minute for the whole module), saying why it is slow; the
// full run (scripts/test, CI) runs it.
func skipShort(t *testing.T, why string) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: " + why)
	}
}

// freePort is embeddedtest.FreePort: a port of 127.0.0.1 below the
// kernel's ephemeral range, for a process the test is about to start.
func freePort(t testing.TB) int { return embeddedtest.FreePort(t) }

// engineProc is a running `engine serve`.
type engineProc struct {
	cmd *exec.Cmd
	url string
	out *syncBuffer
}

// syncBuffer is a bytes.Buffer a process writes to while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startEngine starts `engine serve` on a free port with its data in dir and
// waits until a client can connect. The process is killed at test end if
// it still runs.
func startEngine(t *testing.T, dir string, extra ...string) *engineProc {
	t.Helper()
	return startEngineAt(t, dir, freePort(t), extra...)
}

// startEngineAt is startEngine on a given port (a restart on the same
// address, so clients reconnect).
func startEngineAt(t *testing.T, dir string, port int, extra ...string) *engineProc {
	t.Helper()
	return startEngineEnvAt(t, dir, port, nil, extra...)
}

// startEngineEnvAt is startEngineAt with env added to the process's
// environment.
func startEngineEnvAt(t *testing.T, dir string, port int, env []string, extra ...string) *engineProc {
	t.Helper()
	args := []string{"serve", "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--data", dir}
	if !slices.Contains(extra, "--telemetry-listen") {
		args = append(args, "--telemetry-listen", "") // the default port may be taken on a shared machine
	}
	args = append(args, extra...)
	cmd := exec.Command(filepath.Join(binDir, "engine"), args...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(withoutNATSURL(), env...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &engineProc{cmd: cmd, url: fmt.Sprintf("nats://127.0.0.1:%d", port), out: out}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		nc, err := nats.Connect(p.url)
		if err == nil {
			nc.Close()
			if strings.Contains(out.String(), "engine ready") {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("engine did not get ready: %s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *engineProc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("engine exited with %v after SIGTERM: %s", err, p.out)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("engine did not stop within 30s of SIGTERM: %s", p.out)
	}
}

func withoutNATSURL() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TURNSTONE_") {
			env = append(env, kv)
		}
	}
	return env
}

// run runs `engine ARGS...` against url and returns its stdout; it fails
// the test when the command fails.
func run(t *testing.T, url string, args ...string) string {
	t.Helper()
	out, errOut, err := runErr(url, args...)
	if err != nil {
		t.Fatalf("engine %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

func runErr(url string, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "engine"), args...)
	cmd.Env = append(withoutNATSURL(), "TURNSTONE_NATS_URL="+url)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return out.String(), errOut.String(), err
}

func TestCLIImportSessionsInspectReplay(t *testing.T) {
	skipShort(t, "runs the CLI over a transcript import")
	parallel(t)
	data := t.TempDir()
	eng := startEngine(t, data, "--snapshot-every", "50", "--sync", "1s")
	// A transcript cut after a tool_use, then a new prompt: the tool
	// never answered.
	cut, orphans := cutAfterToolUse(t, filepath.Join(transcriptsDir, "spotter", "tool_heavy.jsonl"), 0)
	cut = nextPrompt(t, cut)

	out := run(t, eng.url, "import", "--format", "claude-code", transcriptsDir)
	if !strings.Contains(out, "lines skipped") || !strings.Contains(out, "events/s") {
		t.Fatalf("import report: %s", out)
	}
	again := run(t, eng.url, "import", "--format", "claude-code", transcriptsDir)
	if !strings.Contains(again, "(0 appended") {
		t.Fatalf("second import appended events: %s", again)
	}
	run(t, eng.url, "import", "--format", "claude-code", "--tenant", "cut", cut)

	// The projector folds the imports after they are stored: sessions
	// says so while it has events to fold (a session whose turn's end is
	// not folded yet would show as interrupted), and not once it is done.
	waitFor(t, "sessions without a projector backlog note", func() bool {
		_, errOut, err := runErr(eng.url, "sessions")
		return err == nil && !strings.Contains(errOut, "still to fold")
	})

	// sessions: one line per session, the cut one with its orphan.
	var list []struct {
		Tenant, Session, Status string
		Counts                  struct {
			TurnsTotal     int `json:"turns_total"`
			OrphansOpen    int `json:"orphans_open"`
			ViolationsOpen int `json:"violations_open"`
		}
	}
	if err := json.Unmarshal([]byte(run(t, eng.url, "sessions", "--json")), &list); err != nil {
		t.Fatal(err)
	}
	if len(list) < 30 {
		t.Fatalf("sessions --json lists %d sessions, want every imported one", len(list))
	}
	table := run(t, eng.url, "sessions")
	if lines := strings.Count(strings.TrimSpace(table), "\n"); lines != len(list) {
		t.Fatalf("sessions prints %d rows for %d sessions:\n%s", lines, len(list), table)
	}
	// Times in tables say their zone.
	for _, l := range strings.Split(strings.TrimSpace(table), "\n")[1:] {
		if f := strings.Fields(l); !strings.HasSuffix(f[len(f)-1], "Z") {
			t.Errorf("sessions row %q: the last event's time does not say its zone", l)
		}
	}
	if broken := run(t, eng.url, "sessions", "--broken"); strings.Count(strings.TrimSpace(broken), "\n") != 1 || !strings.Contains(broken, "cut") {
		t.Errorf("sessions --broken, want the cut session alone:\n%s", broken)
	}
	for _, s := range list {
		switch s.Tenant {
		case "cut":
			if s.Counts.OrphansOpen != len(orphans) || s.Counts.ViolationsOpen != len(orphans) || s.Status != "broken" {
				t.Errorf("cut session: %+v, want %d orphan(s)", s, len(orphans))
			}
		default:
			if s.Counts.OrphansOpen != 0 || s.Counts.ViolationsOpen != 0 || s.Counts.TurnsTotal == 0 {
				t.Errorf("shipped session %s: %+v", s.Session, s)
			}
		}
	}

	// inspect --json has the promised keys.
	var state map[string]json.RawMessage
	if err := json.Unmarshal([]byte(run(t, eng.url, "inspect", "cut/"+sessionOf(t, cut), "--json")), &state); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"session", "turns", "messages", "orphaned_tool_use_ids", "violations", "in_flight", "view"} {
		if _, ok := state[k]; !ok {
			t.Errorf("inspect --json lacks %q", k)
		}
	}
	var ids []string
	_ = json.Unmarshal(state["orphaned_tool_use_ids"], &ids)
	if strings.Join(ids, ",") != strings.Join(orphans, ",") {
		t.Errorf("orphaned_tool_use_ids = %v, want %v", ids, orphans)
	}
	human := run(t, eng.url, "inspect", "--tenant", "cut", sessionOf(t, cut))
	if !strings.Contains(human, orphans[0]) || !strings.Contains(human, "tool_use_without_result") {
		t.Errorf("inspect does not show the orphan:\n%s", human)
	}

	// replay flags the orphan at the event that declares it; --json prints
	// each event whole, then the final view.
	all := strings.Split(strings.TrimSpace(run(t, eng.url, "replay", "cut/"+sessionOf(t, cut), "--json")), "\n")
	lines, endLine := all[:len(all)-1], all[len(all)-1]
	var end struct {
		Replayed int `json:"replayed"`
		View     struct {
			Status             string   `json:"status"`
			OrphanedToolUseIDs []string `json:"orphaned_tool_use_ids"`
		} `json:"view"`
	}
	if err := json.Unmarshal([]byte(endLine), &end); err != nil || end.Replayed != len(lines) || end.View.Status != "broken" ||
		strings.Join(end.View.OrphanedToolUseIDs, ",") != strings.Join(orphans, ",") {
		t.Errorf("replay --json last line %s (err %v): want %d events replayed and the orphans %v", endLine, err, len(lines), orphans)
	}
	flagged := 0
	var lastSeq uint64
	for _, l := range lines {
		var ev struct {
			Seq   uint64 `json:"seq"`
			Type  string `json:"type"`
			Event struct {
				ID      string          `json:"id"`
				Type    string          `json:"type"`
				Tenant  string          `json:"tenant"`
				Session string          `json:"session"`
				Data    json.RawMessage `json:"data"`
			} `json:"event"`
			Anomalies []struct {
				Rule      string `json:"rule"`
				ToolUseID string `json:"tool_use_id"`
			} `json:"anomalies"`
		}
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("replay --json line %q: %v", l, err)
		}
		if ev.Seq <= lastSeq {
			t.Fatalf("replay out of order at seq %d", ev.Seq)
		}
		if ev.Event.ID == "" || ev.Event.Type != ev.Type || ev.Event.Tenant != "cut" || len(ev.Event.Data) == 0 {
			t.Fatalf("replay --json line %d does not hold the whole event: %s", ev.Seq, l)
		}
		lastSeq = ev.Seq
		for _, a := range ev.Anomalies {
			if a.Rule == "tool_use_without_result" {
				flagged++
				if ev.Type != "turn.completed" {
					t.Errorf("orphan flagged at a %s event, want the turn.completed that ends the cut turn", ev.Type)
				}
			}
		}
	}
	if flagged != len(orphans) {
		t.Errorf("replay flags %d orphans, want %d", flagged, len(orphans))
	}
	text := run(t, eng.url, "replay", "cut/"+sessionOf(t, cut))
	if !strings.Contains(text, "!! tool_use_without_result") {
		t.Errorf("replay text does not flag the orphan:\n%s", text)
	}
	until := run(t, eng.url, "replay", "cut/"+sessionOf(t, cut), "--json", "--until-seq", fmt.Sprint(lastSeq-1))
	if n := strings.Count(strings.TrimSpace(until), "\n"); n != len(lines)-1 {
		t.Errorf("--until-seq %d printed %d events, want %d", lastSeq-1, n, len(lines)-1)
	}

	// A long session's timeline: in stream order, snapshot.taken events
	// with the time of what they cover said, not in the time column.
	long := run(t, eng.url, "replay", "258c7280")
	var prev uint64
	snapshots := 0
	for _, l := range strings.Split(long, "\n") {
		f := strings.Fields(l)
		if len(f) < 3 || strings.HasPrefix(l, " ") && !strings.Contains(l, "snapshot.taken") {
			continue
		}
		if strings.Contains(l, "snapshot.taken") {
			snapshots++
			if !strings.HasPrefix(l, "    ") || !strings.Contains(l, "snapshot of the state up to seq") {
				t.Errorf("snapshot line %q: want no time of its own and the time of what it covers", l)
			}
			f = append([]string{"-"}, f...)
		}
		seq, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			continue
		}
		if seq <= prev {
			t.Errorf("replay prints seq %d after seq %d", seq, prev)
		}
		prev = seq
	}
	if snapshots == 0 {
		t.Errorf("replay of a long session shows no snapshot.taken (engine --snapshot-every 50)")
	}

	// A clean stop, and the data is there after a restart.
	eng.stop(t)
	eng = startEngine(t, data)
	var after []json.RawMessage
	if err := json.Unmarshal([]byte(run(t, eng.url, "sessions", "--json")), &after); err != nil || len(after) != len(list) {
		t.Fatalf("after restart: %d sessions (err %v), want %d", len(after), err, len(list))
	}
	eng.stop(t)
}

// sessionOf returns the session token of a transcript: its records'
// sessionId.
func sessionOf(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		var rec struct {
			SessionID string `json:"sessionId"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.SessionID != "" {
			return rec.SessionID
		}
	}
	t.Fatalf("%s has no sessionId", file)
	return ""
}

func TestCLIErrorsAreClear(t *testing.T) {
	parallel(t)
	_, errOut, err := runErr("nats://127.0.0.1:1", "sessions")
	if err == nil || !strings.Contains(errOut, "engine serve") {
		t.Errorf("no server: err %v, stderr %q; want a hint to start the engine", err, errOut)
	}
	eng := startEngine(t, t.TempDir())
	_, errOut, err = runErr(eng.url, "inspect", "nope")
	if err == nil || !strings.Contains(errOut, "not found") {
		t.Errorf("unknown session: err %v, stderr %q", err, errOut)
	}
	_, errOut, err = runErr(eng.url, "import", "--format", "csv", "x.jsonl")
	if err == nil || !strings.Contains(errOut, "claude-code") {
		t.Errorf("bad format: err %v, stderr %q", err, errOut)
	}
	_, errOut, err = runErr(eng.url, "replay", "x", "--until-time", "yesterday")
	if err == nil || !strings.Contains(errOut, "RFC 3339") {
		t.Errorf("bad time: err %v, stderr %q", err, errOut)
	}
	eng.stop(t)
}
