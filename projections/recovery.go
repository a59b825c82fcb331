package projections

import (
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/turnstone-dev/turnstone/events"
)

// BreakersSession is events.BreakersSession: the pseudo-session, one per
// tenant, that holds the tenant's breaker.changed events.
const BreakersSession = events.BreakersSession

// CommandRecord is what the session's log says about one recovery command:
// its recovery.attempted, recovery.completed and recovery.parked events.
type CommandRecord struct {
	// ID and Kind are the command's id and kind (recovery.Kind).
	ID   string `json:"id"`
	Kind string `json:"kind"`
	// Attempts is how many recovery.attempted events it has, or the
	// attempts recovery.completed counts when that is more.
	Attempts int `json:"attempts"`
	// LastResult is the latest attempt's result (events.AttemptOK or
	// AttemptFailed); LastClass the error class it fell into (a
	// recovery.Class name), and LastError a preview of its error
	// (PreviewRunes runes), when it failed.
	LastResult events.AttemptResult `json:"last_result,omitempty"`
	LastClass  string               `json:"last_class,omitempty"`
	LastError  string               `json:"last_error,omitempty"`
	// Strategy is the strategy that ended it (recovery.completed's), or
	// else the latest one tried.
	Strategy string `json:"strategy,omitempty"`
	// Outcome is recovery.completed's outcome (one of events.Outcomes;
	// OutcomeUnknown when it named none), empty until one is recorded;
	// the first one stands (a later one, a duplicate delivery, only moves
	// LastSeq). Detail is its detail, for people (a preview); OutcomeSeq
	// the sequence of its recovery.completed.
	Outcome    events.Outcome `json:"outcome,omitempty"`
	Detail     string         `json:"detail,omitempty"`
	OutcomeSeq uint64         `json:"outcome_seq,omitzero"`
	// Parked is set by recovery.parked: the command was set aside after
	// its last delivery failed. ParkReason says why; Deliveries is how
	// many deliveries it had.
	Parked     bool   `json:"parked,omitzero"`
	ParkReason string `json:"park_reason,omitempty"`
	Deliveries int    `json:"deliveries,omitzero"`
	// PauseCause is the cause of the session.paused that named this
	// command (events.SessionPaused.CommandID), when one did: a command
	// that paused the session for runtime_unavailable is issued again when
	// the runtime is back.
	PauseCause events.PauseCause `json:"pause_cause,omitempty"`
	// FirstSeq and LastSeq are the sequences of its first and latest
	// recovery.* events.
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
}

// OutcomeUnknown is the Outcome a CommandRecord holds for a
// recovery.completed that named none (the contract requires one; a fold
// never drops an event).
const OutcomeUnknown events.Outcome = "unknown"

// Result is how the command stands, in one word: its outcome (recovered,
// degraded, failed, unknown), OutcomeParked, or OutcomeRunning while it
// has neither.
func (c *CommandRecord) Result() string {
	switch {
	case c.Parked:
		return OutcomeParked
	case c.Outcome != "":
		return string(c.Outcome)
	}
	return OutcomeRunning
}

// Done reports whether the command has an outcome or was parked: a worker
// that receives it again (a redelivery after a crash) skips it.
func (c *CommandRecord) Done() bool { return c.Outcome != "" || c.Parked }

// Breaker is the latest state of one provider's circuit breaker.
type Breaker struct {
	// Provider is the provider the breaker guards.
	Provider string `json:"provider"`
	// State is "closed", "open" or "half_open"; From the state before.
	State string `json:"state"`
	From  string `json:"from,omitempty"`
	// Failures is the failure count in the window when it opened; Reason
	// says why it changed.
	Failures int    `json:"failures,omitzero"`
	Reason   string `json:"reason,omitempty"`
	// Seq and Since are the sequence and the time of the breaker.changed
	// that set State.
	Seq   uint64    `json:"seq"`
	Since time.Time `json:"since,omitzero"`
}

