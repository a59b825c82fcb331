package claudecode

import (
	"bytes"
	stdjson "encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	json "github.com/go-json-experiment/json/v1"

	"github.com/turnstone-dev/turnstone/events"
)

// seedLines adds real transcript lines to a fuzz corpus: every line of the
// short transcripts and the first line of each record type and subtype of
// the others (long lines are cut to keep the corpus small; a cut line is a
// useful seed too).
func seedLines(f *testing.F) {
	dir := corpusDir(f)
	seen := map[string]bool{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".jsonl") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		small := len(b) < 64<<10
		for i, l := range bytes.Split(b, []byte("\n")) {
			if !small && i%25 != 0 {
				continue
			}
			r, err := parseRecord(l)
			key := "bad"
			if err == nil {
				key = r.typ + "/" + r.subtype + "/" + r.class.String()
			}
			if !small && seen[key] {
				continue
			}
			seen[key] = true
			if len(l) > 8<<10 {
				l = l[:8<<10]
			}
			f.Add(append([]byte(nil), l...))
		}
		return nil
	})
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		``, `null`, `{}`, `{"type":"user"}`, `{"type":"assistant","uuid":"a","timestamp":"2026-01-01T00:00:00Z","message":{"content":[]}}`,
		apiErrorLine(`API Error: 529 {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}`, `"apiErrorStatus":"529"`),
		`{"type":"system","subtype":"compact_boundary","uuid":"c","timestamp":"2026-01-01T00:00:00Z","compactMetadata":{"trigger":"auto","preTokens":1e300}}`,
	} {
		f.Add([]byte(s))
	}
}

// FuzzParseRecord checks that the record parser never panics and that what
// it accepts can be classified and converted into valid events.
func FuzzParseRecord(f *testing.F) {
	seedLines(f)
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := parseRecord(line)
		if err != nil {
			return
		}
		_ = r.class.String()
		if r.typ == recAssistant && r.apiError {
			info := apiErrorInfo(r)
			if info.Message == "" {
				t.Fatal("API error without a message")
			}
		}
		res, err := Convert(bytes.NewReader(line), "fuzz.jsonl", Options{})
		if err != nil {
			t.Fatal(err)
		}
		checkEvents(t, res)
	})
}

