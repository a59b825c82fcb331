package codex

import (
	"bytes"
	"os"
	"testing"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/importer"
)

// FuzzConvert: no input makes the converter panic or produce an invalid
// event, read as history or live.
func FuzzConvert(f *testing.F) {
	// Small inputs: the fuzzer minimizes every new input it finds, which
	// is slow for large ones.
	for _, rel := range []string{rolloutPending, rollout077} {
		b, err := os.ReadFile(wild(f, rel))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, false)
		f.Add(b[:len(b)/2], true)
	}
	r := newRollout("sess-fuzz")
	r.task("t1", "go")
	r.call("c1", "ls", 100)
	r.add("event_msg", `{"type":"turn_aborted","turn_id":"t1","reason":"interrupted"}`)
	r.output("c1", "Exit code: 1")
	r.add("compacted", `{"message":"summary","replacement_history":[]}`)
	r.add("event_msg", `{"type":"context_compacted"}`)
	r.add("response_item", `{"type":"web_search_call","id":"ws","status":"completed","action":{"type":"search","query":"q"}}`)
	r.add("event_msg", `{"type":"error","message":"boom","codex_error_info":{"http_connection_failed":{"http_status_code":502}}}`)
	r.add("event_msg", `{"type":"user_message","message":"again"}`)
	r.add("response_item", `{"type":"message","role":"user","content":[{"type":"input_text","text":"again"},{"type":"input_image","image_url":"data:image/png;base64,AAAA"}]}`)
	f.Add([]byte(r.String()), false)
	f.Add([]byte(r.String()), true)
	f.Fuzz(func(t *testing.T, data []byte, live bool) {
		c, err := NewConverter(importer.Options{MaxLineBytes: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.Convert(bytes.NewReader(data), "rollout-fuzz.jsonl", importer.Input{Live: live})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range res.Sessions {
			if !events.ValidToken(s.Session) {
				t.Fatalf("session token %q", s.Session)
			}
			seen, started := map[string]bool{}, map[string]bool{}
			for _, ev := range s.Events {
				if err := events.Validate(&ev); err != nil {
					t.Fatalf("%s: %v", ev, err)
				}
				if seen[ev.ID] {
					t.Fatalf("event id %s twice", ev.ID)
				}
				seen[ev.ID] = true
				if ev.Type == events.TypeToolCallStarted {
					p := payload[events.ToolCallStarted](t, ev)
					if started[p.ToolUseID] {
						t.Fatalf("tool call %s started twice", p.ToolUseID)
					}
					started[p.ToolUseID] = true
				}
			}
		}
	})
}
