package claudecode

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"time"

	json "github.com/go-json-experiment/json/v1"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/importer"
)

// Record types (the "type" field) and system subtypes of a Claude Code
// transcript line, as written by Claude Code 1.0.x-2.1.x.
const (
	recUser       = "user"
	recAssistant  = "assistant"
	recSystem     = "system"
	recProgress   = "progress"
	subCompact    = "compact_boundary"
	subTurnDur    = "turn_duration"
	subStopHook   = "stop_hook_summary"
	subLocalCmd   = "local_command"
	subAPIError   = "api_error"
	progressAgent = "agent_progress"
)

// header is what is read of a line that does not fit rawRecord: a record of
// a type the conversion skips may have fields of other shapes.
type header struct {
	Type    string `json:"type"`
	Subtype string `json:"subtype"`
}

// rawRecord is the shape of a transcript record, as far as this package
// reads it. Fields it does not read are left out; fields whose JSON type
// varies between Claude Code versions or record types are kept raw.
type rawRecord struct {
	Type              string          `json:"type"`
	Subtype           string          `json:"subtype"`
	UUID              string          `json:"uuid"`
	ParentUUID        *string         `json:"parentUuid"`
	SessionID         string          `json:"sessionId"`
	AgentID           string          `json:"agentId"`
	IsSidechain       bool            `json:"isSidechain"`
	IsMeta            bool            `json:"isMeta"`
	IsCompactSummary  bool            `json:"isCompactSummary"`
	IsAPIErrorMessage bool            `json:"isApiErrorMessage"`
	Timestamp         string          `json:"timestamp"`
	Version           string          `json:"version"`
	CWD               string          `json:"cwd"`
	GitBranch         string          `json:"gitBranch"`
	Slug              string          `json:"slug"`
	Message           *apiMessage     `json:"message"`
	ToolUseResult     json.RawMessage `json:"toolUseResult"`
	CompactMetadata   json.RawMessage `json:"compactMetadata"`
	DurationMS        *float64        `json:"durationMs"`
	Error             json.RawMessage `json:"error"`
	APIErrorStatus    json.RawMessage `json:"apiErrorStatus"`
	ParentToolUseID   json.RawMessage `json:"parentToolUseID"`
	Data              json.RawMessage `json:"data"`
	Content           json.RawMessage `json:"content"`
	RetryAttempt      *float64        `json:"retryAttempt"`
	MaxRetries        *float64        `json:"maxRetries"`
}

// apiMessage is the Anthropic Messages API message inside a user or
// assistant record.
type apiMessage struct {
	ID         string   `json:"id"`
	Model      string   `json:"model"`
	Content    *content `json:"content"`
	StopReason *string  `json:"stop_reason"`
	Usage      *usage   `json:"usage"`
}

// content is a message's content: a string, or an array of content blocks
// in the Anthropic shapes. It decodes in the same pass as its record.
type content struct {
	isString bool
	text     string
	blocks   []events.ContentBlock
}

// UnmarshalJSON implements json.Unmarshaler.
func (c *content) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case len(b) == 0 || string(b) == "null":
		return nil
	case b[0] == '"':
		c.isString = true
		return json.Unmarshal(b, &c.text)
	case b[0] == '[':
		var blocks []events.ContentBlock
		if err := json.Unmarshal(b, &blocks); err != nil {
			return fmt.Errorf("content blocks: %s", jsonProblem(err))
		}
		c.blocks = blocks
		if c.blocks == nil {
			c.blocks = []events.ContentBlock{}
		}
		return nil
	}
	return errors.New("content must be a string or an array of content blocks")
}

// usage is the token accounting of an assistant message, in tokens.
type usage struct {
	InputTokens              float64 `json:"input_tokens"`
	OutputTokens             float64 `json:"output_tokens"`
	CacheCreationInputTokens float64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     float64 `json:"cache_read_input_tokens"`
}

