package events

import (
	"bytes"
	"encoding/base64"
	"math/bits"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// Redacted replaces every secret Mask finds.
const Redacted = "[REDACTED]"

// maskRule is one kind of secret. re finds it; the secret is the text of
// the first group named "s" that took part in the match (the whole match
// when re has no such group), and it alone is replaced by Redacted: the
// rest of the match (a key name, a scheme, a user) is kept. keep, when set,
// leaves a match as it is (a placeholder, a variable, a type name); it gets
// the text, the lower-case text of the group named "k" (the key's secret
// word, or "") and the secret's bounds.
//
// needles are lower-case ASCII literals: every text re can match holds one
// of them, in any ASCII case. The prefilter (maskCandidates) runs a rule
// only on text that holds one of its needles, and need, when set, is one
// more cheap test every text re can match passes. Patterns spell letters
// as [Aa] classes rather than (?i), which would also fold k and s into the
// Kelvin sign and the long s, that no ASCII needle sees.
type maskRule struct {
	name    string
	needles []string
	re      *regexp.Regexp
	need    func(s string) bool
	keep    func(s, word string, a, z int) bool
	// multiLine is set on the rules whose matches may hold a line break;
	// they come first in maskRules. The others run line by line.
	multiLine bool

	secret []int // indexes of the groups named "s"
	word   int   // index of the group named "k" (the key's secret word), or 0
}

// ci returns a pattern matching word with its ASCII letters in either case;
// a '_' in word matches one optional '_', '.' or '-' (api_key matches
// apikey, api-key and API.KEY).
func ci(word string) string {
	var b strings.Builder
	for i := 0; i < len(word); i++ {
		switch c := word[i]; {
		case 'a' <= c && c <= 'z':
			b.WriteByte('[')
			b.WriteByte(c - 'a' + 'A')
			b.WriteByte(c)
			b.WriteByte(']')
		case c == '_':
			b.WriteString(`[_.-]?`)
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	return b.String()
}

func ciAny(words ...string) string {
	alt := make([]string, len(words))
	for i, w := range words {
		alt[i] = ci(w)
	}
	return "(?:" + strings.Join(alt, "|") + ")"
}

// secretWords are the words a key ends with when its value is a secret
// (GITHUB_TOKEN, db.password, clientSecret, x-api-key). A key that only
// contains one (token_count, password_file, max_tokens) is not one.
var secretWords = []string{"password", "passwd", "passphrase", "pwd", "secret", "token", "api_key", "access_key", "secret_key", "private_key", "auth"}

// secretWordNeedles are needles for secretWords: each word holds one.
var secretWordNeedles = []string{"assw", "assph", "pwd", "ecret", "oken", "api", "ccess", "rivat", "auth"}

// Patterns shared by the key/value rules.
const (
	// kvQuote is an optional quote closing a key: "password": or \"password\":.
	kvQuote = `\\?["'` + "`" + `]?`
	// kvSep is the separator of a key and its value, with the spaces and
	// Markdown bold (**Password:** x) around it: = : := =>.
	kvSep = `\*{0,2}[ \t]*(?::=|=>|[:=])[ \t]*\*{0,2}[ \t]*`
	// unquotedClass is what an unquoted value is made of: anything up to
	// white space, a quote, or a separator of a query string, header list,
	// call or literal.
	unquotedClass = `[^\s"'` + "`" + `\\&,;<>()\[\]{}]`
)

// valueAlts returns the alternatives of a value: Redacted itself (so that
// masked text is a fixed point), a string in escaped quotes (JSON inside a
// JSON string), in double or single quotes (with escapes), or unquoted,
// whose first byte is none of notFirst.
func valueAlts(notFirst string) string {
	return `(?:(?P<s>\[REDACTED\])` +
		`|\\"(?P<s>[^"\\\r\n]+)` +
		`|"(?P<s>(?:\\.|[^"\\\r\n])+)` +
		`|'(?P<s>(?:\\.|[^'\\\r\n])+)` +
		`|(?P<s>[^\s"'` + "`" + `\\&,;<>()\[\]{}` + notFirst + `]` + unquotedClass + `*))`
}

var maskRules = []maskRule{
	// PEM private keys (RFC 7468), whole blocks across lines: PKCS#1 RSA,
	// SEC 1 EC, PKCS#8 (PRIVATE, ENCRYPTED PRIVATE), OPENSSH, PGP. The
	// BEGIN and END lines are kept; a block cut off before its END line is
	// masked to the end of the text. The line breaks may be escaped (\n,
	// as in JSON inside a string).
	{name: "pem-private-key", needles: []string{"private key"}, multiLine: true,
		re: regexp.MustCompile(`-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----(?:\s|\\[rn])*(?P<s>[^-](?s:.*?))` +
			`(?:(?:\s|\\[rn])*-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|(?:\s|\\[rn])*\z)`)},
	// RFC 6750 bearer tokens, as in "Authorization: Bearer <token>".
	{name: "bearer", needles: []string{"earer"},
		re: regexp.MustCompile(`\b` + ci("bearer") + `[ \t]+(?P<s>[A-Za-z0-9._~+/=-]{8,})`)},
	// The credentials of an Authorization or Proxy-Authorization header
	// (RFC 9110 section 11.6), whatever the scheme: the scheme is kept.
	{name: "authorization", needles: []string{"authorization"},
		re: regexp.MustCompile(`\b(?:` + ci("proxy-") + `)?(?P<k>` + ci("authorization") + `)` + kvQuote + `[ \t]*[:=][ \t]*\\?["']?` +
			`(?:[A-Za-z][A-Za-z0-9-]*[ \t]+)?(?P<s>\[REDACTED\]|[A-Za-z0-9._~+/-][A-Za-z0-9._~+/=-]*)`),
		need: authNeed, keep: keepKeyValue},
	// HTTP Basic credentials (RFC 7617) outside a header: "basic" and
	// base64 that decodes to user:password.
	{name: "basic-auth", needles: []string{"basic"},
		re:   regexp.MustCompile(`\b` + ci("basic") + `[ \t]+(?P<s>[A-Za-z0-9+/]{4,}={0,2})`),
		keep: func(s, _ string, a, z int) bool { return !isBasicCredentials(s[a:z]) }},
	// curl's -u / --user user:password (HTTP Basic from the command line).
	{name: "curl-user", needles: []string{"curl"},
		re:   regexp.MustCompile(`\b` + ci("curl") + `\b[^\r\n]*?[ \t](?:--user|-u)(?:[ \t]+|=)?\\?["']?[^\s:"'\\]+:(?P<s>\[REDACTED\]|[^\s"'\\]+)`),
		need: func(s string) bool { return strings.Contains(s, "-u") },
		keep: func(s, _ string, a, _ int) bool { return s[a] == '$' }},
	// Credentials in a URL's userinfo (RFC 3986 section 3.2.1): keep the
	// scheme and user, drop the password (up to the last @ of the
	// authority). The user may be empty (redis://:password@host).
	{name: "url-credentials", needles: []string{"://"},
		re:   regexp.MustCompile(`\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@"'\\]*:(?P<s>[^\s/"'\\]+)@`),
		need: func(s string) bool { return strings.IndexByte(s, '@') >= 0 }},
	// key=value, key: value, key := value, "key": "value" and env
	// assignments (export GITHUB_TOKEN=...), for every key that ends with
	// one of secretWords.
	{name: "key-value", needles: secretWordNeedles,
		re:   regexp.MustCompile(`(?P<k>` + ciAny(secretWords...) + `)` + kvQuote + kvSep + valueAlts(`=:`)),
		need: kvNeed, keep: keepKeyValue},
	// Command-line flags with the value after a space: --password x.
	{name: "flag", needles: secretWordNeedles,
		re:   regexp.MustCompile(`--[A-Za-z0-9-]*?(?P<k>` + ciAny(secretWords...) + `)[ \t]+` + valueAlts(`=:-`)),
		need: func(s string) bool { return strings.Contains(s, "--") }, keep: keepKeyValue},
	// Cookie and Set-Cookie headers (RFC 6265): every cookie of a Cookie
	// header, the first (the cookie itself, not its attributes) of a
	// Set-Cookie header.
	{name: "cookie", needles: []string{"ookie"},
		re:   regexp.MustCompile(`(?:^|[^A-Za-z0-9_-])(?P<k>` + ci("cookie") + `)` + kvQuote + `[ \t]*:[ \t]*\\?["']?(?P<s>[^\r\n"'\\]*[^\s"'\\])`),
		need: cookieNeed, keep: keepKeyValue},
	{name: "set-cookie", needles: []string{"ookie"},
		re:   regexp.MustCompile(ci("set-cookie") + kvQuote + `[ \t]*:[ \t]*\\?["']?[^=;\s"'\\]+=(?P<s>[^;\s"'\\]+)`),
		need: cookieNeed},
	// AWS access key ids: AKIA (long-term) and ASIA (temporary), 20 characters.
	{name: "aws-access-key-id", needles: []string{"akia", "asia"},
		re: regexp.MustCompile(`\b(?:AKIA|ASIA)[0-9A-Z]{16}\b`)},
	// JSON Web Tokens (RFC 7519) in compact form: a JSON header and a JSON
	// payload in base64url both start with eyJ ({").
	{name: "jwt", needles: []string{"eyj"},
		re:   regexp.MustCompile(`\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*`),
		need: func(s string) bool { return strings.IndexByte(s, '.') >= 0 }},
	// Provider and forge keys by their documented prefixes.
	{name: "anthropic-key", needles: []string{"sk-"},
		re: regexp.MustCompile(`\bsk-ant-[A-Za-z0-9_-]{8,}`)},
	{name: "openai-key", needles: []string{"sk-"},
		re: regexp.MustCompile(`\bsk-[A-Za-z0-9_-]{16,}`)},
	{name: "stripe-key", needles: []string{"sk_live_", "sk_test_", "rk_live_", "rk_test_", "whsec_"},
		re: regexp.MustCompile(`\b(?:[sr]k_(?:live|test)_[A-Za-z0-9]{10,}|whsec_[A-Za-z0-9+/=]{16,})`)},
	{name: "github-token", needles: []string{"ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"},
		re: regexp.MustCompile(`\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})`)},
	{name: "gitlab-token", needles: []string{"glpat-", "glptt-", "gldt-", "glrt-", "glcbt-", "gloas-", "glsoat-", "glffct-", "glimt-", "glagent-"},
		re: regexp.MustCompile(`\bgl(?:pat|ptt|dt|rt|cbt|oas|soat|ffct|imt|agent)-[A-Za-z0-9_-]{20,}`)},
	{name: "slack-token", needles: []string{"xox", "xapp-"},
		re: regexp.MustCompile(`\b(?:xox[abprse]-[A-Za-z0-9-]{10,}|xapp-[0-9]+-[A-Za-z0-9-]{10,})`)},
	{name: "google-api-key", needles: []string{"aiza"},
		re: regexp.MustCompile(`\bAIza[0-9A-Za-z_-]{35}`)},
	{name: "huggingface-token", needles: []string{"hf_"},
		re: regexp.MustCompile(`\bhf_[A-Za-z0-9]{30,}`)},
	{name: "npm-token", needles: []string{"npm_"},
		re: regexp.MustCompile(`\bnpm_[A-Za-z0-9]{36}\b`)},
	{name: "pypi-token", needles: []string{"pypi-"},
		re: regexp.MustCompile(`\bpypi-AgE[A-Za-z0-9_-]{50,}`)},
}

// multiLineRules has bit i set when maskRules[i] is multiLine.
var multiLineRules uint64

func init() {
	for i := range maskRules {
		r := &maskRules[i]
		if r.multiLine {
			if i > 0 && !maskRules[i-1].multiLine {
				panic("events: mask rule " + r.name + " is multiLine after one that is not")
			}
			multiLineRules |= 1 << i
		}
		for g, name := range r.re.SubexpNames() {
			switch name {
			case "s":
				r.secret = append(r.secret, g)
			case "k":
				r.word = g
			}
		}
	}
}

// keyBeforeSep reports whether s holds one of words (as ci spells them),
// then optional quotes, backslashes, asterisks, spaces and tabs, then one
// of the bytes of seps: the start of every match of a key/value rule, found
// without running its expression.
func keyBeforeSep(s string, words []string, seps string) bool {
	for i := 0; i < len(s); i++ {
		j := strings.IndexAny(s[i:], seps)
		if j < 0 {
			return false
		}
		i += j
		k := i
		for k > 0 && strings.IndexByte(" \t*\"'`\\", s[k-1]) >= 0 {
			k--
		}
		for _, w := range words {
			if suffixFold(s[:k], w) > 0 {
				return true
			}
		}
	}
	return false
}

func kvNeed(s string) bool     { return keyBeforeSep(s, secretWords, ":=") }
func authNeed(s string) bool   { return keyBeforeSep(s, authWords, ":=") }
func cookieNeed(s string) bool { return keyBeforeSep(s, cookieWords, ":") }

var (
	authWords   = []string{"authorization"}
	cookieWords = []string{"cookie"}
)

// replace masks every match of r in s, whatever r's needles and need say.
func (r *maskRule) replace(s string) string {
	ms := r.re.FindAllStringSubmatchIndex(s, -1)
	if ms == nil {
		return s
	}
	var b strings.Builder
	last := 0
	for _, m := range ms {
		a, z := m[0], m[1]
		for _, g := range r.secret {
			if m[2*g] >= 0 {
				a, z = m[2*g], m[2*g+1]
				break
			}
		}
		if s[a:z] == Redacted {
			continue
		}
		if word := ""; r.keep != nil {
			if r.word > 0 && m[2*r.word] >= 0 {
				word = strings.ToLower(s[m[2*r.word]:m[2*r.word+1]])
			}
			if r.keep(s, word, a, z) {
				continue
			}
		}
		if b.Len() == 0 {
			b.Grow(len(s))
		}
		b.WriteString(s[last:a])
		b.WriteString(Redacted)
		last = z
	}
	if b.Len() == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

// keepKeyValue is the keep of the key/value rules: it leaves values that
// are code or placeholders rather than secrets (see keepValue), and an
// unquoted value that is the name of a function called or a value indexed
// (password = getpass(), token = os.environ["T"]).
func keepKeyValue(s, word string, a, z int) bool {
	quoted := a > 0 && (s[a-1] == '"' || s[a-1] == '\'')
	if !quoted && z < len(s) && (s[z] == '(' || s[z] == '[') {
		return true
	}
	return keepValue(word, s[a:z], quoted)
}

// keepWords are values of a secret key that are not secrets: keywords,
// type names and auth scheme names.
var keepWords = map[string]bool{
	"null": true, "nil": true, "none": true, "undefined": true, "true": true, "false": true,
	"string": true, "str": true, "bool": true, "boolean": true, "int": true, "integer": true, "number": true,
	"any": true, "object": true, "optional": true, "required": true, "bytes": true, "secretstr": true,
	"await": true, "new": true, "function": true, "async": true, "lambda": true, "yield": true, "return": true,
	"basic": true, "bearer": true, "digest": true,
}

// codeRoots are the roots of dotted names that read a secret from
// somewhere rather than hold it (token = process.env.GITHUB_TOKEN).
var codeRoots = []string{"process.env.", "import.meta.env.", "os.environ", "os.getenv", "env.", "secrets.", "config.", "settings.",
	"self.", "this.", "args.", "opts.", "options.", "params.", "props.", "req.", "request.", "ctx.", "cfg.", "conf.", "vars.",
	"values.", "creds.", "credentials.", "user.", "form.", "data.", "input.", "inputs."}

// keepValue reports whether v, the value of a key whose secret word is
// word (lower case), is not a secret: a keyword or type name, the key's
// own name (password=password), a variable ($TOKEN, ${{ secrets.X }},
// {{ .Values.pw }}), a format verb (%s), a placeholder (<your-token>), a
// count (token: 5), a directory (PWD=/home/x), or, unquoted, a variable
// named for what it holds (token: csrfToken) or a dotted name under a
// codeRoot.
func keepValue(word, v string, quoted bool) bool {
	if v == "" {
		return true
	}
	lv := strings.ToLower(v)
	switch {
	case keepWords[lv], squash(lv) == squash(word):
		return true
	case v[0] == '$', strings.HasPrefix(v, "{{"), v[0] == '<' && v[len(v)-1] == '>':
		return true
	case v[0] == '%' && (len(v) <= 3 || v[1] == '('):
		return true
	case squash(word) == "token" && allDigits(v):
		return true
	case word == "pwd" && (v[0] == '/' || v[0] == '~'):
		return true
	case !quoted && isIdent(v) && strings.HasSuffix(squash(lv), squash(word)):
		return true // a variable named for what it holds: token: csrfToken
	case !quoted:
		for _, root := range codeRoots {
			if strings.HasPrefix(lv, root) {
				return true
			}
		}
	}
	return false
}

// squash drops the separators of a key word (api_key, api-key: apikey).
func squash(s string) string {
	if !strings.ContainsAny(s, "_.-") {
		return s
	}
	return strings.Map(func(r rune) rune {
		if r == '_' || r == '.' || r == '-' {
			return -1
		}
		return r
	}, s)
}

// isIdent reports whether s is an identifier: [A-Za-z_][A-Za-z0-9_]*.
func isIdent(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '_' || i > 0 && '0' <= c && c <= '9') {
			return false
		}
	}
	return s != ""
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// isBasicCredentials reports whether b64 is base64 (padded or not) of
// printable UTF-8 text with a colon: user:password.
func isBasicCredentials(b64 string) bool {
	raw, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(b64, "="))
	if err != nil || !utf8.Valid(raw) {
		return false
	}
	for _, c := range raw {
		if c < 0x20 || c == 0x7f {
			return false
		}
	}
	return bytes.IndexByte(raw, ':') >= 0
}

// secretKeyWord returns the secret word (lower case, as spelled in k) of
// an object key whose string value is a secret: a key that ends with one
// of secretWords, as the key/value rule reads keys, or an Authorization,
// Proxy-Authorization, Cookie or Set-Cookie header name. It returns false
// for any other key.
func secretKeyWord(k string) (string, bool) {
	switch {
	case equalFoldASCII(k, "authorization"), equalFoldASCII(k, "proxy-authorization"):
		return "authorization", true
	case equalFoldASCII(k, "cookie"), equalFoldASCII(k, "set-cookie"):
		return "cookie", true
	}
	for _, w := range secretWords {
		if n := suffixFold(k, w); n > 0 {
			return strings.ToLower(k[len(k)-n:]), true
		}
	}
	return "", false
}

// equalFoldASCII reports whether s is lower, ASCII letters in either case.
func equalFoldASCII(s, lower string) bool {
	return len(s) == len(lower) && suffixFold(s, lower) == len(s)
}

// suffixFold returns the length of the suffix of s that ci(word) matches,
// or 0: ASCII letters in either case, and a '_' of word matching one
// optional '_', '.' or '-'.
func suffixFold(s, word string) int {
	i := len(s)
	for j := len(word) - 1; j >= 0; j-- {
		if word[j] == '_' {
			if i > 0 && (s[i-1] == '_' || s[i-1] == '.' || s[i-1] == '-') {
				i--
			}
			continue
		}
		if i == 0 || lowerASCII[s[i-1]] != word[j] {
			return 0
		}
		i--
	}
	return len(s) - i
}

// maskKeyed returns v, the string value of object key k, with all of it
// replaced by Redacted when k names a secret (see secretKeyWord) and v is
// one (see keepValue); the scheme of an Authorization value is kept.
func maskKeyed(k, v string) string {
	word, ok := secretKeyWord(k)
	if !ok || v == Redacted || keepValue(word, v, true) {
		return v
	}
	if word == "authorization" {
		if i := strings.IndexAny(v, " \t"); i > 0 && isScheme(v[:i]) {
			if rest := strings.TrimLeft(v[i:], " \t"); rest == Redacted || rest == "" {
				return v
			}
			return v[:i] + " " + Redacted
		}
	}
	return Redacted
}

func isScheme(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || i > 0 && ('0' <= c && c <= '9' || c == '-')) {
			return false
		}
	}
	return true
}

