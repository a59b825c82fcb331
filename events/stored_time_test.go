package events

import (
	"testing"
	"time"

	"github.com/go-json-experiment/json"
)

// TestParseCanonicalTimeAgreesWithTheLibrary: every time the hand parser
// accepts, the library (the reference) parses to the same instant and
// location; what it refuses is left to the library.
func TestParseCanonicalTimeAgreesWithTheLibrary(t *testing.T) {
	t.Parallel()
	accepted := 0
	for _, s := range []string{
		`"2026-02-19T10:00:00Z"`, `"2026-02-19T10:00:00.1Z"`, `"2026-02-19T10:00:00.123456789Z"`, `"2026-02-19T10:00:00.120000000Z"`,
		`"2024-02-29T23:59:59Z"`, `"1999-12-31T00:00:00.5Z"`, `"9999-12-31T23:59:59.999999999Z"`,
		// Refused by the hand parser (left to the library, which may accept).
		`"2025-02-29T10:00:00Z"`, `"2026-13-01T10:00:00Z"`, `"2026-02-19T24:00:00Z"`, `"2026-02-19T10:60:00Z"`,
		`"2026-02-19T10:00:60Z"`, `"2026-02-19T10:00:00.1234567890Z"`, `"2026-02-19T10:00:00.Z"`, `"2026-02-19t10:00:00Z"`,
		`"2026-02-19T10:00:00z"`, `"2026-02-19T10:00:00+01:00"`, `"2026-02-19 10:00:00Z"`, `"0999-01-01T00:00:00Z"`,
		`"2026-2-19T10:00:00Z"`, `"\u0032026-02-19T10:00:00Z"`, `"2026-02-19T10:00:00"`, `""`, `"Z"`,
	} {
		got, ok := parseCanonicalTime([]byte(s))
		var want time.Time
		err := json.Unmarshal([]byte(s), &want)
		if !ok {
			continue
		}
		accepted++
		if err != nil || !got.Equal(want) || got.Location().String() != want.Location().String() {
			t.Errorf("%s: hand parser %v (%s), library %v (%s), %v", s, got, got.Location(), want, want.Location(), err)
		}
	}
	if accepted != 7 {
		t.Errorf("the hand parser accepted %d of the canonical forms, want 7", accepted)
	}
}

// TestStoredMessageWithEscapesDecodesAsTheReference: a message.appended
// with escaped names and values is read as Decode and Validate read it
// (the hand decoder hands an escaped name to them).
func TestStoredMessageWithEscapesDecodesAsTheReference(t *testing.T) {
	t.Parallel()
	for _, data := range []string{
		`{"role":"user","content":[{"type":"text","t\u0065xt":"b"}]}`,
		`{"r\u006fle":"user","content":[{"type":"text","text":"a\u00e9\n\"q\""}]}`,
		`{"role":"assistant","content":[{"type":"tool_use","id":"t\u0031","name":"Bash","input":{"c":"\u00e9"}}]}`,
	} {
		body := []byte(`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00Z","tenant":"acme","session":"chat-42","data":` + data + `}`)
		got := DecodeStored("agent.evt.3.acme.chat-42", 9, body)
		want, err := Decode(body)
		if err == nil {
			err = Validate(&want)
		}
		if (got.Err == nil) != (err == nil) {
			t.Fatalf("%s: DecodeStored err %v, reference %v", data, got.Err, err)
		}
		if err != nil {
			continue
		}
		gp, _ := got.Payload()
		wp, _ := want.Payload()
		if gm, wm := gp.(*MessageAppended), wp.(*MessageAppended); gm.Role != wm.Role || len(gm.Content) != len(wm.Content) ||
			gm.Content[0].Text != wm.Content[0].Text || gm.Content[0].ID != wm.Content[0].ID || string(gm.Content[0].Input) != string(wm.Content[0].Input) {
			t.Fatalf("%s: DecodeStored %+v, reference %+v", data, gm, wm)
		}
	}
}
