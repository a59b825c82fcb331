// Package whatif replays recorded sessions through the reconciler's own
// Decide under a policy, and compares the decisions it would take with
// what was recorded, or with another policy's (`engine whatif`,
// docs/cli.md).
//
// The replay folds the session's recorded runtime events
// (projections.RuntimeEvent) through projections.Replayer, the one path
// from events to state, and runs reconciler.Decide, the live reconciler's
// pure decision function, at each event and at each time between two
// events at which a deadline falls due (reconciler.NextDue). Time comes
// from the events: their own times (ClockEvent) or the times the log
// stored them (ClockStored); nothing reads the wall clock, so two runs
// give the same result. The log effects of its own decisions are folded
// as the worker writes them (an abandoned turn ends, a repaired orphan is
// answered, a paused session pauses), so what follows is decided on the
// state they leave; the outcomes of chains that need the runtime (a
// retry, a distillation) are folded from the log when the replay decided
// the same command, since only the runtime could say how they went.
// Presence is not recorded: the replay assumes no runtime present, so it
// never decides resume_session. A subagent session's activity counts as a
// sign of life of its parent's turn, as ActivityBucket makes it count
// live, from the subagent's own recorded events.
//
// Nothing is written or published: the package only reads the log, the
// recovery stream and the fleet index.
package whatif

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/reconciler"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// Clock is where a replay's times come from.
type Clock string

// The clocks.
const (
	// ClockEvent: each event's own time (the transcript's, the
	// publisher's): how the session ran.
	ClockEvent Clock = "event"
	// ClockStored: when the log stored each event, the clock the live
	// reconciler reads.
	ClockStored Clock = "stored"
)

// The changes of a Decision against its baseline.
const (
	// Same: the baseline took it too, at the same sequence and time
	// (within RecordedSlack of what was recorded).
	Same = "same"
	// Added: the baseline did not take it.
	Added = "added"
	// Removed: the baseline took it; the policy tried does not.
	Removed = "removed"
	// Changed: both take it, at different sequences (BaselineSeq) or
	// times (BaselineTime).
	Changed = "changed"
)

// RecordedSlack is how far apart in time a decision of the replay and
// the recorded one may be and still be the same, at the same seq: the
// engine decides deadlines on a one-second tick and issues through a
// queue, so what it issued comes a little after the time the replay
// computes. A policy baseline is compared exactly.
const RecordedSlack = 2 * time.Second

// KindSkipped is a Decision's Kind for the reconciler's answer to a
// distillation request it defers (a distillation.skipped event), which is
// not a command.
const KindSkipped = "distillation_skipped"

// Decision is one decision of the reconciler in a replay: its Kind (the
// command kind, or KindSkipped), the Seq of the latest runtime event
// folded when it was taken (projections.Session.LastRuntimeSeq) and its
// Time on the replay's clock, the Turn it names, its ID (the command id,
// or the event id of an answer) and Reason. Change, BaselineSeq and
// BaselineTime say how it compares with the baseline (the baseline's
// seq and time of a changed decision).
type Decision struct {
	Kind         string    `json:"kind"`
	Seq          uint64    `json:"seq"`
	Time         time.Time `json:"time,omitzero"`
	Turn         string    `json:"turn,omitempty"`
	ID           string    `json:"id"`
	Reason       string    `json:"reason"`
	Change       string    `json:"change"`
	BaselineSeq  uint64    `json:"baseline_seq,omitzero"`
	BaselineTime time.Time `json:"baseline_time,omitzero"`
}

// Divergence is where a replay's decisions first differ from the
// baseline's: the lowest sequence of a decision added, removed or
// changed (for a changed one, the lower of its two sequences).
type Divergence struct {
	Seq    uint64 `json:"seq"`
	Kind   string `json:"kind"`
	Change string `json:"change"`
	ID     string `json:"id"`
}

