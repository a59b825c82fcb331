package events_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/claudecode"
)

// fuzzTranscript is a short real Claude Code transcript, relative to the
// events package: its converted events seed the decoder's corpus.
const fuzzTranscript = "../../shared/data/transcripts/claude-code/spotter/short.jsonl"

// seedPayloads is one payload of every type of the contract, with the
// optional fields set, so that the seeds reach every payload's rules.
func seedPayloads() []struct {
	turn string
	p    events.Payload
} {
	info := events.ErrorInfo{Message: "overloaded", Stack: "at x (y.go:1)", Kind: events.KindTransient, Provider: "anthropic", HTTPStatus: 529, Code: "overloaded_error"}
	return []struct {
		turn string
		p    events.Payload
	}{
		{"", &events.SessionStarted{Runtime: "claude-code 2.1.39", Model: "claude-sonnet-4-5", Provider: "anthropic", Kind: "subagent",
			ParentSession: "parent-1", ParentToolUseID: "toolu_01", Labels: map[string]string{"cwd": "/src", "git_branch": "main"}}},
		{"", &events.SessionStarted{ForkedFrom: "s0", ForkSeq: 12}},
		{"", &events.SessionPaused{Reason: "authentication failed"}},
		{"", &events.SessionResumed{Reason: "credentials fixed"}},
		{"", &events.SessionRewound{ToSeq: 7, Reason: "bad turn", CommandID: "cmd-1"}},
		{"", &events.SessionForked{ForkSession: "s1-fork", AtSeq: 9, CommandID: "cmd-2"}},
		{"t1", &events.TurnStarted{Prompt: "fix the build; api_key=abc123", Trigger: "user", DeadlineMS: 120000}},
		{"t1", &events.TurnStageCompleted{Stage: events.StageHistory, DurationMS: 12}},
		{"t1", &events.TurnCompleted{Reason: "interrupted", DurationMS: 900}},
		{"t1", &events.TurnFailed{Stage: events.StageExecute, Error: info}},
		{"t1", &events.TurnAbandoned{LastStage: events.StageContext, Reason: "no outcome within 2m"}},
		{"t1", &events.MessageAppended{Role: events.RoleAssistant, MessageID: "msg_01", Model: "claude-sonnet-4-5", StopReason: "tool_use", Content: []events.ContentBlock{
			{Type: events.BlockThinking, Thinking: "hmm", Signature: "sig"},
			{Type: events.BlockText, Text: "Authorization: Bearer abcdefghijklmnop"},
			{Type: events.BlockToolUse, ID: "toolu_01", Name: "Bash", Input: json.RawMessage(`{"command":"ls"}`)},
			{Type: "redacted_thinking", Data: "xyz"},
		}}},
		{"t1", &events.MessageAppended{Role: events.RoleUser, Meta: true, Synthetic: true, Content: []events.ContentBlock{
			{Type: events.BlockToolResult, ToolUseID: "toolu_01", IsError: true, Content: json.RawMessage(`[{"type":"text","text":"boom"}]`)},
			{Type: events.BlockToolResult, ToolUseID: "toolu_02", Content: json.RawMessage(`"ok"`)},
			{Type: "image", Source: json.RawMessage(`{"type":"base64","data":"AAAA"}`)},
		}}},
		{"t1", &events.ToolCallStarted{ToolUseID: "toolu_01", Name: "Bash"}},
		{"t1", &events.ToolCallCompleted{ToolUseID: "toolu_01", Name: "Bash", DurationMS: 30, IsError: true}},
		{"t1", &events.ErrorRecorded{ErrorInfo: info, Consecutive: 2, Stage: events.StageExecute}},
		{"", &events.DistillationRequested{Reason: "auto: context 92% full"}},
		{"", &events.DistillationStarted{FromSeq: 1, ToSeq: 40}},
		{"t1", &events.DistillationCompleted{FromSeq: 1, ToSeq: 40, TokensBefore: 167094, TokensAfter: 9000, Trigger: "auto", Summary: "the story so far"}},
		{"", &events.DistillationSkipped{Reason: "turn_in_flight", Detail: "t1"}},
		{"", &events.SnapshotTaken{CoversSeq: 100, Version: 3}},
		{"", &events.RecoveryAttempted{CommandID: "cmd-1", Kind: "retry_turn", Attempt: 1, Strategy: "retry", Worker: "w1", Result: "failed", Class: "overloaded", Error: &info, DurationMS: 5}},
		{"", &events.RecoveryCompleted{CommandID: "cmd-1", Kind: "retry_turn", Outcome: events.OutcomeDegraded, Strategy: "switch_provider", Attempts: 2, Detail: "on bedrock"}},
		{"", &events.RecoveryParked{CommandID: "cmd-3", Kind: "repair_orphans", Reason: "runtime down", Deliveries: 5}},
		{"", &events.BreakerChanged{Provider: "anthropic", From: "closed", To: "open", Failures: 5, Reason: "5 failures in 1m"}},
	}
}

