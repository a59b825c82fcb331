package events

import (
	"encoding/binary"
	"encoding/json"
	"reflect"
	"strconv"
	"sync"
	"unicode/utf8"
	"unsafe"
)

// The fast path of Validate's payload decoding. json.Decoder.Decode into
// the typed payload is most of what validating an event costs; for the
// plain case (keys spelled exactly as the payload's JSON names, each at
// most once; values of the field's own JSON type, no null; integers in
// range) decodePlain fills the payload itself, with the values
// encoding/json would give it. Anything else it leaves to encoding/json,
// which then decodes into a fresh payload, so the result and the errors
// stay exactly encoding/json's.

// fieldKind is how decodePlain sets a field.
type fieldKind uint8

const (
	kindString fieldKind = iota + 1
	kindInt
	kindUint
	kindBool
	kindRaw    // json.RawMessage: the value's bytes
	kindStruct // a nested object
	kindSlice  // an array of objects
	kindMap    // map[string]string
)

type plainField struct {
	name  string
	index int
	kind  fieldKind
	bits  int          // kindInt, kindUint: the field's size
	elem  *plainStruct // kindStruct, kindSlice
	typ   reflect.Type // kindSlice: the slice type
}

// plainStruct is a struct type decodePlain can fill: its fields by JSON
// name.
type plainStruct struct {
	fields []plainField
}

func (s *plainStruct) field(name []byte) (int, bool) {
	for i := range s.fields {
		if s.fields[i].name == string(name) {
			return i, true
		}
	}
	return 0, false
}

var (
	rawMessageType = reflect.TypeFor[json.RawMessage]()
	plainTypes     sync.Map // reflect.Type -> *plainStruct, or nil when not plain
)

// plainStructOf returns the decoding plan of struct type t, or nil when t
// has a field decodePlain does not handle (embedded or unexported fields,
// pointers, interfaces, floats, tag options other than omitempty).
func plainStructOf(t reflect.Type) *plainStruct {
	if v, ok := plainTypes.Load(t); ok {
		s, _ := v.(*plainStruct)
		return s
	}
	s := buildPlainStruct(t, 0)
	plainTypes.Store(t, s)
	return s
}

func buildPlainStruct(t reflect.Type, depth int) *plainStruct {
	if t.Kind() != reflect.Struct || depth > 3 {
		return nil
	}
	s := &plainStruct{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Anonymous || !f.IsExported() {
			return nil
		}
		tag := f.Tag.Get("json")
		name, opts, _ := cutComma(tag)
		if !plainName(name) || (opts != "" && opts != "omitempty") || len(s.fields) >= 64 {
			return nil
		}
		if _, dup := s.field([]byte(name)); dup {
			return nil
		}
		pf := plainField{name: name, index: i}
		switch ft := f.Type; {
		case ft == rawMessageType:
			pf.kind = kindRaw
		case ft.Kind() == reflect.String:
			pf.kind = kindString
		case ft.Kind() == reflect.Bool:
			pf.kind = kindBool
		case ft.Kind() >= reflect.Int && ft.Kind() <= reflect.Int64:
			pf.kind, pf.bits = kindInt, ft.Bits()
		case ft.Kind() >= reflect.Uint && ft.Kind() <= reflect.Uint64:
			pf.kind, pf.bits = kindUint, ft.Bits()
		case ft.Kind() == reflect.Struct:
			pf.kind, pf.elem = kindStruct, buildPlainStruct(ft, depth+1)
			if pf.elem == nil {
				return nil
			}
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			pf.kind, pf.elem, pf.typ = kindSlice, buildPlainStruct(ft.Elem(), depth+1), ft
			if pf.elem == nil {
				return nil
			}
		case ft.Kind() == reflect.Map && ft.Key().Kind() == reflect.String && ft.Elem().Kind() == reflect.String &&
			ft.Key() == reflect.TypeFor[string]() && ft.Elem() == reflect.TypeFor[string]():
			pf.kind, pf.typ = kindMap, ft
		default:
			return nil
		}
		s.fields = append(s.fields, pf)
	}
	return s
}

// plainName reports whether a JSON name is lower-case letters, digits and
// '_' (encoding/json takes such a tag as it is).
func plainName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

