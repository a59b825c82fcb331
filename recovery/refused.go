package recovery

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
)

// MaxCommandBytes bounds one command's JSON body, in bytes: Issue refuses
// a larger one (events.ErrTooLarge) without sending it. A quarter of the
// NATS server's default max_payload (1 MiB): the reconciler's commands
// name ids as keys (projections.IDKey) and keep their reasons short, so
// the largest it issues (a repair of every orphan the state keeps) is a
// few tens of KiB.
const MaxCommandBytes = 256 << 10

// MaxReasonBytes bounds a command's Reason, in bytes (Validate).
const MaxReasonBytes = 4 << 10

// Refused reports whether err means "this action is refused": the event,
// command or snapshot is too large (events.ErrTooLarge, nats.ErrMaxPayload,
// JetStream's error 10054 "message size exceeds maximum allowed"), or it
// breaks a rule (events.ErrInvalid, ErrInvalidCommand). Sending it again
// gives the same answer, and it concerns its own session only: the caller
// sets it aside (parks it, with the reason) and carries on with the
// others. Any other error, events.ErrLogUnavailable first among them,
// means "the log cannot be written" and is not a refusal: the caller fails
// closed and retries. An error that is both (a batch with one event too
// large and a timeout) is not a refusal.
func Refused(err error) bool {
	if err == nil || errors.Is(err, events.ErrLogUnavailable) {
		return false
	}
	if errors.Is(err, events.ErrTooLarge) || errors.Is(err, events.ErrInvalid) || errors.Is(err, ErrInvalidCommand) || errors.Is(err, nats.ErrMaxPayload) {
		return true
	}
	var api *jetstream.APIError
	return errors.As(err, &api) && api.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum
}

// publishError turns the error of a publish to AGENT_RECOVERY into the
// log's sentinels: a message too large for the server wraps
// events.ErrTooLarge; a JetStream API error is kept as it is; anything
// else (no responders, a timeout, a closed connection) wraps
// events.ErrLogUnavailable.
func publishError(err error) error {
	var api *jetstream.APIError
	switch {
	case errors.Is(err, nats.ErrMaxPayload),
		errors.As(err, &api) && api.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return fmt.Errorf("%w: %w", events.ErrTooLarge, err)
	case errors.As(err, &api):
		return err
	}
	return fmt.Errorf("%w: %w", events.ErrLogUnavailable, err)
}
