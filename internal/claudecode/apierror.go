package claudecode

import (
	"bytes"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	json "github.com/go-json-experiment/json/v1"

	"github.com/turnstone-dev/turnstone/events"
)

// providerAnthropic is the provider Claude Code calls.
const providerAnthropic = "anthropic"

// apiStatusRe finds the HTTP status in the text Claude Code writes for a
// failed model call: "API Error: 529 {...}".
var apiStatusRe = regexp.MustCompile(`API Error:?\s*\(?(\d{3})\b`)

// apiErrorInfo describes an API error record: an assistant record with
// isApiErrorMessage true or an "error" field (the call failed for good), or
// a system api_error record (Claude Code 2.x: a failed attempt it retries,
// with retryAttempt and maxRetries). Claude Code writes the
// provider's answer into the message text ("API Error: 529
// {"type":"error","error":{"type":"overloaded_error",...}}") and, in 2.x,
// the HTTP status as apiErrorStatus and its own category as "error"
// ("rate_limit", "server_error", "authentication_failed"). Message is the
// text; HTTPStatus comes from apiErrorStatus, an "error" object's status or
// the text; Code is the provider's error type from the text's JSON, else
// the "error" field's; Kind follows classifyAPIError.
func apiErrorInfo(r *record) events.ErrorInfo {
	var texts []string
	for _, b := range r.blocks {
		if b.Type == events.BlockText && strings.TrimSpace(b.Text) != "" {
			texts = append(texts, b.Text)
		}
	}
	info := events.ErrorInfo{
		Message:  strings.Join(texts, "\n"),
		Provider: providerAnthropic,
	}

	// apiErrorStatus: a number (or a numeric string).
	if st := r.errStatus; st != nil {
		var n json.Number
		if json.Unmarshal(st, &n) == nil {
			if v, err := n.Int64(); err == nil {
				info.HTTPStatus = int(v)
			}
		} else {
			var s string
			if json.Unmarshal(st, &s) == nil {
				info.HTTPStatus, _ = strconv.Atoi(strings.TrimSpace(s))
			}
		}
	}

	// "error": a category string, or an object with a status and the
	// provider's error body, possibly wrapped ({"type":"error","error":
	// {"type":"overloaded_error","message":...}}).
	var category string
	if e := r.errField; e != nil {
		switch e[0] {
		case '"':
			_ = json.Unmarshal(e, &category)
		case '{':
			var body errorBody
			if json.Unmarshal(e, &body) == nil {
				if v, err := body.Status.Int64(); err == nil && info.HTTPStatus == 0 {
					info.HTTPStatus = int(v)
				}
				typ, msg := body.innermost()
				category = typ
				if info.Message == "" {
					info.Message = msg
				}
			}
		}
	}

	if info.Message == "" {
		info.Message = r.sysText
	}
	if info.HTTPStatus == 0 {
		if m := apiStatusRe.FindStringSubmatch(info.Message); m != nil {
			info.HTTPStatus, _ = strconv.Atoi(m[1])
		}
	}
	if info.HTTPStatus < 100 || info.HTTPStatus > 599 {
		info.HTTPStatus = 0
	}
	info.Code = providerErrorType(info.Message)
	if info.Code == "" {
		info.Code = category
	}
	if strings.TrimSpace(info.Message) == "" {
		info.Message = "API error"
		if info.HTTPStatus != 0 {
			info.Message += " " + strconv.Itoa(info.HTTPStatus)
		}
		if category != "" {
			info.Message += ": " + category
		}
	}
	if r.retryAttempt > 0 {
		retry := fmt.Sprintf(" (retry %d", r.retryAttempt)
		if r.maxRetries > 0 {
			retry += fmt.Sprintf(" of %d", r.maxRetries)
		}
		info.Message += retry + ")"
	}
	info.Kind = classifyAPIError(info.HTTPStatus, info.Code, info.Message)
	return info
}

// errorBody is an error object as Claude Code and the Anthropic API nest
// them: a status, a type, a message and the error it wraps.
type errorBody struct {
	Status  json.Number `json:"status"`
	Type    string      `json:"type"`
	Message string      `json:"message"`
	Error   *errorBody  `json:"error"`
}

// innermost returns the most specific error type (the innermost one that
// is not a wrapper's "error") and message of b's chain.
func (b *errorBody) innermost() (typ, msg string) {
	for e, depth := b, 0; e != nil && depth < 8; e, depth = e.Error, depth+1 {
		if e.Type != "" && e.Type != "error" {
			typ = e.Type
		}
		if e.Message != "" {
			msg = e.Message
		}
	}
	return typ, msg
}

