package claudecode

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/importer/importertest"
)

// corpusDir is the shipped Claude Code transcripts, beside the repository.
func corpusDir(t testing.TB) string {
	t.Helper()
	dir := filepath.Join("..", "..", "..", "shared", "data", "transcripts", "claude-code")
	fi, err := os.Stat(dir)
	if err != nil || !fi.IsDir() {
		t.Fatalf("the Claude Code transcript corpus is missing: want a directory at %s (shared/data/transcripts/claude-code beside the repository): %v", dir, err)
	}
	return dir
}

// corpusFile is one shipped transcript, by its path under corpusDir.
func corpusFile(t testing.TB, rel string) string {
	t.Helper()
	p := filepath.Join(corpusDir(t), filepath.FromSlash(rel))
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("corpus file %s: %v", rel, err)
	}
	return p
}

type converted struct {
	files   []string
	results map[string]*Result // by file
}

// convertCorpus converts every file of the corpus, in Expand's order.
func convertCorpus(t testing.TB) *converted {
	t.Helper()
	files, err := Expand([]string{corpusDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no transcript in the corpus")
	}
	return convertFiles(t, files)
}

// sampled reports whether the tests that convert large parts of the corpus
// more than once take a sample (corpusSample): under the race detector
// and under -short. The full-size pass of .ci/run runs them whole.
func sampled() bool { return raceEnabled || testing.Short() }

// corpusSample is the part of the corpus a sampled test converts (the race
// detector finds nothing in a conversion, one goroutine, and slows
// decoding JSON twentyfold): every file of at most 256 KiB (sessions,
// subagents linked by file, compactions, API errors, interruptions) and
// ccviewer/fe5e1c67 (Claude Code 1.0, with six subagents written inline
// and linked to their Task calls). The five long spotter sessions, some
// 3 MB each, are left to the full-size pass of .ci/run.
func corpusSample(t testing.TB) []string {
	t.Helper()
	files, err := Expand([]string{corpusDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	out := importertest.Sample(t, files, corpusFile(t, "ccviewer/fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl"))
	if len(out) < 15 || len(out) == len(files) {
		t.Fatalf("the sample holds %d of the corpus's %d files", len(out), len(files))
	}
	return out
}

// convertFiles converts files in order with one Converter, as an import
// of them does.
func convertFiles(t testing.TB, files []string) *converted {
	t.Helper()
	c, err := NewConverter(Options{})
	if err != nil {
		t.Fatal(err)
	}
	out := &converted{files: files, results: map[string]*Result{}}
	for _, f := range files {
		res, err := c.ConvertFile(f)
		if err != nil {
			t.Fatalf("convert %s: %v", f, err)
		}
		out.results[f] = res
	}
	return out
}

var (
	corpusOnce   sync.Once
	corpusCached *converted
)

// sharedCorpus converts the corpus once for the tests that only read it:
// the whole corpus, or corpusSample when sampled.
func sharedCorpus(t testing.TB) *converted {
	t.Helper()
	corpusDir(t)
	corpusOnce.Do(func() {
		if sampled() {
			corpusCached = convertFiles(t, corpusSample(t))
		} else {
			corpusCached = convertCorpus(t)
		}
	})
	if corpusCached == nil {
		t.Fatal("corpus conversion failed earlier")
	}
	return corpusCached
}

func (c *converted) sessions() []Session {
	var out []Session
	for _, f := range c.files {
		out = append(out, c.results[f].Sessions...)
	}
	return out
}

func payload[T any](t testing.TB, ev events.Event) *T {
	t.Helper()
	p, err := ev.Payload()
	if err != nil {
		t.Fatalf("%s: %v", ev, err)
	}
	v, ok := any(p).(*T)
	if !ok {
		t.Fatalf("%s: payload is %T", ev, p)
	}
	return v
}

// stats counts what a session holds.
type stats struct {
	turns, completed, interrupted, failed, messages, toolUses, toolResults, distillations, errors int
}

func sessionStats(t testing.TB, s Session) stats {
	var st stats
	for _, ev := range s.Events {
		switch ev.Type {
		case events.TypeTurnStarted:
			st.turns++
		case events.TypeTurnCompleted:
			st.completed++
			if payload[events.TurnCompleted](t, ev).Reason == "interrupted" {
				st.interrupted++
			}
		case events.TypeTurnFailed:
			st.failed++
		case events.TypeMessageAppended:
			st.messages++
			for _, b := range payload[events.MessageAppended](t, ev).Content {
				switch b.Type {
				case events.BlockToolUse:
					st.toolUses++
				case events.BlockToolResult:
					st.toolResults++
				}
			}
		case events.TypeDistillationCompleted:
			st.distillations++
		case events.TypeErrorRecorded:
			st.errors++
		}
	}
	return st
}

// checkSession asserts the rules every converted session keeps: it opens
// with session.started; every event is valid; turns do not overlap and each
// ends at most once, every turn but the last before the next starts (the
// last may stay in flight: see openTurn); events inside a turn name it;
// tool calls start and complete once. It returns the problems found.
func checkSession(t testing.TB, s Session) []string {
	t.Helper()
	var probs []string
	bad := func(format string, args ...any) { probs = append(probs, fmt.Sprintf(format, args...)) }
	if len(s.Events) == 0 || s.Events[0].Type != events.TypeSessionStarted {
		bad("does not start with session.started")
	}
	open := ""
	ended := map[string]bool{}
	calls := map[string]string{} // tool_use id -> state
	for i, ev := range s.Events {
		if err := events.Validate(&ev); err != nil {
			bad("event %d (%s) invalid: %v", i, ev.Type, err)
		}
		if ev.Tenant != s.Tenant || ev.Session != s.Session {
			bad("event %d in %s/%s", i, ev.Tenant, ev.Session)
		}
		if i > 0 && ev.Type == events.TypeSessionStarted {
			bad("second session.started at %d", i)
		}
		switch ev.Type {
		case events.TypeTurnStarted:
			if open != "" {
				bad("turn %s starts while %s is open", ev.Turn, open)
			}
			if ended[ev.Turn] {
				bad("turn %s started twice", ev.Turn)
			}
			open = ev.Turn
		case events.TypeTurnCompleted, events.TypeTurnFailed:
			if ev.Turn != open {
				bad("%s of turn %s while %q is open", ev.Type, ev.Turn, open)
			}
			ended[ev.Turn] = true
			open = ""
		case events.TypeToolCallStarted:
			p := payload[events.ToolCallStarted](t, ev)
			if calls[p.ToolUseID] != "" {
				bad("tool call %s started twice", p.ToolUseID)
			}
			calls[p.ToolUseID] = "started"
		case events.TypeToolCallCompleted:
			p := payload[events.ToolCallCompleted](t, ev)
			if calls[p.ToolUseID] != "started" {
				bad("tool call %s completed but %q", p.ToolUseID, calls[p.ToolUseID])
			}
			calls[p.ToolUseID] = "completed"
		}
		if ev.Turn != "" && ev.Type != events.TypeTurnCompleted && ev.Type != events.TypeTurnFailed && ev.Turn != open {
			bad("%s at %d names turn %s while %q is open", ev.Type, i, ev.Turn, open)
		}
	}
	return probs
}

// openTurn returns the session's last turn when no end event follows its
// turn.started, or "".
func openTurn(s Session) string {
	open := ""
	for _, ev := range s.Events {
		switch ev.Type {
		case events.TypeTurnStarted:
			open = ev.Turn
		case events.TypeTurnCompleted, events.TypeTurnFailed, events.TypeTurnAbandoned:
			open = ""
		}
	}
	return open
}

// historyProblems applies the message-history invariant of docs/design.md
// to a session's message.appended events, after merging consecutive records of
// one role: every tool_use gets exactly one tool_result in the next (user)
// message, which puts its results first; every tool_result answers a
// tool_use of the previous assistant message. A distillation.completed
// starts a new history.
func historyProblems(t testing.TB, s Session) []string {
	type msg struct {
		role   events.Role
		blocks []events.ContentBlock
	}
	var probs []string
	var hist []msg
	check := func() {
		for i, m := range hist {
			if m.role != events.RoleAssistant {
				continue
			}
			var uses []string
			for _, b := range m.blocks {
				if b.Type == events.BlockToolUse {
					uses = append(uses, b.ID)
				}
			}
			if len(uses) == 0 {
				continue
			}
			if i+1 >= len(hist) {
				probs = append(probs, fmt.Sprintf("tool_use %v never answered", uses))
				continue
			}
			next := hist[i+1]
			answered := map[string]int{}
			inResults := true
			for _, b := range next.blocks {
				if b.Type == events.BlockToolResult {
					if !inResults {
						probs = append(probs, fmt.Sprintf("tool_result %s after other blocks", b.ToolUseID))
					}
					answered[b.ToolUseID]++
				} else {
					inResults = false
				}
			}
			for _, u := range uses {
				if answered[u] != 1 {
					probs = append(probs, fmt.Sprintf("tool_use %s answered %d times in the next message", u, answered[u]))
				}
				delete(answered, u)
			}
			for id := range answered {
				probs = append(probs, fmt.Sprintf("tool_result %s answers no tool_use of the previous message", id))
			}
		}
		hist = hist[:0]
	}
	for _, ev := range s.Events {
		switch ev.Type {
		case events.TypeDistillationCompleted:
			check()
		case events.TypeMessageAppended:
			p := payload[events.MessageAppended](t, ev)
			if n := len(hist); n > 0 && hist[n-1].role == p.Role {
				hist[n-1].blocks = append(hist[n-1].blocks, p.Content...)
			} else {
				hist = append(hist, msg{role: p.Role, blocks: append([]events.ContentBlock(nil), p.Content...)})
			}
		}
	}
	check()
	return probs
}

// TestCorpusConverts: every file of the corpus (of corpusSample when
// sampled; the full-size pass of .ci/run converts all 25) converts
// without diagnostics into sessions with unique tokens and event ids,
// each valid, ending every turn, with a history a provider accepts, and
// every tool_use answered.
func TestCorpusConverts(t *testing.T) {
	t.Parallel()
	c := sharedCorpus(t)
	ids := map[string]string{}
	tokens := map[string]string{}
	var uses, results int
	for _, f := range c.files {
		res := c.results[f]
		rel, _ := filepath.Rel(corpusDir(t), f)
		for _, d := range res.Diagnostics {
			t.Errorf("%s: diagnostic: %v", rel, d)
		}
		if len(res.Sessions) == 0 {
			t.Errorf("%s: no session", rel)
		}
		for _, s := range res.Sessions {
			if prev, dup := tokens[s.Session]; dup {
				t.Errorf("%s: session %s also comes from %s", rel, s.Session, prev)
			}
			tokens[s.Session] = rel
			if !events.ValidToken(s.Session) || s.Tenant != DefaultTenant {
				t.Errorf("%s: session %q tenant %q", rel, s.Session, s.Tenant)
			}
			for _, p := range checkSession(t, s) {
				t.Errorf("%s (%s): %s", rel, s.Session, p)
			}
			if open := openTurn(s); open != "" {
				t.Errorf("%s (%s): turn %s never ends, though the transcript is complete", rel, s.Session, open)
			}
			for _, p := range historyProblems(t, s) {
				t.Errorf("%s (%s): history: %s", rel, s.Session, p)
			}
			for _, ev := range s.Events {
				if prev, dup := ids[ev.ID]; dup {
					t.Errorf("%s: event id %s also in %s", rel, ev.ID, prev)
				}
				ids[ev.ID] = rel
			}
			st := sessionStats(t, s)
			uses += st.toolUses
			results += st.toolResults
			t.Logf("%-75s %-9s turns %2d (interrupted %d, failed %d) messages %3d tool pairs %3d distillations %d",
				rel+" "+strings.TrimPrefix(s.Session, strings.TrimSuffix(filepath.Base(rel), ".jsonl")), s.Kind,
				st.turns, st.interrupted, st.failed, st.messages, st.toolUses, st.distillations)
		}
	}
	// The corpus holds 1,336 tool_use blocks, each with its tool_result,
	// and the sample 351 (counted with jq over the raw files).
	want := 1336
	if sampled() {
		want = 351
	}
	if uses != want || results != want {
		t.Errorf("tool_use blocks %d, tool_result blocks %d; want %d each", uses, results, want)
	}
}

// skipSampled skips a test about the long spotter sessions, which a
// sampled run does not convert (see corpusSample).
func skipSampled(t *testing.T) {
	t.Helper()
	if sampled() {
		t.Skip("reads the long spotter sessions, which the race detector's and -short's sample leaves to the full-size pass")
	}
}

// TestCorpusToolPairs asserts, from the converted events, that every
// tool_use id has exactly one tool_result later in the same session and
// that no tool_result comes without its tool_use.
func TestCorpusToolPairs(t *testing.T) {
	t.Parallel()
	for _, s := range sharedCorpus(t).sessions() {
		used := map[string]int{} // tool_use id -> event index
		answered := map[string]int{}
		for i, ev := range s.Events {
			if ev.Type != events.TypeMessageAppended {
				continue
			}
			for _, b := range payload[events.MessageAppended](t, ev).Content {
				switch b.Type {
				case events.BlockToolUse:
					if _, dup := used[b.ID]; dup {
						t.Errorf("%s: tool_use %s twice", s.Session, b.ID)
					}
					used[b.ID] = i
				case events.BlockToolResult:
					at, ok := used[b.ToolUseID]
					if !ok || at >= i {
						t.Errorf("%s: tool_result %s without an earlier tool_use", s.Session, b.ToolUseID)
					}
					answered[b.ToolUseID]++
				}
			}
		}
		for id := range used {
			if answered[id] != 1 {
				t.Errorf("%s: tool_use %s has %d tool_results", s.Session, id, answered[id])
			}
		}
	}
}

var longSpotter = []string{
	"258c7280-ae70-4798-800f-63464d01a85d",
	"4d5611e5-241a-462a-8d15-5122611a9569",
	"8463c716-a2ea-4c14-9efa-87158ebd9f20",
	"ae4a77f8-aedd-4bc1-888f-c94edc91af04",
	"fa812bfe-b295-4cca-9c2f-fdf01028cb46",
}

// TestCorpusDistillations: each long spotter session compacts once, the
// compaction's events in a row in the turn it ran in, the summary after
// them. Skipped when sampled: the full-size pass of .ci/run runs it.
func TestCorpusDistillations(t *testing.T) {
	t.Parallel()
	skipSampled(t)
	c := sharedCorpus(t)
	for _, id := range longSpotter {
		res := c.results[corpusFile(t, "spotter/"+id+".jsonl")]
		s := res.Sessions[0]
		if s.Session != id || s.Kind != KindMain {
			t.Fatalf("%s: first session %s kind %s", id, s.Session, s.Kind)
		}
		var got []int
		for i, ev := range s.Events {
			if ev.Type == events.TypeDistillationCompleted {
				got = append(got, i)
			}
		}
		if len(got) != 1 {
			t.Errorf("%s: %d distillation.completed, want 1", id, len(got))
			continue
		}
		i := got[0]
		req, start, done := s.Events[i-2], s.Events[i-1], s.Events[i]
		if req.Type != events.TypeDistillationRequested || start.Type != events.TypeDistillationStarted {
			t.Errorf("%s: distillation events %s, %s, %s", id, req.Type, start.Type, done.Type)
		}
		if req.Turn != done.Turn || start.Turn != done.Turn {
			t.Errorf("%s: distillation events name turns %q %q %q", id, req.Turn, start.Turn, done.Turn)
		}
		dc := payload[events.DistillationCompleted](t, done)
		if dc.TokensBefore <= 0 || dc.TokensAfter <= 0 || dc.TokensAfter >= dc.TokensBefore {
			t.Errorf("%s: tokens %d -> %d", id, dc.TokensBefore, dc.TokensAfter)
		}
		// The compact summary follows at once, as meta, in the same turn.
		sum := s.Events[i+1]
		m := payload[events.MessageAppended](t, sum)
		if sum.Type != events.TypeMessageAppended || m.Role != events.RoleUser || !m.Meta || sum.Turn != done.Turn ||
			!strings.HasPrefix(m.Content[0].Text, "This session is being continued") {
			t.Errorf("%s: after distillation.completed: %s turn %q %+v", id, sum.Type, sum.Turn, m)
		}
		switch dc.Trigger {
		case "auto":
			// Inside the turn in flight, between two model calls.
			if done.Turn == "" {
				t.Errorf("%s: auto compaction outside a turn", id)
			}
		case "manual":
			// /compact runs between turns.
			if done.Turn != "" {
				t.Errorf("%s: manual compaction in turn %s", id, done.Turn)
			}
		default:
			t.Errorf("%s: trigger %q", id, dc.Trigger)
		}
	}
	// 258c7280 compacts automatically in its second turn, the one a
	// background task's notification started; ae4a77f8 by /compact.
	s := c.results[corpusFile(t, "spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl")].Sessions[0]
	for _, ev := range s.Events {
		if ev.Type == events.TypeDistillationCompleted {
			dc := payload[events.DistillationCompleted](t, ev)
			if ev.Turn != "0a5857c1-7c3d-4165-b520-c7eff1cfa27a" || dc.TokensBefore != 167094 || dc.Trigger != "auto" {
				t.Errorf("258c7280: distillation in turn %q: %+v", ev.Turn, dc)
			}
		}
	}
}

func TestCorpusTurns(t *testing.T) {
	t.Parallel()
	c := sharedCorpus(t)
	tests := []struct {
		file                            string
		turns, interrupted, failed      int
		firstPrompt, firstTrigger, kind string
	}{
		{"spotter/short.jsonl", 1, 1, 0, "mix phx.server doesnt seem to start", "user", KindMain},
		{"spotter/tool_heavy.jsonl", 2, 2, 0, "start phoenix in background", "user", KindMain},
		{"spotter/subagent.jsonl", 2, 1, 0, "/handgemacht:create-beads websearch", "command", KindMain},
		{"spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl", 4, 1, 0, "Implement spotter-gqc", "user", KindMain},
		{"spotter/ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl", 2, 0, 0, "Work on bead spotter-4te.", "user", KindMain},
		{"ccviewer/1af7fc5e-8455-4414-9ccd-011d40f70b2a.jsonl", 1, 0, 0, "/init", "command", KindMain},
		{"ccviewer/fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl", 2, 0, 0, "/orchestrator create TODO app by Next.js", "command", KindMain},
		{"spotter/4d5611e5-241a-462a-8d15-5122611a9569/subagents/agent-acompact-e1f845.jsonl", 1, 0, 0, "Your task is to create a detailed summary", "compaction", KindCompaction},
		{"spotter/fa812bfe-b295-4cca-9c2f-fdf01028cb46/subagents/agent-a93ccab.jsonl", 1, 0, 0, "Explore the codebase", "subagent", KindSubagent},
	}
	for _, tt := range tests {
		res := c.results[corpusFile(t, tt.file)]
		if res == nil && sampled() {
			continue // a long file, or a subagent of one: see corpusSample
		}
		s := res.Sessions[0]
		st := sessionStats(t, s)
		if st.turns != tt.turns || st.interrupted != tt.interrupted || st.failed != tt.failed || s.Kind != tt.kind {
			t.Errorf("%s: kind %s turns %d interrupted %d failed %d; want %s %d %d %d",
				tt.file, s.Kind, st.turns, st.interrupted, st.failed, tt.kind, tt.turns, tt.interrupted, tt.failed)
		}
		for _, ev := range s.Events {
			if ev.Type == events.TypeTurnStarted {
				p := payload[events.TurnStarted](t, ev)
				if !strings.HasPrefix(p.Prompt, tt.firstPrompt) || p.Trigger != tt.firstTrigger {
					t.Errorf("%s: first turn prompt %q trigger %q, want %q... %q", tt.file, p.Prompt, p.Trigger, tt.firstPrompt, tt.firstTrigger)
				}
				break
			}
		}
	}
	// A turn ends before the local commands that follow it.
	s := c.results[corpusFile(t, "spotter/short.jsonl")].Sessions[0]
	if last := s.Events[len(s.Events)-1]; last.Type != events.TypeTurnCompleted || payload[events.TurnCompleted](t, last).DurationMS != 5634 {
		t.Errorf("short: last event %s %s, want turn.completed after 5634 ms", last.Type, last.Data)
	}
	if sampled() {
		return // 258c7280 is in the full-size pass
	}
	// A turn lasts from its prompt to its latest message (its
	// turn_duration record, 2729883 ms, comes after the turn and is not
	// read: the end must not depend on what follows the turn's messages).
	s = c.results[corpusFile(t, "spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl")].Sessions[0]
	found := false
	for _, ev := range s.Events {
		if ev.Type == events.TypeTurnCompleted && ev.Turn == "0a5857c1-7c3d-4165-b520-c7eff1cfa27a" {
			found = true
			if p := payload[events.TurnCompleted](t, ev); p.DurationMS != 2730135 || p.Reason != "end_turn" {
				t.Errorf("258c7280 turn 2 completed %+v, want 2730135 ms end_turn", p)
			}
		}
	}
	if !found {
		t.Error("258c7280: turn 0a5857c1 has no turn.completed")
	}
}

func TestCorpusSubagentsLinked(t *testing.T) {
	t.Parallel()
	c := sharedCorpus(t)
	bySession := map[string]Session{}
	for _, s := range c.sessions() {
		bySession[s.Session] = s
	}
	var sub, comp, linked int
	for _, s := range c.sessions() {
		if s.Kind == KindMain {
			if s.Parent != "" {
				t.Errorf("%s: main session with parent %s", s.Session, s.Parent)
			}
			continue
		}
		p := payload[events.SessionStarted](t, s.Events[0])
		if p.Kind != s.Kind || p.ParentSession != s.Parent || p.ParentToolUseID != s.ParentToolUseID || s.Parent == "" {
			t.Errorf("%s: session.started %+v vs %+v", s.Session, p, s)
		}
		if !strings.HasPrefix(s.Session, s.Parent+"_agent-") {
			t.Errorf("%s: token does not name its parent %s", s.Session, s.Parent)
		}
		parent, haveParent := bySession[s.Parent]
		switch s.Kind {
		case KindCompaction:
			comp++
		case KindSubagent:
			sub++
			if s.ParentToolUseID == "" {
				// Only the subagents whose parent is not shipped (6c2214d7)
				// or whose parent has no matching Task call (ccviewer's
				// agent-test-hash files) stay unlinked.
				if haveParent && !strings.Contains(s.Session, "test-hash") {
					t.Errorf("%s: not linked to a tool call of %s", s.Session, s.Parent)
				}
				continue
			}
			linked++
			if !haveParent {
				t.Errorf("%s: linked to %s but the parent was not converted", s.Session, s.ParentToolUseID)
				continue
			}
			ok := false
			for _, ev := range parent.Events {
				if ev.Type != events.TypeMessageAppended {
					continue
				}
				for _, b := range payload[events.MessageAppended](t, ev).Content {
					if b.Type == events.BlockToolUse && b.ID == s.ParentToolUseID && b.Name == "Task" {
						ok = true
					}
				}
			}
			if !ok {
				t.Errorf("%s: parent tool use %s is no Task call of %s", s.Session, s.ParentToolUseID, s.Parent)
			}
		}
	}
	// spotter: 7 subagent and 5 compaction files; ccviewer: 2 agent files
	// and 7 subagents written inline in their parents' files. The sample
	// holds all but one (4d5611e5's agent-a2898e3, 290 KiB), and not the
	// long spotter sessions whose Task calls the spotter ones answer:
	// only the 7 inline ones link.
	wantSub, wantLinked := 16, 13
	if sampled() {
		wantSub, wantLinked = 15, 7
	}
	if sub != wantSub || comp != 5 || linked != wantLinked {
		t.Errorf("subagents %d (linked %d), compactions %d; want %d (%d), 5", sub, linked, comp, wantSub, wantLinked)
	}
}

// TestConvertTwiceIdentical: a second conversion of the files sharedCorpus
// converted (corpusSample under the race detector and -short; the whole
// corpus in the full-size pass of .ci/run) is equal to the first, and the
// tenant enters the event ids.
func TestConvertTwiceIdentical(t *testing.T) {
	t.Parallel()
	a := sharedCorpus(t)
	b := convertFiles(t, a.files)
	for _, f := range a.files {
		if !reflect.DeepEqual(a.results[f], b.results[f]) {
			t.Errorf("%s: two conversions differ", f)
		}
	}
	// Another tenant gives other ids for the same records.
	f := corpusFile(t, "spotter/short.jsonl")
	x, err := ConvertFile(f, Options{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	y := a.results[f]
	if x.Sessions[0].Events[0].ID == y.Sessions[0].Events[0].ID || x.Sessions[0].Events[0].Tenant != "acme" {
		t.Error("tenant does not enter the event ids")
	}
}

// readLines returns a transcript's lines.
func readLines(t testing.TB, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

func convertLines(t testing.TB, name string, lines []string) *Result {
	t.Helper()
	res, err := Convert(strings.NewReader(strings.Join(lines, "\n")+"\n"), name, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// toolUseLines lists, for each assistant record with a tool_use block, its
// index and the tool_use id.
func toolUseLines(t testing.TB, lines []string) (idx []int, ids []string) {
	for i, l := range lines {
		r, err := parseRecord([]byte(l))
		if err != nil || r.typ != recAssistant {
			continue
		}
		for _, b := range r.blocks {
			if b.Type == events.BlockToolUse {
				idx = append(idx, i)
				ids = append(ids, b.ID)
			}
		}
	}
	return idx, ids
}

// TestCutAfterToolUseLeavesTheTurnInFlight cuts real transcripts right
// after each tool_use record, as a process that died mid-tool (or a
// snapshot of a file still being written) leaves them: the tool_use is
// converted, its turn stays in flight (the transcript does not say how it
// ended), and no result is made up. Under the race detector and -short
// it cuts the three small files only; the full-size pass of .ci/run cuts the long
// 258c7280 too (2.7 MB converted per cut).
func TestCutAfterToolUseLeavesTheTurnInFlight(t *testing.T) {
	t.Parallel()
	files := []string{
		"spotter/short.jsonl",
		"spotter/tool_heavy.jsonl",
		"spotter/ae4a77f8-aedd-4bc1-888f-c94edc91af04/subagents/agent-aac57f5.jsonl", // six parallel tool calls
		"spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl",
	}
	if sampled() {
		files = files[:3]
	}
	for _, rel := range files {
		lines := readLines(t, corpusFile(t, rel))
		idx, ids := toolUseLines(t, lines)
		if len(idx) == 0 {
			t.Fatalf("%s: no tool_use", rel)
		}
		// Every cut point in the small files; a few in the long one.
		step := 1
		if len(idx) > 40 {
			step = len(idx)/3 + 1
		}
		for k := 0; k < len(idx); k += step {
			cut := lines[:idx[k]+1]
			res := convertLines(t, rel, cut)
			if len(res.Diagnostics) > 0 {
				t.Fatalf("%s cut at line %d: %v", rel, idx[k]+1, res.Diagnostics)
			}
			s := res.Sessions[0]
			for _, p := range checkSession(t, s) {
				t.Errorf("%s cut at line %d: %s", rel, idx[k]+1, p)
			}
			if openTurn(s) == "" {
				t.Errorf("%s cut at line %d: the last turn ended; want it in flight", rel, idx[k]+1)
			}
			started := false
			for _, ev := range s.Events {
				switch ev.Type {
				case events.TypeToolCallStarted:
					started = started || payload[events.ToolCallStarted](t, ev).ToolUseID == ids[k]
				case events.TypeMessageAppended:
					for _, b := range payload[events.MessageAppended](t, ev).Content {
						if b.Type == events.BlockToolResult && b.ToolUseID == ids[k] {
							t.Errorf("%s cut at line %d: %s has a tool_result", rel, idx[k]+1, ids[k])
						}
					}
				}
			}
			if !started {
				t.Errorf("%s cut at line %d: no tool_call.started for %s", rel, idx[k]+1, ids[k])
			}
		}
	}
}

// TestRepeatedToolUseStartsOneCall: a tool_use id names one call. An
// assistant record copied under a new uuid after its call was answered
// (found by FuzzConvert), or a block repeating an id inside one message,
// starts no second tool_call.started; the skip is counted.
func TestRepeatedToolUseStartsOneCall(t *testing.T) {
	t.Parallel()
	use := `[{"type":"tool_use","id":"toolu_A","name":"Glob","input":{}}]`
	res := convertLines(t, "main.jsonl", []string{
		userAt("p1", 0, `"find mix.exs"`, ""),
		assistantAt("a1", 1, "msg_1", use),
		userAt("r1", 2, `[{"type":"tool_result","tool_use_id":"toolu_A","content":"rejected","is_error":true}]`, ""),
		assistantAt("a1-copy", 3, "msg_1", use),
		assistantAt("a2", 4, "msg_2", `[{"type":"tool_use","id":"toolu_B","name":"Read","input":{}},{"type":"tool_use","id":"toolu_B","name":"Read","input":{}}]`),
	})
	s := res.Sessions[0]
	for _, p := range checkSession(t, s) {
		t.Error(p)
	}
	started := map[string]int{}
	for _, ev := range s.Events {
		if ev.Type == events.TypeToolCallStarted {
			started[payload[events.ToolCallStarted](t, ev).ToolUseID]++
		}
	}
	if started["toolu_A"] != 1 || started["toolu_B"] != 1 {
		t.Errorf("tool_call.started per id: %v; want one each", started)
	}
	if n := res.Skipped["tool_use (id repeated)"]; n != 2 {
		t.Errorf("skipped repeated tool_use: %d; want 2 (%v)", n, res.Skipped)
	}
}

func TestMalformedLinesAreReportedAndSkipped(t *testing.T) {
	lines := readLines(t, corpusFile(t, "spotter/tool_heavy.jsonl"))
	clean := convertLines(t, "x.jsonl", lines)

	// Insert bad lines in the middle and a truncated record at the end.
	var bad []string
	var wantLines []int
	for i, l := range lines {
		bad = append(bad, l)
		switch i {
		case 3:
			bad = append(bad, `{"type":"user","uuid":"zz",`)
			wantLines = append(wantLines, len(bad))
		case 10:
			bad = append(bad, `{"type":"user","uuid":"u-bad","timestamp":"2026-02-10T22:57:59.200Z","message":5}`)
			wantLines = append(wantLines, len(bad))
		case 16:
			bad = append(bad, "   \t ")
			wantLines = append(wantLines, len(bad))
		case 20:
			bad = append(bad, `{"type":"assistant","uuid":"a-bad","timestamp":"2026-02-10T22:58:05Z","message":{"content":[{"type":"tool_use","id":7}]}}`)
			wantLines = append(wantLines, len(bad))
		}
	}
	trunc := lines[12][:len(lines[12])/2]
	bad = append(bad, trunc)
	wantLines = append(wantLines, len(bad))
	res, err := Convert(strings.NewReader(strings.Join(bad, "\n")), "bad.jsonl", Options{})
	if err != nil {
		t.Fatal(err)
	}
	var gotLines []int
	for _, d := range res.Diagnostics {
		gotLines = append(gotLines, d.Line)
		if !strings.HasPrefix(d.Error(), fmt.Sprintf("bad.jsonl:%d: ", d.Line)) {
			t.Errorf("diagnostic %q lacks file:line", d.Error())
		}
		if d.File != "bad.jsonl" {
			t.Errorf("diagnostic file %q", d.File)
		}
	}
	if !reflect.DeepEqual(gotLines, wantLines) {
		t.Errorf("diagnostics at lines %v, want %v: %v", gotLines, wantLines, res.Diagnostics)
	}
	if res.Records != len(lines) {
		t.Errorf("records %d, want %d", res.Records, len(lines))
	}
	if !reflect.DeepEqual(res.Sessions, renameFile(clean.Sessions, "bad.jsonl")) {
		t.Error("the events differ from those of the clean file")
	}

	// A line over the limit is skipped and reported; the rest converts.
	limit := 0
	for _, l := range lines {
		limit = max(limit, len(l))
	}
	long := append([]string{}, lines...)
	long[5] = `{"type":"progress","pad":"` + strings.Repeat("x", limit) + `"}`
	res, err = Convert(strings.NewReader(strings.Join(long, "\n")), "long.jsonl", Options{MaxLineBytes: limit})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Diagnostics) != 1 || res.Diagnostics[0].Line != 6 || !strings.Contains(res.Diagnostics[0].Error(), "line too long") {
		t.Errorf("diagnostics %v, want one for line 6", res.Diagnostics)
	}
	if res.EventCount() != clean.EventCount() {
		t.Errorf("%d events, want %d", res.EventCount(), clean.EventCount())
	}
}

func renameFile(ss []Session, name string) []Session {
	out := make([]Session, len(ss))
	for i, s := range ss {
		s.File = name
		out[i] = s
	}
	return out
}

// ts is a timestamp n seconds into a test session.
func ts(n int) string { return fmt.Sprintf("2026-03-01T10:00:%02d.000Z", n) }

func userAt(uuid string, n int, content, extra string) string {
	if extra != "" {
		extra = "," + extra
	}
	return `{"type":"user","uuid":"` + uuid + `","sessionId":"sess-1","version":"2.1.39","timestamp":"` + ts(n) + `",` +
		`"message":{"role":"user","content":` + content + `}` + extra + `}`
}

func assistantAt(uuid string, n int, msgID, content string) string {
	return `{"type":"assistant","uuid":"` + uuid + `","sessionId":"sess-1","timestamp":"` + ts(n) + `",` +
		`"message":{"id":"` + msgID + `","model":"claude-opus-4-6","role":"assistant","stop_reason":null,` +
		`"usage":{"input_tokens":10,"cache_read_input_tokens":1000,"cache_creation_input_tokens":5},"content":` + content + `}}`
}

func types(evs []events.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = string(e.Type)
		if e.Turn != "" {
			out[i] += "@" + e.Turn
		}
	}
	return out
}

func TestAPIErrorsFailTheTurn(t *testing.T) {
	overloaded := `API Error: 529 {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}`
	lines := []string{
		userAt("p1", 0, `"do it"`, ""),
		apiErrorLineAt("e1", ts(1), overloaded, ""),
		apiErrorLineAt("e2", ts(2), overloaded, ""),
		userAt("p2", 3, `"try again"`, ""),
		apiErrorLineAt("e3", ts(4), overloaded, ""),
		assistantAt("a1", 5, "msg_1", `[{"type":"text","text":"done"}]`),
		apiErrorLineAt("e4", ts(6), `API Error: 401 {\"type\":\"error\",\"error\":{\"type\":\"authentication_error\",\"message\":\"invalid x-api-key\"}}`, ""),
	}
	res := convertLines(t, "err.jsonl", lines)
	if len(res.Diagnostics) > 0 {
		t.Fatal(res.Diagnostics)
	}
	s := res.Sessions[0]
	for _, p := range checkSession(t, s) {
		t.Error(p)
	}
	want := []string{
		"session.started",
		"turn.started@p1", "message.appended@p1", "turn.stage_completed@p1", "turn.stage_completed@p1", // the model was called
		"error.recorded@p1", "error.recorded@p1", "turn.failed@p1",
		"turn.started@p2", "message.appended@p2", "turn.stage_completed@p2", "turn.stage_completed@p2",
		"error.recorded@p2", "message.appended@p2", "error.recorded@p2", "turn.failed@p2",
	}
	if got := types(s.Events); !reflect.DeepEqual(got, want) {
		t.Fatalf("events\n%v\nwant\n%v", got, want)
	}
	var consec []int
	for _, ev := range s.Events {
		if ev.Type == events.TypeErrorRecorded {
			p := payload[events.ErrorRecorded](t, ev)
			consec = append(consec, p.Consecutive)
			if p.Provider != "anthropic" || p.Stage != events.StageExecute {
				t.Errorf("error.recorded %+v", p)
			}
		}
	}
	if !reflect.DeepEqual(consec, []int{1, 2, 3, 1}) {
		t.Errorf("consecutive counts %v, want [1 2 3 1]", consec)
	}
	f1 := payload[events.TurnFailed](t, s.Events[7])
	if f1.Stage != events.StageExecute || f1.Error.HTTPStatus != 529 || f1.Error.Code != "overloaded_error" || f1.Error.Kind != events.KindTransient {
		t.Errorf("turn.failed %+v", f1)
	}
	f2 := payload[events.TurnFailed](t, s.Events[15])
	if f2.Error.HTTPStatus != 401 || f2.Error.Kind != events.KindLogic || f2.Error.Code != "authentication_error" {
		t.Errorf("turn.failed %+v", f2)
	}

	// An error the runtime recovered from (a response follows) does not
	// fail the turn.
	res = convertLines(t, "ok.jsonl", lines[:6])
	evs := res.Sessions[0].Events
	if last := evs[len(evs)-1]; last.Type != events.TypeTurnCompleted {
		t.Errorf("last event %s, want turn.completed", last.Type)
	}

	// Claude Code 2.x also writes a system api_error record for each
	// attempt it retries: errors, counted, that fail the turn only when the
	// last attempt fails too.
	retry := func(uuid string, n, attempt int) string {
		return fmt.Sprintf(`{"type":"system","subtype":"api_error","level":"error","uuid":%q,"timestamp":%q,"retryAttempt":%d,"maxRetries":10,"retryInMs":500,`+
			`"error":{"status":529,"error":{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}}}`, uuid, ts(n), attempt)
	}
	lines = []string{
		userAt("p1", 0, `"do it"`, ""),
		retry("r1", 1, 1),
		retry("r2", 2, 2),
		assistantAt("a1", 3, "msg_1", `[{"type":"text","text":"done"}]`),
		userAt("p2", 4, `"again"`, ""),
		retry("r3", 5, 1),
		apiErrorLineAt("e1", ts(6), overloaded, ""),
	}
	res = convertLines(t, "retry.jsonl", lines)
	s = res.Sessions[0]
	want = []string{
		"session.started",
		"turn.started@p1", "message.appended@p1", "turn.stage_completed@p1", "turn.stage_completed@p1",
		"error.recorded@p1", "error.recorded@p1", "message.appended@p1", "turn.completed@p1",
		"turn.started@p2", "message.appended@p2", "turn.stage_completed@p2", "turn.stage_completed@p2",
		"error.recorded@p2", "error.recorded@p2", "turn.failed@p2",
	}
	if got := types(s.Events); !reflect.DeepEqual(got, want) || len(res.Diagnostics) > 0 {
		t.Fatalf("events\n%v\nwant\n%v\n%v", got, want, res.Diagnostics)
	}
	consec = nil
	for _, ev := range s.Events {
		if ev.Type == events.TypeErrorRecorded {
			p := payload[events.ErrorRecorded](t, ev)
			consec = append(consec, p.Consecutive)
			if p.HTTPStatus != 529 || p.Code != "overloaded_error" || p.Kind != events.KindTransient {
				t.Errorf("error.recorded %+v", p)
			}
		}
	}
	if !reflect.DeepEqual(consec, []int{1, 2, 1, 2}) {
		t.Errorf("consecutive counts %v, want [1 2 1 2]", consec)
	}
	if m := payload[events.ErrorRecorded](t, s.Events[5]).Message; m != "Overloaded (retry 1 of 10)" {
		t.Errorf("retry message %q", m)
	}
}

func TestCommandsAndMergedMessages(t *testing.T) {
	lines := []string{
		`{"type":"file-history-snapshot","messageId":"x","snapshot":{}}`,
		userAt("c1", 0, `"<command-message>init is analyzing your codebase…</command-message>\n<command-name>/init</command-name>"`, ""),
		userAt("m1", 0, `[{"type":"text","text":"Please analyze this codebase"}]`, `"isMeta":true`),
		assistantAt("a1", 1, "msg_1", `[{"type":"thinking","thinking":"hm","signature":"s"}]`),
		assistantAt("a2", 2, "msg_1", `[{"type":"tool_use","id":"toolu_A","name":"Read","input":{"file_path":"/a"}}]`),
		`{"type":"progress","data":{"type":"hook_progress"},"uuid":"pr1"}`,
		userAt("r1", 3, `[{"type":"tool_result","tool_use_id":"toolu_A","content":"a"}]`, `"toolUseResult":{"durationMs":7}`),
		assistantAt("a3", 4, "msg_1", `[{"type":"tool_use","id":"toolu_B","name":"Bash","input":{"command":"ls"}}]`),
		userAt("r2", 6, `[{"type":"tool_result","tool_use_id":"toolu_B","content":"b","is_error":true}]`, ""),
		assistantAt("a4", 7, "msg_2", `[{"type":"text","text":"done"}]`),
		`{"type":"system","subtype":"stop_hook_summary","uuid":"sh","timestamp":"` + ts(8) + `"}`,
		userAt("cv", 9, `"<local-command-caveat>Caveat: ...</local-command-caveat>"`, `"isMeta":true`),
		userAt("c2", 9, `"<command-name>/mcp</command-name>\n<command-message>mcp</command-message>\n<command-args></command-args>"`, ""),
		userAt("o2", 9, `"<local-command-stdout>Reconnected.</local-command-stdout>"`, ""),
		userAt("b1", 9, `"<bash-input>ls</bash-input>"`, ""),
		userAt("b2", 9, `"<bash-stdout>a.go</bash-stdout><bash-stderr></bash-stderr>"`, ""),
		userAt("p2", 10, `"next"`, ""),
	}
	res := convertLines(t, "cmd.jsonl", lines)
	if len(res.Diagnostics) > 0 {
		t.Fatal(res.Diagnostics)
	}
	s := res.Sessions[0]
	for _, p := range checkSession(t, s) {
		t.Error(p)
	}
	for _, p := range historyProblems(t, s) {
		t.Error(p)
	}
	want := []string{
		"session.started",
		"turn.started@c1", "message.appended@c1", "message.appended@c1",
		"turn.stage_completed@c1", "turn.stage_completed@c1", // the model answered: execute
		"message.appended@c1",                                                   // a1..a3 merged: thinking, tool_use A, tool_use B
		"tool_call.started@c1", "tool_call.completed@c1", "message.appended@c1", // A and its result, held back
		"tool_call.started@c1", "tool_call.completed@c1", "message.appended@c1", // B
		"message.appended@c1", // a4
		"turn.completed@c1",
		"message.appended", "message.appended", "message.appended", // /mcp runs between turns
		"message.appended", "message.appended", // so does !ls
		"turn.started@p2", "message.appended@p2", // the model has not answered p2: in flight
	}
	if got := types(s.Events); !reflect.DeepEqual(got, want) {
		t.Fatalf("events\n%v\nwant\n%v", got, want)
	}
	ts := payload[events.TurnStarted](t, s.Events[1])
	if ts.Prompt != "/init" || ts.Trigger != "command" {
		t.Errorf("turn.started %+v", ts)
	}
	if m := payload[events.MessageAppended](t, s.Events[3]); !m.Meta {
		t.Error("the command's expansion is not meta")
	}
	if st := payload[events.TurnStageCompleted](t, s.Events[5]); st.Stage != events.StageHistory || s.Events[5].Time != s.Events[6].Time {
		t.Errorf("the turn's stage before the model's first answer: %+v at %v", st, s.Events[5].Time)
	}
	merged := payload[events.MessageAppended](t, s.Events[6])
	if merged.MessageID != "msg_1" || len(merged.Content) != 3 || merged.Content[1].ID != "toolu_A" || merged.Content[2].ID != "toolu_B" {
		t.Errorf("merged message %+v", merged)
	}
	if s.Events[6].Time != s.Events[2].Time.Add(1e9) {
		t.Errorf("merged message time %v, want the first record's", s.Events[6].Time)
	}
	a := payload[events.ToolCallCompleted](t, s.Events[8])
	b := payload[events.ToolCallCompleted](t, s.Events[11])
	if a.DurationMS != 7 || a.IsError || b.DurationMS != 2000 || !b.IsError || b.Name != "Bash" {
		t.Errorf("tool calls %+v %+v", a, b)
	}
	if m := payload[events.MessageAppended](t, s.Events[15]); !m.Meta {
		t.Error("caveat not meta")
	}
	if m := payload[events.MessageAppended](t, s.Events[17]); !m.Meta {
		t.Error("command output not meta")
	}
	if res.Skipped["file-history-snapshot"] != 1 || res.Skipped["progress"] != 1 || res.Skipped["system/stop_hook_summary"] != 1 {
		t.Errorf("skipped %v", res.Skipped)
	}
}

func TestOrphanMidFileIsNotAnEndOfFileFailure(t *testing.T) {
	lines := []string{
		userAt("p1", 0, `"go"`, ""),
		assistantAt("a1", 1, "msg_1", `[{"type":"tool_use","id":"toolu_X","name":"Bash","input":{}}]`),
		userAt("p2", 5, `"hello?"`, ""),
		assistantAt("a2", 6, "msg_2", `[{"type":"text","text":"hi"}]`),
	}
	evs := convertLines(t, "o.jsonl", lines).Sessions[0].Events
	if last := evs[len(evs)-1]; last.Type != events.TypeTurnCompleted {
		t.Errorf("last event %s", last.Type)
	}
	for _, ev := range evs {
		if ev.Type == events.TypeTurnFailed {
			t.Errorf("unexpected %s", ev)
		}
	}
}

func TestSubagentFileLinkedInOneRun(t *testing.T) {
	dir := t.TempDir()
	parent := filepath.Join(dir, "sess-1.jsonl")
	sub := filepath.Join(dir, "sess-1", "subagents", "agent-abc123.jsonl")
	write(t, parent,
		userAt("p1", 0, `"explore"`, ""),
		assistantAt("a1", 1, "msg_1", `[{"type":"tool_use","id":"toolu_T","name":"Task","input":{"description":"x","prompt":"Look around","subagent_type":"Explore"}}]`),
		`{"type":"progress","parentToolUseID":"toolu_T","data":{"type":"agent_progress","agentId":"abc123"},"uuid":"pp","timestamp":"`+ts(2)+`"}`,
		userAt("r1", 9, `[{"type":"tool_result","tool_use_id":"toolu_T","content":[{"type":"text","text":"found it"}]}]`, `"toolUseResult":{"status":"completed","agentId":"abc123","totalDurationMs":7000}`),
	)
	write(t, sub,
		`{"type":"user","uuid":"s1","sessionId":"sess-1","agentId":"abc123","isSidechain":true,"timestamp":"`+ts(2)+`","message":{"role":"user","content":"Look around"}}`,
		`{"type":"assistant","uuid":"s2","sessionId":"sess-1","agentId":"abc123","isSidechain":true,"timestamp":"`+ts(3)+`","message":{"id":"m9","model":"claude-haiku-4-5-20251001","content":[{"type":"text","text":"found it"}]}}`,
	)
	files, err := Expand([]string{parent})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(files, []string{parent, sub}) {
		t.Fatalf("Expand = %v", files)
	}
	c, err := NewConverter(Options{Tenant: "t1"})
	if err != nil {
		t.Fatal(err)
	}
	var sessions []Session
	for _, f := range files {
		res, err := c.ConvertFile(f)
		if err != nil || len(res.Diagnostics) > 0 {
			t.Fatal(err, res.Diagnostics)
		}
		sessions = append(sessions, res.Sessions...)
	}
	s := sessions[1]
	if s.Session != "sess-1_agent-abc123" || s.Parent != "sess-1" || s.ParentToolUseID != "toolu_T" || s.Kind != KindSubagent {
		t.Errorf("subagent session %+v", s)
	}
	p := payload[events.SessionStarted](t, s.Events[0])
	if p.Labels["subagent_type"] != "Explore" || p.Labels["agent_id"] != "abc123" || p.Model != "claude-haiku-4-5-20251001" {
		t.Errorf("session.started %+v", p)
	}
	// Alone, the subagent file is still its own session, unlinked.
	res, err := ConvertFile(sub, Options{Tenant: "t1"})
	if err != nil {
		t.Fatal(err)
	}
	if s2 := res.Sessions[0]; s2.Session != s.Session || s2.Parent != "sess-1" || s2.ParentToolUseID != "" {
		t.Errorf("alone: %+v", s2)
	}
	for _, ev := range sessions[0].Events {
		if ev.Type == events.TypeToolCallCompleted {
			if d := payload[events.ToolCallCompleted](t, ev); d.ToolUseID == "toolu_T" && d.DurationMS != 7000 {
				t.Errorf("Task duration %+v", d)
			}
		}
	}
}

func write(t testing.TB, path string, lines ...string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestOptions(t *testing.T) {
	for _, o := range []Options{{Tenant: "a.b"}, {Tenant: strings.Repeat("x", 129)}, {MaxLineBytes: -1}} {
		if _, err := NewConverter(o); err == nil {
			t.Errorf("NewConverter(%+v) accepted", o)
		}
	}
	res, err := Convert(strings.NewReader(userAt("p", 0, `"hi"`, "")), "x.jsonl", Options{Source: "urn:test"})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range res.Sessions[0].Events {
		if ev.Source != "urn:test" || ev.Tenant != DefaultTenant {
			t.Errorf("%s: source %q tenant %q", ev, ev.Source, ev.Tenant)
		}
	}
	res, _ = Convert(strings.NewReader(userAt("p", 0, `"hi"`, "")), "x.jsonl", Options{})
	if src := res.Sessions[0].Events[0].Source; src != "urn:claude-code:sess-1" {
		t.Errorf("source %q", src)
	}
}

func TestNoSessionWithoutHistory(t *testing.T) {
	res, err := Convert(strings.NewReader(`{"type":"summary","summary":"x"}`+"\n"), "s.jsonl", Options{})
	if err != nil || len(res.Sessions) != 0 || res.Skipped["summary"] != 1 || res.Records != 1 {
		t.Errorf("%+v %v", res, err)
	}
	res, err = Convert(bytes.NewReader(nil), "empty.jsonl", Options{})
	if err != nil || len(res.Sessions) != 0 || len(res.Diagnostics) != 0 {
		t.Errorf("%+v %v", res, err)
	}
}

// TestEventSizes reports the largest event of the corpus: the log refuses
// events over its MaxEventBytes (1 MiB by default).
func TestEventSizes(t *testing.T) {
	t.Parallel()
	var sizes []int
	for _, s := range sharedCorpus(t).sessions() {
		for _, ev := range s.Events {
			b, err := json.Marshal(ev)
			if err != nil {
				t.Fatal(err)
			}
			sizes = append(sizes, len(b))
		}
	}
	sort.Ints(sizes)
	max := sizes[len(sizes)-1]
	t.Logf("%d events; largest %d bytes, median %d", len(sizes), max, sizes[len(sizes)/2])
	if max > 1<<20 {
		t.Errorf("an event of %d bytes is over the log's default limit", max)
	}
}