// Fork is one session forked from this one (session.forked).
type Fork struct {
	// Session is the new session (same tenant).
	Session string `json:"session"`
	// AtSeq is the last sequence of this session's events it copies.
	AtSeq uint64 `json:"at_seq"`
	// Seq is the sequence of the session.forked event.
	Seq uint64 `json:"seq"`
	// CommandID names the fork_session command that forked it, if any.
	CommandID string `json:"command_id,omitempty"`
}

// CommandDone reports whether the session's log records an outcome
// (recovery.completed) or a park (recovery.parked) for the command with id,
// so that a worker receiving it again after a crash skips it. Commands
// beyond the KeepCommands latest done ones are forgotten, and a rewind
// undoes the records of the events it rewinds like any other; a rewind or
// a fork that a command already carried out shows in RewindByCommand and
// ForkByCommand.
func (s *Session) CommandDone(id string) bool {
	c := s.Command(id)
	return c != nil && c.Done()
}

// Command returns the record of the command with id, or nil. The pointer
// is into the state: read it, do not keep it across Apply.
func (s *Session) Command(id string) *CommandRecord {
	id = IDKey(id)
	if len(s.Commands) < indexFrom {
		if i := latest(s.Commands, id, func(c *CommandRecord) string { return c.ID }); i >= 0 {
			return &s.Commands[i]
		}
		return nil
	}
	if i, ok := s.index().commands[id]; ok {
		return &s.Commands[i]
	}
	return nil
}

// Breaker returns the latest state of provider's breaker, or nil when no
// breaker.changed named it. The pointer is into the state: read it, do not
// keep it across Apply.
func (s *Session) Breaker(provider string) *Breaker {
	provider = IDKey(provider)
	i := sort.Search(len(s.Breakers), func(i int) bool { return s.Breakers[i].Provider >= provider })
	if i < len(s.Breakers) && s.Breakers[i].Provider == provider {
		return &s.Breakers[i]
	}
	return nil
}

// ForkByCommand returns the latest fork the command with id made, or nil.
// The pointer is into the state: read it, do not keep it across Apply.
func (s *Session) ForkByCommand(id string) *Fork {
	id = IDKey(id)
	for i := len(s.Forks) - 1; i >= 0 && id != ""; i-- {
		if s.Forks[i].CommandID == id {
			return &s.Forks[i]
		}
	}
	return nil
}

// command returns the record of id (an IDKey), creating it at ev.
func (s *Session) command(ev *events.Event, id, kind string) *CommandRecord {
	kind = IDKey(kind)
	c := s.Command(id)
	if c == nil {
		s.Commands = append(s.Commands, CommandRecord{ID: id, FirstSeq: ev.Seq})
		s.Totals.Commands++
		i := len(s.Commands) - 1
		if s.idx != nil {
			s.idx.commands[id] = i
		}
		c = &s.Commands[i]
	}
	if c.Kind == "" {
		c.Kind = kind
	}
	c.LastSeq = ev.Seq
	return c
}

// recoveryAttempted records one attempt at a command.
func (s *Session) recoveryAttempted(ev *events.Event, p *events.RecoveryAttempted) {
	if p.CommandID == "" {
		s.invalid(ev, "recovery.attempted without command_id")
		return
	}
	c := s.command(ev, IDKey(p.CommandID), p.Kind)
	c.Attempts++
	c.LastResult, c.LastClass, c.LastError = events.AttemptResult(IDKey(string(p.Result))), IDKey(p.Class), ""
	if p.Error != nil {
		c.LastError = detail(p.Error.Message)
	}
	if p.Strategy != "" && c.Outcome == "" {
		c.Strategy = IDKey(p.Strategy)
	}
}

