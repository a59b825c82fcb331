package projections

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/turnstone-dev/turnstone/events"
)

// Version is the version of the Session JSON schema. A snapshot of another
// version is ignored and the session is replayed from its first event.
// Bump it whenever the fold's rules or the state's shape change.
//
// Version 2: recovery commands, rewinds, forks, breakers; repaired
// orphans and resolved violations.
//
// Version 3: invariant 4's counts (the output streak and message hashes,
// turns' failed attempts, flaky-suspected tool runs) and violation times.
//
// Version 4: the log's own clock (FirstStored, LastStored, LastLiveStored,
// Turn.SeenAt), History, the pause's cause and command, and clock_skew.
//
// Version 5: every list and every string bounded (docs/limits.md): ids
// and names as keys (IDKey), previews clipped by runes and JSON bytes,
// the message history a window (KeepMessages, MessagesDropped) of
// messages of at most MaxMessageBlocks blocks and MaxMessageSeqs
// sequences, at most MaxToolUsesPerMessage tool_use blocks tracked per
// message, unknown types capped (UnknownOther), HistoryBroken, the
// failed, abandoned and parked totals, Block.Seq, and the
// too_many_turns_in_flight rule.
//
// Version 6: the stage a turn is in (Turn.Stage), from turn.abandoned's
// stage; typed recovery outcomes.
//
// Version 7: invariant 4 calibrated on real sessions: the implementation
// budget counts failed attempts per step (Steps, ToolCall.Step,
// Turn.FailedAttempts), and the output streak compares the input each
// output answers (user messages' Hash, OutputStreak.Input).
//
// Version 8: the snapshot's stored form (EncodeSnapshot) changed on
// the perf branch while main took Version 6 and 7 for the fold's
// calibration: a snapshot is now the state's JSON written by
// github.com/go-json-experiment/json and compressed with S2 (numbers
// that are zero are left out with omitzero; <, > and & written as they
// are). A version 7 snapshot is refused and the session refolded.
//
// Version 9: an assistant message remembers its response's message_id
// (Message.MessageID), and a message.appended of the same response that
// comes after the tool results of its first pieces continues it
// (importers record a response cut by the end of a file in pieces); the
// output streak keeps the streak before the latest message (Before).
//
// Version 10: signs of life (issue 15): Turn.ActiveAt, the store time of
// the latest event of a turn, which its deadline counts from; a tool
// call's declared timeout and store time (ToolCall.TimeoutMS, UsedAt);
// LastRuntimeSeq, LastAbandonStored; and PausedAt.
//
// Version 11: Totals.ToolErrors (tool calls whose result said is_error)
// and Turn.AbandonCause (turn.abandoned's cause), which a version 10
// state lacks: its sessions are refolded once.
//
// Version 12: the loop and budget hashes (OutputHash, chainInput's,
// InputHash, StepKey) are XXH64 where they were SHA-256, so a version 11
// state's hashes would never equal new ones: its sessions are refolded
// once.
const Version = 12

// MaxClockSkew is how far an event's own time may lie ahead of its store
// time (Event.Stored, JetStream's clock) before the fold flags it with a
// clock_skew violation. Times in the past are not flagged: a publisher may
// send late (a buffer flushed after an outage) and an import is history.
const MaxClockSkew = 5 * time.Minute