func cutComma(s string) (before, after string, found bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == ',' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// decodePlain decodes the JSON object at the start of data into p (a
// pointer to a zero payload struct), ignoring what follows the object as
// json.Decoder.Decode does, and reports whether it could; and if so,
// whether it skipped white space (outside strings) and where the object
// ends. When it could not, p may be partly written. The strings and raw
// values of p share data's memory (no copy): p must not outlive data, and
// data must not change while p is in use. Validate only reads p, and
// copies what it keeps (see validator.add).
func decodePlain(data []byte, p Payload) (ok, spaced bool, end int) {
	v := reflect.ValueOf(p)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return false, false, 0
	}
	s := plainStructOf(v.Elem().Type())
	if s == nil {
		return false, false, 0
	}
	d := plainDecoder{data: data}
	d.space()
	if !d.object(v.Elem(), s) {
		return false, false, 0
	}
	return true, d.spaced, d.i
}

type plainDecoder struct {
	data   []byte
	i      int
	spaced bool // white space was skipped
}

func (d *plainDecoder) space() {
	for d.i < len(d.data) {
		switch d.data[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
			d.spaced = true
		default:
			return
		}
	}
}

func (d *plainDecoder) peek() byte {
	if d.i < len(d.data) {
		return d.data[d.i]
	}
	return 0
}

// object fills struct v from the object at d.i.
func (d *plainDecoder) object(v reflect.Value, s *plainStruct) bool {
	if d.peek() != '{' {
		return false
	}
	d.i++
	d.space()
	if d.peek() == '}' {
		d.i++
		return true
	}
	var seen uint64
	for {
		key, ok := d.plainString()
		if !ok {
			return false
		}
		fi, ok := s.field(key)
		if !ok || seen&(1<<fi) != 0 {
			return false // unknown (maybe a case-folded name), or repeated
		}
		seen |= 1 << fi
		d.space()
		if d.peek() != ':' {
			return false
		}
		d.i++
		d.space()
		if !d.value(v.Field(s.fields[fi].index), &s.fields[fi]) {
			return false
		}
		d.space()
		switch d.peek() {
		case ',':
			d.i++
			d.space()
		case '}':
			d.i++
			return true
		default:
			return false
		}
	}
}

func (d *plainDecoder) value(v reflect.Value, f *plainField) bool {
	switch f.kind {
	case kindString:
		if d.peek() != '"' {
			return false
		}
		str, ok := d.stringValue()
		if ok {
			v.SetString(str)
		}
		return ok
	case kindInt:
		tok, ok := d.integer()
		if !ok {
			return false
		}
		n, err := strconv.ParseInt(string(tok), 10, 64)
		if err != nil || v.OverflowInt(n) {
			return false
		}
		v.SetInt(n)
		return true
	case kindUint:
		tok, ok := d.integer()
		if !ok || tok[0] == '-' {
			return false
		}
		n, err := strconv.ParseUint(string(tok), 10, 64)
		if err != nil || v.OverflowUint(n) {
			return false
		}
		v.SetUint(n)
		return true
	case kindBool:
		switch {
		case d.literal("true"):
			v.SetBool(true)
		case d.literal("false"):
			v.SetBool(false)
		default:
			return false
		}
		return true
	case kindRaw:
		if d.peek() == 'n' {
			return false // null: encoding/json's call
		}
		start := d.i
		c := compactor{src: d.data, i: d.i, check: true}
		if !c.value(0) {
			return false
		}
		d.i = c.i
		d.spaced = d.spaced || c.spaced
		v.SetBytes(d.data[start:d.i:d.i])
		return true
	case kindStruct:
		return d.object(v, f.elem)
	case kindSlice:
		return d.array(v, f)
	case kindMap:
		return d.stringMap(v, f)
	}
	return false
}

