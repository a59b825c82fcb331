package events

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func mustEvent(t *testing.T, turn string, p Payload) Event {
	t.Helper()
	ev, err := New("acme", "s-1", turn, p)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func TestValidate(t *testing.T) {
	t.Parallel()
	ok := func(ev Event) Event { return ev }
	tests := []struct {
		name   string
		ev     func(t *testing.T) Event
		fields []string // every field a FieldError must name; empty: valid
	}{
		{"session started", func(t *testing.T) Event { return mustEvent(t, "", &SessionStarted{Runtime: "x"}) }, nil},
		{"turn started", func(t *testing.T) Event { return mustEvent(t, "t1", &TurnStarted{}) }, nil},
		{"turn started without turn", func(t *testing.T) Event { return mustEvent(t, "", &TurnStarted{}) }, []string{"turn"}},
		{"bad stage", func(t *testing.T) Event { return mustEvent(t, "t1", &TurnStageCompleted{Stage: "deploy"}) }, []string{"data.stage"}},
		{"failed without stage and message", func(t *testing.T) Event { return mustEvent(t, "t1", &TurnFailed{}) }, []string{"data.stage", "data.error.message"}},
		{"message ok", func(t *testing.T) Event {
			return mustEvent(t, "t1", &MessageAppended{Role: RoleAssistant, Content: []ContentBlock{
				{Type: BlockText, Text: "hi"}, {Type: BlockToolUse, ID: "toolu_1", Name: "Bash", Input: json.RawMessage(`{"command":"ls"}`)}}})
		}, nil},
		{"message bad role and empty", func(t *testing.T) Event { return mustEvent(t, "", &MessageAppended{Role: "system"}) }, []string{"data.role", "data.content"}},
		{"tool_use without id in user message", func(t *testing.T) Event {
			return mustEvent(t, "", &MessageAppended{Role: RoleUser, Content: []ContentBlock{{Type: BlockToolUse, Name: "x"}}})
		}, []string{"data.content[0].id", "data.content[0].type"}},
		{"tool_result content number", func(t *testing.T) Event {
			return mustEvent(t, "", &MessageAppended{Role: RoleUser, Content: []ContentBlock{{Type: BlockToolResult, ToolUseID: "toolu_1", Content: json.RawMessage(`5`)}}})
		}, []string{"data.content[0].content"}},
		{"error kind", func(t *testing.T) Event {
			return mustEvent(t, "", &ErrorRecorded{ErrorInfo: ErrorInfo{Message: "boom", Kind: "fatal", HTTPStatus: 999}})
		}, []string{"data.kind", "data.http_status"}},
		{"error ok", func(t *testing.T) Event {
			return mustEvent(t, "", &ErrorRecorded{ErrorInfo: ErrorInfo{Message: "429", Kind: KindTransient, HTTPStatus: 429}, Consecutive: 2})
		}, nil},
		{"distillation range", func(t *testing.T) Event { return mustEvent(t, "", &DistillationCompleted{FromSeq: 9, ToSeq: 3}) }, []string{"data.from_seq"}},
		{"skipped needs reason", func(t *testing.T) Event { return mustEvent(t, "", &DistillationSkipped{}) }, []string{"data.reason"}},
		{"snapshot needs covers_seq", func(t *testing.T) Event { return mustEvent(t, "", &SnapshotTaken{}) }, []string{"data.covers_seq"}},
		{"envelope", func(t *testing.T) Event {
			return Event{SpecVersion: "0.3", ID: "nope", Type: "Turn Started", Tenant: "a.b", Session: strings.Repeat("x", 129), Turn: "t 1", Data: json.RawMessage(`[]`)}
		}, []string{"specversion", "id", "type", "source", "time", "tenant", "session", "turn", "data"}},
		{"unknown type with valid envelope is accepted", func(t *testing.T) Event {
			ev := mustEvent(t, "", &SessionResumed{})
			ev.Type = "future.thing"
			ev.Data = json.RawMessage(`{"anything":1}`)
			return ok(ev)
		}, nil},
		{"wrong field type", func(t *testing.T) Event {
			ev := mustEvent(t, "t1", &TurnStageCompleted{Stage: StageContext})
			ev.Data = json.RawMessage(`{"stage":"context","duration_ms":"fast"}`)
			return ev
		}, []string{"data"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := tt.ev(t)
			err := Validate(&ev)
			if len(tt.fields) == 0 {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("want ErrInvalid, got %v", err)
			}
			got := fieldsOf(err)
			for _, f := range tt.fields {
				if !got[f] {
					t.Errorf("no FieldError for %q in %v", f, err)
				}
			}
			if len(got) != len(tt.fields) {
				t.Errorf("got fields %v, want exactly %v", got, tt.fields)
			}
		})
	}
}

func fieldsOf(err error) map[string]bool {
	out := map[string]bool{}
	var walk func(error)
	walk = func(e error) {
		var fe *FieldError
		if errors.As(e, &fe) && e == error(fe) {
			out[fe.Field] = true
			return
		}
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
		}
	}
	walk(err)
	return out
}

