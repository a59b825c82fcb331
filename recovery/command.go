// Package recovery is the recovery contract every Turnstone process and
// every runtime shares: the command model, the AGENT_RECOVERY stream and
// its consumers' settings, error classification, retry policies and
// strategy chains, and the runtime control protocol (control requests and
// replies on agent.ctl.<tenant>.<session>, and presence). It imports only
// the event model; the worker that executes commands is internal
// (internal/worker), and the engine's reconciler decides what to issue.
//
// Commands travel on the AGENT_RECOVERY stream, published to
// agent.cmd.<tenant>.<session> and stored partitioned like the events. One
// durable pull consumer per partition, with MaxAckPending 1 and a priority
// group under the pinned_client policy, lets NATS pin each partition to one
// worker and move it when that worker dies, so no two commands of a session
// ever run at once or out of order. Every attempt and outcome is recorded
// in the session's own event log.
package recovery

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/turnstone-dev/turnstone/events"
)

// Kind is what a command asks for.
type Kind string

// The command kinds. Effects inside the log need no runtime; the others go
// to the agent runtime as NATS requests on agent.ctl.<tenant>.<session>
// (docs/control.md).
const (
	// KindRepairOrphans appends a synthesized, is_error tool_result for each
	// orphaned tool_use, so the history is valid for the model API again.
	KindRepairOrphans Kind = "repair_orphans"
	// KindAbandonTurn ends a turn that has no outcome with turn.abandoned.
	KindAbandonTurn Kind = "abandon_turn"
	// KindRetryTurn asks the runtime to run the turn again.
	KindRetryTurn Kind = "retry_turn"
	// KindSwitchProvider asks the runtime to move the session to another
	// provider (Params.ToProvider, or the runtime's next one).
	KindSwitchProvider Kind = "switch_provider"
	// KindResumeSession lifts a pause (session.resumed) and tells the
	// runtime to carry on.
	KindResumeSession Kind = "resume_session"
	// KindForkSession starts a new session (Params.ForkSession) from the
	// session's events up to Params.AtSeq, with its lineage recorded.
	KindForkSession Kind = "fork_session"
	// KindRewindSession rewinds the session to Params.ToSeq
	// (session.rewound): later events are kept but no longer count.
	KindRewindSession Kind = "rewind_session"
	// KindDistill asks the runtime to distill (compact) the history.
	KindDistill Kind = "distill"
	// KindPivotStrategy asks the runtime to change its approach
	// (Params.Strategy) after a loop or a spent budget.
	KindPivotStrategy Kind = "pivot_strategy"
	// KindPauseSession pauses the session (session.paused).
	KindPauseSession Kind = "pause_session"
	// KindAbortSession gives up on the session: it is paused for good with
	// the diagnostics (what failed, what was tried, the configuration).
	KindAbortSession Kind = "abort_session"
)

// Kinds lists every command kind.
var Kinds = []Kind{
	KindRepairOrphans, KindAbandonTurn, KindRetryTurn, KindSwitchProvider, KindResumeSession,
	KindForkSession, KindRewindSession, KindDistill, KindPivotStrategy, KindPauseSession, KindAbortSession,
}

// Valid reports whether k is one of Kinds.
func (k Kind) Valid() bool {
	for _, x := range Kinds {
		if k == x {
			return true
		}
	}
	return false
}

// NeedsRuntime reports whether the command's effect goes through the agent
// runtime (a control request) rather than only into the log.
func (k Kind) NeedsRuntime() bool {
	switch k {
	case KindRetryTurn, KindSwitchProvider, KindDistill, KindPivotStrategy:
		return true
	}
	return false
}

