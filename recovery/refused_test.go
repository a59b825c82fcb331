package recovery

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
)

// TestRefused is the rule that tells "this action is refused" (its
// session's matter: park it) from "the log cannot be written" (fail
// closed, retry).
func TestRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"log unavailable", fmt.Errorf("append: %w: timeout", events.ErrLogUnavailable), false},
		{"unknown error", errors.New("something else"), false},
		{"deadline", context.DeadlineExceeded, false},
		{"conflict", fmt.Errorf("append: %w", events.ErrConflict), false},
		{"event too large", fmt.Errorf("append: %w: 2000000 bytes", events.ErrTooLarge), true},
		{"invalid event", fmt.Errorf("append: %w", &events.FieldError{Field: "turn", Rule: "must be a token"}), true},
		{"invalid command", fmt.Errorf("issue: %w: reason: required", ErrInvalidCommand), true},
		{"maximum payload", fmt.Errorf("issue: %w", nats.ErrMaxPayload), true},
		{"JetStream 10054", fmt.Errorf("issue: %w", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamMessageExceedsMaximum}), true},
		{"JetStream 10071", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence}, false},
		{"too large and unavailable", errors.Join(events.ErrTooLarge, events.ErrLogUnavailable), false},
		{"publish error, too large", publishError(nats.ErrMaxPayload), true},
		{"publish error, no responders", publishError(nats.ErrNoResponders), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Refused(c.err); got != c.want {
				t.Errorf("Refused(%v) = %v, want %v", c.err, got, c.want)
			}
		})
	}
	if err := publishError(nats.ErrNoResponders); !errors.Is(err, events.ErrLogUnavailable) {
		t.Errorf("no responders: %v, want ErrLogUnavailable", err)
	}
}

// TestIssueRefusesBeforeSending: a command over MaxCommandBytes, or with
// a reason over MaxReasonBytes, is refused without a round trip (the
// JetStream handle is never used).
func TestIssueRefusesBeforeSending(t *testing.T) {
	big := NewCommand(KindRepairOrphans, "acme", "s1", "", "orphans", []uint64{1})
	for i := range MaxCommandBytes / 50 {
		big.Params.ToolUseIDs = append(big.Params.ToolUseIDs, fmt.Sprintf("toolu_%044d", i))
	}
	if _, _, err := Issue(context.Background(), nil, big); !errors.Is(err, events.ErrTooLarge) || !Refused(err) {
		t.Errorf("a command over MaxCommandBytes: %v, want ErrTooLarge", err)
	}
	long := NewCommand(KindPauseSession, "acme", "s1", "", strings.Repeat("r", MaxReasonBytes+1), []uint64{1})
	if _, _, err := Issue(context.Background(), nil, long); !errors.Is(err, ErrInvalidCommand) || !Refused(err) {
		t.Errorf("a reason over MaxReasonBytes: %v, want ErrInvalidCommand", err)
	}
}