// Retention bounds. The state keeps what the invariants need and a
// bounded window of the rest, so that a snapshot stays under
// MaxSnapshotBytes whatever the session's length, its ids' sizes or its
// texts (docs/limits.md lists every bound and what it costs). Totals
// counts every entry ever made; the full value of anything clipped or
// dropped stays in the log, at the sequence the state names beside it.
const (
	// KeepTurns is how many ended turns the state keeps; turns in flight
	// are always kept (at most MaxInFlightTurns).
	KeepTurns = 32
	// MaxInFlightTurns is how many turns the state tracks in flight at
	// once. A turn.started while that many are in flight breaks
	// too_many_turns_in_flight and is not tracked (its later events are
	// turn_unknown): a runtime runs one turn per session, two while a
	// second message arrives mid-turn.
	MaxInFlightTurns = 16
	// KeepToolCalls is how many tool calls of the current history the
	// state keeps besides those of the latest assistant message (which it
	// keeps all of, up to MaxToolUsesPerMessage, so that every result is
	// paired, every orphan declared and every repair matched). A result
	// for a tool call no longer kept breaks tool_result_without_tool_use
	// (reason not_held), as the API rules have it: it can only answer a
	// tool_use of an earlier message, or none.
	KeepToolCalls = 96
	// MaxToolUsesPerMessage is how many tool_use blocks of one assistant
	// message the state tracks; the rest are counted
	// (Message.UntrackedToolUses) and not judged: never orphans, and a
	// result the state cannot pair while the previous assistant message
	// has untracked ones is recorded (reason untracked_tool_use) without
	// a violation. The model API does not write that many in one message.
	MaxToolUsesPerMessage = 128
	// KeepAnomalies is how many entries each of Violations,
	// UnmatchedResults, InvalidEvents and Flaky keeps. Status, Anomalous
	// and the distillation check count from Totals and HistoryBroken, not
	// from the lists, so they stay exact.
	KeepAnomalies = 48
	// KeepOrphans is how many orphans Orphans keeps: at least
	// MaxToolUsesPerMessage, so that every orphan of the latest assistant
	// message (the only ones a repair can answer) is kept.
	KeepOrphans = MaxToolUsesPerMessage
	// KeepDistillations is how many distillations the state keeps (the
	// latest is kept while open).
	KeepDistillations = 8
	// KeepCommands is how many recovery commands with an outcome or a park
	// the state keeps; MaxOpenCommands is how many more without one it
	// keeps (the oldest go first past that).
	KeepCommands    = 16
	MaxOpenCommands = 8
	// KeepRewinds is how many entries each of Rewinds and Forks keeps.
	KeepRewinds = 8
	// MaxRewoundRanges is how many disjoint ranges Rewound holds. A
	// session.rewound that would add one more is an invalid event: the
	// state needs every range to refold, so none is dropped.
	MaxRewoundRanges = 64
	// KeepMessages is how many messages of the current history the state
	// keeps: the latest (the last assistant message among them, which the
	// rules of invariant 2 read); MessagesDropped counts the others.
	KeepMessages = 6
	// MaxMessageBlocks is how many block digests a message keeps (its
	// first ones; Message.BlocksDropped counts the rest), and
	// MaxMessageSeqs how many record sequences (its first ones;
	// Message.SeqsDropped counts the rest).
	MaxMessageBlocks = 6
	MaxMessageSeqs   = 16
	// KeepOutputSeqs is how many sequences OutputStreak.Seqs keeps: those
	// of the run's first messages.
	KeepOutputSeqs = 10
	// MaxSteps is how many failing steps of turns in flight Steps keeps:
	// past it, the one with the fewest failures in a row is forgotten (a
	// step that counts toward a budget has more).
	MaxSteps = 16
	// MaxUnknownTypes is how many unknown event types UnknownTypes names;
	// events of further types are counted in UnknownOther.
	MaxUnknownTypes = 32
	// MaxLabels is how many labels of session.started the state keeps
	// (the first in key order; LabelsDropped counts the rest).
	MaxLabels = 16
	// MaxBreakers is how many providers' breakers the state keeps (the
	// most recently changed).
	MaxBreakers = 8
	// PreviewRunes is the length, in runes, of the text previews of blocks
	// and prompts (and at most 4 × PreviewRunes bytes of JSON; see clip).
	PreviewRunes = 200
	// DetailRunes and DetailBytes bound every reason, detail and error
	// message the state keeps in a list entry (violations, turns,
	// commands, distillations, rewinds, breakers, invalid events, label
	// values): runes, and bytes of JSON.
	DetailRunes = 200
	DetailBytes = 256
	// MaxKeyBytes bounds every id, name and other key the state keeps
	// (IDKey): a longer one is kept as a digest, its full value in the
	// log.
	MaxKeyBytes = 64
)

