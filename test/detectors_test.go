package test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/claudecode"
	"github.com/turnstone-dev/turnstone/internal/reconciler"
	"github.com/turnstone-dev/turnstone/projections"
)

// wildDir holds about a hundred more real Claude Code sessions, not all of
// them clean (shared/data/wild beside the repository; each folder's
// SOURCE.txt analyses every file).
const wildDir = "../../shared/data/wild/claude-code"

// detected is what every detector says of one session, imported from real
// transcripts and folded from the log: the fold's invariants (violations
// by rule, orphans, invalid events), invariant 4's counts at their highest
// anywhere in the session (the same output to the same input in a row,
// the same error in a row, one step's failures in a row, flaky re-runs),
// the commands the reconciler's Decide issues for the final state (as if
// the session were live, with the default policy) and for any state along
// the way, and the turns left in flight.
type detected struct {
	turns, inFlight     int
	violations          string // "rule:n ...", sorted
	orphans, invalid    int
	outputs, errors     int // the longest streaks
	attempts, flaky     int // the most failed attempts at one step; flaky re-runs
	decided, decidedMid string
	sessions, subagents int
	warmups, notHistory int
}

// anomalies is the part of a row that a healthy session holds at zero
// whatever the files imported beside it.
func (d detected) anomalies() detected {
	return detected{violations: d.violations, orphans: d.orphans, invalid: d.invalid, flaky: d.flaky, decided: d.decided, decidedMid: d.decidedMid}
}

