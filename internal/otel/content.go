package otel

import (
	"strings"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/turnstone-dev/turnstone/events"
)

// DefaultMaxContentBytes bounds each text captured into a message part
// (MapConfig.MaxContentBytes): longer texts are cut at a character
// boundary and end with "…".
const DefaultMaxContentBytes = 8192

// maxParts bounds the parts of one captured message list.
const maxParts = 64

// The message parts of gen_ai.input.messages and gen_ai.output.messages,
// in the shapes of the conventions' JSON schemas
// (docs/gen-ai/gen-ai-input-messages.json and
// gen-ai-output-messages.json): text, reasoning, tool_call,
// tool_call_response, and a generic part naming any other block type.
type msgPart struct {
	Type      string         `json:"type"`
	Content   string         `json:"content,omitempty"`
	ID        string         `json:"id,omitempty"`
	Name      string         `json:"name,omitempty"`
	Arguments jsontext.Value `json:"arguments,omitempty"`
	Response  *string        `json:"response,omitempty"`
}

// chatMessage is one message of gen_ai.input.messages or
// gen_ai.output.messages.
type chatMessage struct {
	Role         string    `json:"role"`
	Parts        []msgPart `json:"parts"`
	FinishReason string    `json:"finish_reason,omitempty"`
}

// clipText returns s cut to at most max bytes at a character boundary,
// ending with "…" when cut.
func clipText(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// parts turns content blocks into message parts; the text they carry is
// the masked text of the log (events are masked when they are stored),
// each text clipped to max bytes.
func parts(blocks []events.ContentBlock, max int) []msgPart {
	out := make([]msgPart, 0, len(blocks))
	for i := range blocks {
		b := &blocks[i]
		switch b.Type {
		case events.BlockText:
			out = append(out, msgPart{Type: "text", Content: clipText(b.Text, max)})
		case events.BlockThinking:
			out = append(out, msgPart{Type: "reasoning", Content: clipText(b.Thinking, max)})
		case events.BlockToolUse:
			out = append(out, msgPart{Type: "tool_call", ID: b.ID, Name: b.Name, Arguments: rawOrString(b.Input, max)})
		case events.BlockToolResult:
			r := clipText(resultText(b.Content), max)
			out = append(out, msgPart{Type: "tool_call_response", ID: b.ToolUseID, Response: &r})
		default:
			out = append(out, msgPart{Type: b.Type})
		}
	}
	return out
}

// rawOrString returns raw (a JSON value) when it fits max bytes, else its
// start as a JSON string.
func rawOrString(raw []byte, max int) jsontext.Value {
	if len(raw) == 0 {
		return nil
	}
	if len(raw) <= max && jsontext.Value(raw).IsValid() {
		return jsontext.Value(raw)
	}
	s, err := jsontext.AppendQuote(nil, clipText(string(raw), max))
	if err != nil {
		return nil
	}
	return jsontext.Value(s)
}

// resultText returns a tool_result's content as text: the string, or the
// text blocks of an array joined by newlines.
func resultText(raw []byte) string {
	if len(raw) == 0 {
		return ""
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s
	}
	var blocks []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return ""
	}
	var texts []string
	for _, b := range blocks {
		if b.Type == events.BlockText && b.Text != "" {
			texts = append(texts, b.Text)
		}
	}
	return strings.Join(texts, "\n")
}

// messagesJSON encodes msgs as the conventions' JSON string ("" when
// there is nothing to say).
func messagesJSON(msgs []chatMessage) string {
	if len(msgs) == 0 {
		return ""
	}
	b, err := json.Marshal(msgs, json.Deterministic(true))
	if err != nil {
		return ""
	}
	return string(b)
}
