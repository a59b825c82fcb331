package forensics

import (
	"context"
	"errors"
	"fmt"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
)

// Diff is what changed in a session's projected state between two points
// (the states as of two stream sequences): the Nova26 "snapshot diff" of
// `engine diff` and the web view. Counts come from the states' totals and
// are exact; the lists are drawn from what the later state keeps (its
// bounded windows, docs/limits.md), so a long stretch can list fewer
// entries than it counts: Truncated says so.
type Diff struct {
	Tenant  string `json:"tenant"`
	Session string `json:"session"`
	// From and To are the two points.
	From Point `json:"from"`
	To   Point `json:"to"`
	// StatusChanged is set when From.Status differs from To.Status.
	StatusChanged bool `json:"status_changed"`

	// TurnsStarted and TurnsEnded are the turns that started, and that
	// ended (completed, failed or abandoned), after From.
	TurnsStarted []TurnChange `json:"turns_started"`
	TurnsEnded   []TurnChange `json:"turns_ended"`
	// ToolCallsStarted are the tool_use blocks added after From;
	// ToolCallsAnswered the tool calls a tool_result answered (or a
	// repair repaired) after From.
	ToolCallsStarted  []ToolCallChange `json:"tool_calls_started"`
	ToolCallsAnswered []ToolCallChange `json:"tool_calls_answered"`
	// MessagesAdded counts the API messages added after From (records
	// merged into the message From already held are not new messages);
	// Messages are those the later state keeps.
	MessagesAdded int              `json:"messages_added"`
	Messages      []MessageChange  `json:"messages"`
	HistoryReset  bool             `json:"history_reset"`
	ErrorsAdded   int              `json:"errors_added"`
	Distillations []DistillChange  `json:"distillations"`
	Commands      []CommandChange  `json:"commands"`
	Orphans       []OrphanChange   `json:"orphans"`
	Raised        []ViolationEntry `json:"violations_raised"`
	Resolved      []ViolationEntry `json:"violations_resolved"`
	// RaisedCount and ResolvedCount are the exact counts of violations
	// raised and resolved after From.
	RaisedCount   int `json:"violations_raised_count"`
	ResolvedCount int `json:"violations_resolved_count"`
	// Truncated is set when a count exceeds its list: the later state no
	// longer keeps every entry.
	Truncated bool `json:"truncated"`
}

// Point is a session's state at one end of a Diff, in counts.
type Point struct {
	// Seq is the sequence asked for (0: the session's start for From, its
	// end for To); LastSeq the last event folded at or before it.
	Seq     uint64 `json:"seq"`
	LastSeq uint64 `json:"last_seq"`
	Events  int    `json:"events"`
	Status  string `json:"status"`
	// Turns started, in flight; messages and tool calls ever; the open
	// orphans of the current history; violations ever raised and
	// resolved; errors recorded.
	Turns      int  `json:"turns"`
	InFlight   int  `json:"in_flight"`
	Messages   int  `json:"messages"`
	ToolCalls  int  `json:"tool_calls"`
	Orphans    int  `json:"orphans"`
	Violations int  `json:"violations"`
	Resolved   int  `json:"resolved"`
	Errors     int  `json:"errors"`
	Paused     bool `json:"paused"`
}

// TurnChange is a turn that started or ended between the two points.
type TurnChange struct {
	ID    string `json:"id"`
	Index int    `json:"index"`
	// Before is the turn's status at From ("" when it had not started),
	// After at To.
	Before   string `json:"before"`
	After    string `json:"after"`
	Reason   string `json:"reason,omitempty"`
	Stage    string `json:"stage,omitempty"`
	Seq      uint64 `json:"seq"`
	EndedSeq uint64 `json:"ended_seq,omitempty"`
}

// ToolCallChange is a tool call added or answered between the two points.
type ToolCallChange struct {
	ToolUseID string `json:"tool_use_id"`
	Name      string `json:"name"`
	Before    string `json:"before"`
	After     string `json:"after"`
	UseSeq    uint64 `json:"use_seq"`
	ResultSeq uint64 `json:"result_seq,omitempty"`
	IsError   bool   `json:"is_error,omitempty"`
}

// MessageChange is a message added after From.
type MessageChange struct {
	Index     int      `json:"index"`
	Role      string   `json:"role"`
	Seqs      []uint64 `json:"seqs"`
	Synthetic bool     `json:"synthetic,omitempty"`
	Preview   string   `json:"preview,omitempty"`
}

