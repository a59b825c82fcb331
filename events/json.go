package events

import (
	"errors"
	"fmt"
	"strings"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// Turnstone reads and writes JSON with github.com/go-json-experiment/json,
// the design of encoding/json/v2 (in Go 1.26 behind GOEXPERIMENT=jsonv2;
// moving to it is an import change: encoding/json/v2 and
// encoding/json/jsontext). Its defaults suit a wire contract, and are the
// contract's (docs/events.md, "Strictness"): an object with a duplicate
// member name is refused, names match case-sensitively, a string must be
// valid UTF-8, a body is one JSON value with nothing after it, and a
// number must fit its field.

// marshal encodes v as compact JSON, with <, > and & as they are, and the
// members of maps sorted (the same value always encodes the same bytes).
func marshal(v any) ([]byte, error) { return json.Marshal(v, json.Deterministic(true)) }

// unmarshal decodes b, one JSON value, into v.
func unmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// validObject reports whether b is one JSON object (no duplicate names,
// valid UTF-8) and nothing else. The stored-body scanner answers first
// (the same rules, no allocation); what it does not accept the library
// judges (an object nested past the scanner's bounds is still valid).
func validObject(b []byte) bool {
	if scannedObject(b) {
		return true
	}
	v := jsontext.Value(b)
	if !v.IsValid() {
		return false
	}
	return v.Kind() == '{'
}

// compact returns b compacted (white space outside strings removed); b
// must be valid JSON.
func compact(b []byte) ([]byte, error) {
	v := jsontext.Value(append([]byte(nil), b...))
	if err := v.Compact(); err != nil {
		return nil, err
	}
	return v, nil
}

// decodeProblem says what is wrong with a body the decoder refused, for
// people: "data.content[2].id is a JSON number, want a string".
func decodeProblem(err error) string {
	var se *json.SemanticError
	if errors.As(err, &se) && se.JSONPointer != "" {
		where := pointerPath(string(se.JSONPointer))
		if se.JSONKind != 0 && se.GoType != nil {
			return fmt.Sprintf("%s is a JSON %s, want %s", where, kindName(se.JSONKind), se.GoType)
		}
		if se.Err != nil {
			return fmt.Sprintf("%s: %v", where, se.Err)
		}
	}
	var syn *jsontext.SyntacticError
	if errors.As(err, &syn) {
		return strings.TrimPrefix(syn.Error(), "jsontext: ")
	}
	return strings.TrimPrefix(strings.TrimPrefix(err.Error(), "json: "), "jsontext: ")
}

// pointerPath turns a JSON pointer ("/content/2/id") into a field path
// ("content[2].id").
func pointerPath(p string) string {
	var b strings.Builder
	for _, tok := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		if tok != "" && strings.Trim(tok, "0123456789") == "" {
			b.WriteString("[" + tok + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(tok)
	}
	return b.String()
}

func kindName(k jsontext.Kind) string {
	switch k {
	case 'n':
		return "null"
	case 'f', 't':
		return "boolean"
	case '"':
		return "string"
	case '0':
		return "number"
	case '{':
		return "object"
	case '[':
		return "array"
	}
	return k.String()
}
