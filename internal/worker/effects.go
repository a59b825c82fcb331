package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/go-json-experiment/json"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// LostResultText is the content of the tool_result repair_orphans
// synthesizes for an orphaned tool_use (is_error true), followed by the
// command's reason and id. It tells the model the result is lost and the
// tool may or may not have run.
const LostResultText = "Turnstone: the result of this tool call was lost: the process stopped between the tool_use and its tool_result, so the tool may or may not have run. Check its effects before running it again."

// logEffect executes a command whose effect lives in the log alone: it
// plans the events from the session's state and appends them, with the
// attempt and the outcome, conditionally on the session not having moved
// (events.ErrConflict sends the caller back to read it again).
func (w *Worker) logEffect(ctx context.Context, cmd recovery.Command, state *projections.Session) (events.Outcome, int, error) {
	evs, outcome, detail, err := w.plan(ctx, cmd, state)
	if err != nil {
		return "", 0, fmt.Errorf("%s %s: %w", cmd.Kind, cmd.ID, err)
	}
	attempt := 1
	if rec := state.Command(cmd.ID); rec != nil {
		attempt = rec.Attempts + 1
	}
	result := AttemptOK
	if outcome == events.OutcomeFailed {
		result = AttemptFailed
	}
	evs = append(evs,
		w.attempted(cmd, attempt, string(cmd.Kind), result, "", nil, 0),
		w.completed(cmd, outcome, string(cmd.Kind), attempt, detail))
	if _, err := w.append(ctx, evs, events.ExpectLastSeq(state.LastSeq)); err != nil {
		return "", 0, fmt.Errorf("%s %s: %w", cmd.Kind, cmd.ID, err)
	}
	w.l.Info().Str("command", cmd.ID).Str("session", cmd.Tenant+"/"+cmd.Session).Str("outcome", string(outcome)).Msg(detail)
	return outcome, attempt, nil
}

// plan returns the events that carry out a log-only command on state, the
// outcome, and a detail for people. A command whose effect is already in
// the state (the orphans are repaired, the session is paused) plans no
// event and is recovered: executing a command twice changes nothing. Its
// error is the log's (reading what the state keeps only by reference), or
// a refusal (events.ErrTooLarge: see Refused) when no event can carry the
// effect.
func (w *Worker) plan(ctx context.Context, cmd recovery.Command, state *projections.Session) ([]events.Event, events.Outcome, string, error) {
	if cmd.Kind == recovery.KindRepairOrphans {
		return w.planRepair(ctx, cmd, state)
	}
	evs, outcome, detail := w.planOther(cmd, state)
	return evs, outcome, detail, nil
}

func (w *Worker) planOther(cmd recovery.Command, state *projections.Session) ([]events.Event, events.Outcome, string) {
	switch cmd.Kind {
	case recovery.KindPauseSession:
		if state.Paused {
			return nil, events.OutcomeRecovered, "already paused"
		}
		cause := events.CauseManual
		if cmd.IssuedBy == recovery.IssuerReconciler {
			cause = events.CauseLoop
		}
		return []events.Event{w.event(cmd, cmd.Session, "", "pause", &events.SessionPaused{Reason: cmd.Reason, Cause: cause, CommandID: cmd.ID, Kind: string(cmd.Kind)})},
			events.OutcomeRecovered, "paused: " + cmd.Reason
	case recovery.KindForkSession:
		return nil, events.OutcomeFailed, "fork_session runs through forkEffect"
	case recovery.KindRewindSession:
		to := cmd.Params.ToSeq
		if to < state.FirstSeq || to > state.LastSeq {
			return nil, events.OutcomeFailed, fmt.Sprintf("cannot rewind to seq %d: the session spans %d..%d", to, state.FirstSeq, state.LastSeq)
		}
		return []events.Event{w.event(cmd, cmd.Session, "", "rewind", &events.SessionRewound{ToSeq: to, Reason: cmd.Reason, CommandID: cmd.ID})},
			events.OutcomeRecovered, fmt.Sprintf("rewound to seq %d", to)
	}
	return nil, events.OutcomeFailed, fmt.Sprintf("%s is not a log-only command", cmd.Kind)
}