// encodedSeeds returns the bodies Log.Append stores for one event of
// every type built with events.NewAt and for the events of a real
// transcript.
func encodedSeeds(tb testing.TB) [][]byte {
	tb.Helper()
	at := time.Date(2026, 2, 19, 10, 0, 0, 0, time.UTC)
	var out [][]byte
	add := func(ev events.Event) {
		b, err := ev.Encode()
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, b)
	}
	for i, s := range seedPayloads() {
		ev, err := events.NewAt(at.Add(time.Duration(i)*time.Second), events.DeterministicID(at, fmt.Sprint(s.p.EventType(), i)), "acme", "chat-42", s.turn, s.p)
		if err != nil {
			tb.Fatal(err)
		}
		add(ev)
	}
	res, err := claudecode.ConvertFile(fuzzTranscript, claudecode.Options{Tenant: "real"})
	if err != nil {
		tb.Fatalf("convert %s (the shared data sits beside the repository): %v", fuzzTranscript, err)
	}
	if res.EventCount() == 0 {
		tb.Fatalf("%s converted to no events", fuzzTranscript)
	}
	for _, s := range res.Sessions {
		for _, ev := range s.Events {
			add(ev)
		}
	}
	return out
}

// seedBodies returns event bodies for the decoder's corpus: encodedSeeds,
// and bodies written by hand, valid and not: a few that break the
// contract in typical ways, and forms Encode does not write.
func seedBodies(tb testing.TB) [][]byte {
	tb.Helper()
	out := encodedSeeds(tb)
	for _, s := range []string{
		``, `null`, `[]`, `{}`, `"x"`, `{"specversion":"1.0"`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"turn.started","source":"urn:x","time":"2026-02-19T10:00:00Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"prompt":"hi"}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"turn.started","source":"urn:x","time":"2026-02-19T10:00:00Z","tenant":"acme","session":"chat-42","data":{"deadline_ms":"soon"}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"agent.thought","source":"urn:x","time":"2026-02-19T10:00:00+02:00","tenant":"acme","session":"chat-42","data":{"anything":[1,2,{"x":null}]}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00Z","tenant":"a.b","session":"c d","data":{"role":"user","content":[{"type":"tool_use"}]}}`,
		`{"specversion":1,"id":7,"type":null,"time":"yesterday","data":[]}`,
		// DecodeStored's one pass hands these to Decode and Validate: data
		// before type, an escaped name, a repeated member, white space.
		`{"data":{"prompt":"hi"},"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"turn.started","source":"urn:x","time":"2026-02-19T10:00:00Z","tenant":"acme","session":"chat-42","turn":"t-1"}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","typ\u0065":"turn.started","source":"urn:x","time":"2026-02-19T10:00:00Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"prompt":"hi"}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"turn.started","source":"urn:x","time":"2026-02-19T10:00:00Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"prompt":"hi"},"data":{}}`,
		` { "specversion" : "1.0" , "id" : "01JGZ8Q0000000000000000000" , "type" : "turn.started" , "source" : "urn:x" , "time" : "2026-02-19T10:00:00Z" , "tenant" : "acme" , "session" : "chat-42" , "turn" : "t-1" , "data" : { "prompt" : "hi" } , "extra" : [1] } `,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"session.started","source":"urn:x","time":"2026-02-19T10:00:00Z","tenant":"acme","session":"chat-42","data":{"labels":{"token":"sk-ant-aaaaaaaaaaaaaaaaaaaa"}}}`,
		// message.appended, read without reflection: what it reads the
		// library's way, and what it hands to the reference.
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00.5Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"role":"assistant","model":"m","stop_reason":"tool_use","usage":{"input_tokens":3,"output_tokens":4},"content":[{"type":"text","text":"aé"},{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"ls"},"extra":[1]}],"unknown":{"x":1}}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00.5Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"role":"user","meta":true,"synthetic":false,"content":[{"type":"tool_result","tool_use_id":"toolu_1","is_error":true,"content":[{"type":"text","text":"x"}]},{"type":"image","source":{"type":"base64","data":"AA=="}}]}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00.5Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"role":"user","content":[{"type":"text","text":"a","text":"b"}]}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00.5Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"role":"user","content":[{"type":"text","text":null}]}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00.5Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"role":"user","content":null}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00.5Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"role":"user","content":[]}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00.5Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":null,"is_error":null}]}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00.5Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"role":"user","Content":[{"type":"text","text":"case"}]}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00.5Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"sig","data":"d"}],"usage":null}}`,
		// The scanner's own reading: escapes, runes, numbers, nesting,
		// repeated names inside raw values, counts, white space.
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00.5Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"role":"user","content":[{"type":"text","text":"a\"b\\c\n\u00e9\ud83d\ude00 é 😀 end of a longer line"}]}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00.5Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"role":"user","content":[{"type":"text","text":"lone \ud800 surrogate"}]}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00.5Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"role":"assistant","message_id":"msg_1","content":[{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"a":[1,-2.5e+3,0,true,false,null,{"b":{}},[]],"c":"x"}}],"usage":{"input_tokens":0,"output_tokens":12,"cache_read_input_tokens":100000,"cache_creation_input_tokens":7,"reasoning_output_tokens":1,"service_tier":"standard"}}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00.5Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"a":1,"a":2}}]}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00.5Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"a":{"a":1},"b":{"a":2}}}]}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00.5Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"n":01}}]}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00.5Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"role":"assistant","usage":{"input_tokens":1.0,"output_tokens":1e3},"content":[{"type":"text","text":"x"}]}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00.5Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"role":"assistant","usage":{"input_tokens":-0,"output_tokens":9223372036854775807},"content":[{"type":"text","text":"x"}]}}`,
		"{\"specversion\":\"1.0\",\"id\":\"01JGZ8Q0000000000000000000\",\"type\":\"message.appended\",\"source\":\"urn:x\",\"time\":\"2026-02-19T10:00:00.5Z\",\"tenant\":\"acme\",\"session\":\"chat-42\",\"data\":{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"tab\tin a string\"}]}}",
		"{\"specversion\":\"1.0\",\"id\":\"01JGZ8Q0000000000000000000\",\"type\":\"message.appended\",\"source\":\"urn:x\",\"time\":\"2026-02-19T10:00:00.5Z\",\"tenant\":\"acme\",\"session\":\"chat-42\",\"data\":{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"bad \xff\xfe byte\"}]}}",
		"\t{ \"specversion\" :\n\"1.0\", \"id\":\"01JGZ8Q0000000000000000000\",\"type\":\"message.appended\",\"source\":\"urn:x\",\"time\":\"2026-02-19T10:00:00.5Z\",\"tenant\":\"acme\",\"session\":\"chat-42\",\"x\":{},\"y\":[],\"data\" : { \"role\" : \"user\" , \"content\" : [ { \"type\" : \"text\" , \"text\" : \"x\" , \"z\" : [ 1 , { } ] } ] , \"w\" : \"v\" } }\r\n",
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00.5Z","tenant":"acme","session":"chat-42","x":1,"x":2,"data":{"role":"user","content":[{"type":"text","text":"x"}]}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00.5Z","tenant":"acme","session":"chat-42","data":{"role":"user","content":[{"type":"text","text":"x"}]}} {}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00.5Z","tenant":"acme","session":"chat-42","data":{"role":"user","content":[{"type":"text","text":"x"}],"deep":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"turn.started","source":"urn:x","time":"2026-02-19T10:00:00Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"prompt":"hi","trigger":"user"},"after":{"k":"v"}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"turn.started","source":"urn:x","time":"2026-02-19T10:00:00Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"prompt":"hi"}  ,"turn":"t-2"}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"turn.started","source":"urn:x","time":"2026-02-19T10:00:00Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"prompt":null,"deadline_ms":-5,"trigger":"user","x":{"y":[]}}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"turn.completed","source":"urn:x","time":"2026-02-19T10:00:00Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"reason":"end_turn","duration_ms":4200,"duration_ms":1}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"turn.stage_completed","source":"urn:x","time":"2026-02-19T10:00:00Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"stage":"execute","duration_ms":12.5}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"tool_call.completed","source":"urn:x","time":"2026-02-19T10:00:00Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"tool_use_id":"toolu_1","name":"Bash","is_error":null,"duration_ms":null,"extra":"\u00e9"}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"tool_call.started","source":"urn:x","time":"2026-02-19T10:00:00Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"tool_use_id":"toolu_1","name":"Bash"}}`,
	} {
		out = append(out, []byte(s))
	}
	return out
}