// Result is one session's replay: the decisions the policy tried takes,
// each compared with the baseline, and the baseline's that it does not
// take (Removed), ordered by sequence; FirstDivergence is nil when they
// agree.
type Result struct {
	Tenant          string      `json:"tenant"`
	Session         string      `json:"session"`
	Events          int         `json:"events"`
	Decisions       []Decision  `json:"decisions"`
	FirstDivergence *Divergence `json:"first_divergence"`
}

// Ref names one session.
type Ref struct{ Tenant, Session string }

// Config is one whatif run.
type Config struct {
	// Log is the event log read.
	Log *events.Log
	// Policy is the policy tried (nil: reconciler.DefaultPolicy).
	Policy *reconciler.Policy
	// Baseline is the policy to compare with; nil compares with what was
	// recorded: the commands the reconciler issued (AGENT_RECOVERY) and
	// the answers it wrote in the session.
	Baseline *reconciler.Policy
	// AssumeLive treats history sessions as live: judged while their
	// latest runtime event is within the live horizon of the decision's
	// time, as a session the reconciler follows.
	AssumeLive bool
	// Clock is where times come from (default ClockStored).
	Clock Clock
	// ScanChildren finds each session's subagent sessions from the
	// session.started of every session of its tenant (exact, one read per
	// session: what a run over a whole tenant reads anyway) instead of
	// from the fleet index (one read per tenant, as fresh as the index).
	ScanChildren bool
}

// Run replays each session of refs (sorted by tenant, then session) and
// returns their Results in that order. Errors: the log's, the recovery
// stream's (wrapped), and events.ErrSessionNotFound for a session with
// no event.
func Run(ctx context.Context, cfg Config, refs []Ref) ([]Result, error) {
	if cfg.Policy == nil {
		cfg.Policy = reconciler.DefaultPolicy()
	}
	if cfg.Clock == "" {
		cfg.Clock = ClockStored
	}
	if cfg.Clock != ClockEvent && cfg.Clock != ClockStored {
		return nil, fmt.Errorf("whatif: clock %q: want event or stored", cfg.Clock)
	}
	refs = slices.Clone(refs)
	slices.SortFunc(refs, func(a, b Ref) int { return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Session, b.Session)) })
	refs = slices.Compact(refs)
	kids := map[string]map[string][]string{} // tenant -> parent -> children
	out := make([]Result, 0, len(refs))
	for _, ref := range refs {
		if _, ok := kids[ref.Tenant]; !ok {
			find := children
			if cfg.ScanChildren {
				find = scanChildren
			}
			k, err := find(ctx, cfg.Log, ref.Tenant)
			if err != nil {
				return nil, err
			}
			kids[ref.Tenant] = k
		}
		res, err := runSession(ctx, cfg, ref, kids[ref.Tenant][ref.Session])
		if err != nil {
			return nil, err
		}
		out = append(out, res)
	}
	return out, nil
}

// children maps each session of tenant to its subagent sessions, from
// the fleet index (nothing without one: the replay then sees no
// subagent's activity).
func children(ctx context.Context, log *events.Log, tenant string) (map[string][]string, error) {
	rows, err := projections.ReadIndex(ctx, log.JetStream(), projections.IndexFilter{Tenant: tenant})
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return map[string][]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("whatif: read the fleet index: %w", err)
	}
	out := map[string][]string{}
	for _, r := range rows {
		if r.ParentSession != "" {
			out[r.ParentSession] = append(out[r.ParentSession], r.Session)
		}
	}
	for _, c := range out {
		sort.Strings(c)
	}
	return out, nil
}

// scanChildren maps each session of tenant to its subagent sessions,
// from the first event of each session of the tenant (its
// session.started).
func scanChildren(ctx context.Context, log *events.Log, tenant string) (map[string][]string, error) {
	refs, err := log.Sessions(ctx, tenant)
	if err != nil {
		return nil, fmt.Errorf("whatif: list %s: %w", tenant, err)
	}
	out := map[string][]string{}
	errFirst := errors.New("first event read")
	for _, r := range refs {
		err := log.ReadSession(ctx, r.Tenant, r.Session, events.ReadOptions{}, func(ev events.Event) error {
			if p, err := ev.Payload(); err == nil {
				if st, ok := p.(*events.SessionStarted); ok && st.ParentSession != "" {
					out[st.ParentSession] = append(out[st.ParentSession], r.Session)
				}
			}
			return errFirst
		})
		if err != nil && !errors.Is(err, errFirst) && !errors.Is(err, events.ErrSessionNotFound) {
			return nil, fmt.Errorf("whatif: %s/%s: %w", r.Tenant, r.Session, err)
		}
	}
	for _, c := range out {
		sort.Strings(c)
	}
	return out, nil
}