// planRepair plans a repair_orphans: a synthesized, is_error tool_result
// for each orphan the command names (every orphan when it names none)
// that the state still holds unrepaired, in synthetic user records of at
// most repairRecordBytes each (consecutive user records are one API
// message, so several records repair like one). The state keeps ids as
// keys (projections.IDKey); an id too long for one is read back whole from
// the assistant record that holds it (Orphan.Seq). An orphan whose result
// alone would be over the record limit is left as it is and named in the
// detail (outcome degraded); when no orphan can be repaired that way, the
// command is refused (events.ErrTooLarge).
func (w *Worker) planRepair(ctx context.Context, cmd recovery.Command, state *projections.Session) ([]events.Event, events.Outcome, string, error) {
	want := map[string]bool{}
	for _, id := range cmd.Params.ToolUseIDs {
		want[projections.IDKey(id)] = true
	}
	var orphans []projections.Orphan
	for _, key := range state.OrphanedToolUseIDs() {
		if len(want) > 0 && !want[key] {
			continue
		}
		for i := len(state.Orphans) - 1; i >= 0; i-- {
			if o := state.Orphans[i]; o.ToolUseID == key {
				orphans = append(orphans, o)
				break
			}
		}
	}
	if len(orphans) == 0 {
		return nil, events.OutcomeRecovered, "no orphan left to repair", nil
	}
	full, err := w.fullToolUseIDs(ctx, state, orphans)
	if err != nil {
		return nil, "", "", err
	}
	text := fmt.Sprintf("%s (%s; repaired by command %s)", LostResultText, cmd.Reason, cmd.ID)
	content, err := json.Marshal(text)
	if err != nil {
		return nil, "", "", fmt.Errorf("repair %s: %w", cmd.ID, err)
	}
	limit := w.repairRecordBytes()
	var (
		records  [][]events.ContentBlock
		size     int
		repaired []string
		left     []string
		why      string
	)
	for _, o := range orphans {
		id, ok := full[o.ToolUseID]
		if !ok {
			left = append(left, o.ToolUseID)
			why = fmt.Sprintf("the record at seq %d does not hold tool_use %s", o.Seq, o.ToolUseID)
			continue
		}
		b := events.ContentBlock{Type: events.BlockToolResult, ToolUseID: id, IsError: true, Content: content}
		enc, err := json.Marshal(b)
		if err != nil {
			return nil, "", "", fmt.Errorf("repair %s: tool_result for %s: %w", cmd.ID, o.ToolUseID, err)
		}
		if len(enc) > limit {
			left = append(left, o.ToolUseID)
			why = fmt.Sprintf("the tool_result for %s would be %d bytes, over the %d an event may hold", o.ToolUseID, len(enc), limit)
			continue
		}
		if len(records) == 0 || size+len(enc)+1 > limit {
			records, size = append(records, nil), 0
		}
		records[len(records)-1] = append(records[len(records)-1], b)
		size += len(enc) + 1
		repaired = append(repaired, o.ToolUseID)
	}
	if len(repaired) == 0 {
		return nil, "", "", fmt.Errorf("%w: no orphan can be repaired: %s", events.ErrTooLarge, why)
	}
	evs := make([]events.Event, len(records))
	for i, blocks := range records {
		key := "repair"
		if i > 0 {
			key = fmt.Sprintf("repair/%d", i)
		}
		evs[i] = w.event(cmd, cmd.Session, "", key, &events.MessageAppended{Role: events.RoleUser, Content: blocks, Synthetic: true})
	}
	detail := fmt.Sprintf("repaired %d orphaned tool_use", len(repaired))
	if len(records) > 1 {
		detail += fmt.Sprintf(" in %d records", len(records))
	}
	detail += ": " + nameSome(repaired)
	if len(left) > 0 {
		return evs, events.OutcomeDegraded, detail + fmt.Sprintf("; %d not repaired (%s): %s", len(left), nameSome(left), why), nil
	}
	return evs, events.OutcomeRecovered, detail, nil
}

// repairRecordBytes is how many bytes of tool_result blocks one synthetic
// repair record holds at most: the log's event limit less room for the
// envelope and the masking of secrets.
func (w *Worker) repairRecordBytes() int {
	max := w.log.Config().MaxEventBytes
	if max <= 0 {
		max = events.DefaultMaxEventBytes
	}
	return max - max/16
}