// Params are the kind-specific arguments of a command. Each kind reads only
// its own: ToolUseIDs (repair_orphans: empty means every orphan), ToSeq
// (rewind_session), AtSeq and ForkSession (fork_session), Provider and
// ToProvider (switch_provider, retry_turn), Strategy (pivot_strategy),
// ErrorClass (the class of the error that led to the command, see
// Classify). Chain, when set, is the strategy chain the worker runs instead
// of the default for the error's class (see ParseChain: "retry*2",
// "pause"); Recommendation is what a person should do if the chain ends in
// a pause ("switch provider").
type Params struct {
	Chain          []string `json:"chain,omitempty"`
	Recommendation string   `json:"recommendation,omitempty"`
	ToolUseIDs     []string `json:"tool_use_ids,omitempty"`
	ToSeq          uint64   `json:"to_seq,omitzero"`
	AtSeq          uint64   `json:"at_seq,omitzero"`
	ForkSession    string   `json:"fork_session,omitempty"`
	Provider       string   `json:"provider,omitempty"`
	ToProvider     string   `json:"to_provider,omitempty"`
	Strategy       string   `json:"strategy,omitempty"`
	ErrorClass     Class    `json:"error_class,omitempty"`
	Reissue        string   `json:"reissue,omitempty"`
	// Cause is why the reconciler issued an abandon_turn
	// (events.AbandonDeadline or events.AbandonEngineRestart); the worker
	// writes it into the turn.abandoned (a command issued by anyone else
	// is events.AbandonManual).
	Cause string `json:"cause,omitempty"`
}

// Diagnostics travel with abort_session: what failed, what was tried, and
// the configuration that applied (values masked before they are stored).
type Diagnostics struct {
	Failed string            `json:"failed"`
	Tried  []string          `json:"tried,omitempty"`
	Config map[string]string `json:"config,omitempty"`
}

// Command is one recovery command, the body of a message on
// agent.cmd.<tenant>.<session> (JSON). ID is deterministic (see CommandID):
// the same detection issues the same id, so JetStream's duplicate window
// drops a repeat and workers skip a command whose outcome the session's log
// already holds. Evidence lists the stream sequences of the events that
// led to it. Issue is 1 for the first issue of a detection and counts
// re-issues (a re-issue is a new command with a new id). Turn names the
// turn concerned, when one is. DecidedSeq, set by the reconciler, is the
// sequence of the latest runtime event of the session it had folded when
// it decided (projections.Session.LastRuntimeSeq): where the decision was
// taken, which `engine whatif` compares; 0 on commands issued by hand.
type Command struct {
	ID          string       `json:"id"`
	Kind        Kind         `json:"kind"`
	Tenant      string       `json:"tenant"`
	Session     string       `json:"session"`
	Turn        string       `json:"turn,omitempty"`
	Reason      string       `json:"reason"`
	Evidence    []uint64     `json:"evidence,omitempty"`
	Issue       int          `json:"issue"`
	IssuedAt    time.Time    `json:"issued_at"`
	IssuedBy    string       `json:"issued_by,omitempty"`
	DecidedSeq  uint64       `json:"decided_seq,omitzero"`
	Params      Params       `json:"params,omitzero"`
	Diagnostics *Diagnostics `json:"diagnostics,omitempty"`
}

// CommandID is the deterministic id of a command: "<kind>-" and 20 hex
// digits of the SHA-256 of kind, tenant, session, turn, the evidence
// sequences and the issue number. The same inputs always give the same id.
func CommandID(kind Kind, tenant, session, turn string, evidence []uint64, issue int) string {
	var b strings.Builder
	b.WriteString(string(kind))
	for _, s := range []string{tenant, session, turn} {
		b.WriteByte(0)
		b.WriteString(s)
	}
	for _, e := range evidence {
		b.WriteByte(0)
		b.WriteString(strconv.FormatUint(e, 10))
	}
	b.WriteByte(0)
	b.WriteString(strconv.Itoa(issue))
	sum := sha256.Sum256([]byte(b.String()))
	return string(kind) + "-" + hex.EncodeToString(sum[:10])
}

// NewCommand returns a command of kind for the session with its id set from
// its inputs (issue 1). Set Params or Diagnostics before publishing; they
// do not change the id.
func NewCommand(kind Kind, tenant, session, turn, reason string, evidence []uint64) Command {
	return Command{
		ID:       CommandID(kind, tenant, session, turn, evidence, 1),
		Kind:     kind,
		Tenant:   tenant,
		Session:  session,
		Turn:     turn,
		Reason:   reason,
		Evidence: evidence,
		Issue:    1,
		IssuedAt: time.Now().UTC(),
	}
}

