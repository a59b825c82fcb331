package projections

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/turnstone-dev/turnstone/events"
)

// preview returns the first n runes of s, with invalid UTF-8 replaced, and
// "…" when it cut; it cuts sooner when the JSON encoding of the runes kept
// would pass 4n bytes (see clip), so that a preview of n runes never costs
// a snapshot more than 4n+5 bytes, whatever its characters.
func preview(s string, n int) string { return clip(s, n, 4*n) }

// detail returns s clipped for a reason, a detail or an error message the
// state keeps in a list entry: DetailRunes runes and DetailBytes bytes of
// JSON at most (see clip).
func detail(s string) string { return clip(s, DetailRunes, DetailBytes) }

// previewBytes is preview of the text b (UTF-8; invalid bytes read as
// U+FFFD): the one allocation is the string it returns.
func previewBytes(b []byte, n int) string { return clipBytes(b, n, 4*n) }

// clipBytes is clip of the text b.
func clipBytes(b []byte, runes, maxJSON int) string {
	if !utf8.Valid(b) {
		return clip(string(b), runes, maxJSON)
	}
	// A prefix of plain ASCII counts one rune and one JSON byte a byte.
	j := plainASCII(b[:max(0, min(len(b), runes, maxJSON))])
	if j == len(b) {
		return string(b)
	}
	n, size := j, j
	for j < len(b) {
		w, c := 1, int(asciiJSONLen[b[j]&0x7f])
		if b[j] >= utf8.RuneSelf {
			var r rune
			r, w = utf8.DecodeRune(b[j:])
			c = jsonRuneLen(r)
		}
		if n == runes || size+c > maxJSON {
			return string(b[:j]) + "…"
		}
		n++
		size += c
		j += w
	}
	return string(b)
}

// clip returns the first runes runes of s, with invalid UTF-8 replaced by
// U+FFFD, cut sooner where the JSON encoding of what it keeps (as
// encoding/json writes it: a quote or a backslash is 2 bytes, a control
// character, <, >, &, U+2028 and U+2029 are 6) would pass maxJSON bytes.
// It ends with "…" when it cut, so its JSON encoding is at most maxJSON+5
// bytes with the quotes.
//
// It reads s only as far as it keeps: an invalid byte counts as the
// U+FFFD that replaces it (one rune, 3 bytes of JSON), so the cut falls
// where it would in s with its invalid bytes replaced, and only the part
// kept is checked and mended (a preview of a tool's 1 MB output reads
// some 200 characters of it, not the megabyte).
func clip(s string, runes, maxJSON int) string {
	// A prefix of plain ASCII counts one rune and one JSON byte a byte.
	j := plainASCII(s[:max(0, min(len(s), runes, maxJSON))])
	if j == len(s) {
		return s
	}
	n, size := j, j
	for j < len(s) {
		w, c := 1, int(asciiJSONLen[s[j]&0x7f])
		if s[j] >= utf8.RuneSelf {
			var r rune
			r, w = utf8.DecodeRuneInString(s[j:]) // RuneError, 1 for an invalid byte
			c = jsonRuneLen(r)
		}
		if n == runes || size+c > maxJSON {
			return validKey(s[:j]) + "…"
		}
		n++
		size += c
		j += w
	}
	return validKey(s)
}

// plainASCII returns the length of the longest prefix of s whose bytes
// are each a rune that JSON writes as it is, in one byte: ASCII but the
// control characters, the quote, the backslash, <, > and & (asciiJSONLen
// 1). It tests eight bytes at a time (the "has a zero byte" test on x^c
// for each of the five, the "has less" test for the controls, the high
// bits), then byte by byte from the first word that has one.
func plainASCII[T string | []byte](s T) int {
	const lsb, msb = 0x0101010101010101, 0x8080808080808080
	has := func(v uint64) uint64 { return (v - lsb) &^ v }
	i := 0
	for ; i+8 <= len(s); i += 8 {
		x := uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
			uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
		m := x | ((x - lsb*0x20) &^ x) | has(x^(lsb*'"')) | has(x^(lsb*'\\')) |
			has(x^(lsb*'<')) | has(x^(lsb*'>')) | has(x^(lsb*'&'))
		if m&msb != 0 {
			break
		}
	}
	for ; i < len(s); i++ {
		if c := s[i]; c >= utf8.RuneSelf || asciiJSONLen[c] != 1 {
			break
		}
	}
	return i
}

