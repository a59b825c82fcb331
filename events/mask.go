package events

import (
	"bytes"
	"encoding/json"
	"regexp"
)

// Redacted replaces every secret Mask finds.
const Redacted = "[REDACTED]"

// maskRule is one kind of secret: re finds it and repl replaces it, keeping
// the capture groups that are not secret (a key name, a scheme and user).
type maskRule struct {
	name string
	re   *regexp.Regexp
	repl string
}

// valueChars is what a secret value may be made of: anything up to
// whitespace, quotes, or a separator of a query string or header list.
const valueChars = `[^\s"'\\&,;<>)]+`

var maskRules = []maskRule{
	// RFC 6750 bearer tokens, as in "Authorization: Bearer <token>".
	{"bearer", regexp.MustCompile(`(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]{8,}`), "${1}" + Redacted},
	// Credentials in a URL's userinfo (RFC 3986 section 3.2.1): keep the
	// scheme and user, drop the password.
	{"url-credentials", regexp.MustCompile(`(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@"'\\]+:)[^\s/@"'\\]+(@)`), "${1}" + Redacted + "${2}"},
	// key=value and header forms of API keys, passwords and secrets.
	{"key-value", regexp.MustCompile(`(?i)(\b(?:api[_-]?key|x-api-key|access[_-]?token|auth[_-]?token|client[_-]?secret|secret[_-]?key|secret|password|passwd|pwd)\s*=\s*)` + valueChars), "${1}" + Redacted},
	{"header", regexp.MustCompile(`(?i)(\b(?:x-api-key|api-key|x-goog-api-key)\s*:\s*)` + valueChars), "${1}" + Redacted},
	// AWS access key ids: AKIA (long-term) and ASIA (temporary), 20 characters.
	{"aws-access-key-id", regexp.MustCompile(`\b(?:AKIA|ASIA)[0-9A-Z]{16}\b`), Redacted},
	// Provider and forge keys by their documented prefixes.
	{"anthropic-key", regexp.MustCompile(`\bsk-ant-[A-Za-z0-9_-]{8,}`), Redacted},
	{"openai-key", regexp.MustCompile(`\bsk-[A-Za-z0-9_-]{16,}`), Redacted},
	{"github-token", regexp.MustCompile(`\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})`), Redacted},
	{"slack-token", regexp.MustCompile(`\bxox[abprs]-[A-Za-z0-9-]{10,}`), Redacted},
	{"google-api-key", regexp.MustCompile(`\bAIza[0-9A-Za-z_-]{35}`), Redacted},
}

// maskNeedles are literal fragments at least one of which is in any text a
// rule can match; text with none of them is returned as it is, without
// running a regular expression.
var maskNeedles = [][]byte{
	[]byte("earer"), []byte("EARER"),
	[]byte("://"),
	[]byte("key"), []byte("Key"), []byte("KEY"),
	[]byte("oken"), []byte("OKEN"),
	[]byte("ecret"), []byte("ECRET"),
	[]byte("assw"), []byte("ASSW"), []byte("pwd"), []byte("PWD"),
	[]byte("AKIA"), []byte("ASIA"),
	[]byte("sk-"),
	[]byte("gh"), []byte("github_pat_"),
	[]byte("xox"),
	[]byte("AIza"),
}

func mayHoldSecret(b []byte) bool {
	for _, n := range maskNeedles {
		if bytes.Contains(b, n) {
			return true
		}
	}
	return false
}

// MaskString returns s with every secret replaced by Redacted: RFC 6750
// bearer tokens, credentials in URLs (https://user:pass@host keeps the user),
// api_key= / password= / secret= style pairs and x-api-key headers, AWS
// access key ids (AKIA..., ASIA...), and provider keys by prefix (sk-ant-,
// sk-, ghp_ and the other GitHub token prefixes, xox?- Slack tokens, AIza
// Google keys). Text without a secret is returned unchanged. Masking is
// idempotent.
func MaskString(s string) string {
	if !mayHoldSecret([]byte(s)) {
		return s
	}
	for _, r := range maskRules {
		s = r.re.ReplaceAllString(s, r.repl)
	}
	return s
}

// MaskJSON returns the JSON value b with MaskString applied to every string
// value in it (object keys are kept). b is returned as it is when it holds
// no candidate secret, and when it is not valid JSON (Validate reports that).
// The result is compact JSON with object keys sorted.
func MaskJSON(b []byte) []byte {
	if !mayHoldSecret(b) {
		return b
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return b
	}
	changed := false
	v = maskValue(v, &changed)
	if !changed {
		return b
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return b
	}
	return bytes.TrimRight(out.Bytes(), "\n")
}

func maskValue(v any, changed *bool) any {
	switch t := v.(type) {
	case string:
		m := MaskString(t)
		if m != t {
			*changed = true
		}
		return m
	case []any:
		for i := range t {
			t[i] = maskValue(t[i], changed)
		}
	case map[string]any:
		for k, x := range t {
			t[k] = maskValue(x, changed)
		}
	}
	return v
}

// Mask masks the event's data in place (see MaskJSON) and reports whether
// anything was replaced. Envelope attributes are identifiers and are not
// masked. Log.Append calls it on every event before it stores it.
func Mask(e *Event) bool {
	m := MaskJSON(e.Data)
	if len(m) == len(e.Data) && string(m) == string(e.Data) {
		return false
	}
	e.Data = m
	return true
}
