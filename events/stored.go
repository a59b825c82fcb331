package events

import (
	"bytes"
	stdjson "encoding/json"
	"io"
	"sync"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// storedDecoder is a reusable jsontext.Decoder and the buffer it reads
// from (a bytes.Buffer, which the decoder reads in place, without a copy).
type storedDecoder struct {
	dec *jsontext.Decoder
	buf *bytes.Buffer
	ev  Event // decoded into here (a pointer to a local would escape)
	val validator
	// interned holds the values of the envelope's repetitive members
	// (source, turn) this decoder has read: a value seen before costs no
	// allocation, and the states that keep it share one string.
	interned map[string]string
}

// maxInterned bounds storedDecoder.interned; past it the table starts
// again.
const maxInterned = 4096

// intern returns the string of the unquoted bytes b, from the table when
// it holds it.
func (sd *storedDecoder) intern(b []byte) string {
	if s, ok := sd.interned[string(b)]; ok {
		return s
	}
	if len(sd.interned) >= maxInterned {
		clear(sd.interned)
	}
	s := string(b)
	sd.interned[s] = s
	return s
}

var storedDecoders = sync.Pool{New: func() any {
	buf := new(bytes.Buffer)
	return &storedDecoder{dec: jsontext.NewDecoder(buf), buf: buf, interned: map[string]string{}}
}}

// decodeValid decodes a stored body and checks it against the contract in
// one pass over its bytes: the envelope's members, and the data member
// decoded straight into the typed payload of the type read before it (the
// order Encode writes). Data shares the data member's bytes with body.
//
// It answers only for a body that is valid: one JSON object (no duplicate
// names, valid UTF-8, nothing after it), of a known type whose data comes
// after it, breaking no rule of Validate. For anything else it reports
// false, and the caller decodes the body with Decode and Validate, whose
// results and errors are the reference: for a body decodeValid accepts,
// they give the same Event and payload (FuzzDecodeValidate checks).
//
// tenant and session are the subject's: a body that names them (as a
// valid one does) shares their strings rather than allocating its own.
func decodeValid(body []byte, tenant, session string) (Event, bool) {
	sd := storedDecoders.Get().(*storedDecoder)
	defer storedDecoders.Put(sd)
	sd.buf.Reset()
	*sd.buf = *bytes.NewBuffer(body)
	dec := sd.dec
	dec.Reset(sd.buf)
	ev := &sd.ev
	*ev = Event{}

	if tok, err := dec.ReadToken(); err != nil || tok.Kind() != '{' {
		return Event{}, false
	}
	var p Payload
	for dec.PeekKind() == '"' {
		name, err := dec.ReadValue() // the name as written: quoted, maybe escaped
		if err != nil {
			return Event{}, false
		}
		ok := true
		switch string(name) {
		case `"specversion"`:
			ok = sd.readInterned(&ev.SpecVersion)
		case `"id"`:
			ok = sd.readString(&ev.ID)
		case `"type"`:
			var t string
			ok = sd.readInterned(&t)
			ev.Type = Type(t)
		case `"source"`:
			ok = sd.readInterned(&ev.Source)
		case `"time"`:
			if dec.PeekKind() != '"' {
				return Event{}, false
			}
			raw, err := dec.ReadValue()
			if err != nil {
				return Event{}, false
			}
			// Encode's form is parsed by hand; any other goes through the
			// library, the reference.
			if t, ok := parseCanonicalTime(raw); ok {
				ev.Time = t
			} else if json.Unmarshal(raw, &ev.Time) != nil {
				return Event{}, false
			}
		case `"tenant"`:
			ok = sd.readShared(&ev.Tenant, tenant)
		case `"session"`:
			ok = sd.readShared(&ev.Session, session)
		case `"turn"`:
			ok = sd.readInterned(&ev.Turn)
		case `"data"`:
			if p = newPayload(ev.Type); p == nil || dec.PeekKind() != '{' {
				return Event{}, false // unknown type, data before type, or not an object
			}
			start := dec.InputOffset() // after the name: the colon and white space follow
			if m, ok := p.(*MessageAppended); ok {
				// Most of a log: read without reflection.
				if !sd.messageAppended(m) {
					return Event{}, false
				}
			} else if err := json.UnmarshalDecode(dec, p, rawInPlace); err != nil {
				return Event{}, false
			}
			data := body[start:dec.InputOffset()]
			ev.Data = data[bytes.IndexByte(data, '{'):]
		default:
			if bytes.IndexByte(name, '\\') >= 0 {
				return Event{}, false // an escaped name may spell a member's
			}
			err = dec.SkipValue()
		}
		if err != nil || !ok {
			return Event{}, false
		}
	}
	if tok, err := dec.ReadToken(); err != nil || tok.Kind() != '}' {
		return Event{}, false
	}
	if _, err := dec.ReadToken(); err != io.EOF {
		return Event{}, false // something after the object
	}
	if p == nil {
		return Event{}, false
	}
	v := &sd.val // the decoder's: no allocation per event
	*v = validator{errs: v.errs[:0]}
	v.envelope(ev)
	v.payload(ev, p)
	if len(v.errs) > 0 {
		clear(v.errs[:cap(v.errs)]) // the pool keeps no error
		return Event{}, false
	}
	ev.payload = p
	out := *ev
	*ev = Event{} // the pool keeps nothing of it
	return out, true
}

// messageAppended decodes the data of a message.appended event into m as
// json.UnmarshalDecode would (the contract's strictness: the decoder
// refuses duplicate names and invalid UTF-8; names match exactly; unknown
// members are skipped; raw values share the body's bytes, as rawInPlace
// does), without reflection. It reports false for anything it does not
// read the library's way (an escaped name, a null where a string or a
// bool goes, a value of another kind), and the caller gives the body to
// the reference path.
func (sd *storedDecoder) messageAppended(m *MessageAppended) bool {
	dec := sd.dec
	if tok, err := dec.ReadToken(); err != nil || tok.Kind() != '{' {
		return false
	}
	for dec.PeekKind() == '"' {
		name, err := dec.ReadValue()
		if err != nil || bytes.IndexByte(name, '\\') >= 0 {
			return false
		}
		switch string(name) {
		case `"role"`:
			var r string
			if !sd.readInterned(&r) {
				return false
			}
			m.Role = Role(r)
		case `"content"`:
			if tok, err := dec.ReadToken(); err != nil || tok.Kind() != '[' {
				return false
			}
			for dec.PeekKind() == '{' {
				m.Content = append(m.Content, ContentBlock{})
				if !sd.contentBlock(&m.Content[len(m.Content)-1]) {
					return false
				}
			}
			if tok, err := dec.ReadToken(); err != nil || tok.Kind() != ']' {
				return false
			}
		case `"message_id"`:
			if !sd.readString(&m.MessageID) {
				return false
			}
		case `"model"`:
			if !sd.readInterned(&m.Model) {
				return false
			}
		case `"stop_reason"`:
			if !sd.readInterned(&m.StopReason) {
				return false
			}
		case `"meta"`:
			if !boolValue(dec, &m.Meta) {
				return false
			}
		case `"synthetic"`:
			if !boolValue(dec, &m.Synthetic) {
				return false
			}
		case `"usage"`:
			if dec.PeekKind() != '{' {
				return false
			}
			m.Usage = new(Usage)
			if json.UnmarshalDecode(dec, m.Usage) != nil {
				return false
			}
		default:
			if dec.SkipValue() != nil {
				return false
			}
		}
	}
	tok, err := dec.ReadToken()
	return err == nil && tok.Kind() == '}'
}

// contentBlock decodes one content block into b, the way messageAppended
// decodes the message.
func (sd *storedDecoder) contentBlock(b *ContentBlock) bool {
	dec := sd.dec
	if tok, err := dec.ReadToken(); err != nil || tok.Kind() != '{' {
		return false
	}
	for dec.PeekKind() == '"' {
		name, err := dec.ReadValue()
		if err != nil || bytes.IndexByte(name, '\\') >= 0 {
			return false
		}
		var dst *string
		switch string(name) {
		case `"type"`:
			if !sd.readInterned(&b.Type) {
				return false
			}
			continue
		case `"name"`:
			if !sd.readInterned(&b.Name) {
				return false
			}
			continue
		case `"text"`:
			dst = &b.Text
		case `"thinking"`:
			dst = &b.Thinking
		case `"signature"`:
			dst = &b.Signature
		case `"data"`:
			dst = &b.Data
		case `"id"`:
			dst = &b.ID
		case `"tool_use_id"`:
			dst = &b.ToolUseID
		case `"is_error"`:
			if !boolValue(dec, &b.IsError) {
				return false
			}
			continue
		case `"input"`, `"content"`, `"source"`:
			v, err := dec.ReadValue() // shared with the body, as rawInPlace
			if err != nil {
				return false
			}
			switch string(name) {
			case `"input"`:
				b.Input = stdjson.RawMessage(v)
			case `"content"`:
				b.Content = stdjson.RawMessage(v)
			default:
				b.Source = stdjson.RawMessage(v)
			}
			continue
		default:
			if dec.SkipValue() != nil {
				return false
			}
			continue
		}
		if !sd.readString(dst) {
			return false
		}
	}
	tok, err := dec.ReadToken()
	return err == nil && tok.Kind() == '}'
}

// readString reads the next value, which must be a JSON string, into
// *dst (a string of its own).
func (sd *storedDecoder) readString(dst *string) bool {
	v, ok := stringValue(sd.dec)
	if ok {
		*dst = string(v)
	}
	return ok
}

// readInterned is readString for a value that repeats (a type, a source,
// a turn, a model): the string comes from the decoder's table.
func (sd *storedDecoder) readInterned(dst *string) bool {
	v, ok := stringValue(sd.dec)
	if ok {
		*dst = sd.intern(v)
	}
	return ok
}

// readShared is readString for the event's tenant or session: a value
// that is the subject's, given as s, shares its string.
func (sd *storedDecoder) readShared(dst *string, s string) bool {
	v, ok := stringValue(sd.dec)
	switch {
	case !ok:
	case string(v) == s:
		*dst = s
	default:
		*dst = string(v)
	}
	return ok
}

// boolValue reads the next value, which must be true or false, into b.
func boolValue(dec *jsontext.Decoder, b *bool) bool {
	switch dec.PeekKind() {
	case 't', 'f':
		tok, err := dec.ReadToken()
		if err != nil {
			return false
		}
		*b = tok.Bool()
		return true
	}
	return false
}

// stringValue reads the next value, which must be a JSON string, and
// returns its content unquoted: the bytes as they are in the body when
// they hold no escape (read them before the decoder's next read), else a
// copy with the escapes decoded. The decoder has checked the string (valid
// UTF-8, valid escapes).
func stringValue(dec *jsontext.Decoder) ([]byte, bool) {
	if dec.PeekKind() != '"' {
		return nil, false
	}
	v, err := dec.ReadValue()
	if err != nil {
		return nil, false
	}
	if bytes.IndexByte(v, '\\') < 0 {
		return v[1 : len(v)-1], true
	}
	u, err := jsontext.AppendUnquote(nil, v)
	return u, err == nil
}

// parseCanonicalTime parses a JSON string in the form Encode writes a
// time in, RFC 3339 in UTC with an optional fraction of 1 to 9 digits
// ("2026-02-19T10:00:00.123Z"), without reflection. It reports false for
// any other form, and for a date or time out of range, which the caller
// then gives to the library (the reference).
func parseCanonicalTime(q []byte) (time.Time, bool) {
	if len(q) < len(`"2006-01-02T15:04:05Z"`) || q[0] != '"' || q[len(q)-1] != '"' {
		return time.Time{}, false
	}
	b := q[1 : len(q)-1]
	num := func(s []byte) (int, bool) {
		n := 0
		for _, c := range s {
			if c < '0' || c > '9' {
				return 0, false
			}
			n = n*10 + int(c-'0')
		}
		return n, true
	}
	if b[4] != '-' || b[7] != '-' || b[10] != 'T' || b[13] != ':' || b[16] != ':' || b[len(b)-1] != 'Z' {
		return time.Time{}, false
	}
	year, ok1 := num(b[0:4])
	month, ok2 := num(b[5:7])
	day, ok3 := num(b[8:10])
	hour, ok4 := num(b[11:13])
	minute, ok5 := num(b[14:16])
	sec, ok6 := num(b[17:19])
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) || year < 1000 || month < 1 || month > 12 || day < 1 || hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	if day > time.Date(year, time.Month(month)+1, 0, 0, 0, 0, 0, time.UTC).Day() {
		return time.Time{}, false
	}
	nsec := 0
	switch rest := b[19 : len(b)-1]; {
	case len(rest) == 0:
	case len(rest) >= 2 && len(rest) <= 10 && rest[0] == '.':
		n, ok := num(rest[1:])
		if !ok {
			return time.Time{}, false
		}
		for range 10 - len(rest) {
			n *= 10
		}
		nsec = n
	default:
		return time.Time{}, false
	}
	return time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC), true
}

// rawInPlace decodes a json.RawMessage (a tool's input, a result's
// content) as the bytes of the value in the body, shared rather than
// copied: the decoder reads the body in place (a bytes.Buffer), and the
// event keeps the body anyway (Raw). They are the bytes json.RawMessage's
// own UnmarshalJSON would copy.
var rawInPlace = json.WithUnmarshalers(json.UnmarshalFromFunc(func(dec *jsontext.Decoder, v *stdjson.RawMessage) error {
	val, err := dec.ReadValue()
	*v = stdjson.RawMessage(val)
	return err
}))