// IssuerReconciler is Command.IssuedBy on the commands the engine's
// reconciler issues; commands issued by hand name their issuer otherwise.
const IssuerReconciler = "reconciler"

// Reissued returns c issued again: the same kind, session, turn, evidence
// and parameters, the next issue number, and the id that issue number
// gives (CommandID), so that issuing it twice stores it once. issuedBy and
// at are who issues it and when.
func Reissued(c Command, issuedBy string, at time.Time) Command {
	n := c
	n.Issue = c.Issue + 1
	n.ID = CommandID(c.Kind, c.Tenant, c.Session, c.Turn, c.Evidence, n.Issue)
	n.IssuedAt, n.IssuedBy = at.UTC(), issuedBy
	if !strings.HasSuffix(n.Reason, reissueNote) {
		n.Reason += reissueNote
	}
	return n
}

const reissueNote = " (issued again: its runtime is back)"

// Masked returns c with its free text masked (events.MaskString): the
// reason, the recommendation and strategy, and the diagnostics (what
// failed, what was tried, the configuration's values). Issue stores only
// masked commands, whoever issues them (a person's --reason may quote a
// secret). Ids, kinds and tokens are not text and are kept.
func (c Command) Masked() Command {
	c.Reason = events.MaskString(c.Reason)
	c.Params.Recommendation = events.MaskString(c.Params.Recommendation)
	c.Params.Strategy = events.MaskString(c.Params.Strategy)
	if d := c.Diagnostics; d != nil {
		m := &Diagnostics{Failed: events.MaskString(d.Failed)}
		for _, t := range d.Tried {
			m.Tried = append(m.Tried, events.MaskString(t))
		}
		if d.Config != nil {
			m.Config = make(map[string]string, len(d.Config))
			for k, v := range d.Config {
				// The key says whether the value is a secret
				// (GITHUB_TOKEN=...), so it is masked as a pair.
				pair := events.MaskString(k + "=" + v)
				if rest, ok := strings.CutPrefix(pair, k+"="); ok {
					m.Config[k] = rest
				} else {
					m.Config[k] = events.MaskString(v)
				}
			}
		}
		c.Diagnostics = m
	}
	return c
}

// Validate reports every rule the command breaks, joined; each error wraps
// ErrInvalidCommand.
func (c *Command) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: %s", ErrInvalidCommand, fmt.Sprintf(format, a...)))
	}
	if c.ID == "" {
		bad("id: required")
	}
	if !c.Kind.Valid() {
		bad("kind: %q is not a command kind", c.Kind)
	}
	if !events.ValidToken(c.Tenant) {
		bad("tenant: %q is not a subject token", c.Tenant)
	}
	if !events.ValidToken(c.Session) {
		bad("session: %q is not a subject token", c.Session)
	}
	if c.Reason == "" {
		bad("reason: required")
	} else if len(c.Reason) > MaxReasonBytes {
		bad("reason: %d bytes, the limit is %d", len(c.Reason), MaxReasonBytes)
	}
	if c.Issue < 1 {
		bad("issue: must be at least 1, got %d", c.Issue)
	}
	switch c.Kind {
	case KindAbandonTurn, KindRetryTurn:
		if c.Turn == "" {
			bad("turn: required for %s", c.Kind)
		}
	case KindRewindSession:
		if c.Params.ToSeq == 0 {
			bad("params.to_seq: required for rewind_session")
		}
	case KindForkSession:
		if c.Params.AtSeq == 0 {
			bad("params.at_seq: required for fork_session")
		}
		if !events.ValidToken(c.Params.ForkSession) {
			bad("params.fork_session: %q is not a subject token", c.Params.ForkSession)
		}
	case KindAbortSession:
		if c.Diagnostics == nil || c.Diagnostics.Failed == "" {
			bad("diagnostics.failed: required for abort_session")
		}
	}
	return errors.Join(errs...)
}
