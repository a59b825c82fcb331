package reconciler

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/clock"
	"github.com/turnstone-dev/turnstone/recovery"
	"gopkg.in/yaml.v3"
)

// Duration is a time.Duration written in YAML as a Go duration string
// ("120s", "2m"), or a whole number of days ("30d"): clock.ParseDuration,
// which the commands' duration flags (--since) share.
type Duration time.Duration

// UnmarshalYAML implements yaml.Unmarshaler.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return fmt.Errorf("line %d: want a duration such as \"120s\"", n.Line)
	}
	v, err := clock.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration such as \"120s\" or \"30d\"", n.Line, s)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML implements yaml.Marshaler.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// Policy is what the reconciler enforces: one policy file (YAML) with these
// defaults, and per-tenant overrides under `tenants:` that set any subset of
// the same keys. docs/policy.md documents every key.
type Policy struct {
	// TurnDeadline is how long a turn in flight with no tool call pending
	// (the runtime, or the model call, works) may go without a sign of
	// life before it is abandoned (a turn.started's own deadline_ms wins):
	// an event of the turn, activity of a subagent session it started, or
	// a runtime's claim that it works on the turn (docs/policy.md, "Every
	// turn ends"). Default 10m: real model calls were silent up to 7 min.
	TurnDeadline Duration `yaml:"turn_deadline"`
	// ToolDeadline is the same while a tool call of the turn is pending:
	// the tool runs, a subagent works, or the runtime waits for a person
	// (Claude Code asks before it runs most tools, and writes nothing
	// while it waits). Default 2h: real calls waited up to 69 min.
	ToolDeadline Duration `yaml:"tool_deadline"`
	// TurnMaxDuration, when set, bounds a turn's whole length from its
	// start, signs of life or not. Default 0: off.
	TurnMaxDuration Duration `yaml:"turn_max_duration"`
	// ToolTimeoutGrace is what a pending tool call that declares its own
	// timeout (projections.DeclaredTimeoutMS: Claude Code's Bash timeout,
	// Codex's timeout_ms) is given past that timeout before its silence
	// counts against the turn. Default 30s.
	ToolTimeoutGrace Duration `yaml:"tool_timeout_grace"`
	// Restart says what the engine does, when it starts, with turns that
	// were in flight when it (or a runtime) died.
	Restart RestartPolicy `yaml:"restart"`
	// Budget bounds a turn's work and detects loops (invariant 4).
	Budget BudgetPolicy `yaml:"budget"`
	// Transient sets what follows a turn that failed on a transient
	// provider error (network, timeout, 429, 5xx, 529).
	Transient TransientPolicy `yaml:"transient"`
	// Authentication is the chain for a turn that failed on 401/403:
	// default ["pause"] (the session is blocked until a person fixes the
	// credentials and resumes it).
	Authentication []string `yaml:"authentication"`
	// ParseFailure is the chain for a structured-output parse failure:
	// default ["degrade"] (the runtime uses the raw output instead of
	// failing the turn).
	ParseFailure []string `yaml:"parse_failure"`
	// Distillation guards distillation requests (invariant 3).
	Distillation DistillationPolicy `yaml:"distillation"`
	// Orphans sets what happens to an orphaned tool_use.
	Orphans OrphanPolicy `yaml:"orphans"`
	// Live says which sessions the reconciler acts on.
	Live LivePolicy `yaml:"live"`
	// Retention says how long a tenant's sessions are kept.
	Retention RetentionPolicy `yaml:"retention"`
	// Tenants holds per-tenant overrides: any of the keys above.
	Tenants map[string]yaml.Node `yaml:"tenants"`

	tenants map[string]*Policy
}

// RestartPolicy: InFlightTurns is "wait" (the default: keep each turn's
// deadline, so it is abandoned when it expires unless it ends first) or
// "abandon" (abandon every turn found in flight at start at once).
type RestartPolicy struct {
	InFlightTurns string `yaml:"in_flight_turns"`
}

// BudgetPolicy: ImplementationAttempts is how many attempts at one step
// of a turn in flight may fail in a row before the strategy is pivoted
// (projections.Turn.FailedAttempts: the same tool on the same operand, or
// one stage, failing with no success of that step between; failures at
// different steps do not add up) (default 10); SameErrorLimit how many
// identical errors in a row pivot it (default 3); SameOutputLimit how many
// times in a row the same assistant output answering the same input halts
// the loop and pauses the session (default 3).
type BudgetPolicy struct {
	ImplementationAttempts int `yaml:"implementation_attempts"`
	SameErrorLimit         int `yaml:"same_error_limit"`
	SameOutputLimit        int `yaml:"same_output_limit"`
}