// Session is the projected state of one session: what its events say, and
// what they break. The zero value is an empty session, ready for Apply.
// It marshals to JSON (snake_case) for snapshots and `engine inspect
// --json`; a Session unmarshalled from that JSON folds on exactly like the
// one it was marshalled from. Treat its fields as read-only: change it only
// with Apply.
//
// Sequences (…Seq) are JetStream stream sequences of the session's events;
// times come from the events' time attribute.
type Session struct {
	// Version is the schema version of this state (the package's Version).
	Version int `json:"version"`

	// Tenant and Session identify the session (subject tokens).
	Tenant  string `json:"tenant"`
	Session string `json:"session"`
	// Kind is "main", "subagent" or "compaction" (from session.started;
	// empty until it is seen).
	Kind string `json:"kind,omitempty"`
	// ParentSession and ParentToolUseID link a subagent's session to the
	// session and the tool call that started it.
	ParentSession   string `json:"parent_session,omitempty"`
	ParentToolUseID string `json:"parent_tool_use_id,omitempty"`
	// Runtime names the agent runtime ("claude-code 2.1.38").
	Runtime string `json:"runtime,omitempty"`
	// Provider is the model provider session.started named.
	Provider string `json:"provider,omitempty"`
	// Model is the model of the latest assistant message (or, before any,
	// the one session.started named).
	Model string `json:"model,omitempty"`
	// Labels are session.started's free-form metadata (masked values):
	// the first MaxLabels in key order, keys as IDKey, values clipped
	// (DetailRunes); LabelsDropped counts the others.
	Labels        map[string]string `json:"labels,omitempty"`
	LabelsDropped int               `json:"labels_dropped,omitzero"`
	// ForkedFrom and ForkSeq are a fork's lineage, from the first
	// session.started that names them: the session (same tenant) it was
	// forked from, and the last stream sequence of that session's events
	// it copies (a sequence of the source session's log, not of this one).
	ForkedFrom string `json:"forked_from,omitempty"`
	ForkSeq    uint64 `json:"fork_seq,omitzero"`

	// Events is how many events were folded, invalid, unknown and rewound
	// ones included.
	Events int `json:"events"`
	// FirstSeq and LastSeq are the stream sequences of the first and the
	// last event folded (0 when the events carry none).
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
	// FirstTime and LastTime are the earliest and the latest event time
	// folded. Event times need not rise with sequences (an import, a
	// snapshot.taken stamped with the time of the event it covers), so
	// they are a minimum and a maximum, not the first and last events'.
	FirstTime time.Time `json:"first_time,omitzero"`
	LastTime  time.Time `json:"last_time,omitzero"`
	// FirstStored and LastStored are the earliest and the latest store
	// time (JetStream's clock, Event.Stored) of the events folded: the
	// trusted times, unlike the publishers' FirstTime and LastTime. Zero
	// when the events carried none (a fold of events not read from the
	// log).
	FirstStored time.Time `json:"first_stored,omitzero"`
	LastStored  time.Time `json:"last_stored,omitzero"`
	// LastLiveStored is the latest store time of an event folded while
	// the session was not History: what the live horizon counts from.
	LastLiveStored time.Time `json:"last_live_stored,omitzero"`
	// LastRuntimeSeq is the sequence of the latest runtime event folded
	// (RuntimeEvent: the runtime at work, not Turnstone's own
	// bookkeeping), history or not: where a decision of the reconciler is
	// taken (recovery.Command.DecidedSeq) and what `engine whatif`
	// compares.
	LastRuntimeSeq uint64 `json:"last_runtime_seq,omitzero"`
	// LastAbandonStored is when the log stored the latest turn.abandoned
	// folded (zero without one): the reconciler stays with a session
	// whose turn it abandoned long enough to repair what the abandon
	// declared orphaned.
	LastAbandonStored time.Time `json:"last_abandon_stored,omitzero"`
	// History is set when the latest session.started said the session is
	// history (recorded after the fact, such as an imported transcript):
	// the reconciler never acts on it.
	History bool `json:"history,omitzero"`
	// Totals counts every entry ever made in the lists the state keeps
	// only the latest entries of.
	Totals Totals `json:"totals"`

	// Turns are the session's turns in start order: every in-flight turn
	// and the latest KeepTurns ended ones.
	Turns []Turn `json:"turns,omitempty"`
	// InFlight lists the ids of the turns in flight, in start order.
	InFlight []string `json:"in_flight,omitempty"`

	// Messages is the current message history in the model API's view:
	// consecutive records of one role merged into one message; the latest
	// KeepMessages of it. MessagesDropped counts the older messages of the
	// current history the state no longer keeps (HistoryLen is both). A
	// distillation.completed empties it.
	Messages        []Message `json:"messages,omitempty"`
	MessagesDropped int       `json:"messages_dropped,omitzero"`
	// HistoryStart marks where the current history began.
	HistoryStart HistoryMark `json:"history_start"`
	// Pending lists the tool_use ids of the latest assistant message that
	// still await their tool_result (the tool is running), in block order.
	Pending []string `json:"pending,omitempty"`
	// ToolCalls pairs the tool_use blocks of the current history with
	// their tool_result, in order of appearance: every one of the latest
	// assistant message (up to MaxToolUsesPerMessage) and the pending
	// ones, and the latest KeepToolCalls others.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// Orphans are the tool_use blocks judged to have no tool_result (the
	// latest KeepOrphans).
	Orphans []Orphan `json:"orphans,omitempty"`
	// UnmatchedResults are the tool_result blocks that answer no tool_use
	// of the previous assistant message (the latest KeepAnomalies).
	UnmatchedResults []UnmatchedResult `json:"unmatched_results,omitempty"`
	// Violations are the broken invariants, each at the event where it
	// arose (the latest KeepAnomalies).
	Violations []Violation `json:"violations,omitempty"`
	// HistoryBroken counts, per history rule (invariant 2), the
	// violations of it that arose since the current history began and no
	// repair resolved: what a distillation's check reads, exact whatever
	// Violations still keeps.
	HistoryBroken map[Rule]int `json:"history_broken,omitempty"`

	// Distillations are the session's distillations (compactions), in
	// order (the latest KeepDistillations).
	Distillations []Distillation `json:"distillations,omitempty"`
	// Errors counts the errors recorded and the current streak.
	Errors ErrorStats `json:"errors"`
	// Outputs is the current run of identical assistant outputs
	// (invariant 4; see OutputStreak).
	Outputs OutputStreak `json:"outputs"`
	// LastTool is the session's latest tool_use and how it ran: what the
	// next tool_use is compared with to spot a re-run (see Flaky). Nil
	// before the first tool_use, and after a tool_use whose id the history
	// already held.
	LastTool *ToolRun `json:"last_tool,omitempty"`
	// Flaky are the flaky-suspected tool runs: a failed tool call whose
	// immediate identical re-run passed (the latest KeepAnomalies). They
	// are not violations.
	Flaky []Flaky `json:"flaky,omitempty"`
	// Steps are the steps of turns in flight that failed and have not
	// succeeded since, in order of their first failure (at most
	// MaxSteps): what each turn's FailedAttempts counts (see FailedStep).
	Steps []FailedStep `json:"steps,omitempty"`

	// Paused is true between session.paused and session.resumed;
	// PauseReason and PausedSeq tell why and since when; PauseCause,
	// PauseCommand and PauseKind are the pause's cause, and the command
	// that paused it or could not run (see events.SessionPaused).
	Paused       bool              `json:"paused"`
	PauseReason  string            `json:"pause_reason,omitempty"`
	PauseCause   events.PauseCause `json:"pause_cause,omitempty"`
	PauseCommand string            `json:"pause_command,omitempty"`
	PauseKind    string            `json:"pause_kind,omitempty"`
	PausedSeq    uint64            `json:"paused_seq,omitzero"`
	// PausedAt is when the log stored the session.paused (the log's
	// clock; zero without a store time): a runtime is back only once it
	// answered after it (reconciler, docs/policy.md).
	PausedAt time.Time `json:"paused_at,omitzero"`
	// LastSnapshotSeq is the covers_seq of the latest snapshot.taken of
	// this state Version (0: none).
	LastSnapshotSeq uint64 `json:"last_snapshot_seq,omitzero"`

	// Commands are the recovery commands run on the session, by id, in
	// order of their first recovery.* event: the latest KeepCommands done
	// ones (with an outcome or a park) and up to MaxOpenCommands more. See
	// CommandDone.
	Commands []CommandRecord `json:"commands,omitempty"`
	// Breakers is the latest state of each provider's circuit breaker that
	// a breaker.changed event named (the MaxBreakers changed last), sorted
	// by provider. Breaker events
	// usually live in a pseudo-session of their own per tenant
	// (BreakersSession).
	Breakers []Breaker `json:"breakers,omitempty"`
	// Forks are the sessions forked from this one (session.forked), in
	// order (the latest KeepRewinds).
	Forks []Fork `json:"forks,omitempty"`

	// Rewinds are the session's rewinds (session.rewound), in order (the
	// latest KeepRewinds), including the ones a later rewind undid (see
	// IsRewound). A rewind is never undone from this list.
	Rewinds []Rewind `json:"rewinds,omitempty"`
	// Rewound are the ranges of stream sequences whose events rewinds
	// undid: they are kept in the log but no longer count. Sorted,
	// disjoint and not adjacent; never trimmed (each rewind adds at most
	// one range, and the state needs them all to refold): a rewind that
	// would make more than MaxRewoundRanges is an invalid event.
	Rewound []SeqRange `json:"rewound,omitempty"`
	// RewoundEvents is how many of the session's events lie in Rewound,
	// as of the last refold.
	RewoundEvents int `json:"rewound_events,omitzero"`
	// NeedsRefold is set by Apply of a session.rewound that undoes events
	// the state holds: until Refold (or RefoldLog) runs, the recovery
	// record (Rewinds, Rewound) is current but the rest of the state still
	// shows the undone events. FoldLog, Restore and the Projector refold
	// at once; a caller of Apply must too.
	NeedsRefold bool `json:"needs_refold,omitzero"`

	// InvalidEvents are the events that could not be folded (the latest
	// KeepAnomalies); each also has an invalid_event violation.
	InvalidEvents []InvalidEvent `json:"invalid_events,omitempty"`
	// UnknownTypes counts the events of types this version does not know,
	// in order of first appearance, for the first MaxUnknownTypes types;
	// UnknownOther counts the events of the types after those. They are
	// not violations: the wire contract lets newer publishers send new
	// types.
	UnknownTypes []UnknownType `json:"unknown_types,omitempty"`
	UnknownOther int           `json:"unknown_other,omitzero"`

	idx *index // lookups by id, rebuilt from the slices when nil
}

