// Package test holds Turnstone's end-to-end tests: real embedded NATS
// servers, real processes, real transcripts.
package test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/claudecode"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/internal/importer/importertest"
	"github.com/turnstone-dev/turnstone/projections"
)

// transcriptsDir is where the shared real transcripts live, beside the
// repository.
const transcriptsDir = "../../shared/data/transcripts/claude-code"

func transcripts(t testing.TB) []string {
	t.Helper()
	if _, err := os.Stat(transcriptsDir); err != nil {
		t.Fatalf("real transcripts not found at %s (the shared data sits beside the repository): %v", transcriptsDir, err)
	}
	files, err := claudecode.Expand([]string{transcriptsDir})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 20 {
		t.Fatalf("found %d transcript files under %s, want the 25 shipped", len(files), transcriptsDir)
	}
	return files
}

// corpusSample returns files, or under the race detector those of at
// most importertest.SampleBytes (256 KiB), in their order: 117 of the 140
// Claude Code and Codex files, 5.3 of 32 MB, which still hold every record
// shape the larger ones do (subagents, compactions, parallel tool calls,
// cuts). The tests over a whole corpus fold single-threaded, where the
// race detector finds nothing and runs ten to twenty times slower; the
// whole corpus runs without it (scripts/fullsize, and any go test without
// -race). The files named in keep are kept whatever their size.
func corpusSample(t testing.TB, files []string, keep ...string) []string {
	t.Helper()
	if !raceEnabled {
		return files
	}
	kept := importertest.Sample(t, files, keep...)
	named := ""
	if len(keep) > 0 {
		named = fmt.Sprintf(", and the %d named", len(keep))
	}
	t.Logf("race detector on: %d of %d transcripts (those of at most %d KiB%s)", len(kept), len(files), importertest.SampleBytes>>10, named)
	return kept
}

type env struct {
	log   *events.Log
	js    jetstream.JetStream
	store *projections.SnapshotStore
}