// TransientPolicy: Chain is the strategy chain of a turn failed on a
// transient provider error (default ["retry*2", "pause"]: two jittered
// retries, then pause); Recommendation is what the pause recommends
// (default "switch provider").
type TransientPolicy struct {
	Chain          []string `yaml:"chain"`
	Recommendation string   `yaml:"recommendation"`
}

// DistillationPolicy: Guard answers distillation requests (default true):
// skipped with the reason while a turn is in flight or the history is
// dirty, run as a distill command once it is clean. Grace is how long a
// request may wait for the runtime's own distillation.started before the
// guard answers it (default 1s).
type DistillationPolicy struct {
	Guard *bool    `yaml:"guard"`
	Grace Duration `yaml:"grace"`
}

// LivePolicy: the reconciler acts only on live sessions (docs/policy.md,
// "Live sessions"): not history (an import), and either served by a
// runtime that is present (package presence) or with runtime activity
// stored within Horizon (the log's clock; default 30m). A person can
// still issue any command on any session by hand.
type LivePolicy struct {
	Horizon Duration `yaml:"horizon"`
}

// RetentionPolicy: MaxAge is how long a session is kept after its latest
// event was stored (the log's clock): past it, the engine that owns the
// session's partition erases the whole session (events, snapshots,
// commands and their statuses, index entry, quarantine records) and
// records it in the audit stream with reason "retention". 0, the default,
// keeps sessions forever. docs/policy.md, "Retention", says why this
// and not JetStream's per-message TTL.
type RetentionPolicy struct {
	MaxAge Duration `yaml:"max_age"`
}

// OrphanPolicy: Repair issues repair_orphans for every orphaned tool_use
// (default true).
type OrphanPolicy struct {
	Repair *bool `yaml:"repair"`
}

// DefaultPolicy returns the policy with every default set.
func DefaultPolicy() *Policy {
	p := &Policy{}
	p.setDefaults()
	return p
}

func (p *Policy) setDefaults() {
	if p.TurnDeadline == 0 {
		p.TurnDeadline = Duration(10 * time.Minute)
	}
	if p.ToolDeadline == 0 {
		p.ToolDeadline = Duration(2 * time.Hour)
	}
	if p.ToolTimeoutGrace == 0 {
		p.ToolTimeoutGrace = Duration(30 * time.Second)
	}
	if p.Restart.InFlightTurns == "" {
		p.Restart.InFlightTurns = "wait"
	}
	if p.Budget.ImplementationAttempts == 0 {
		p.Budget.ImplementationAttempts = 10
	}
	if p.Budget.SameErrorLimit == 0 {
		p.Budget.SameErrorLimit = 3
	}
	if p.Budget.SameOutputLimit == 0 {
		p.Budget.SameOutputLimit = 3
	}
	if p.Transient.Chain == nil {
		p.Transient.Chain = []string{"retry*2", "pause"}
	}
	if p.Transient.Recommendation == "" {
		p.Transient.Recommendation = "switch provider"
	}
	if p.Authentication == nil {
		p.Authentication = []string{"pause"}
	}
	if p.ParseFailure == nil {
		p.ParseFailure = []string{"degrade"}
	}
	if p.Distillation.Guard == nil {
		t := true
		p.Distillation.Guard = &t
	}
	if p.Distillation.Grace == 0 {
		p.Distillation.Grace = Duration(time.Second)
	}
	if p.Orphans.Repair == nil {
		t := true
		p.Orphans.Repair = &t
	}
	if p.Live.Horizon == 0 {
		p.Live.Horizon = Duration(30 * time.Minute)
	}
}

