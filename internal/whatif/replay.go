package whatif

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/reconciler"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// source is the source of the events a replay folds for its own
// decisions' effects: not runtime events, like the worker's.
const source = "urn:turnstone:whatif"

// maxRounds bounds the decisions taken at one instant: one decision's
// effect may call for another (an abandoned turn declares its pending
// tool_use orphans, which are then repaired).
const maxRounds = 8

// owners says which recorded command wrote each recorded event that is
// not a runtime event: by the command id its payload names, or by the
// deterministic id the worker gives each effect of a command.
type owners struct {
	byCmd   map[string]recovery.Command
	byEvent map[string]string // event id -> command id
}

// effectKeys are the keys of the worker's log effects (worker.event):
// their event ids are events.DeterministicID(issued at, "<command
// id>/<session>/<key>").
var effectKeys = func() []string {
	keys := []string{"abandon", "resume", "repair", "abort", "rewind"}
	for i := 1; i < 16; i++ {
		keys = append(keys, "repair/"+strconv.Itoa(i))
	}
	return keys
}()

func effectOwners(cmds []recovery.Command) owners {
	o := owners{byCmd: map[string]recovery.Command{}, byEvent: map[string]string{}}
	for _, c := range cmds {
		o.byCmd[c.ID] = c
		at := c.IssuedAt
		if at.IsZero() {
			at = time.Unix(0, 0)
		}
		for _, k := range effectKeys {
			o.byEvent[events.DeterministicID(at, c.ID+"/"+c.Session+"/"+k)] = c.ID
		}
	}
	return o
}

// commandOf returns the id of the command that wrote ev, or "".
func (o owners) commandOf(ev events.Event) string {
	if p, err := ev.Payload(); err == nil {
		switch p := p.(type) {
		case *events.RecoveryAttempted:
			return p.CommandID
		case *events.RecoveryCompleted:
			return p.CommandID
		case *events.RecoveryParked:
			return p.CommandID
		case *events.SessionPaused:
			if p.CommandID != "" {
				return p.CommandID
			}
		}
	}
	return o.byEvent[ev.ID]
}

// simulated are the command kinds whose log effects the replay writes
// itself when it decides them (effect).
var simulated = []recovery.Kind{recovery.KindAbandonTurn, recovery.KindRepairOrphans, recovery.KindPauseSession, recovery.KindResumeSession}

// replay folds evs through the replay path and decides under policy at
// each event and at each deadline between, returning the decisions in
// the order they were taken.
func replay(ctx context.Context, cfg Config, policy *reconciler.Policy, ref Ref, evs []events.Event, act map[string][]time.Time, own owners) []Decision {
	p := policy.For(ref.Tenant)
	rp := projections.NewReplayer(cfg.Log)
	decided := map[string]bool{}
	reqSeen := map[uint64]time.Time{}
	var out []Decision
	var now, lastRuntime time.Time

	input := func(now time.Time) reconciler.Input {
		s := rp.State()
		live := reconciler.Live(s, now, p, false)
		if cfg.AssumeLive {
			since := lastRuntime
			if s.LastAbandonStored.After(since) {
				since = s.LastAbandonStored
			}
			live = !lastRuntime.IsZero() && now.Sub(since) <= reconciler.LiveFor(s, p)
		}
		in := reconciler.Input{State: s, Now: now, Policy: p, Live: live,
			RequestSeenAt: func(seq uint64) time.Time { return reqSeen[seq] }}
		for i := range s.Turns {
			t := &s.Turns[i]
			if t.Status != projections.TurnInFlight {
				continue
			}
			latest := latestBefore(act[toolKey(ref, "")], now)
			for _, tc := range s.PendingToolCalls(t.ID) {
				if a := latestBefore(act[toolKey(ref, tc.ToolUseID)], now); a.After(latest) {
					latest = a
				}
			}
			if !latest.IsZero() {
				if in.Activity == nil {
					in.Activity = map[string]time.Time{}
				}
				in.Activity[t.ID] = latest
			}
		}
		return in
	}
	fold := func(ev events.Event) {
		if cfg.Clock == ClockEvent {
			ev.Stored = ev.Time
		}
		// A refold's read error leaves the state as Apply left it; the
		// replay goes on, as the projector would.
		_, _, _ = rp.Apply(ctx, ev)
	}
	judge := func(now time.Time) {
		for range maxRounds {
			var fresh []reconciler.Action
			for _, a := range reconciler.Decide(input(now)) {
				if !decided[a.Key] {
					decided[a.Key] = true
					fresh = append(fresh, a)
				}
			}
			if len(fresh) == 0 {
				return
			}
			for _, a := range fresh {
				out = append(out, decisionOf(a, rp.State(), now))
				for _, ev := range effect(a, rp.State(), now) {
					fold(ev)
				}
			}
		}
	}
	// deadlines decides at each time a deadline falls due before until
	// (zero: with no event to come, as long as the session is live).
	deadlines := func(until time.Time) {
		for range 10000 {
			in := input(now)
			due := reconciler.NextDue(in)
			if due.IsZero() || (!until.IsZero() && !due.Before(until)) {
				return
			}
			if until.IsZero() && !input(due).Live {
				return
			}
			now = due
			judge(now)
		}
	}

	for _, ev := range evs {
		runtime := projections.RuntimeEvent(ev)
		if !runtime && !foldRecorded(ev, own, decided) {
			continue
		}
		t := at(cfg.Clock, ev)
		if !now.IsZero() && t.After(now) {
			deadlines(t)
		}
		if t.After(now) {
			now = t
		}
		if runtime {
			if t.After(lastRuntime) {
				lastRuntime = t
			}
			if ev.Type == events.TypeDistillationRequested {
				reqSeen[ev.Seq] = now
			}
		}
		fold(ev)
		judge(now)
	}
	deadlines(time.Time{})
	return out
}