// Totals counts every entry ever made, including the ones the state no
// longer keeps (see the Keep constants).
type Totals struct {
	// Turns is how many turns started; Turn.Index counts from it.
	Turns int `json:"turns"`
	// Messages is how many API messages the history ever held (before and
	// after distillations); Message.Index counts from it.
	Messages int `json:"messages"`
	// ToolCalls, Orphans, UnmatchedResults, Violations, InvalidEvents and
	// Distillations count the entries ever made in the lists of the same
	// names.
	ToolCalls        int `json:"tool_calls"`
	Orphans          int `json:"orphans"`
	UnmatchedResults int `json:"unmatched_results"`
	Violations       int `json:"violations"`
	InvalidEvents    int `json:"invalid_events"`
	Distillations    int `json:"distillations"`
	// Resolved counts the violations a repair resolved (Violation.Resolved).
	Resolved int `json:"resolved,omitzero"`
	// Commands, Forks, Rewinds and Flaky count the entries ever made in
	// the lists of the same names.
	Commands int `json:"commands,omitzero"`
	Forks    int `json:"forks,omitzero"`
	Rewinds  int `json:"rewinds,omitzero"`
	Flaky    int `json:"flaky,omitzero"`
	// FailedTurns and AbandonedTurns count the turns that ended failed or
	// abandoned; ParkedCommands and FailedCommands the commands parked or
	// completed with outcome failed (what Anomalous reads, whatever the
	// lists still keep).
	FailedTurns    int `json:"failed_turns,omitzero"`
	AbandonedTurns int `json:"abandoned_turns,omitzero"`
	ParkedCommands int `json:"parked_commands,omitzero"`
	FailedCommands int `json:"failed_commands,omitzero"`
	// ToolErrors counts the tool calls whose result said is_error (a
	// tool_result block, or tool_call.completed), each once; a synthetic
	// result written by a repair does not count.
	ToolErrors int `json:"tool_errors,omitzero"`
	// UntrackedToolUses counts the tool_use blocks past
	// MaxToolUsesPerMessage of their message, which the state did not
	// track.
	UntrackedToolUses int `json:"untracked_tool_uses,omitzero"`
}

