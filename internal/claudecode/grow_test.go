package claudecode

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
)

// wildFile is one of the real transcripts under
// shared/data/wild/claude-code beside the repository.
func wildFile(t testing.TB, rel string) string {
	t.Helper()
	p := filepath.Join("..", "..", "..", "shared", "data", "wild", "claude-code", filepath.FromSlash(rel))
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("wild transcript %s (shared/data/wild beside the repository): %v", rel, err)
	}
	return p
}

// growFiles are real transcripts of every shape the importer reads:
// Claude Code 1.0 with inline sidechains, 2.0 and 2.1, parallel tool
// calls with results between the blocks of one response, an automatic
// compaction, local commands, stop hooks and interruptions.
func growFiles(t testing.TB) []string {
	return []string{
		corpusFile(t, "spotter/short.jsonl"),
		corpusFile(t, "spotter/tool_heavy.jsonl"),
		corpusFile(t, "spotter/subagent.jsonl"),
		corpusFile(t, "spotter/ae4a77f8-aedd-4bc1-888f-c94edc91af04/subagents/agent-aac57f5.jsonl"),
		corpusFile(t, "spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl"),
		corpusFile(t, "ccviewer/fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl"),
		wildFile(t, "codemie-ai__codemie-code/session-624a4a58.jsonl"),
		wildFile(t, "codemie-ai__codemie-code/claude/incremental-subagents/turn-2.jsonl"),
		wildFile(t, "codemie-ai__codemie-code/claude/incremental-simple/turn-2.jsonl"),
		wildFile(t, "daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/cb2e607c-c758-415a-8b45-c49e4631906a.jsonl"),
		wildFile(t, "daaain__claude-code-log/real_projects/-experiments-worktrees/ef958aa1-0e93-49f0-bb71-150f63befcd1.jsonl"),
	}
}

// cutPoints returns the prefixes (line counts) a test cuts a transcript
// at: every line of a small file; in a larger one (converting every
// prefix costs the square of its size) the lines around each system
// record and interruption (compactions, stop hooks, local commands, API
// errors, where a cut decides the most) and others spread evenly, within
// a budget of about 8 MB converted (1 MB under the race detector, which
// finds nothing in this single-goroutine code and slows it twentyfold).
func cutPoints(lines []string) []int {
	size := 0
	for _, l := range lines {
		size += len(l) + 1
	}
	n := len(lines)
	budget, least := 8<<20, 8
	if raceEnabled {
		budget, least = 1<<20, 3
	}
	want := n
	if size > 0 {
		want = min(n, max(least, budget/size*2))
	}
	pick := map[int]bool{}
	for k := 1; k < n; k += max(1, n/want) {
		pick[k] = true
	}
	for i, l := range lines {
		if raceEnabled && size > budget {
			break
		}
		if strings.Contains(l, `"type":"system"`) || strings.Contains(l, "[Request interrupted by user") {
			for k := i; k <= i+1; k++ {
				if k >= 1 && k < n {
					pick[k] = true
				}
			}
		}
	}
	var cuts []int
	for k := 1; k < n; k++ {
		if pick[k] {
			cuts = append(cuts, k)
		}
	}
	return cuts
}

// splitsResponse reports whether a cut after the first k lines falls
// inside one API response: the next assistant record after the cut has
// the message id of the last one before it, with nothing between them but
// tool results (Claude Code runs a tool while the response streams on).
func splitsResponse(lines []string, k int) bool {
	type rec struct {
		Type    string `json:"type"`
		Message struct {
			ID      string          `json:"id"`
			Content json.RawMessage `json:"content"`
		} `json:"message"`
	}
	parse := func(l string) rec {
		var r rec
		_ = json.Unmarshal([]byte(l), &r)
		return r
	}
	last := ""
	for i := k - 1; i >= 0; i-- {
		r := parse(lines[i])
		if r.Type == recAssistant {
			last = r.Message.ID
			break
		}
		if r.Type == recUser && !bytes.Contains(r.Message.Content, []byte(`"tool_result"`)) {
			return false
		}
	}
	if last == "" {
		return false
	}
	for _, l := range lines[k:] {
		r := parse(l)
		switch {
		case r.Type == recAssistant:
			return r.Message.ID == last
		case r.Type == recUser && !bytes.Contains(r.Message.Content, []byte(`"tool_result"`)):
			return false
		}
	}
	return false
}

// firstResponseLine is the index of the first model response's line.
func firstResponseLine(lines []string) int {
	for i, l := range lines {
		if r, err := parseRecord([]byte(l)); err == nil && r.typ == recAssistant && !r.apiError && r.model != "" && r.model != "<synthetic>" {
			return i
		}
	}
	return len(lines)
}

// logOf is a session's log as an import builds it: events appended in
// order, each id once.
type logOf struct {
	evs  []events.Event
	have map[string]int
	// loose: a history snapshot's end may guess a turn's end (a response
	// the person then interrupted), a compaction's size (the next model
	// call is not written yet) or session.started (a sidechain cut before
	// its first response) otherwise than the grown file: the events are
	// the same, their payloads may differ, and a turn's end may come
	// before the turn's last records.
	loose  bool
	errors int
}

