package events

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// The masker's prefilter (the rules' needles and needs, and
// stringsUnmasked) must give exactly what the rules alone give: these
// tests and FuzzMaskString compare them.

type fpCase struct {
	typ  Type
	data []byte
}

// fpSeeds are payloads of every type, as JSON, with edge cases.
func fpSeeds(tb testing.TB) []fpCase {
	tb.Helper()
	info := ErrorInfo{Message: "overloaded", Stack: "at x", Kind: KindTransient, Provider: "anthropic", HTTPStatus: 529, Code: "overloaded_error"}
	payloads := []Payload{
		&SessionStarted{Runtime: "claude-code", Model: "m", Provider: "p", Kind: "subagent", ParentSession: "s", ParentToolUseID: "toolu_1", Labels: map[string]string{"cwd": "/x", "branch": "main"}},
		&SessionPaused{Reason: "r"}, &SessionResumed{Reason: "r"},
		&TurnStarted{Prompt: "hello <b> & \"q\"", Trigger: "user", DeadlineMS: 120000},
		&TurnStageCompleted{Stage: StageHistory, DurationMS: 5},
		&TurnCompleted{Reason: "end_turn", DurationMS: 4200},
		&TurnFailed{Stage: StageExecute, Error: info},
		&TurnAbandoned{LastStage: StageContext, Reason: "deadline"},
		&MessageAppended{Role: RoleAssistant, Model: "m", MessageID: "msg_1", StopReason: "tool_use", Content: []ContentBlock{
			{Type: BlockText, Text: "I'll run it"}, {Type: BlockThinking, Thinking: "hmm", Signature: "sig"},
			{Type: BlockToolUse, ID: "toolu_1", Name: "Bash", Input: json.RawMessage(`{"command":"ls -la","n":[1,2.5e3,-0,{"a":null,"b":true}]}`)}}},
		&MessageAppended{Role: RoleUser, Meta: true, Content: []ContentBlock{
			{Type: BlockToolResult, ToolUseID: "toolu_1", IsError: true, Content: json.RawMessage(`[{"type":"text","text":"x"}]`)},
			{Type: "image", Source: json.RawMessage(`{"type":"base64","data":"AAAA"}`)}}},
		&ToolCallStarted{ToolUseID: "toolu_1", Name: "Bash"},
		&ToolCallCompleted{ToolUseID: "toolu_1", Name: "Bash", DurationMS: 10, IsError: true},
		&ErrorRecorded{ErrorInfo: info, Consecutive: 2, Stage: StageExecute},
		&DistillationRequested{Reason: "auto"}, &DistillationStarted{FromSeq: 1, ToSeq: 9},
		&DistillationCompleted{FromSeq: 1, ToSeq: 9, TokensBefore: 180000, TokensAfter: 12000, Trigger: "auto", Summary: "s"},
		&DistillationSkipped{Reason: "turn_in_flight", Detail: "d"},
		&SnapshotTaken{CoversSeq: 18446744073709551615, Version: 3},
		&SessionRewound{ToSeq: 5, Reason: "r", CommandID: "c"}, &SessionForked{ForkSession: "f", AtSeq: 3},
		&RecoveryAttempted{CommandID: "c", Kind: "k", Attempt: 1, Result: "failed", Error: &info, DurationMS: 3},
		&RecoveryCompleted{CommandID: "c", Kind: "k", Outcome: OutcomeRecovered}, &RecoveryParked{CommandID: "c", Kind: "k", Reason: "r"},
		&BreakerChanged{Provider: "p", From: "closed", To: "open", Failures: 5},
	}
	var out []fpCase
	for _, p := range payloads {
		b, err := marshal(p)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, fpCase{p.EventType(), b})
		var ind bytes.Buffer
		_ = json.Indent(&ind, b, " ", "\t")
		out = append(out, fpCase{p.EventType(), ind.Bytes()})
	}
	edge := map[Type][]string{
		TypeMessageAppended: {
			`{"role":"user","content":[{"type":"text","text":"a\u0041\n\ud83d\ude00\ud800 \u2028"}]}`,
			"{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"bad \xff\xfe utf8 \xe2\x80\xa8\"}]}",
			`{"Role":"user","content":[{"type":"text","text":"x"}]}`,
			`{"role":"user","role":"assistant","content":[{"type":"text","text":"x"}]}`,
			`{"role":"user","content":[{"type":"text","text":"a"}],"content":[{"type":"tool_result"}]}`,
			`{"role":null,"content":[{"type":"text","text":"x"}]}`,
			`{"role":"user","content":null}`,
			`{"role":"user","content":[]}`,
			`{"role":"user","content":[null]}`,
			`{"role":"user","content":{}}`,
			`{"role":5,"content":[{"type":"text","text":"x"}]}`,
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","is_error":1}]}`,
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":null}]}`,
			`{"role":"user","content":[{"type":"tool_use","id":"t","name":"n","input":{ "a" : [ 1 , 2 ] }}]}`,
			`{"role":"user","content":[{"type":"text","text":"x"}]} trailing garbage`,
			`{"role":"user","content":[{"type":"text","text":"x"}]}{"role":"assistant"}`,
			`{"role":"user","content":[{"type":"text","text":"x"}],"unknown":{"deep":[1,2,3]}}`,
			`{"role":"user","meta":true,"synthetic":false,"content":[{"type":"text","text":"x"}]}`,
			`{"role":"us\u0065r","content":[{"type":"text","text":"x"}]}`,
			`{"r\u006fle":"user","content":[{"type":"text","text":"x"}]}`,
			`{"role":"user","content":[{"type":"tool_use","id":"t","name":"n","input":{"a":01}}]}`,
			`{"role":"user","content":[{"type":"tool_use","id":"t","name":"n","input":[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]}]}`,
			`{"role":"user","content":[{"type":"text","text":"x"}`,
			`{"role":"user","content":[{"type":"text","text":"x\u00"}]}`,
			`{"role":"user","content":[{"type":"text","text":"x\q"}]}`,
			"{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"tab\there\"}]}",
			`{"role":"user","content":[{"type":"text","text":"x","text":"y"}]}`,
			`{"role":"assistant","content":[{"type":"text","text":"Authorization: Bearer abcdefgh12345678 and password=hunter2"}]}`,
		},
		TypeTurnStarted: {
			`{"deadline_ms":9223372036854775807}`, `{"deadline_ms":9223372036854775808}`, `{"deadline_ms":-1}`,
			`{"deadline_ms":1.0}`, `{"deadline_ms":1e3}`, `{"deadline_ms":"5"}`, `{"deadline_ms":-0}`, `{"deadline_ms":null}`,
			`{}`, `{ }`, `{"prompt":"` + strings.Repeat("long ", 300) + `"}`,
		},
		TypeSnapshotTaken:     {`{"covers_seq":-1}`, `{"covers_seq":18446744073709551616}`, `{"covers_seq":0,"version":2147483648}`, `{"covers_seq":1,"version":9223372036854775807}`},
		TypeSessionStarted:    {`{"labels":{}}`, `{"labels":{"a":"1","a":"2"}}`, `{"labels":{"a":1}}`, `{"labels":{"a\u0062":"x","k":"api_key=abc123"}}`, `{"labels":null}`},
		TypeTurnFailed:        {`{"stage":"execute","error":{"message":"m","http_status":429}}`, `{"stage":"execute","error":null}`, `{"stage":"execute","error":{"message":"m"},"error":{"kind":"logic"}}`},
		TypeToolCallCompleted: {`{"tool_use_id":"t","name":"n","is_error":true}`, `{"tool_use_id":"t","name":"n","is_error":"true"}`, `{"tool_use_id":"t","name":"n","is_error":nul}`},
	}
	for typ, docs := range edge {
		for _, d := range docs {
			out = append(out, fpCase{typ, []byte(d)})
		}
	}
	return out
}