// Clone returns a deep copy of the state: every list, map and pointer is
// its own, so that folding either leaves the other as it was (strings,
// which never change, are shared). The copy folds on exactly like s.
// It only reads s: it is safe beside other readers, not beside Apply.
// TestCloneSharesNothing checks that it copies every field.
func (s *Session) Clone() *Session {
	c := *s
	c.idx = nil // rebuilt from the slices on first use
	c.Labels = maps.Clone(s.Labels)
	c.HistoryBroken = maps.Clone(s.HistoryBroken)
	c.Turns = slices.Clone(s.Turns)
	for i := range c.Turns {
		c.Turns[i].Error = clonePtr(c.Turns[i].Error)
	}
	c.InFlight = slices.Clone(s.InFlight)
	c.Messages = slices.Clone(s.Messages)
	for i := range c.Messages {
		m := &c.Messages[i]
		m.Seqs, m.Blocks = slices.Clone(m.Seqs), slices.Clone(m.Blocks)
	}
	c.Pending = slices.Clone(s.Pending)
	c.ToolCalls = slices.Clone(s.ToolCalls)
	c.Orphans = slices.Clone(s.Orphans)
	c.UnmatchedResults = slices.Clone(s.UnmatchedResults)
	c.Violations = slices.Clone(s.Violations)
	c.Distillations = slices.Clone(s.Distillations)
	for i := range c.Distillations {
		c.Distillations[i].DirtyReasons = slices.Clone(c.Distillations[i].DirtyReasons)
	}
	c.Errors.Last = clonePtr(s.Errors.Last)
	c.Outputs.Seqs = slices.Clone(s.Outputs.Seqs)
	if c.Outputs.Before = clonePtr(s.Outputs.Before); c.Outputs.Before != nil {
		c.Outputs.Before.Seqs = slices.Clone(c.Outputs.Before.Seqs)
	}
	c.LastTool = clonePtr(s.LastTool)
	c.Flaky = slices.Clone(s.Flaky)
	c.Commands = slices.Clone(s.Commands)
	c.Steps = slices.Clone(s.Steps)
	c.Breakers = slices.Clone(s.Breakers)
	c.Forks = slices.Clone(s.Forks)
	c.Rewinds = slices.Clone(s.Rewinds)
	c.Rewound = slices.Clone(s.Rewound)
	c.InvalidEvents = slices.Clone(s.InvalidEvents)
	c.UnknownTypes = slices.Clone(s.UnknownTypes)
	return &c
}

// clonePtr returns a pointer to a copy of *p, or nil.
func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	c := *p
	return &c
}

// Fold is FoldLog, under the name it had before rewinds: it folds a
// session's events, in stream order, into a new Session and returns it.
func Fold(evs []events.Event) *Session { return FoldLog(evs) }

// Apply folds one event into the state and returns the violations it gave
// rise to (nil for none), in the order they arose; orphans show as
// tool_use_without_result violations naming the tool_use, invalid events
// as invalid_event ones. The returned slice is a copy, all of them even
// when Violations keeps fewer (KeepAnomalies). A caller that replays
// a session event by event (`engine replay`) flags each returned violation
// at ev.
//
// Apply never panics and never stops: an event whose Err is set, whose
// payload does not decode, that lacks what the fold needs (a turn id on a
// turn event, a message role) or that belongs to another session becomes
// an InvalidEvent and an invalid_event violation; an event of an unknown
// type is counted in UnknownTypes. Either way the fold goes on.
//
// An event whose Seq is not above LastSeq (already folded: a redelivery,
// or a tail that overlaps a snapshot) is ignored; events with Seq 0 are
// always folded. Apply uses no clock: times come from the events.
//
// A session.rewound that undoes events the state holds sets NeedsRefold:
// call Refold or RefoldLog before the next Apply (see rewind.go).
func (s *Session) Apply(ev events.Event) []Violation {
	if ev.Seq != 0 && ev.Seq <= s.LastSeq {
		return nil
	}
	before := s.Totals.Violations
	s.Version = Version
	s.track(&ev)
	s.apply(&ev)
	s.stored(&ev)
	if ev.Seq != 0 && runtimeEvent(&ev) {
		s.LastRuntimeSeq = ev.Seq
	}
	var vs []Violation
	if n := min(s.Totals.Violations-before, len(s.Violations)); n > 0 {
		vs = slices.Clone(s.Violations[len(s.Violations)-n:]) // before trim drops any
	}
	s.trim()
	if s.longLists() {
		s.index() // built here, so that readers of the state after Apply only read it
	}
	return vs
}

