package codex

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/importer"
	"github.com/turnstone-dev/turnstone/internal/importer/importertest"
	"github.com/turnstone-dev/turnstone/projections"
)

// rollouts are every shipped Codex rollout.
func rollouts(t testing.TB) []string {
	t.Helper()
	var out []string
	for _, rel := range []string{rollout077, rollout0146, rolloutParallel, rolloutCompacted, rolloutPending, rolloutShort,
		"madshn__localpush/sessions/rollout-2026-02-23T12-40-23-019c8a4c-ed82-79a1-aa28-7738fc5ab61a.jsonl"} {
		out = append(out, wild(t, rel))
	}
	dir := filepath.Join("..", "..", "..", "shared", "data", "wild", "codex")
	var all []string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".jsonl") {
			all = append(all, p)
		}
		return nil
	})
	if len(all) != len(out) {
		t.Fatalf("%d rollouts under %s, the tests know %d: name the new ones", len(all), dir, len(out))
	}
	return out
}

// imported imports a rollout as history into a MemLog and folds its
// session.
func imported(t *testing.T, rel string) (*importer.Report, []events.Event, *projections.Session) {
	t.Helper()
	log := importertest.NewMemLog()
	rep, err := importer.Import(context.Background(), log, Format, []string{wild(t, rel)}, importer.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Diagnostics) > 0 || rep.Sessions != 1 {
		t.Fatalf("import %s: %d sessions, diagnostics %v", rel, rep.Sessions, rep.Diagnostics)
	}
	evs := sessionEvents(t, log)
	return rep, evs, importertest.Fold(evs)
}

// sessionEvents are the events of the one session a log holds.
func sessionEvents(t *testing.T, log *importertest.MemLog) []events.Event {
	t.Helper()
	ss := log.Sessions(importer.DefaultTenant)
	if len(ss) != 1 {
		t.Fatalf("the log holds sessions %v, want one", ss)
	}
	evs, _ := log.Events(context.Background(), importer.DefaultTenant, ss[0])
	return evs
}

func payload[T any](t testing.TB, ev events.Event) *T {
	t.Helper()
	p, err := ev.Payload()
	if err != nil {
		t.Fatal(err)
	}
	v, ok := any(p).(*T)
	if !ok {
		t.Fatalf("%s: payload is %T", ev.Type, p)
	}
	return v
}