// tokens converts a count read as a JSON number to an int64, or 0 when it
// is negative, fractional noise aside, or implausibly large.
func tokens(n float64) int64 {
	if n < 0 || n > 1e15 {
		return 0
	}
	return int64(n)
}

// event is the usage as the event model stores it, or nil when every
// count is zero (Claude Code writes zeros on synthetic and error records).
func (u *usage) event() *events.Usage {
	if u == nil {
		return nil
	}
	e := &events.Usage{
		InputTokens:      tokens(u.InputTokens),
		OutputTokens:     tokens(u.OutputTokens),
		CacheReadTokens:  tokens(u.CacheReadInputTokens),
		CacheWriteTokens: tokens(u.CacheCreationInputTokens),
	}
	if *e == (events.Usage{}) {
		return nil
	}
	return e
}

// contextTokens is the size of the context the message was generated from.
func (u *usage) contextTokens() int64 {
	n := u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens
	if n < 0 || n > 1e15 {
		return 0
	}
	return int64(n)
}

// compactMetadata is a compact_boundary record's description of the
// compaction: what started it ("auto" or "manual") and the context size
// before it, in tokens.
type compactMetadata struct {
	Trigger   string  `json:"trigger"`
	PreTokens float64 `json:"preTokens"`
}

// progressRecord holds what a progress record links: a subagent (agentId)
// to the Task tool call that runs it (parentToolUseID). It is read
// leniently: a progress line whose shape is unexpected links nothing.
type progressRecord struct {
	ParentToolUseID string `json:"parentToolUseID"`
	Data            struct {
		Type    string `json:"type"`
		AgentID string `json:"agentId"`
	} `json:"data"`
}

// userClass is what a user record is, for turn boundaries.
type userClass int

// The classes of user records. See classifyUser for the rules.
const (
	classPrompt           userClass = iota // typed by a person: starts a turn
	classToolResult                        // tool_result blocks answering tool_use blocks
	classMeta                              // isMeta: added by Claude Code (skill text, hook context)
	classCaveat                            // <local-command-caveat>: local commands follow
	classCompactSummary                    // isCompactSummary: the history after a compaction
	classInterruption                      // "[Request interrupted by user...]"
	classCommand                           // <command-name>: a slash command the person typed
	classCommandOutput                     // <local-command-stdout>, <bash-stdout>: a local command's output
	classBashInput                         // <bash-input>: a shell command run with "!", no model call
	classTaskNotification                  // <task-notification>: a background task finished
)

var classNames = [...]string{"prompt", "tool_result", "meta", "caveat", "compact_summary", "interruption", "command", "command_output", "bash_input", "task_notification"}

func (c userClass) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return fmt.Sprintf("class(%d)", int(c))
}

// record is one parsed transcript line.
type record struct {
	line    int
	typ     string
	subtype string

	uuid       string
	parentUUID string
	sessionID  string
	agentID    string
	sidechain  bool
	meta       bool
	compactSum bool
	apiError   bool
	time       time.Time
	version    string
	cwd        string
	gitBranch  string
	slug       string

	// user and assistant records
	msgID      string
	model      string
	stopReason string
	usage      *usage
	blocks     []events.ContentBlock
	text       string // the string content, or the first block's text
	class      userClass
	toolResult json.RawMessage // toolUseResult, the runtime's own account of a tool call

	// API error records, and system api_error records (a retry)
	errField     json.RawMessage
	errStatus    json.RawMessage
	sysText      string
	retryAttempt int
	maxRetries   int

	// system records
	compact    *compactMetadata
	durationMS int64

	// progress records
	progress *progressRecord
}

// history reports whether r is a record the conversion walks: user,
// assistant and system records.
func (r *record) history() bool {
	return r.typ == recUser || r.typ == recAssistant || r.typ == recSystem
}

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformedRecord, fmt.Sprintf(format, args...))
}