// track updates the identity, counters and positions every event moves.
func (s *Session) track(ev *events.Event) {
	s.Events++
	if s.FirstSeq == 0 {
		s.FirstSeq = ev.Seq
	}
	if !ev.Time.IsZero() {
		t := ev.Time.Round(0)
		if s.FirstTime.IsZero() || t.Before(s.FirstTime) {
			s.FirstTime = t
		}
		if t.After(s.LastTime) {
			s.LastTime = t
		}
	}
	if s.Tenant == "" && s.Session == "" {
		s.Tenant, s.Session = ev.Tenant, ev.Session
	}
}

// stored moves the log's clock (Event.Stored), after the event's rule ran
// (so that a session.started that marks the session history already
// counts), and flags an event time too far ahead of it.
func (s *Session) stored(ev *events.Event) {
	if ev.Stored.IsZero() {
		return
	}
	at := ev.Stored.Round(0)
	if s.FirstStored.IsZero() || at.Before(s.FirstStored) {
		s.FirstStored = at
	}
	if at.After(s.LastStored) {
		s.LastStored = at
	}
	if !s.History && runtimeEvent(ev) && at.After(s.LastLiveStored) {
		s.LastLiveStored = at
	}
	if runtimeEvent(ev) {
		s.signOfLife(ev.Turn, at)
	}
	if ev.Type == events.TypeTurnAbandoned && ev.Err == nil && at.After(s.LastAbandonStored) {
		s.LastAbandonStored = at
	}
	if ahead := ev.Time.Sub(at); ev.Err == nil && ahead > MaxClockSkew {
		s.violate(ev, RuleClockSkew, fmt.Sprintf("event time %s is %s ahead of the time it was stored (%s); the log's time is used",
			ev.Time.UTC().Format(time.RFC3339), ahead.Round(time.Second), at.UTC().Format(time.RFC3339)), "", ev.Turn)
	}
}

// RuntimeEvent reports whether ev is the agent runtime at work (what
// makes a session live, and a sign of life of its turn), not Turnstone's
// own bookkeeping: the types a runtime publishes, from a source that is
// not one of Turnstone's writers ("urn:turnstone:worker:…",
// "urn:turnstone:reconciler"). An event that did not decode is not.
func RuntimeEvent(ev events.Event) bool { return runtimeEvent(&ev) }

// runtimeEvent is RuntimeEvent without a copy of ev.
func runtimeEvent(ev *events.Event) bool {
	if ev.Err != nil || strings.HasPrefix(ev.Source, "urn:turnstone:") {
		return false
	}
	switch ev.Type {
	case events.TypeSnapshotTaken, events.TypeBreakerChanged, events.TypeSessionPaused, events.TypeSessionResumed,
		events.TypeSessionRewound, events.TypeSessionForked, events.TypeDistillationSkipped,
		events.TypeRecoveryAttempted, events.TypeRecoveryCompleted, events.TypeRecoveryParked:
		return false
	}
	return true
}