// foldRecorded reports whether a recorded event that is not a runtime
// event is folded into the replay: the effects of a command issued by a
// person, and of a command of the reconciler that the replay decided too
// (its outcome, which only the runtime could give), unless the replay
// writes that kind's effects itself; not the reconciler's own answers and
// snapshots, which the replay decides or does not need.
func foldRecorded(ev events.Event, own owners, decided map[string]bool) bool {
	id := own.commandOf(ev)
	if id == "" {
		switch {
		case ev.Source == "urn:turnstone:reconciler", ev.Type == events.TypeSnapshotTaken:
			return false
		}
		return true
	}
	c, ok := own.byCmd[id]
	if !ok {
		return false // a command no longer stored: its decision cannot be told
	}
	if c.IssuedBy != recovery.IssuerReconciler {
		return true
	}
	if slices.Contains(simulated, c.Kind) {
		return false
	}
	first := recovery.CommandID(c.Kind, c.Tenant, c.Session, c.Turn, c.Evidence, 1)
	return decided[first]
}

// decisionOf describes action a, taken at now on state s.
func decisionOf(a reconciler.Action, s *projections.Session, now time.Time) Decision {
	d := Decision{Seq: s.LastRuntimeSeq, Time: now.UTC(), ID: a.Key, Reason: a.Why}
	if a.Command != nil {
		d.Kind, d.Turn, d.ID, d.Reason = string(a.Command.Kind), a.Command.Turn, a.Command.ID, a.Command.Reason
	} else if len(a.Events) > 0 {
		d.Kind, d.ID, d.Turn = KindSkipped, a.Events[0].ID, a.Events[0].Turn
	}
	return d
}

// effect returns the events the worker (or the reconciler, for an
// answer) writes for a, as the replay folds them: an abandoned turn, the
// synthetic results of a repair, a pause, a resume, the answer's own
// events. A command that needs the runtime writes nothing here.
func effect(a reconciler.Action, s *projections.Session, now time.Time) []events.Event {
	if a.Command == nil {
		out := slices.Clone(a.Events)
		for i := range out {
			out[i].Seq, out[i].Stored = 0, now
		}
		return out
	}
	c := a.Command
	mk := func(turn string, p events.Payload) []events.Event {
		ev, err := events.NewAt(now, events.DeterministicID(now, c.ID+"/whatif"), c.Tenant, c.Session, turn, p)
		if err != nil {
			return nil
		}
		ev.Source, ev.Stored = source, now
		return []events.Event{ev}
	}
	switch c.Kind {
	case recovery.KindAbandonTurn:
		t := s.Turn(c.Turn)
		if t == nil || t.Ended() {
			return nil
		}
		in := t.Stage
		if in == "" {
			in = t.LastStage.Next()
		}
		return mk(c.Turn, &events.TurnAbandoned{LastStageCompleted: t.LastStage, Stage: in, Reason: c.Reason})
	case recovery.KindRepairOrphans:
		content := json.RawMessage(`"tool result lost (replayed by engine whatif)"`)
		var blocks []events.ContentBlock
		for _, id := range c.Params.ToolUseIDs {
			blocks = append(blocks, events.ContentBlock{Type: events.BlockToolResult, ToolUseID: id, IsError: true, Content: content})
		}
		if len(blocks) == 0 {
			return nil
		}
		return mk("", &events.MessageAppended{Role: events.RoleUser, Content: blocks, Synthetic: true})
	case recovery.KindPauseSession:
		if s.Paused {
			return nil
		}
		return mk("", &events.SessionPaused{Reason: c.Reason, Cause: events.CauseLoop, CommandID: c.ID, Kind: string(c.Kind)})
	case recovery.KindResumeSession:
		if !s.Paused {
			return nil
		}
		return mk("", &events.SessionResumed{Reason: c.Reason})
	}
	return nil
}