// FuzzDecodeValidate feeds arbitrary bytes to the read path every stored
// event goes through (Decode, Validate, Payload, Summary, Mask) and checks
// that none of it panics and that an event Validate accepts round-trips:
// Encode then Decode gives the same envelope, its payload decodes, and
// masking keeps its data a JSON object.
func FuzzDecodeValidate(f *testing.F) {
	for _, b := range seedBodies(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		// The scanner accepts as one object only what the library does.
		if events.ScannedObject(body) && !jsontext.Value(body).IsValid() {
			t.Fatalf("the scanner reads an object the library refuses: %q", body)
		}
		stored := events.DecodeStored("agent.evt.3.acme.chat-42", 9, body)
		_ = stored.Summary()
		_ = stored.String()

		ev, err := events.Decode(body)
		if err != nil {
			if !errors.Is(err, events.ErrMalformed) {
				t.Fatalf("Decode error %v does not wrap ErrMalformed", err)
			}
			return
		}
		_ = ev.Summary()
		verr := events.Validate(&ev)
		if verr != nil && !errors.Is(verr, events.ErrInvalid) {
			t.Fatalf("Validate error %v does not wrap ErrInvalid", verr)
		}
		p, perr := ev.Payload()
		if perr == nil && p.EventType() != ev.Type {
			t.Fatalf("Payload of a %s event is a %s", ev.Type, p.EventType())
		}
		// The payload decoded without reflection (the turn's payloads) is
		// the library's.
		if events.KnownType(ev.Type) && len(ev.Data) > 0 {
			lp, lerr := events.DecodePayloadWithLibrary(ev.Type, ev.Data)
			if (lerr == nil) != (perr == nil) || lerr == nil && !reflect.DeepEqual(lp, p) {
				t.Fatalf("Payload and the library differ on %s data %s:\n  %#v (%v)\n  %#v (%v)", ev.Type, ev.Data, p, perr, lp, lerr)
			}
		}
		masked := ev
		masked.Data = append(json.RawMessage(nil), ev.Data...)
		events.Mask(&masked)
		subject := events.StoredEventSubject(3, ev.Tenant, ev.Session)
		if verr != nil {
			if bad := events.DecodeStored(subject, 9, body); bad.Err == nil {
				t.Fatalf("Validate refuses the body (%v) but DecodeStored accepts it", verr)
			}
			return
		}

		// Valid: the payload decodes (or the type is unknown and kept).
		if events.KnownType(ev.Type) && perr != nil {
			t.Fatalf("Validate accepts a %s event whose Payload fails: %v", ev.Type, perr)
		}
		if !events.KnownType(ev.Type) && !errors.Is(perr, events.ErrUnknownType) {
			t.Fatalf("Payload of unknown type %q: %v, want ErrUnknownType", ev.Type, perr)
		}
		own := events.DecodeStored(subject, 9, body)
		if own.Err != nil {
			t.Fatalf("Validate accepts the body but DecodeStored flags it: %v", own.Err)
		}
		// DecodeStored reads a body in one pass: the same event and payload
		// as Decode and Validate.
		if own.SpecVersion != ev.SpecVersion || own.ID != ev.ID || own.Type != ev.Type || own.Source != ev.Source ||
			!own.Time.Equal(ev.Time) || own.Time.Location().String() != ev.Time.Location().String() ||
			own.Tenant != ev.Tenant || own.Session != ev.Session || own.Turn != ev.Turn || !bytes.Equal(own.Data, ev.Data) {
			t.Fatalf("DecodeStored and Decode differ:\n  %+v\n  %+v", own, ev)
		}
		if op, oerr := own.Payload(); (oerr == nil) != (perr == nil) || !reflect.DeepEqual(op, p) {
			t.Fatalf("DecodeStored's payload differs from Validate's:\n  %#v (%v)\n  %#v (%v)", op, oerr, p, perr)
		}

		// Round trip: the stored form decodes to the same envelope, and is
		// a fixed point of Encode.
		enc, err := ev.Encode()
		if err != nil {
			t.Fatalf("Encode of a valid event: %v", err)
		}
		back, err := events.Decode(enc)
		if err != nil {
			t.Fatalf("Decode of an encoded valid event: %v\n%s", err, enc)
		}
		if err := events.Validate(&back); err != nil {
			t.Fatalf("the encoded valid event no longer validates: %v\n%s", err, enc)
		}
		if back.SpecVersion != ev.SpecVersion || back.ID != ev.ID || back.Type != ev.Type || back.Source != ev.Source ||
			!back.Time.Equal(ev.Time) || back.Tenant != ev.Tenant || back.Session != ev.Session || back.Turn != ev.Turn {
			t.Fatalf("round trip changed the envelope:\n  %+v\n  %+v", ev, back)
		}
		// Encode writes the data compact, its strings escaped as
		// jsontext does by default ("\u00e9" becomes "é"): the same
		// values, which the canonical forms (RFC 8785) of both show.
		want, got := jsontext.Value(append([]byte(nil), ev.Data...)), jsontext.Value(append([]byte(nil), back.Data...))
		if err := want.Canonicalize(); err != nil {
			t.Fatalf("valid event data is not JSON: %v", err)
		}
		if err := got.Canonicalize(); err != nil || !bytes.Equal(want, got) {
			t.Fatalf("round trip changed the data (%v):\n  %s\n  %s", err, ev.Data, back.Data)
		}
		again, err := back.Encode()
		if err != nil || !bytes.Equal(again, enc) {
			t.Fatalf("Encode is not stable: %v\n  %s\n  %s", err, enc, again)
		}

		// Masking keeps the data a JSON object of the same type's shape,
		// and is idempotent.
		if d := bytes.TrimSpace(masked.Data); len(d) == 0 || d[0] != '{' || !json.Valid(d) {
			t.Fatalf("Mask turned data %s into %s", ev.Data, masked.Data)
		}
		if _, err := masked.Payload(); events.KnownType(ev.Type) && err != nil {
			t.Fatalf("masked data no longer fits %s: %v\n%s", ev.Type, err, masked.Data)
		}
		twice := masked
		if events.Mask(&twice) {
			t.Fatalf("Mask is not idempotent:\n  %s\n  %s", masked.Data, twice.Data)
		}
		if _, err := masked.Encode(); err != nil {
			t.Fatalf("Encode of a masked valid event: %v", err)
		}
	})
}