// runSession replays one session under the policy tried and compares it
// with the baseline.
func runSession(ctx context.Context, cfg Config, ref Ref, kids []string) (Result, error) {
	evs, err := readSession(ctx, cfg.Log, ref)
	if err != nil {
		return Result{}, err
	}
	act, err := childActivity(ctx, cfg, ref, kids)
	if err != nil {
		return Result{}, err
	}
	recorded, err := recovery.SessionCommands(ctx, cfg.Log.JetStream(), ref.Tenant, ref.Session)
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return Result{}, fmt.Errorf("whatif: %w", err)
	}
	owners := effectOwners(recorded)
	tried := replay(ctx, cfg, cfg.Policy, ref, evs, act, owners)
	var base []Decision
	if cfg.Baseline != nil {
		base = replay(ctx, cfg, cfg.Baseline, ref, evs, act, owners)
	} else {
		base = recordedDecisions(evs, recorded)
	}
	res := Result{Tenant: ref.Tenant, Session: ref.Session, Events: len(evs)}
	slack := time.Duration(0)
	if cfg.Baseline == nil {
		slack = RecordedSlack
	}
	res.Decisions, res.FirstDivergence = compare(tried, base, slack)
	return res, nil
}

// readSession reads every event of a session.
func readSession(ctx context.Context, log *events.Log, ref Ref) ([]events.Event, error) {
	var evs []events.Event
	err := log.ReadSession(ctx, ref.Tenant, ref.Session, events.ReadOptions{}, func(ev events.Event) error {
		evs = append(evs, ev)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("whatif: %w", err)
	}
	return evs, nil
}

// at is an event's time on the clock.
func at(c Clock, ev events.Event) time.Time {
	if c == ClockEvent || ev.Stored.IsZero() {
		return ev.Time
	}
	return ev.Stored
}

// childActivity returns, for each tool key of the parent
// (reconciler.ActivityKey's last token), the sorted times of its
// subagents' runtime events.
func childActivity(ctx context.Context, cfg Config, parent Ref, kids []string) (map[string][]time.Time, error) {
	out := map[string][]time.Time{}
	for _, kid := range kids {
		var key string
		err := cfg.Log.ReadSession(ctx, parent.Tenant, kid, events.ReadOptions{}, func(ev events.Event) error {
			if p, err := ev.Payload(); err == nil {
				if st, ok := p.(*events.SessionStarted); ok && key == "" {
					key = toolKey(parent, projections.IDKey(st.ParentToolUseID))
				}
			}
			if key != "" && projections.RuntimeEvent(ev) {
				out[key] = append(out[key], at(cfg.Clock, ev))
			}
			return nil
		})
		if err != nil && !errors.Is(err, events.ErrSessionNotFound) {
			return nil, fmt.Errorf("whatif: subagent %s: %w", kid, err)
		}
	}
	for k := range out {
		slices.SortFunc(out[k], time.Time.Compare)
	}
	return out, nil
}

// latestBefore returns the latest of ts at or before now (ts sorted).
func latestBefore(ts []time.Time, now time.Time) time.Time {
	i := sort.Search(len(ts), func(i int) bool { return ts[i].After(now) })
	if i == 0 {
		return time.Time{}
	}
	return ts[i-1]
}

// toolKey is the last token of reconciler.ActivityKey: the key of a tool
// call of parent in the subagent activity.
func toolKey(parent Ref, id string) string {
	return reconciler.ActivityKey(parent.Tenant, parent.Session, id)[len(parent.Tenant)+len(parent.Session)+2:]
}
