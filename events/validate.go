package events

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/oklog/ulid/v2"
)

// Validate checks the event against wire contract version 1 and returns nil
// or an error that joins one *FieldError per broken rule (all of them, not
// only the first); errors.Is(err, ErrInvalid) holds for it.
//
// Envelope rules: specversion is "1.0"; id is a ULID; type is non-empty
// lower-case [a-z0-9_.]; source is non-empty; time is set; tenant and
// session are subject tokens (ValidToken); turn, when set, is a token too;
// data is one JSON object (docs/events.md, "Strictness"). For a known
// type the payload's own rules apply (see docs/events.md); an unknown
// type only needs a valid envelope, so that newer publishers are not
// refused. A valid event keeps its payload decoded (see Payload).
func Validate(e *Event) error {
	v := &validator{}
	v.envelope(e)
	e.payload = nil
	// The turn's payloads are read in one pass that also shows data is
	// one object; for anything else, data is checked, then decoded.
	p := newPayload(e.Type)
	scanned := p != nil && readPayload(p, e.Data)
	if !scanned && !dataObject(e) {
		v.add("data", "must be one JSON object (no duplicate member names, valid UTF-8)", "")
		return v.err()
	}
	if p != nil {
		var err error
		if !scanned {
			p, err = unmarshalPayload(e.Type, e.Data)
		}
		if err != nil {
			v.add("data", "must fit the "+string(e.Type)+" shape: "+strings.TrimPrefix(err.Error(), ErrMalformed.Error()+": "+string(e.Type)+" data: "), "")
			return v.err()
		}
		v.payload(e, p)
		if len(v.errs) == 0 {
			e.payload = p
		}
	}
	return v.err()
}

// dataObject reports whether e.Data is one JSON object: when Decode read
// it (strictly) and it was not changed since, only its kind is looked at.
func dataObject(e *Event) bool {
	if d := e.decoded; len(d) > 0 && len(d) == len(e.Data) && &d[0] == &e.Data[0] {
		for _, c := range d {
			switch c {
			case ' ', '\t', '\r', '\n':
				continue
			}
			return c == '{'
		}
		return false
	}
	return validObject(e.Data)
}

// envelope checks the envelope's rules (see Validate).
func (v *validator) envelope(e *Event) {
	if e.SpecVersion != SpecVersion {
		v.add("specversion", `must be "1.0"`, e.SpecVersion)
	}
	if e.ID == "" {
		v.add("id", "required (a ULID)", "")
	} else if _, err := ulid.ParseStrict(e.ID); err != nil {
		v.add("id", "must be a ULID (26 characters of Crockford base32)", e.ID)
	}
	if e.Type == "" {
		v.add("type", "required", "")
	} else if !validTypeName(string(e.Type)) {
		v.add("type", "must be lower-case letters, digits, '_' and '.'", string(e.Type))
	}
	if e.Source == "" {
		v.add("source", "required (a URI-reference naming the publisher)", "")
	}
	if e.Time.IsZero() {
		v.add("time", "required (RFC 3339)", "")
	}
	v.token("tenant", e.Tenant, true)
	v.token("session", e.Session, true)
	v.token("turn", e.Turn, false)
}

// payload checks the rules of e's decoded payload p, and the turn its type
// needs.
func (v *validator) payload(e *Event, p Payload) {
	v.prefix = "data."
	p.validate(v)
	v.prefix = ""
	if needsTurn(e.Type) && e.Turn == "" {
		v.add("turn", "required for "+string(e.Type), "")
	}
}

func needsTurn(t Type) bool {
	switch t {
	case TypeTurnStarted, TypeTurnStageCompleted, TypeTurnCompleted, TypeTurnFailed, TypeTurnAbandoned:
		return true
	}
	return false
}