// TestStoredBodiesTakeTheOnePass: the bodies Log.Append stores (every
// payload type built with events.NewAt, a real transcript's events: the
// canonical form Encode writes) and valid bodies written another way
// (escapes, runes, white space, unknown members, counts, nested raw
// values) are read by DecodeStored's own pass, not handed to the library,
// and give what the library gives.
func TestStoredBodiesTakeTheOnePass(t *testing.T) {
	t.Parallel()
	const envelope = `"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00.5Z","tenant":"acme","session":"chat-42","turn":"t-1"`
	others := []string{
		`{` + envelope + `,"data":{"role":"user","content":[{"type":"text","text":"a\"b\\c\n\u00e9\ud83d\ude00 é 😀 中文 end of a longer line"}]}}`,
		`{` + envelope + `,"data":{"role":"assistant","message_id":"msg_1","content":[{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"a":[1,-2.5e+3,0,true,false,null,{"b":{}},[]],"c":"x\u0041","d":{"a":1}},"cache_control":{"type":"ephemeral"}}],"usage":{"input_tokens":0,"output_tokens":12,"cache_read_input_tokens":100000,"service_tier":"standard"}}}`,
		"\t{ " + envelope + " ,\"x\":{},\"y\":[],\"data\" : { \"role\" : \"user\" , \"content\" : [ { \"type\" : \"text\" , \"text\" : \"x\" , \"z\" : [ 1 , { } ] } ] , \"w\" : \"v\" } }\r\n",
		`{` + envelope + `,"data":{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"ok"}],"is_error":false}],"meta":true,"synthetic":false}}`,
		// null where a string, a bool, an object or a count goes: the
		// library leaves the zero value (a nil Usage).
		`{` + envelope + `,"data":{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":null,"is_error":null,"text":null}],"usage":null,"model":null}}`,
		`{` + envelope + `,"data":{"role":"assistant","content":[{"type":"text","text":"x"}],"usage":{"input_tokens":null,"output_tokens":3}}}`,
		// The other payloads of a turn, with nulls and unknown members.
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"turn.started","source":"urn:x","time":"2026-02-19T10:00:00Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"prompt":null,"deadline_ms":60000,"trigger":"user","x":{"y":[]}}}`,
		`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"tool_call.completed","source":"urn:x","time":"2026-02-19T10:00:00Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"tool_use_id":"toolu_1","name":"Bash","is_error":null,"duration_ms":null,"extra":"\u00e9"}}`,
	}
	bodies := encodedSeeds(t)
	if len(bodies) < 30 {
		t.Fatalf("only %d encoded seed bodies", len(bodies))
	}
	for _, o := range others {
		bodies = append(bodies, []byte(o))
	}
	for _, body := range bodies {
		ev, err := events.Decode(body)
		if err == nil {
			err = events.Validate(&ev)
		}
		if err != nil {
			t.Fatalf("a seed meant valid is not: %v\n%s", err, body)
		}
		got, ok := events.DecodeValid(body, ev.Tenant, ev.Session)
		if !ok {
			t.Errorf("a valid body goes to the library:\n%s", body)
			continue
		}
		want, _ := ev.Payload()
		gp, _ := got.Payload()
		if got.ID != ev.ID || got.Type != ev.Type || !got.Time.Equal(ev.Time) || got.Turn != ev.Turn || !bytes.Equal(got.Data, ev.Data) || !reflect.DeepEqual(gp, want) {
			t.Errorf("the one pass and the library differ on\n%s\n  %#v\n  %#v", body, gp, want)
		}
	}
}

