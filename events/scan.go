package events

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// scanner reads JSON in place from a stored body, as strictly as
// jsontext's Decoder with its defaults (RFC 8259 syntax; strings of valid
// UTF-8 with valid escapes and no control character; no duplicate member
// names in any object), for the stored bodies decodeValid reads without
// the library. It answers only what it reads without doubt: an escaped
// member name, nesting deeper than maxScanDepth or an object with more
// than maxScanNames members makes it report false, and the caller hands
// the body to the library, the reference.
//
// Each method consumes what it reads (white space before it included)
// and reports false when the input is not what it expects; the position
// after a false is undefined.
type scanner struct {
	b []byte
	i int
	// names holds the member names (unquoted, unescaped) of the objects
	// open at this point, innermost last; each object checks its new
	// names against its own, from the mark it took when it opened.
	names [][]byte
	// unq is the scratch an escaped string is unquoted into.
	unq []byte
	// spaced is set once peek skips white space, and, when checkEscapes
	// is set, oddEscape once a string holds an escape the library's
	// encoder would not write (canonicalData reads them; a read does not
	// pay for the check).
	spaced, checkEscapes, oddEscape bool
	// copyRaw makes raw return a copy rather than the input's bytes (for
	// a caller's Data, which the caller may change).
	copyRaw bool
}

// maxScanDepth bounds how deep skip nests, and maxScanNames how many
// members one object may have (the duplicate check is linear in them);
// past either, the caller's reference decodes the body (jsontext allows
// 10,000 levels and any number of members).
const (
	maxScanDepth = 64
	maxScanNames = 128
)

// reset points s at b, from its start.
func (s *scanner) reset(b []byte) {
	s.b, s.i = b, 0
	s.names = s.names[:0]
	s.spaced, s.checkEscapes, s.oddEscape, s.copyRaw = false, false, false, false
}

// release drops s's references to the last body (the pool keeps s).
func (s *scanner) release() {
	s.b = nil
	clear(s.names[:cap(s.names)])
	s.names = s.names[:0]
}

// peek skips white space and returns the next byte, or 0 at the end.
func (s *scanner) peek() byte {
	for s.i < len(s.b) {
		switch c := s.b[s.i]; c {
		case ' ', '\t', '\n', '\r':
			s.i++
			s.spaced = true
		default:
			return c
		}
	}
	return 0
}

// eat consumes byte c, after white space, and reports whether it was
// next.
func (s *scanner) eat(c byte) bool {
	if s.peek() == c {
		s.i++
		return true
	}
	return false
}

// atEnd reports whether only white space is left.
func (s *scanner) atEnd() bool { return s.peek() == 0 && s.i == len(s.b) }

// Eight bytes at a time: lsb has the low bit of each byte set, msb the
// high bit.
const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// scanRun checks seg, a run of a JSON string with no quote and no
// backslash, eight bytes at a time: it reports false when a byte is a
// control character (below 0x20: invalid in a string), and clears
// *ascii when one is 0x80 or above (a multi-byte rune, for utf8.Valid).
// (x - lsb*0x20) &^ x has a high bit set exactly when some byte of x is
// below 0x20 (the classic "has less" test, exact for n <= 128).
func scanRun(seg []byte, ascii *bool) bool {
	var high uint64
	for len(seg) >= 8 {
		x := binary.LittleEndian.Uint64(seg)
		if (x-lsb*0x20)&^x&msb != 0 {
			return false
		}
		high |= x
		seg = seg[8:]
	}
	for _, c := range seg {
		if c < 0x20 {
			return false
		}
		high |= uint64(c)
	}
	if high&msb != 0 { // the tail's bytes are in the low byte
		*ascii = false
	}
	return true
}

