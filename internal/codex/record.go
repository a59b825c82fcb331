package codex

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	json "github.com/go-json-experiment/json/v1"

	"github.com/turnstone-dev/turnstone/internal/importer"
)

// Line types of a rollout (RolloutItem's tags in codex-rs/protocol).
const (
	typeSessionMeta = "session_meta"
	typeTurnContext = "turn_context"
	typeResponse    = "response_item"
	typeEvent       = "event_msg"
	typeCompacted   = "compacted"
)

// line is one parsed rollout line: {timestamp, type, payload} (and, since
// 0.146, ordinal). kind is the payload's own "type" for response_item and
// event_msg lines.
type line struct {
	n       int
	time    time.Time // the line's timestamp, or the latest readable one before it
	typ     string
	kind    string
	payload json.RawMessage
}

// key is the line's event id key: its line number, which a grown file
// keeps (Codex appends to a rollout, never rewrites it).
func (l *line) key() string { return fmt.Sprintf("L%d", l.n) }

// rawLine is a rollout line's envelope.
type rawLine struct {
	Timestamp json.RawMessage `json:"timestamp"`
	Type      string          `json:"type"`
	Payload   json.RawMessage `json:"payload"`
}

// parseLine parses one rollout line. It returns an error wrapping
// importer.ErrMalformedRecord when the line is not a JSON object with a
// string type. A timestamp that is missing or not RFC 3339 is not an
// error: the line takes the time of the line before it (prev).
func parseLine(b []byte, n int, prev time.Time) (*line, error) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil, malformed("blank line")
	}
	if b[0] != '{' {
		return nil, malformed("not a JSON object")
	}
	var raw rawLine
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, malformed("%s", jsonProblem(err))
	}
	if raw.Type == "" {
		return nil, malformed(`no "type"`)
	}
	l := &line{n: n, time: prev, typ: raw.Type, payload: raw.Payload}
	var ts string
	if json.Unmarshal(raw.Timestamp, &ts) == nil {
		if t, err := time.Parse(time.RFC3339Nano, ts); err == nil {
			l.time = t.UTC()
		}
	}
	if raw.Type == typeResponse || raw.Type == typeEvent {
		var h struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(raw.Payload, &h)
		l.kind = h.Type
	}
	return l, nil
}

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", importer.ErrMalformedRecord, fmt.Sprintf(format, args...))
}

// jsonProblem shortens encoding/json errors to what a person can act on.
func jsonProblem(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("bad JSON at byte %d: %v", se.Offset, se)
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("field %q is a JSON %s, want %s", te.Field, te.Value, te.Type)
	}
	return err.Error()
}

// decode reads a payload leniently: a field of another shape than the one
// wanted is left zero, never an error (a payload is read only as far as
// the conversion needs it, and newer versions change shapes).
func decode[T any](raw json.RawMessage) T {
	var v T
	if err := json.Unmarshal(raw, &v); err != nil {
		// Retry field by field: keep what parses.
		var fields map[string]json.RawMessage
		if json.Unmarshal(raw, &fields) == nil {
			for k, f := range fields {
				if one, err := json.Marshal(map[string]json.RawMessage{k: f}); err == nil {
					_ = json.Unmarshal(one, &v) // what does not parse stays zero
				}
			}
		}
	}
	return v
}

// sessionMeta is session_meta's payload (SessionMeta in
// codex-rs/protocol): the thread's identity and origin.
type sessionMeta struct {
	ID            string          `json:"id"`
	Timestamp     string          `json:"timestamp"`
	CWD           string          `json:"cwd"`
	Originator    string          `json:"originator"`
	CLIVersion    string          `json:"cli_version"`
	Source        json.RawMessage `json:"source"`
	ModelProvider string          `json:"model_provider"`
	Model         string          `json:"model"`
	ForkedFromID  string          `json:"forked_from_id"`
	ParentThread  string          `json:"parent_thread_id"`
	Git           struct {
		CommitHash string `json:"commit_hash"`
		Branch     string `json:"branch"`
	} `json:"git"`
}

// source returns the session's source as a label ("cli", "vscode",
// "exec", "subagent"), and the parent thread of a subagent.
func (m *sessionMeta) source() (label, parent string) {
	var s string
	if json.Unmarshal(m.Source, &s) == nil {
		return s, m.ParentThread
	}
	var obj struct {
		Subagent json.RawMessage `json:"subagent"`
	}
	if json.Unmarshal(m.Source, &obj) == nil && len(obj.Subagent) > 0 {
		var spawn struct {
			ThreadSpawn struct {
				ParentThreadID string `json:"parent_thread_id"`
			} `json:"thread_spawn"`
		}
		_ = json.Unmarshal(obj.Subagent, &spawn)
		parent = spawn.ThreadSpawn.ParentThreadID
		if parent == "" {
			parent = m.ParentThread
		}
		return "subagent", parent
	}
	return "", m.ParentThread
}

// turnContext is turn_context's payload: the settings of the next model
// requests.
type turnContext struct {
	TurnID string `json:"turn_id"`
	Model  string `json:"model"`
	CWD    string `json:"cwd"`
}

// responseItem is a response_item's payload (ResponseItem in
// codex-rs/protocol/src/models.rs), as far as the conversion reads it.
type responseItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	Summary   json.RawMessage `json:"summary"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
	Input     json.RawMessage `json:"input"`
	CallID    string          `json:"call_id"`
	ID        string          `json:"id"`
	Action    json.RawMessage `json:"action"`
	Output    json.RawMessage `json:"output"`
	Status    string          `json:"status"`
	Tools     json.RawMessage `json:"tools"`
	Prompt    string          `json:"revised_prompt"`
}

// callID is the item's call id: call_id, else (a local_shell_call of the
// chat completions API) its id.
func (it *responseItem) callID() string {
	if it.CallID != "" {
		return it.CallID
	}
	return it.ID
}

// tokenUsage is one TokenUsage of a token_count event.
type tokenUsage struct {
	InputTokens           int64 `json:"input_tokens"`
	CachedInputTokens     int64 `json:"cached_input_tokens"`
	OutputTokens          int64 `json:"output_tokens"`
	ReasoningOutputTokens int64 `json:"reasoning_output_tokens"`
	TotalTokens           int64 `json:"total_tokens"`
}

// eventMsg is an event_msg's payload, as far as the conversion reads it.
type eventMsg struct {
	Type    string          `json:"type"`
	TurnID  string          `json:"turn_id"`
	Reason  string          `json:"reason"`
	Message string          `json:"message"`
	Error   json.RawMessage `json:"error"`
	Info    *struct {
		Total tokenUsage `json:"total_token_usage"`
		Last  tokenUsage `json:"last_token_usage"`
	} `json:"info"`
	CodexErrorInfo json.RawMessage `json:"codex_error_info"`
	CallID         string          `json:"call_id"`
	ExitCode       *int64          `json:"exit_code"`
	Success        *bool           `json:"success"`
	Status         string          `json:"status"`
	Result         json.RawMessage `json:"result"`
	DurationMS     *int64          `json:"duration_ms"`
}

// compacted is a compacted line's payload: the summary (older versions)
// and the history that replaced the compacted one (newer versions).
type compacted struct {
	Message            string            `json:"message"`
	ReplacementHistory []json.RawMessage `json:"replacement_history"`
}
