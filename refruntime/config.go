package refruntime

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/turnstone-dev/turnstone/events"
)

// Defaults of Config.
const (
	// DefaultName names the runtime in session.started and in the events'
	// source ("urn:refruntime:refruntime").
	DefaultName = "refruntime"
	// DefaultProvider is the provider a session starts on.
	DefaultProvider = "anthropic"
	// DefaultModel is the model the assistant messages name.
	DefaultModel = "claude-sonnet-4-5"
	// DefaultConflictRetries is how many times a conditional append that
	// meets events.ErrConflict re-reads the session and tries again.
	DefaultConflictRetries = 20
)

// Config configures a Runtime. Only Tenant is required; every other field
// has a default (see the field).
type Config struct {
	// Tenant is the tenant token (events.ValidToken) the runtime records
	// under and answers control requests for. Required.
	Tenant string
	// Name names the runtime: session.started's runtime attribute is
	// "<Name> (turnstone refruntime)" and the events' source is
	// "urn:refruntime:<Name>". Default DefaultName.
	Name string
	// Provider is the provider new sessions start on. Default: the first
	// of Providers, or DefaultProvider.
	Provider string
	// Providers is the order switch_provider moves a session through
	// ("anthropic", "bedrock", "vertex"): each switch goes to the provider
	// after the current one, wrapping around. Default: Provider alone.
	// When both are set, Provider must be one of Providers.
	Providers []string
	// Model is the model the assistant messages name. Default
	// DefaultModel.
	Model string
	// StageDelay is how long each stage of a turn takes before its
	// turn.stage_completed is recorded (and how long each tool runs).
	// Default 0: as fast as the log acknowledges.
	StageDelay time.Duration
	// TurnDeadline, when set, is recorded as each turn.started's
	// deadline_ms (milliseconds): how long the turn may run before the
	// reconciler abandons it. Default 0: no deadline.
	TurnDeadline time.Duration
	// QueueGroup is the NATS queue group of the control subscription, so
	// that several instances for one tenant share the requests. Default
	// "refruntime-<Tenant>". NATS hands each request to one member of the
	// group, which rejects a session it does not know: instances that
	// share a group should set AdoptUnknown.
	QueueGroup string
	// AdoptUnknown makes a control request for a session this runtime
	// never ran adopt the session from the log (see Runtime.Adopt) instead
	// of rejecting it: a runtime restarted after a crash serves the
	// sessions of the process that died. Default false.
	AdoptUnknown bool
	// OnCrash, when set, is called after a FaultCrashMidTool turn has
	// recorded its tool_use and tool_call.started, with the session and
	// turn ids; a command sets it to exit the process (a real crash).
	OnCrash func(session, turn string)
	// ConflictRetries bounds how many times a conditional append retries
	// after events.ErrConflict, each after a short random pause (up to
	// 5 ms per attempt, at most 50 ms). Default DefaultConflictRetries.
	ConflictRetries int
}

func (c *Config) setDefaults() {
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.Provider == "" {
		if len(c.Providers) > 0 {
			c.Provider = c.Providers[0]
		} else {
			c.Provider = DefaultProvider
		}
	}
	if len(c.Providers) == 0 {
		c.Providers = []string{c.Provider}
	} else {
		c.Providers = append([]string(nil), c.Providers...)
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.QueueGroup == "" {
		c.QueueGroup = "refruntime-" + c.Tenant
	}
	if c.ConflictRetries == 0 {
		c.ConflictRetries = DefaultConflictRetries
	}
}

// Validate reports every field that is out of range, joined with
// errors.Join: a Tenant that is not a subject token, a blank or duplicate
// provider, a Provider missing from Providers, negative durations or
// retries, a QueueGroup or Name with white space.
func (c *Config) Validate() error {
	var errs []error
	if !events.ValidToken(c.Tenant) {
		errs = append(errs, fmt.Errorf("tenant: must be 1-%d characters of [A-Za-z0-9_-], got %q", events.MaxTokenLen, c.Tenant))
	}
	if strings.ContainsFunc(c.Name, unicode.IsSpace) {
		errs = append(errs, fmt.Errorf("name: must not hold white space, got %q", c.Name))
	}
	seen := map[string]bool{}
	for i, p := range c.Providers {
		switch {
		case strings.TrimSpace(p) == "":
			errs = append(errs, fmt.Errorf("providers[%d]: must not be blank", i))
		case seen[p]:
			errs = append(errs, fmt.Errorf("providers[%d]: %q is listed twice", i, p))
		}
		seen[p] = true
	}
	if c.Provider != "" && len(c.Providers) > 0 && !seen[c.Provider] {
		errs = append(errs, fmt.Errorf("provider: %q is not one of providers %v", c.Provider, c.Providers))
	}
	if c.StageDelay < 0 {
		errs = append(errs, fmt.Errorf("stage delay: must not be negative, got %s", c.StageDelay))
	}
	if c.TurnDeadline < 0 {
		errs = append(errs, fmt.Errorf("turn deadline: must not be negative, got %s", c.TurnDeadline))
	}
	if strings.ContainsFunc(c.QueueGroup, unicode.IsSpace) {
		errs = append(errs, fmt.Errorf("queue group: must not hold white space, got %q", c.QueueGroup))
	}
	if c.ConflictRetries < 0 {
		errs = append(errs, fmt.Errorf("conflict retries: must not be negative, got %d", c.ConflictRetries))
	}
	return errors.Join(errs...)
}