// The prefilter: one pass over the text finds every needle of every rule,
// in any ASCII case, and so the rules worth running. A text with none is
// returned as it is without running a regular expression.
type maskNeedle struct {
	lower string
	rules uint64 // bit i: maskRules[i] has this needle
}

var (
	// lowerASCII maps ASCII upper-case letters to lower case.
	lowerASCII = func() (t [256]byte) {
		for i := range t {
			t[i] = byte(i)
			if 'A' <= i && i <= 'Z' {
				t[i] = byte(i + 'a' - 'A')
			}
		}
		return t
	}()
	// needleBigrams has bit b set when some needle starts with the two
	// bytes b>>8, b&0xff, in some ASCII case; needleGroup maps those
	// bytes to 1 + the index in needleGroups of the needles that start
	// with them.
	needleBigrams [1 << 16 / 64]uint64
	needleGroup   [1 << 16]uint8
	needleGroups  = [][]maskNeedle{nil}
)

func init() {
	if len(maskRules) > 64 {
		panic("events: more than 64 mask rules")
	}
	byText := map[string]uint64{}
	var texts []string
	for i, r := range maskRules {
		for _, n := range r.needles {
			if len(n) < 2 || strings.ToLower(n) != n {
				panic("events: mask needle " + strconv.Quote(n) + " is not lower case of two bytes or more")
			}
			if _, ok := byText[n]; !ok {
				texts = append(texts, n)
			}
			byText[n] |= 1 << i
		}
	}
	slices.Sort(texts)
	for _, n := range texts {
		lb := uint16(n[0])<<8 | uint16(n[1])
		g := needleGroup[lb]
		if g == 0 {
			if len(needleGroups) > 255 {
				panic("events: more than 255 two-byte starts of mask needles")
			}
			needleGroups = append(needleGroups, nil)
			g = uint8(len(needleGroups) - 1)
		}
		needleGroups[g] = append(needleGroups[g], maskNeedle{n, byText[n]})
		for _, c0 := range caseVariants(n[0]) {
			for _, c1 := range caseVariants(n[1]) {
				bg := uint16(c0)<<8 | uint16(c1)
				needleBigrams[bg/64] |= 1 << (bg % 64)
				needleGroup[bg] = g
			}
		}
	}
}