// fpMaskString is MaskString without its prefilter: every rule, whatever
// its needles and need, on every string. MaskString must give the same, so
// this also checks that every text a rule matches holds one of its needles
// and passes its need.
func fpMaskString(s string) string {
	for i := range maskRules {
		s = maskRules[i].replace(s)
	}
	return s
}

// fpMaskJSON is MaskJSON without its fast paths (the prefilter and
// stringsUnmasked), masking strings with fpMaskString.
func fpMaskJSON(b []byte) []byte { return maskJSONWith(b, fpMaskString) }

// TestMaskNeedlesHoldForEveryMatch checks, on every text of the masking
// tables and on forms in unusual cases, that a rule matching a text has a
// needle the prefilter finds in it and a need the text passes, and that
// the Unicode folds of k and s (the Kelvin sign, the long s), which no
// ASCII needle sees, match no rule.
func TestMaskNeedlesHoldForEveryMatch(t *testing.T) {
	t.Parallel()
	texts := []string{
		"Authorization: BeArEr abcdefgh12345678", "bearer\tabcdefgh12345678", "PROXY-AUTHORIZATION: x",
		"postgres://app:s3cr3t@db", "HTTPS://u:p@h",
		"API_KEY=x", "apikey = y", "Pwd=1", "ACCESS-TOKEN=q", "client_secret=c", "PassPhrase: p", "PRIVATE.KEY=k",
		"X-API-KEY: v", "x-goog-api-key: w", "Api-Key:v", "COOKIE: a=b", "SET-COOKIE: a=b", "BASIC dXNlcjpwYXNz", "CURL -u a:b",
		"AKIAIOSFODNN7EXAMPLE", "ASIAY34FZKBOKMUTVV7A",
		"sk-ant-api03-AbCdEf012345", "sk-proj-abcdefghijklmnop1234",
		"ghp_abcdefghijklmnopqrstuvwxyz0123", "github_pat_11ABCDEFG0123456789_abc", "gho_abcdefghijklmnopqrstuv",
		"xoxb-1234567890-abc", "AIzaSyA1234567890abcdefghijklmnopqrstu",
	}
	for _, c := range maskStringCases {
		texts = append(texts, c.in)
	}
	for _, c := range maskUntouchedCases {
		texts = append(texts, c.in)
	}
	for _, s := range texts {
		found := maskCandidates(s, false)
		for i, r := range maskRules {
			if !r.re.MatchString(s) {
				continue
			}
			if found&(1<<i) == 0 {
				t.Errorf("rule %s matches %q but the prefilter finds none of its needles %q", r.name, s, r.needles)
			}
			if r.need != nil && !r.need(s) {
				t.Errorf("rule %s matches %q but its need does not hold", r.name, s)
			}
		}
		if got, want := MaskString(s), fpMaskString(s); got != want {
			t.Errorf("MaskString(%q) = %q, want %q", s, got, want)
		}
	}
	for _, s := range []string{"\u212Aey=1", "api_\u212Aey=1", "paſſword=p", "ſecret=z", "to\u212Aen: t", "coo\u212Aie: c=1"} {
		for _, r := range maskRules {
			if r.re.MatchString(s) {
				t.Errorf("rule %s matches %q, which holds no ASCII needle", r.name, s)
			}
		}
	}
}

// FuzzMaskString checks the masker's prefilter: MaskString must give what
// every rule run on the text without it gives, and be idempotent.
func FuzzMaskString(f *testing.F) {
	for _, s := range []string{"Bearer abcdefgh12345678", "password=x", "x-api-key: y", "ghp_abcdefghijklmnopqrstuvwxyz", "the token is here", "https://a:b@c"} {
		f.Add(s)
	}
	for _, c := range maskStringCases {
		f.Add(c.in)
	}
	for _, c := range maskUntouchedCases {
		f.Add(c.in)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := MaskString(s)
		if want := fpMaskString(s); got != want {
			t.Fatalf("MaskString(%q) = %q, want %q", s, got, want)
		}
		if again := MaskString(got); again != got {
			t.Fatalf("MaskString is not idempotent on %q:\n  %q\n  %q", s, got, again)
		}
	})
}
