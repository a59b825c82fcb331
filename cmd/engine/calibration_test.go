package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/claudecode"
	"github.com/turnstone-dev/turnstone/internal/codex"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/internal/importer"
	"github.com/turnstone-dev/turnstone/internal/importer/importertest"
	"github.com/turnstone-dev/turnstone/internal/whatif"
)

// The real transcripts (shared/data beside the repository; its README
// says what each holds).
const (
	shippedDir = "../../../shared/data/transcripts/claude-code"
	wildCCDir  = "../../../shared/data/wild/claude-code"
	wildCXDir  = "../../../shared/data/wild/codex"
)

// calibrated is what `engine whatif --assume-live --clock event` decides
// on one real transcript: under the default policy (decisions, the kinds
// in order, space-separated), and under the policy before calibration,
// which counted turn_deadline from a turn's last sign of life at 120 s
// with no tool_deadline (before, the same). why says, from the
// transcript's own times, what set the default thresholds apart for the
// files where the two differ, and why the defaults' decisions are right
// for the files on which they decide anything (a file that ends mid-turn:
// followed live, its runtime went silent); every such file has one, and
// no other.
type calibrated struct {
	decisions, before string
	why               string
}

// beforeCalibration is the policy the defaults replaced: a turn silent
// 120 s is abandoned, whether a tool call is pending or not.
const beforeCalibration = "turn_deadline: 120s\ntool_deadline: 120s\n"

