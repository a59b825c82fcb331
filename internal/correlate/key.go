package correlate

import (
	"strconv"
	"strings"
)

// Key is a correlation key: signals with equal keys are one incident.
// Kind and Class are always set; the other fields are set only when the
// class's rule (KeyFields) names them, so that a provider outage is one
// incident whatever the models, runtimes and tenants it hit, while a bad
// request is one per model.
type Key struct {
	Kind  Kind   `json:"kind"`
	Class string `json:"class"`
	// Code is the error's HTTP status when it had one, else its
	// provider code in lower case ("overloaded_error").
	Code     string `json:"code,omitempty"`
	Provider string `json:"provider,omitempty"`
	Model    string `json:"model,omitempty"`
	Runtime  string `json:"runtime,omitempty"`
	Tool     string `json:"tool,omitempty"`
	// Stage is the turn's stage the error was thrown in (ClassLogic
	// only): the runtime's own failure in "history" is one incident, in
	// "execute" another.
	Stage string `json:"stage,omitempty"`
}

// Field is one optional field of a Key.
type Field uint8

// The optional fields of a Key.
const (
	FieldProvider Field = 1 << iota
	FieldCode
	FieldModel
	FieldRuntime
	FieldTool
	FieldStage
)

// KeyFields returns the fields of the key of a signal of kind and class,
// the correlation rule:
//
//   - errors the provider causes for everyone (recovery classes overloaded,
//     rate_limit, server, timeout, network) and authentication:
//     provider and code. One provider's outage is one incident.
//   - errors of the request (context_length, invalid_request,
//     parse_error): provider, model and code. A model that rejects a
//     request shape is one incident per model.
//   - tool_error: tool and runtime.
//   - logic (ClassLogic: a runtime's own failure, which names no
//     provider, code or status): runtime and stage. A runtime version
//     whose history stage throws is one incident, whatever the provider
//     its sessions use.
//   - every other error class (resource, runtime_unavailable, unknown):
//     runtime and code. A runtime version that crashes is one incident.
//   - anomaly flaky_tool: tool. A flaky tool is one incident whatever
//     runs it.
//   - anomalies recovery_failed and recovery_parked: runtime and code
//     (the command's kind). A strategy that fails for one runtime version
//     is one incident.
//   - every other anomaly (a violation rule, turn_abandoned, loop):
//     runtime. A runtime version that leaves orphans is one incident.
func KeyFields(kind Kind, class string) Field {
	if kind == KindAnomaly {
		switch class {
		case ClassFlakyTool:
			return FieldTool
		case ClassRecoveryFailed, ClassRecoveryParked:
			return FieldRuntime | FieldCode
		}
		return FieldRuntime
	}
	switch class {
	case "overloaded", "rate_limit", "server", "timeout", "network", "authentication":
		return FieldProvider | FieldCode
	case "context_length", "invalid_request", "parse_error":
		return FieldProvider | FieldModel | FieldCode
	case "tool_error":
		return FieldTool | FieldRuntime
	case ClassLogic:
		return FieldRuntime | FieldStage
	}
	return FieldRuntime | FieldCode
}

// KeyOf returns the correlation key of s (see KeyFields).
func KeyOf(s Signal) Key {
	k := Key{Kind: s.Kind, Class: s.Class}
	f := KeyFields(s.Kind, s.Class)
	if f&FieldProvider != 0 {
		k.Provider = s.Provider
	}
	if f&FieldCode != 0 {
		k.Code = strings.ToLower(strings.TrimSpace(s.Code))
		if s.Status != 0 {
			k.Code = strconv.Itoa(s.Status)
		}
	}
	if f&FieldModel != 0 {
		k.Model = s.Model
	}
	if f&FieldRuntime != 0 {
		k.Runtime = s.Runtime
	}
	if f&FieldTool != 0 {
		k.Tool = s.Tool
	}
	if f&FieldStage != 0 {
		k.Stage = s.Stage
	}
	return k
}

// String is the key as "kind=error class=overloaded code=529
// provider=anthropic": its set fields in a fixed order (Incident.ID hashes
// it).
func (k Key) String() string {
	var b strings.Builder
	add := func(name, v string) {
		if v == "" {
			return
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(name)
		b.WriteByte('=')
		b.WriteString(v)
	}
	add("kind", string(k.Kind))
	add("class", k.Class)
	add("code", k.Code)
	add("provider", k.Provider)
	add("model", k.Model)
	add("runtime", k.Runtime)
	add("tool", k.Tool)
	add("stage", k.Stage)
	return b.String()
}

// Scope is the key's fields other than its kind and class, for people:
// "provider anthropic · code 529", "runtime claude-code 2.1.38 · stage
// history"; "" when the key has none.
func (k Key) Scope() string {
	var parts []string
	for _, p := range [][2]string{{"provider", k.Provider}, {"model", k.Model}, {"runtime", k.Runtime}, {"tool", k.Tool}, {"stage", k.Stage}, {"code", k.Code}} {
		if p[1] != "" {
			parts = append(parts, p[0]+" "+p[1])
		}
	}
	return strings.Join(parts, " · ")
}

// Title names the key for people: "overloaded 529 · provider anthropic",
// "tool_use_without_result · runtime claude-code 2.1.38".
func (k Key) Title() string {
	head := k.Class
	if k.Code != "" {
		head += " " + k.Code
	}
	parts := []string{head}
	for _, p := range [][2]string{{"stage", k.Stage}, {"provider", k.Provider}, {"model", k.Model}, {"runtime", k.Runtime}, {"tool", k.Tool}} {
		if p[1] != "" {
			parts = append(parts, p[0]+" "+p[1])
		}
	}
	return strings.Join(parts, " · ")
}
