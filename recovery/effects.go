package recovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
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
func (w *Worker) logEffect(ctx context.Context, cmd Command, state *projections.Session) (events.Outcome, int, error) {
	evs, outcome, detail := w.plan(cmd, state)
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
	if _, err := w.log.Append(ctx, evs, events.ExpectLastSeq(state.LastSeq)); err != nil {
		return "", 0, fmt.Errorf("%s %s: %w", cmd.Kind, cmd.ID, err)
	}
	w.l.Info().Str("command", cmd.ID).Str("session", cmd.Tenant+"/"+cmd.Session).Str("outcome", string(outcome)).Msg(detail)
	return outcome, attempt, nil
}

// plan returns the events that carry out a log-only command on state, the
// outcome, and a detail for people. A command whose effect is already in
// the state (the orphans are repaired, the session is paused) plans no
// event and is recovered: executing a command twice changes nothing.
func (w *Worker) plan(cmd Command, state *projections.Session) ([]events.Event, events.Outcome, string) {
	switch cmd.Kind {
	case KindRepairOrphans:
		return w.planRepair(cmd, state)
	case KindPauseSession:
		if state.Paused {
			return nil, events.OutcomeRecovered, "already paused"
		}
		return []events.Event{w.event(cmd, cmd.Session, "", "pause", &events.SessionPaused{Reason: cmd.Reason})},
			events.OutcomeRecovered, "paused: " + cmd.Reason
	case KindForkSession:
		return nil, events.OutcomeFailed, "fork_session runs through forkEffect"
	case KindRewindSession:
		to := cmd.Params.ToSeq
		if to < state.FirstSeq || to > state.LastSeq {
			return nil, events.OutcomeFailed, fmt.Sprintf("cannot rewind to seq %d: the session spans %d..%d", to, state.FirstSeq, state.LastSeq)
		}
		return []events.Event{w.event(cmd, cmd.Session, "", "rewind", &events.SessionRewound{ToSeq: to, Reason: cmd.Reason, CommandID: cmd.ID})},
			events.OutcomeRecovered, fmt.Sprintf("rewound to seq %d", to)
	}
	return nil, events.OutcomeFailed, fmt.Sprintf("%s is not a log-only command", cmd.Kind)
}

func (w *Worker) planRepair(cmd Command, state *projections.Session) ([]events.Event, events.Outcome, string) {
	want := map[string]bool{}
	for _, id := range cmd.Params.ToolUseIDs {
		want[id] = true
	}
	var blocks []events.ContentBlock
	var ids []string
	for _, id := range state.OrphanedToolUseIDs() {
		if len(want) > 0 && !want[id] {
			continue
		}
		text := fmt.Sprintf("%s (%s; repaired by command %s)", LostResultText, cmd.Reason, cmd.ID)
		content, _ := json.Marshal(text)
		blocks = append(blocks, events.ContentBlock{Type: events.BlockToolResult, ToolUseID: id, IsError: true, Content: content})
		ids = append(ids, id)
	}
	if len(blocks) == 0 {
		return nil, events.OutcomeRecovered, "no orphan left to repair"
	}
	msg := w.event(cmd, cmd.Session, "", "repair", &events.MessageAppended{Role: events.RoleUser, Content: blocks, Synthetic: true})
	return []events.Event{msg}, events.OutcomeRecovered, "repaired orphaned tool_use " + strings.Join(ids, ", ")
}

// forkEffect starts Params.ForkSession from the session's events up to
// Params.AtSeq: a session.started naming its lineage, then a copy of every
// event of the prefix (new ids derived from the originals, so a repeat
// stores nothing new); then session.forked, the attempt and the outcome in
// the source session.
func (w *Worker) forkEffect(ctx context.Context, cmd Command, state *projections.Session) (events.Outcome, int, error) {
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
		if _, err := w.log.Append(ctx, evs, events.ExpectLastSeq(state.LastSeq)); err != nil {
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
		if _, err := w.log.Append(ctx, copies[i:min(i+256, len(copies))]); err != nil {
			return "", 0, fmt.Errorf("fork %s: copy prefix: %w", cmd.ID, err)
		}
	}
	forked := w.event(cmd, cmd.Session, "", "forked", &events.SessionForked{ForkSession: target, AtSeq: at, CommandID: cmd.ID})
	return finish(events.OutcomeRecovered, fmt.Sprintf("forked %d events up to seq %d into %s", len(copies)-1, at, target), forked)
}

var errStop = errors.New("stop reading")