func caseVariants(c byte) []byte {
	if 'a' <= c && c <= 'z' {
		return []byte{c, c - 'a' + 'A'}
	}
	return []byte{c}
}

// maskCandidates returns the set of rules (bit i for maskRules[i]) whose
// needles b holds; with first set, it stops at the first needle found.
func maskCandidates[T string | []byte](b T, first bool) uint64 {
	var rules uint64
	for i := 0; i+1 < len(b); i++ {
		bg := uint16(b[i])<<8 | uint16(b[i+1])
		if needleBigrams[bg/64]&(1<<(bg%64)) == 0 {
			continue
		}
	needles:
		for _, n := range needleGroups[needleGroup[bg]] {
			if rules&n.rules == n.rules || len(b)-i < len(n.lower) {
				continue
			}
			for j := 2; j < len(n.lower); j++ {
				if lowerASCII[b[i+j]] != n.lower[j] {
					continue needles
				}
			}
			rules |= n.rules
			if first {
				return rules
			}
		}
	}
	return rules
}

// mayHoldSecret reports whether b holds a needle of some rule.
func mayHoldSecret[T string | []byte](b T) bool { return maskCandidates(b, true) != 0 }

// MaskString returns s with every secret it finds replaced by Redacted,
// keeping what says what the secret was (a key name, a header name and
// scheme, a URL's scheme and user, a PEM block's BEGIN and END lines).
// Text without a secret is returned unchanged, and masking is idempotent:
// masked text masks to itself. docs/masking.md has an example of each form.
//
// Covered:
//   - Authorization and Proxy-Authorization headers, any scheme (Basic,
//     Bearer, token...), and RFC 6750 "Bearer <token>" anywhere;
//   - HTTP Basic credentials: "basic <base64 of user:password>", curl -u
//     user:password, and URL userinfo (https://user:pass@host keeps the
//     user; redis://:pass@host);
//   - a key that ends with password, passwd, passphrase, pwd, secret,
//     token, api_key, access_key, secret_key, private_key or auth (in any
//     case, with _ - . or nothing between the parts: GITHUB_TOKEN,
//     db.password, clientSecret, x-api-key, AWS_SECRET_ACCESS_KEY), then =
//     : := or =>, then a value, quoted ("x", 'x', \"x\") or not (up to
//     white space or , ; & < > ( ) [ ] { } quotes): env assignments with
//     or without export, query strings, YAML, JSON text, headers
//     (X-Auth-Token:), keyword arguments; and --password x flags;
//   - Cookie headers (every cookie) and Set-Cookie headers (the cookie, not
//     its attributes);
//   - PEM private key blocks, across lines (RSA, EC, PKCS#8, ENCRYPTED,
//     OPENSSH, PGP);
//   - by shape: JWTs (eyJ...eyJ...sig), AWS access key ids (AKIA, ASIA),
//     Anthropic (sk-ant-), OpenAI (sk-), Stripe (sk_live_, sk_test_,
//     rk_live_, rk_test_, whsec_), GitHub (ghp_ gho_ ghu_ ghs_ ghr_
//     github_pat_), GitLab (glpat- and the other gl...- prefixes), Slack
//     (xoxb- xoxp- xoxa- xoxr- xoxs- xoxe- xapp-), Google (AIza),
//     Hugging Face (hf_), npm (npm_) and PyPI (pypi-AgE) keys.
//
// A key's value is kept when it is code or a placeholder, not a secret:
// null, true, a type name (password: string), the key's own name, a
// variable ($TOKEN, {{ .Values.pw }}), a format verb, <your-token>, a
// number after a token key (token: 5), a directory after PWD, a call or
// index (password = getpass(), os.environ["PW"]) or a dotted name read from
// config (token = process.env.GITHUB_TOKEN).
//
// Not covered: a secret with nothing around it that says so (a password in
// prose, "the password is hunter2", a random string with no known
// prefix), a key not in the list (DB_KEY=, sig=, SAS tokens, private_key_id
// is not, signature=), an unquoted value's part after white space, a
// flag's value after a space other than --<...secret word> (mysql -p,
// -u user pass), a secret split across strings or events, and secrets in
// encodings (base64 of a .env file, URL-encoded keys other than in a
// query string).
func MaskString(s string) string {
	rules := maskCandidates(s, false)
	if rules == 0 {
		return s
	}
	s = applyRules(s, rules&multiLineRules)
	if rules&^multiLineRules == 0 {
		return s
	}
	// The other rules never match a line break and are not changed by one,
	// so each runs on the lines that hold one of its needles only, which
	// is the same as running it on the whole text, and much cheaper when
	// the text is long.
	if strings.IndexByte(s, '\n') < 0 {
		return applyRules(s, rules&^multiLineRules)
	}
	var b strings.Builder
	done := 0 // s[:done] is in b, or needs no change when b is empty
	for start := 0; start < len(s); {
		end := strings.IndexByte(s[start:], '\n')
		if end < 0 {
			end = len(s)
		} else {
			end += start
		}
		line := s[start:end]
		if lr := maskCandidates(line, false) &^ multiLineRules; lr != 0 {
			if m := applyRules(line, lr); m != line {
				b.Grow(len(s) - done + len(m))
				b.WriteString(s[done:start])
				b.WriteString(m)
				done = end
			}
		}
		start = end + 1
	}
	if done == 0 {
		return s
	}
	b.WriteString(s[done:])
	return b.String()
}