// TestEveryRolloutImports: every shipped rollout converts with no line
// skipped as an error, every event valid, and the record types Codex
// added after the five of the format counted as unknown.
func TestEveryRolloutImports(t *testing.T) {
	for _, f := range rollouts(t) {
		c, err := NewConverter(importer.Options{})
		if err != nil {
			t.Fatal(err)
		}
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.Convert(fh, f, importer.Input{})
		fh.Close()
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(f)
		if len(res.Diagnostics) != 0 || len(res.Sessions) != 1 || res.Records == 0 {
			t.Errorf("%s: %d sessions, %d records, diagnostics %v", name, len(res.Sessions), res.Records, res.Diagnostics)
			continue
		}
		for _, ev := range res.Sessions[0].Events {
			if err := events.Validate(&ev); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
		started := payload[events.SessionStarted](t, res.Sessions[0].Events[0])
		if !strings.HasPrefix(started.Runtime, "codex 0.") || !started.History || started.Labels["cwd"] == "" {
			t.Errorf("%s: session.started %+v", name, started)
		}
		unknown := fmt.Sprint(res.Unknown)
		want := "map[]"
		if name == filepath.Base(rollout0146) {
			want = "map[inter_agent_communication_metadata:1 world_state:5]"
		}
		if unknown != want {
			t.Errorf("%s: unknown record types %s, want %s", name, unknown, want)
		}
	}
}

// TestRolloutEndingOnACall: 019c8a70 ends on a function_call with no
// output. Imported, its one turn is in flight with the call pending and
// no orphan, and it reads interrupted once its last event is older than
// the live horizon, naming the call (followed live, it stays in_turn); a
// second import adds nothing.
func TestRolloutEndingOnACall(t *testing.T) {
	log := importertest.NewMemLog()
	path := wild(t, rolloutPending)
	rep, err := importer.Import(context.Background(), log, Format, []string{path}, importer.Options{}, nil)
	if err != nil || rep.Appended == 0 || len(rep.Diagnostics) > 0 {
		t.Fatalf("import: %v %+v", err, rep)
	}
	if rep.Records != 19 {
		t.Errorf("%d records, want the file's 19 lines", rep.Records)
	}
	st := importertest.Fold(sessionEvents(t, log))
	if st.Totals.Turns != 1 || len(st.InFlight) != 1 || !slices.Equal(st.Pending, []string{"call_UtYwHmwWekzvq83m8Rb9K8jJ"}) ||
		st.Totals.Orphans != 0 || st.Totals.Violations != 0 || !st.History {
		t.Fatalf("turns %d, in flight %v, pending %v, orphans %d, violations %+v, history %v",
			st.Totals.Turns, st.InFlight, st.Pending, st.Totals.Orphans, st.Violations, st.History)
	}
	if tn := st.Turn(st.InFlight[0]); tn == nil || tn.Stage != events.StageExecute {
		t.Errorf("the turn running its call: %+v", tn)
	}
	// As history, the turn reads interrupted once its last event is older
	// than the live horizon (computed when read: nothing is written), and
	// in_turn before; the view names the call.
	last := st.LastTime
	if got := st.StatusAt(last.Add(projections.DefaultLiveHorizon+time.Second), 0); got != projections.StatusInterrupted {
		t.Errorf("past the horizon: status %s, want interrupted", got)
	}
	if got := st.StatusAt(last.Add(time.Minute), 0); got != projections.StatusInTurn {
		t.Errorf("within the horizon: status %s, want in_turn", got)
	}
	if v := st.ViewAt(last.Add(time.Hour), 0); v.Status != projections.StatusInterrupted || !slices.Equal(v.PendingToolUseIDs, []string{"call_UtYwHmwWekzvq83m8Rb9K8jJ"}) ||
		!strings.Contains(v.StatusDetail, "tool_use without its result: call_UtYwHmwWekzvq83m8Rb9K8jJ") {
		t.Errorf("the view now: status %s, pending %v, detail %q", v.Status, v.PendingToolUseIDs, v.StatusDetail)
	}
	// Followed live, the same file is a runtime at work, never interrupted.
	c, err := NewConverter(importer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Convert(fh, path, importer.Input{Live: true})
	fh.Close()
	if err != nil || len(res.Sessions) != 1 {
		t.Fatalf("live conversion: %v, %d sessions", err, len(res.Sessions))
	}
	if live := importertest.Fold(res.Sessions[0].Events); live.History || live.StatusAt(last.Add(24*time.Hour), 0) != projections.StatusInTurn {
		t.Errorf("followed live: history %v, status a day later %s, want in_turn", live.History, live.StatusAt(last.Add(24*time.Hour), 0))
	}
	again, err := importer.Import(context.Background(), log, Format, []string{path}, importer.Options{}, nil)
	if err != nil || again.Appended != 0 || again.Existing != rep.Appended {
		t.Fatalf("re-import: %v, %d appended, %d existing (want 0, %d)", err, again.Appended, again.Existing, rep.Appended)
	}
}

// TestCompactedRollout: 019c8a59, a day of Codex Desktop work: 365 of 365
// calls paired, no violation, and its one compaction a distillation
// inside turn 019c8f0c with the context before it (the last model call's
// 212,134 tokens) and after it (the next call's 48,297 input tokens).
func TestCompactedRollout(t *testing.T) {
	_, evs, st := imported(t, rolloutCompacted)
	if st.Totals.ToolCalls != 365 || st.Totals.Orphans != 0 || st.Totals.UnmatchedResults != 0 || len(st.Pending) != 0 ||
		st.Totals.Violations != 0 || len(st.InFlight) != 0 || st.Totals.Turns != 33 {
		t.Fatalf("tool calls %d, orphans %d, unmatched %d, pending %v, violations %+v, in flight %v, turns %d",
			st.Totals.ToolCalls, st.Totals.Orphans, st.Totals.UnmatchedResults, st.Pending, st.Violations, st.InFlight, st.Totals.Turns)
	}
	started, completed := map[string]bool{}, map[string]bool{}
	for _, ev := range evs {
		switch ev.Type {
		case events.TypeToolCallStarted:
			started[payload[events.ToolCallStarted](t, ev).ToolUseID] = true
		case events.TypeToolCallCompleted:
			completed[payload[events.ToolCallCompleted](t, ev).ToolUseID] = true
		}
	}
	if len(started) != 365 || len(completed) != 365 {
		t.Errorf("%d calls started, %d completed; want 365 each", len(started), len(completed))
	}
	if len(st.Distillations) != 1 {
		t.Fatalf("distillations %+v", st.Distillations)
	}
	d := st.Distillations[0]
	if d.Turn != "019c8f0c-8f4f-7560-bc78-3f31db378e0c" || d.TokensBefore != 212134 || d.TokensAfter != 48297 || !d.Clean {
		t.Errorf("distillation %+v", d)
	}
}

// TestRolloutVersions reads the three versions of the format: 0.77's
// implicit turns, 0.104's parallel calls and token counts, 0.146's late
// output, server tools and turn ends with reasons.
func TestRolloutVersions(t *testing.T) {
	t.Run("0.77 implicit turns", func(t *testing.T) {
		_, evs, st := imported(t, rollout077)
		if st.Totals.Turns != 1 || st.Turns[0].ID != "implicit-L4" || st.Totals.Violations != 0 || st.Totals.ToolCalls != 3 {
			t.Fatalf("turns %+v, violations %+v, %d calls", st.Turns, st.Violations, st.Totals.ToolCalls)
		}
		ts := payload[events.TurnStarted](t, evs[slices.IndexFunc(evs, func(e events.Event) bool { return e.Type == events.TypeTurnStarted })])
		if ts.Prompt != "what is current repository about? summarize purpuse and explain goals" {
			t.Errorf("prompt %q", ts.Prompt)
		}
		// The AGENTS.md and environment context Codex injected before it
		// are meta; the prompt is not.
		var meta []bool
		for _, ev := range evs {
			if ev.Type == events.TypeMessageAppended {
				if m := payload[events.MessageAppended](t, ev); m.Role == events.RoleUser && m.Content[0].Type == events.BlockText {
					meta = append(meta, m.Meta)
				}
			}
		}
		if !slices.Equal(meta, []bool{true, true, false}) {
			t.Errorf("user texts' meta flags %v, want injected, injected, prompt", meta)
		}
	})
	t.Run("0.104 parallel calls and usage", func(t *testing.T) {
		_, evs, st := imported(t, rolloutParallel)
		if st.Totals.Violations != 0 || st.Totals.ToolCalls != 118 || st.Totals.Orphans != 0 {
			t.Fatalf("violations %+v, %d calls, %d orphans", st.Violations, st.Totals.ToolCalls, st.Totals.Orphans)
		}
		// Lines 14-18: reasoning, commentary, two function_calls, then the
		// token_count that ends the model call: one assistant message.
		m := findMessage(t, evs, "call_gL2iTwQbQ9Tg1BKGl350ZGKp")
		if len(m.Content) != 4 || m.Content[2].ID != "call_gL2iTwQbQ9Tg1BKGl350ZGKp" || m.Content[3].ID != "call_qXFvlxrQVjVXhLKaZsBPk1ob" {
			t.Fatalf("the response with two calls: %+v", m.Content)
		}
		// Its usage: last_token_usage of the count whose total grew, the
		// cached input apart (17383 input, 3456 of it cached, ...).
		line := importertest.Lines(t, wild(t, rolloutParallel))[18]
		var tc struct {
			Payload struct {
				Info struct {
					Last tokenUsage `json:"last_token_usage"`
				} `json:"info"`
			} `json:"payload"`
		}
		if err := json.Unmarshal([]byte(line), &tc); err != nil {
			t.Fatal(err)
		}
		u := tc.Payload.Info.Last
		want := events.Usage{InputTokens: u.InputTokens - u.CachedInputTokens, CacheReadTokens: u.CachedInputTokens,
			OutputTokens: u.OutputTokens, ReasoningTokens: u.ReasoningOutputTokens}
		if m.Usage == nil || *m.Usage != want || u.TotalTokens != 17383 {
			t.Errorf("usage %+v, want %+v", m.Usage, want)
		}
	})
	t.Run("0.146", func(t *testing.T) {
		_, evs, st := imported(t, rollout0146)
		// call-1 (custom_tool_call) and call-2 (function_call) of one
		// response: one assistant message, with the web search and the
		// tool search Codex's provider ran as server_tool_use blocks.
		m := findMessage(t, evs, "call-1")
		var types []string
		for _, b := range m.Content {
			types = append(types, b.Type+":"+b.Name)
		}
		if got := strings.Join(types, " "); got != "thinking: tool_use:shell tool_use:shell server_tool_use:tool_search tool_search_tool_result: server_tool_use:web_search" {
			t.Errorf("the response's blocks: %s", got)
		}
		// call-1's output comes after turn_aborted: it answers the call,
		// and the turn ends after it, with the abort's reason.
		completed := slices.IndexFunc(evs, func(e events.Event) bool {
			return e.Type == events.TypeToolCallCompleted && payload[events.ToolCallCompleted](t, e).ToolUseID == "call-1"
		})
		end := slices.IndexFunc(evs, func(e events.Event) bool {
			return e.Type == events.TypeTurnCompleted && e.Turn == "019fc8be-0000-7000-8000-000000000001"
		})
		if completed < 0 || end < completed || st.Totals.Orphans != 0 {
			t.Fatalf("call-1 completed at %d, its turn ended at %d; %d orphans", completed, end, st.Totals.Orphans)
		}
		for _, v := range st.Violations {
			if strings.Contains(v.ToolUseID, "call-") {
				t.Errorf("violation %+v", v)
			}
		}
		first := st.Turn("019fc8be-0000-7000-8000-000000000001")
		if first == nil || first.Status != projections.TurnCompleted || first.Reason != "interrupted" {
			t.Errorf("the aborted turn: %+v", first)
		}
		for _, ev := range evs {
			if ev.Type == events.TypeToolCallStarted && strings.HasPrefix(payload[events.ToolCallStarted](t, ev).ToolUseID, "ws-") {
				t.Error("a web search made a tool call")
			}
		}
	})
}

// findMessage is the assistant message.appended holding tool_use id.
func findMessage(t *testing.T, evs []events.Event, id string) *events.MessageAppended {
	t.Helper()
	for _, ev := range evs {
		if ev.Type != events.TypeMessageAppended {
			continue
		}
		m := payload[events.MessageAppended](t, ev)
		for _, b := range m.Content {
			if b.Type == events.BlockToolUse && b.ID == id {
				return m
			}
		}
	}
	t.Fatalf("no message holds tool_use %s", id)
	return nil
}

func toolCall(st *projections.Session, id string) *projections.ToolCall {
	for i := range st.ToolCalls {
		if st.ToolCalls[i].ToolUseID == id {
			return &st.ToolCalls[i]
		}
	}
	return nil
}

// rollout builds a rollout's lines: each a {timestamp, type, payload}.
type rollout struct {
	t0    time.Time
	n     int
	lines []string
}

func (r *rollout) add(typ, payload string) {
	r.n++
	r.lines = append(r.lines, fmt.Sprintf(`{"timestamp":%q,"type":%q,"payload":%s}`, r.t0.Add(time.Duration(r.n)*time.Second).Format(time.RFC3339Nano), typ, payload))
}

func (r *rollout) String() string { return strings.Join(r.lines, "\n") + "\n" }

func newRollout(id string) *rollout {
	r := &rollout{t0: time.Date(2026, 2, 23, 12, 0, 0, 0, time.UTC)}
	r.add("session_meta", fmt.Sprintf(`{"id":%q,"cwd":"/repo","originator":"codex_cli_rs","cli_version":"0.104.0","source":"cli","model_provider":"openai"}`, id))
	return r
}

func (r *rollout) task(turn, prompt string) {
	r.add("event_msg", fmt.Sprintf(`{"type":"task_started","turn_id":%q}`, turn))
	r.add("response_item", fmt.Sprintf(`{"type":"message","role":"user","content":[{"type":"input_text","text":%q}]}`, prompt))
	r.add("event_msg", fmt.Sprintf(`{"type":"user_message","message":%q}`, prompt))
	r.add("turn_context", fmt.Sprintf(`{"turn_id":%q,"model":"gpt-5.3-codex"}`, turn))
}

func (r *rollout) call(id, cmd string, total int) {
	r.add("response_item", fmt.Sprintf(`{"type":"function_call","name":"exec_command","arguments":%q,"call_id":%q}`, `{"cmd":"`+cmd+`"}`, id))
	r.add("event_msg", fmt.Sprintf(`{"type":"token_count","info":{"total_token_usage":{"input_tokens":%d,"output_tokens":10,"total_tokens":%d},"last_token_usage":{"input_tokens":%d,"output_tokens":10,"total_tokens":%d}}}`, total, total+10, total, total+10))
}

func (r *rollout) output(id, out string) {
	r.add("response_item", fmt.Sprintf(`{"type":"function_call_output","call_id":%q,"output":%q}`, id, out))
}

// TestNewTaskOverAnUnansweredCall: a task starts while a call of the
// previous one has no output (a person started new work over it): exactly
// that call is an orphan, and the old turn is abandoned, in execute.
func TestNewTaskOverAnUnansweredCall(t *testing.T) {
	r := newRollout("sess-over")
	r.task("turn-a", "run the tests")
	r.call("call_ok", "ls", 100)
	r.output("call_ok", "Process exited with code 0\nOutput:\na.go")
	r.add("turn_context", `{"turn_id":"turn-a","model":"gpt-5.3-codex"}`)
	r.call("call_hung", "go test ./...", 200)
	r.task("turn-b", "never mind, do something else")
	r.add("response_item", `{"type":"message","role":"assistant","content":[{"type":"output_text","text":"OK."}]}`)
	r.add("event_msg", `{"type":"token_count","info":{"total_token_usage":{"input_tokens":400,"output_tokens":10,"total_tokens":410},"last_token_usage":{"input_tokens":90,"output_tokens":10,"total_tokens":100}}}`)
	r.add("event_msg", `{"type":"task_complete","turn_id":"turn-b","last_agent_message":"OK."}`)

	c, _ := NewConverter(importer.Options{})
	res, err := c.Convert(strings.NewReader(r.String()), "rollout-built.jsonl", importer.Input{})
	if err != nil || len(res.Diagnostics) > 0 {
		t.Fatalf("convert: %v %v", err, res.Diagnostics)
	}
	evs := res.Sessions[0].Events
	for i := range evs {
		evs[i].Seq = uint64(i + 1)
	}
	st := importertest.Fold(evs)
	if st.Totals.Orphans != 1 || st.Orphans[0].ToolUseID != "call_hung" || st.Totals.Turns != 2 {
		t.Fatalf("orphans %+v, %d turns", st.Orphans, st.Totals.Turns)
	}
	a := st.Turn("turn-a")
	if a == nil || a.Status != projections.TurnAbandoned || a.Stage != events.StageExecute || st.Turn("turn-b").Status != projections.TurnCompleted {
		t.Fatalf("turns %+v", st.Turns)
	}
	if tc := toolCall(st, "call_ok"); tc == nil || tc.Status != projections.ToolAnswered || tc.IsError {
		t.Errorf("call_ok %+v", tc)
	}
}

// TestOutputErrorFlags: an output's error flag comes from the call's
// *_end event, else from "exited with code N", else from the shell tool's
// metadata.exit_code.
func TestOutputErrorFlags(t *testing.T) {
	for _, tt := range []struct {
		raw     string
		isError bool
		known   bool
	}{
		{`"Process exited with code 2\nOutput:\nboom"`, true, true},
		{`"Chunk ID: 1\nWall time: 0.1 seconds\nProcess exited with code 0\nOutput:\nok"`, false, true},
		{`"Exit code: 1\nWall time: 2s\nOutput:\n"`, true, true},
		{`"{\"output\":\"x\",\"metadata\":{\"exit_code\":0,\"duration_seconds\":0.1}}"`, false, true},
		{`"{\"output\":\"x\",\"metadata\":{\"exit_code\":127}}"`, true, true},
		{`{"content":"denied","success":false}`, true, true},
		{`[{"type":"input_text","text":"a.txt"}]`, false, false},
		{`{"type":"input_text","text":"a.txt"}`, false, false},
		{`"plain text"`, false, false},
	} {
		o := parseOutput([]byte(tt.raw))
		if o.isError != tt.isError || o.known != tt.known {
			t.Errorf("%s: error %v known %v, want %v %v", tt.raw, o.isError, o.known, tt.isError, tt.known)
		}
		var probe any
		if json.Unmarshal(o.content, &probe) != nil {
			t.Errorf("%s: content %s is not JSON", tt.raw, o.content)
		}
	}
	r := newRollout("sess-end")
	r.task("t1", "go")
	r.call("call_x", "make", 100)
	r.add("event_msg", `{"type":"exec_command_end","call_id":"call_x","exit_code":2}`)
	r.output("call_x", "done")
	c, _ := NewConverter(importer.Options{})
	res, err := c.Convert(strings.NewReader(r.String()), "rollout-end.jsonl", importer.Input{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range res.Sessions[0].Events {
		if ev.Type == events.TypeToolCallCompleted && !payload[events.ToolCallCompleted](t, ev).IsError {
			t.Error("exec_command_end's exit code 2 did not fail the call")
		}
	}
}

// TestThreadRolledBack: Codex's rollback of the last turns
// (thread_rolled_back, num_turns) records nothing: the event model's
// rewind is Turnstone's own and names a log sequence a conversion cannot
// know (docs/importers.md, "Known limits"). The rolled-back turn stays in
// the history, completed; the event is counted; the next task is a turn
// of its own.
func TestThreadRolledBack(t *testing.T) {
	r := newRollout("sess-rollback")
	r.task("turn-a", "rename the package")
	r.call("call_a", "sed -i s/foo/bar/ a.go", 100)
	r.output("call_a", "Process exited with code 0")
	r.add("event_msg", `{"type":"task_complete","turn_id":"turn-a","last_agent_message":"Done."}`)
	r.add("event_msg", `{"type":"thread_rolled_back","num_turns":1}`)
	r.task("turn-b", "no, keep the old name")
	r.add("response_item", `{"type":"message","role":"assistant","content":[{"type":"output_text","text":"OK."}]}`)
	r.add("event_msg", `{"type":"token_count","info":{"total_token_usage":{"input_tokens":300,"output_tokens":10,"total_tokens":310},"last_token_usage":{"input_tokens":190,"output_tokens":10,"total_tokens":200}}}`)
	r.add("event_msg", `{"type":"task_complete","turn_id":"turn-b","last_agent_message":"OK."}`)

	c, _ := NewConverter(importer.Options{})
	res, err := c.Convert(strings.NewReader(r.String()), "rollout-built.jsonl", importer.Input{})
	if err != nil || len(res.Diagnostics) > 0 || len(res.Unknown) > 0 {
		t.Fatalf("convert: %v %v, unknown %v", err, res.Diagnostics, res.Unknown)
	}
	if res.Skipped["event_msg/thread_rolled_back"] != 1 {
		t.Errorf("skipped %v: the rollback is not counted", res.Skipped)
	}
	evs := res.Sessions[0].Events
	for i := range evs {
		evs[i].Seq = uint64(i + 1)
		if evs[i].Type == events.TypeSessionRewound {
			t.Errorf("an import wrote %s", evs[i].Type)
		}
	}
	st := importertest.Fold(evs)
	if st.Totals.Turns != 2 || st.Turn("turn-a").Status != projections.TurnCompleted || st.Turn("turn-b").Status != projections.TurnCompleted ||
		st.Totals.Violations != 0 || st.Totals.Orphans != 0 {
		t.Fatalf("%d turns %+v, violations %+v, orphans %d", st.Totals.Turns, st.Turns, st.Violations, st.Totals.Orphans)
	}
}

// TestRepeatedTurnIDs: a task_started naming the open turn again starts
// nothing, and a turn_id an ended turn had gives a turn of its own: every
// event keeps an id of its own (FuzzConvert found two turn.started of one
// id when a rollout repeated a task_started).
func TestRepeatedTurnIDs(t *testing.T) {
	r := newRollout("sess-repeat")
	r.task("turn-a", "first")
	r.add("event_msg", `{"type":"task_started","turn_id":"turn-a"}`)
	r.add("response_item", `{"type":"message","role":"assistant","content":[{"type":"output_text","text":"done"}]}`)
	r.add("event_msg", `{"type":"task_complete","turn_id":"turn-a","last_agent_message":"done"}`)
	r.task("turn-a", "again")
	r.add("response_item", `{"type":"message","role":"assistant","content":[{"type":"output_text","text":"again done"}]}`)
	r.add("event_msg", `{"type":"task_complete","turn_id":"turn-a","last_agent_message":"again done"}`)

	c, _ := NewConverter(importer.Options{})
	res, err := c.Convert(strings.NewReader(r.String()), "rollout-built.jsonl", importer.Input{})
	if err != nil || len(res.Diagnostics) > 0 {
		t.Fatalf("convert: %v %v", err, res.Diagnostics)
	}
	ids := map[string]bool{}
	var turns []string
	for _, ev := range res.Sessions[0].Events {
		if ids[ev.ID] {
			t.Fatalf("event id %s twice", ev.ID)
		}
		ids[ev.ID] = true
		switch ev.Type {
		case events.TypeTurnStarted, events.TypeTurnCompleted, events.TypeTurnAbandoned:
			turns = append(turns, string(ev.Type)+" "+ev.Turn)
		}
	}
	want := "turn.started turn-a,turn.completed turn-a,turn.started turn-a-L9,turn.completed turn-a-L9"
	if got := strings.Join(turns, ","); got != want {
		t.Fatalf("turns %s\nwant  %s", got, want)
	}
	s := projections.Fold(res.Sessions[0].Events)
	if s.Totals.Turns != 2 || s.Totals.Violations != 0 {
		t.Fatalf("folded: %d turns, violations %+v", s.Totals.Turns, s.Violations)
	}
}

// TestRepeatedCallID: a call_id names one call. An item that repeats an
// earlier call's id (in a later response, or twice in one) stays in the
// history but starts no second tool_call.started; the skip is counted.
func TestRepeatedCallID(t *testing.T) {
	r := newRollout("sess-repeat-call")
	r.task("turn-a", "list")
	r.call("call_x", "ls", 100)
	r.output("call_x", "Process exited with code 0\nOutput:\na.go")
	r.call("call_x", "ls", 200)
	r.call("call_y", "pwd", 300)
	r.call("call_y", "pwd", 300)
	r.output("call_y", "Process exited with code 0\nOutput:\n/repo")
	r.add("response_item", `{"type":"message","role":"assistant","content":[{"type":"output_text","text":"done"}]}`)
	r.add("event_msg", `{"type":"task_complete","turn_id":"turn-a","last_agent_message":"done"}`)

	c, _ := NewConverter(importer.Options{})
	res, err := c.Convert(strings.NewReader(r.String()), "rollout-built.jsonl", importer.Input{})
	if err != nil || len(res.Diagnostics) > 0 {
		t.Fatalf("convert: %v %v", err, res.Diagnostics)
	}
	started := map[string]int{}
	for _, ev := range res.Sessions[0].Events {
		if ev.Type == events.TypeToolCallStarted {
			started[payload[events.ToolCallStarted](t, ev).ToolUseID]++
		}
	}
	if started["call_x"] != 1 || started["call_y"] != 1 {
		t.Errorf("tool_call.started per id: %v; want one each", started)
	}
	if n := res.Skipped["tool call (call_id repeated)"]; n != 2 {
		t.Errorf("skipped repeated calls: %d; want 2 (%v)", n, res.Skipped)
	}
}
