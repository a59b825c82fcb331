package projections

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/turnstone-dev/turnstone/events"
)

// The hashes as they were written before they were made to allocate
// nothing: the reference the new ones must equal, byte for byte, since
// stored snapshots and the loop detectors compare them. refHash is the
// hash function they feed (SHA-256 until state Version 12, XXH64 since).

// refHash collects the bytes written to it and hashes them at Sum.
type refHash struct{ b []byte }

func newRefHash() *refHash        { return &refHash{} }
func (h *refHash) Write(p []byte) { h.b = append(h.b, p...) }
func (h *refHash) Sum(_ []byte) []byte {
	var out [8]byte
	binary.BigEndian.PutUint64(out[:], xxhash.Sum64(h.b))
	return out[:]
}

func refChainOutput(h string, cb *events.ContentBlock) string {
	if cb.Type == events.BlockThinking || cb.Type == "redacted_thinking" {
		return h
	}
	sum := newRefHash()
	for i, part := range []string{h + "\n" + cb.Type, cb.Name, refCompactJSON(cb.Input), strings.Join(strings.Fields(cb.Text), " ")} {
		if i > 0 {
			sum.Write([]byte{0})
		}
		sum.Write([]byte(part))
	}
	return hex.EncodeToString(sum.Sum(nil)[:8])
}
func refChainInput(h string, cb *events.ContentBlock) string {
	sum := newRefHash()
	sum.Write([]byte(h + "\n" + cb.Type))
	if cb.IsError {
		sum.Write([]byte{0, 1})
	}
	for _, part := range [][]byte{[]byte(cb.Text), cb.Content, cb.Source, []byte(cb.Data)} {
		sum.Write([]byte{0})
		sum.Write(part)
	}
	return hex.EncodeToString(sum.Sum(nil)[:8])
}
func refInputHash(input json.RawMessage) string {
	sum := newRefHash()
	sum.Write([]byte(refCompactJSON(input)))
	return hex.EncodeToString(sum.Sum(nil)[:8])
}
func refStepKey(name string, input json.RawMessage) string {
	sum := newRefHash()
	sum.Write([]byte(name))
	sum.Write([]byte{0})
	sum.Write([]byte(strings.Join(strings.Fields(refCompactJSON(firstMember(input))), " ")))
	return hex.EncodeToString(sum.Sum(nil)[:8])
}