// applyRules runs the rules of the set (bit i for maskRules[i]) on s, in
// order, each one whose need s passes.
func applyRules(s string, rules uint64) string {
	for rules != 0 {
		i := bits.TrailingZeros64(rules)
		rules &^= 1 << i
		if r := &maskRules[i]; r.need == nil || r.need(s) {
			s = r.replace(s)
		}
	}
	return s
}

// MaskJSON returns the JSON value b with every secret in it replaced by
// Redacted: MaskString applied to every string, keys included; the whole
// string value of a key that names a secret ({"password": "x"}, {"env":
// {"GITHUB_TOKEN": "..."}}, {"Authorization": "Basic ..."} keeps its
// scheme; see MaskString for the key words, and the values kept); a key
// that itself holds a secret is masked too ({"sk-ant-...": 1} becomes
// {"[REDACTED]": 1}), and when two keys would then be equal the second, in
// sorted order of the keys before masking, gets "#2", the third "#3". The
// result is compact JSON with object keys sorted, and it is still valid
// JSON of the same shape: only strings change. b is returned as it is
// when it holds no candidate secret, and when it is not valid JSON
// (Validate reports that).
func MaskJSON(b []byte) []byte {
	if !mayHoldSecret(b) && !hidesNeedle(b) {
		return b
	}
	// The string found to change is masked once: usually it is the one.
	var in, out string
	str := func(s string) string {
		if s == in {
			return out
		}
		return MaskString(s)
	}
	if stringsUnmasked(b, func(s string) string {
		in, out = s, MaskString(s)
		return out
	}) {
		return b
	}
	return maskJSONWith(b, str)
}

