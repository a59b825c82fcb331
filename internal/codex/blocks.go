package codex

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"

	json "github.com/go-json-experiment/json/v1"

	"github.com/turnstone-dev/turnstone/events"
)

// contentItem is one item of a message's content, or of a tool output
// given as an array (ContentItem, FunctionCallOutputContentItem).
type contentItem struct {
	Type     string          `json:"type"`
	Text     string          `json:"text"`
	ImageURL json.RawMessage `json:"image_url"`
	Refusal  string          `json:"refusal"`
}

// contentBlocks converts a message's content (an array of content items;
// a string in some shapes) to content blocks in the Anthropic shapes:
// input_text, output_text and refusal become text blocks, input_image an
// image block (a data: URL as a base64 source, any other as a url source;
// an image without a URL is left out). Other item types are kept as a
// block of their own type.
func contentBlocks(raw json.RawMessage) []events.ContentBlock {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) == nil && s != "" {
			return []events.ContentBlock{{Type: events.BlockText, Text: s}}
		}
		return nil
	}
	var items []contentItem
	if raw[0] == '{' {
		var one contentItem
		if json.Unmarshal(raw, &one) != nil {
			return nil
		}
		items = []contentItem{one}
	} else if json.Unmarshal(raw, &items) != nil {
		var loose []json.RawMessage
		if json.Unmarshal(raw, &loose) != nil {
			return nil
		}
		for _, l := range loose {
			var it contentItem
			if json.Unmarshal(l, &it) == nil {
				items = append(items, it)
			}
		}
	}
	var out []events.ContentBlock
	for _, it := range items {
		switch it.Type {
		case "input_text", "output_text", "text":
			if it.Text != "" {
				out = append(out, events.ContentBlock{Type: events.BlockText, Text: it.Text})
			}
		case "refusal":
			if it.Refusal != "" {
				out = append(out, events.ContentBlock{Type: events.BlockText, Text: it.Refusal})
			}
		case "input_image":
			if b, ok := imageBlock(it.ImageURL); ok {
				out = append(out, b)
			}
		case "":
		default:
			out = append(out, events.ContentBlock{Type: it.Type, Text: it.Text})
		}
	}
	return out
}

// imageBlock converts an input_image's image_url to an image block.
func imageBlock(raw json.RawMessage) (events.ContentBlock, bool) {
	var url string
	if json.Unmarshal(raw, &url) != nil || url == "" {
		return events.ContentBlock{}, false
	}
	var src any
	if rest, ok := strings.CutPrefix(url, "data:"); ok {
		media, data, found := strings.Cut(rest, ";base64,")
		if !found {
			return events.ContentBlock{}, false
		}
		src = map[string]string{"type": "base64", "media_type": media, "data": data}
	} else {
		src = map[string]string{"type": "url", "url": url}
	}
	return events.ContentBlock{Type: "image", Source: marshalOr(src, `{}`)}, true
}