// validate reports every bad key, each named with prefix ("tenants.acme.").
func (p *Policy) validate(prefix string) []error {
	var errs []error
	bad := func(key, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s%s: %s", prefix, key, fmt.Sprintf(format, a...)))
	}
	if p.TurnDeadline <= 0 {
		bad("turn_deadline", "must be positive, got %s", time.Duration(p.TurnDeadline))
	}
	if p.ToolDeadline <= 0 {
		bad("tool_deadline", "must be positive, got %s", time.Duration(p.ToolDeadline))
	}
	if p.TurnMaxDuration < 0 {
		bad("turn_max_duration", "must not be negative (0 is off), got %s", time.Duration(p.TurnMaxDuration))
	}
	if p.ToolTimeoutGrace < 0 {
		bad("tool_timeout_grace", "must not be negative, got %s", time.Duration(p.ToolTimeoutGrace))
	}
	if p.Restart.InFlightTurns != "wait" && p.Restart.InFlightTurns != "abandon" {
		bad("restart.in_flight_turns", "must be wait or abandon, got %q", p.Restart.InFlightTurns)
	}
	for key, n := range map[string]int{
		"budget.implementation_attempts": p.Budget.ImplementationAttempts,
		"budget.same_error_limit":        p.Budget.SameErrorLimit,
		"budget.same_output_limit":       p.Budget.SameOutputLimit,
	} {
		if n < 1 {
			bad(key, "must be at least 1, got %d", n)
		}
	}
	for key, chain := range map[string][]string{
		"transient.chain": p.Transient.Chain,
		"authentication":  p.Authentication,
		"parse_failure":   p.ParseFailure,
	} {
		if _, err := recovery.ParseChain(chain); err != nil {
			bad(key, "%v", err)
		}
	}
	if p.Live.Horizon <= 0 {
		bad("live.horizon", "must be positive, got %s", time.Duration(p.Live.Horizon))
	}
	if p.Distillation.Grace < 0 {
		bad("distillation.grace", "must not be negative, got %s", time.Duration(p.Distillation.Grace))
	}
	if p.Retention.MaxAge < 0 {
		bad("retention.max_age", "must not be negative (0 keeps sessions forever), got %s", time.Duration(p.Retention.MaxAge))
	}
	sort.Slice(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
	return errs
}

// ParsePolicy reads a policy from YAML. Unknown keys are errors, every
// value is checked, and each tenant's overrides are applied to the base
// policy and checked too. The error joins every problem, each naming its
// key ("tenants.acme.turn_deadline: must be positive").
func ParsePolicy(data []byte) (*Policy, error) {
	// Decode onto the defaults, so a key set to 0 stays 0 and is refused
	// rather than silently replaced by its default.
	p := DefaultPolicy()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(p); err != nil && !errors.Is(err, io.EOF) { // an empty file is the default policy
		return nil, fmt.Errorf("policy: %w", err)
	}
	errs := p.validate("")
	p.tenants = map[string]*Policy{}
	names := make([]string, 0, len(p.Tenants))
	for name := range p.Tenants {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !events.ValidToken(name) {
			errs = append(errs, fmt.Errorf("tenants.%s: %q is not a tenant token ([A-Za-z0-9_-], 1-128)", name, name))
			continue
		}
		node := p.Tenants[name]
		t := p.copyBase()
		if err := decodeStrict(&node, t); err != nil {
			errs = append(errs, fmt.Errorf("tenants.%s: %w", name, err))
			continue
		}
		errs = append(errs, t.validate("tenants."+name+".")...)
		p.tenants[name] = t
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	return p, nil
}

// decodeStrict decodes node onto v, refusing unknown keys.
func decodeStrict(node *yaml.Node, v *Policy) error {
	b, err := yaml.Marshal(node)
	if err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		return err
	}
	if v.Tenants != nil {
		return errors.New("tenants: overrides cannot nest tenants")
	}
	return nil
}

func (p *Policy) copyBase() *Policy {
	c := *p
	c.Tenants, c.tenants = nil, nil
	c.Transient.Chain = append([]string(nil), p.Transient.Chain...)
	c.Authentication = append([]string(nil), p.Authentication...)
	c.ParseFailure = append([]string(nil), p.ParseFailure...)
	return &c
}

// LoadPolicy reads and parses the policy file at path; an empty path is
// the default policy.
func LoadPolicy(path string) (*Policy, error) {
	if path == "" {
		return DefaultPolicy(), nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	p, err := ParsePolicy(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// YAML returns the policy as a policy file that ParsePolicy reads back
// to the same policy: every key with its value, and the tenants'
// overrides as they were written. The engine records it in the audit
// stream when it loads it (audit.ActionPolicyLoaded).
func (p *Policy) YAML() ([]byte, error) {
	b, err := yaml.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	return b, nil
}

// Retains reports whether any tenant's sessions have a retention (a
// max age), so an engine knows whether to sweep at all.
func (p *Policy) Retains() bool {
	if p.Retention.MaxAge > 0 {
		return true
	}
	for _, t := range p.tenants {
		if t.Retention.MaxAge > 0 {
			return true
		}
	}
	return false
}

// For returns the policy that applies to tenant: the base with the
// tenant's overrides, or the base.
func (p *Policy) For(tenant string) *Policy {
	if t, ok := p.tenants[tenant]; ok {
		return t
	}
	return p
}
