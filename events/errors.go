package events

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors of the event model and the log. Match them with errors.Is;
// the errors returned wrap them with the operation and the details.
var (
	// ErrInvalid: the event breaks a rule of the wire contract. The error
	// is (or joins) *FieldError values that name the field and the rule.
	ErrInvalid = errors.New("invalid event")
	// ErrMalformed: the body is not a JSON object of the envelope's shape,
	// or its data does not fit the shape of its type.
	ErrMalformed = errors.New("malformed event")
	// ErrUnknownType: the type is not one of this version's; the event is
	// still stored and read, only its payload cannot be decoded.
	ErrUnknownType = errors.New("unknown event type")
	// ErrTooLarge: the encoded event is larger than the log accepts
	// (Config.MaxEventBytes).
	ErrTooLarge = errors.New("event too large")
	// ErrConflict: the session's last subject sequence was not the one the
	// writer expected; another writer appended first. Re-read the session
	// and decide again. JetStream reports it as error code 10071 (wrong
	// last sequence) or, for batches, 10164.
	ErrConflict = errors.New("session changed since it was read")
	// ErrLogUnavailable: the log could not be written or read (no
	// JetStream, stream offline, storage full, timeout).
	ErrLogUnavailable = errors.New("event log unavailable")
	// ErrSessionNotFound: no event of the session is in the log.
	ErrSessionNotFound = errors.New("session not found")
	// ErrAmbiguousSession: a name given to ResolveSession matches several
	// sessions.
	ErrAmbiguousSession = errors.New("session name is ambiguous")
	// ErrSettingsDiffer: the config asks for a stream setting that
	// differs from the existing stream's, without Config.UpdateStreams;
	// or (recovery.SettingsError) a process asks for consumer settings
	// other than those stored. Only a setup changes them (engine setup).
	ErrSettingsDiffer = errors.New("settings differ")
	// ErrNoStream: a stream the log needs does not exist and
	// Config.UseExisting forbids creating it.
	ErrNoStream = errors.New("stream missing")
	// ErrDuplicateID: an event id of an atomic batch (an Atomic append of
	// two or more events, or a conditional one) is stored already, but not
	// by this call as it is now: the id was used by another call, or the
	// call sent again differs from the one stored. A resend must repeat the call as it was (then it is
	// answered with the original acks, Duplicate set); new events need
	// new ids. JetStream reports it as error 10201 (ADR-50).
	ErrDuplicateID = errors.New("event id already stored by another call")
)

// FieldError is one broken rule: Field is the path of the offending field
// ("tenant", "data.content[2].id"), Rule what it must satisfy, and Value, when
// short, what it held.
type FieldError struct {
	Field string
	Rule  string
	Value string
}

// Error implements error: `field "data.stage": must be one of context, ...`.
func (e *FieldError) Error() string {
	if e.Value != "" {
		return fmt.Sprintf("field %q: %s (got %q)", e.Field, e.Rule, e.Value)
	}
	return fmt.Sprintf("field %q: %s", e.Field, e.Rule)
}

// Unwrap makes errors.Is(err, ErrInvalid) hold.
func (e *FieldError) Unwrap() error { return ErrInvalid }

// EventError reports a problem with one event of the log: where it is
// (tenant, session, stream sequence, id) and what is wrong (Err).
type EventError struct {
	Tenant  string
	Session string
	Seq     uint64
	ID      string
	Err     error
}

// Error implements error.
func (e *EventError) Error() string {
	var b strings.Builder
	b.WriteString("event")
	if e.Tenant != "" || e.Session != "" {
		fmt.Fprintf(&b, " %s/%s", e.Tenant, e.Session)
	}
	if e.Seq != 0 {
		fmt.Fprintf(&b, " seq %d", e.Seq)
	}
	if e.ID != "" {
		fmt.Fprintf(&b, " id %s", e.ID)
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	return b.String()
}

// Unwrap returns the underlying error.
func (e *EventError) Unwrap() error { return e.Err }

func sha256Sum(s string) [32]byte { return sha256.Sum256([]byte(s)) }