// textOf is the text of content blocks, joined by newlines.
func textOf(blocks []events.ContentBlock) string {
	var parts []string
	for _, b := range blocks {
		if b.Type == events.BlockText {
			parts = append(parts, b.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// reasoningBlock converts a reasoning item to a thinking block: its
// summary texts (and its raw reasoning text, when Codex kept it), or
// nothing when it holds only encrypted content.
func reasoningBlock(it *responseItem) (events.ContentBlock, bool) {
	var parts []string
	for _, raw := range []json.RawMessage{it.Summary, it.Content} {
		var items []contentItem
		if json.Unmarshal(raw, &items) != nil {
			continue
		}
		for _, c := range items {
			if c.Text != "" {
				parts = append(parts, c.Text)
			}
		}
	}
	if len(parts) == 0 {
		return events.ContentBlock{}, false
	}
	return events.ContentBlock{Type: events.BlockThinking, Thinking: strings.Join(parts, "\n\n")}, true
}

// toolInput makes a call's arguments a tool_use input object: the
// arguments when they are a JSON object (function_call's arguments are a
// string holding JSON), else {key: the string or value as written}.
func toolInput(raw json.RawMessage, key string) json.RawMessage {
	raw = bytes.TrimSpace(raw)
	var s string
	if len(raw) > 0 && raw[0] == '"' && json.Unmarshal(raw, &s) == nil {
		t := strings.TrimSpace(s)
		if strings.HasPrefix(t, "{") && json.Valid([]byte(t)) {
			return json.RawMessage(t)
		}
		return marshalOr(map[string]string{key: s}, `{}`)
	}
	if len(raw) > 0 && raw[0] == '{' && json.Valid(raw) {
		return raw
	}
	if len(raw) == 0 || string(raw) == "null" {
		return json.RawMessage("{}")
	}
	if b, err := json.Marshal(map[string]json.RawMessage{key: raw}); err == nil {
		return b
	}
	return marshalOr(map[string]string{key: string(raw)}, `{}`) // raw is not JSON: kept as written
}

// marshalOr returns v encoded, or the JSON fallback when it cannot be,
// never nil: a block's value stays valid JSON. (Strings and maps of
// strings do not fail: invalid UTF-8 is written as U+FFFD, encoding/json's
// rule; a value holding raw JSON fails when that is invalid.)
func marshalOr(v any, fallback string) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		return []byte(fallback)
	}
	return b
}

// The block type of the calls Codex's model provider runs itself (no
// output to wait for), after the Anthropic Messages API's server tools:
// they are part of the assistant message, never tool_use blocks.
const blockServerToolUse = "server_tool_use"

// serverToolBlock converts a web_search_call, image_generation_call or
// tool_search_call to a server_tool_use block (name web_search,
// image_generation or tool_search; input its action or arguments).
func serverToolBlock(it *responseItem) events.ContentBlock {
	name := strings.TrimSuffix(it.Type, "_call")
	var in json.RawMessage
	switch {
	case len(bytes.TrimSpace(it.Action)) > 0 && bytes.TrimSpace(it.Action)[0] == '{':
		in = it.Action
	case len(it.Arguments) > 0:
		in = toolInput(it.Arguments, "arguments")
	case it.Prompt != "":
		in = marshalOr(map[string]string{"revised_prompt": it.Prompt}, `{}`)
	}
	id := it.callID()
	if id == "" {
		id = name
	}
	return events.ContentBlock{Type: blockServerToolUse, ID: id, Name: name, Input: []byte(in)}
}

// output is a tool output converted: its content (a string, or an array
// of content blocks), and whether it reports a failure.
type output struct {
	content json.RawMessage
	text    string
	isError bool
	known   bool // the output itself says whether it failed
}

var exitCodeRE = regexp.MustCompile(`(?m)^(?:Process exited with code|Exit code:)\s*(-?\d+)`)

// parseOutput converts a *_output item's output: a string; an array of
// content items; one content item (0.146); or an object {content, success}
// (the failure shape of FunctionCallOutputPayload). Its error flag, when
// the output says it, comes from success, else from "exited with code N"
// (Codex's exec output: "Process exited with code N", "Exit code: N"),
// else from metadata.exit_code (the shell tool's JSON output of 0.77).
func parseOutput(raw json.RawMessage) output {
	raw = bytes.TrimSpace(raw)
	var o output
	switch {
	case len(raw) == 0 || string(raw) == "null":
		o.content = json.RawMessage(`""`)
	case raw[0] == '"':
		var s string
		_ = json.Unmarshal(raw, &s)
		o.text = s
		o.content = marshalOr(s, `""`)
	case raw[0] == '[':
		blocks := contentBlocks(raw)
		if len(blocks) == 0 {
			o.content = json.RawMessage(`""`)
		} else {
			o.text = textOf(blocks)
			var err error
			if o.content, err = json.Marshal(blocks); err != nil {
				o.content = marshalOr(o.text, `""`) // a block's raw value was invalid: its text
			}
		}
	case raw[0] == '{':
		var obj struct {
			Content json.RawMessage `json:"content"`
			Success *bool           `json:"success"`
			Type    string          `json:"type"`
		}
		_ = json.Unmarshal(raw, &obj)
		if obj.Type != "" {
			return parseOutput(append(append(json.RawMessage("["), raw...), ']'))
		}
		o = parseOutput(obj.Content)
		if obj.Success != nil {
			o.isError, o.known = !*obj.Success, true
			return o
		}
	default:
		o.content = marshalOr(string(raw), `""`)
		o.text = string(raw)
	}
	if o.known {
		return o
	}
	head := o.text
	if len(head) > 4096 {
		head = head[:4096]
	}
	if m := exitCodeRE.FindStringSubmatch(head); m != nil {
		code, _ := strconv.Atoi(m[1])
		o.isError, o.known = code != 0, true
		return o
	}
	var shell struct {
		Metadata *struct {
			ExitCode *int64 `json:"exit_code"`
		} `json:"metadata"`
	}
	if strings.HasPrefix(strings.TrimSpace(o.text), "{") && json.Unmarshal([]byte(o.text), &shell) == nil && shell.Metadata != nil && shell.Metadata.ExitCode != nil {
		o.isError, o.known = *shell.Metadata.ExitCode != 0, true
	}
	return o
}

// endFailed reads whether a *_end event (exec_command_end,
// patch_apply_end, mcp_tool_call_end, ...) says its call failed, and
// whether it says anything.
func endFailed(ev *eventMsg) (failed, known bool) {
	switch {
	case ev.ExitCode != nil:
		return *ev.ExitCode != 0, true
	case ev.Success != nil:
		return !*ev.Success, true
	case len(ev.Result) > 0:
		var r struct {
			Ok *struct {
				IsError bool `json:"isError"`
			} `json:"Ok"`
			Err json.RawMessage `json:"Err"`
		}
		if json.Unmarshal(ev.Result, &r) == nil {
			if r.Err != nil {
				return true, true
			}
			if r.Ok != nil {
				return r.Ok.IsError, true
			}
		}
	case ev.Status == "failed" || ev.Status == "error":
		return true, true
	case ev.Status == "completed":
		return false, true
	}
	return false, false
}

// codexError converts an error (an error event, or task_complete's error)
// to the event model's error object: message; code, the kind of
// codex_error_info (a name, or an object of one name with details, such
// as {"http_connection_failed":{"http_status_code":502}}); its HTTP
// status; kind transient for overload, connection, stream, server and
// usage-limit errors and 408, 429 and 5xx statuses, logic for
// unauthorized, bad request, context window and sandbox errors and other
// 4xx, else unknown (CodexErrorInfo in codex-rs/protocol).
func codexError(message string, info json.RawMessage, provider string) events.ErrorInfo {
	e := events.ErrorInfo{Message: message, Provider: provider, Kind: events.KindUnknown}
	if e.Message == "" {
		e.Message = "codex error"
	}
	info = bytes.TrimSpace(info)
	var name string
	if json.Unmarshal(info, &name) != nil {
		var obj map[string]json.RawMessage
		if json.Unmarshal(info, &obj) == nil {
			for k, v := range obj {
				name = k
				var d struct {
					Snake *int `json:"http_status_code"`
					Camel *int `json:"httpStatusCode"`
				}
				if json.Unmarshal(v, &d) == nil {
					if d.Snake != nil {
						e.HTTPStatus = *d.Snake
					} else if d.Camel != nil {
						e.HTTPStatus = *d.Camel
					}
				}
				break
			}
		}
	}
	name = snake(name)
	if len(name) > 100 {
		name = name[:100]
	}
	e.Code = name
	if e.HTTPStatus < 100 || e.HTTPStatus > 599 {
		e.HTTPStatus = 0
	}
	switch name {
	case "server_overloaded", "http_connection_failed", "response_stream_connection_failed", "internal_server_error",
		"response_stream_disconnected", "response_too_many_failed_attempts", "usage_limit_exceeded":
		e.Kind = events.KindTransient
	case "unauthorized", "bad_request", "context_window_exceeded", "sandbox_error", "thread_rollback_failed", "cyber_policy":
		e.Kind = events.KindLogic
	}
	switch s := e.HTTPStatus; {
	case s == 408 || s == 429 || s >= 500:
		e.Kind = events.KindTransient
	case s >= 400 && e.Kind == events.KindUnknown:
		e.Kind = events.KindLogic
	}
	return e
}

// snake turns a camelCase name (the app-server's spelling) into
// snake_case (the rollout's).
func snake(s string) string {
	var b strings.Builder
	for i, r := range s {
		if r >= 'A' && r <= 'Z' {
			if i > 0 {
				b.WriteByte('_')
			}
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}