// DistillChange is a distillation with a step (requested, started,
// completed, skipped) after From.
type DistillChange struct {
	Step         string `json:"step"`
	Seq          uint64 `json:"seq"`
	FromSeq      uint64 `json:"from_seq,omitempty"`
	ToSeq        uint64 `json:"to_seq,omitempty"`
	TokensBefore int64  `json:"tokens_before,omitempty"`
	TokensAfter  int64  `json:"tokens_after,omitempty"`
	Clean        bool   `json:"clean"`
	Skipped      string `json:"skipped,omitempty"`
}

// CommandChange is a recovery command with a recovery.* event after From.
type CommandChange struct {
	ID       string `json:"id"`
	Kind     string `json:"kind"`
	Before   string `json:"before"`
	After    string `json:"after"`
	Attempts int    `json:"attempts"`
	Strategy string `json:"strategy,omitempty"`
}

// OrphanChange is an orphan declared or repaired after From.
type OrphanChange struct {
	ToolUseID string `json:"tool_use_id"`
	Name      string `json:"name"`
	// Change is "declared", "repaired", or "declared_and_repaired".
	Change      string `json:"change"`
	DeclaredSeq uint64 `json:"declared_seq"`
	RepairedSeq uint64 `json:"repaired_seq,omitempty"`
}

// ViolationEntry is a violation raised or resolved after From.
type ViolationEntry struct {
	Seq         uint64 `json:"seq"`
	Rule        string `json:"rule"`
	Detail      string `json:"detail"`
	ResolvedSeq uint64 `json:"resolved_seq,omitempty"`
}

// pointOf reads a state's counts.
func pointOf(s *projections.Session, seq uint64) Point {
	return Point{
		Seq: seq, LastSeq: s.LastSeq, Events: s.Events, Status: string(s.Status()),
		Turns: s.Totals.Turns, InFlight: len(s.InFlight), Messages: s.Totals.Messages, ToolCalls: s.Totals.ToolCalls,
		Orphans: len(s.OrphanedToolUseIDs()), Violations: s.Totals.Violations, Resolved: s.Totals.Resolved,
		Errors: s.Errors.Total, Paused: s.Paused,
	}
}

// Compare returns what changed from a to b, two states of one session with
// b folded further than a (b.LastSeq >= a.LastSeq). fromSeq and toSeq are
// the sequences asked for, recorded in the points. An entry counts as
// after a when the sequence of its change lies past a.LastSeq.
func Compare(a, b *projections.Session, fromSeq, toSeq uint64) Diff {
	after := a.LastSeq
	d := Diff{Tenant: b.Tenant, Session: b.Session, From: pointOf(a, fromSeq), To: pointOf(b, toSeq)}
	d.StatusChanged = d.From.Status != d.To.Status
	turnBefore := func(id string) string {
		if t := a.Turn(id); t != nil {
			return string(t.Status)
		}
		return ""
	}
	for _, t := range b.Turns {
		stage := string(t.FailedStage)
		if stage == "" {
			stage = string(t.LastStage)
		}
		c := TurnChange{ID: t.ID, Index: t.Index, Before: turnBefore(t.ID), After: string(t.Status), Reason: t.Reason, Stage: stage, Seq: t.StartedSeq, EndedSeq: t.EndedSeq}
		if t.StartedSeq > after {
			d.TurnsStarted = append(d.TurnsStarted, c)
		}
		if t.Ended() && t.EndedSeq > after {
			d.TurnsEnded = append(d.TurnsEnded, c)
		}
	}
	toolBefore := func(id string) string {
		if tc := a.ToolCall(id); tc != nil {
			return string(tc.Status)
		}
		return ""
	}
	for _, tc := range b.ToolCalls {
		c := ToolCallChange{ToolUseID: tc.ToolUseID, Name: tc.Name, Before: toolBefore(tc.ToolUseID), After: string(tc.Status), UseSeq: tc.UseSeq, ResultSeq: tc.ResultSeq, IsError: tc.IsError}
		if tc.UseSeq > after {
			d.ToolCallsStarted = append(d.ToolCallsStarted, c)
		}
		if tc.ResultSeq > after && (tc.Status == projections.ToolAnswered || tc.Status == projections.ToolRepaired) {
			d.ToolCallsAnswered = append(d.ToolCallsAnswered, c)
		}
	}
	d.MessagesAdded = b.Totals.Messages - a.Totals.Messages
	for _, m := range b.Messages {
		if m.Index <= a.Totals.Messages {
			continue
		}
		c := MessageChange{Index: m.Index, Role: string(m.Role), Seqs: m.Seqs, Synthetic: m.Synthetic}
		for _, bl := range m.Blocks {
			if bl.Text != "" {
				c.Preview = bl.Text
				break
			}
		}
		d.Messages = append(d.Messages, c)
	}
	d.HistoryReset = b.HistoryStart.Seq > after
	d.ErrorsAdded = b.Errors.Total - a.Errors.Total
	for _, dd := range b.Distillations {
		for _, st := range []struct {
			step string
			seq  uint64
		}{{"requested", dd.RequestedSeq}, {"skipped", dd.SkippedSeq}, {"started", dd.StartedSeq}, {"completed", dd.CompletedSeq}} {
			if st.seq > after {
				d.Distillations = append(d.Distillations, DistillChange{Step: st.step, Seq: st.seq, FromSeq: dd.FromSeq, ToSeq: dd.ToSeq,
					TokensBefore: dd.TokensBefore, TokensAfter: dd.TokensAfter, Clean: dd.Clean, Skipped: dd.Skipped})
			}
		}
	}
	cmdState := func(c *projections.CommandRecord) string {
		switch {
		case c == nil:
			return ""
		case c.Parked:
			return "parked"
		case c.Outcome != "":
			return string(c.Outcome)
		}
		return "running"
	}
	for i := range b.Commands {
		c := &b.Commands[i]
		if c.LastSeq > after {
			d.Commands = append(d.Commands, CommandChange{ID: c.ID, Kind: c.Kind, Before: cmdState(a.Command(c.ID)), After: cmdState(c), Attempts: c.Attempts, Strategy: c.Strategy})
		}
	}
	for _, o := range b.Orphans {
		declared, repaired := o.DeclaredSeq > after, o.Repaired && o.RepairedSeq > after
		change := ""
		switch {
		case declared && repaired:
			change = "declared_and_repaired"
		case declared:
			change = "declared"
		case repaired:
			change = "repaired"
		default:
			continue
		}
		d.Orphans = append(d.Orphans, OrphanChange{ToolUseID: o.ToolUseID, Name: o.Name, Change: change, DeclaredSeq: o.DeclaredSeq, RepairedSeq: o.RepairedSeq})
	}
	d.RaisedCount = b.Totals.Violations - a.Totals.Violations
	d.ResolvedCount = b.Totals.Resolved - a.Totals.Resolved
	for _, v := range b.Violations {
		e := ViolationEntry{Seq: v.Seq, Rule: string(v.Rule), Detail: v.Detail, ResolvedSeq: v.ResolvedSeq}
		if v.Seq > after {
			d.Raised = append(d.Raised, e)
		}
		if v.Resolved && v.ResolvedSeq > after {
			d.Resolved = append(d.Resolved, e)
		}
	}
	d.Truncated = len(d.Raised) < d.RaisedCount || len(d.Resolved) < d.ResolvedCount || len(d.Messages) < d.MessagesAdded ||
		len(d.TurnsStarted) < d.To.Turns-d.From.Turns
	return d
}