// hidesNeedle reports whether the JSON text b holds an escape that may
// decode to a byte of a needle (\u0073k-..., https:\/\/), so that a
// string may hold a needle its bytes do not show. The other escapes decode
// to bytes no needle holds (\n, \", \\).
func hidesNeedle(b []byte) bool {
	return bytes.Contains(b, []byte(`\u`)) || bytes.Contains(b, []byte(`\/`))
}

// maskJSONWith is MaskJSON past its fast paths, with str masking each
// string (tests compare it with the rules alone).
//
// A value is decoded into maps, slices, strings and, for numbers, their
// literal (so they are written back as they were). An object that holds a
// key twice (which Validate refuses: no reader sees it) is decoded by
// merging two objects and keeping the last value otherwise, while the
// bytes still hold both; it is re-encoded whenever one of its strings
// holds a secret, even one that would not be kept, so that the secret
// leaves the bytes too.
func maskJSONWith(b []byte, str func(string) string) []byte {
	v, dup, err := decodeForMask(b)
	if err != nil {
		return b
	}
	changed := false
	v = maskValue(v, str, &changed)
	if !changed && !(dup && !stringsUnmasked(b, str)) {
		return b
	}
	out, err := json.Marshal(v, json.Deterministic(true), jsontext.AllowInvalidUTF8(true), jsontext.EscapeForJS(true))
	if err != nil {
		return b
	}
	return out
}