// recoveryCompleted records a command's outcome; the first one stands.
func (s *Session) recoveryCompleted(ev *events.Event, p *events.RecoveryCompleted) {
	if p.CommandID == "" {
		s.invalid(ev, "recovery.completed without command_id")
		return
	}
	c := s.command(ev, IDKey(p.CommandID), p.Kind)
	if c.Outcome != "" {
		return
	}
	c.Outcome, c.Detail, c.OutcomeSeq = events.Outcome(IDKey(string(p.Outcome))), detail(p.Detail), ev.Seq
	if c.Outcome == "" {
		c.Outcome = OutcomeUnknown
	}
	if c.Outcome == events.OutcomeFailed {
		s.Totals.FailedCommands++
	}
	if p.Strategy != "" {
		c.Strategy = IDKey(p.Strategy)
	}
	if p.Attempts > c.Attempts {
		c.Attempts = p.Attempts
	}
}

// recoveryParked records that a command was set aside.
func (s *Session) recoveryParked(ev *events.Event, p *events.RecoveryParked) {
	if p.CommandID == "" {
		s.invalid(ev, "recovery.parked without command_id")
		return
	}
	c := s.command(ev, IDKey(p.CommandID), p.Kind)
	if !c.Parked {
		s.Totals.ParkedCommands++
	}
	c.Parked, c.ParkReason, c.Deliveries = true, detail(p.Reason), p.Deliveries
}

// breakerChanged records a breaker's new state, keeping Breakers sorted
// by provider.
func (s *Session) breakerChanged(ev *events.Event, p *events.BreakerChanged) {
	if p.Provider == "" {
		s.invalid(ev, "breaker.changed without provider")
		return
	}
	provider := IDKey(p.Provider)
	b := Breaker{Provider: provider, State: IDKey(p.To), From: IDKey(p.From), Failures: p.Failures,
		Reason: detail(p.Reason), Seq: ev.Seq, Since: ev.Time.Round(0)}
	if cur := s.Breaker(provider); cur != nil {
		*cur = b
		return
	}
	if len(s.Breakers) >= MaxBreakers {
		// Forget the breaker changed longest ago.
		oldest := 0
		for i := range s.Breakers {
			if s.Breakers[i].Seq < s.Breakers[oldest].Seq {
				oldest = i
			}
		}
		s.Breakers = slices.Delete(s.Breakers, oldest, oldest+1)
	}
	i := sort.Search(len(s.Breakers), func(i int) bool { return s.Breakers[i].Provider >= provider })
	s.Breakers = slices.Insert(s.Breakers, i, b)
}

// sessionForked records a fork made from this session.
func (s *Session) sessionForked(ev *events.Event, p *events.SessionForked) {
	if p.ForkSession == "" {
		s.invalid(ev, "session.forked without fork_session")
		return
	}
	s.Forks = append(s.Forks, Fork{Session: tokenKey(p.ForkSession), AtSeq: p.AtSeq, Seq: ev.Seq, CommandID: IDKey(p.CommandID)})
	s.Totals.Forks++
}

// sessionStarted records the session's identity. A fork's log holds two
// session.started: its own, naming its lineage (ForkedFrom, ForkSeq), then
// the copy of its source's; the first lineage stands, and a later
// session.started fills in only what it names.
func (s *Session) sessionStarted(p *events.SessionStarted) {
	if p.Kind != "" {
		s.Kind = IDKey(p.Kind)
	} else if s.Kind == "" {
		s.Kind = "main"
	}
	if s.ForkedFrom == "" && p.ForkedFrom != "" {
		s.ForkedFrom, s.ForkSeq = tokenKey(p.ForkedFrom), p.ForkSeq
	}
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	set(&s.Runtime, IDKey(p.Runtime))
	set(&s.Provider, IDKey(p.Provider))
	set(&s.ParentSession, tokenKey(p.ParentSession))
	set(&s.ParentToolUseID, IDKey(p.ParentToolUseID))
	set(&s.Model, IDKey(p.Model))
	s.History = p.History
	if len(p.Labels) > 0 {
		keys := slices.Sorted(maps.Keys(p.Labels))
		s.Labels, s.LabelsDropped = make(map[string]string, min(len(keys), MaxLabels)), 0
		for i, k := range keys {
			if i == MaxLabels {
				s.LabelsDropped = len(keys) - MaxLabels
				break
			}
			s.Labels[IDKey(k)] = detail(p.Labels[k])
		}
	}
}