// TestCalibrationWithTime runs `engine whatif --assume-live --clock
// event` in-process over every shipped and wild Claude Code transcript,
// as if each session had been followed live at its own recorded pace,
// with the default policy and with the one before calibration, and
// checks each file's row of wantCalibrated: no decision on a healthy
// session, an abandon and a repair for each real orphan (a transcript
// that ends with a tool_use and no result: a snapshot taken mid-turn,
// imported alone), and a reason for each file the defaults had to be
// changed for. TURNSTONE_PRINT_CALIBRATION=1 prints the rows found.
func TestCalibrationWithTime(t *testing.T) {
	for _, d := range []string{shippedDir, wildCCDir, wildCXDir} {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("the real transcripts are missing at %s (shared/data beside the repository): %v", d, err)
		}
	}
	ctx := context.Background()
	srv := embeddedtest.Start(t)
	_, js := embeddedtest.Connect(t, srv)
	log, err := events.Open(ctx, js, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	all, err := claudecode.Expand([]string{shippedDir, wildCCDir})
	if err != nil {
		t.Fatal(err)
	}
	files := replayable(t, all)
	// Every file into one tenant, as a projects directory holds them (a
	// subagent's file beside its parent's); the snapshots a later file
	// continues (incremental-*/turn-1) also alone, each in a tenant of
	// its own: imported alone, such a file ends mid-turn.
	owner := map[string]string{} // session -> the file that last writes it
	for _, fs := range bulkImport(t, js, log, "real", files, claudeCodeConvert(t, "real")) {
		for _, s := range fs.sessions {
			owner["real/"+s] = calRel(fs.file)
		}
	}
	// Every Codex rollout, as `engine import --format codex` records it,
	// into a tenant of its own (a rollout holds its whole session).
	for _, fs := range bulkImport(t, js, log, "codex", codexRollouts(t), codexConvert(t, "codex")) {
		for _, s := range fs.sessions {
			owner["codex/"+s] = calRel(fs.file)
		}
	}
	var snapshots []string
	for _, f := range files {
		if filepath.Base(f) == "turn-1.jsonl" {
			snapshots = append(snapshots, f)
		}
	}
	for i, f := range snapshots {
		tenant := fmt.Sprintf("cut%d", i)
		group := []string{f}
		if sub, err := filepath.Glob(filepath.Join(strings.TrimSuffix(f, ".jsonl"), "subagents", "*.jsonl")); err == nil {
			group = append(group, sub...)
		}
		for _, fs := range bulkImport(t, js, log, tenant, group, claudeCodeConvert(t, tenant)) {
			for _, s := range fs.sessions {
				owner[tenant+"/"+s] = calRel(fs.file) + " (alone)"
			}
		}
	}

	policy := filepath.Join(t.TempDir(), "before.yaml")
	if err := os.WriteFile(policy, []byte(beforeCalibration), 0o644); err != nil {
		t.Fatal(err)
	}
	tenants := []string{"real", "codex"}
	for i := range snapshots {
		tenants = append(tenants, fmt.Sprintf("cut%d", i))
	}
	run := func(extra ...string) map[string]string {
		t.Helper()
		got := map[string]string{}
		for _, f := range owner {
			got[f] = ""
		}
		for _, tenant := range tenants {
			var out, errb bytes.Buffer
			root := newRootCommand(&out, &errb)
			root.SetArgs(append([]string{"whatif", "--nats-url", srv.ClientURL(), "--tenant", tenant, "--assume-live", "--clock", "event", "--json"}, extra...))
			if err := root.ExecuteContext(ctx); err != nil {
				t.Fatalf("engine whatif %v: %v\n%s", extra, err, errb.String())
			}
			var res []whatif.Result
			if err := json.Unmarshal(out.Bytes(), &res); err != nil {
				t.Fatal(err)
			}
			for _, r := range res {
				f, ok := owner[r.Tenant+"/"+r.Session]
				if !ok {
					t.Fatalf("no file for %s/%s", r.Tenant, r.Session)
				}
				var kinds []string
				for _, d := range r.Decisions {
					if d.Change != whatif.Added {
						t.Errorf("%s/%s: %+v: an import records no decision, every one is added", r.Tenant, r.Session, d)
					}
					kinds = append(kinds, d.Kind)
				}
				got[f] = strings.TrimSpace(got[f] + " " + strings.Join(kinds, " "))
			}
		}
		return got
	}
	now, before := run(), run("--policy", policy)

	names := make([]string, 0, len(now))
	for f := range now {
		names = append(names, f)
	}
	sort.Strings(names)
	if os.Getenv("TURNSTONE_PRINT_CALIBRATION") != "" {
		for _, f := range names {
			fmt.Printf("\t%q: {decisions: %q, before: %q},\n", f, now[f], before[f])
		}
	}
	for _, f := range names {
		w, ok := wantCalibrated[f]
		if !ok {
			w = calibrated{} // a healthy file: nothing decided either way
		}
		if now[f] != w.decisions || before[f] != w.before {
			t.Errorf("%s: decides %q (before calibration %q), want %q (%q)", f, now[f], before[f], w.decisions, w.before)
		}
		if (now[f] != before[f] || now[f] != "") != (w.why != "") {
			t.Errorf("%s: decides %q (before calibration %q); the table says why exactly for the files the defaults decide on or changed: %q", f, now[f], before[f], w.why)
		}
	}
	if calibrationSample() {
		if len(names) < 60 {
			t.Errorf("%d files replayed under the race detector or -short, want the ~80 small ones", len(names))
		}
		return
	}
	for f := range wantCalibrated {
		if !slices.Contains(names, f) {
			t.Errorf("%s: in the table, not in the data", f)
		}
	}
	if len(names) < 110 {
		t.Errorf("%d files replayed, want every one of the ~130 shipped and wild transcripts", len(names))
	}
}