// ErrBadRange is returned by DiffLog when from is past to.
var ErrBadRange = errors.New("--from is after --to")

// DiffLog folds a session from its first event and returns Compare of its
// state as of from (0: before its first event) and as of to (0: its last
// event). It reads the log once, holding no event; a rewind is refolded
// from the log (as `engine replay` does). Errors: ErrBadRange; the log's
// (events.ErrSessionNotFound, events.ErrLogUnavailable), wrapped.
func DiffLog(ctx context.Context, log projections.SessionReader, tenant, session string, from, to uint64) (Diff, error) {
	if to != 0 && from > to {
		return Diff{}, fmt.Errorf("diff %s/%s: %w (%d > %d)", tenant, session, ErrBadRange, from, to)
	}
	a, b, err := FoldTwo(ctx, log, tenant, session, from, to)
	if err != nil {
		return Diff{}, err
	}
	return Compare(a, b, from, to), nil
}

// FoldTwo folds a session once and returns its states as of from and as
// of to (0: the end), as DiffLog reads them.
func FoldTwo(ctx context.Context, log projections.SessionReader, tenant, session string, from, to uint64) (a, b *projections.Session, err error) {
	r := projections.NewReplayer(log)
	s := r.State()
	var snap *projections.Session
	take := func() {
		if snap == nil {
			snap = s.Clone()
			if snap.Tenant == "" {
				snap.Tenant, snap.Session = tenant, session
			}
		}
	}
	// The state as of from is the one before the first event after it, so
	// this walks the Replayer itself rather than projections.Replay, whose
	// steps show each state after its event.
	err = log.ReadSession(ctx, tenant, session, events.ReadOptions{UntilSeq: to}, func(ev events.Event) error {
		if ev.Seq > from {
			take()
		}
		_, _, err := r.Apply(ctx, ev)
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("diff %s/%s: %w", tenant, session, err)
	}
	take()
	if s.Tenant == "" {
		s.Tenant, s.Session = tenant, session
	}
	return snap, s, nil
}