func TestDecodeAndPayload(t *testing.T) {
	t.Parallel()
	ev := mustEvent(t, "t1", &TurnFailed{Stage: StageHistory, Error: ErrorInfo{Message: "boom", Kind: KindLogic}})
	b, err := ev.Encode()
	if err != nil {
		t.Fatal(err)
	}
	back, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if !back.Time.Equal(ev.Time) || back.ID != ev.ID || back.Turn != "t1" {
		t.Fatalf("round trip changed the envelope: %+v", back)
	}
	p, err := back.Payload()
	if err != nil {
		t.Fatal(err)
	}
	tf, ok := p.(*TurnFailed)
	if !ok || tf.Stage != StageHistory || tf.Error.Message != "boom" {
		t.Fatalf("payload = %#v", p)
	}

	if _, err := Decode([]byte(`{"id":`)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("truncated JSON: want ErrMalformed, got %v", err)
	}
	if _, err := Decode([]byte(`{"time":"yesterday"}`)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("bad time: want ErrMalformed, got %v", err)
	}
	unknown := Event{Type: "x.y", Data: json.RawMessage(`{}`)}
	if _, err := unknown.Payload(); !errors.Is(err, ErrUnknownType) {
		t.Fatalf("want ErrUnknownType, got %v", err)
	}
}

func TestDeterministicID(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 2, 10, 21, 11, 56, 846_000_000, time.UTC)
	a := DeterministicID(at, "uuid-1/message")
	if a != DeterministicID(at, "uuid-1/message") {
		t.Fatal("same input, different id")
	}
	if a == DeterministicID(at, "uuid-1/turn.started") {
		t.Fatal("different key, same id")
	}
	ev := Event{SpecVersion: SpecVersion, ID: a, Type: TypeSessionResumed, Source: "x", Time: at, Tenant: "t", Session: "s", Data: json.RawMessage(`{}`)}
	if err := Validate(&ev); err != nil {
		t.Fatalf("deterministic id is not a valid ULID: %v", err)
	}
}

func TestValidToken(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]bool{
		"acme": true, "a_b-C9": true, "": false, "a.b": false, "a*": false, "a>": false, "a b": false,
		strings.Repeat("x", 128): true, strings.Repeat("x", 129): false, "é": false,
	} {
		if got := ValidToken(s); got != want {
			t.Errorf("ValidToken(%q) = %v, want %v", s, got, want)
		}
	}
}

func TestEncodeKeepsHTMLCharacters(t *testing.T) {
	t.Parallel()
	ev := mustEvent(t, "", &MessageAppended{Role: RoleAssistant, Content: []ContentBlock{
		{Type: BlockToolUse, ID: "toolu_1", Name: "Bash", Input: json.RawMessage(`{"command":"a 2>&1 | b <x"}`)},
	}})
	b, err := ev.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `a 2>&1 | b <x`) {
		t.Fatalf("encoded body escapes HTML characters: %s", b)
	}
}

func TestValidateRefusesInvalidOrTrailingData(t *testing.T) {
	t.Parallel()
	for _, data := range []string{`{"prompt":`, `{"prompt":"x"} {"y":1}`} {
		ev := mustEvent(t, "t1", &TurnStarted{})
		ev.Data = json.RawMessage(data)
		if err := Validate(&ev); !errors.Is(err, ErrInvalid) {
			t.Errorf("data %s: want ErrInvalid, got %v", data, err)
		}
	}
}

// TestTurnAbandonedStages checks turn.abandoned's stage keys: the new
// ones are validated, and the old last_stage is still read as the last
// stage completed.
func TestTurnAbandonedStages(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		data          string
		ok            bool
		completed, in Stage
	}{
		{`{"reason":"deadline","last_stage_completed":"history","stage":"execute"}`, true, StageHistory, StageExecute},
		{`{"reason":"deadline","last_stage":"context"}`, true, StageContext, StageHistory},
		{`{"reason":"deadline"}`, true, "", StageContext},
		{`{"reason":"deadline","last_stage_completed":"finalize"}`, true, StageFinalize, StageFinalize},
		{`{"reason":"deadline","stage":"lunch"}`, false, "", ""},
		{`{"reason":"deadline","last_stage_completed":"lunch"}`, false, "", ""},
	} {
		ev := Event{SpecVersion: SpecVersion, ID: NewID(), Type: TypeTurnAbandoned, Source: DefaultSource, Time: time.Now(),
			Tenant: "a", Session: "s", Turn: "t1", Data: json.RawMessage(tt.data)}
		err := Validate(&ev)
		if (err == nil) != tt.ok {
			t.Errorf("%s: Validate = %v, want ok %v", tt.data, err, tt.ok)
			continue
		}
		if !tt.ok {
			continue
		}
		p, err := ev.Payload()
		if err != nil {
			t.Fatal(err)
		}
		a := p.(*TurnAbandoned)
		if a.Completed() != tt.completed || a.InStage() != tt.in {
			t.Errorf("%s: completed %q, in %q; want %q, %q", tt.data, a.Completed(), a.InStage(), tt.completed, tt.in)
		}
	}
}
