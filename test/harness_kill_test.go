package test

import (
	"cmp"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/claudecode"
	"github.com/turnstone-dev/turnstone/projections"
)

// longTranscripts returns the long shipped transcripts (over 1 MiB, each
// with a compaction) and their subagents, in the order Import reads them;
// with n > 0, only the n smallest of them.
func longTranscripts(t testing.TB, n int) []string {
	t.Helper()
	transcripts(t) // fails naming the path when the shared data is missing
	mains, err := filepath.Glob(filepath.Join(transcriptsDir, "spotter", "*.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var long []string
	size := map[string]int64{}
	for _, f := range mains {
		if fi, err := os.Stat(f); err == nil && fi.Size() > 1<<20 {
			long, size[f] = append(long, f), fi.Size()
		}
	}
	if len(long) < 5 {
		t.Fatalf("found %d transcripts over 1 MiB under %s/spotter, want the 5 shipped", len(long), transcriptsDir)
	}
	if n > 0 && n < len(long) {
		slices.SortFunc(long, func(a, b string) int { return cmp.Compare(size[a], size[b]) })
		long = long[:n]
		slices.Sort(long)
	}
	files, err := claudecode.Expand(long)
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// convertAll converts files as `engine import` does (one converter, in
// order) and returns the sessions it yields.
func convertAll(t testing.TB, tenant string, files []string) []claudecode.Session {
	t.Helper()
	conv, err := claudecode.NewConverter(claudecode.Options{Tenant: tenant})
	if err != nil {
		t.Fatal(err)
	}
	var out []claudecode.Session
	for _, f := range files {
		res, err := conv.ConvertFile(f)
		if err != nil {
			t.Fatalf("convert %s: %v", f, err)
		}
		out = append(out, res.Sessions...)
	}
	return out
}

// checkImportedOnce checks that the log holds every converted event of
// every session exactly once, in the converted order, and nothing else of
// the tenant but the engine's own events (snapshot.taken and the like).
func checkImportedOnce(t testing.TB, want []claudecode.Session, got map[string][]events.Event) {
	t.Helper()
	checkNoDuplicateIDs(t, got)
	wanted := map[string]bool{}
	engineEvents := map[events.Type]int{}
	for _, s := range want {
		wanted[s.Session] = true
		var ids []string
		for _, ev := range got[s.Session] {
			if strings.HasPrefix(ev.Source, engineSource) {
				engineEvents[ev.Type]++
				continue
			}
			if ev.Err != nil {
				t.Errorf("%s: invalid event at seq %d: %v", s.Session, ev.Seq, ev.Err)
			}
			ids = append(ids, ev.ID)
		}
		wantIDs := make([]string, len(s.Events))
		for i, ev := range s.Events {
			wantIDs[i] = ev.ID
		}
		if !slices.Equal(ids, wantIDs) {
			missing, extra := diffIDs(wantIDs, ids)
			t.Errorf("%s: the log holds %d imported events, the transcript converts to %d: %d missing %v, %d not converted %v (or out of order)",
				s.Session, len(ids), len(wantIDs), len(missing), firstIDs(missing), len(extra), firstIDs(extra))
		}
	}
	for session := range got {
		if !wanted[session] {
			t.Errorf("the log holds session %s, which no transcript converts to", session)
		}
	}
	t.Logf("%d sessions imported exactly once; events the engine wrote beside them: %v", len(want), engineEvents)
}

func diffIDs(want, got []string) (missing, extra []string) {
	in := func(xs []string) map[string]bool {
		m := map[string]bool{}
		for _, x := range xs {
			m[x] = true
		}
		return m
	}
	w, g := in(want), in(got)
	for _, id := range want {
		if !g[id] {
			missing = append(missing, id)
		}
	}
	for _, id := range got {
		if !w[id] {
			extra = append(extra, id)
		}
	}
	return missing, extra
}

func firstIDs(xs []string) []string { return xs[:min(len(xs), 3)] }

var importCounts = regexp.MustCompile(`-> (\d+) events \((\d+) appended, (\d+) already stored\)`)

// TestEngineKilledMidImport kills the engine (SIGKILL, --sync always) while
// `engine import` writes the long transcripts, starts it again on the same
// port and data, and imports again: every converted event is then in the
// log exactly once and in order, the second import appends exactly what
// the first did not store, and every session's projection (snapshot plus
// tail, as `engine inspect` serves it) equals a fresh replay of its log.
func TestEngineKilledMidImport(t *testing.T) {
	skipShort(t, "kills engine processes")
	parallelLong(t)
	const tenant = "killimport"
	// Under the race detector, the two smallest (5.5 of 15 MB): the
	// harness converts and folds what it imports in this process, ten to
	// twenty times slower under race, while the engine it kills is a
	// process of its own, built without it; a kill lands a quarter of the
	// way into either. scripts/fullsize imports all five.
	n := 0
	if raceEnabled {
		n = 2
	}
	files := longTranscripts(t, n)
	want := convertAll(t, tenant, files)
	total := 0
	for _, s := range want {
		total += len(s.Events)
	}

	dir, port := t.TempDir(), freePort(t)
	eng := startEngineAt(t, dir, port, "--sync", "always")
	_, js, _ := connectJS(t, eng.url)
	args := append([]string{"import", "--format", "claude-code", "--tenant", tenant, "--quiet"}, files...)
	imp := startProc(t, eng.url, "engine", args...)

	// Kill the engine a quarter of the way in.
	deadline := time.Now().Add(time.Minute)
	for streamMsgs(js) < uint64(total/4) {
		if imp.exited() {
			t.Fatalf("the import ended before the kill (%d of %d events stored); stdout: %s\nstderr: %s", streamMsgs(js), total, imp.out, imp.errOut)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the import stored %d of %d events in a minute", streamMsgs(js), total)
		}
		time.Sleep(10 * time.Millisecond)
	}
	killEngine(t, eng)
	if code := imp.wait(t, 30*time.Second); code == 0 {
		t.Fatalf("the import succeeded although the engine was killed: %s", imp.out)
	}
	if !strings.Contains(imp.errOut.String(), events.ErrLogUnavailable.Error()) {
		t.Errorf("the interrupted import does not say the log is unavailable:\n%s", imp.errOut)
	}
	t.Logf("interrupted import: %s", firstLine(imp.errOut.String()))

	eng = startEngineAt(t, dir, port, "--sync", "always")
	_, js, log := connectJS(t, eng.url)
	// What survived is a prefix of each session's events: the import
	// publishes in order, so a hole would be an acknowledged event lost
	// while a later one was kept.
	before := tenantLog(t, log, tenant)
	stored := 0
	for _, s := range want {
		var ids []string
		for _, ev := range before[s.Session] {
			if !strings.HasPrefix(ev.Source, engineSource) {
				ids = append(ids, ev.ID)
			}
		}
		for i, id := range ids {
			if i >= len(s.Events) || s.Events[i].ID != id {
				t.Fatalf("%s: after the kill the log holds %d events that are not the first of the transcript's (event %d is %s)", s.Session, len(ids), i, id)
			}
		}
		stored += len(ids)
	}
	if stored == 0 || stored >= total {
		t.Fatalf("%d of %d events survived the kill; want a part of them", stored, total)
	}

	out := runOK(t, eng.url, args...)
	m := importCounts.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("import report: %s", out)
	}
	converted, appended, existing := atoi(m[1]), atoi(m[2]), atoi(m[3])
	if converted != total || existing != stored || appended != total-stored {
		t.Errorf("second import: %d events, %d appended, %d already stored; want %d, %d, %d", converted, appended, existing, total, total-stored, stored)
	}
	t.Logf("%d of %d events stored before the kill; the second import appended %d", stored, total, appended)

	waitProjectorIdle(t, js)
	got := tenantLog(t, log, tenant)
	checkImportedOnce(t, want, got)
	checkProjectionsEqualReplay(t, eng.url, log, tenant, got)
	eng.stop(t)
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// turnRecorded is one "turn recorded" log line of refruntime: a turn
// whose events were all acknowledged by the log.
type turnRecorded struct {
	session, turn, outcome string
	first, last            uint64
}

var (
	ansi      = regexp.MustCompile(`\x1b\[[0-9;]*m`)
	logFields = regexp.MustCompile(`(\w+)=(\S+)`)
)

// recordedTurns parses refruntime's stderr for the turns it recorded.
func recordedTurns(stderr string) []turnRecorded {
	var out []turnRecorded
	for _, line := range strings.Split(ansi.ReplaceAllString(stderr, ""), "\n") {
		if !strings.Contains(line, "turn recorded") {
			continue
		}
		var r turnRecorded
		for _, m := range logFields.FindAllStringSubmatch(line, -1) {
			switch m[1] {
			case "session":
				r.session = m[2]
			case "turn":
				r.turn = m[2]
			case "outcome":
				r.outcome = m[2]
			case "first_seq":
				r.first, _ = strconv.ParseUint(m[2], 10, 64)
			case "last_seq":
				r.last, _ = strconv.ParseUint(m[2], 10, 64)
			}
		}
		out = append(out, r)
	}
	return out
}

// TestEngineKilledMidLiveIngest kills the engine (SIGKILL, --sync always)
// while the reference runtime records sessions, and starts it again on
// the same port and data at once. The runtime's NATS client reconnects;
// an append in flight at the kill fails with ErrLogUnavailable after the
// log's timeout, and the runtime stops there (it does not retry). Then a
// second runtime records more sessions. Every turn a runtime reported as
// recorded (all its events acknowledged) is in the log, ended, at the
// sequences acknowledged; no id is stored twice; every session's
// projection equals a fresh replay of its log.
func TestEngineKilledMidLiveIngest(t *testing.T) {
	skipShort(t, "kills engine processes")
	parallel(t)
	const tenant = "live"
	dir, port := t.TempDir(), freePort(t)
	// Snapshots every 20 events, so that restores start from them.
	eng := startEngineAt(t, dir, port, "--sync", "always", "--snapshot-every", "20")
	_, js, _ := connectJS(t, eng.url)

	rt := startProc(t, eng.url, "refruntime", "--nats-url", eng.url, "--tenant", tenant,
		"--sessions", "40", "--turns", "3", "--tools", "2", "--session-prefix", "a")
	deadline := time.Now().Add(time.Minute)
	for streamMsgs(js) < 200 {
		if rt.exited() {
			t.Fatalf("the runtime ended before the kill; stderr: %s", rt.errOut)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the runtime stored %d events in a minute", streamMsgs(js))
		}
		time.Sleep(5 * time.Millisecond)
	}
	killEngine(t, eng)
	eng = startEngineAt(t, dir, port, "--sync", "always", "--snapshot-every", "20")

	code := rt.wait(t, 90*time.Second)
	firstRun := recordedTurns(rt.errOut.String())
	switch code {
	case 0:
		t.Logf("the runtime rode out the restart: %d turns recorded", len(firstRun))
	case 1:
		if !strings.Contains(rt.errOut.String(), events.ErrLogUnavailable.Error()) {
			t.Errorf("the runtime failed without saying the log is unavailable:\n%s", rt.errOut)
		}
		t.Logf("the runtime stopped at the kill after %d turns recorded: %s", len(firstRun), lastLine(rt.errOut.String()))
	default:
		t.Fatalf("runtime exit status %d:\n%s", code, rt.errOut)
	}

	// Live ingest works again after the restart.
	rt2 := startProc(t, eng.url, "refruntime", "--nats-url", eng.url, "--tenant", tenant,
		"--sessions", "3", "--turns", "2", "--tools", "1", "--session-prefix", "b")
	if code := rt2.wait(t, time.Minute); code != 0 {
		t.Fatalf("runtime after the restart: exit %d\n%s", code, rt2.errOut)
	}
	recorded := append(firstRun, recordedTurns(rt2.errOut.String())...)
	if len(recorded) < 6 {
		t.Fatalf("%d turns recorded in all, want at least the second runtime's 6", len(recorded))
	}

	_, js, log := connectJS(t, eng.url)
	waitProjectorIdle(t, js)
	got := tenantLog(t, log, tenant)
	checkNoDuplicateIDs(t, got)
	printed := strings.Fields(rt.out.String() + " " + rt2.out.String())
	for _, s := range printed {
		if _, ok := got[s]; !ok && !strings.HasPrefix(s, "a-") {
			t.Errorf("session %s of the second runtime is not in the log", s)
		}
	}
	for _, r := range recorded {
		s := projections.FoldLog(got[r.session])
		tn := s.Turn(r.turn)
		switch {
		case tn == nil:
			t.Errorf("turn %s/%s was recorded (seq %d..%d) but is not in the log", r.session, r.turn, r.first, r.last)
		case string(tn.Status) != r.outcome:
			t.Errorf("turn %s/%s: status %s in the log, the runtime recorded %s", r.session, r.turn, tn.Status, r.outcome)
		case tn.StartedSeq != r.first && tn.StartedSeq != r.first+1, tn.EndedSeq != r.last:
			t.Errorf("turn %s/%s: seq %d..%d in the log, acknowledged at %d..%d", r.session, r.turn, tn.StartedSeq, tn.EndedSeq, r.first, r.last)
		}
	}
	for session, evs := range got {
		for _, ev := range evs {
			if ev.Err != nil {
				t.Errorf("%s: invalid event at seq %d: %v", session, ev.Seq, ev.Err)
			}
		}
	}
	checkProjectionsEqualReplay(t, eng.url, log, tenant, got)
	eng.stop(t)
}

func firstLine(s string) string {
	first, _, _ := strings.Cut(strings.TrimSpace(ansi.ReplaceAllString(s, "")), "\n")
	return first
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(ansi.ReplaceAllString(s, "")), "\n")
	return lines[len(lines)-1]
}
