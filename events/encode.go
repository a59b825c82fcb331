package events

import "encoding/binary"

// encodedSize is the capacity to allocate for the encoded event.
func (e *Event) encodedSize() int {
	return len(e.Data) + len(e.SpecVersion) + len(e.ID) + len(e.Type) + len(e.Source) + len(e.Tenant) + len(e.Session) + len(e.Turn) + 160
}

// The fast path of Event.Encode: the envelope written by hand, byte for
// byte what encoding/json writes for it (without HTML escaping), for the
// common case; anything out of the ordinary (a string that needs escaping,
// data that is not plain valid JSON, a time JSON cannot hold) is left to
// encoding/json, so the result and the errors stay exactly its own.

// appendEnvelope appends the encoded event to dst and reports whether it
// could; when it could not, dst is to be discarded. dataCompact says that
// e.Data is known to be one valid JSON value without white space outside
// its strings (see validate): it is then copied as it is.
func (e *Event) appendEnvelope(dst []byte, dataCompact bool) ([]byte, bool) {
	if len(e.Data) == 0 {
		return dst, false // nil is "null", empty is an error: encoding/json's call
	}
	tm, err := e.Time.MarshalJSON()
	if err != nil {
		return dst, false
	}
	ok := true
	str := func(key, s string) {
		dst = append(dst, key...)
		dst, ok = appendPlainString(dst, s, ok)
	}
	str(`{"specversion":`, e.SpecVersion)
	str(`,"id":`, e.ID)
	str(`,"type":`, string(e.Type))
	str(`,"source":`, e.Source)
	dst = append(dst, `,"time":`...)
	dst = append(dst, tm...)
	str(`,"tenant":`, e.Tenant)
	str(`,"session":`, e.Session)
	if e.Turn != "" {
		str(`,"turn":`, e.Turn)
	}
	if !ok {
		return dst, false
	}
	dst = append(dst, `,"data":`...)
	if dataCompact {
		dst = append(dst, e.Data...)
	} else if dst, ok = appendCompactJSON(dst, e.Data); !ok {
		return dst, false
	}
	return append(dst, '}'), true
}

// appendPlainString appends s quoted when it needs no escaping (printable
// ASCII but '"' and '\'); ok goes false, and stays false, when it does.
func appendPlainString(dst []byte, s string, ok bool) ([]byte, bool) {
	if !ok {
		return dst, false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			return dst, false
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"'), true
}

// maxCompactDepth bounds the nesting appendCompactJSON handles; deeper data
// is left to encoding/json (whose own limit is 10000).
const maxCompactDepth = 500

// appendCompactJSON appends src without its insignificant white space, as
// json.Compact does, when src is one valid JSON value (RFC 8259, as
// encoding/json's scanner reads it: strings are copied as they are, bytes
// of 0x80 and above unchecked, control characters refused), and reports
// whether it was.
func appendCompactJSON(dst, src []byte) ([]byte, bool) {
	c := compactor{src: src, dst: dst}
	c.space()
	if !c.value(0) {
		return dst, false
	}
	c.space()
	if c.i != len(src) {
		return dst, false
	}
	return c.dst, true
}

// compactor reads one JSON value from src at i, appending it to dst
// without white space unless check is set (then it only checks it).
type compactor struct {
	src, dst []byte
	i        int
	check    bool
	spaced   bool // white space was skipped
}

func (c *compactor) put(b ...byte) {
	if !c.check {
		c.dst = append(c.dst, b...)
	}
}

func (c *compactor) space() {
	for c.i < len(c.src) {
		switch c.src[c.i] {
		case ' ', '\t', '\n', '\r':
			c.i++
			c.spaced = true
		default:
			return
		}
	}
}

func (c *compactor) value(depth int) bool {
	if c.i >= len(c.src) {
		return false
	}
	switch b := c.src[c.i]; {
	case b == '{':
		return c.object(depth + 1)
	case b == '[':
		return c.array(depth + 1)
	case b == '"':
		return c.string()
	case b == '-' || '0' <= b && b <= '9':
		return c.number()
	case b == 't':
		return c.literal("true")
	case b == 'f':
		return c.literal("false")
	case b == 'n':
		return c.literal("null")
	}
	return false
}

func (c *compactor) object(depth int) bool {
	if depth > maxCompactDepth {
		return false
	}
	c.put('{')
	c.i++
	c.space()
	if c.i < len(c.src) && c.src[c.i] == '}' {
		c.i++
		c.put('}')
		return true
	}
	for {
		if c.i >= len(c.src) || c.src[c.i] != '"' || !c.string() {
			return false
		}
		c.space()
		if c.i >= len(c.src) || c.src[c.i] != ':' {
			return false
		}
		c.i++
		c.put(':')
		c.space()
		if !c.value(depth) {
			return false
		}
		c.space()
		if c.i >= len(c.src) {
			return false
		}
		switch c.src[c.i] {
		case ',':
			c.i++
			c.put(',')
			c.space()
		case '}':
			c.i++
			c.put('}')
			return true
		default:
			return false
		}
	}
}

func (c *compactor) array(depth int) bool {
	if depth > maxCompactDepth {
		return false
	}
	c.put('[')
	c.i++
	c.space()
	if c.i < len(c.src) && c.src[c.i] == ']' {
		c.i++
		c.put(']')
		return true
	}
	for {
		if !c.value(depth) {
			return false
		}
		c.space()
		if c.i >= len(c.src) {
			return false
		}
		switch c.src[c.i] {
		case ',':
			c.i++
			c.put(',')
			c.space()
		case ']':
			c.i++
			c.put(']')
			return true
		default:
			return false
		}
	}
}

// string copies a string token (at c.src[c.i] == '"') as it is.
func (c *compactor) string() bool {
	start := c.i
	i := c.i + 1
	for i < len(c.src) {
		// Skip eight plain bytes at a time: none is '"', '\\' or a
		// control character.
		for i+8 <= len(c.src) && !specialInString(binary.LittleEndian.Uint64(c.src[i:])) {
			i += 8
		}
		if i >= len(c.src) {
			break
		}
		b := c.src[i]
		switch {
		case b == '"':
			c.i = i + 1
			c.put(c.src[start:c.i]...)
			return true
		case b < 0x20:
			return false
		case b == '\\':
			if i+1 >= len(c.src) {
				return false
			}
			switch c.src[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(c.src) {
					return false
				}
				for _, h := range c.src[i+2 : i+6] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return false
					}
				}
				i += 6
			default:
				return false
			}
		default:
			i++
		}
	}
	return false
}

// specialInString reports whether one of the eight bytes of x may be '"',
// '\\' or below 0x20 (it may answer true for none, never false for one).
func specialInString(x uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	zero := func(y uint64) uint64 { return (y - ones) & ^y & highs }
	return zero(x^(ones*'"'))|zero(x^(ones*'\\'))|((x-ones*0x20)&^x&highs) != 0
}

// number copies -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (c *compactor) number() bool {
	s, i := c.src, c.i
	digits := func() bool {
		n := i
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
		}
		return i > n
	}
	if s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && '1' <= s[i] && s[i] <= '9':
		digits()
	default:
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if !digits() {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if !digits() {
			return false
		}
	}
	c.put(s[c.i:i]...)
	c.i = i
	return true
}

func (c *compactor) literal(lit string) bool {
	if len(c.src)-c.i < len(lit) || string(c.src[c.i:c.i+len(lit)]) != lit {
		return false
	}
	c.put([]byte(lit)...)
	c.i += len(lit)
	return true
}