// parseRecord parses one transcript line. It returns an error wrapping
// ErrMalformedRecord when the line is not a JSON object, a field the
// conversion reads has the wrong JSON type, or a user, assistant or
// compact_boundary record lacks its uuid, timestamp or content. Records of
// types the conversion skips are read only as far as their type (and, for
// progress records, leniently, their subagent link). It never panics.
func parseRecord(line []byte) (*record, error) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return nil, malformed("blank line")
	}
	if line[0] != '{' {
		return nil, malformed("not a JSON object")
	}
	var raw rawRecord
	if err := json.Unmarshal(line, &raw); err != nil {
		// A record of a type the conversion skips may have fields of other
		// shapes: only its type must be readable.
		var h header
		if herr := json.Unmarshal(line, &h); herr != nil {
			return nil, malformed("%s", jsonProblem(herr))
		}
		switch {
		case h.Type == "":
			return nil, malformed(`no "type"`)
		case h.Type == recUser || h.Type == recAssistant || h.Type == recSystem && h.Subtype == subCompact:
			return nil, malformed("%s record: %s", h.Type, jsonProblem(err))
		}
		r := &record{typ: h.Type, subtype: h.Subtype}
		if h.Type == recProgress {
			r.progress = parseProgress(line)
		}
		return r, nil
	}
	if raw.Type == "" {
		return nil, malformed(`no "type"`)
	}
	r := &record{typ: raw.Type, subtype: raw.Subtype}
	switch raw.Type {
	case recUser, recAssistant, recSystem:
	case recProgress:
		r.progress = progressLink(raw.ParentToolUseID, raw.Data)
		return r, nil
	default:
		return r, nil
	}

	r.uuid = raw.UUID
	if raw.ParentUUID != nil {
		r.parentUUID = *raw.ParentUUID
	}
	r.sessionID = raw.SessionID
	r.agentID = raw.AgentID
	r.sidechain = raw.IsSidechain
	r.meta = raw.IsMeta
	r.compactSum = raw.IsCompactSummary
	r.version = raw.Version
	r.cwd = raw.CWD
	r.gitBranch = raw.GitBranch
	r.slug = raw.Slug
	if raw.Timestamp != "" {
		t, err := time.Parse(time.RFC3339Nano, raw.Timestamp)
		if err != nil {
			return nil, malformed("%s record: timestamp %q is not RFC 3339", raw.Type, clip(raw.Timestamp, 40))
		}
		r.time = t.UTC()
	}

	if raw.Type == recSystem {
		return r, parseSystem(r, &raw)
	}
	if r.uuid == "" {
		return nil, malformed("%s record has no uuid", raw.Type)
	}
	if r.time.IsZero() {
		return nil, malformed("%s record %s has no timestamp", raw.Type, r.uuid)
	}
	m := raw.Message
	if m == nil {
		return nil, malformed("%s record %s has no message", raw.Type, r.uuid)
	}
	if m.Content == nil || (!m.Content.isString && m.Content.blocks == nil) {
		return nil, malformed("%s record %s: message has no content", raw.Type, r.uuid)
	}
	r.msgID = m.ID
	r.model = m.Model
	if m.StopReason != nil {
		r.stopReason = *m.StopReason
	}
	r.usage = m.Usage
	role := events.RoleUser
	if raw.Type == recAssistant {
		role = events.RoleAssistant
	}
	if m.Content.isString {
		r.text = m.Content.text
		r.blocks = []events.ContentBlock{{Type: events.BlockText, Text: m.Content.text}}
	} else {
		r.blocks = m.Content.blocks
		for i := range r.blocks {
			if err := checkBlock(&r.blocks[i], role); err != nil {
				return nil, malformed("%s record %s: content[%d]: %v", raw.Type, r.uuid, i, err)
			}
		}
		if len(r.blocks) > 0 && r.blocks[0].Type == events.BlockText {
			r.text = r.blocks[0].Text
		}
	}
	if raw.Type == recAssistant {
		r.errField = nonNull(raw.Error)
		r.errStatus = nonNull(raw.APIErrorStatus)
		r.apiError = raw.IsAPIErrorMessage || r.errField != nil
	} else {
		r.toolResult = nonNull(raw.ToolUseResult)
		r.class = classifyUser(r)
	}
	return r, nil
}