// fullToolUseIDs returns the full tool_use id of each orphan, by its key:
// the key itself, or, for a digest key (projections.IsDigestKey), the id
// read back from the assistant record at the orphan's Seq. An id the
// record does not hold is missing from the map.
func (w *Worker) fullToolUseIDs(ctx context.Context, state *projections.Session, orphans []projections.Orphan) (map[string]string, error) {
	full := map[string]string{}
	var seqs []uint64
	need := map[uint64]bool{}
	for _, o := range orphans {
		if !projections.IsDigestKey(o.ToolUseID) {
			full[o.ToolUseID] = o.ToolUseID
			continue
		}
		if !need[o.Seq] {
			need[o.Seq] = true
			seqs = append(seqs, o.Seq)
		}
	}
	slices.Sort(seqs)
	for _, seq := range seqs {
		err := w.log.ReadSession(ctx, state.Tenant, state.Session, events.ReadOptions{FromSeq: seq, UntilSeq: seq}, func(ev events.Event) error {
			if ev.Seq != seq || ev.Err != nil {
				return nil
			}
			p, err := ev.Payload()
			if err != nil {
				return nil
			}
			if m, ok := p.(*events.MessageAppended); ok {
				for _, b := range m.Content {
					if b.Type == events.BlockToolUse {
						full[projections.IDKey(b.ID)] = b.ID
					}
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("read the tool_use ids at seq %d: %w", seq, err)
		}
	}
	return full, nil
}

// nameSome names at most 5 of ids (keys, so each is short), and how many
// more there are.
func nameSome(ids []string) string {
	const most = 5
	if len(ids) <= most {
		return strings.Join(ids, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(ids[:most], ", "), len(ids)-most)
}

// forkEffect starts Params.ForkSession from the session's events up to
// Params.AtSeq: a session.started naming its lineage, then a copy of every
// event of the prefix (new ids derived from the originals, so a repeat
// stores nothing new); then session.forked, the attempt and the outcome in
// the source session.
func (w *Worker) forkEffect(ctx context.Context, cmd recovery.Command, state *projections.Session) (events.Outcome, int, error) {
	at, target := cmd.Params.AtSeq, cmd.Params.ForkSession
	attempt := 1
	if rec := state.Command(cmd.ID); rec != nil {
		attempt = rec.Attempts + 1
	}
	finish := func(outcome events.Outcome, detail string, extra ...events.Event) (events.Outcome, int, error) {
		result := AttemptOK
		if outcome == events.OutcomeFailed {
			result = AttemptFailed
		}
		evs := append(extra,
			w.attempted(cmd, attempt, string(cmd.Kind), result, "", nil, 0),
			w.completed(cmd, outcome, string(cmd.Kind), attempt, detail))
		if _, err := w.append(ctx, evs, events.ExpectLastSeq(state.LastSeq)); err != nil {
			return "", 0, fmt.Errorf("fork %s: %w", cmd.ID, err)
		}
		return outcome, attempt, nil
	}
	if at < state.FirstSeq || at > state.LastSeq {
		return finish(events.OutcomeFailed, fmt.Sprintf("cannot fork at seq %d: the session spans %d..%d", at, state.FirstSeq, state.LastSeq))
	}
	if target == cmd.Session {
		return finish(events.OutcomeFailed, "a session cannot be forked into itself")
	}
	var prefix []events.Event
	err := w.log.ReadSession(ctx, cmd.Tenant, cmd.Session, events.ReadOptions{UntilSeq: at}, func(ev events.Event) error {
		prefix = append(prefix, ev)
		return nil
	})
	if err != nil {
		return "", 0, fmt.Errorf("fork %s: read prefix: %w", cmd.ID, err)
	}
	start := events.SessionStarted{}
	copies := make([]events.Event, 0, len(prefix)+1)
	for _, ev := range prefix {
		// Rewound events no longer count, and snapshot and rewind events
		// name the source's sequences: none of them belongs in the fork.
		if ev.Err != nil || ev.Type == events.TypeSnapshotTaken || ev.Type == events.TypeSessionRewound || state.IsRewound(ev.Seq) {
			continue
		}
		if ev.Type == events.TypeSessionStarted {
			if p, err := ev.Payload(); err == nil {
				start = *p.(*events.SessionStarted)
			}
			continue
		}
		c := ev
		c.ID = events.DeterministicID(ev.Time, cmd.ID+"/"+target+"/"+ev.ID)
		c.Session, c.Seq, c.Subject = target, 0, ""
		copies = append(copies, c)
	}
	start.ForkedFrom, start.ForkSeq = cmd.Session, at
	first := w.event(cmd, target, "", "fork/start", &start)
	if len(prefix) > 0 {
		first.Time = prefix[0].Time
	}
	copies = append([]events.Event{first}, copies...)

	// A fork session that already exists must be this fork (a repeat).
	var head *events.Event
	err = w.log.ReadSession(ctx, cmd.Tenant, target, events.ReadOptions{UntilSeq: 0}, func(ev events.Event) error {
		if head == nil {
			e := ev
			head = &e
		}
		return errStop
	})
	if err != nil && !errors.Is(err, errStop) && !errors.Is(err, events.ErrSessionNotFound) {
		return "", 0, fmt.Errorf("fork %s: %w", cmd.ID, err)
	}
	if head != nil && head.ID != first.ID {
		return finish(events.OutcomeFailed, fmt.Sprintf("session %s already exists and is not this fork", target))
	}
	for i := 0; i < len(copies); i += 256 {
		if _, err := w.append(ctx, copies[i:min(i+256, len(copies))]); err != nil {
			return "", 0, fmt.Errorf("fork %s: copy prefix: %w", cmd.ID, err)
		}
	}
	forked := w.event(cmd, cmd.Session, "", "forked", &events.SessionForked{ForkSession: target, AtSeq: at, CommandID: cmd.ID})
	return finish(events.OutcomeRecovered, fmt.Sprintf("forked %d events up to seq %d into %s", len(copies)-1, at, target), forked)
}

var errStop = errors.New("stop reading")