// bulkImport records files as `engine import` does (history, events as
// convert gives them, masked by the log), published asynchronously so
// that ~10,000 events take a moment even under the race detector: each
// session's events in order on one connection, an event converted twice
// (a snapshot a later file continues) stored once (its id is its
// Nats-Msg-Id).
// It returns the sessions each file gave, in the files' order.
func bulkImport(t *testing.T, js jetstream.JetStream, log *events.Log, tenant string, files []string, convert func(string) (*importer.Result, error)) []fileSessions {
	t.Helper()
	var out []fileSessions
	n := 0
	for _, f := range files {
		res, err := convert(f)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Diagnostics) > 0 {
			t.Fatalf("%s: %v", f, res.Diagnostics)
		}
		out = append(out, fileSessions{file: f})
		for _, s := range res.Sessions {
			out[len(out)-1].sessions = append(out[len(out)-1].sessions, s.Session)
			msgs, err := log.Prepare(s.Events, false)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			for _, m := range msgs {
				if _, err := js.PublishMsgAsync(m); err != nil {
					t.Fatal(err)
				}
				if n++; n%1000 == 0 {
					<-js.PublishAsyncComplete()
				}
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		t.Fatal("the import was not acknowledged within a minute")
	}
	return out
}

// claudeCodeConvert converts Claude Code transcripts for tenant, as
// `engine import --format claude-code` does: the converter keeps the
// links from subagents to their parents' calls between files.
func claudeCodeConvert(t *testing.T, tenant string) func(string) (*importer.Result, error) {
	t.Helper()
	conv, err := claudecode.NewConverter(claudecode.Options{Tenant: tenant})
	if err != nil {
		t.Fatal(err)
	}
	return conv.ConvertFile
}

// codexConvert converts Codex rollouts for tenant, as `engine import
// --format codex` does (history).
func codexConvert(t *testing.T, tenant string) func(string) (*importer.Result, error) {
	t.Helper()
	conv, err := codex.NewConverter(importer.Options{Tenant: tenant})
	if err != nil {
		t.Fatal(err)
	}
	return func(f string) (*importer.Result, error) {
		fh, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		defer fh.Close()
		return conv.Convert(fh, f, importer.Input{})
	}
}

// codexRollouts are the wild Codex rollouts (every .jsonl under
// wild/codex: one fixture is not named rollout-*), the ones replayable
// under the race detector (see replayable).
func codexRollouts(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(wildCXDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".jsonl") {
			files = append(files, p)
		}
		return err
	})
	if err != nil || len(files) < 7 {
		t.Fatalf("the Codex rollouts are missing at %s: %d files, %v", wildCXDir, len(files), err)
	}
	return replayable(t, files)
}

// replayable are the files the calibration replays: every one, or under
// the race detector, which makes decoding and masking JSON about twenty
// times slower, and under -short (see calibrationSample), the files of at
// most 256 KiB (most of the wild ones, the shipped short ones and the
// real orphans').
func replayable(t testing.TB, all []string) []string {
	if !calibrationSample() {
		return all
	}
	return importertest.Sample(t, all)
}

// calibrationSample reports whether the calibration replays the files of
// at most 256 KiB only: under the race detector, and under -short (every
// file takes some 6 s without race; the sample about 1). The full set runs
// without either in CI's full-size pass.
func calibrationSample() bool { return raceEnabled || testing.Short() }

// fileSessions are the sessions one transcript file gave.
type fileSessions struct {
	file     string
	sessions []string
}

// calRel is a transcript's path under shared/data, with slashes.
func calRel(f string) string {
	for _, dir := range []string{shippedDir, wildCCDir, wildCXDir} {
		if r, err := filepath.Rel(dir, f); err == nil && !strings.HasPrefix(r, "..") {
			if dir == wildCXDir {
				return "wild/codex/" + filepath.ToSlash(r)
			}
			return filepath.Base(filepath.Dir(dir)) + "/" + filepath.ToSlash(r)
		}
	}
	return f
}

