package events

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The fast paths of Validate (decodePlain), Encode (appendEnvelope,
// appendCompactJSON) and Mask (rule needles, stringsUnmasked) must give
// exactly what encoding/json and the plain regular expressions give. These
// tests compare them on a corpus of every payload shape with the edge
// cases of JSON (white space, escapes, invalid UTF-8, case-folded and
// repeated keys, null, wrong types, numbers out of range, trailing data),
// and on thousands of random mutations of it; the Fuzz targets go on from
// there (go test -fuzz FuzzFastPath...).

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

type fpCase struct {
	typ  Type
	data []byte
}

// TestFastPathsMatchEncodingJSON checks the corpus and 20,000 random
// mutations of it.
func TestFastPathsMatchEncodingJSON(t *testing.T) {
	seeds := fpSeeds(t)
	for _, c := range seeds {
		fpCheck(t, c.typ, c.data)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte(`{}[]:," \\/0123456789-+.eEtrufalsn` + "\t\n\x00\x7f\xc3\xa9\xff")
	for i := 0; i < 20000; i++ {
		c := seeds[rng.IntN(len(seeds))]
		b := append([]byte(nil), c.data...)
		for n := rng.IntN(3) + 1; n > 0 && len(b) > 0; n-- {
			at := rng.IntN(len(b))
			switch rng.IntN(3) {
			case 0:
				b[at] = alphabet[rng.IntN(len(alphabet))]
			case 1:
				b = append(b[:at], b[at+1:]...)
			default:
				b = append(b[:at], append([]byte{alphabet[rng.IntN(len(alphabet))]}, b[at:]...)...)
			}
		}
		fpCheck(t, c.typ, b)
	}
}

// fpCheck compares every fast path on one payload document.
func fpCheck(t *testing.T, typ Type, data []byte) {
	t.Helper()
	// decodePlain against json.Decoder.
	if p := newPayload(typ); p != nil {
		trimmed := bytes.TrimSpace(data)
		if ok, spaced, end := decodePlain(trimmed, p); ok {
			ref := newPayload(typ)
			if err := json.NewDecoder(bytes.NewReader(trimmed)).Decode(ref); err != nil {
				t.Fatalf("%s %q: fast decode succeeded, encoding/json: %v", typ, data, err)
			}
			if !reflect.DeepEqual(p, ref) {
				t.Fatalf("%s %q: fast decode\n%#v\nencoding/json\n%#v", typ, data, p, ref)
			}
			if !spaced {
				var buf bytes.Buffer
				if err := json.Compact(&buf, trimmed[:end]); err != nil || !bytes.Equal(buf.Bytes(), trimmed[:end]) {
					t.Fatalf("%s %q: taken as compact, json.Compact: %v %q", typ, data, err, buf.Bytes())
				}
			}
		}
	}
	// validJSON against json.Valid.
	if got, want := validJSON(data, true), json.Valid(data); got != want {
		t.Fatalf("validJSON(%q) = %t, json.Valid %t", data, got, want)
	}
	// appendCompactJSON against json.Compact.
	if out, ok := appendCompactJSON([]byte("x"), data); ok {
		var buf bytes.Buffer
		if err := json.Compact(&buf, data); err != nil || "x"+buf.String() != string(out) {
			t.Fatalf("%q: compacted to %q, json.Compact: %q %v", data, out, buf.Bytes(), err)
		}
	}
	// Encode against encoding/json, and the append path's copy of
	// compact data.
	ev := Event{SpecVersion: SpecVersion, ID: "01JB8XZ2Y4K3M5N6P7Q8R9S0T1", Type: typ, Source: DefaultSource,
		Time: time.Date(2026, 2, 19, 10, 0, 0, 123456789, time.UTC), Tenant: "acme", Session: "s-1", Turn: "t1", Data: data}
	fpCheckEncode(t, ev)
	compact, err := validate(&ev)
	if err2 := fpValidateSlow(&ev); fmt.Sprint(err) != fmt.Sprint(err2) {
		t.Fatalf("%s %q: validate %v, encoding/json path %v", typ, data, err, err2)
	}
	masked := Mask(&ev)
	if compact && !masked {
		fast, ok := ev.appendEnvelope(nil, true)
		ref, err := marshal(ev)
		if !ok || err != nil || !bytes.Equal(fast, ref) {
			t.Fatalf("%s %q: compact copy %q (ok %t), encoding/json %q %v", typ, data, fast, ok, ref, err)
		}
	}
	// Masking against the regular expressions alone.
	ev.Data = data
	if got, want := MaskJSON(data), fpMaskJSON(data); !bytes.Equal(got, want) {
		t.Fatalf("MaskJSON(%q)\n got %q\nwant %q", data, got, want)
	}
	if got, want := MaskString(string(data)), fpMaskString(string(data)); got != want {
		t.Fatalf("MaskString(%q)\n got %q\nwant %q", data, got, want)
	}
}

func fpCheckEncode(t *testing.T, ev Event) {
	t.Helper()
	got, err := ev.Encode()
	want, werr := marshal(ev)
	if werr != nil {
		werr = fmt.Errorf("encode event %s: %w", ev.ID, werr)
	}
	if fmt.Sprint(err) != fmt.Sprint(werr) || !bytes.Equal(got, want) {
		t.Fatalf("Encode(%+v)\n got %q %v\nwant %q %v", ev, got, err, want, werr)
	}
}

// fpValidateSlow is Validate with encoding/json's decoding only.
func fpValidateSlow(e *Event) error {
	_, err := validateWith(e, false)
	return err
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

func FuzzFastPathPayload(f *testing.F) {
	for i, c := range fpSeeds(f) {
		f.Add(uint8(i), c.data)
	}
	types := []Type{TypeMessageAppended, TypeTurnStarted, TypeTurnCompleted, TypeTurnFailed, TypeSessionStarted, TypeToolCallCompleted,
		TypeSnapshotTaken, TypeDistillationCompleted, TypeRecoveryAttempted, TypeErrorRecorded, TypeBreakerChanged}
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		fpCheck(t, types[int(which)%len(types)], data)
	})
}

func FuzzFastPathMaskString(f *testing.F) {
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

func FuzzFastPathEnvelope(f *testing.F) {
	f.Add("01JB8XZ2Y4K3M5N6P7Q8R9S0T1", "urn:x", "acme", "s-1", "t1", int64(1771495200), []byte(`{"a":1}`))
	f.Add("id\"", "ü", "a\u2028", "\x00", "", int64(-62135596800-1), []byte(` {"a" : [ ] } `))
	f.Fuzz(func(t *testing.T, id, source, tenant, session, turn string, sec int64, data []byte) {
		ev := Event{SpecVersion: SpecVersion, ID: id, Type: "x.y", Source: source, Time: time.Unix(sec, 0).UTC(), Tenant: tenant, Session: session, Turn: turn, Data: data}
		fpCheckEncode(t, ev)
	})
}