func newEnv(t *testing.T) *env {
	t.Helper()
	srv := embeddedtest.Start(t)
	_, js := embeddedtest.Connect(t, srv)
	log, err := events.Open(context.Background(), js, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	store, err := projections.NewSnapshotStore(js, projections.SnapshotConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return &env{log: log, js: js, store: store}
}

func (e *env) importFiles(t *testing.T, tenant string, files ...string) *claudecode.Report {
	t.Helper()
	rep, err := claudecode.Import(context.Background(), claudecode.LogStore(e.log), files, claudecode.Options{Tenant: tenant}, nil)
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	return rep
}

func (e *env) restore(t *testing.T, tenant, session string) *projections.Session {
	t.Helper()
	s, err := projections.Restore(context.Background(), e.log, e.store, tenant, session)
	if err != nil {
		t.Fatalf("restore %s/%s: %v", tenant, session, err)
	}
	return s
}

// TestEveryShippedTranscriptImportsClean imports the shipped Claude Code
// transcripts and restores every session: no diagnostic, no orphan, no
// violation, no pending tool_use, no turn in flight, every distillation
// over a clean history. Under the race detector it reads the files of at
// most 256 KiB (corpusSample); .ci/run's full-size pass reads them all.
func TestEveryShippedTranscriptImportsClean(t *testing.T) {
	skipShort(t, "reads the whole transcript corpus")
	parallel(t)
	e := newEnv(t)
	files := transcripts(t)
	sampled := raceEnabled
	files = corpusSample(t, files)
	rep := e.importFiles(t, "real", files...)
	if len(rep.Diagnostics) != 0 {
		t.Fatalf("diagnostics on the shipped transcripts: %v", rep.Diagnostics)
	}
	if rep.Appended != rep.Events || rep.Events == 0 {
		t.Fatalf("report %+v: want every converted event appended", rep)
	}
	refs, err := e.log.Sessions(context.Background(), "real")
	if err != nil {
		t.Fatal(err)
	}
	if len(refs) != rep.Sessions {
		t.Fatalf("log holds %d sessions, import converted %d", len(refs), rep.Sessions)
	}
	distilled := 0
	for _, r := range refs {
		s := e.restore(t, r.Tenant, r.Session)
		if ids := s.OrphanedToolUseIDs(); len(ids) != 0 {
			t.Errorf("%s: orphans %v on a clean transcript", r.Session, ids)
		}
		if s.Totals.Violations != 0 || s.Totals.InvalidEvents != 0 {
			t.Errorf("%s: %d violations, %d invalid events: %+v", r.Session, s.Totals.Violations, s.Totals.InvalidEvents, s.Violations)
		}
		if len(s.Pending) != 0 {
			t.Errorf("%s: %d tool_use still pending after import", r.Session, len(s.Pending))
		}
		if s.Totals.Turns == 0 {
			t.Errorf("%s: no turn", r.Session)
		}
		for _, tn := range s.Turns {
			if tn.Status == projections.TurnInFlight {
				t.Errorf("%s: turn %s still in flight after import", r.Session, tn.ID)
			}
		}
		for _, d := range s.Distillations {
			if d.CompletedSeq != 0 {
				distilled++
				if !d.Clean {
					t.Errorf("%s: distillation at seq %d over a dirty history: %v", r.Session, d.CompletedSeq, d.DirtyReasons)
				}
			}
		}
	}
	// Each long spotter session has one compact_boundary (the sample
	// under the race detector holds none of them).
	if !sampled && distilled < 5 {
		t.Errorf("found %d completed distillations, want one per long spotter session (5)", distilled)
	}
}

func TestCompactionBecomesADistillation(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	file := filepath.Join(transcriptsDir, "spotter", "258c7280-ae70-4798-800f-63464d01a85d.jsonl")
	e.importFiles(t, "real", file)
	s := e.restore(t, "real", "258c7280-ae70-4798-800f-63464d01a85d")
	if len(s.Distillations) != 1 {
		t.Fatalf("distillations: %+v, want 1", s.Distillations)
	}
	d := s.Distillations[0]
	if d.Trigger != "auto" || d.TokensBefore != 167094 || !d.Clean || d.CompletedSeq == 0 {
		t.Fatalf("distillation %+v: want a clean auto compaction of 167094 tokens", d)
	}
	// The history restarts at the compaction with the summary.
	if s.HistoryStart.Seq != d.CompletedSeq {
		t.Fatalf("history starts at seq %d, the distillation completed at %d", s.HistoryStart.Seq, d.CompletedSeq)
	}
	// The state keeps the latest messages of the history
	// (projections.KeepMessages): the first one after the compaction is
	// the first the state holds when folded up to it.
	at := &projections.Session{}
	err := e.log.ReadSession(context.Background(), "real", s.Session, events.ReadOptions{}, func(ev events.Event) error {
		at.Apply(ev)
		if ev.Seq > d.CompletedSeq && ev.Type == events.TypeMessageAppended {
			return errStopFold
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStopFold) {
		t.Fatal(err)
	}
	if len(at.Messages) != 1 || at.MessagesDropped != 0 || at.Messages[0].Role != events.RoleUser || !at.Messages[0].Meta {
		t.Fatalf("first message after the compaction: %+v, want the summary (user, meta)", at.Messages)
	}
}

var errStopFold = errors.New("stop the fold")

// TestSecondImportAddsNothing imports the shipped transcripts twice: the
// second import appends nothing and finds every event. Under the race
// detector it reads the files of at most 256 KiB (corpusSample); .ci/run's
// full-size pass reads them all.
func TestSecondImportAddsNothing(t *testing.T) {
	skipShort(t, "reads the whole transcript corpus twice")
	parallel(t)
	e := newEnv(t)
	files := corpusSample(t, transcripts(t))
	first := e.importFiles(t, "real", files...)
	info := func() uint64 {
		st, err := e.js.Stream(context.Background(), events.EventsStream)
		if err != nil {
			t.Fatal(err)
		}
		i, err := st.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return i.State.Msgs
	}
	before := info()
	second := e.importFiles(t, "real", files...)
	if second.Appended != 0 || second.Existing != first.Events {
		t.Fatalf("second import appended %d, found %d existing; want 0 and %d", second.Appended, second.Existing, first.Events)
	}
	if after := info(); after != before {
		t.Fatalf("stream grew from %d to %d messages on the second import", before, after)
	}
}

// cutAfterToolUse copies a transcript up to and including the nth
// (0-based) assistant record that holds a tool_use, and returns the new file
// and the ids of the tool_use blocks the cut leaves unanswered: that record's,
// and those of earlier records of the same API response (Claude Code writes
// one record per content block, so parallel tool calls span several).
func cutAfterToolUse(t *testing.T, src string, n int) (string, []string) {
	t.Helper()
	f, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var kept []string
	seen := 0
	msgID := ""
	var open []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Text()
		kept = append(kept, line)
		var rec struct {
			Type    string `json:"type"`
			Message struct {
				ID      string          `json:"id"`
				Content json.RawMessage `json:"content"`
			} `json:"message"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil || rec.Type != "assistant" {
			continue
		}
		if rec.Message.ID != msgID {
			msgID, open = rec.Message.ID, nil
		}
		var blocks []events.ContentBlock
		if json.Unmarshal(rec.Message.Content, &blocks) != nil {
			continue
		}
		for _, b := range blocks {
			if b.Type != events.BlockToolUse {
				continue
			}
			open = append(open, b.ID)
			if seen == n {
				out := filepath.Join(t.TempDir(), filepath.Base(src))
				if err := os.WriteFile(out, []byte(strings.Join(kept, "\n")+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				sort.Strings(open)
				return out, open
			}
			seen++
		}
	}
	t.Fatalf("%s has no %dth tool_use", src, n)
	return "", nil
}

// TestCutTranscriptReportsExactlyTheOrphan cuts real transcripts right
// after a tool_use record. Imported as it is, the cut leaves the turn in
// flight with exactly those tool_use blocks pending: the file does not say
// whether the tool is still running. When the transcript goes on with a
// new prompt and no result (the process died, the person typed again),
// exactly those become orphans.
// nextPrompt appends to the transcript file a person's next prompt, a
// second after its last record, as Claude Code writes one, and returns
// the file.
func nextPrompt(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var last struct {
		SessionID string    `json:"sessionId"`
		Timestamp time.Time `json:"timestamp"`
	}
	for i := len(lines) - 1; i >= 0 && last.SessionID == ""; i-- {
		_ = json.Unmarshal([]byte(lines[i]), &last)
	}
	rec, _ := json.Marshal(map[string]any{
		"type": "user", "uuid": "b1a5e0c4-0000-4000-8000-000000000001", "sessionId": last.SessionID,
		"timestamp": last.Timestamp.Add(time.Second).Format(time.RFC3339Nano),
		"message":   map[string]any{"role": "user", "content": "are you still there?"},
	})
	if err := os.WriteFile(file, append(b, append(rec, '\n')...), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

func TestCutTranscriptReportsExactlyTheOrphan(t *testing.T) {
	skipShort(t, "cuts and imports long transcripts")
	parallel(t)
	e := newEnv(t)
	cases := []struct {
		file string
		nth  int
	}{
		{"spotter/short.jsonl", 0},
		{"spotter/tool_heavy.jsonl", 3},
		{"spotter/4d5611e5-241a-462a-8d15-5122611a9569.jsonl", 40},
		{"ccviewer/fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl", 5},
		{"spotter/ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl", 0},
		{"spotter/fa812bfe-b295-4cca-9c2f-fdf01028cb46.jsonl", 100},
	}
	parallel := 0
	for i, c := range cases {
		cut, ids := cutAfterToolUse(t, filepath.Join(transcriptsDir, c.file), c.nth)
		if len(ids) > 1 {
			parallel++
		}
		tenant := "cut" + string(rune('a'+i))
		rep := e.importFiles(t, tenant, cut)
		if len(rep.Diagnostics) != 0 {
			t.Fatalf("%s: diagnostics %v", c.file, rep.Diagnostics)
		}
		refs, err := e.log.Sessions(context.Background(), tenant)
		if err != nil || len(refs) != 1 {
			t.Fatalf("%s: sessions %v, err %v", c.file, refs, err)
		}
		s := e.restore(t, tenant, refs[0].Session)
		pending := append([]string(nil), s.Pending...)
		sort.Strings(pending)
		if strings.Join(pending, " ") != strings.Join(ids, " ") || len(s.InFlight) != 1 || s.Totals.Violations != 0 || !s.History {
			t.Errorf("%s cut after a tool_use record: pending %v (want %v), in flight %v, violations %+v", c.file, pending, ids, s.InFlight, s.Violations)
		}
		e.importFiles(t, tenant, nextPrompt(t, cut))
		s = e.restore(t, tenant, refs[0].Session)
		got := s.OrphanedToolUseIDs()
		sort.Strings(got)
		if strings.Join(got, " ") != strings.Join(ids, " ") {
			t.Errorf("%s cut after a tool_use record: orphans %v, want exactly %v", c.file, got, ids)
			continue
		}
		for _, o := range s.Orphans {
			if o.Name == "" || o.Seq == 0 || o.Turn == "" {
				t.Errorf("%s: orphan %+v lacks its tool name, sequence or turn", c.file, o)
			}
		}
		if s.Totals.Violations != len(ids) {
			t.Errorf("%s: %d violations, want one per orphan: %+v", c.file, s.Totals.Violations, s.Violations)
		}
	}
	if parallel == 0 {
		t.Error("no case cut inside a response with parallel tool calls; pick one that does")
	}
}