// apply dispatches ev to its type's rule. s.LastSeq still holds the
// sequence of the previous event while it runs.
func (s *Session) apply(ev *events.Event) {
	defer func() {
		if ev.Seq != 0 {
			s.LastSeq = ev.Seq
		}
	}()
	if ev.Err != nil {
		s.invalid(ev, ev.Err.Error())
		return
	}
	if ev.Tenant != s.Tenant || ev.Session != s.Session {
		s.invalid(ev, fmt.Sprintf("event of session %s/%s folded into %s/%s", ev.Tenant, ev.Session, s.Tenant, s.Session))
		return
	}
	p, err := ev.Payload()
	if errors.Is(err, events.ErrUnknownType) {
		s.unknown(ev)
		return
	}
	if err != nil {
		s.invalid(ev, err.Error())
		return
	}
	turn := tokenKey(ev.Turn)
	switch p := p.(type) {
	case *events.SessionStarted:
		s.sessionStarted(p)
	case *events.SessionPaused:
		s.Paused, s.PauseReason, s.PausedSeq, s.PausedAt = true, detail(p.Reason), ev.Seq, ev.Stored.Round(0)
		s.PauseCause, s.PauseCommand, s.PauseKind = events.PauseCause(IDKey(string(p.Cause))), IDKey(p.CommandID), IDKey(p.Kind)
		if c := s.Command(p.CommandID); c != nil && p.Cause != "" {
			c.PauseCause = s.PauseCause
		}
	case *events.SessionResumed:
		s.Paused, s.PauseReason, s.PausedSeq, s.PausedAt = false, "", 0, time.Time{}
		s.PauseCause, s.PauseCommand, s.PauseKind = "", "", ""
	case *events.TurnStarted:
		if turn == "" {
			s.invalid(ev, "turn.started without a turn id")
			return
		}
		s.turnStarted(ev, turn, p)
	case *events.TurnStageCompleted:
		if t := s.turnEvent(ev, turn); t != nil {
			t.LastStage, t.Stage = stageKey(p.Stage), stageKey(p.Stage.Next())
			s.stepPassed(turn, stageStep(p.Stage))
		}
	case *events.TurnCompleted:
		if t := s.turnEvent(ev, turn); t != nil {
			reason := p.Reason
			if reason == "" {
				reason = "end_turn"
			}
			s.endTurn(ev, t, TurnCompleted, reason, p.DurationMS)
			s.Errors.Streak = Streak{}
		}
	case *events.TurnFailed:
		if t := s.turnEvent(ev, turn); t != nil {
			info := turnError(p.Error)
			t.FailedStage, t.Error, t.Stage = stageKey(p.Stage), &info, stageKey(p.Stage)
			s.endTurn(ev, t, TurnFailed, "", 0)
			s.recordError(ev, turn, p.Stage, p.Error, 0)
		}
	case *events.TurnAbandoned:
		if t := s.turnEvent(ev, turn); t != nil {
			if c := p.Completed(); c != "" {
				t.LastStage = stageKey(c)
			}
			t.Stage = stageKey(p.InStage())
			t.AbandonCause = IDKey(p.Cause)
			s.endTurn(ev, t, TurnAbandoned, p.Reason, 0)
		}
	case *events.MessageAppended:
		if p.Role != events.RoleUser && p.Role != events.RoleAssistant {
			s.invalid(ev, fmt.Sprintf("message role %q is neither user nor assistant", p.Role))
			return
		}
		s.appendMessage(ev, turn, p)
	case *events.ToolCallStarted:
		if tc := s.toolCallEvent(ev, turn, p.ToolUseID, p.Name); tc != nil && tc.StartedSeq == 0 {
			tc.StartedSeq = ev.Seq
		}
	case *events.ToolCallCompleted:
		if tc := s.toolCallEvent(ev, turn, p.ToolUseID, p.Name); tc != nil {
			tc.CompletedSeq, tc.DurationMS = ev.Seq, p.DurationMS
			s.toolError(tc, p.IsError)
		}
	case *events.ErrorRecorded:
		s.recordError(ev, turn, p.Stage, p.ErrorInfo, p.Consecutive)
		s.stepFailed(ev, turn, stageStep(p.Stage), string(stageKey(p.Stage)))
	case *events.DistillationRequested:
		s.distillationRequested(ev, turn, p)
	case *events.DistillationStarted:
		s.distillationStarted(ev, turn, p)
	case *events.DistillationCompleted:
		s.distillationCompleted(ev, turn, p)
	case *events.DistillationSkipped:
		d := s.openDistillation(turn, anyDistillation)
		d.SkippedSeq, d.Skipped = ev.Seq, detail(p.Reason)
	case *events.SnapshotTaken:
		// A snapshot of another state version is one Restore refuses
		// (ErrSnapshotVersion): the session counts as never snapshotted,
		// so that the projector writes one of this version soon rather
		// than replaying the whole log at every restore until SnapshotEvery
		// new events come.
		if p.Version == Version {
			s.LastSnapshotSeq = p.CoversSeq
		}
	case *events.SessionRewound:
		s.sessionRewound(ev, p)
	case *events.SessionForked:
		s.sessionForked(ev, p)
	case *events.RecoveryAttempted:
		s.recoveryAttempted(ev, p)
	case *events.RecoveryCompleted:
		s.recoveryCompleted(ev, p)
	case *events.RecoveryParked:
		s.recoveryParked(ev, p)
	case *events.BreakerChanged:
		s.breakerChanged(ev, p)
	default:
		s.invalid(ev, fmt.Sprintf("no rule for %s events", ev.Type))
	}
}

// trim drops the oldest entries of the lists over their Keep bound. It
// runs only when a list is a quarter over its bound, so that its cost is
// spread over many events; the result depends only on the state, so a
// restored state trims exactly like the original.
func (s *Session) trim() {
	var n int
	if s.Turns, n = trimFront(s.Turns, KeepTurns, func(t *Turn) bool { return t.Ended() }); n > 0 {
		s.idx = nil
	}
	latest := 0 // the latest assistant message: its tool calls stay
	if m := s.lastAssistant(); m != nil {
		latest = m.Index
	}
	if s.ToolCalls, n = trimFront(s.ToolCalls, KeepToolCalls, func(tc *ToolCall) bool {
		return tc.Status != ToolPending && (tc.Message == 0 || tc.Message != latest)
	}); n > 0 {
		s.idx = nil
	}
	all := func(*Violation) bool { return true }
	s.Violations, _ = trimFront(s.Violations, KeepAnomalies, all)
	s.Orphans, _ = trimFront(s.Orphans, KeepOrphans, func(*Orphan) bool { return true })
	s.UnmatchedResults, _ = trimFront(s.UnmatchedResults, KeepAnomalies, func(*UnmatchedResult) bool { return true })
	s.InvalidEvents, _ = trimFront(s.InvalidEvents, KeepAnomalies, func(*InvalidEvent) bool { return true })
	s.Flaky, _ = trimFront(s.Flaky, KeepAnomalies, func(*Flaky) bool { return true })
	if k := len(s.Distillations); k > 0 {
		last := &s.Distillations[k-1]
		s.Distillations, _ = trimFront(s.Distillations, KeepDistillations, func(d *Distillation) bool { return d != last || !d.open() })
	}
	if s.Commands, n = trimFront(s.Commands, KeepCommands, func(c *CommandRecord) bool { return c.Done() }); n > 0 {
		s.idx = nil
	}
	if s.Commands, n = trimFront(s.Commands, KeepCommands+MaxOpenCommands, func(*CommandRecord) bool { return true }); n > 0 {
		s.idx = nil
	}
	s.Rewinds, _ = trimFront(s.Rewinds, KeepRewinds, func(*Rewind) bool { return true })
	s.Forks, _ = trimFront(s.Forks, KeepRewinds, func(*Fork) bool { return true })
	s.Messages, n = trimFront(s.Messages, KeepMessages, func(*Message) bool { return true })
	s.MessagesDropped += n
}