// providerErrorType returns error.type from the first JSON object in text
// that has the Anthropic error shape {"type":"error","error":{"type":...}},
// or "". It tries the first maxErrorObjects opening braces of the first
// maxErrorText bytes: each try decodes up to the end of what it reads, so
// an unbounded search of a message of nested objects ({"a":{"a":...)
// took time quadratic in its length (20 s for 80 KB; an API error's body
// comes first in its message).
func providerErrorType(text string) string {
	if len(text) > maxErrorText {
		text = text[:maxErrorText]
	}
	tries := 0
	for i := strings.IndexByte(text, '{'); i >= 0 && tries < maxErrorObjects; tries++ {
		dec := json.NewDecoder(strings.NewReader(text[i:]))
		var obj struct {
			Type  string `json:"type"`
			Error *struct {
				Type string `json:"type"`
			} `json:"error"`
		}
		if dec.Decode(&obj) == nil && obj.Error != nil && obj.Error.Type != "" {
			return obj.Error.Type
		}
		j := strings.IndexByte(text[i+1:], '{')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return ""
}

// The bounds of providerErrorType's search.
const (
	maxErrorText    = 64 << 10
	maxErrorObjects = 16
)

// Provider error types and Claude Code error categories by retry class,
// from the Anthropic API's documented errors
// (https://docs.anthropic.com/en/api/errors) and Claude Code's "error"
// field values.
var (
	transientCodes = map[string]bool{
		"overloaded_error": true, "rate_limit_error": true, "api_error": true, "timeout_error": true,
		"rate_limit": true, "server_error": true, "overloaded": true, "timeout": true,
	}
	logicCodes = map[string]bool{
		"invalid_request_error": true, "authentication_error": true, "permission_error": true,
		"not_found_error": true, "request_too_large": true, "billing_error": true,
		"authentication_failed": true, "invalid_request": true, "billing": true,
	}
	transientWords = []string{"overloaded", "timeout", "timed out", "etimedout", "econnreset", "econnrefused",
		"connection error", "socket hang up", "rate limit", "temporarily", "stalled"}
)

// classifyAPIError says whether a failed model call is worth retrying:
// transient for 408, 429 and 5xx (529 is Anthropic's "overloaded"), for
// overload, rate-limit and server error types, and for timeouts and broken
// connections; logic for the other 4xx and for request, authentication,
// permission and billing error types; unknown otherwise.
func classifyAPIError(status int, code, message string) events.ErrorKind {
	switch {
	case status == 408 || status == 429 || status >= 500:
		return events.KindTransient
	case status >= 400:
		return events.KindLogic
	}
	c := strings.ToLower(code)
	switch {
	case transientCodes[c]:
		return events.KindTransient
	case logicCodes[c]:
		return events.KindLogic
	}
	m := strings.ToLower(message)
	for _, w := range transientWords {
		if strings.Contains(m, w) {
			return events.KindTransient
		}
	}
	return events.KindUnknown
}

// toolDurationMS reads a tool call's duration, in milliseconds, from the
// runtime's toolUseResult (durationMs, totalDurationMs for Task, or
// durationSeconds for WebSearch); ok is false when it carries none.
func toolDurationMS(raw json.RawMessage) (ms int64, ok bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return 0, false
	}
	var d struct {
		DurationMS      *float64 `json:"durationMs"`
		TotalDurationMS *float64 `json:"totalDurationMs"`
		DurationSeconds *float64 `json:"durationSeconds"`
	}
	if json.Unmarshal(raw, &d) != nil {
		return 0, false
	}
	var v float64
	switch {
	case d.DurationMS != nil:
		v = *d.DurationMS
	case d.TotalDurationMS != nil:
		v = *d.TotalDurationMS
	case d.DurationSeconds != nil:
		v = *d.DurationSeconds * 1000
	default:
		return 0, false
	}
	if v < 0 || v > 1e15 {
		return 0, false
	}
	return int64(v), true
}

// toolResultAgentID reads the agentId a Task tool call's toolUseResult
// names (Claude Code 2.1), or "".
func toolResultAgentID(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return ""
	}
	var d struct {
		AgentID string `json:"agentId"`
	}
	if json.Unmarshal(raw, &d) != nil {
		return ""
	}
	return d.AgentID
}