// quoted consumes a JSON string and returns it as written, quotes
// included, and whether it holds an escape. It finds the closing quote
// with bytes.IndexByte (a quote after a backslash is escaped, and the
// search goes on past it) and checks the runs between with scanRun. A
// string with an escape is checked, and unquoted into s.unq, by
// jsontext.AppendUnquote; one without is checked here (no control
// character, valid UTF-8).
//
// Linear in the string's length whatever its escapes: the quote found is
// kept until an escape consumes it, and each escape searches only the
// bytes up to the next backslash. (Searching for the quote again after
// every escape read a tool output of 900 KB with 50,000 escaped line
// breaks 50,000 times: seconds per event.)
func (s *scanner) quoted() (q []byte, escaped, ok bool) {
	if s.peek() != '"' {
		return nil, false, false
	}
	if q, ok, done := s.quotedPlain(); done {
		return q, false, ok
	}
	b, start := s.b, s.i
	i, ascii := start+1, true
	end := -1 // b[end] is the first quote at or after i, once end >= i
	for {
		if i >= len(b) {
			return nil, false, false
		}
		if end < i {
			k := bytes.IndexByte(b[i:], '"')
			if k < 0 {
				return nil, false, false
			}
			end = i + k
		}
		run := b[i:end]
		if bs := bytes.IndexByte(run, '\\'); bs >= 0 {
			if !scanRun(run[:bs], &ascii) {
				return nil, false, false
			}
			escaped = true
			i += bs + 2 // the escaped byte cannot end the string; AppendUnquote checks it
			continue
		}
		if !scanRun(run, &ascii) {
			return nil, false, false
		}
		i = end
		q = b[start : i+1]
		s.i = i + 1
		if escaped {
			var err error
			s.unq, err = jsontext.AppendUnquote(s.unq[:0], q)
			s.oddEscape = s.oddEscape || s.checkEscapes && !encoderEscapes(q)
			return q, true, err == nil
		}
		return q, false, ascii || utf8.Valid(q)
	}
}

// quotedPlain reads the string at s.i (its opening quote) in one pass,
// eight bytes at a time, when it ends within plainMax bytes and holds no
// escape: most of a body's strings (member names, ids, kinds, times).
// Each word is tested at once for a quote and a backslash (the "has a
// zero byte" test on x^'"' and x^'\\') and for a control character
// (scanRun's test); the lowest byte any test flags is a true match (a
// false flag needs a true one below it), and the string ends there if it
// is a quote. quoted's general path makes three passes (a quote, a
// backslash, then scanRun). done is false, with s unchanged, when it
// cannot tell (an escape, a control character, a longer string, or the
// input's end within a word): quoted reads the string then.
func (s *scanner) quotedPlain() (q []byte, ok, done bool) {
	b, start := s.b, s.i
	var high uint64
	for i := start + 1; i+8 <= len(b) && i-start <= plainMax; i += 8 {
		x := binary.LittleEndian.Uint64(b[i:])
		qx, bx := x^(lsb*'"'), x^(lsb*'\\')
		m := (((qx - lsb) &^ qx) | ((bx - lsb) &^ bx) | ((x - lsb*0x20) &^ x)) & msb
		if m == 0 {
			high |= x
			continue
		}
		k := bits.TrailingZeros64(m) / 8
		if b[i+k] != '"' {
			return nil, false, false
		}
		high |= x & (uint64(1)<<(8*k) - 1) // the bytes before the quote
		q = b[start : i+k+1]
		s.i = i + k + 1
		return q, high&msb == 0 || utf8.Valid(q), true
	}
	return nil, false, false
}

// plainMax is how far, in bytes, quotedPlain looks for a string's end
// before quoted's general path (bytes.IndexByte, faster on long strings)
// reads it.
const plainMax = 64

// null consumes a JSON null if one is next, and reports whether it was:
// the library leaves a string, a bool, a count or a pointer as it is (the
// zero value, here) for a null.
func (s *scanner) null() bool { return s.peek() == 'n' && s.literal("null") }

// encoderEscapes reports whether every escape in the valid JSON string q
// is one the library's encoder writes: \" \\ \b \f \n \r \t, and
// \u00XX (lower-case hex) for the other control characters.
func encoderEscapes(q []byte) bool {
	for i := 0; ; {
		k := bytes.IndexByte(q[i:], '\\')
		if k < 0 {
			return true
		}
		i += k
		if i+1 >= len(q) {
			return false
		}
		switch q[i+1] {
		case '"', '\\', 'b', 'f', 'n', 'r', 't':
			i += 2
			continue
		case 'u':
		default:
			return false
		}
		if i+5 >= len(q) || q[i+2] != '0' || q[i+3] != '0' {
			return false
		}
		var code byte
		switch hi, lo := q[i+4], q[i+5]; {
		case hi != '0' && hi != '1':
			return false
		case lo >= '0' && lo <= '9':
			code = (hi-'0')<<4 | (lo - '0')
		case lo >= 'a' && lo <= 'f':
			code = (hi-'0')<<4 | (lo - 'a' + 10)
		default:
			return false
		}
		switch code {
		case '\b', '\f', '\n', '\r', '\t':
			return false // the encoder writes the short form
		}
		i += 6
	}
}