// TestEveryDetectorOnEveryRealTranscript imports every shipped and wild
// Claude Code transcript, folds every session, and runs every detector
// over it: a healthy real session must give no anomaly. The counts are
// asserted per file (the row of the file that last wrote to a session; a
// snapshot that a later file continues is checked on its own at the end).
// Under the race detector it reads the files of at most 256 KiB
// (corpusSample); .ci/run's full-size pass reads them all.
//
// Every one of them is zero: no violation, no orphan, no loop, no spent
// budget, no flaky run, no command, on ~130 real sessions of Claude Code
// 1.0.24 to 2.1.114, including the ones that fired before calibration:
//   - the 12 warm-up sidechains (one-line agent-*.jsonl of 2.0.42-2.0.55,
//     first_message_not_user) get their "Warmup" prompt back;
//   - spotter/8463c716, ae4a77f8 and ccviewer/fe5e1c67's subagent
//     (pivot_strategy: 13, 11 and 10 failed tool results in one long turn)
//     fail at most 4 times in a row at one step (8463c716's
//     `mix test test/spotter_web/live/session_live_test.exs`, lines
//     1243-1392, which then passes at line 1421);
//   - coderabbit-review-helper/cb2e607c (pause_session: the same
//     BashOutput poll 4 times, lines 158-168) polled a background build
//     whose status and time stamp changed each time, until it completed.
//
// The only turn left in flight is the snapshot
// codemie incremental-subagents/turn-1.jsonl taken mid-turn: its last
// record (line 25) is a Bash tool_use whose result is the first line
// turn-2.jsonl adds (line 26); imported alone it stays in flight with the
// tool pending (no orphan, no failure), and turn-2 continues it.
func TestEveryDetectorOnEveryRealTranscript(t *testing.T) {
	skipShort(t, "reads the whole transcript corpus")
	parallel(t)
	if _, err := os.Stat(wildDir); err != nil {
		t.Fatalf("the wild transcripts are missing at %s (shared/data beside the repository): %v", wildDir, err)
	}
	files, err := claudecode.Expand([]string{transcriptsDir, wildDir})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 130 {
		t.Fatalf("found %d transcripts, want the 25 shipped and the 108 wild", len(files))
	}
	all := len(files)
	sample := corpusSample(t, files)
	// Under the race detector, a file's counts are compared only when the
	// sample holds the files its converter reads it beside: its folder's
	// (a resumed session continues there; older subagent files sit there)
	// and, under <session>/subagents/, its parent session's. The others
	// are checked for what the test is about: no anomaly.
	sampled := map[string]bool{}
	for _, f := range sample {
		sampled[f] = true
	}
	left := map[string]bool{} // folders and parent sessions with a file left out
	for _, f := range files {
		if !sampled[f] {
			left[filepath.Dir(f)] = true
			left[strings.TrimSuffix(f, ".jsonl")] = true
		}
	}
	complete := map[string]bool{}
	for _, f := range sample {
		dir := filepath.Dir(f)
		parent := "" // <session>.jsonl beside <session>/subagents/
		if filepath.Base(dir) == "subagents" {
			parent = filepath.Dir(dir)
		}
		complete[rel(f)] = !left[dir] && !left[parent]
	}
	files = sample
	// Which file gives which session: the last one that writes to it
	// owns its row.
	conv, err := claudecode.NewConverter(claudecode.Options{Tenant: "real"})
	if err != nil {
		t.Fatal(err)
	}
	owner := map[string]string{} // session -> file
	kinds := map[string]string{}
	for _, f := range files {
		res, err := conv.ConvertFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range res.Sessions {
			owner[s.Session] = rel(f)
			kinds[s.Session] = s.Kind
		}
	}

	e := newEnv(t)
	rep := e.importFiles(t, "real", files...)
	if len(rep.Diagnostics) != 0 {
		t.Fatalf("diagnostics: %v", rep.Diagnostics)
	}
	got := map[string]detected{}
	for _, f := range files {
		got[rel(f)] = detected{}
	}
	policy := reconciler.DefaultPolicy()
	for session, file := range owner {
		d := got[file]
		detect(t, e, "real", session, policy, &d)
		d.sessions++
		if kinds[session] != claudecode.KindMain {
			d.subagents++
		}
		got[file] = d
	}

	compared := 0
	for _, f := range files {
		r := rel(f)
		w, ok := wantDetected[r]
		if !ok {
			t.Errorf("no expectation for %s: got %#v", r, got[r])
			continue
		}
		if !complete[r] {
			if g := got[r]; g.anomalies() != w.anomalies() {
				t.Errorf("%s (its folder in part):\n got %#v\nwant %#v", r, g.anomalies(), w.anomalies())
			}
			continue
		}
		compared++
		if got[r] != w {
			t.Errorf("%s:\n got %#v\nwant %#v", r, got[r], w)
		}
	}
	if os.Getenv("TURNSTONE_PRINT_DETECTED") != "" {
		for _, f := range files {
			fmt.Printf("\t%q: %#v,\n", rel(f), got[rel(f)])
		}
	}
	if len(files) < all {
		t.Logf("race detector on: compared the counts of %d files, and the anomalies of the other %d", compared, len(files)-compared)
	} else if len(wantDetected) != len(files) {
		t.Errorf("%d expectations for %d files", len(wantDetected), len(files))
	}

	// The growing session, snapshot by snapshot, on its own: turn-1 stops
	// mid-turn (a Bash tool_use at line 25 whose result turn-2 adds), so
	// its turn stays in flight with the tool pending, and the history
	// session is not live; turn-2 continues the same turn (the session has
	// one prompt) and ends it once.
	inc := filepath.Join(wildDir, "codemie-ai__codemie-code", "claude", "incremental-subagents")
	e.importFiles(t, "grow", filepath.Join(inc, "turn-1.jsonl"))
	s := e.restore(t, "grow", "e9fb405b-169f-40eb-9396-7e75076f045d")
	if len(s.InFlight) != 1 || strings.Join(s.Pending, ",") != "toolu_bdrk_01NNGBKLENmr7j3TfUKZW7rz" || s.Totals.Violations != 0 || !s.History {
		t.Fatalf("turn-1 alone: in flight %v, pending %v, violations %+v, history %v", s.InFlight, s.Pending, s.Violations, s.History)
	}
	if reconciler.Live(s, time.Now().Add(time.Hour), policy, true) {
		t.Error("an imported snapshot is live")
	}
	e.importFiles(t, "grow", filepath.Join(inc, "turn-2.jsonl"))
	s = e.restore(t, "grow", "e9fb405b-169f-40eb-9396-7e75076f045d")
	if len(s.InFlight) != 0 || len(s.Pending) != 0 || s.Totals.Violations != 0 || s.Totals.Turns != 1 {
		t.Fatalf("turn-2 after turn-1: in flight %v, pending %v, violations %+v, %d turns", s.InFlight, s.Pending, s.Violations, s.Totals.Turns)
	}
}

