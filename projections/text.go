package projections

import (
	"encoding/json"
	"strings"
	"unicode/utf8"

	"github.com/turnstone-dev/turnstone/events"
)

// preview returns the first n runes of s, with invalid UTF-8 replaced, and
// "…" when it cut.
func preview(s string, n int) string {
	s = validKey(s)
	i := 0
	for j := range s {
		if i == n {
			return s[:j] + "…"
		}
		i++
	}
	return s
}

// validKey returns s with every byte of invalid UTF-8 replaced by U+FFFD,
// exactly as encoding/json does, so that ids compare the same before and
// after a JSON round trip.
func validKey(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// rawPrefix is how much of a raw JSON value the previews read: enough for
// PreviewRunes runes even if each is a 12-byte escaped surrogate pair.
const rawPrefix = 12*PreviewRunes + 64

// digest returns the Block for a content block.
func digest(cb *events.ContentBlock) Block {
	b := Block{Type: cb.Type}
	switch cb.Type {
	case events.BlockText:
		b.Text, b.Size = preview(cb.Text, PreviewRunes), len(cb.Text)
	case events.BlockThinking:
		b.Text, b.Size = preview(cb.Thinking, PreviewRunes), len(cb.Thinking)
	case events.BlockToolUse:
		b.ID, b.Name = validKey(cb.ID), cb.Name
		b.Text, b.Size = preview(compactPrefix(cb.Input, rawPrefix), PreviewRunes), len(cb.Input)
	case events.BlockToolResult:
		b.ToolUseID, b.IsError = validKey(cb.ToolUseID), cb.IsError
		b.Text, b.Size = preview(resultText(cb.Content), PreviewRunes), len(cb.Content)
	default:
		b.Text = preview(cb.Text, PreviewRunes)
		b.Size = len(cb.Text) + len(cb.Thinking) + len(cb.Data) + len(cb.Input) + len(cb.Content) + len(cb.Source)
	}
	return b
}

// compactPrefix returns about the first max bytes of the JSON value raw
// with the white space outside strings removed, without reading further.
func compactPrefix(raw []byte, max int) string {
	var b strings.Builder
	inString, escaped := false, false
	for _, c := range raw {
		if b.Len() >= max {
			break
		}
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

// compactJSON returns raw with the white space outside strings removed.
func compactJSON(raw json.RawMessage) string { return compactPrefix(raw, len(raw)) }

// resultText returns the start of a tool_result's content as text: the
// string, or the text blocks of an array joined by newlines. Only the
// first rawPrefix bytes of a string are decoded.
func resultText(raw json.RawMessage) string {
	raw = trimSpace(raw)
	if len(raw) == 0 {
		return ""
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(stringPrefix(raw, rawPrefix), &s); err != nil {
			return ""
		}
		return s
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

// stringPrefix returns the JSON string raw cut, at a character boundary of
// the encoding, after about max bytes, and closed with a quote.
func stringPrefix(raw []byte, max int) []byte {
	if len(raw) <= max {
		return raw
	}
	i := 1
	for i < max && i < len(raw)-1 {
		switch {
		case raw[i] == '\\' && i+1 < len(raw) && raw[i+1] == 'u':
			i += 6
		case raw[i] == '\\':
			i += 2
		default:
			i++
		}
	}
	if i > len(raw)-1 {
		return raw
	}
	out := make([]byte, 0, i+1)
	out = append(out, raw[:i]...)
	return append(out, '"')
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\n' || b[0] == '\r') {
		b = b[1:]
	}
	return b
}