// recordedDecisions are the decisions the log records for the session:
// the first issue of each command the reconciler issued (at its
// DecidedSeq, or, for a command from before it was recorded, the latest
// runtime event stored by the time it was issued), and the answers it
// appended to the session. resume_session is left out: it follows a
// runtime's presence, which the log does not record and the replay does
// not decide.
func recordedDecisions(evs []events.Event, cmds []recovery.Command) []Decision {
	type point struct {
		seq    uint64
		stored time.Time
	}
	var runtime []point
	for _, ev := range evs {
		if projections.RuntimeEvent(ev) {
			runtime = append(runtime, point{ev.Seq, ev.Stored})
		}
	}
	before := func(seq uint64) uint64 { // the latest runtime event before seq
		i := sort.Search(len(runtime), func(i int) bool { return runtime[i].seq >= seq })
		if i == 0 {
			return 0
		}
		return runtime[i-1].seq
	}
	storedBy := func(t time.Time) uint64 {
		var last uint64
		for _, p := range runtime {
			if p.stored.After(t) {
				break
			}
			last = p.seq
		}
		return last
	}
	var out []Decision
	for _, c := range cmds {
		if c.IssuedBy != recovery.IssuerReconciler || c.Issue > 1 || c.Kind == recovery.KindResumeSession {
			continue
		}
		seq := c.DecidedSeq
		if seq == 0 {
			seq = storedBy(c.IssuedAt)
		}
		out = append(out, Decision{Kind: string(c.Kind), Seq: seq, Time: c.IssuedAt.UTC(), Turn: c.Turn, ID: c.ID, Reason: c.Reason})
	}
	for _, ev := range evs {
		if ev.Source == "urn:turnstone:reconciler" && ev.Type == events.TypeDistillationSkipped {
			reason := ""
			if p, err := ev.Payload(); err == nil {
				if sk, ok := p.(*events.DistillationSkipped); ok {
					reason = "distillation skipped: " + sk.Reason
				}
			}
			out = append(out, Decision{Kind: KindSkipped, Seq: before(ev.Seq), Time: ev.Stored.UTC(), Turn: ev.Turn, ID: ev.ID, Reason: reason})
		}
	}
	return out
}

// within reports whether a and b are at most slack apart.
func within(a, b time.Time, slack time.Duration) bool {
	d := a.Sub(b)
	return d <= slack && -d <= slack
}

// compare returns the decisions of tried, each marked against base (the
// same when taken at the same seq, within slack of the same time), with
// base's that tried does not take (Removed), ordered by sequence, kind
// and id; and the first divergence, or nil.
func compare(tried, base []Decision, slack time.Duration) ([]Decision, *Divergence) {
	byID := map[string]Decision{}
	for _, d := range base {
		if _, ok := byID[d.ID]; !ok {
			byID[d.ID] = d
		}
	}
	seen := map[string]bool{}
	out := make([]Decision, 0, len(tried)+len(base))
	for _, d := range tried {
		if seen[d.ID] {
			continue
		}
		seen[d.ID] = true
		b, ok := byID[d.ID]
		switch {
		case !ok:
			d.Change = Added
		case b.Seq == d.Seq && within(d.Time, b.Time, slack):
			d.Change = Same
		default:
			d.Change, d.BaselineSeq, d.BaselineTime = Changed, b.Seq, b.Time
		}
		out = append(out, d)
	}
	for _, b := range base {
		if !seen[b.ID] {
			seen[b.ID] = true
			b.Change = Removed
			out = append(out, b)
		}
	}
	slices.SortStableFunc(out, func(a, b Decision) int {
		return cmp.Or(cmp.Compare(a.Seq, b.Seq), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.ID, b.ID))
	})
	var first *Divergence
	for _, d := range out {
		if d.Change == Same {
			continue
		}
		seq := d.Seq
		if d.Change == Changed {
			seq = min(seq, d.BaselineSeq)
		}
		if first == nil || seq < first.Seq {
			first = &Divergence{Seq: seq, Kind: d.Kind, Change: d.Change, ID: d.ID}
		}
	}
	return out, first
}

// String says what a divergence is, for people.
func (d *Divergence) String() string {
	if d == nil {
		return "none"
	}
	return fmt.Sprintf("seq %d: %s %s (%s)", d.Seq, d.Kind, d.Change, d.ID)
}