func (d *plainDecoder) array(v reflect.Value, f *plainField) bool {
	if d.peek() != '[' {
		return false
	}
	d.i++
	d.space()
	out := reflect.MakeSlice(f.typ, 0, 0)
	if d.peek() == ']' {
		d.i++
		v.Set(out)
		return true
	}
	for {
		n := out.Len()
		out = reflect.Append(out, reflect.Zero(f.typ.Elem()))
		if !d.object(out.Index(n), f.elem) {
			return false
		}
		d.space()
		switch d.peek() {
		case ',':
			d.i++
			d.space()
		case ']':
			d.i++
			v.Set(out)
			return true
		default:
			return false
		}
	}
}

func (d *plainDecoder) stringMap(v reflect.Value, f *plainField) bool {
	if d.peek() != '{' {
		return false
	}
	d.i++
	d.space()
	m := reflect.MakeMap(f.typ)
	if d.peek() == '}' {
		d.i++
		v.Set(m)
		return true
	}
	for {
		if d.peek() != '"' {
			return false
		}
		key, ok := d.stringValue()
		if !ok {
			return false
		}
		d.space()
		if d.peek() != ':' {
			return false
		}
		d.i++
		d.space()
		if d.peek() != '"' {
			return false
		}
		val, ok := d.stringValue()
		if !ok {
			return false
		}
		m.SetMapIndex(reflect.ValueOf(key), reflect.ValueOf(val))
		d.space()
		switch d.peek() {
		case ',':
			d.i++
			d.space()
		case '}':
			d.i++
			v.Set(m)
			return true
		default:
			return false
		}
	}
}

// token returns the string token at d.i (with its quotes) after checking
// its syntax, and whether it holds escapes and bytes outside ASCII.
func (d *plainDecoder) token() (tok []byte, escaped, ascii, ok bool) {
	c := compactor{src: d.data, i: d.i, check: true}
	if d.peek() != '"' || !c.string() {
		return nil, false, false, false
	}
	tok = d.data[d.i:c.i]
	d.i = c.i
	ascii = true
	i := 0
	for ; i+8 <= len(tok); i += 8 {
		if x := binary.LittleEndian.Uint64(tok[i:]); escapeOrHigh(x) {
			break
		}
	}
	for _, b := range tok[i:] {
		if b == '\\' {
			escaped = true
		} else if b >= utf8.RuneSelf {
			ascii = false
		}
	}
	return tok, escaped, ascii, true
}

// escapeOrHigh reports whether one of the eight bytes of x may be '\\' or
// 0x80 and above (never false for one).
func escapeOrHigh(x uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	y := x ^ (ones * '\\')
	return ((y-ones)&^y|x)&highs != 0
}

// plainString returns the contents of a string token without escapes or
// bytes outside ASCII (object keys).
func (d *plainDecoder) plainString() ([]byte, bool) {
	tok, escaped, ascii, ok := d.token()
	if !ok || escaped || !ascii {
		return nil, false
	}
	return tok[1 : len(tok)-1], true
}

// stringValue returns the string a token decodes to, as encoding/json
// decodes it: its bytes when it has no escape and is valid UTF-8 (the
// token has no control character).
func (d *plainDecoder) stringValue() (string, bool) {
	tok, escaped, ascii, ok := d.token()
	if !ok {
		return "", false
	}
	if in := tok[1 : len(tok)-1]; !escaped && (ascii || utf8.Valid(in)) {
		if len(in) == 0 {
			return "", true
		}
		return unsafe.String(&in[0], len(in)), true // shares data (see decodePlain)
	}
	var s string
	if err := json.Unmarshal(tok, &s); err != nil {
		return "", false
	}
	return s, true
}

// integer returns an integer token: -?(0|[1-9][0-9]*) followed by a
// delimiter (not a fraction or an exponent).
func (d *plainDecoder) integer() ([]byte, bool) {
	start := d.i
	c := compactor{src: d.data, i: d.i, check: true}
	if b := d.peek(); b != '-' && (b < '0' || b > '9') || !c.number() {
		return nil, false
	}
	tok := d.data[start:c.i]
	for _, b := range tok {
		if b == '.' || b == 'e' || b == 'E' {
			return nil, false
		}
	}
	d.i = c.i
	return tok, true
}

func (d *plainDecoder) literal(lit string) bool {
	if len(d.data)-d.i < len(lit) || string(d.data[d.i:d.i+len(lit)]) != lit {
		return false
	}
	d.i += len(lit)
	return true
}