// asciiJSONLen is jsonRuneLen of each ASCII character.
var asciiJSONLen = func() (t [utf8.RuneSelf]uint8) {
	for r := range t {
		t[r] = uint8(jsonRuneLen(rune(r)))
	}
	return t
}()

// jsonRuneLen is how many bytes encoding/json writes for r inside a
// string.
func jsonRuneLen(r rune) int {
	switch {
	case r == '"' || r == '\\' || r == '\n' || r == '\r' || r == '\t':
		return 2
	case r < 0x20 || r == '<' || r == '>' || r == '&' || r == '\u2028' || r == '\u2029':
		return 6
	}
	return utf8.RuneLen(r)
}

// IDKey returns the form in which the state holds an id (a tool_use id, a
// command id) or another key it compares (a tool name, a stage, a
// provider): s itself when it is at most MaxKeyBytes bytes of characters
// JSON writes as they are (no control character, quote, backslash, <, >,
// & or U+2028/U+2029); else a digest "<prefix>…<hex>" of at most
// MaxKeyBytes bytes: up to 24 bytes of s (characters JSON would escape
// replaced by '_') and the first 24 hex digits of the SHA-256 of s (invalid
// UTF-8 replaced first, as encoding/json does). Two keys are equal when
// the values are (a collision needs a SHA-256 collision on 96 bits, or a
// value crafted to equal another's digest); IDKey of a key is that key.
// The full value stays in the log, in the event at the sequence the state
// names beside the key (ToolCall.UseSeq, Orphan.Seq): see IsDigestKey.
func IDKey(s string) string {
	if len(s) <= MaxKeyBytes && plainKey(s) {
		return s
	}
	v := validKey(s)
	sum := sha256.Sum256([]byte(v))
	var b strings.Builder
	for _, r := range v {
		if b.Len()+utf8.RuneLen(r) > keyPrefixBytes {
			break
		}
		if jsonRuneLen(r) != utf8.RuneLen(r) {
			r = '_'
		}
		b.WriteRune(r)
	}
	b.WriteString(digestMark)
	b.WriteString(hex.EncodeToString(sum[:keyDigestBytes]))
	return b.String()
}

// IsDigestKey reports whether k has the shape of a digest IDKey: the value
// it stands for was too long (or held characters JSON escapes), and only
// the log holds it. A short value that happens to have that shape is its
// own key; a reader that looks the value up in the log finds it all the
// same (IDKey of it is k).
func IsDigestKey(k string) bool {
	i := strings.LastIndex(k, digestMark)
	if i < 0 || len(k)-i-len(digestMark) != 2*keyDigestBytes {
		return false
	}
	_, err := hex.DecodeString(k[i+len(digestMark):])
	return err == nil
}

// The shape of a digest IDKey: at most keyPrefixBytes of the value, the
// mark, and keyDigestBytes of its SHA-256 in hex.
const (
	keyPrefixBytes = 24
	keyDigestBytes = 12
	digestMark     = "…"
)

// plainKey reports whether s is valid UTF-8 that JSON writes as it is.
func plainKey(s string) bool {
	i := plainASCII(s)
	if i == len(s) {
		return true
	}
	for _, r := range s[i:] {
		if r == utf8.RuneError || jsonRuneLen(r) != utf8.RuneLen(r) {
			return false
		}
	}
	return true
}

