package events_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/turnstone-dev/turnstone/events"
)

// FuzzEncode: for any event (any strings, time and data), Encode's own
// writer, when it answers, writes the bytes the library writes, and it
// answers for every event Log.Append stores from the seeds (the bodies
// of every payload type and of a real transcript).
func FuzzEncode(f *testing.F) {
	for _, body := range seedBodies(f) {
		ev, err := events.Decode(body)
		if err != nil {
			continue
		}
		f.Add(ev.SpecVersion, ev.ID, string(ev.Type), ev.Source, ev.Tenant, ev.Session, ev.Turn, ev.Time.UnixNano(), 0, []byte(ev.Data))
	}
	f.Add("1.0", "id\x00\"é", "t", "urn:x", "a\xffb", "s", "", int64(-1<<62), 3600*5+1800, []byte(`{"a":"\u001f\u00e9\/"}`))
	f.Add("1.0", "id", "t", "urn:x", "a", "s", "t1", int64(1), -75, []byte(` {"a" : [1, 2.50, -0, 1E3]} `))
	f.Add("1.0", "id", "t", "urn:x", "a", "s", "t1", int64(1), 25*3600, []byte(`{}`)) // a zone the library refuses
	f.Add("1.0", "id", "t", "urn:x", "a", "s", "t1", int64(1), -24*3600, []byte(`{}`))
	f.Fuzz(func(t *testing.T, spec, id, typ, source, tenant, session, turn string, nanos int64, offset int, data []byte) {
		ev := events.Event{SpecVersion: spec, ID: id, Type: events.Type(typ), Source: source, Tenant: tenant, Session: session, Turn: turn,
			Time: time.Unix(0, nanos).In(time.FixedZone("z", offset%(26*3600))), Data: data}
		got, ok := events.EncodeWithoutLibrary(ev)
		want, err := events.EncodeWithLibrary(ev)
		if !ok {
			return
		}
		if err != nil {
			t.Fatalf("the library refuses the event (%v), Encode's own writer wrote\n%s", err, got)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("Encode's own writer and the library differ:\n  %s\n  %s", got, want)
		}
	})
}

// TestEncodeWritesStoredEventsWithoutTheLibrary: every event of the
// seeds, as Log.Append stores it (its data as the library writes it), is
// written by Encode's own writer, byte for byte as the library writes it.
func TestEncodeWritesStoredEventsWithoutTheLibrary(t *testing.T) {
	t.Parallel()
	n := 0
	for _, body := range encodedSeeds(t) {
		ev, err := events.Decode(body)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := events.EncodeWithoutLibrary(ev)
		if !ok {
			t.Errorf("a stored event goes to the library:\n%s", body)
			continue
		}
		if !bytes.Equal(got, body) {
			t.Errorf("Encode's own writer changed a stored body:\n  %s\n  %s", got, body)
		}
		n++
	}
	if n < 30 {
		t.Fatalf("only %d seed events", n)
	}
}

// TestAValidatedPayloadSharesNothingWithData: Validate decodes a caller's
// Data into the payload; a tool input in it is a copy, so the caller may
// reuse the Data buffer afterwards.
func TestAValidatedPayloadSharesNothingWithData(t *testing.T) {
	t.Parallel()
	ev, err := events.New("acme", "s1", "t1", &events.MessageAppended{Role: events.RoleAssistant, Content: []events.ContentBlock{
		{Type: events.BlockToolUse, ID: "toolu_1", Name: "Bash", Input: []byte(`{"command":"ls"}`)}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := events.Validate(&ev); err != nil {
		t.Fatal(err)
	}
	p, err := ev.Payload()
	if err != nil {
		t.Fatal(err)
	}
	for i := range ev.Data {
		ev.Data[i] = 'x'
	}
	if in := string(p.(*events.MessageAppended).Content[0].Input); in != `{"command":"ls"}` {
		t.Fatalf("the payload's input changed with the caller's Data: %s", in)
	}
}

// TestTheScannerReadsStringsAsTheLibraryDoes: a string of 17 bytes with
// any two byte values at any two nearby positions (the runs the scanner
// reads eight at a time, their ends, escapes, quotes, control characters,
// multi-byte runes) inside an object, last or with a member after it: the scanner accepts exactly what
// the library accepts (it never hands on a valid one either, as no
// nesting or escaped name is involved). Under the race detector or
// -short, every 17th first byte (scripts/fullsize runs all 256).
func TestTheScannerReadsStringsAsTheLibraryDoes(t *testing.T) {
	t.Parallel()
	s := make([]byte, 17)
	step := 1
	if sampled() {
		step = 17 // 0, 17, 34 ("), ... 255: both ends and the quote
	}
	for p := 0; p < len(s); p++ {
		for q := p + 1; q < len(s) && q < p+4; q++ {
			for c := 0; c < 256; c += step {
				for d := 0; d < 256; d++ {
					for i := range s {
						s[i] = 'a'
					}
					s[p], s[q] = byte(c), byte(d)
					// The string at the body's end, and with a member
					// after it (the scanner reads past the string's end
					// eight bytes at a time when the body goes on).
					for _, after := range []string{`"}`, `","b":"0123456789abcdef"}`} {
						b := append(append([]byte(`{"a":"`), s...), after...)
						if got, want := events.ScannedObject(b), jsontext.Value(b).IsValid(); got != want {
							t.Fatalf("scanner %v, library %v on %q", got, want, b)
						}
					}
				}
			}
		}
	}
}

// sampled reports whether the tests read a sample (under the race
// detector or -short).
func sampled() bool { return raceEnabled || testing.Short() }
