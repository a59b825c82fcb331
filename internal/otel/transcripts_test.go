package otel

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/turnstone-dev/turnstone/events"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// rawUsage is the token accounting of one API response, as the
// transcripts record it: the usage of the last record of the response
// (records sharing message.id) in a file, read by this test alone.
type rawUsage struct{ in, out, cacheRead, cacheWrite int64 }

// fileUsage returns the usage of each response of a file with tokens, by
// message id.
func fileUsage(t *testing.T, path string) map[string]rawUsage {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	last := map[string]rawUsage{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.Contains(line, []byte(`"assistant"`)) || !bytes.Contains(line, []byte(`"usage"`)) {
			continue
		}
		var rec struct {
			Type    string `json:"type"`
			Message struct {
				ID    string `json:"id"`
				Usage *struct {
					In         int64 `json:"input_tokens"`
					Out        int64 `json:"output_tokens"`
					CacheRead  int64 `json:"cache_read_input_tokens"`
					CacheWrite int64 `json:"cache_creation_input_tokens"`
				} `json:"usage"`
			} `json:"message"`
		}
		if json.Unmarshal(line, &rec) != nil || rec.Type != "assistant" || rec.Message.Usage == nil || rec.Message.ID == "" {
			continue
		}
		u := rec.Message.Usage
		last[rec.Message.ID] = rawUsage{u.In, u.Out, u.CacheRead, u.CacheWrite}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for id, u := range last {
		if u == (rawUsage{}) {
			delete(last, id) // a synthetic record: no model call was accounted
		}
	}
	return last
}

// logFacts is what the log says, read by the test: each session's ended
// turns, its tool_use ids, the turn of each event, and its parent link.
type logFacts struct {
	endedTurns map[string]map[string]bool // session -> turn ids that ended
	toolUses   map[string][]string        // session -> tool_use ids
	eventTurn  map[string]string          // event id -> turn
	parent     map[string][2]string       // session -> parent session, parent tool_use id
}

func readFacts(t *testing.T, log *events.Log, sessions []SessionRef) logFacts {
	t.Helper()
	f := logFacts{endedTurns: map[string]map[string]bool{}, toolUses: map[string][]string{}, eventTurn: map[string]string{}, parent: map[string][2]string{}}
	for _, r := range sessions {
		started := map[string]bool{}
		f.endedTurns[r.Session] = map[string]bool{}
		err := log.ReadSession(context.Background(), r.Tenant, r.Session, events.ReadOptions{}, func(ev events.Event) error {
			f.eventTurn[ev.ID] = ev.Turn
			p, err := ev.Payload()
			if err != nil {
				return err
			}
			switch p := p.(type) {
			case *events.SessionStarted:
				if p.ParentSession != "" {
					f.parent[r.Session] = [2]string{p.ParentSession, p.ParentToolUseID}
				}
			case *events.TurnStarted:
				started[ev.Turn] = true
			case *events.TurnCompleted, *events.TurnFailed, *events.TurnAbandoned:
				if started[ev.Turn] {
					f.endedTurns[r.Session][ev.Turn] = true
				}
			case *events.MessageAppended:
				for _, b := range p.Content {
					if b.Type == events.BlockToolUse {
						f.toolUses[r.Session] = append(f.toolUses[r.Session], b.ID)
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// TestShippedTranscripts exports every shipped transcript to an in-memory
// exporter and checks the spans against the log and the raw files: one
// invoke_agent per turn, one execute_tool per tool_use with its id, the
// three attributes on every span, correct parents (a subagent's turns
// under its Task call), and the transcripts' token counts. Under the race
// detector and -short it exports the sample transcriptFiles gives (26
// sessions, 29 turns, 351 tool calls, 278 model calls); the full-size
// pass of .ci/run exports all 25 files.
func TestShippedTranscripts(t *testing.T) {
	t.Parallel()
	// The least the export must hold: the shipped transcripts hold more.
	minTurns, minTools, minResponses := 30, 100, 500
	if sampled() {
		minTurns, minTools, minResponses = 25, 100, 200
	}
	log := sharedLog(t)
	files := transcriptFiles(t)
	sessions := sessionRefs(t, log, "real")
	facts := readFacts(t, log, sessions)
	spans := backfill(t, log, sessions, BackfillConfig{})
	ops := byOp(spans)
	t.Logf("%d sessions, %d spans: %d invoke_agent, %d chat, %d execute_tool", len(sessions), len(spans),
		len(ops[OpInvokeAgent]), len(ops[OpChat]), len(ops[OpExecuteTool]))

	byID := map[trace.SpanID]tracetest.SpanStub{}
	for _, s := range spans {
		if _, dup := byID[s.SpanContext.SpanID()]; dup {
			t.Errorf("span id %s twice (%s)", s.SpanContext.SpanID(), s.Name)
		}
		byID[s.SpanContext.SpanID()] = s
		for _, k := range []attribute.Key{KeyOperationName, KeyProviderName, KeyConversationID} {
			if attr(s, k) == "" {
				t.Errorf("span %q (%s) lacks %s", s.Name, attr(s, KeySession), k)
			}
		}
	}

	// One invoke_agent span per turn that ended.
	turns := map[string]map[string]int{}
	for _, s := range ops[OpInvokeAgent] {
		sess := attr(s, KeySession)
		if turns[sess] == nil {
			turns[sess] = map[string]int{}
		}
		turns[sess][attr(s, KeyTurnID)]++
		if !strings.HasPrefix(s.Name, "invoke_agent") || s.SpanKind != trace.SpanKindInternal {
			t.Errorf("turn span %q kind %s", s.Name, s.SpanKind)
		}
	}
	nTurns := 0
	for sess, ended := range facts.endedTurns {
		nTurns += len(ended)
		for id := range ended {
			if turns[sess][id] != 1 {
				t.Errorf("%s turn %s: %d invoke_agent spans, want 1", sess, id, turns[sess][id])
			}
		}
		if len(turns[sess]) != len(ended) {
			t.Errorf("%s: invoke_agent spans for %d turns, the log ended %d", sess, len(turns[sess]), len(ended))
		}
	}
	if nTurns < minTurns {
		t.Fatalf("only %d turns in the shipped transcripts", nTurns)
	}

	// One execute_tool span per tool_use, with its id.
	tools := map[string]map[string]int{}
	for _, s := range ops[OpExecuteTool] {
		sess := attr(s, KeySession)
		if tools[sess] == nil {
			tools[sess] = map[string]int{}
		}
		tools[sess][attr(s, KeyToolCallID)]++
		if s.Name != "execute_tool "+attr(s, KeyToolName) {
			t.Errorf("tool span named %q, tool %q", s.Name, attr(s, KeyToolName))
		}
	}
	nTools := 0
	for sess, ids := range facts.toolUses {
		nTools += len(ids)
		for _, id := range ids {
			if tools[sess][id] != 1 {
				t.Errorf("%s tool_use %s: %d execute_tool spans, want 1", sess, id, tools[sess][id])
			}
		}
		if len(tools[sess]) != len(ids) {
			t.Errorf("%s: %d execute_tool spans, %d tool_use blocks", sess, len(tools[sess]), len(ids))
		}
	}
	if nTools < minTools {
		t.Fatalf("only %d tool_use blocks", nTools)
	}

	// Parents: chat and tool spans under the span of their record's turn;
	// a subagent's turns under its parent's Task call; the main
	// sessions' turns are roots.
	linked := 0
	for _, s := range spans {
		parent := s.Parent.SpanID()
		op := attr(s, KeyOperationName)
		sess := attr(s, KeySession)
		if op == OpInvokeAgent {
			link, isSub := facts.parent[sess]
			if !isSub || link[1] == "" {
				if parent.IsValid() {
					t.Errorf("%s turn %s has a parent", sess, attr(s, KeyTurnID))
				}
				continue
			}
			p, ok := byID[parent]
			switch {
			case !ok:
				t.Errorf("subagent %s turn %s: parent %s not exported", sess, attr(s, KeyTurnID), parent)
			case attr(p, KeyOperationName) != OpExecuteTool || attr(p, KeyToolCallID) != link[1] || attr(p, KeySession) != link[0]:
				t.Errorf("subagent %s: parent is %q %s of %s, want the tool call %s of %s", sess, p.Name, attr(p, KeyToolCallID), attr(p, KeySession), link[1], link[0])
			case p.SpanContext.TraceID() != s.SpanContext.TraceID():
				t.Errorf("subagent %s: in trace %s, its parent in %s", sess, s.SpanContext.TraceID(), p.SpanContext.TraceID())
			case attr(s, KeySessionID) != attr(p, KeySessionID):
				t.Errorf("subagent %s: session.id %s, its parent's %s", sess, attr(s, KeySessionID), attr(p, KeySessionID))
			default:
				linked++
			}
			continue
		}
		turn := facts.eventTurn[attr(s, KeyEventID)]
		if op != OpChat && op != OpExecuteTool || turn == "" {
			continue
		}
		p, ok := byID[parent]
		if !ok || attr(p, KeyOperationName) != OpInvokeAgent || attr(p, KeyTurnID) != turn || attr(p, KeySession) != sess {
			t.Errorf("%s %q: parent %q (turn %s), want the turn %s", sess, s.Name, p.Name, attr(p, KeyTurnID), turn)
		}
		if p.SpanContext.TraceID() != s.SpanContext.TraceID() {
			t.Errorf("%s %q: not in its turn's trace", sess, s.Name)
		}
	}
	if linked == 0 {
		t.Error("no subagent turn nests under its Task call")
	}

	// Tokens: each response the transcripts account for is one chat span
	// (per file it appears in) with its tokens, the input counting the
	// cached tokens too.
	want := map[string][]rawUsage{}
	for _, f := range files {
		for id, u := range fileUsage(t, f) {
			want[id] = append(want[id], u)
		}
	}
	got := map[string][]rawUsage{}
	var total int64
	for _, s := range ops[OpChat] {
		if s.Status.Code == codes.Error {
			continue // a model call that failed
		}
		in, cr, cw := attrInt(s, KeyInputTokens), attrInt(s, KeyCacheReadTokens), attrInt(s, KeyCacheCreateTokens)
		id := attr(s, KeyResponseID)
		got[id] = append(got[id], rawUsage{in - cr - cw, attrInt(s, KeyOutputTokens), cr, cw})
		total += attrInt(s, KeyOutputTokens)
		if s.SpanKind != trace.SpanKindClient || !strings.HasPrefix(s.Name, "chat ") || attr(s, KeyResponseModel) == "" {
			t.Errorf("chat span %q kind %s model %q", s.Name, s.SpanKind, attr(s, KeyResponseModel))
		}
	}
	less := func(a, b rawUsage) int {
		return cmp.Or(cmp.Compare(a.in, b.in), cmp.Compare(a.out, b.out), cmp.Compare(a.cacheRead, b.cacheRead), cmp.Compare(a.cacheWrite, b.cacheWrite))
	}
	for id, w := range want {
		g := got[id]
		slices.SortFunc(w, less)
		slices.SortFunc(g, less)
		if !slices.Equal(w, g) {
			t.Errorf("response %s: the transcripts account %v, the chat spans %v", id, w, g)
		}
	}
	for id := range got {
		if _, ok := want[id]; !ok {
			t.Errorf("chat span of response %q, which no transcript accounts for", id)
		}
	}
	if total == 0 || len(want) < minResponses {
		t.Fatalf("%d responses, %d output tokens", len(want), total)
	}
}

// TestBackfillTwiceIsIdentical: a second export of the same log sends
// identical spans, ids included (of the sample transcriptFiles gives under
// the race detector and -short; of all 25 files in the full-size pass).
func TestBackfillTwiceIsIdentical(t *testing.T) {
	t.Parallel()
	log := sharedLog(t)
	sessions := sessionRefs(t, log, "real")
	a := canonical(backfill(t, log, sessions, BackfillConfig{}))
	b := canonical(backfill(t, log, sessions, BackfillConfig{}))
	if len(a) == 0 {
		t.Fatal("no span")
	}
	if !slices.Equal(a, b) {
		for i := range min(len(a), len(b)) {
			if a[i] != b[i] {
				t.Fatalf("first difference:\n%s\n%s", a[i], b[i])
			}
		}
		t.Fatalf("%d spans, then %d", len(a), len(b))
	}
}

// canonical renders each span whole (ids, parent, name, kind, times,
// status, attributes, events), sorted.
func canonical(spans tracetest.SpanStubs) []string {
	out := make([]string, 0, len(spans))
	for _, s := range spans {
		var b strings.Builder
		fmt.Fprintf(&b, "%s/%s<-%s %q %s %s..%s %s:%q", s.SpanContext.TraceID(), s.SpanContext.SpanID(), s.Parent.SpanID(),
			s.Name, s.SpanKind, s.StartTime.UTC().Format("15:04:05.000000000"), s.EndTime.UTC().Format("15:04:05.000000000"), s.Status.Code, s.Status.Description)
		attrs := make([]string, 0, len(s.Attributes))
		for _, kv := range s.Attributes {
			attrs = append(attrs, string(kv.Key)+"="+kv.Value.Emit())
		}
		sort.Strings(attrs)
		fmt.Fprintf(&b, " %v", attrs)
		for _, e := range s.Events {
			fmt.Fprintf(&b, " [%s@%s", e.Name, e.Time.UTC().Format("15:04:05.000000000"))
			for _, kv := range e.Attributes {
				fmt.Fprintf(&b, " %s=%s", kv.Key, kv.Value.Emit())
			}
			b.WriteString("]")
		}
		out = append(out, b.String())
	}
	sort.Strings(out)
	return out
}