// TestDecodedValuesCannotWriteIntoTheBody: the data and the raw values
// of a decoded event share the stored body, and end where their value
// ends: appending to one allocates, and leaves the body as it was.
func TestDecodedValuesCannotWriteIntoTheBody(t *testing.T) {
	t.Parallel()
	body := []byte(`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00Z","tenant":"acme","session":"chat-42","turn":"t-1","data":{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"ls"}}]},"x":1}`)
	ev, ok := events.DecodeValid(body, "acme", "chat-42")
	if !ok {
		t.Fatal("the one pass refused a valid body")
	}
	before := string(body)
	p, _ := ev.Payload()
	in := p.(*events.MessageAppended).Content[0].Input
	_ = append(ev.Data, 'X')
	_ = append(in, 'Y')
	if string(body) != before {
		t.Fatalf("an append to a decoded value wrote into the body:\n%s", body)
	}
	// The library's path (a payload read with reflection) shares as well.
	body = []byte(`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"session.started","source":"urn:x","time":"2026-02-19T10:00:00Z","tenant":"acme","session":"chat-42","data":{"labels":{"cwd":"/src"}},"x":1}`)
	before = string(body)
	ev = events.DecodeStored("agent.evt.3.acme.chat-42", 1, body)
	if ev.Err != nil {
		t.Fatal(ev.Err)
	}
	_ = append(ev.Data, 'X')
	if string(body) != before {
		t.Fatalf("an append to the data wrote into the body:\n%s", body)
	}
}