func refCompactJSON(raw []byte) string {
	var b strings.Builder
	inString, escaped := false, false
	for _, c := range raw {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// TestHashesEqualTheirReference: chainOutput, chainInput, InputHash and
// StepKey give what they gave before they were rewritten, on texts with
// every kind of white space (Unicode's too), escapes and invalid UTF-8,
// short and longer than their stack buffers: 5,000 generated blocks, 1,000
// under the race detector and -short (the full-size pass of .ci/run checks 5,000).
func TestHashesEqualTheirReference(t *testing.T) {
	t.Parallel()
	n := 5000
	if sampled() {
		n = 1000
	}
	parts := []string{"a", "word", " ", "  ", "\t", "\n", "\r\n", "\v", "\f", "\u00a0", "\u2003", "\u3000", "\u0085", "\x85", "\xff", "\xe2\x80",
		"é", "日本", `"`, `\"`, `\\`, "{", "}", ":", ",", "[", "]", "x y", strings.Repeat("long text ", 150)}
	rnd := rand.New(rand.NewPCG(1, 2))
	gen := func() string {
		var b strings.Builder
		for range rnd.IntN(12) {
			b.WriteString(parts[rnd.IntN(len(parts))])
		}
		return b.String()
	}
	for i := range n {
		cb := events.ContentBlock{Type: []string{"text", "tool_use", "tool_result", "image"}[i%4], Name: gen(), Text: gen(),
			Input: json.RawMessage(gen()), Content: json.RawMessage(gen()), Source: json.RawMessage(gen()), Data: gen(), IsError: i%3 == 0}
		h := refInputHash(json.RawMessage(gen()))
		if got, want := chainOutput(h, &cb), refChainOutput(h, &cb); got != want {
			t.Fatalf("chainOutput(%q, %+v) = %s, want %s", h, cb, got, want)
		}
		if got, want := chainInput(h, &cb), refChainInput(h, &cb); got != want {
			t.Fatalf("chainInput(%q, %+v) = %s, want %s", h, cb, got, want)
		}
		if got, want := InputHash(cb.Input), refInputHash(cb.Input); got != want {
			t.Fatalf("InputHash(%q) = %s, want %s", cb.Input, got, want)
		}
		if got, want := StepKey(cb.Name, cb.Input), refStepKey(cb.Name, cb.Input); got != want {
			t.Fatalf("StepKey(%q, %q) = %s, want %s", cb.Name, cb.Input, got, want)
		}
		if got, want := string(appendFields(nil, cb.Text)), strings.Join(strings.Fields(cb.Text), " "); got != want {
			t.Fatalf("appendFields(%q) = %q, want %q", cb.Text, got, want)
		}
	}
}

// TestHashesAllocateOnlyTheirResult: the fold's hashes allocate the
// string they return and nothing else.
func TestHashesAllocateOnlyTheirResult(t *testing.T) {
	cb := events.ContentBlock{Type: "tool_use", Name: "Bash", Input: json.RawMessage(`{"command": "go test ./...", "description": "run the tests"}`),
		Text: "The handler returns early when the request has no body, so the counter is never updated."}
	for name, f := range map[string]func(){
		"chainOutput": func() { chainOutput(emptyOutputHash, &cb) },
		"chainInput":  func() { chainInput(emptyOutputHash, &cb) },
		"InputHash":   func() { InputHash(cb.Input) },
	} {
		if n := testing.AllocsPerRun(100, f); n > 1 {
			t.Errorf("%s: %v allocations, want 1 (its result)", name, n)
		}
	}
}

// The previews' sources as they were written before they were made to
// allocate nothing but their result.

func refResultText(raw []byte) string {
	raw = trimSpace(raw)
	if len(raw) == 0 {
		return ""
	}
	switch raw[0] {
	case '"':
		// A cut string ends in a valid rune; should it not, the invalid
		// bytes read as U+FFFD, which the preview never reaches.
		s, _ := jsontext.AppendUnquote(nil, refStringPrefix(raw, rawPrefix))
		return string(s)
	case '[':
		var blocks []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(raw, &blocks); err != nil {
			return ""
		}
		var parts []string
		for _, bl := range blocks {
			if bl.Type == events.BlockText && bl.Text != "" {
				parts = append(parts, bl.Text)
			}
		}
		return strings.Join(parts, "\n")
	}
	return ""
}
func refStringPrefix(raw []byte, max int) []byte {
	if len(raw) <= max {
		return raw
	}
	i := 1
	for i < max && i < len(raw)-1 {
		switch {
		case raw[i] == '\\' && i+1 < len(raw) && raw[i+1] == 'u':
			i += 6
			if highSurrogate(raw[i-4 : min(i, len(raw))]) {
				i += 6 // and the low one after it
			}
		case raw[i] == '\\':
			i += 2
		default:
			i++
		}
	}
	if i > len(raw)-1 {
		return raw
	}
	for i > 1 && raw[i]&0xC0 == 0x80 {
		i-- // not inside a rune's UTF-8 bytes
	}
	out := make([]byte, 0, i+1)
	out = append(out, raw[:i]...)
	return append(out, '"')
}

// TestPreviewsEqualTheirReference: a tool_use's and a tool_result's
// previews are what they were (clip of compactPrefix, clip of
// resultText), on generated inputs of every length: 5,000 of them, 1,000
// under the race detector and -short (the full-size pass of .ci/run checks 5,000).
func TestPreviewsEqualTheirReference(t *testing.T) {
	t.Parallel()
	n := 5000
	if sampled() {
		n = 1000
	}
	parts := []string{"a", " ", "\n", `"`, `\"`, `\\`, `\n`, `\u00e9`, `\ud83d\ude00`, "é", "😀", "\u2028", "<", "\xff", "\xe2\x82", "{", "}", ":", ",",
		strings.Repeat("x", 700), strings.Repeat("é", 400)}
	rnd := rand.New(rand.NewPCG(3, 4))
	gen := func() string {
		var b strings.Builder
		for range rnd.IntN(16) {
			b.WriteString(parts[rnd.IntN(len(parts))])
		}
		return b.String()
	}
	for range n {
		in := []byte(gen())
		if got, want := previewBytes(appendCompact(nil, in, rawPrefix), PreviewRunes), preview(compactPrefix(in, rawPrefix), PreviewRunes); got != want {
			t.Fatalf("tool_use preview of %q:\n  %q\nwant\n  %q", in, got, want)
		}
		str, err := json.Marshal(gen())
		if err != nil {
			t.Fatal(err)
		}
		for _, raw := range [][]byte{str, in, []byte(`[{"type":"text","text":` + string(str) + `},{"type":"text","text":"b"}]`)} {
			if got, want := previewBytes(appendResultText(nil, raw), PreviewRunes), preview(refResultText(raw), PreviewRunes); got != want {
				t.Fatalf("tool_result preview of %q:\n  %q\nwant\n  %q", raw, got, want)
			}
		}
		if got, want := clipBytes(in, 50, 120), clip(string(in), 50, 120); got != want {
			t.Fatalf("clipBytes(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestEmptyOutputHash: the constant the output chain starts from is the
// hash of nothing.
func TestEmptyOutputHash(t *testing.T) {
	if got := shortHash(nil); got != emptyOutputHash {
		t.Fatalf("shortHash(nil) = %s, emptyOutputHash = %s", got, emptyOutputHash)
	}
}

// refCompact is appendCompact's reference: the first max bytes of
// refCompactJSON, the byte-at-a-time compaction, appended to dst.
func refCompact(dst, raw []byte, max int) []byte {
	c := refCompactJSON(raw)
	return append(dst, c[:min(max, len(c))]...)
}

// TestAppendCompactEqualsItsReference: on generated bytes (JSON and
// not: open strings, runs of backslashes, white space inside and outside
// strings) and every max up to past their length, appendCompact appends
// exactly what the byte-at-a-time reference does, after a prefix already
// in dst.
func TestAppendCompactEqualsItsReference(t *testing.T) {
	t.Parallel()
	parts := []string{"a", " ", "  ", "\t", "\n", "\r", `"`, `\`, `\\`, `\"`, `\\"`, `\\\"`, "é", "\xff", "{", "}", ":", ",", "1.5", strings.Repeat("x", 90), `"a b"`}
	rnd := rand.New(rand.NewPCG(5, 6))
	for range 3000 {
		var b strings.Builder
		for range rnd.IntN(24) {
			b.WriteString(parts[rnd.IntN(len(parts))])
		}
		in := []byte(b.String())
		for _, max := range []int{0, 1, 2, 7, rnd.IntN(len(in) + 2), len(in) - 1, len(in), len(in) + 5} {
			if max < 0 {
				continue
			}
			got, want := appendCompact([]byte("p:"), in, max), refCompact([]byte("p:"), in, max)
			if !bytes.Equal(got, want) {
				t.Fatalf("appendCompact(%q, max %d) = %q, want %q", in, max, got, want)
			}
		}
	}
}
