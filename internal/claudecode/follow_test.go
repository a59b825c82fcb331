package claudecode_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/claudecode"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/internal/importer/importertest"
	"github.com/turnstone-dev/turnstone/projections"
)

// corpus is a shipped transcript, by its path under
// shared/data/transcripts/claude-code beside the repository.
func corpus(t testing.TB, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "shared", "data", "transcripts", "claude-code", filepath.FromSlash(rel)))
	if err != nil {
		t.Fatalf("shipped transcript %s (shared/data beside the repository): %v", rel, err)
	}
	return b
}

// following is a Follower running on an embedded log in a test.
type following struct {
	log   *events.Log
	store claudecode.Store
	reads chan claudecode.FollowRead
	done  chan error
	stop  context.CancelFunc
}

func follow(t *testing.T, cfg claudecode.FollowConfig, paths ...string) *following {
	t.Helper()
	srv := embeddedtest.Start(t)
	_, js := embeddedtest.Connect(t, srv)
	log, err := events.Open(context.Background(), js, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &following{log: log, store: claudecode.LogStore(log), reads: make(chan claudecode.FollowRead, 1024), done: make(chan error, 1)}
	cfg.OnRead = func(rd claudecode.FollowRead) {
		select {
		case f.reads <- rd:
		default:
		}
	}
	fl, err := claudecode.NewFollower(f.store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.stop = cancel
	go func() { f.done <- fl.Run(ctx, paths) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-f.done:
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after its context was cancelled")
		}
	})
	return f
}

// session reads a session's events from the log (none when it holds none).
func (f *following) session(t *testing.T, tenant, session string) []events.Event {
	t.Helper()
	var evs []events.Event
	_ = f.log.ReadSession(context.Background(), tenant, session, events.ReadOptions{}, func(ev events.Event) error {
		evs = append(evs, ev)
		return nil
	})
	return evs
}

// waitFor polls the session's events until cond holds (up to 20 s).
func (f *following) waitFor(t *testing.T, what, tenant, session string, cond func([]events.Event) bool) []events.Event {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		evs := f.session(t, tenant, session)
		if cond(evs) {
			return evs
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached; the log holds %d events", what, len(evs))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// liveWhole is the projection a live conversion of the whole of data
// gives (importertest.Normal), and its session's token.
func liveWhole(t *testing.T, data []byte, name string) any {
	t.Helper()
	c, err := claudecode.NewConverter(claudecode.Options{})
	if err != nil {
		t.Fatal(err)
	}
	log := importertest.NewMemLog()
	res := importertest.Import(t, c, log, data, name, true)
	evs, _ := log.Events(context.Background(), res.Sessions[0].Tenant, res.Sessions[0].Session)
	return importertest.Normal(importertest.Fold(evs))
}

func ids(evs []events.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.ID
	}
	return out
}

// TestFollowRecordsAFileAsItIsWritten writes a real transcript into a
// followed directory the way Claude Code does, line by line, with some
// lines written in two pieces and a pause mid-turn: the log ends up with
// the projection the whole file gives, the session is live, and nothing
// is flagged.
func TestFollowRecordsAFileAsItIsWritten(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	project := filepath.Join(dir, "-home-user-repo")
	f := follow(t, claudecode.FollowConfig{Settle: 20 * time.Millisecond}, dir)

	data := corpus(t, "spotter/tool_heavy.jsonl")
	lines := strings.SplitAfter(string(data), "\n")
	// The project directory appears after the follower started.
	if err := os.MkdirAll(project, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(project, "d6e0bada-1959-4eec-a9d2-0bfade768d8f.jsonl")
	file, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	const session = "d6e0bada-1959-4eec-a9d2-0bfade768d8f"
	firstUse := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, `"type":"tool_use"`) })
	for i, l := range lines {
		if i%3 == 0 && len(l) > 10 {
			// A line written in two pieces: the first waits for the rest.
			if _, err := file.WriteString(l[:len(l)/2]); err != nil {
				t.Fatal(err)
			}
			time.Sleep(30 * time.Millisecond)
			l = l[len(l)/2:]
		}
		if _, err := file.WriteString(l); err != nil {
			t.Fatal(err)
		}
		if i == firstUse+1 {
			// Mid-turn: the tool's result is written; the response may
			// still grow. Nothing after the prompt's turn.started ends it.
			time.Sleep(300 * time.Millisecond)
			evs := f.session(t, claudecode.DefaultTenant, session)
			st := fold(evs)
			if len(st.InFlight) != 1 || st.Totals.Violations != 0 {
				for rd := range drain(f.reads) {
					t.Logf("read %+v", rd)
				}
				t.Fatalf("mid-turn (line %d): %d events, in flight %v, violations %+v", i, len(evs), st.InFlight, st.Violations)
			}
		}
	}
	want := liveWhole(t, data, path)
	evs := f.waitFor(t, "the whole file recorded", claudecode.DefaultTenant, session, func(evs []events.Event) bool {
		return len(importertest.Diff(want, importertest.Normal(fold(evs)), 1)) == 0
	})
	st := fold(evs)
	if st.History || st.Totals.Violations != 0 || len(st.InFlight) != 0 || st.Totals.Turns != 2 {
		t.Fatalf("followed session: history %v, violations %+v, in flight %v, %d turns", st.History, st.Violations, st.InFlight, st.Totals.Turns)
	}
	for rd := range drain(f.reads) {
		if len(rd.Diagnostics) > 0 || rd.Err != nil {
			t.Errorf("read %+v", rd)
		}
	}
}

