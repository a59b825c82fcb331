package events

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
)

// SpecVersion is the CloudEvents specification version the envelope follows.
const SpecVersion = "1.0"

// DefaultSource is the envelope source Turnstone writes on events it creates
// itself. CloudEvents requires a non-empty URI-reference; publishers set
// their own (for example "urn:agent:billing-bot").
const DefaultSource = "urn:turnstone"

// Event is one record of the log: a CloudEvents 1.0 style envelope around a
// typed payload. It is stored as one JSON object, exactly as published.
//
// ID is a ULID (26 characters, Crockford base32) and doubles as the
// Nats-Msg-Id header, so a retried publish is stored once. Time is when the
// thing happened at its source (RFC 3339 on the wire), not when it was
// stored. Tenant and Session are subject tokens (see ValidToken). Turn is
// optional and names the turn the event belongs to. Data holds the payload
// for Type, a JSON object; use Payload to decode it.
//
// Seq, Subject and Stored are set on events read from the log (the stream
// sequence, the stored, partitioned subject, and JetStream's store time);
// they are not part of the body. Raw is the stored body itself (shared
// with the message: do not change it), and Data shares its bytes. Stored is the log's own clock: unlike
// Time, which the publisher chose, it is when the event reached the
// stream, so deadlines and recency count from it (zero when the reader
// did not have it). Err
// is set on an event read from the log whose body could not be decoded or
// breaks the contract (an *EventError naming its session and sequence);
// such an event still carries Seq, Subject, Tenant and Session (from the
// subject) and its raw body in Data, so a reader can report it and go on.
type Event struct {
	SpecVersion string          `json:"specversion"`
	ID          string          `json:"id"`
	Type        Type            `json:"type"`
	Source      string          `json:"source"`
	Time        time.Time       `json:"time"`
	Tenant      string          `json:"tenant"`
	Session     string          `json:"session"`
	Turn        string          `json:"turn,omitempty"`
	Data        json.RawMessage `json:"data"`

	Seq     uint64    `json:"-"`
	Subject string    `json:"-"`
	Stored  time.Time `json:"-"`
	Raw     []byte    `json:"-"`
	Err     error     `json:"-"`

	payload Payload // decoded by Validate: see Payload
	// decoded is Data as Decode read it, strictly (no duplicate member
	// names, valid UTF-8): Validate need not check it again while Data
	// is still those bytes.
	decoded []byte
}

// New builds an event for tenant and session carrying payload p, with a new
// ULID, the current time and DefaultSource. turn may be empty. It returns an
// error only if p cannot be encoded as JSON. The event is not validated:
// Log.Append validates before it stores.
func New(tenant, session, turn string, p Payload) (Event, error) {
	return NewAt(time.Now().UTC(), NewID(), tenant, session, turn, p)
}

// NewAt is New with an explicit time and id, for importers and replays that
// must produce the same event twice (see DeterministicID).
func NewAt(at time.Time, id, tenant, session, turn string, p Payload) (Event, error) {
	data, err := marshal(p)
	if err != nil {
		return Event{}, fmt.Errorf("encode %s payload: %w", p.EventType(), err)
	}
	return Event{
		SpecVersion: SpecVersion,
		ID:          id,
		Type:        p.EventType(),
		Source:      DefaultSource,
		Time:        at,
		Tenant:      tenant,
		Session:     session,
		Turn:        turn,
		Data:        data,
	}, nil
}

var (
	entropyMu sync.Mutex
	entropy   = ulid.Monotonic(rand.Reader, 0)
)

// NewID returns a new ULID string: 48 bits of millisecond time and 80 bits
// of randomness, monotonic within one process.
func NewID() string {
	entropyMu.Lock()
	defer entropyMu.Unlock()
	return ulid.MustNew(ulid.Timestamp(time.Now()), entropy).String()
}

// DeterministicID returns a ULID whose time part is at (milliseconds) and
// whose random part is derived from key (the first 80 bits of its SHA-256).
// The same at and key always give the same id, so re-importing a record
// yields the same Nats-Msg-Id and the log stores it once.
func DeterministicID(at time.Time, key string) string {
	var id ulid.ULID
	_ = id.SetTime(ulid.Timestamp(at))
	sum := sha256Sum(key)
	copy(id[6:], sum[:10])
	return id.String()
}

// Decode parses one event body. It returns an error wrapping ErrMalformed
// when b is not one JSON object of the envelope's shape (docs/events.md,
// "Strictness": no duplicate member names, valid UTF-8, nothing after the
// object); it does not validate the contents (see Validate).
func Decode(b []byte) (Event, error) {
	var ev Event
	if err := unmarshal(b, &ev); err != nil {
		return Event{}, fmt.Errorf("%w: %s", ErrMalformed, decodeProblem(err))
	}
	ev.decoded = ev.Data
	return ev, nil
}

// Encode returns the event body as stored: one compact JSON object, the
// envelope's members in contract order, with <, > and & kept as they are
// (not \u003c escapes), so stored text reads as sent. It returns an error
// when the event cannot be written as JSON (a string of invalid UTF-8, a
// time outside years 0 to 9999, Data that is not one valid JSON value).
func (e Event) Encode() ([]byte, error) {
	if b, ok := e.appendEncoded(make([]byte, 0, len(e.Data)+len(e.ID)+len(e.Tenant)+len(e.Session)+len(e.Source)+len(e.Turn)+160)); ok {
		return b, nil // what marshal writes (FuzzEncode checks), without reflection
	}
	b, err := marshal(e)
	if err != nil {
		return nil, fmt.Errorf("encode event %s: %w", e.ID, err)
	}
	return b, nil
}

// Payload decodes Data into the typed payload for Type (for example
// *TurnStarted for TypeTurnStarted). An event that Validate (or a read of
// the log) checked carries its payload decoded already, and Payload
// returns that one: a payload is decoded once. It returns an error
// wrapping ErrUnknownType for a type this version does not know, and one
// wrapping ErrMalformed when Data does not fit the payload's shape. Treat
// the payload as read-only: it may be shared by copies of the event.
func (e Event) Payload() (Payload, error) {
	if e.payload != nil && e.payload.EventType() == e.Type {
		return e.payload, nil
	}
	return decodePayload(e.Type, e.Data)
}

// decodePayload decodes data into a new payload of type t: the turn's
// payloads with the scanner (readPayload), anything else, or what it does
// not read, with the library (unmarshalPayload).
func decodePayload(t Type, data []byte) (Payload, error) {
	if p := newPayload(t); p != nil && readPayload(p, data) {
		return p, nil // without reflection (FuzzDecodeValidate compares)
	}
	return unmarshalPayload(t, data)
}

// unmarshalPayload decodes data into a new payload of type t with the
// library: decodePayload's reference, and its errors (ErrUnknownType,
// ErrMalformed).
func unmarshalPayload(t Type, data []byte) (Payload, error) {
	p := newPayload(t)
	if p == nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownType, t)
	}
	if len(data) == 0 {
		return nil, fmt.Errorf("%w: %s event has no data", ErrMalformed, t)
	}
	if err := unmarshal(data, p); err != nil {
		return nil, fmt.Errorf("%w: %s data: %s", ErrMalformed, t, decodeProblem(err))
	}
	return p, nil
}

// String is a short form for logs: type, tenant/session and id.
func (e Event) String() string {
	return fmt.Sprintf("%s %s/%s %s", e.Type, e.Tenant, e.Session, e.ID)
}