func validTypeName(s string) bool {
	if len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// validator collects FieldErrors.
type validator struct {
	prefix string
	errs   []error
}

func (v *validator) add(field, rule, value string) {
	if len(value) > 64 {
		value = value[:64] + "..."
	} else {
		value = strings.Clone(value)
	}
	v.errs = append(v.errs, &FieldError{Field: v.prefix + field, Rule: rule, Value: value})
}

func (v *validator) err() error {
	if len(v.errs) == 0 {
		return nil
	}
	return errors.Join(v.errs...)
}

func (v *validator) token(field, s string, required bool) {
	switch {
	case s == "" && required:
		v.add(field, "required", "")
	case s == "":
	case !ValidToken(s):
		v.add(field, fmt.Sprintf("must be 1-%d characters of [A-Za-z0-9_-]", MaxTokenLen), s)
	}
}

func (v *validator) required(field, s string) {
	if strings.TrimSpace(s) == "" {
		v.add(field, "required", "")
	}
}

func (v *validator) stage(field string, s Stage, required bool) {
	if s == "" {
		if required {
			v.add(field, "required (context, history, execute or finalize)", "")
		}
		return
	}
	if !s.valid() {
		v.add(field, "must be one of context, history, execute, finalize", string(s))
	}
}

func (v *validator) nonNegative(field string, n int64) {
	if n < 0 {
		v.add(field, "must not be negative", fmt.Sprint(n))
	}
}

func (v *validator) errorInfo(field string, e *ErrorInfo) {
	if field != "" {
		field += "."
	}
	v.required(field+"message", e.Message)
	if e.Kind != "" && !e.Kind.valid() {
		v.add(field+"kind", "must be one of transient, logic, unknown", string(e.Kind))
	}
	if e.HTTPStatus != 0 && (e.HTTPStatus < 100 || e.HTTPStatus > 599) {
		v.add(field+"http_status", "must be an HTTP status (100-599)", fmt.Sprint(e.HTTPStatus))
	}
}

func (p *SessionStarted) validate(v *validator) {
	switch p.Kind {
	case "", "main", "subagent", "compaction":
	default:
		v.add("kind", "must be one of main, subagent, compaction", p.Kind)
	}
	v.token("parent_session", p.ParentSession, false)
	v.token("forked_from", p.ForkedFrom, false)
	if p.ForkSeq != 0 && p.ForkedFrom == "" {
		v.add("forked_from", "required when fork_seq is set", "")
	}
	if p.ParentToolUseID != "" && p.ParentSession == "" {
		v.add("parent_session", "required when parent_tool_use_id is set", "")
	}
}

func (p *SessionPaused) validate(v *validator) {
	v.required("reason", p.Reason)
	switch p.Cause {
	case "", CauseRuntimeUnavailable, CauseNeedsPerson, CauseParked, CauseLoop, CauseAborted, CauseManual:
	default:
		v.add("cause", "must be one of runtime_unavailable, needs_person, parked, loop, aborted, manual", string(p.Cause))
	}
}
func (p *SessionResumed) validate(v *validator) {}

func (p *TurnStarted) validate(v *validator) { v.nonNegative("deadline_ms", p.DeadlineMS) }

func (p *TurnStageCompleted) validate(v *validator) {
	v.stage("stage", p.Stage, true)
	v.nonNegative("duration_ms", p.DurationMS)
}

func (p *TurnCompleted) validate(v *validator) { v.nonNegative("duration_ms", p.DurationMS) }

func (p *TurnFailed) validate(v *validator) {
	v.stage("stage", p.Stage, true)
	v.errorInfo("error", &p.Error)
}

func (p *TurnAbandoned) validate(v *validator) {
	v.stage("last_stage_completed", p.LastStageCompleted, false)
	v.stage("stage", p.Stage, false)
	v.stage("last_stage", p.LastStage, false)
	v.required("reason", p.Reason)
}

func (p *MessageAppended) validate(v *validator) {
	if p.Role != RoleUser && p.Role != RoleAssistant {
		v.add("role", "must be user or assistant", string(p.Role))
	}
	if len(p.Content) == 0 {
		v.add("content", "must hold at least one content block", "")
	}
	for i := range p.Content {
		validateBlock(v, i, &p.Content[i], p.Role)
	}
	if u := p.Usage; u != nil {
		if p.Role != RoleAssistant {
			v.add("usage", "belongs to assistant messages", string(p.Role))
		}
		for _, f := range [...]struct {
			name string
			n    int64
		}{
			{"usage.input_tokens", u.InputTokens},
			{"usage.output_tokens", u.OutputTokens},
			{"usage.cache_read_input_tokens", u.CacheReadTokens},
			{"usage.cache_creation_input_tokens", u.CacheWriteTokens},
			{"usage.reasoning_output_tokens", u.ReasoningTokens},
		} {
			if f.n < 0 {
				v.add(f.name, "must be zero or more", strconv.FormatInt(f.n, 10))
			}
		}
	}
}

// validateBlock checks content block i of a message of role. The field
// path ("content[2].id") is made only for an error: a valid block costs
// no allocation.
func validateBlock(v *validator, i int, b *ContentBlock, role Role) {
	field := func(name string) string { return "content[" + strconv.Itoa(i) + "]." + name }
	required := func(name, s string) {
		if strings.TrimSpace(s) == "" {
			v.add(field(name), "required", "")
		}
	}
	switch b.Type {
	case "":
		v.add(field("type"), "required", "")
	case BlockToolUse:
		required("id", b.ID)
		required("name", b.Name)
		if in := bytes.TrimSpace(b.Input); len(in) > 0 && in[0] != '{' {
			v.add(field("input"), "must be a JSON object", "")
		}
		if role == RoleUser {
			v.add(field("type"), "tool_use blocks belong to assistant messages", b.Type)
		}
	case BlockToolResult:
		required("tool_use_id", b.ToolUseID)
		if c := bytes.TrimSpace(b.Content); len(c) > 0 && c[0] != '"' && c[0] != '[' && string(c) != "null" {
			v.add(field("content"), "must be a string or an array of content blocks", "")
		}
		if role == RoleAssistant {
			v.add(field("type"), "tool_result blocks belong to user messages", b.Type)
		}
	}
}

func (p *ToolCallStarted) validate(v *validator) {
	v.required("tool_use_id", p.ToolUseID)
	v.required("name", p.Name)
}

func (p *ToolCallCompleted) validate(v *validator) {
	v.required("tool_use_id", p.ToolUseID)
	v.required("name", p.Name)
	v.nonNegative("duration_ms", p.DurationMS)
}

func (p *ErrorRecorded) validate(v *validator) {
	v.errorInfo("", &p.ErrorInfo)
	if p.Consecutive < 0 {
		v.add("consecutive", "must not be negative", fmt.Sprint(p.Consecutive))
	}
	v.stage("stage", p.Stage, false)
}

func (p *DistillationRequested) validate(v *validator) {}
func (p *DistillationStarted) validate(v *validator) {
	if p.ToSeq != 0 && p.FromSeq > p.ToSeq {
		v.add("from_seq", "must not be after to_seq", fmt.Sprint(p.FromSeq))
	}
}

func (p *DistillationCompleted) validate(v *validator) {
	if p.ToSeq != 0 && p.FromSeq > p.ToSeq {
		v.add("from_seq", "must not be after to_seq", fmt.Sprint(p.FromSeq))
	}
	v.nonNegative("tokens_before", p.TokensBefore)
	v.nonNegative("tokens_after", p.TokensAfter)
}

func (p *DistillationSkipped) validate(v *validator) { v.required("reason", p.Reason) }

func (p *SnapshotTaken) validate(v *validator) {
	if p.CoversSeq == 0 {
		v.add("covers_seq", "required (the last stream sequence the snapshot covers)", "")
	}
}

func (p *SessionRewound) validate(v *validator) {
	if p.ToSeq == 0 {
		v.add("to_seq", "required (the stream sequence to rewind to)", "")
	}
	v.required("reason", p.Reason)
}

func (p *SessionForked) validate(v *validator) {
	v.token("fork_session", p.ForkSession, true)
	if p.AtSeq == 0 {
		v.add("at_seq", "required (the last sequence of the copied prefix)", "")
	}
}

func (p *RecoveryAttempted) validate(v *validator) {
	v.required("command_id", p.CommandID)
	v.required("kind", p.Kind)
	if p.Attempt < 1 {
		v.add("attempt", "must be at least 1", fmt.Sprint(p.Attempt))
	}
	if p.Result != AttemptOK && p.Result != AttemptFailed {
		v.add("result", "must be ok or failed", string(p.Result))
	}
	if p.Error != nil {
		v.errorInfo("error", p.Error)
	}
	v.nonNegative("duration_ms", p.DurationMS)
}

func (p *RecoveryCompleted) validate(v *validator) {
	v.required("command_id", p.CommandID)
	v.required("kind", p.Kind)
	if !p.Outcome.Valid() {
		v.add("outcome", "must be one of recovered, degraded, failed", string(p.Outcome))
	}
}

func (p *RecoveryParked) validate(v *validator) {
	v.required("command_id", p.CommandID)
	v.required("kind", p.Kind)
	v.required("reason", p.Reason)
}

func validBreakerState(s string) bool { return s == "closed" || s == "open" || s == "half_open" }

func (p *BreakerChanged) validate(v *validator) {
	v.required("provider", p.Provider)
	if !validBreakerState(p.From) {
		v.add("from", "must be one of closed, open, half_open", p.From)
	}
	if !validBreakerState(p.To) {
		v.add("to", "must be one of closed, open, half_open", p.To)
	}
}