func drain(c chan claudecode.FollowRead) func(func(claudecode.FollowRead) bool) {
	return func(yield func(claudecode.FollowRead) bool) {
		for {
			select {
			case rd := <-c:
				if !yield(rd) {
					return
				}
			default:
				return
			}
		}
	}
}

func fold(evs []events.Event) *projections.Session { return projections.FoldLog(evs) }

// TestFollowAnOldFileIsHistoryUntilItGrows: a transcript already there
// and not written recently is imported as history; when it grows, its
// session becomes live.
func TestFollowAnOldFileIsHistoryUntilItGrows(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := corpus(t, "spotter/short.jsonl")
	lines := strings.SplitAfter(strings.TrimSuffix(string(data), "\n"), "\n")
	path := filepath.Join(dir, "55604662-cf2a-4331-851a-ec234028f8ca.jsonl")
	if err := os.WriteFile(path, []byte(strings.Join(lines[:len(lines)-3], "")), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	const session = "55604662-cf2a-4331-851a-ec234028f8ca"
	f := follow(t, claudecode.FollowConfig{Settle: 20 * time.Millisecond}, path)
	evs := f.waitFor(t, "the old file imported", claudecode.DefaultTenant, session, func(evs []events.Event) bool { return len(evs) > 0 })
	time.Sleep(100 * time.Millisecond)
	if st := fold(f.session(t, claudecode.DefaultTenant, session)); !st.History {
		t.Fatalf("an old file's session is not history (%d events)", len(evs))
	}
	fh, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteString(strings.Join(lines[len(lines)-3:], "") + "\n"); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	evs = f.waitFor(t, "the grown file recorded live", claudecode.DefaultTenant, session, func(evs []events.Event) bool {
		return !fold(evs).History
	})
	if st := fold(evs); st.Totals.Violations != 0 {
		t.Fatalf("violations %+v", st.Violations)
	}
}

// TestFollowStopsOnCancel: Run returns nil at once when its context is
// cancelled, with nothing written.
func TestFollowStopsOnCancel(t *testing.T) {
	t.Parallel()
	f := follow(t, claudecode.FollowConfig{}, t.TempDir())
	time.Sleep(50 * time.Millisecond)
	f.stop()
	select {
	case err := <-f.done:
		if err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
		f.done <- nil // for the cleanup
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return")
	}
}

// TestFollowMissingPath: a path that does not exist is an error at once.
func TestFollowMissingPath(t *testing.T) {
	t.Parallel()
	fl, err := claudecode.NewFollower(nil, claudecode.FollowConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := fl.Run(context.Background(), []string{filepath.Join(t.TempDir(), "nope")}); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Run = %v, want a not-exist error", err)
	}
}

// TestFollowRecordsParallelToolUsesBeforeSilence writes, at Claude Code's
// pace, a prompt and one API response whose two parallel tool_use blocks
// come as two records (with the thinking before them), then nothing: the
// runtime died while its tools ran. Both tool_use blocks are in the log
// well within a second, pending in a turn in flight, so that the engine's
// deadline can abandon the turn and make both orphans; a third record of
// the same response written later (the runtime was only slow) continues
// the message, and the results then answer both.
func TestFollowRecordsParallelToolUsesBeforeSilence(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	f := follow(t, claudecode.FollowConfig{}, dir) // the default settle time
	path := filepath.Join(dir, "sess-par.jsonl")
	fh, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	now := time.Now().UTC()
	at := func(d time.Duration) string { return now.Add(d).Format(time.RFC3339Nano) }
	rec := func(uuid, typ string, d time.Duration, msg string) string {
		return fmt.Sprintf(`{"type":%q,"uuid":%q,"parentUuid":null,"sessionId":"sess-par","timestamp":%q,"version":"2.1.39","message":%s}`+"\n", typ, uuid, at(d), msg)
	}
	asst := func(content string) string {
		return `{"id":"msg_par","model":"claude-opus-4-6","role":"assistant","type":"message","stop_reason":null,"content":[` + content + `]}`
	}
	lines := []string{
		rec("p1", "user", 0, `{"role":"user","content":"run both"}`),
		rec("a1", "assistant", 900*time.Millisecond, asst(`{"type":"thinking","thinking":"both at once","signature":"s"}`)),
		rec("a2", "assistant", 1200*time.Millisecond, asst(`{"type":"tool_use","id":"toolu_P1","name":"Bash","input":{"command":"sleep 60"}}`)),
		rec("a3", "assistant", 1350*time.Millisecond, asst(`{"type":"tool_use","id":"toolu_P2","name":"Bash","input":{"command":"sleep 61"}}`)),
	}
	pace := []time.Duration{0, 300 * time.Millisecond, 150 * time.Millisecond, 150 * time.Millisecond}
	for i, l := range lines {
		time.Sleep(pace[i])
		if _, err := fh.WriteString(l); err != nil {
			t.Fatal(err)
		}
	}
	wrote := time.Now()
	evs := f.waitFor(t, "both tool_use blocks recorded", claudecode.DefaultTenant, "sess-par", func(evs []events.Event) bool {
		return len(fold(evs).Pending) == 2
	})
	// The settle time is 100 ms; the bound leaves room for a loaded CI
	// machine running race-built packages side by side (2 s flaked there)
	// and still fails a follower that waits for a next record that never
	// comes.
	if took := time.Since(wrote); took > 5*time.Second {
		t.Errorf("the tool_use blocks took %v to reach the log after the last write", took)
	}
	st := fold(evs)
	if len(st.InFlight) != 1 || st.History || st.Totals.Violations != 0 || len(st.Messages) != 2 || st.Messages[1].ToolUses != 2 {
		t.Fatalf("after the silence: in flight %v, history %v, violations %+v, messages %+v", st.InFlight, st.History, st.Violations, st.Messages)
	}
	if tn := st.Turn(st.InFlight[0]); tn == nil || tn.Stage != events.StageExecute {
		t.Fatalf("the turn running its tools is not in execute: %+v", tn)
	}
	// What the engine's deadline then writes makes both orphans.
	abandoned, err := events.New(claudecode.DefaultTenant, "sess-par", st.InFlight[0], &events.TurnAbandoned{Reason: "deadline", Stage: events.StageExecute})
	if err != nil {
		t.Fatal(err)
	}
	abandoned.Seq = evs[len(evs)-1].Seq + 1
	if st := fold(append(slices.Clone(evs), abandoned)); st.Totals.Orphans != 2 {
		t.Fatalf("abandoned: %d orphans, want both tool_use blocks (%+v)", st.Totals.Orphans, st.Orphans)
	}

	// The runtime was slow, not dead: the response goes on, then the
	// results come.
	more := []string{
		rec("a4", "assistant", 2*time.Second, asst(`{"type":"text","text":"Waiting for both."}`)),
		rec("r1", "user", 62*time.Second, `{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_P1","content":"ok"}]}`),
		rec("r2", "user", 63*time.Second, `{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_P2","content":"ok"}]}`),
	}
	for _, l := range more {
		if _, err := fh.WriteString(l); err != nil {
			t.Fatal(err)
		}
	}
	evs = f.waitFor(t, "both answered", claudecode.DefaultTenant, "sess-par", func(evs []events.Event) bool {
		st := fold(evs)
		return len(st.Pending) == 0 && len(st.Messages) == 3
	})
	if st := fold(evs); st.Totals.Violations != 0 || st.Messages[1].ToolUses != 2 || len(st.Messages[1].Blocks) != 4 {
		t.Fatalf("grown: violations %+v, messages %+v", st.Violations, st.Messages)
	}
}
