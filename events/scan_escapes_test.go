package events

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestEscapesDecodeInLinearTime: a string whose every other byte is an
// escape is read in time linear in its length. A tool output of many
// lines is stored as such a string ("\n" after each line), and the
// scanner once searched for the closing quote again after every escape:
// a 900 KB output of 50,000 lines took seconds to read, at every restore
// and every delivery (a CI run's engine lost its partitions to it). The
// body here is 4 MB of two-byte escapes (2 million): linear, it is read
// in milliseconds (well under a second under the race detector); the
// quadratic search would scan about 4 TB, hours. The bound is that gap,
// not a figure of speed (BenchmarkDecodeEscapes measures that). The
// value read is compared with the library's.
func TestEscapesDecodeInLinearTime(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, line string }{
		{"line breaks", `\n`},
		{"escaped quotes", `\"`}, // each escape takes the quote found: searched again, one byte on
		{"lines of text", `build output line\n`},
		{"unicode escapes", `\u00e9\t`},
	} {
		body := escapesBody(tc.line, 4<<20)
		done := make(chan Event, 1)
		go func() { done <- DecodeStored("agent.evt.3.acme.chat-42", 9, body) }()
		var got Event
		select {
		case got = <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: a %d-byte body of escapes not read in 20 s", tc.name, len(body))
		}
		if got.Err != nil {
			t.Fatalf("%s: %v", tc.name, got.Err)
		}
		p, err := got.Payload()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		want, err := Decode(body)
		if err != nil {
			t.Fatal(err)
		}
		wp, err := want.Payload()
		if err != nil {
			t.Fatal(err)
		}
		g, w := p.(*MessageAppended).Content[0], wp.(*MessageAppended).Content[0]
		if !bytes.Equal(g.Content, w.Content) || len(g.Content) < 2<<20 {
			t.Errorf("%s: tool_result content of %d bytes, the library's %d", tc.name, len(g.Content), len(w.Content))
		}
	}
}

// escapesBody is a stored message.appended whose one tool_result holds a
// JSON string of line repeated to about n bytes.
func escapesBody(line string, n int) []byte {
	return []byte(`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"message.appended","source":"urn:x","time":"2026-02-19T10:00:00Z","tenant":"acme","session":"chat-42","data":` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"` + strings.Repeat(line, n/len(line)) + `"}]}}`)
}

// BenchmarkDecodeEscapes times the read of a stored body whose tool
// output is a string of lines (an escape every 19 bytes) at 64 KiB and at
// the log's 1 MiB limit: the time per byte (MB/s) is the same at both
// sizes.
func BenchmarkDecodeEscapes(b *testing.B) {
	for _, n := range []int{64 << 10, 1 << 20} {
		body := escapesBody(`build output line\n`, n)
		b.Run(fmt.Sprintf("%dKiB", n>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if ev := DecodeStored("agent.evt.3.acme.chat-42", 9, body); ev.Err != nil {
					b.Fatal(ev.Err)
				}
			}
		})
	}
}