// decodeForMask decodes the first JSON value of b (see maskJSONWith) and
// reports whether some object of it holds a key twice. Invalid UTF-8
// reads as U+FFFD.
func decodeForMask(b []byte) (v any, dup bool, err error) {
	dec := jsontext.NewDecoder(bytes.NewReader(b), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	v, err = maskedValue(dec, &dup)
	return v, dup, err
}

func maskedValue(dec *jsontext.Decoder, dup *bool) (any, error) {
	tok, err := dec.ReadToken()
	if err != nil {
		return nil, err
	}
	switch tok.Kind() {
	case '{':
		m := map[string]any{}
		for dec.PeekKind() != '}' {
			kt, err := dec.ReadToken()
			if err != nil {
				return nil, err
			}
			k := kt.String() // before the next read: the token is only valid until then
			x, err := maskedValue(dec, dup)
			if err != nil {
				return nil, err
			}
			if old, ok := m[k]; ok {
				*dup = true
				x = mergeValues(old, x)
			}
			m[k] = x
		}
		_, err := dec.ReadToken()
		return m, err
	case '[':
		a := []any{}
		for dec.PeekKind() != ']' {
			x, err := maskedValue(dec, dup)
			if err != nil {
				return nil, err
			}
			a = append(a, x)
		}
		_, err := dec.ReadToken()
		return a, err
	case '"':
		return tok.String(), nil
	case '0':
		return jsontext.Value(tok.String()), nil // the literal, as written
	case 't', 'f':
		return tok.Bool(), nil
	}
	return nil, nil // null
}

func mergeValues(old, x any) any {
	om, ok := old.(map[string]any)
	xm, ok2 := x.(map[string]any)
	if !ok || !ok2 {
		return x
	}
	for k, v := range xm {
		om[k] = mergeValues(om[k], v)
	}
	return om
}

// stringsUnmasked reports whether MaskJSON, masking strings with str,
// leaves every JSON string token of b as it is, so that MaskJSON returns b without decoding it into
// values. It looks at every string, keys and text after the first value
// included, and answers false for any string that names a secret key, so
// it may answer false where MaskJSON changes nothing (MaskJSON then decodes
// b and finds out); it answers true only when no string MaskJSON would
// see changes. A string without escapes, in valid UTF-8 and without
// control characters decodes to its bytes; any other is decoded as
// encoding/json decodes it.
func stringsUnmasked(b []byte, str func(string) string) bool {
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
		var text string
		if plain || (utf8.Valid(tok) && !bytes.ContainsRune(tok, '\\') && !hasControl(tok)) {
			if !mayHoldSecret(tok) {
				continue
			}
			text = string(tok[1 : len(tok)-1])
		} else {
			u, err := jsontext.AppendUnquote(nil, tok)
			if err != nil {
				return false // invalid: the slow path decides
			}
			text = string(u)
		}
		if str(text) != text {
			return false
		}
		if _, ok := secretKeyWord(text); ok {
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

// maskValue masks v, a value decodeForMask made, in place, with str
// masking each string, and sets *changed when anything changed (see
// MaskJSON).
func maskValue(v any, str func(string) string, changed *bool) any {
	switch t := v.(type) {
	case string:
		if m := str(t); m != t {
			*changed = true
			return m
		}
	case []any:
		for i := range t {
			t[i] = maskValue(t[i], str, changed)
		}
	case map[string]any:
		var renamed []string
		for k, x := range t {
			x = maskValue(x, str, changed)
			if s, ok := x.(string); ok {
				if m := maskKeyed(k, s); m != s {
					*changed = true
					x = m
				}
			}
			t[k] = x
			if str(k) != k && !renamedBefore(k, str) {
				renamed = append(renamed, k)
			}
		}
		if len(renamed) == 0 {
			break
		}
		*changed = true
		// Each renamed key takes its masked name, or the first of
		// name#2, name#3, ... that is free, in sorted order of the keys
		// before masking. The renamed keys leave first, so the object
		// only grows as they come back, and each masked name's search
		// goes on from where the last one with that name stopped: a
		// search from #2 for every key made 16,000 secret keys of one
		// event (448 KB) take 27 s to mask.
		slices.Sort(renamed)
		values := make([]any, len(renamed))
		for i, k := range renamed {
			values[i] = t[k]
			delete(t, k)
		}
		next := map[string]int{}
		for i, k := range renamed {
			mk := str(k)
			nk, n := mk, max(next[mk], 1)
			if n > 1 {
				nk = mk + "#" + strconv.Itoa(n)
			}
			for {
				if _, dup := t[nk]; !dup {
					break
				}
				n++
				nk = mk + "#" + strconv.Itoa(n)
			}
			next[mk] = n + 1
			t[nk] = values[i]
		}
	}
	return v
}

// renamedBefore reports whether object key k is a name masking gives a
// renamed key: a masked name (one str leaves as it is), "#" and a count
// of at least 2. Such a key is kept as it is, so that masking twice
// changes nothing: a rule may mask the count away ("Cookie:
// [REDACTED]#2" masks to "Cookie: [REDACTED]"), and renaming those keys
// again would hand their names out anew, in another order.
func renamedBefore(k string, str func(string) string) bool {
	i := strings.LastIndexByte(k, '#')
	if i <= 0 || i == len(k)-1 {
		return false
	}
	n, err := strconv.Atoi(k[i+1:])
	if err != nil || n < 2 || strconv.Itoa(n) != k[i+1:] {
		return false
	}
	return str(k[:i]) == k[:i]
}

// Mask masks the event in place and reports whether anything was
// replaced: its data (see MaskJSON) and its source, the one envelope
// attribute that is free text (see MaskString). The other attributes are
// ids, tokens, a type name and a time, which must keep their shape: a
// secret there is not masked (a token field in data that masking changes,
// such as parent_session, makes the event invalid, and Log.Append refuses
// it). Log.Append calls Mask on every event before it stores it.
func Mask(e *Event) bool {
	changed := false
	if m := MaskString(e.Source); m != e.Source {
		e.Source = m
		changed = true
	}
	m := MaskJSON(e.Data)
	if len(m) == len(e.Data) && string(m) == string(e.Data) {
		return changed
	}
	e.Data = m
	e.payload = nil // decoded from the unmasked data: decode again
	return true
}