// wantCalibrated holds the files on which the default policy, or the one
// before calibration, decides anything; every other file is healthy and
// nothing is decided on it either way. The real orphans: the
// incremental-subagents snapshot turn-1, imported alone, ends with a Bash
// tool_use whose result only turn-2 holds, and the Codex rollout 019c8a70
// ends on an exec_command call with no output; followed live, each turn
// is abandoned tool_deadline after its last event and the orphan
// repaired. Two Codex fixtures end inside a turn with no call pending:
// followed live, the turn is abandoned turn_deadline after its last sign
// of life, and there is nothing to repair.
var wantCalibrated = map[string]calibrated{
	"transcripts/spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl": {decisions: "", before: "abandon_turn repair_orphans",
		why: "a Bash call pending 3m2s (a person's permission, then the command): tool_deadline; its TaskOutput wait of 2m0s declared timeout 300000 ms"},
	"transcripts/spotter/4d5611e5-241a-462a-8d15-5122611a9569.jsonl": {decisions: "", before: "abandon_turn repair_orphans",
		why: "a Bash call pending 2m41s: tool_deadline"},
	"transcripts/spotter/8463c716-a2ea-4c14-9efa-87158ebd9f20.jsonl": {decisions: "", before: "abandon_turn",
		why: "the model silent 7m9s with no call pending (lines 112-113: a tool result, then 7 minutes of extended thinking before a plan): turn_deadline 10m"},
	"transcripts/spotter/ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl": {decisions: "", before: "abandon_turn repair_orphans",
		why: "a Bash call pending 2m39s: tool_deadline"},
	"transcripts/spotter/fa812bfe-b295-4cca-9c2f-fdf01028cb46.jsonl": {decisions: "", before: "abandon_turn repair_orphans abandon_turn repair_orphans",
		why: "two Bash calls pending 3m2s each: tool_deadline"},
	"transcripts/spotter/subagent.jsonl": {decisions: "", before: "abandon_turn repair_orphans",
		why: "AskUserQuestion pending 2m15s: it waits for the person's answer, tool_deadline"},
	"wild/codemie-ai__codemie-code/claude/incremental-simple/turn-2.jsonl": {decisions: "", before: "abandon_turn repair_orphans",
		why: "a Task call pending 2m11s while its subagent worked (its file is not in the data): tool_deadline"},
	"wild/codemie-ai__codemie-code/claude/incremental-subagents/turn-1.jsonl (alone)": {decisions: "abandon_turn repair_orphans", before: "abandon_turn repair_orphans",
		why: "a real orphan: a snapshot taken mid-turn, imported alone, ends with a Bash tool_use whose result only turn-2 holds"},
	"wild/codemie-ai__codemie-code/claude/incremental-subagents/turn-2.jsonl": {decisions: "", before: "abandon_turn repair_orphans",
		why: "a Task call pending 5m50s; its subagent (agent-a485154) went quiet 2 min inside it: tool_deadline"},
	"wild/codemie-ai__codemie-code/session-9eda1058.jsonl": {decisions: "", before: "abandon_turn repair_orphans abandon_turn repair_orphans",
		why: "two Task calls pending 2m21s and 2m59s (their subagents' files are not in the data): tool_deadline"},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-JSSoundRecorder/7acd37a8-2745-4b58-a8a9-46164b22ad9e.jsonl": {decisions: "", before: "abandon_turn repair_orphans",
		why: "two Bash calls and an Edit pending 2m10s: tool_deadline"},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-claude-code-log-sample/89488521-e2e7-4d97-bc02-38197efdddc8.jsonl": {decisions: "", before: "abandon_turn repair_orphans",
		why: "an Edit pending 5m7s (a permission prompt): tool_deadline"},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-db734024.jsonl": {decisions: "", before: "abandon_turn repair_orphans",
		why: "a subagent's two WebSearch calls pending 54m45s, then a WebFetch 58m30s (lines 8-10, 13-14): permission prompts left open while the person was away; the longest waits in the data but one, and why tool_deadline is 2h"},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/cb2e607c-c758-415a-8b45-c49e4631906a.jsonl": {decisions: "", before: "abandon_turn repair_orphans abandon_turn repair_orphans",
		why: "ExitPlanMode pending 2m33s (the person reads the plan) and a Bash call 2m11s: tool_deadline"},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-danieldemmel-me-next/9e953218-585f-4692-89df-9e0747a31c68.jsonl": {decisions: "", before: "abandon_turn repair_orphans",
		why: "a Bash call with no declared timeout pending 10m41s: tool_deadline"},
	"wild/daaain__claude-code-log/real_projects/-experiments-worktrees/ef958aa1-0e93-49f0-bb71-150f63befcd1.jsonl": {decisions: "", before: "abandon_turn repair_orphans abandon_turn repair_orphans",
		why: "three parallel Agent calls pending 7m27s and 3m17s: their subagents worked all along but each went quiet 2 min or more inside its own tool calls: tool_deadline"},
	"wild/daaain__claude-code-log/real_projects/-experiments-worktrees/ef958aa1-0e93-49f0-bb71-150f63befcd1/subagents/agent-a36efb2a1231c41e2.jsonl": {decisions: "", before: "abandon_turn repair_orphans",
		why: "a subagent's Bash call pending 2m55s: tool_deadline"},
	"wild/daaain__claude-code-log/real_projects/-experiments-worktrees/ef958aa1-0e93-49f0-bb71-150f63befcd1/subagents/agent-a4ca7529859c158c2.jsonl": {decisions: "", before: "abandon_turn repair_orphans",
		why: "a subagent's two WebFetch calls pending 4m14s: tool_deadline"},
	"wild/daaain__claude-code-log/real_projects/-experiments-worktrees/ef958aa1-0e93-49f0-bb71-150f63befcd1/subagents/agent-a52886dc180afb356.jsonl": {decisions: "", before: "abandon_turn repair_orphans",
		why: "a subagent's Bash call pending 4m1s: tool_deadline"},
	"wild/daaain__claude-code-log/real_projects/-experiments-worktrees/ef958aa1-0e93-49f0-bb71-150f63befcd1/subagents/agent-a6aa8ad077d9ea083.jsonl": {decisions: "", before: "abandon_turn repair_orphans",
		why: "a subagent's Bash call pending 2m31s: tool_deadline"},
	"wild/daaain__claude-code-log/real_projects/-experiments-worktrees/ef958aa1-0e93-49f0-bb71-150f63befcd1/subagents/agent-ab1e6e141221a29ab.jsonl": {decisions: "", before: "abandon_turn repair_orphans",
		why: "a subagent's Bash call pending 4m0s: tool_deadline"},
	"wild/daaain__claude-code-log/real_projects/-experiments-worktrees/ef958aa1-0e93-49f0-bb71-150f63befcd1/subagents/agent-aef063ba534d73153.jsonl": {decisions: "", before: "abandon_turn repair_orphans",
		why: "a subagent's Bash call pending 2m42s: tool_deadline"},
	"wild/daaain__claude-code-log/real_projects/-src-deep-manifest/a7da6a22-facc-4fcd-8bab-f83c87862004.jsonl": {decisions: "", before: "abandon_turn repair_orphans abandon_turn repair_orphans",
		why: "AskUserQuestion pending 4m49s and a Bash call 2m33s; later a Bash call pending 69m (lines 133-134, a permission prompt over a break): the longest wait in the data, inside tool_deadline"},

	// Codex rollouts (wild/codex, imported as `engine import --format codex` does).
	"wild/codex/codemie-ai__codemie-code/codex/rollout-2026-01-02T18-39-45-019b7f94-51b4-7593-922e-ba12b5b73b52.jsonl": {decisions: "abandon_turn", before: "abandon_turn",
		why: "a fixture cut 13 s into a `codex exec` run: it ends on a shell output and the turn_context of the next model request, in its implicit turn (no task events in 0.77); no call pending, so turn_deadline, and nothing to repair"},
	"wild/codex/jazzyalex__agent-sessions/codex_small_0.146.0.jsonl": {decisions: "abandon_turn", before: "abandon_turn",
		why: "a synthetic fixture whose last task (task_started, line 97) never ends; its calls all have outputs (the one written after turn_aborted answers its call), so turn_deadline, and nothing to repair"},
	"wild/codex/madshn__localpush/sessions/rollout-2026-02-23T12-54-34-019c8a59-e9dd-71f0-9ae3-4079fe9726a9.jsonl": {decisions: "", before: strings.TrimSpace(strings.Repeat("abandon_turn repair_orphans ", 8)),
		why: "eight waits of exec_command calls, 4m8s to 1h16m57s, in a session under approval_policy on-request (Codex asks the person before an escalated command runs): 22m56s (lines 55-58), 25m35s (300-303), 4m8s (952-955), 26m42s (1123-1126), 26m19s (1281-1286, two calls), 25m56s (1697-1702, with an MCP call), each output right after a developer message written at the end of the wait, and 17m52s (2532-2534) and 1h16m57s (395-398) with none: tool_deadline"},
	"wild/codex/madshn__localpush/sessions/rollout-2026-02-23T13-19-38-019c8a70-dda7-7f33-98ea-f30553347322.jsonl": {decisions: "abandon_turn repair_orphans", before: "abandon_turn repair_orphans",
		why: "a real orphan: the session ends on an exec_command call (call_UtYwHmwWekzvq83m8Rb9K8jJ, line 18) with no output; tool_deadline after it"},
}