// tokenKey returns s when it is a subject token (events.ValidToken: at
// most events.MaxTokenLen bytes of [A-Za-z0-9_-]), else IDKey(s): turn ids
// and session names are tokens in every event the log accepts, and the
// state keeps them whole so that they name what the log names.
func tokenKey(s string) string {
	if s == "" || events.ValidToken(s) {
		return s
	}
	return IDKey(s)
}

// validKey returns s with every byte of invalid UTF-8 replaced by U+FFFD,
// exactly as encoding/json does, so that ids compare the same before and
// after a JSON round trip.
func validKey(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// rawPrefix is how much of a raw JSON value the previews read: enough for
// PreviewRunes runes even if each is a 12-byte escaped surrogate pair.
const rawPrefix = 12*PreviewRunes + 64

// digest returns the Block for a content block of the record at seq.
func digest(cb *events.ContentBlock, seq uint64) Block {
	b := Block{Type: IDKey(cb.Type), Seq: seq}
	switch cb.Type {
	case events.BlockText:
		b.Text, b.Size = preview(cb.Text, PreviewRunes), len(cb.Text)
	case events.BlockThinking:
		b.Text, b.Size = preview(cb.Thinking, PreviewRunes), len(cb.Thinking)
	case events.BlockToolUse:
		b.ID, b.Name = IDKey(cb.ID), IDKey(cb.Name)
		var scratch [rawPrefix]byte // the preview's source, on the stack
		b.Text, b.Size = previewBytes(appendCompact(scratch[:0], cb.Input, rawPrefix), PreviewRunes), len(cb.Input)
	case events.BlockToolResult:
		b.ToolUseID, b.IsError = IDKey(cb.ToolUseID), cb.IsError
		var scratch [2 * rawPrefix]byte
		b.Text, b.Size = previewBytes(appendResultText(scratch[:0], cb.Content), PreviewRunes), len(cb.Content)
	default:
		b.Text = preview(cb.Text, PreviewRunes)
		b.Size = len(cb.Text) + len(cb.Thinking) + len(cb.Data) + len(cb.Input) + len(cb.Content) + len(cb.Source)
	}
	return b
}

// compactPrefix returns about the first max bytes of the JSON value raw
// with the white space outside strings removed, without reading further.
func compactPrefix(raw []byte, max int) string {
	return string(appendCompact(make([]byte, 0, min(len(raw), max+1)), raw, max))
}

// appendCompact appends to dst about the first max bytes of the JSON
// value raw with the white space outside strings removed (compactPrefix),
// and returns the extended slice. It copies runs, not bytes: a string runs
// to its first quote not escaped (an odd run of backslashes before a quote
// escapes it), found with bytes.IndexByte; a string left open runs to the
// end of raw.
func appendCompact(dst, raw []byte, max int) []byte {
	n := 0 // bytes appended
	for i := 0; i < len(raw) && n < max; {
		j := i + 1 // the run is raw[i:j]
		switch raw[i] {
		case ' ', '\t', '\n', '\r':
			i++
			continue
		case '"':
			for {
				k := bytes.IndexByte(raw[j:], '"')
				if k < 0 {
					j = len(raw)
					break
				}
				k += j
				b := k
				for b > i+1 && raw[b-1] == '\\' {
					b--
				}
				j = k + 1
				if (k-b)%2 == 0 {
					break
				}
			}
		default:
			for j < len(raw) && !compactStop[raw[j]] {
				j++
			}
		}
		run := raw[i:j]
		if len(run) > max-n {
			run = run[:max-n]
		}
		dst = append(dst, run...)
		n += len(run)
		i = j
	}
	return dst
}

// compactStop marks the bytes that end a run outside a string: a quote
// and JSON's white space.
var compactStop = [256]bool{'"': true, ' ': true, '\t': true, '\n': true, '\r': true}

// compactJSON returns raw with the white space outside strings removed.
func compactJSON(raw []byte) string { return compactPrefix(raw, len(raw)) }

// appendFields appends to dst the words of s (strings.Fields: runs of
// Unicode white space split them) joined by single spaces: what
// strings.Join(strings.Fields(s), " ") returns, without allocating.
func appendFields(dst []byte, s string) []byte {
	first := true
	for i := 0; i < len(s); {
		// Skip white space.
		for i < len(s) {
			c := s[i]
			if c < utf8.RuneSelf {
				if asciiSpace[c] == 0 {
					break
				}
				i++
				continue
			}
			r, size := utf8.DecodeRuneInString(s[i:])
			if !unicode.IsSpace(r) {
				break
			}
			i += size
		}
		if i == len(s) {
			break
		}
		start := i
		for i < len(s) {
			c := s[i]
			if c < utf8.RuneSelf {
				if asciiSpace[c] != 0 {
					break
				}
				i++
				continue
			}
			r, size := utf8.DecodeRuneInString(s[i:])
			if unicode.IsSpace(r) {
				break
			}
			i += size
		}
		if !first {
			dst = append(dst, ' ')
		}
		dst = append(dst, s[start:i]...)
		first = false
	}
	return dst
}

// asciiSpace marks the ASCII bytes unicode.IsSpace holds space, as
// strings.Fields reads them.
var asciiSpace = [256]uint8{'\t': 1, '\n': 1, '\v': 1, '\f': 1, '\r': 1, ' ': 1}

// appendResultText appends to dst the start of a tool_result's content as
// text: the string, or the text blocks of an array joined by newlines.
// Only the first rawPrefix bytes of a string are decoded.
func appendResultText(dst, raw []byte) []byte {
	raw = trimSpace(raw)
	if len(raw) == 0 {
		return dst
	}
	switch raw[0] {
	case '"':
		// A cut string ends in a valid rune; should it not, the invalid
		// bytes read as U+FFFD, which the preview never reaches.
		var scratch [rawPrefix + 1]byte
		out, err := jsontext.AppendUnquote(dst, appendStringPrefix(scratch[:0], raw, rawPrefix))
		if err != nil {
			// AppendUnquote keeps what it decoded up to the error, as
			// the text it stands for.
			return out
		}
		return out
	case '[':
		var blocks []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(raw, &blocks); err != nil {
			return dst
		}
		first := true
		for _, bl := range blocks {
			if bl.Type == events.BlockText && bl.Text != "" {
				if !first {
					dst = append(dst, '\n')
				}
				dst = append(dst, bl.Text...)
				first = false
			}
		}
		return dst
	}
	return dst
}

// appendStringPrefix appends to dst the JSON string raw cut, at a character boundary of
// the encoding, after about max bytes, and closed with a quote.
func appendStringPrefix(dst, raw []byte, max int) []byte {
	if len(raw) <= max {
		return append(dst, raw...)
	}
	i := 1
	for i < max && i < len(raw)-1 {
		switch {
		case raw[i] == '\\' && i+1 < len(raw) && raw[i+1] == 'u':
			i += 6
			if highSurrogate(raw[i-4 : min(i, len(raw))]) {
				i += 6 // and the low one after it
			}
		case raw[i] == '\\':
			i += 2
		default:
			i++
		}
	}
	if i > len(raw)-1 {
		return append(dst, raw...)
	}
	for i > 1 && raw[i]&0xC0 == 0x80 {
		i-- // not inside a rune's UTF-8 bytes
	}
	dst = append(dst, raw[:i]...)
	return append(dst, '"')
}

// highSurrogate reports whether hex, the four digits of a \u escape, is a
// UTF-16 high surrogate (D800-DBFF), the first of a pair.
func highSurrogate(hex []byte) bool {
	return len(hex) == 4 && (hex[0] == 'd' || hex[0] == 'D') && strings.IndexByte("89abAB", hex[1]) >= 0
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\n' || b[0] == '\r') {
		b = b[1:]
	}
	return b
}
