package events

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"unicode/utf8"
)

// Redacted replaces every secret Mask finds.
const Redacted = "[REDACTED]"

// maskRule is one kind of secret: re finds it and repl replaces it, keeping
// the capture groups that are not secret (a key name, a scheme and user).
// need is a cheap test that holds for every string re can match (a literal
// every match contains); a string it rejects is left as it is without
// running re. Case-insensitive needles avoid k and s, whose Unicode case
// folds (the Kelvin sign, the long s) re matches too.
type maskRule struct {
	name string
	re   *regexp.Regexp
	repl string
	need func(s string) bool
}

// valueChars is what a secret value may be made of: anything up to
// whitespace, quotes, or a separator of a query string or header list.
const valueChars = `[^\s"'\\&,;<>)]+`

var maskRules = []maskRule{
	// RFC 6750 bearer tokens, as in "Authorization: Bearer <token>".
	{"bearer", regexp.MustCompile(`(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]{8,}`), "${1}" + Redacted,
		func(s string) bool { return containsFoldASCII(s, "bearer") }},
	// Credentials in a URL's userinfo (RFC 3986 section 3.2.1): keep the
	// scheme and user, drop the password.
	{"url-credentials", regexp.MustCompile(`(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@"'\\]+:)[^\s/@"'\\]+(@)`), "${1}" + Redacted + "${2}",
		func(s string) bool { return strings.Contains(s, "://") && strings.IndexByte(s, '@') >= 0 }},
	// key=value and header forms of API keys, passwords and secrets.
	{"key-value", regexp.MustCompile(`(?i)(\b(?:api[_-]?key|x-api-key|access[_-]?token|auth[_-]?token|client[_-]?secret|secret[_-]?key|secret|password|passwd|pwd)\s*=\s*)` + valueChars), "${1}" + Redacted,
		func(s string) bool { return strings.IndexByte(s, '=') >= 0 }},
	{"header", regexp.MustCompile(`(?i)(\b(?:x-api-key|api-key|x-goog-api-key)\s*:\s*)` + valueChars), "${1}" + Redacted,
		func(s string) bool { return strings.IndexByte(s, ':') >= 0 && containsFoldASCII(s, "api-") }},
	// AWS access key ids: AKIA (long-term) and ASIA (temporary), 20 characters.
	{"aws-access-key-id", regexp.MustCompile(`\b(?:AKIA|ASIA)[0-9A-Z]{16}\b`), Redacted,
		func(s string) bool { return strings.Contains(s, "AKIA") || strings.Contains(s, "ASIA") }},
	// Provider and forge keys by their documented prefixes.
	{"anthropic-key", regexp.MustCompile(`\bsk-ant-[A-Za-z0-9_-]{8,}`), Redacted,
		func(s string) bool { return strings.Contains(s, "sk-ant-") }},
	{"openai-key", regexp.MustCompile(`\bsk-[A-Za-z0-9_-]{16,}`), Redacted,
		func(s string) bool { return strings.Contains(s, "sk-") }},
	{"github-token", regexp.MustCompile(`\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})`), Redacted,
		func(s string) bool {
			return strings.Contains(s, "github_pat_") || strings.Contains(s, "gh") && strings.IndexByte(s, '_') >= 0
		}},
	{"slack-token", regexp.MustCompile(`\bxox[abprs]-[A-Za-z0-9-]{10,}`), Redacted,
		func(s string) bool { return strings.Contains(s, "xox") }},
	{"google-api-key", regexp.MustCompile(`\bAIza[0-9A-Za-z_-]{35}`), Redacted,
		func(s string) bool { return strings.Contains(s, "AIza") }},
}

// containsFoldASCII reports whether s contains needle, ASCII letters
// matched in either case. needle must be lower case and hold no k or s
// (see maskRule).
func containsFoldASCII(s, needle string) bool {
	first := needle[0]
	upper := first
	if 'a' <= first && first <= 'z' {
		upper = first - 'a' + 'A'
	}
	for i := 0; i+len(needle) <= len(s); i++ {
		if c := s[i]; c != first && c != upper {
			continue
		}
		j := 1
		for ; j < len(needle); j++ {
			c := s[i+j]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != needle[j] {
				break
			}
		}
		if j == len(needle) {
			return true
		}
	}
	return false
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

// needleBigrams finds the maskNeedles in one pass: bit b is set when some
// needle starts with the two bytes b>>8, b&0xff.
var needleBigrams = func() (x [1 << 16 / 64]uint64) {
	for _, n := range maskNeedles {
		bg := uint16(n[0])<<8 | uint16(n[1])
		x[bg/64] |= 1 << (bg % 64)
	}
	return x
}()

// maskNeedleStrings are maskNeedles as strings.
var maskNeedleStrings = func() []string {
	s := make([]string, len(maskNeedles))
	for i, n := range maskNeedles {
		s[i] = string(n)
	}
	return s
}()

// mayHoldSecret reports whether b contains one of maskNeedles (every
// needle is at least two bytes long).
func mayHoldSecret[T string | []byte](b T) bool {
	for i := 0; i+1 < len(b); i++ {
		bg := uint16(b[i])<<8 | uint16(b[i+1])
		if needleBigrams[bg/64]&(1<<(bg%64)) == 0 {
			continue
		}
		for _, n := range maskNeedleStrings {
			if n[0] == b[i] && n[1] == b[i+1] && len(b)-i >= len(n) && string(b[i:i+len(n)]) == n {
				return true
			}
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
	if !mayHoldSecret(s) {
		return s
	}
	for _, r := range maskRules {
		if r.need(s) {
			s = r.re.ReplaceAllString(s, r.repl)
		}
	}
	return s
}

// MaskJSON returns the JSON value b with MaskString applied to every string
// value in it (object keys are kept). b is returned as it is when it holds
// no candidate secret, and when it is not valid JSON (Validate reports that).
// The result is compact JSON with object keys sorted.
func MaskJSON(b []byte) []byte {
	if !mayHoldSecret(b) || stringsUnmasked(b) {
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

// stringsUnmasked reports whether MaskString leaves every JSON string
// token of b as it is, so that MaskJSON returns b without decoding it into
// values. It looks at every string, keys and text after the first value
// included, so it may answer false where MaskJSON changes nothing (MaskJSON
// then decodes b and finds out); it answers true only when no string value
// MaskJSON would see changes. A string without escapes, in valid UTF-8 and
// without control characters decodes to its bytes; any other is decoded
// as encoding/json decodes it.
func stringsUnmasked(b []byte) bool {
	for i := 0; i < len(b); {
		q := bytes.IndexByte(b[i:], '"')
		if q < 0 {
			return true
		}
		start := i + q
		end, plain := start+1, true
		for end < len(b) && b[end] != '"' {
			if c := b[end]; c == '\\' {
				plain = false
				end++
			} else if c < 0x20 || c >= utf8.RuneSelf {
				plain = false
			}
			end++
		}
		if end >= len(b) {
			return false // unterminated: let the decoder judge
		}
		tok := b[start : end+1]
		i = end + 1
		if plain || (utf8.Valid(tok) && !bytes.ContainsRune(tok, '\\') && !hasControl(tok)) {
			if !mayHoldSecret(tok) {
				continue
			}
			if str := string(tok[1 : len(tok)-1]); MaskString(str) != str {
				return false
			}
			continue
		}
		var str string
		if err := json.Unmarshal(tok, &str); err != nil {
			return false
		}
		if MaskString(str) != str {
			return false
		}
	}
	return true
}

func hasControl(b []byte) bool {
	for _, c := range b {
		if c < 0x20 {
			return true
		}
	}
	return false
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
