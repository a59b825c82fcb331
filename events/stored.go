package events

import (
	"bytes"
	stdjson "encoding/json"
	"sync"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// storedDecoder holds what decodeValid reuses from one body to the next:
// the scanner, a jsontext.Decoder for the payloads read through the
// library, and the intern table.
type storedDecoder struct {
	sc  scanner
	dec *jsontext.Decoder
	buf *bytes.Buffer // what dec reads, in place (no copy)
	ev  Event         // decoded into here (a pointer to a local would escape)
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

// Bits of the envelope's members, for the duplicate check.
const (
	envSpecVersion = 1 << iota
	envID
	envType
	envSource
	envTime
	envTenant
	envSession
	envTurn
	envData
)

// decodeValid decodes a stored body and checks it against the contract in
// one pass over its bytes, without reflection for the envelope and for
// the payloads every turn has (message.appended, most of a log;
// turn.started, turn.completed, turn.stage_completed, tool_call.started,
// tool_call.completed): the envelope's members, and the data member
// decoded straight into the typed payload of the type read before it
// (the order Encode writes). Data shares the data member's bytes with
// body.
//
// It answers only for a body that is valid: one JSON object (no duplicate
// names, valid UTF-8, nothing after it), of a known type whose data comes
// after it, breaking no rule of Validate. For anything else, and for what
// its scanner does not read (an escaped name, data before type, an
// unknown type), it reports false, and the caller decodes the body with
// Decode and Validate, whose results and errors are the reference: for a
// body decodeValid accepts, they give the same Event and payload
// (FuzzDecodeValidate checks).
//
// tenant and session are the subject's: a body that names them (as a
// valid one does) shares their strings rather than allocating its own.
func decodeValid(body []byte, tenant, session string) (Event, bool) {
	sd := storedDecoders.Get().(*storedDecoder)
	defer storedDecoders.Put(sd)
	sc := &sd.sc
	sc.reset(body)
	defer sc.release()
	ev := &sd.ev
	*ev = Event{}
	defer func() { *ev = Event{} }() // the pool keeps nothing of the body, accepted or not

	if !sc.eat('{') {
		return Event{}, false
	}
	var p Payload
	seen := 0
	for more := !sc.eat('}'); more; { // {} has no type: refused below
		name, ok := sc.name()
		if !ok {
			return Event{}, false
		}
		bit := 0
		switch string(name) {
		case "specversion":
			bit, ok = envSpecVersion, sd.readInterned(&ev.SpecVersion)
		case "id":
			bit, ok = envID, sd.readString(&ev.ID)
		case "type":
			var t string
			bit, ok = envType, sd.readInterned(&t)
			ev.Type = Type(t)
		case "source":
			bit, ok = envSource, sd.readInterned(&ev.Source)
		case "time":
			bit = envTime
			q, _, qok := sc.quoted()
			if !qok {
				return Event{}, false
			}
			// Encode's form is parsed by hand; any other goes through the
			// library, the reference.
			if t, tok := parseCanonicalTime(q); tok {
				ev.Time = t
			} else if json.Unmarshal(q, &ev.Time) != nil {
				return Event{}, false
			}
		case "tenant":
			bit, ok = envTenant, sd.readShared(&ev.Tenant, tenant)
		case "session":
			bit, ok = envSession, sd.readShared(&ev.Session, session)
		case "turn":
			bit, ok = envTurn, sd.readInterned(&ev.Turn)
		case "data":
			bit = envData
			if p = newPayload(ev.Type); p == nil || sc.peek() != '{' {
				return Event{}, false // unknown type, data before type, or not an object
			}
			start := sc.i
			if known, read := sd.payload(p); known {
				ok = read
			} else {
				ok = sd.unmarshalAt(p)
			}
			ev.Data = body[start:sc.i:sc.i] // an append to it cannot write into the body
		default:
			ok = sc.member(0, name) && sc.skip(0)
		}
		if !ok || seen&bit != 0 {
			return Event{}, false
		}
		seen |= bit
		if more, ok = sc.next(0); !ok {
			return Event{}, false
		}
	}
	if !sc.atEnd() || p == nil {
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
	ev.decoded = ev.Data // read as strictly as Decode reads: Validate need not again
	return *ev, true
}

// payload decodes the object at the scanner's position into p when p is
// one of the payloads the scanner reads (known), and reports whether it
// read it.
func (sd *storedDecoder) payload(p Payload) (known, ok bool) {
	switch p := p.(type) {
	case *MessageAppended: // most of a log
		return true, sd.messageAppended(p)
	case *TurnStarted:
		return true, sd.turnStarted(p)
	case *TurnCompleted:
		return true, sd.turnCompleted(p)
	case *TurnStageCompleted:
		return true, sd.stageCompleted(p)
	case *ToolCallStarted:
		return true, sd.toolCallStarted(p)
	case *ToolCallCompleted:
		return true, sd.toolCallCompleted(p)
	}
	return false, false
}

// readPayload decodes data, a payload's JSON object as a caller gave it,
// into p with the scanner, as decodePayload's library path would (raw
// values copied, not shared with data), and reports whether it could: a
// payload it does not read, or data it does not read without doubt,
// goes to the library (p is then to be dropped: it may be half filled).
func readPayload(p Payload, data []byte) bool {
	return withScanner(data, func(sd *storedDecoder) bool {
		sd.sc.copyRaw = true
		known, ok := sd.payload(p)
		return known && ok && sd.sc.atEnd()
	})
}

// withScanner runs f with a pooled decoder whose scanner is at the start
// of b, and returns what f does; the pool keeps nothing of b.
func withScanner(b []byte, f func(sd *storedDecoder) bool) bool {
	sd := storedDecoders.Get().(*storedDecoder)
	defer storedDecoders.Put(sd)
	sd.sc.reset(b)
	defer sd.sc.release()
	return f(sd)
}

// unmarshalAt decodes the object at the scanner's position into p with
// the library (json.UnmarshalDecode, raw values shared with the body as
// rawInPlace), and moves the scanner past it.
func (sd *storedDecoder) unmarshalAt(p Payload) bool {
	sc := &sd.sc
	*sd.buf = *bytes.NewBuffer(sc.b[sc.i:])
	sd.dec.Reset(sd.buf)
	err := json.UnmarshalDecode(sd.dec, p, rawInPlace)
	off := sd.dec.InputOffset()
	*sd.buf = bytes.Buffer{}
	sd.dec.Reset(sd.buf) // the pooled decoder keeps nothing of the body
	if err != nil {
		return false
	}
	sc.i += int(off)
	return true
}

// object reads a JSON object member by member, as the library would:
// for each name, read reads its value into the payload when it knows the
// name and returns the name's bit (one per name, for the duplicate check)
// and whether the value was one it reads; for a name it does not know it
// returns 0 and reads nothing, and object skips the value (names must not
// repeat there either). An escaped name is not read.
func (sd *storedDecoder) object(read func(name []byte) (bit int, ok bool)) bool {
	sc := &sd.sc
	if !sc.eat('{') {
		return false
	}
	mark, seen := len(sc.names), 0
	for more := !sc.eat('}'); more; {
		name, ok := sc.name()
		if !ok {
			return false
		}
		bit, ok := read(name)
		if bit == 0 {
			ok = sc.member(mark, name) && sc.skip(1)
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
		if more, ok = sc.next(mark); !ok {
			return false
		}
	}
	return true
}

// messageAppended decodes the data of a message.appended event into m as
// json.Unmarshal would (the contract's strictness: no duplicate names,
// valid UTF-8; names match exactly; unknown members are skipped; a null
// leaves the zero value; raw values share the body's bytes, as rawInPlace
// does), without reflection. It reports false for anything it does not
// read the library's way (an escaped name, a value of another kind, a
// count that is not a plain integer of at most 18 digits), and the caller
// gives the body to the reference path.
func (sd *storedDecoder) messageAppended(m *MessageAppended) bool {
	sc := &sd.sc
	return sd.object(func(name []byte) (int, bool) {
		switch string(name) {
		case "role":
			var r string
			ok := sd.readInterned(&r)
			m.Role = Role(r)
			return 1, ok
		case "content":
			return 2, sd.contentBlocks(m)
		case "message_id":
			return 4, sd.readString(&m.MessageID)
		case "model":
			return 8, sd.readInterned(&m.Model)
		case "stop_reason":
			return 16, sd.readInterned(&m.StopReason)
		case "meta":
			return 32, sc.boolean(&m.Meta)
		case "synthetic":
			return 64, sc.boolean(&m.Synthetic)
		case "usage":
			if sc.null() {
				return 128, true
			}
			m.Usage = new(Usage)
			return 128, sd.usage(m.Usage)
		}
		return 0, true
	})
}

// contentBlocks decodes a message's array of content blocks into
// m.Content (empty, not nil, for []; nil for null; as the library does).
func (sd *storedDecoder) contentBlocks(m *MessageAppended) bool {
	sc := &sd.sc
	if sc.null() {
		return true
	}
	if !sc.eat('[') {
		return false
	}
	if sc.eat(']') {
		m.Content = []ContentBlock{}
		return true
	}
	for {
		m.Content = append(m.Content, ContentBlock{})
		if !sd.contentBlock(&m.Content[len(m.Content)-1]) {
			return false
		}
		switch sc.peek() {
		case ',':
			sc.i++
		case ']':
			sc.i++
			return true
		default:
			return false
		}
	}
}

// contentBlock decodes one content block into b, the way messageAppended
// decodes the message.
func (sd *storedDecoder) contentBlock(b *ContentBlock) bool {
	sc := &sd.sc
	return sd.object(func(name []byte) (int, bool) {
		switch string(name) {
		case "type":
			return 1, sd.readInterned(&b.Type)
		case "name":
			return 2, sd.readInterned(&b.Name)
		case "text":
			return 4, sd.readString(&b.Text)
		case "thinking":
			return 8, sd.readString(&b.Thinking)
		case "signature":
			return 16, sd.readString(&b.Signature)
		case "data":
			return 32, sd.readString(&b.Data)
		case "id":
			return 64, sd.readString(&b.ID)
		case "tool_use_id":
			return 128, sd.readString(&b.ToolUseID)
		case "is_error":
			return 256, sc.boolean(&b.IsError)
		case "input":
			v, ok := sc.raw()
			b.Input = stdjson.RawMessage(v)
			return 512, ok
		case "content":
			v, ok := sc.raw()
			b.Content = stdjson.RawMessage(v)
			return 1024, ok
		case "source":
			v, ok := sc.raw()
			b.Source = stdjson.RawMessage(v)
			return 2048, ok
		}
		return 0, true
	})
}

// usage decodes a message's token counts into u.
func (sd *storedDecoder) usage(u *Usage) bool {
	sc := &sd.sc
	return sd.object(func(name []byte) (int, bool) {
		switch string(name) {
		case "input_tokens":
			return 1, sc.count(&u.InputTokens)
		case "output_tokens":
			return 2, sc.count(&u.OutputTokens)
		case "cache_read_input_tokens":
			return 4, sc.count(&u.CacheReadTokens)
		case "cache_creation_input_tokens":
			return 8, sc.count(&u.CacheWriteTokens)
		case "reasoning_output_tokens":
			return 16, sc.count(&u.ReasoningTokens)
		}
		return 0, true
	})
}

// turnStarted, turnCompleted, stageCompleted, toolCallStarted and
// toolCallCompleted decode the other payloads every turn has, the way
// messageAppended decodes a message.
func (sd *storedDecoder) turnStarted(p *TurnStarted) bool {
	return sd.object(func(name []byte) (int, bool) {
		switch string(name) {
		case "prompt":
			return 1, sd.readString(&p.Prompt)
		case "trigger":
			return 2, sd.readInterned(&p.Trigger)
		case "deadline_ms":
			return 4, sd.sc.count(&p.DeadlineMS)
		}
		return 0, true
	})
}

func (sd *storedDecoder) turnCompleted(p *TurnCompleted) bool {
	return sd.object(func(name []byte) (int, bool) {
		switch string(name) {
		case "reason":
			return 1, sd.readInterned(&p.Reason)
		case "duration_ms":
			return 2, sd.sc.count(&p.DurationMS)
		}
		return 0, true
	})
}

func (sd *storedDecoder) stageCompleted(p *TurnStageCompleted) bool {
	return sd.object(func(name []byte) (int, bool) {
		switch string(name) {
		case "stage":
			var st string
			ok := sd.readInterned(&st)
			p.Stage = Stage(st)
			return 1, ok
		case "duration_ms":
			return 2, sd.sc.count(&p.DurationMS)
		}
		return 0, true
	})
}

func (sd *storedDecoder) toolCallStarted(p *ToolCallStarted) bool {
	return sd.object(func(name []byte) (int, bool) {
		switch string(name) {
		case "tool_use_id":
			return 1, sd.readString(&p.ToolUseID)
		case "name":
			return 2, sd.readInterned(&p.Name)
		}
		return 0, true
	})
}

func (sd *storedDecoder) toolCallCompleted(p *ToolCallCompleted) bool {
	return sd.object(func(name []byte) (int, bool) {
		switch string(name) {
		case "tool_use_id":
			return 1, sd.readString(&p.ToolUseID)
		case "name":
			return 2, sd.readInterned(&p.Name)
		case "duration_ms":
			return 4, sd.sc.count(&p.DurationMS)
		case "is_error":
			return 8, sd.sc.boolean(&p.IsError)
		}
		return 0, true
	})
}

// readString reads the next value, which must be a JSON string, into
// *dst (a string of its own).
func (sd *storedDecoder) readString(dst *string) bool {
	v, ok := sd.sc.str()
	if ok && v != nil {
		*dst = string(v)
	}
	return ok
}

// readInterned is readString for a value that repeats (a type, a source,
// a turn, a model): the string comes from the decoder's table.
func (sd *storedDecoder) readInterned(dst *string) bool {
	v, ok := sd.sc.str()
	if ok && v != nil {
		*dst = sd.intern(v)
	}
	return ok
}

// readShared is readString for the event's tenant or session: a value
// that is the subject's, given as s, shares its string.
func (sd *storedDecoder) readShared(dst *string, s string) bool {
	v, ok := sd.sc.str()
	switch {
	case !ok, v == nil:
	case string(v) == s:
		*dst = s
	default:
		*dst = string(v)
	}
	return ok
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
	*v = stdjson.RawMessage(val[:len(val):len(val)]) // an append to it cannot write into the body
	return err
}))