// trimFront returns xs without its oldest removable entries once xs is a
// quarter over keep, down to keep entries (fewer are dropped when too few
// are removable), and how many it dropped. It moves the kept entries to
// the front of xs's own array, in order, and clears the rest (the
// garbage collector keeps nothing they held): a long session's lists
// reuse their arrays rather than allocating new ones at each trim. Clone
// copies every list, so no other state shares the array.
func trimFront[T any](xs []T, keep int, removable func(*T) bool) ([]T, int) {
	if len(xs) <= keep+keep/4 {
		return xs, 0
	}
	drop := len(xs) - keep
	found := false
	for i := range xs {
		if found = removable(&xs[i]); found {
			break
		}
	}
	if !found {
		return xs, 0 // every entry is still needed
	}
	k, dropped := 0, 0
	for i := range xs {
		if dropped < drop && removable(&xs[i]) {
			dropped++
			continue
		}
		xs[k] = xs[i]
		k++
	}
	clear(xs[k:])
	return xs[:k], dropped
}

// since returns the index in a list of n kept entries (out of total ever
// made) of the first entry made after mark entries.
func since(mark, total, n int) int {
	i := n - (total - mark)
	if i < 0 {
		return 0
	}
	if i > n {
		return n
	}
	return i
}

// index holds lookups by id over the state's slices. It is not marshalled:
// it is rebuilt from the slices when nil (after a JSON round trip or a
// Clone) or after a slice is trimmed, and Apply leaves it built once a
// list is long (longLists), so that the queries of readers sharing a
// state (the projector's hooks, Clone) never write it. A list shorter
// than indexFrom is searched from its end instead (most sessions' lists:
// no maps to make, fill, and mark at every garbage collection).
type index struct {
	turns     map[string]int // turn id -> index in Turns
	toolCalls map[string]int // tool_use id -> index in ToolCalls (the latest)
	commands  map[string]int // command id -> index in Commands
}

func (s *Session) index() *index {
	if s.idx == nil {
		s.idx = &index{
			turns:     make(map[string]int, len(s.Turns)),
			toolCalls: make(map[string]int, len(s.ToolCalls)),
			commands:  make(map[string]int, len(s.Commands)),
		}
		for i := range s.Turns {
			s.idx.turns[s.Turns[i].ID] = i
		}
		for i := range s.ToolCalls {
			s.idx.toolCalls[s.ToolCalls[i].ToolUseID] = i
		}
		for i := range s.Commands {
			s.idx.commands[s.Commands[i].ID] = i
		}
	}
	return s.idx
}

// indexFrom is the length from which a list is looked up through the
// index's map rather than searched.
const indexFrom = 16

// longLists reports whether a list the index covers is long enough to be
// looked up through it.
func (s *Session) longLists() bool {
	return len(s.Turns) >= indexFrom || len(s.ToolCalls) >= indexFrom || len(s.Commands) >= indexFrom
}

// latest returns the index of the last entry of xs whose id is id, or -1.
func latest[T any](xs []T, id string, idOf func(*T) string) int {
	for i := len(xs) - 1; i >= 0; i-- {
		if idOf(&xs[i]) == id {
			return i
		}
	}
	return -1
}

func (s *Session) turn(id string) *Turn {
	if len(s.Turns) < indexFrom {
		if i := latest(s.Turns, id, func(t *Turn) string { return t.ID }); i >= 0 {
			return &s.Turns[i]
		}
		return nil
	}
	if i, ok := s.index().turns[id]; ok {
		return &s.Turns[i]
	}
	return nil
}

func (s *Session) toolCall(id string) *ToolCall {
	if len(s.ToolCalls) < indexFrom {
		if i := latest(s.ToolCalls, id, func(tc *ToolCall) string { return tc.ToolUseID }); i >= 0 {
			return &s.ToolCalls[i]
		}
		return nil
	}
	if i, ok := s.index().toolCalls[id]; ok {
		return &s.ToolCalls[i]
	}
	return nil
}