// add appends the events of res that the log does not hold yet, as Import
// does, and checks that each one it holds already is the same event.
func (l *logOf) add(t *testing.T, what string, res *Result) {
	t.Helper()
	for _, s := range res.Sessions {
		for _, ev := range s.Events {
			if i, ok := l.have[ev.ID]; ok {
				old := l.evs[i]
				same := old.Type == ev.Type && old.Turn == ev.Turn && bytes.Equal(old.Data, ev.Data) && old.Time.Equal(ev.Time)
				if l.loose {
					switch ev.Type {
					case events.TypeTurnCompleted, events.TypeTurnFailed, events.TypeDistillationCompleted, events.TypeSessionStarted:
						same = old.Turn == ev.Turn
					}
				}
				if !same && l.errors < 5 {
					l.errors++
					t.Errorf("%s: event %s (%s) differs from the one stored before:\n%s %s\n%s %s", what, ev.ID, ev.Type, old.Time, old.Data, ev.Time, ev.Data)
				}
				continue
			}
			l.have[ev.ID] = len(l.evs)
			l.evs = append(l.evs, ev)
		}
	}
}

// TestGrowingTranscriptImportsLikeTheWholeFile converts real transcripts
// as they grew, line by line (live, as `import --follow` reads a file
// Claude Code is writing) or snapshot by snapshot (history, as `import`
// of a copy taken while Claude Code was running), appends each
// conversion's new events to a log as Import does, and checks that the
// log is the whole file's, event for event and in the same order: no turn
// ends twice, no result comes late, nothing differs from what the whole
// file gives. History snapshots are cut between two API responses (a copy
// cut inside one stores its first blocks only, which --follow avoids by
// waiting for the response to complete), after the first model response
// (session.started describes the session as that response found it; a
// history copy taken before it has a session.started without the model,
// which the grown file's does not replace).
func TestGrowingTranscriptImportsLikeTheWholeFile(t *testing.T) {
	for _, path := range growFiles(t) {
		lines := readLines(t, path)
		name := filepath.Base(path)
		// Parse once; convert each prefix from the parsed records (the
		// conversion does not change them), as Convert would.
		var parsed []*record
		upto := make([]int, len(lines)+1) // lines -> records parsed in them
		for i, l := range lines {
			if r, err := parseRecord([]byte(l)); err == nil {
				r.line = i + 1
				parsed = append(parsed, r)
			}
			upto[i+1] = len(parsed)
		}
		for _, live := range []bool{true, false} {
			opts := Options{Live: live}
			conv := func(lines []string) *Result {
				t.Helper()
				c, err := NewConverter(opts)
				if err != nil {
					t.Fatal(err)
				}
				res := &Result{Skipped: map[string]int{}}
				c.convertRecords(name, parsed[:upto[len(lines)]], res, agentMeta{})
				return res
			}
			t.Run(fmt.Sprintf("%s/live=%v", name, live), func(t *testing.T) {
				t.Parallel()
				whole := conv(lines)
				var want []events.Event
				for _, s := range whole.Sessions {
					want = append(want, s.Events...)
				}
				grown := &logOf{have: map[string]int{}, loose: !live}
				cuts := 0
				first := firstResponseLine(lines)
				for _, k := range cutPoints(lines) {
					if !live && (k <= first || splitsResponse(lines, k)) {
						continue
					}
					cuts++
					grown.add(t, fmt.Sprintf("cut at line %d", k), conv(lines[:k]))
				}
				grown.add(t, "whole", whole)
				if cuts < 2 {
					t.Fatalf("only %d cut points", cuts)
				}
				if len(grown.evs) != len(want) {
					t.Fatalf("the log holds %d events, the whole file gives %d", len(grown.evs), len(want))
				}
				// Sessions are appended one after the other; compare each
				// session's order.
				pos := map[string][]string{}
				for _, ev := range want {
					pos[ev.Session] = append(pos[ev.Session], ev.ID)
				}
				got := map[string][]string{}
				for _, ev := range grown.evs {
					got[ev.Session] = append(got[ev.Session], ev.ID)
				}
				for sess, ids := range pos {
					g := got[sess]
					if !live {
						g, ids = slices.Sorted(slices.Values(g)), slices.Sorted(slices.Values(ids))
					}
					if !slices.Equal(g, ids) {
						t.Errorf("session %s: the log's events differ from the whole file's (in order, live)", sess)
					}
				}
				// And the fold of the grown log breaks nothing the whole
				// file does not.
				for sess := range pos {
					var evs []events.Event
					for _, ev := range grown.evs {
						if ev.Session == sess {
							ev.Seq = uint64(len(evs) + 1)
							evs = append(evs, ev)
						}
					}
					if st := projections.FoldLog(evs); st.Totals.Violations != 0 {
						t.Errorf("session %s: %d violations: %+v", sess, st.Totals.Violations, st.Violations)
					}
				}
			})
		}
	}
}