// FuzzRecordDecodeKeepsEncodingJSONSemantics: the parser decodes a line
// with go-json-experiment's v1 package, which promises encoding/json's
// semantics (names matched without regard to case, the last of duplicate
// names, invalid UTF-8 replaced, a type error not stopping the rest); on
// any input, a record and a content block array decode to the same values
// and fail on the same inputs as with encoding/json itself. (The content
// inside a record decodes with the package's own call in both.)
func FuzzRecordDecodeKeepsEncodingJSONSemantics(f *testing.F) {
	seedLines(f)
	for _, s := range []string{
		`{"type":"assistant","uuid":"u","TYPE":"x","message":{"id":"m","content":[{"type":"text","text":"\ud800"}],"usage":{"input_tokens":1e400}}}`,
		`{"type":"progress","data":{"type":"agent_progress","agentId":"a"},"parentToolUseID":"t","type":"user"}`,
		"{\"type\":\"user\",\"cwd\":\"\xff\xfe\"}",
		`{"type":"system","subtype":"api_error","content":"x","retryAttempt":1.5,"maxRetries":-1,"error":{"a":[1,2]}}`,
		`{"type":"user","isMeta":true,"ismeta":false,"message":{"content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"a"}]}]}}`,
		`[{"type":"text","text":"a","TEXT":"b"},{"type":"tool_use","id":"t","input":{"a":1}}]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var want, got rawRecord
		werr, gerr := stdjson.Unmarshal(b, &want), json.Unmarshal(b, &got)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("record: encoding/json error %v, the parser's %v", werr, gerr)
		}
		if werr == nil && !reflect.DeepEqual(want, got) {
			t.Fatalf("record:\nencoding/json %+v\nthe parser    %+v", want, got)
		}
		var wantBlocks, gotBlocks []events.ContentBlock
		werr, gerr = stdjson.Unmarshal(b, &wantBlocks), json.Unmarshal(b, &gotBlocks)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("blocks: encoding/json error %v, the parser's %v", werr, gerr)
		}
		if werr == nil && !reflect.DeepEqual(wantBlocks, gotBlocks) {
			t.Fatalf("blocks:\nencoding/json %+v\nthe parser    %+v", wantBlocks, gotBlocks)
		}
	})
}

// FuzzConvert checks that converting any input never panics and yields
// only valid events. Seeds: small real transcripts and their cuts.
func FuzzConvert(f *testing.F) {
	// Small inputs: the fuzzer minimizes every new input it finds, which
	// is slow for large ones.
	for _, rel := range []string{"spotter/short.jsonl", "ccviewer/agent-test-hash-123.jsonl"} {
		b, err := os.ReadFile(corpusFile(f, rel))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, rel)
		f.Add(b[:len(b)/2], rel)
	}
	overloaded := `API Error: 529 {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}`
	for _, lines := range [][]string{
		{
			userAt("c1", 0, `"<command-name>/init</command-name>"`, ""),
			userAt("m1", 0, `[{"type":"text","text":"Analyze"}]`, `"isMeta":true`),
			assistantAt("a1", 1, "msg_1", `[{"type":"tool_use","id":"toolu_A","name":"Read","input":{}}]`),
			userAt("r1", 3, `[{"type":"tool_result","tool_use_id":"toolu_A","content":"a"}]`, `"toolUseResult":{"durationMs":7}`),
			assistantAt("a2", 4, "msg_1", `[{"type":"tool_use","id":"toolu_B","name":"Bash","input":{}}]`),
			`{"type":"system","subtype":"compact_boundary","uuid":"cb","timestamp":"` + ts(5) + `","compactMetadata":{"trigger":"auto","preTokens":100}}`,
			userAt("cs", 5, `"summary"`, `"isCompactSummary":true`),
			userAt("i1", 6, `[{"type":"text","text":"[Request interrupted by user]"}]`, ""),
		},
		{
			userAt("p1", 0, `"do it"`, ""),
			apiErrorLineAt("e1", ts(1), overloaded, `"apiErrorStatus":529`),
			`{"type":"system","subtype":"turn_duration","durationMs":5,"uuid":"td","timestamp":"` + ts(2) + `"}`,
			userAt("cv", 3, `"<local-command-caveat>c</local-command-caveat>"`, `"isMeta":true`),
			userAt("c2", 3, `"<command-name>/compact</command-name>"`, ""),
			userAt("o2", 3, `"<local-command-stdout>ok</local-command-stdout>"`, ""),
		},
		{
			`{"type":"user","uuid":"s1","sessionId":"p","isSidechain":true,"timestamp":"` + ts(0) + `","message":{"content":"look"}}`,
			`{"type":"user","uuid":"s2","parentUuid":"s1","sessionId":"p","isSidechain":true,"timestamp":"` + ts(1) + `","message":{"content":"<task-notification><summary>x</summary></task-notification>"}}`,
		},
	} {
		f.Add([]byte(strings.Join(lines, "\n")), "agent-x.jsonl")
		f.Add([]byte(strings.Join(lines, "\n")), "main.jsonl")
	}
	f.Fuzz(func(t *testing.T, data []byte, name string) {
		res, err := Convert(bytes.NewReader(data), name, Options{MaxLineBytes: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		checkEvents(t, res)
	})
}

func checkEvents(t *testing.T, res *Result) {
	t.Helper()
	for _, s := range res.Sessions {
		if !events.ValidToken(s.Session) {
			t.Fatalf("session token %q", s.Session)
		}
		for _, ev := range s.Events {
			if err := events.Validate(&ev); err != nil {
				t.Fatalf("%s: %v", ev, err)
			}
		}
		for _, p := range checkSession(t, s) {
			t.Fatal(p)
		}
	}
}
