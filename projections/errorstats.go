package projections

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode"

	"github.com/turnstone-dev/turnstone/events"
)

// ErrorStats counts the session's errors: error.recorded events and the
// errors of failed turns.
type ErrorStats struct {
	// Total is how many errors were recorded.
	Total int `json:"total"`
	// Last is the latest error, if any.
	Last *ErrorRecord `json:"last,omitempty"`
	// Streak is the run of identical errors in a row (invariant 4: the
	// same error N times in a row is a loop, not progress).
	Streak Streak `json:"streak"`
}

// ErrorRecord is one error as the state keeps it.
type ErrorRecord struct {
	// Error is the error, its message and stack shortened.
	Error events.ErrorInfo `json:"error"`
	// Seq is the sequence of the event that carried it.
	Seq uint64 `json:"seq"`
	// Turn and Stage are the turn and stage it happened in, when known.
	Turn  string       `json:"turn,omitempty"`
	Stage events.Stage `json:"stage,omitempty"`
	// Consecutive is error.recorded's own count of this error in a row.
	Consecutive int `json:"consecutive,omitzero"`
}

// Streak is a run of identical errors. Two errors are identical when they
// have the same Key: their kind, code, HTTP status and a hash of their
// normalized message (lower case, digits folded, spaces collapsed). The
// streak restarts at 1 when a different error arrives and resets to zero
// when a turn completes.
type Streak struct {
	// Key is the ErrorKey of the streak's error (empty when Count is 0).
	Key string `json:"key,omitempty"`
	// Count is how many times in a row it arrived.
	Count int `json:"count"`
	// FirstSeq is the sequence of the streak's first error.
	FirstSeq uint64 `json:"first_seq,omitzero"`
}

// recordError counts an error and moves the streak.
func (s *Session) recordError(ev *events.Event, turn string, stage events.Stage, info events.ErrorInfo, consecutive int) {
	s.Errors.Total++
	s.Errors.Last = &ErrorRecord{Error: shortError(info), Seq: ev.Seq, Turn: turn, Stage: stageKey(stage), Consecutive: consecutive}
	key := IDKey(ErrorKey(info))
	if s.Errors.Streak.Key == key && s.Errors.Streak.Count > 0 {
		s.Errors.Streak.Count++
		return
	}
	s.Errors.Streak = Streak{Key: key, Count: 1, FirstSeq: ev.Seq}
}

// ErrorKey returns the key that makes two errors "the same error" for a
// Streak: "kind|code|http_status|hash", the hash being the first 8 bytes
// (hex) of the SHA-256 of the message normalized: lower case, every run of
// digits folded to one '#', runs of white space collapsed to one space,
// trimmed. Normalizing keeps ids, counts and timestamps in messages from
// hiding a loop.
func ErrorKey(e events.ErrorInfo) string {
	sum := sha256.Sum256([]byte(normalizeMessage(e.Message)))
	return fmt.Sprintf("%s|%s|%d|%s", e.Kind, e.Code, e.HTTPStatus, hex.EncodeToString(sum[:8]))
}

func normalizeMessage(m string) string {
	var b strings.Builder
	b.Grow(len(m))
	prev := ' ' // so that leading space is trimmed
	for _, r := range m {
		switch {
		case unicode.IsDigit(r):
			r = '#'
		case unicode.IsSpace(r):
			r = ' '
		default:
			r = unicode.ToLower(r)
		}
		if (r == '#' || r == ' ') && r == prev {
			continue
		}
		b.WriteRune(r)
		prev = r
	}
	return strings.TrimRight(b.String(), " ")
}

// shortError returns e with its message and stack clipped for
// Errors.Last (the full error stays in the log): the message to
// ErrorRunes runes, the stack to StackRunes, each within twice as many
// bytes of JSON; its kind, provider and code as keys.
func shortError(e events.ErrorInfo) events.ErrorInfo {
	e.Message = clip(e.Message, ErrorRunes, 2*ErrorRunes)
	e.Stack = clip(e.Stack, StackRunes, 2*StackRunes)
	return errorKeys(e)
}

// turnError returns e as a Turn keeps it: the message clipped like a
// detail, no stack.
func turnError(e events.ErrorInfo) events.ErrorInfo {
	e.Message, e.Stack = detail(e.Message), ""
	return errorKeys(e)
}

func errorKeys(e events.ErrorInfo) events.ErrorInfo {
	e.Kind = events.ErrorKind(IDKey(string(e.Kind)))
	e.Provider, e.Code = IDKey(e.Provider), IDKey(e.Code)
	return e
}

// stageKey is a stage as the state keeps it (IDKey).
func stageKey(st events.Stage) events.Stage { return events.Stage(IDKey(string(st))) }

// The bounds of Errors.Last (see shortError).
const (
	ErrorRunes = 500
	StackRunes = 1000
)