// rel is a transcript's path under the shared data, with slashes.
func rel(f string) string {
	for _, dir := range []string{transcriptsDir, wildDir} {
		if r, err := filepath.Rel(dir, f); err == nil && !strings.HasPrefix(r, "..") {
			return filepath.Base(filepath.Dir(dir)) + "/" + filepath.ToSlash(r)
		}
	}
	return f
}

// detect folds the session from the log, event by event, deciding on each
// state as the engine's reconciler would if the session were live, and
// adds what every detector says to d.
func detect(t *testing.T, e *env, tenant, session string, policy *reconciler.Policy, d *detected) {
	t.Helper()
	s := &projections.Session{}
	mid := map[string]bool{}
	err := e.log.ReadSession(context.Background(), tenant, session, events.ReadOptions{}, func(ev events.Event) error {
		s.Apply(ev)
		d.outputs = max(d.outputs, s.Outputs.Count)
		d.errors = max(d.errors, s.Errors.Streak.Count)
		for i := range s.Turns {
			d.attempts = max(d.attempts, s.Turns[i].FailedAttempts)
		}
		for _, a := range reconciler.Decide(reconciler.Input{State: s, Now: ev.Stored, Policy: policy, Live: true}) {
			if a.Command != nil {
				mid[string(a.Command.Kind)] = true
			} else {
				mid["events"] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("read %s: %v", session, err)
	}
	d.turns += s.Totals.Turns
	d.inFlight += len(s.InFlight)
	d.orphans += s.Totals.Orphans
	d.invalid += s.Totals.InvalidEvents
	d.flaky += s.Totals.Flaky
	if !s.History {
		d.notHistory++ // every import is history: a live one would be a bug
	}
	for _, tn := range s.Turns {
		if tn.Trigger == "warmup" {
			d.warmups++
		}
	}
	rules := map[string]int{}
	for _, v := range s.Violations {
		rules[string(v.Rule)]++
	}
	var final []string
	for _, a := range reconciler.Decide(reconciler.Input{State: s, Now: time.Now(), Policy: policy, Live: true}) {
		if a.Command != nil {
			final = append(final, string(a.Command.Kind))
		} else {
			final = append(final, "events")
		}
	}
	d.violations = join(d.violations, counts(rules))
	d.decided = join(d.decided, strings.Join(final, " "))
	d.decidedMid = join(d.decidedMid, strings.Join(slices.Sorted(maps.Keys(mid)), " "))
}

func counts(m map[string]int) string {
	var out []string
	for k, n := range m {
		out = append(out, fmt.Sprintf("%s:%d", k, n))
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

func join(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + " " + b
}

// wantDetected is what every detector says of each real transcript (see
// TestEveryDetectorOnEveryRealTranscript); TURNSTONE_PRINT_DETECTED=1
// prints the rows the test finds.
var wantDetected = map[string]detected{
	"transcripts/ccviewer/1af7fc5e-8455-4414-9ccd-011d40f70b2a.jsonl":                                                                                {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 1, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"transcripts/ccviewer/5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl":                                                                                {turns: 3, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 1, flaky: 0, decided: "", decidedMid: "", sessions: 3, subagents: 2, warmups: 0, notHistory: 0},
	"transcripts/ccviewer/fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl":                                                                                {turns: 7, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 4, flaky: 0, decided: "", decidedMid: "", sessions: 6, subagents: 5, warmups: 0, notHistory: 0},
	"transcripts/spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl":                                                                                 {turns: 4, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 4, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"transcripts/spotter/4d5611e5-241a-462a-8d15-5122611a9569.jsonl":                                                                                 {turns: 3, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 1, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"transcripts/spotter/8463c716-a2ea-4c14-9efa-87158ebd9f20.jsonl":                                                                                 {turns: 2, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 4, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"transcripts/spotter/ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl":                                                                                 {turns: 2, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 5, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"transcripts/spotter/fa812bfe-b295-4cca-9c2f-fdf01028cb46.jsonl":                                                                                 {turns: 3, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 2, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"transcripts/spotter/short.jsonl":                                                                                                                {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 1, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"transcripts/spotter/subagent.jsonl":                                                                                                             {turns: 2, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"transcripts/spotter/tool_heavy.jsonl":                                                                                                           {turns: 2, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/codemie-ai__codemie-code/claude/-tmp-private/4c2ddfdc-b619-4525-8d03-1950fb1b0257.jsonl":                                                   {turns: 3, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/codemie-ai__codemie-code/claude/incremental-simple/turn-1.jsonl":                                                                           {turns: 0, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 0, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 0, subagents: 0, warmups: 0, notHistory: 0},
	"wild/codemie-ai__codemie-code/claude/incremental-simple/turn-2.jsonl":                                                                           {turns: 4, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/codemie-ai__codemie-code/claude/incremental-subagents/turn-1.jsonl":                                                                        {turns: 0, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 0, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 0, subagents: 0, warmups: 0, notHistory: 0},
	"wild/codemie-ai__codemie-code/claude/incremental-subagents/turn-2.jsonl":                                                                        {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/codemie-ai__codemie-code/session-196820da.jsonl":                                                                                           {turns: 13, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 1, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/codemie-ai__codemie-code/session-624a4a58.jsonl":                                                                                           {turns: 14, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/codemie-ai__codemie-code/session-9eda1058.jsonl":                                                                                           {turns: 3, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 1, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-JSSoundRecorder/2c5941bd-b9de-41d6-9414-221d175776f7.jsonl":                    {turns: 0, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 0, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 0, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-JSSoundRecorder/7acd37a8-2745-4b58-a8a9-46164b22ad9e.jsonl":                    {turns: 6, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 1, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-JSSoundRecorder/b23cbd1d-a39d-4f31-98fd-98f8ff69b816.jsonl":                    {turns: 0, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 0, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 0, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-claude-code-log-sample/07f2e15c-a38b-454b-9148-60edc06de401.jsonl":             {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-claude-code-log-sample/12a546d1-83a7-49a6-abba-5400db340b43.jsonl":             {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 1, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-claude-code-log-sample/326189cf-5676-4237-8cde-1ce80aae4a9f.jsonl":             {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 2, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-claude-code-log-sample/4e27c414-a885-46a0-b5c8-d58e1417377d.jsonl":             {turns: 0, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 0, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 0, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-claude-code-log-sample/4fe49c7c-ff82-4ac7-b3f2-79c22036bd58.jsonl":             {turns: 0, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 0, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 0, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-claude-code-log-sample/62b71fe7-2de1-4d37-83e3-fddac2e2c43a.jsonl":             {turns: 0, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 0, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 0, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-claude-code-log-sample/71c9afe9-d9cc-4583-86b3-e62ba682b83a.jsonl":             {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-claude-code-log-sample/89488521-e2e7-4d97-bc02-38197efdddc8.jsonl":             {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-claude-code-log-sample/937c6e6b-27e7-4edd-86f1-ad28f9731841.jsonl":             {turns: 2, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 1, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-claude-code-log-sample/a854db35-bd6a-47ad-880a-4fdf5c1fac69.jsonl":             {turns: 0, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 0, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 0, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-claude-code-log-sample/aa5c5ada-4f1e-4b7f-9d1f-c496b3badde5.jsonl":             {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 1, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-claude-code-log-sample/b45ad5d8-81fb-4bcb-baba-19d9f503d731.jsonl":             {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 1, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-claude-code-log-sample/b8b48015-0e89-4b2a-8438-bd16c8c50338.jsonl":             {turns: 0, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 0, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 0, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-claude-code-log-sample/cbc0f75b-b36d-4efd-a7da-ac800ea30eb6.jsonl":             {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-claude-code-log-sample/f9b8738e-1c30-4da4-a07a-beab77c7521f.jsonl":             {turns: 0, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 0, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 0, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-claude-code-log-sample/fe869ecb-c176-478f-9734-7e4b8ef12cff.jsonl":             {turns: 2, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 4, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/1ca217c4-f55d-4f6e-a994-b7e2231336f0.jsonl":           {turns: 0, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 0, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 0, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/4227a68e-2b1f-4923-b824-6e04a67f77c1.jsonl":           {turns: 0, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 0, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 0, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/53196f99-eefe-4512-a459-d6def854aae8.jsonl":           {turns: 0, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 0, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 0, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/5b97e2d4-d624-4af2-9fb8-7fc02540282a.jsonl":           {turns: 0, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 0, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 0, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/6323a48e-3984-42eb-8790-2f7811368ab7.jsonl":           {turns: 0, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 0, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 0, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/8a69e93c-e842-471d-a053-5c316757e5e9.jsonl":           {turns: 0, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 0, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 0, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/a4d5ef26-c12c-47f7-970f-ec573fdbdcbd.jsonl":           {turns: 0, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 0, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 0, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/a6022a13-4ec2-41a1-85e9-6e31e7c62f58.jsonl":           {turns: 0, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 0, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 0, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/c7fda819-26c4-40c8-bfec-2d2240999e42.jsonl":           {turns: 0, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 0, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 0, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/cb2e607c-c758-415a-8b45-c49e4631906a.jsonl":           {turns: 5, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 1, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-danieldemmel-me-next/3680252d-d4e3-4416-bddd-8f5b5b4fdb7f.jsonl":               {turns: 0, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 0, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-danieldemmel-me-next/5ed31c36-bca8-40fd-8d24-f1a1f0af7901.jsonl":               {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-danieldemmel-me-next/7864f562-717b-4d70-a1cb-b588f7826a1a.jsonl":               {turns: 0, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 0, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 0, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-danieldemmel-me-next/9e953218-585f-4692-89df-9e0747a31c68.jsonl":               {turns: 11, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 1, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-danieldemmel-me-next/b25638d7-b104-4f06-a797-70ac33d069ed.jsonl":               {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 1, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-danieldemmel-me-next/f852ad25-1024-47da-964e-5eaae5bd6e6a.jsonl":               {turns: 4, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 1, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-experiments-ideas/03eb5929-52b3-4b13-ada3-b93ae35806b8.jsonl":                                       {turns: 7, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-experiments-ideas/a95fea4a-b88a-4e49-ac07-4cc323d8700c.jsonl":                                       {turns: 0, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 0, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 0, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-experiments-worktrees/ef958aa1-0e93-49f0-bb71-150f63befcd1.jsonl":                                   {turns: 2, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-src-deep-manifest/a7da6a22-facc-4fcd-8bab-f83c87862004.jsonl":                                       {turns: 7, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 1, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-src-experiments-claude_p/256ba646-2c15-437a-98e9-4171aafd030e.jsonl":                                {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-src-experiments-claude_p/29ccd257-68b1-427f-ae5f-6524b7cb6f20.jsonl":                                {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-src-experiments-claude_p/2b4ed4c0-b905-41de-9238-273db3ec737a.jsonl":                                {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 1, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-src-experiments-claude_p/94604a7b-062f-4369-bdf0-da948381c3e5.jsonl":                                {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 0, warmups: 0, notHistory: 0},
	"transcripts/ccviewer/agent-test-hash-123.jsonl":                                                                                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"transcripts/ccviewer/agent-test-hash-456.jsonl":                                                                                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"transcripts/spotter/258c7280-ae70-4798-800f-63464d01a85d/subagents/agent-a881341.jsonl":                                                         {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"transcripts/spotter/258c7280-ae70-4798-800f-63464d01a85d/subagents/agent-acompact-fffbd0.jsonl":                                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"transcripts/spotter/4d5611e5-241a-462a-8d15-5122611a9569/subagents/agent-a2898e3.jsonl":                                                         {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 1, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"transcripts/spotter/4d5611e5-241a-462a-8d15-5122611a9569/subagents/agent-acompact-e1f845.jsonl":                                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"transcripts/spotter/6c2214d7-b87e-4432-8e41-22ba294ea584/subagents/agent-afc096d.jsonl":                                                         {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 1, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"transcripts/spotter/8463c716-a2ea-4c14-9efa-87158ebd9f20/subagents/agent-a7be2f0.jsonl":                                                         {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 1, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"transcripts/spotter/8463c716-a2ea-4c14-9efa-87158ebd9f20/subagents/agent-acompact-f46190.jsonl":                                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"transcripts/spotter/ae4a77f8-aedd-4bc1-888f-c94edc91af04/subagents/agent-aac57f5.jsonl":                                                         {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"transcripts/spotter/ae4a77f8-aedd-4bc1-888f-c94edc91af04/subagents/agent-acompact-946d2b.jsonl":                                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"transcripts/spotter/fa812bfe-b295-4cca-9c2f-fdf01028cb46/subagents/agent-a93ccab.jsonl":                                                         {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"transcripts/spotter/fa812bfe-b295-4cca-9c2f-fdf01028cb46/subagents/agent-aa84377.jsonl":                                                         {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"transcripts/spotter/fa812bfe-b295-4cca-9c2f-fdf01028cb46/subagents/agent-acompact-70d8e7.jsonl":                                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"wild/codemie-ai__codemie-code/claude/-tmp-private/agent-36541525.jsonl":                                                                         {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/codemie-ai__codemie-code/claude/-tmp-private/agent-50243ee8.jsonl":                                                                         {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/codemie-ai__codemie-code/claude/incremental-subagents/turn-1/subagents/agent-a485154.jsonl":                                                {turns: 0, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 0, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 0, subagents: 0, warmups: 0, notHistory: 0},
	"wild/codemie-ai__codemie-code/claude/incremental-subagents/turn-2/subagents/agent-a485154.jsonl":                                                {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 1, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-JSSoundRecorder/agent-3430b97e.jsonl":                                          {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-JSSoundRecorder/agent-388fb764.jsonl":                                          {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-JSSoundRecorder/agent-650d3273.jsonl":                                          {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-JSSoundRecorder/agent-7d618812.jsonl":                                          {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-JSSoundRecorder/agent-88061e52.jsonl":                                          {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-JSSoundRecorder/agent-8d27fe83.jsonl":                                          {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-JSSoundRecorder/agent-9c2b663e.jsonl":                                          {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-JSSoundRecorder/agent-aa1e905b.jsonl":                                          {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-claude-code-log-sample/agent-3be551df.jsonl":                                   {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-claude-code-log-sample/agent-41b9470d.jsonl":                                   {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-claude-code-log-sample/agent-41be4aa9.jsonl":                                   {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-claude-code-log-sample/agent-fea317d4.jsonl":                                   {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-0c78cdae.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-1509e86b.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-1674bc8c.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-1d78a5e5.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-20f650b0.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-2b93909d.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-3b8502cb.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-3d1bd44a.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-4b8f344c.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-4e5cf10d.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-55b71465.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-5e37fdd5.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-645808c9.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-659acfed.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-668b5ac2.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-7010dafc.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-7df5b3b2.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-7f1e17a3.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-9fa17969.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-a7b0bd37.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-a83805a2.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-af75be79.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-b2d6685e.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-b52b1c09.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-bbd1e02f.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-db734024.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-ea02459f.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-f36dc5e5.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/agent-fd95e415.jsonl":                                 {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-danieldemmel-me-next/agent-3ea04571.jsonl":                                     {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-danieldemmel-me-next/agent-b1f5d80e.jsonl":                                     {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-danieldemmel-me-next/agent-c3d572ee.jsonl":                                     {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-Users-dain-workspace-danieldemmel-me-next/agent-c63fe96c.jsonl":                                     {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 1, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-experiments-worktrees/ef958aa1-0e93-49f0-bb71-150f63befcd1/subagents/agent-a36efb2a1231c41e2.jsonl": {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-experiments-worktrees/ef958aa1-0e93-49f0-bb71-150f63befcd1/subagents/agent-a4ca7529859c158c2.jsonl": {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 1, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-experiments-worktrees/ef958aa1-0e93-49f0-bb71-150f63befcd1/subagents/agent-a52886dc180afb356.jsonl": {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-experiments-worktrees/ef958aa1-0e93-49f0-bb71-150f63befcd1/subagents/agent-a6aa8ad077d9ea083.jsonl": {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-experiments-worktrees/ef958aa1-0e93-49f0-bb71-150f63befcd1/subagents/agent-ab1e6e141221a29ab.jsonl": {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 1, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-experiments-worktrees/ef958aa1-0e93-49f0-bb71-150f63befcd1/subagents/agent-aef063ba534d73153.jsonl": {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-src-deep-manifest/agent-c8d9b115.jsonl":                                                             {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 1, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
	"wild/daaain__claude-code-log/real_projects/-src-experiments-claude_p/29ccd257-68b1-427f-ae5f-6524b7cb6f20/subagents/agent-a2271d1.jsonl":        {turns: 1, inFlight: 0, violations: "", orphans: 0, invalid: 0, outputs: 1, errors: 0, attempts: 0, flaky: 0, decided: "", decidedMid: "", sessions: 1, subagents: 1, warmups: 0, notHistory: 0},
}
