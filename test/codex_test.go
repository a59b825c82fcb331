package test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/codex"
	"github.com/turnstone-dev/turnstone/internal/enginetest"
	"github.com/turnstone-dev/turnstone/internal/importer"
	"github.com/turnstone-dev/turnstone/internal/importer/importertest"
	"github.com/turnstone-dev/turnstone/internal/reconciler"
)

// codexDir holds real OpenAI Codex rollouts (shared/data/wild/codex
// beside the repository; each folder's SOURCE.txt analyses every file).
const codexDir = "../../shared/data/wild/codex"

// codexRollouts lists every shipped rollout, whatever its file name (a
// directory import takes rollout-*.jsonl only; one fixture is named
// otherwise).
func codexRollouts(t testing.TB) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(codexDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".jsonl") {
			files = append(files, p)
		}
		return err
	})
	if err != nil || len(files) < 7 {
		t.Fatalf("the Codex rollouts are missing at %s (shared/data beside the repository): %d files, %v", codexDir, len(files), err)
	}
	return files
}

// TestEveryDetectorOnEveryCodexRollout is TestEveryDetectorOnEveryRealTranscript
// for Codex: every shipped rollout imported, every session folded from
// the log and run through every detector, asserted per file. The real
// sessions give no anomaly; what is not zero is explained below.
//
//   - 019c8a70 (Codex Desktop 0.104) ends on an exec_command call with no
//     output: its turn stays in flight with the call pending, no orphan
//     (the file does not say whether the command still runs).
//   - The 0.77 `codex exec` run ends on a tool output the model has not
//     answered (the fixture stops there): in flight.
//   - The 0.146 fixture is synthetic, its ids and times "[trimmed for
//     fixture]": right after a compaction (whose summary opens the new
//     history) comes an output for a call id that no call of it has
//     (tool_result_without_tool_use, and results_not_first: it follows the
//     summary's text in one user message), the next compaction runs over
//     that history (distillation_dirty_history), an error event is
//     recorded, and its last task never ends (in flight). Its real shapes
//     are all paired: the output written after turn_aborted answers its
//     call, the web search makes no call.
func TestEveryDetectorOnEveryCodexRollout(t *testing.T) {
	skipShort(t, "reads every Codex rollout")
	parallel(t)
	files := codexRollouts(t)
	e := newEnv(t)
	rep, err := importer.Import(context.Background(), importer.LogStore(e.log), codex.Format, files, importer.Options{Tenant: "codex"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Diagnostics) != 0 || rep.Sessions != len(files) {
		t.Fatalf("%d sessions of %d rollouts, diagnostics %v", rep.Sessions, len(files), rep.Diagnostics)
	}
	policy := reconciler.DefaultPolicy()
	got := map[string]detected{}
	conv, _ := codex.NewConverter(importer.Options{Tenant: "codex"})
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		res, err := conv.Convert(fh, f, importer.Input{})
		fh.Close()
		if err != nil {
			t.Fatal(err)
		}
		d := detected{}
		for _, s := range res.Sessions {
			detect(t, e, "codex", s.Session, policy, &d)
			d.sessions++
		}
		r, _ := filepath.Rel(codexDir, f)
		got[filepath.ToSlash(r)] = d
	}
	for f, w := range wantCodexDetected {
		if got[f] != w {
			t.Errorf("%s:\n got %#v\nwant %#v", f, got[f], w)
		}
	}
	if len(got) != len(wantCodexDetected) {
		t.Errorf("%d rollouts, %d expectations", len(got), len(wantCodexDetected))
	}
	if os.Getenv("TURNSTONE_PRINT_DETECTED") != "" {
		for f, d := range got {
			fmt.Printf("\t%q: %#v,\n", f, d)
		}
	}
}