// parseProgress reads a progress record's subagent link, leniently: nil
// when the line has none.
func parseProgress(line []byte) *progressRecord {
	var p progressRecord
	if json.Unmarshal(line, &p) == nil && p.linked() {
		return &p
	}
	return nil
}

// progressLink is parseProgress for a line already read as a rawRecord:
// it reads only the record's parentToolUseID and data, not the line again.
func progressLink(parent, data json.RawMessage) *progressRecord {
	parent, data = nonNull(parent), nonNull(data)
	if parent == nil || data == nil {
		return nil
	}
	var p progressRecord
	if json.Unmarshal(parent, &p.ParentToolUseID) != nil || json.Unmarshal(data, &p.Data) != nil || !p.linked() {
		return nil
	}
	return &p
}

// linked reports whether p links a subagent to its Task tool call.
func (p *progressRecord) linked() bool {
	return p.Data.Type == progressAgent && p.Data.AgentID != "" && p.ParentToolUseID != ""
}

func parseSystem(r *record, raw *rawRecord) error {
	switch r.subtype {
	case subCompact:
		if r.uuid == "" {
			return malformed("compact_boundary record has no uuid")
		}
		if r.time.IsZero() {
			return malformed("compact_boundary record %s has no timestamp", r.uuid)
		}
		r.compact = &compactMetadata{}
		if md := nonNull(raw.CompactMetadata); md != nil {
			if err := json.Unmarshal(md, r.compact); err != nil {
				return malformed("compact_boundary record %s: compactMetadata: %v", r.uuid, jsonProblem(err))
			}
		}
	case subTurnDur:
		if raw.DurationMS != nil && *raw.DurationMS > 0 && *raw.DurationMS < 1e15 {
			r.durationMS = int64(*raw.DurationMS)
		}
	case subAPIError:
		r.apiError = true
		r.errField = nonNull(raw.Error)
		r.errStatus = nonNull(raw.APIErrorStatus)
		if c := nonNull(raw.Content); c != nil && c[0] == '"' {
			_ = json.Unmarshal(c, &r.sysText)
		}
		r.retryAttempt = smallInt(raw.RetryAttempt)
		r.maxRetries = smallInt(raw.MaxRetries)
	}
	return nil
}

func smallInt(f *float64) int {
	if f == nil || *f < 0 || *f > 1e6 {
		return 0
	}
	return int(*f)
}

// checkBlock applies the content block rules of events.Validate, so that a
// record breaking them is reported as malformed instead of producing an
// event the log would refuse.
func checkBlock(b *events.ContentBlock, role events.Role) error {
	switch b.Type {
	case "":
		return errors.New(`a content block needs a "type"`)
	case events.BlockToolUse:
		if strings.TrimSpace(b.ID) == "" || strings.TrimSpace(b.Name) == "" {
			return errors.New("a tool_use block needs an id and a name")
		}
		if in := bytes.TrimSpace(b.Input); len(in) > 0 && in[0] != '{' {
			if string(in) != "null" {
				return errors.New("tool_use input must be a JSON object")
			}
			b.Input = nil
		}
		if role == events.RoleUser {
			return errors.New("a tool_use block in a user message")
		}
	case events.BlockToolResult:
		if strings.TrimSpace(b.ToolUseID) == "" {
			return errors.New("a tool_result block needs a tool_use_id")
		}
		if c := bytes.TrimSpace(b.Content); len(c) > 0 && c[0] != '"' && c[0] != '[' && string(c) != "null" {
			return errors.New("tool_result content must be a string or an array of content blocks")
		}
		if role == events.RoleAssistant {
			return errors.New("a tool_result block in an assistant message")
		}
	}
	return nil
}

