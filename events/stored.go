package events

import (
	"bytes"
	stdjson "encoding/json"
	"io"
	"sync"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// storedDecoder is a reusable jsontext.Decoder and the buffer it reads
// from (a bytes.Buffer, which the decoder reads in place, without a copy).
type storedDecoder struct {
	dec *jsontext.Decoder
	buf *bytes.Buffer
	ev  Event // decoded into here (a pointer to a local would escape)
}

var storedDecoders = sync.Pool{New: func() any {
	buf := new(bytes.Buffer)
	return &storedDecoder{dec: jsontext.NewDecoder(buf), buf: buf}
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
func decodeValid(body []byte) (Event, bool) {
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
		switch string(name) {
		case `"specversion"`:
			err = json.UnmarshalDecode(dec, &ev.SpecVersion)
		case `"id"`:
			err = json.UnmarshalDecode(dec, &ev.ID)
		case `"type"`:
			err = json.UnmarshalDecode(dec, &ev.Type)
		case `"source"`:
			err = json.UnmarshalDecode(dec, &ev.Source)
		case `"time"`:
			err = json.UnmarshalDecode(dec, &ev.Time)
		case `"tenant"`:
			err = json.UnmarshalDecode(dec, &ev.Tenant)
		case `"session"`:
			err = json.UnmarshalDecode(dec, &ev.Session)
		case `"turn"`:
			err = json.UnmarshalDecode(dec, &ev.Turn)
		case `"data"`:
			if p = newPayload(ev.Type); p == nil || dec.PeekKind() != '{' {
				return Event{}, false // unknown type, data before type, or not an object
			}
			start := dec.InputOffset() // after the name: the colon and white space follow
			if err := json.UnmarshalDecode(dec, p, rawInPlace); err != nil {
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
		if err != nil {
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
	v := validator{}
	v.envelope(ev)
	v.payload(ev, p)
	if len(v.errs) > 0 {
		return Event{}, false
	}
	ev.payload = p
	out := *ev
	*ev = Event{} // the pool keeps nothing of it
	return out, true
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