var wantCodexDetected = map[string]detected{
	"codemie-ai__codemie-code/codex/rollout-2026-01-02T18-39-45-019b7f94-51b4-7593-922e-ba12b5b73b52.jsonl": {turns: 1, inFlight: 1, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"jazzyalex__agent-sessions/codex_small_0.146.0.jsonl":                                                   {turns: 2, inFlight: 1, violations: "distillation_dirty_history:1 results_not_first:1 tool_result_without_tool_use:1", orphans: 0, invalid: 0, outputs: 1, errors: 1, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"madshn__localpush/sessions/rollout-2026-02-23T12-40-23-019c8a4c-ed82-79a1-aa28-7738fc5ab61a.jsonl":     {turns: 5, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"madshn__localpush/sessions/rollout-2026-02-23T12-41-04-019c8a4d-8f45-7010-8b5d-7fad920aa6f9.jsonl":     {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"madshn__localpush/sessions/rollout-2026-02-23T12-54-34-019c8a59-e9dd-71f0-9ae3-4079fe9726a9.jsonl":     {turns: 33, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"madshn__localpush/sessions/rollout-2026-02-23T13-19-38-019c8a70-dda7-7f33-98ea-f30553347322.jsonl":     {turns: 1, inFlight: 1, violations: "", orphans: 0, invalid: 0, outputs: 0, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"madshn__localpush/sessions/rollout-2026-02-23T20-34-25-019c8bfe-ec25-79e0-97d7-bda6a9c575ff.jsonl":     {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
}

// TestCodexImportInspectAndWebView imports every Codex rollout with the
// engine binary: the report shows no line skipped and the record types it
// does not know, counted; a second import adds nothing; `inspect` and the
// web view show each session's runtime and version, and the session that
// ends on a call with its turn in flight, in execute, the call pending.
func TestCodexImportInspectAndWebView(t *testing.T) {
	skipShort(t, "runs engine processes")
	parallel(t)
	ui := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	eng := startEngine(t, t.TempDir(), "--sync", "1s", "--ui-listen", ui)
	files := codexRollouts(t)
	out := run(t, eng.url, append([]string{"import", "--format", "codex", "--quiet"}, files...)...)
	if !strings.Contains(out, fmt.Sprintf("imported %d files, %d sessions", len(files), len(files))) || !strings.Contains(out, "; 0 lines skipped;") ||
		!strings.Contains(out, "unknown record types (counted, not imported): inter_agent_communication_metadata 1, world_state 5") {
		t.Fatalf("import report:\n%s", out)
	}
	if again := run(t, eng.url, "import", "--format", "codex", "--quiet", codexDir, files[len(files)-1]); !strings.Contains(again, "(0 appended") {
		t.Fatalf("second import appended events:\n%s", again)
	}

	// 019c8a70 ends on a call with no output, months ago: as history it
	// reads interrupted in `inspect` and `sessions`, naming the call.
	const pending, call = "019c8a70-dda7-7f33-98ea-f30553347322", "call_UtYwHmwWekzvq83m8Rb9K8jJ"
	inspect := run(t, eng.url, "inspect", "default/"+pending)
	for _, want := range []string{"codex 0.104.0-alpha.1", "in stage execute", "1 pending: " + call,
		"status      interrupted: the history ends mid-turn"} {
		if !strings.Contains(inspect, want) {
			t.Errorf("inspect does not show %q:\n%s", want, inspect)
		}
	}
	var st struct {
		Runtime  string   `json:"runtime"`
		Status   string   `json:"status"`
		InFlight []string `json:"in_flight"`
		Pending  []string `json:"pending"`
		History  bool     `json:"history"`
		View     struct {
			PendingToolUseIDs []string `json:"pending_tool_use_ids"`
		} `json:"view"`
	}
	if err := json.Unmarshal([]byte(run(t, eng.url, "inspect", "default/"+pending, "--json")), &st); err != nil {
		t.Fatal(err)
	}
	if st.Runtime != "codex 0.104.0-alpha.1" || st.Status != "interrupted" || len(st.InFlight) != 1 || len(st.Pending) != 1 || st.Pending[0] != call ||
		!st.History || len(st.View.PendingToolUseIDs) != 1 || st.View.PendingToolUseIDs[0] != call {
		t.Errorf("inspect --json: %+v", st)
	}
	// The fleet index is written within --sync of the last event.
	waitFor(t, "sessions lists the Codex session that ends mid-turn as interrupted, with its call", func() bool {
		out := run(t, eng.url, "sessions", "--tenant", "default")
		return strings.Contains(out, "interrupted: default/"+pending+" ends mid-turn") &&
			strings.Contains(out, "tool_use without its result: "+call)
	})
	// The three rollouts that end inside a turn (wantCodexDetected's
	// inFlight) are interrupted; only 019c8a70 left a call unanswered. Each
	// session's row is written within --sync of its own last event, so a
	// row may still show an earlier state (a call that its next line
	// answers) for that long: the rows are read until all are current.
	want := fmt.Sprint(map[string]string{pending: call, "019b7f94-51b4-7593-922e-ba12b5b73b52": "", "019fc8be-3658-7ca3-9e29-000000000000": ""})
	var got string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("sessions --json, interrupted sessions and their pending calls: %s, want %s", got, want)
		}
	})
	waitFor(t, "sessions --json lists the interrupted Codex sessions with their pending calls", func() bool {
		var rows []struct {
			Session           string   `json:"session"`
			Status            string   `json:"status"`
			PendingToolUseIDs []string `json:"pending_tool_use_ids"`
		}
		if err := json.Unmarshal([]byte(run(t, eng.url, "sessions", "--tenant", "default", "--json")), &rows); err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, r := range rows {
			if r.Status == "interrupted" {
				m[r.Session] = strings.Join(r.PendingToolUseIDs, ",")
			}
		}
		got = fmt.Sprint(m)
		return got == want
	})

	get := httpGet
	waitFor(t, "the web view lists the Codex sessions with their runtime", func() bool {
		code, body := get("http://" + ui + "/ui/?tenant=default&runtime=codex")
		return code == 200 && strings.Contains(body, `data-session="default/`+pending+`"`) &&
			strings.Contains(body, "codex 0.77.0") && strings.Contains(body, "codex 0.146.0")
	})
	if code, body := get("http://" + ui + "/ui/session/default/" + pending); code != 200 || !strings.Contains(body, "runtime codex 0.104.0-alpha.1") {
		t.Errorf("the session page: %d\n%s", code, body)
	}
	eng.stop(t)
}

// TestFollowCodexRolloutLive writes a rollout, line by line at Codex's
// pace with the times Codex would write, into a day folder created under
// a followed ~/.codex/sessions after the follower started, with an engine
// running: the session is recorded live as it is written, and the call it
// ends on, left unanswered past the turn's deadline, is abandoned by the
// reconciler and becomes an orphan.
func TestFollowCodexRolloutLive(t *testing.T) {
	skipShort(t, "follows a rollout at its real pace")
	parallel(t)
	// The call pending makes the turn's deadline tool_deadline's (2 hours
	// by default: a call may wait that long for a person).
	eng := enginetest.Start(t, enginetest.Options{Policy: "turn_deadline: 30s\ntool_deadline: 30s\n"})
	sessions := t.TempDir()
	fl, err := importer.NewFollower(importer.LogStore(eng.Log), codex.Format, importer.FollowConfig{Options: importer.Options{Tenant: "acme"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fl.Run(ctx, []string{sessions}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("follower: %v", err)
		}
	})

	// 019c8a70: a prompt, reasoning, a commentary, an exec_command call,
	// then nothing (the fixture's session stops there).
	src := importertest.Lines(t, filepath.Join(codexDir, "madshn__localpush", "sessions", "rollout-2026-02-23T13-19-38-019c8a70-dda7-7f33-98ea-f30553347322.jsonl"))
	time.Sleep(100 * time.Millisecond) // the follower watches
	day := filepath.Join(sessions, time.Now().UTC().Format("2006/01/02"))
	if err := os.MkdirAll(day, 0o755); err != nil {
		t.Fatal(err)
	}
	fh, err := os.Create(filepath.Join(day, "rollout-"+time.Now().UTC().Format("2006-01-02T15-04-05")+"-019c8a70-dda7-7f33-98ea-f30553347322.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	first, _ := time.Parse(time.RFC3339Nano, stamp(t, src[0]))
	began := time.Now().UTC()
	for _, l := range src {
		at, _ := time.Parse(time.RFC3339Nano, stamp(t, l))
		// Real pace, ten times faster: the file's own gaps.
		time.Sleep(time.Until(began.Add(at.Sub(first) / 10)))
		now := began.Add(at.Sub(first))
		if _, err := fh.WriteString(strings.Replace(l, stamp(t, l), now.Format("2006-01-02T15:04:05.000Z"), 1)); err != nil {
			t.Fatal(err)
		}
	}
	const session = "019c8a70-dda7-7f33-98ea-f30553347322"
	waitFor(t, "the call recorded, pending, in a live turn", func() bool {
		s, ok := eng.Projector.Session("acme", session)
		return ok && !s.History && len(s.InFlight) == 1 && len(s.Pending) == 1 && s.Pending[0] == "call_UtYwHmwWekzvq83m8Rb9K8jJ"
	})
	if s, _ := eng.Projector.Session("acme", session); s.Totals.Orphans != 0 || s.Totals.Violations != 0 {
		t.Fatalf("before the deadline: %d orphans, violations %+v", s.Totals.Orphans, s.Violations)
	}
	// Codex stays silent: past the deadline, the turn is abandoned and the
	// call is an orphan.
	eng.Clock.Advance(time.Minute)
	waitFor(t, "the silent turn abandoned and its call an orphan", func() bool {
		s, ok := eng.Projector.Session("acme", session)
		return ok && s.Totals.AbandonedTurns == 1 && s.Totals.Orphans == 1
	})
	var abandoned bool
	_ = eng.Log.ReadSession(context.Background(), "acme", session, events.ReadOptions{}, func(ev events.Event) error {
		abandoned = abandoned || ev.Type == events.TypeTurnAbandoned
		return nil
	})
	if !abandoned {
		t.Error("no turn.abandoned in the log")
	}
}

// stamp is a rollout line's timestamp.
func stamp(t *testing.T, l string) string {
	t.Helper()
	var v struct {
		Timestamp string `json:"timestamp"`
	}
	if err := json.Unmarshal([]byte(l), &v); err != nil {
		t.Fatal(err)
	}
	return v.Timestamp
}
