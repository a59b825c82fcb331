package claudecode

import (
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/importer"
	"github.com/turnstone-dev/turnstone/projections"
)

// foldSession folds a converted session's events, numbered from 1.
func foldSession(s Session) *projections.Session {
	evs := append([]events.Event(nil), s.Events...)
	for i := range evs {
		evs[i].Seq = uint64(i + 1)
	}
	return projections.FoldLog(evs)
}

// TestWarmupSidechains imports the one-line warm-up files of the wild
// corpus: Claude Code 2.0.42 to 2.0.55 wrote only the model's answer to
// the "Warmup" it sends each subagent type when a session starts. The
// prompt is written back, so that the history starts with a user message
// as the model saw it, and the session is not broken.
func TestWarmupSidechains(t *testing.T) {
	f := wildFile(t, "daaain__claude-code-log/real_projects/-Users-dain-workspace-JSSoundRecorder/agent-3430b97e.jsonl")
	res, err := ConvertFile(f, Options{})
	if err != nil || len(res.Diagnostics) > 0 || len(res.Sessions) != 1 {
		t.Fatalf("convert: %v %v %d sessions", err, res.Diagnostics, len(res.Sessions))
	}
	s := res.Sessions[0]
	if s.Kind != KindSubagent || s.Session != "7acd37a8-2745-4b58-a8a9-46164b22ad9e_agent-3430b97e" {
		t.Errorf("session %s kind %s", s.Session, s.Kind)
	}
	turn := "b54dbaec-697a-4b5a-8815-adac200ed9f6"
	want := []string{"session.started", "turn.started@" + turn, "message.appended@" + turn,
		"turn.stage_completed@" + turn, "turn.stage_completed@" + turn, "message.appended@" + turn, "turn.completed@" + turn}
	if got := types(s.Events); !reflect.DeepEqual(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	if ts := payload[events.TurnStarted](t, s.Events[1]); ts.Prompt != "Warmup" || ts.Trigger != "warmup" {
		t.Errorf("turn.started %+v", ts)
	}
	if m := payload[events.MessageAppended](t, s.Events[2]); m.Role != events.RoleUser || !m.Meta || !m.Synthetic || m.Content[0].Text != "Warmup" {
		t.Errorf("the prompt written back: %+v", m)
	}
	if st := foldSession(s); st.Totals.Violations != 0 || st.Status() != "idle" {
		t.Errorf("folded: status %s, violations %+v", st.Status(), st.Violations)
	}

	// Claude Code 2.0.64 wrote the prompt: the same trigger.
	f = wildFile(t, "codemie-ai__codemie-code/claude/-tmp-private/agent-50243ee8.jsonl")
	res, err = ConvertFile(f, Options{})
	if err != nil || len(res.Sessions) != 1 {
		t.Fatal(err)
	}
	if ts := payload[events.TurnStarted](t, res.Sessions[0].Events[1]); ts.Prompt != "Warmup" || ts.Trigger != "warmup" {
		t.Errorf("recorded warm-up: turn.started %+v", ts)
	}
}

// TestSidechainWithoutItsPromptGetsTheTaskPrompt: a subagent transcript
// that begins with the model's answer, run by a Task call of its parent,
// starts with the Task's prompt.
func TestSidechainWithoutItsPromptGetsTheTaskPrompt(t *testing.T) {
	dir := t.TempDir()
	parent := filepath.Join(dir, "sess-1.jsonl")
	write(t, parent,
		userAt("p1", 0, `"find the bug"`, ""),
		assistantAt("a1", 1, "msg_1", `[{"type":"tool_use","id":"toolu_T","name":"Task","input":{"prompt":"Search for the parser","subagent_type":"Explore"}}]`),
		userAt("r1", 9, `[{"type":"tool_result","tool_use_id":"toolu_T","content":"found it"}]`, `"toolUseResult":{"agentId":"abc123"}`),
		assistantAt("a2", 10, "msg_2", `[{"type":"text","text":"Fixed."}]`),
	)
	sub := filepath.Join(dir, "agent-abc123.jsonl")
	write(t, sub, `{"type":"assistant","uuid":"s1","parentUuid":null,"isSidechain":true,"agentId":"abc123","sessionId":"sess-1","timestamp":"`+ts(2)+`",`+
		`"message":{"id":"msg_s","model":"claude-haiku-4-5","role":"assistant","content":[{"type":"text","text":"The parser is in parse.go."}]}}`)
	write(t, filepath.Join(dir, "agent-abc123.meta.json"), `{"agentType":"Explore"}`)
	c, err := NewConverter(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ConvertFile(parent); err != nil {
		t.Fatal(err)
	}
	res, err := c.ConvertFile(sub)
	if err != nil || len(res.Sessions) != 1 {
		t.Fatal(err)
	}
	s := res.Sessions[0]
	if s.ParentToolUseID != "toolu_T" {
		t.Errorf("not linked: %+v", s)
	}
	if ts := payload[events.TurnStarted](t, s.Events[1]); ts.Prompt != "Search for the parser" || ts.Trigger != "subagent" {
		t.Errorf("turn.started %+v", ts)
	}
	if st := foldSession(s); st.Totals.Violations != 0 {
		t.Errorf("violations %+v", st.Violations)
	}

	// Alone, the .meta.json gives the subagent's type.
	res, err = ConvertFile(sub, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if p := payload[events.SessionStarted](t, res.Sessions[0].Events[0]); p.Labels["subagent_type"] != "Explore" || !p.History {
		t.Errorf("session.started %+v", p)
	}
}

// TestEmptyTranscripts: Claude Code leaves empty session files; they hold
// no session and are no error.
func TestEmptyTranscripts(t *testing.T) {
	for _, rel := range []string{
		"daaain__claude-code-log/real_projects/-Users-dain-workspace-JSSoundRecorder/2c5941bd-b9de-41d6-9414-221d175776f7.jsonl",
		"daaain__claude-code-log/real_projects/-Users-dain-workspace-claude-code-log-sample/62b71fe7-2de1-4d37-83e3-fddac2e2c43a.jsonl",
	} {
		f := wildFile(t, rel)
		if fi, err := os.Stat(f); err != nil || fi.Size() != 0 {
			t.Fatalf("%s: want an empty file: %v", rel, err)
		}
		res, err := ConvertFile(f, Options{})
		if err != nil || len(res.Sessions) != 0 || len(res.Diagnostics) != 0 || res.Records != 0 {
			t.Errorf("%s: %v, %d sessions, %v", rel, err, len(res.Sessions), res.Diagnostics)
		}
	}
}

// TestLiveConversionWaitsForWhatDecides checks what a live conversion
// records at the end of what is written: a response as far as it goes,
// with the results written between its blocks (never withheld), and the
// turn's end only once the transcript says it is over.
func TestLiveConversionWaitsForWhatDecides(t *testing.T) {
	prompt := userAt("p1", 0, `"do it"`, "")
	think := assistantAt("a1", 1, "msg_1", `[{"type":"thinking","thinking":"hm","signature":"s"}]`)
	use := assistantAt("a2", 2, "msg_1", `[{"type":"tool_use","id":"toolu_A","name":"Bash","input":{"command":"ls"}}]`)
	result := userAt("r1", 3, `[{"type":"tool_result","tool_use_id":"toolu_A","content":"a.go"}]`, "")
	answer := assistantAt("a3", 4, "msg_2", `[{"type":"text","text":"Done."}]`)
	hook := `{"type":"system","subtype":"stop_hook_summary","uuid":"sh","timestamp":"` + ts(5) + `"}`
	tests := []struct {
		name  string
		lines []string
		want  []string
	}{
		{"a prompt alone: nothing before the first response", []string{prompt}, nil},
		{"a response still streaming is recorded as far as it goes", []string{prompt, think},
			[]string{"session.started", "turn.started@p1", "message.appended@p1", "turn.stage_completed@p1", "turn.stage_completed@p1", "message.appended@p1"}},
		{"a tool result does not complete the response, and is recorded", []string{prompt, think, use, result},
			[]string{"session.started", "turn.started@p1", "message.appended@p1", "turn.stage_completed@p1", "turn.stage_completed@p1",
				"message.appended@p1", "tool_call.started@p1", "tool_call.completed@p1", "message.appended@p1"}},
		{"the next response completes it; the answer is recorded, the turn stays", []string{prompt, think, use, result, answer},
			[]string{"session.started", "turn.started@p1", "message.appended@p1", "turn.stage_completed@p1", "turn.stage_completed@p1",
				"message.appended@p1", "tool_call.started@p1", "tool_call.completed@p1", "message.appended@p1", "message.appended@p1"}},
		{"the stop hook's summary ends the turn", []string{prompt, think, use, result, answer, hook},
			[]string{"session.started", "turn.started@p1", "message.appended@p1", "turn.stage_completed@p1", "turn.stage_completed@p1",
				"message.appended@p1", "tool_call.started@p1", "tool_call.completed@p1", "message.appended@p1", "message.appended@p1", "turn.completed@p1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := liveConvert(stringsReader(tt.lines), "sess-1.jsonl")
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range res.Sessions {
				got = append(got, types(s.Events)...)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("events %v, want %v", got, tt.want)
			}
			if len(res.Sessions) > 0 {
				if p := payload[events.SessionStarted](t, res.Sessions[0].Events[0]); p.History {
					t.Error("a live session marked history")
				}
			}
		})
	}
}

func stringsReader(lines []string) *strings.Reader {
	return strings.NewReader(strings.Join(lines, "\n") + "\n")
}

// liveConvert converts r as a live transcript (importer.Input.Live).
func liveConvert(r io.Reader, name string) (*Result, error) {
	c, err := NewConverter(Options{})
	if err != nil {
		return nil, err
	}
	return c.Convert(r, name, importer.Input{Live: true})
}