// The texts Claude Code writes for an interruption (ESC while the model
// streams, or while a tool waits or runs).
const (
	interruptedMarker        = "[Request interrupted by user]"
	interruptedForToolMarker = "[Request interrupted by user for tool use]"
)

// classifyUser decides what a user record is. In order: any tool_result
// block makes it a tool result; isCompactSummary a compact summary; a
// <local-command-caveat> text a caveat; isMeta meta; the interruption
// markers an interruption; <local-command-stdout|stderr> and
// <bash-stdout|stderr> command output; <bash-input> a shell command;
// <command-name> or <command-message> a slash command; <task-notification>
// a background task's notification; anything else (a string, text or image
// blocks) a prompt typed by a person.
func classifyUser(r *record) userClass {
	for i := range r.blocks {
		if r.blocks[i].Type == events.BlockToolResult {
			return classToolResult
		}
	}
	t := strings.TrimSpace(r.text)
	switch {
	case r.compactSum:
		return classCompactSummary
	case strings.HasPrefix(t, "<local-command-caveat>"):
		return classCaveat
	case r.meta:
		return classMeta
	case strings.HasPrefix(t, "[Request interrupted by user"):
		return classInterruption
	case hasAnyPrefix(t, "<local-command-stdout>", "<local-command-stderr>", "<bash-stdout>", "<bash-stderr>"):
		return classCommandOutput
	case strings.HasPrefix(t, "<bash-input>"):
		return classBashInput
	case hasAnyPrefix(t, "<command-name>", "<command-message>"):
		return classCommand
	case strings.HasPrefix(t, "<task-notification>"):
		return classTaskNotification
	}
	return classPrompt
}

func hasAnyPrefix(s string, prefixes ...string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// commandPreview turns a slash command record's text into "/name args".
func commandPreview(text string) string {
	name := between(text, "<command-name>", "</command-name>")
	if name == "" {
		return text
	}
	if args := strings.TrimSpace(between(text, "<command-args>", "</command-args>")); args != "" {
		return name + " " + args
	}
	return name
}

func between(s, open, close string) string {
	i := strings.Index(s, open)
	if i < 0 {
		return ""
	}
	s = s[i+len(open):]
	j := strings.Index(s, close)
	if j < 0 {
		return ""
	}
	return strings.TrimSpace(s[:j])
}

// clip returns the first n runes of s (importer.Clip).
func clip(s string, n int) string { return importer.Clip(s, n) }

// jsonPlace names a decoder's path of names and array indexes ("0.text")
// for a person: `field "text" of element 0`, `element 0`, `element 1.2`
// (of an array in an array), `field "type"`, `field "input_tokens" of
// message.usage`.
func jsonPlace(path string) string {
	i := strings.LastIndexByte(path, '.')
	last, at := path[i+1:], ""
	if i >= 0 {
		at = path[:i]
	}
	if strings.Trim(last, "0123456789") == "" { // an array index
		return "element " + path
	}
	if at == "" {
		return fmt.Sprintf("field %q", last)
	}
	if strings.Trim(at, "0123456789.") == "" {
		return fmt.Sprintf("field %q of element %s", last, at)
	}
	return fmt.Sprintf("field %q of %s", last, at)
}

func nonNull(raw json.RawMessage) json.RawMessage {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	return raw
}

// jsonProblem shortens the JSON decoder's errors to what a person can act
// on. A type error names where it is as a path of names and array indexes
// ("0.text": the text of the first element).
func jsonProblem(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field != "" {
			return fmt.Sprintf("%s is a JSON %s, want %s", jsonPlace(te.Field), te.Value, te.Type)
		}
		return fmt.Sprintf("a JSON %s where %s was expected", te.Value, te.Type)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("bad JSON at byte %d: %v", se.Offset, se)
	}
	return err.Error()
}
