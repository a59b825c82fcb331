package refruntime

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/turnstone-dev/turnstone/events"
)

// ErrInvalidFault wraps every problem ParseFault and the turn checks find
// in a fault.
var ErrInvalidFault = errors.New("invalid fault")

// Fault is a failure injected into one turn (TurnSpec.Fault): one of
// FaultCrashMidTool, FaultStageThrows, FaultProvider or FaultHang. A nil
// Fault runs the turn normally. String returns the form ParseFault reads.
type Fault interface {
	fmt.Stringer
	check() error
}

// FaultCrashMidTool makes the turn stop the way a killed process does
// between a tool_use and its tool_result: the assistant message with the
// tool_use blocks and tool_call.started for the first tool are recorded,
// then nothing more (no tool_call.completed, no tool_result, no end of the
// turn). A turn without tools gets one (Bash, {"command":"ls"}).
// Config.OnCrash, when set, is called next.
type FaultCrashMidTool struct{}

// FaultStageThrows makes Stage throw: the stages before it complete, then
// turn.failed{stage: Stage, error: {message: Message, kind: logic}} ends
// the turn. Message defaults to "refruntime: injected failure in the
// <stage> stage".
type FaultStageThrows struct {
	Stage   events.Stage
	Message string
}

// FaultProvider makes the model call of the execute stage fail with the
// provider's HTTP Status (429, 529, 401, 500, 503, ...): error.recorded
// (http_status, code, provider, kind, consecutive, stage execute) and then
// turn.failed{stage: execute} with the same error. Provider defaults to
// the session's current provider; RetryAfter, when set, is the delay the
// provider asked for (a Retry-After header), quoted in the message. See
// ProviderError for the codes and kinds.
type FaultProvider struct {
	Status     int
	RetryAfter time.Duration
	Provider   string
}

// FaultHang makes the turn start and never end: turn.started and the
// context stage are recorded, then nothing (no outcome; the reconciler's
// deadline logic abandons it). RunTurn returns at once with OutcomeHung.
type FaultHang struct{}

// String implements Fault: "crash-mid-tool".
func (FaultCrashMidTool) String() string { return "crash-mid-tool" }

// String implements Fault: "stage-throws:<stage>".
func (f FaultStageThrows) String() string { return "stage-throws:" + string(f.Stage) }

// String implements Fault: "provider:<status>" or
// "provider:<status>:<retry after>".
func (f FaultProvider) String() string {
	s := "provider:" + strconv.Itoa(f.Status)
	if f.RetryAfter > 0 {
		s += ":" + f.RetryAfter.String()
	}
	return s
}

// String implements Fault: "hang".
func (FaultHang) String() string { return "hang" }

func (FaultCrashMidTool) check() error { return nil }
func (FaultHang) check() error         { return nil }

func (f FaultStageThrows) check() error {
	if !validStage(f.Stage) {
		return fmt.Errorf("%w: stage-throws: stage must be one of context, history, execute, finalize, got %q", ErrInvalidFault, f.Stage)
	}
	return nil
}

func (f FaultProvider) check() error {
	if f.Status < 400 || f.Status > 599 {
		return fmt.Errorf("%w: provider: status must be an HTTP error status (400-599), got %d", ErrInvalidFault, f.Status)
	}
	if f.RetryAfter < 0 {
		return fmt.Errorf("%w: provider: retry after must not be negative, got %s", ErrInvalidFault, f.RetryAfter)
	}
	return nil
}

func validStage(s events.Stage) bool {
	switch s {
	case events.StageContext, events.StageHistory, events.StageExecute, events.StageFinalize:
		return true
	}
	return false
}

// ParseFault reads a fault in its String form: "crash-mid-tool",
// "stage-throws:<stage>" (context, history, execute or finalize),
// "provider:<status>" or "provider:<status>:<retry after>" (a Go
// duration, "30s"), or "hang". The empty string is no fault (nil, nil).
// Errors wrap ErrInvalidFault.
func ParseFault(s string) (Fault, error) {
	name, arg, _ := strings.Cut(strings.TrimSpace(s), ":")
	var f Fault
	switch name {
	case "":
		return nil, nil
	case "crash-mid-tool":
		f = FaultCrashMidTool{}
	case "hang":
		f = FaultHang{}
	case "stage-throws":
		f = FaultStageThrows{Stage: events.Stage(arg)}
	case "provider":
		status, after, _ := strings.Cut(arg, ":")
		n, err := strconv.Atoi(status)
		if err != nil {
			return nil, fmt.Errorf("%w: %q: the status must be a number", ErrInvalidFault, s)
		}
		p := FaultProvider{Status: n}
		if after != "" {
			if p.RetryAfter, err = time.ParseDuration(after); err != nil {
				return nil, fmt.Errorf("%w: %q: retry after: %v", ErrInvalidFault, s, err)
			}
		}
		f = p
	default:
		return nil, fmt.Errorf("%w: %q: want crash-mid-tool, stage-throws:<stage>, provider:<status>[:<retry after>] or hang", ErrInvalidFault, s)
	}
	if (name == "crash-mid-tool" || name == "hang") && arg != "" {
		return nil, fmt.Errorf("%w: %q: %s takes no argument", ErrInvalidFault, s, name)
	}
	if err := f.check(); err != nil {
		return nil, err
	}
	return f, nil
}

// ProviderError is the error a provider's API returns with an HTTP status,
// in the shapes of the Anthropic Messages API errors
// (https://docs.anthropic.com/en/api/errors): Code is the error type
// (400 invalid_request_error, 401 authentication_error, 403
// permission_error, 404 not_found_error, 408 timeout_error, 413
// request_too_large, 429 rate_limit_error, 529 overloaded_error, other 5xx
// api_error, other 4xx invalid_request_error); Kind is transient for 408,
// 429 and 5xx (the same call may succeed later) and logic for the other
// statuses. retryAfter, when positive, is quoted in the message.
func ProviderError(provider string, status int, retryAfter time.Duration) events.ErrorInfo {
	code, kind := "invalid_request_error", events.KindLogic
	msg := http.StatusText(status)
	switch {
	case status == 401:
		code, msg = "authentication_error", "invalid x-api-key"
	case status == 403:
		code = "permission_error"
	case status == 404:
		code = "not_found_error"
	case status == 408:
		code, kind = "timeout_error", events.KindTransient
	case status == 413:
		code = "request_too_large"
	case status == 429:
		code, kind, msg = "rate_limit_error", events.KindTransient, "Number of request tokens has exceeded your per-minute rate limit"
	case status == 529:
		code, kind, msg = "overloaded_error", events.KindTransient, "Overloaded"
	case status >= 500:
		code, kind = "api_error", events.KindTransient
	}
	if msg == "" {
		msg = "HTTP " + strconv.Itoa(status)
	}
	message := fmt.Sprintf("%s API error %d %s: %s", provider, status, code, msg)
	if retryAfter > 0 {
		message += fmt.Sprintf(" (retry-after %s)", retryAfter)
	}
	return events.ErrorInfo{
		Message:    message,
		Kind:       kind,
		Provider:   provider,
		HTTPStatus: status,
		Code:       code,
	}
}