// str consumes a JSON string and returns its content unquoted: the
// body's own bytes when it holds no escape, else s.unq (read it before
// the scanner's next string). For a null it returns nil and ok.
func (s *scanner) str() ([]byte, bool) {
	if s.null() {
		return nil, true
	}
	q, escaped, ok := s.quoted()
	switch {
	case !ok:
		return nil, false
	case escaped:
		return s.unq, true
	default:
		return q[1 : len(q)-1], true
	}
}

// name consumes a member name and the colon after it, and returns the
// name; an escaped name (which may spell another) is not read.
func (s *scanner) name() ([]byte, bool) {
	q, escaped, ok := s.quoted()
	if !ok || escaped || !s.eat(':') {
		return nil, false
	}
	return q[1 : len(q)-1], true
}

// member adds name to the object opened at mark, and reports false if
// the object already has it (or has too many members to check).
func (s *scanner) member(mark int, name []byte) bool {
	if len(s.names)-mark >= maxScanNames {
		return false
	}
	for _, n := range s.names[mark:] {
		if bytes.Equal(n, name) {
			return false
		}
	}
	s.names = append(s.names, name)
	return true
}

// next consumes what follows an object's member: it reports more when a
// comma came (another member follows), and ok when that or the object's
// end did, whose names it then drops from mark on.
func (s *scanner) next(mark int) (more, ok bool) {
	switch s.peek() {
	case ',':
		s.i++
		return true, true
	case '}':
		s.i++
		s.names = s.names[:mark]
		return false, true
	}
	return false, false
}

// boolean consumes true or false into *b, or a null.
func (s *scanner) boolean(b *bool) bool {
	switch s.peek() {
	case 'n':
		return s.literal("null")
	case 't':
		if s.literal("true") {
			*b = true
			return true
		}
	case 'f':
		if s.literal("false") {
			*b = false
			return true
		}
	}
	return false
}

// count consumes a non-negative integer of at most 18 digits, written
// without sign, fraction or exponent, into *n, or a null; anything else
// (which may still be a number the library reads, or refuses) is not
// read.
func (s *scanner) count(n *int64) bool {
	if s.null() {
		return true
	}
	b, i := s.b, s.i
	v := int64(0)
	for i < len(b) && b[i] >= '0' && b[i] <= '9' && i-s.i < 18 {
		v = v*10 + int64(b[i]-'0')
		i++
	}
	switch {
	case i == s.i, b[s.i] == '0' && i > s.i+1:
		return false
	case i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E' || b[i] >= '0' && b[i] <= '9'):
		return false
	}
	*n, s.i = v, i
	return true
}

// number consumes a JSON number (RFC 8259 section 6).
func (s *scanner) number() bool {
	b, i := s.b, s.i
	digits := func() bool {
		d := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		return i > d
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case !digits():
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if !digits() {
			return false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if !digits() {
			return false
		}
	}
	s.i = i
	return true
}

// literal consumes lit (true, false or null).
func (s *scanner) literal(lit string) bool {
	if len(s.b)-s.i >= len(lit) && string(s.b[s.i:s.i+len(lit)]) == lit {
		s.i += len(lit)
		return true
	}
	return false
}

// skip consumes one JSON value of any kind, checking it as the library
// would, at nesting depth depth.
func (s *scanner) skip(depth int) bool {
	switch c := s.peek(); c {
	case '"':
		_, _, ok := s.quoted()
		return ok
	case '{':
		if depth >= maxScanDepth {
			return false
		}
		s.i++
		if s.eat('}') {
			return true
		}
		mark := len(s.names)
		for {
			name, ok := s.name()
			if !ok || !s.member(mark, name) || !s.skip(depth+1) {
				return false
			}
			more, ok := s.next(mark)
			if !ok || !more {
				return ok
			}
		}
	case '[':
		if depth >= maxScanDepth {
			return false
		}
		s.i++
		if s.eat(']') {
			return true
		}
		for {
			if !s.skip(depth + 1) {
				return false
			}
			switch s.peek() {
			case ',':
				s.i++
			case ']':
				s.i++
				return true
			default:
				return false
			}
		}
	case 't':
		return s.literal("true")
	case 'f':
		return s.literal("false")
	case 'n':
		return s.literal("null")
	default:
		if c == '-' || c >= '0' && c <= '9' {
			return s.number()
		}
	}
	return false
}

// raw consumes one JSON value and returns its bytes as written, shared
// with the body (capacity cut at the value's end: an append to it cannot
// write into the body).
func (s *scanner) raw() ([]byte, bool) {
	s.peek()
	start := s.i
	if !s.skip(0) {
		return nil, false
	}
	if s.copyRaw {
		return bytes.Clone(s.b[start:s.i]), true
	}
	return s.b[start:s.i:s.i], true
}
