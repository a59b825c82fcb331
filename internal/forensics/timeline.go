package forensics

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
)

// TimelineConfig bounds what a Timeline keeps, so that a page of a
// 200,000-event session costs a fold and a bounded page. Zero fields take
// the defaults.
type TimelineConfig struct {
	// MaxEvents is how many events (the latest folded) the timeline lists.
	// Default 2000.
	MaxEvents int
	// MaxTurns is how many turns (the latest) get a band. Default 100.
	MaxTurns int
	// MaxToolsPerTurn is how many tool calls a band draws. Default 256.
	MaxToolsPerTurn int
	// MaxHistory is how many messages (the latest) of the current history
	// the history panel shows. Default 200.
	MaxHistory int
	// MaxCommands is how many recovery commands (the latest) are shown
	// with their attempts. Default 64.
	MaxCommands int
	// BlockRunes is how many runes of a content block's text the history
	// panel shows. Default 1500.
	BlockRunes int
}

func (c *TimelineConfig) setDefaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.MaxEvents, 2000)
	def(&c.MaxTurns, 100)
	def(&c.MaxToolsPerTurn, 256)
	def(&c.MaxHistory, 200)
	def(&c.MaxCommands, 64)
	def(&c.BlockRunes, 1500)
}

// Timeline is a session folded up to a sequence, as the session page
// shows it. Text in it comes from events: it is untrusted, to be escaped
// by whoever renders it (html/template does).
type Timeline struct {
	Tenant  string
	Session string
	// UntilSeq is the sequence asked for (0: the end).
	UntilSeq uint64
	// State is the projected state as of the last event folded.
	State *projections.Session
	// Events are the latest MaxEvents events folded; EventsBefore counts
	// the earlier ones not listed.
	Events       []Item
	EventsBefore int
	// Turns are the latest MaxTurns turns as bands; TurnsBefore counts
	// the earlier ones.
	Turns       []TurnBand
	TurnsBefore int
	// History is the current history (since the last distillation) as the
	// model sees it: consecutive records of one role merged; the latest
	// MaxHistory messages, HistoryBefore counting the earlier ones.
	History       []HistoryMessage
	HistoryBefore int
	// Commands are the recovery commands run on the session, in order of
	// their first event, with every attempt (the latest MaxCommands).
	Commands []CommandView
	// Snapshots are the snapshot.taken events (the latest 32).
	Snapshots []SnapshotMark
	// Anomalies are the violations the fold raised, each at the event
	// where it arose, in order (the latest 256).
	Anomalies []Anomaly
}

// Item is one event of the timeline.
type Item struct {
	Seq  uint64
	Time time.Time
	Type string
	Turn string
	// Category groups types for display: session, turn, message, tool,
	// error, distillation, snapshot, recovery, other, invalid.
	Category string
	Summary  string
	// Anomalies are the violations this event gave rise to.
	Anomalies []projections.Violation
	// Role, Synthetic and Meta are a message's.
	Role      string
	Synthetic bool
	Meta      bool
	// ToolUses are the ids of a message's tool_use blocks; Orphaned those
	// of them the fold judged orphans (as of the end of the timeline).
	ToolUses []string
	Orphaned []string
	// CommandID is a recovery event's command.
	CommandID string
	// Rewound is set when a later rewind undid this event.
	Rewound bool
}

// TurnBand is one turn with its stages and tool calls.
type TurnBand struct {
	ID, Status, Reason, Prompt, Error, FailedStage string
	// Cause is an abandoned turn's cause (events.TurnAbandoned.Cause).
	Cause            string
	Index            int
	StartSeq, EndSeq uint64
	Start, End       time.Time
	DurationMS       int64
	Stages           []StageMark
	Tools            []ToolSpan
	ToolsDropped     int
	// Lanes is how many rows the tool spans need: calls that overlap in
	// time run side by side, one lane each.
	Lanes     int
	Anomalies int
	Events    int
}

// StageMark is a turn.stage_completed.
type StageMark struct {
	Stage      string
	Seq        uint64
	Time       time.Time
	DurationMS int64
}

// ToolSpan is one tool call of a turn: from tool_call.started (or its
// tool_use) to tool_call.completed (or its tool_result).
type ToolSpan struct {
	ID, Name string
	// UseSeq is the record with the tool_use; StartSeq the
	// tool_call.started; EndSeq the tool_call.completed; ResultSeq the
	// record with its tool_result.
	UseSeq, StartSeq, EndSeq, ResultSeq uint64
	Start, End                          time.Time
	DurationMS                          int64
	// Status is answered, error, orphaned, repaired or pending.
	Status string
	// DeclaredSeq is, for an orphan, the event that declared it.
	DeclaredSeq uint64
	Lane        int
}

// HistoryMessage is one message of the history in the model API's view.
type HistoryMessage struct {
	Index     int
	Role      string
	Seqs      []uint64
	Turn      string
	Synthetic bool
	Meta      bool
	Blocks    []HistoryBlock
}

// HistoryBlock is one content block, its text clipped to BlockRunes.
type HistoryBlock struct {
	Type      string
	Seq       uint64
	Text      string
	Clipped   bool
	ID, Name  string
	ToolUseID string
	IsError   bool
	Synthetic bool
}

// CommandView is one recovery command and its attempts.
type CommandView struct {
	ID, Kind        string
	FirstSeq        uint64
	Attempts        []Attempt
	Outcome         string
	Strategy        string
	Detail          string
	OutcomeSeq      uint64
	Parked          bool
	ParkReason      string
	AttemptsCounted int
}

// Attempt is one recovery.attempted.
type Attempt struct {
	N          int
	Seq        uint64
	Time       time.Time
	Strategy   string
	Worker     string
	Result     string
	Class      string
	Error      string
	DurationMS int64
}

// SnapshotMark is a snapshot.taken.
type SnapshotMark struct {
	Seq, CoversSeq uint64
	Time           time.Time
}

// Anomaly is a violation at the event where it arose.
type Anomaly struct {
	projections.Violation
	Type string
}

// BuildTimeline reads a session from its first event up to until (0: its
// last) and builds its Timeline. It holds no more than the config's
// bounds: events are folded one by one, a rewind refolded from the log.
// Errors: the log's (events.ErrSessionNotFound, events.ErrLogUnavailable),
// wrapped.
func BuildTimeline(ctx context.Context, log projections.SessionReader, tenant, session string, until uint64, cfg TimelineConfig) (*Timeline, error) {
	b := NewTimelineBuilder(tenant, session, until, cfg)
	state, err := projections.Replay(ctx, log, tenant, session, projections.ReplayRange{To: until}, func(s projections.Step) error {
		b.Add(s)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("timeline: %w", err)
	}
	b.state = state
	return b.Finish(), nil
}

// TimelineBuilder builds a Timeline from the steps of a replay
// (projections.Replay), added in stream order.
type TimelineBuilder struct {
	cfg   TimelineConfig
	t     *Timeline
	state *projections.Session

	bands    []*band
	byTurn   map[string]*band
	history  []HistoryMessage
	commands []*CommandView
	byCmd    map[string]*CommandView
}

type band struct {
	TurnBand
	spans []*ToolSpan
	tools map[string]*ToolSpan
}

// NewTimelineBuilder returns a builder for the session, as of until.
func NewTimelineBuilder(tenant, session string, until uint64, cfg TimelineConfig) *TimelineBuilder {
	cfg.setDefaults()
	return &TimelineBuilder{
		cfg: cfg, t: &Timeline{Tenant: tenant, Session: session, UntilSeq: until},
		state: &projections.Session{}, byTurn: map[string]*band{}, byCmd: map[string]*CommandView{},
	}
}

// Add records one step of the replay.
func (b *TimelineBuilder) Add(s projections.Step) {
	ev, vs := s.Event, s.Anomalies
	b.state = s.State
	it := Item{Seq: ev.Seq, Time: ev.Time, Type: string(ev.Type), Turn: ev.Turn, Summary: ev.Summary(), Anomalies: vs, Category: category(ev)}
	for _, v := range vs {
		b.t.Anomalies = append(b.t.Anomalies, Anomaly{Violation: v, Type: string(ev.Type)})
	}
	if n := len(b.t.Anomalies); n > 320 {
		b.t.Anomalies = slices.Delete(b.t.Anomalies, 0, n-256)
	}
	bd := b.byTurn[ev.Turn]
	if ev.Err == nil {
		if p, err := ev.Payload(); err == nil {
			bd = b.payload(ev, p, &it, bd)
		}
	}
	if bd != nil {
		bd.Events++
		bd.Anomalies += len(vs)
	}
	b.t.Events = append(b.t.Events, it)
	if n := len(b.t.Events); n > b.cfg.MaxEvents+b.cfg.MaxEvents/4 {
		drop := n - b.cfg.MaxEvents
		b.t.EventsBefore += drop
		b.t.Events = slices.Delete(b.t.Events, 0, drop)
	}
}

// payload records what ev's payload adds to the bands, the history and
// the commands; it returns the band ev belongs to.
func (b *TimelineBuilder) payload(ev events.Event, p events.Payload, it *Item, bd *band) *band {
	span := func(id, name string) *ToolSpan {
		if bd == nil {
			return nil
		}
		if s, ok := bd.tools[id]; ok {
			return s
		}
		if len(bd.spans) >= b.cfg.MaxToolsPerTurn {
			bd.ToolsDropped++
			return nil
		}
		s := &ToolSpan{ID: id, Name: name, Status: "pending"}
		bd.spans = append(bd.spans, s)
		bd.tools[id] = s
		return s
	}
	switch p := p.(type) {
	case *events.TurnStarted:
		bd = &band{TurnBand: TurnBand{ID: ev.Turn, Index: b.state.Totals.Turns, Status: string(projections.TurnInFlight), Prompt: p.Prompt, StartSeq: ev.Seq, Start: ev.Time},
			tools: map[string]*ToolSpan{}}
		if old := b.byTurn[ev.Turn]; old == nil {
			b.bands = append(b.bands, bd)
			b.byTurn[ev.Turn] = bd
			if n := len(b.bands); n > b.cfg.MaxTurns+b.cfg.MaxTurns/4 {
				drop := n - b.cfg.MaxTurns
				for _, x := range b.bands[:drop] {
					delete(b.byTurn, x.ID)
				}
				b.t.TurnsBefore += drop
				b.bands = slices.Delete(b.bands, 0, drop)
			}
		} else {
			bd = old
		}
	case *events.TurnStageCompleted:
		if bd != nil {
			bd.Stages = append(bd.Stages, StageMark{Stage: string(p.Stage), Seq: ev.Seq, Time: ev.Time, DurationMS: p.DurationMS})
		}
	case *events.TurnCompleted, *events.TurnFailed, *events.TurnAbandoned:
		if bd != nil && bd.EndSeq == 0 {
			bd.EndSeq, bd.End = ev.Seq, ev.Time
			switch p := p.(type) {
			case *events.TurnCompleted:
				bd.Status, bd.Reason, bd.DurationMS = string(projections.TurnCompleted), cmpOr(p.Reason, "end_turn"), p.DurationMS
			case *events.TurnFailed:
				bd.Status, bd.FailedStage, bd.Error = string(projections.TurnFailed), string(p.Stage), p.Error.Message
			case *events.TurnAbandoned:
				bd.Status, bd.Reason, bd.Cause = string(projections.TurnAbandoned), p.Reason, p.Cause
			}
		}
	case *events.MessageAppended:
		it.Role, it.Synthetic, it.Meta = string(p.Role), p.Synthetic, p.Meta
		for _, c := range p.Content {
			switch c.Type {
			case events.BlockToolUse:
				it.ToolUses = append(it.ToolUses, c.ID)
				if s := span(c.ID, c.Name); s != nil && s.UseSeq == 0 {
					s.UseSeq, s.Start = ev.Seq, ev.Time
				}
			case events.BlockToolResult:
				b.answer(c, ev, p.Synthetic)
			}
		}
		b.addHistory(ev, p)
	case *events.ToolCallStarted:
		if s := span(p.ToolUseID, p.Name); s != nil && s.StartSeq == 0 {
			s.StartSeq, s.Start = ev.Seq, ev.Time
		}
	case *events.ToolCallCompleted:
		if s := span(p.ToolUseID, p.Name); s != nil {
			s.EndSeq, s.End, s.DurationMS = ev.Seq, ev.Time, p.DurationMS
			if p.IsError {
				s.Status = "error"
			} else if s.Status == "pending" {
				s.Status = "answered"
			}
		}
	case *events.DistillationCompleted:
		b.history, b.t.HistoryBefore = nil, 0 // the summary replaces the history
	case *events.SnapshotTaken:
		b.t.Snapshots = append(b.t.Snapshots, SnapshotMark{Seq: ev.Seq, CoversSeq: p.CoversSeq, Time: ev.Time})
		if n := len(b.t.Snapshots); n > 40 {
			b.t.Snapshots = slices.Delete(b.t.Snapshots, 0, n-32)
		}
	case *events.RecoveryAttempted:
		it.CommandID = p.CommandID
		c := b.command(p.CommandID, p.Kind, ev.Seq)
		a := Attempt{N: p.Attempt, Seq: ev.Seq, Time: ev.Time, Strategy: p.Strategy, Worker: p.Worker, Result: string(p.Result), Class: p.Class, DurationMS: p.DurationMS}
		if p.Error != nil {
			a.Error = p.Error.Message
		}
		if len(c.Attempts) < 32 {
			c.Attempts = append(c.Attempts, a)
		}
		c.AttemptsCounted++
		c.Strategy = cmpOr(p.Strategy, c.Strategy)
	case *events.RecoveryCompleted:
		it.CommandID = p.CommandID
		c := b.command(p.CommandID, p.Kind, ev.Seq)
		if c.Outcome == "" {
			c.Outcome, c.Strategy, c.Detail, c.OutcomeSeq = string(p.Outcome), cmpOr(p.Strategy, c.Strategy), p.Detail, ev.Seq
		}
	case *events.RecoveryParked:
		it.CommandID = p.CommandID
		c := b.command(p.CommandID, p.Kind, ev.Seq)
		c.Parked, c.ParkReason = true, p.Reason
	}
	return bd
}

// answer marks the span of the tool_use a tool_result answers.
func (b *TimelineBuilder) answer(c events.ContentBlock, ev events.Event, synthetic bool) {
	for i := len(b.bands) - 1; i >= 0; i-- {
		s, ok := b.bands[i].tools[c.ToolUseID]
		if !ok {
			continue
		}
		s.ResultSeq = ev.Seq
		if s.End.IsZero() && !synthetic {
			// A repair's time is when Turnstone answered, not when the
			// tool stopped: the span of a repaired call has no end.
			s.End = ev.Time
		}
		switch {
		case synthetic:
			s.Status = "repaired"
		case c.IsError:
			s.Status = "error"
		case s.Status == "pending":
			s.Status = "answered"
		}
		return
	}
}

func (b *TimelineBuilder) command(id, kind string, seq uint64) *CommandView {
	if c, ok := b.byCmd[id]; ok {
		return c
	}
	c := &CommandView{ID: id, Kind: kind, FirstSeq: seq}
	b.commands = append(b.commands, c)
	b.byCmd[id] = c
	if n := len(b.commands); n > b.cfg.MaxCommands+b.cfg.MaxCommands/4 {
		drop := n - b.cfg.MaxCommands
		for _, x := range b.commands[:drop] {
			delete(b.byCmd, x.ID)
		}
		b.commands = slices.Delete(b.commands, 0, drop)
	}
	return c
}

// addHistory merges a record into the history: into the last message when
// it has the same role, else as a new message.
func (b *TimelineBuilder) addHistory(ev events.Event, p *events.MessageAppended) {
	role := string(p.Role)
	var m *HistoryMessage
	if n := len(b.history); n > 0 && b.history[n-1].Role == role {
		m = &b.history[n-1]
	} else {
		b.history = append(b.history, HistoryMessage{Index: b.state.Totals.Messages, Role: role, Turn: ev.Turn})
		m = &b.history[len(b.history)-1]
		if n := len(b.history); n > b.cfg.MaxHistory+b.cfg.MaxHistory/4 {
			drop := n - b.cfg.MaxHistory
			b.t.HistoryBefore += drop
			b.history = slices.Delete(b.history, 0, drop)
			m = &b.history[len(b.history)-1]
		}
	}
	if len(m.Seqs) < 64 {
		m.Seqs = append(m.Seqs, ev.Seq)
	}
	m.Synthetic = m.Synthetic || p.Synthetic
	m.Meta = m.Meta || p.Meta
	for _, c := range p.Content {
		if len(m.Blocks) >= 64 {
			break
		}
		m.Blocks = append(m.Blocks, b.block(c, ev.Seq, p.Synthetic))
	}
}

func (b *TimelineBuilder) block(c events.ContentBlock, seq uint64, synthetic bool) HistoryBlock {
	hb := HistoryBlock{Type: c.Type, Seq: seq, ID: c.ID, Name: c.Name, ToolUseID: c.ToolUseID, IsError: c.IsError, Synthetic: synthetic}
	var text string
	switch c.Type {
	case events.BlockText:
		text = c.Text
	case events.BlockThinking:
		text = c.Thinking
	case events.BlockToolUse:
		text = string(c.Input)
	case events.BlockToolResult:
		text = resultText(c.Content)
	default:
		text = "[" + c.Type + "]"
	}
	hb.Text, hb.Clipped = clipRunes(text, b.cfg.BlockRunes)
	return hb
}

// Finish completes the timeline: the state, the orphans marked on their
// records and spans, the rewound events, the tool lanes.
func (b *TimelineBuilder) Finish() *Timeline {
	t, s := b.t, b.state
	if s.Tenant == "" {
		s.Tenant, s.Session = t.Tenant, t.Session
	}
	t.State = s
	orphans := map[string]*projections.Orphan{}
	for i := range s.Orphans {
		orphans[s.Orphans[i].ToolUseID] = &s.Orphans[i]
	}
	for i := range t.Events {
		it := &t.Events[i]
		it.Rewound = s.IsRewound(it.Seq)
		for _, id := range it.ToolUses {
			if o := orphans[projections.IDKey(id)]; o != nil && o.Seq == it.Seq && !o.Repaired {
				it.Orphaned = append(it.Orphaned, id)
			}
		}
	}
	for _, bd := range b.bands {
		bd.Tools = make([]ToolSpan, 0, len(bd.spans))
		for _, sp := range bd.spans {
			if o := orphans[projections.IDKey(sp.ID)]; o != nil && o.Seq == sp.UseSeq {
				sp.DeclaredSeq = o.DeclaredSeq
				if o.Repaired {
					sp.Status = "repaired"
				} else {
					sp.Status = "orphaned"
				}
			}
			if sp.Start.IsZero() {
				sp.Start = bd.Start
			}
			if sp.DurationMS == 0 && !sp.End.IsZero() {
				sp.DurationMS = sp.End.Sub(sp.Start).Milliseconds()
			}
			bd.Tools = append(bd.Tools, *sp)
		}
		bd.Lanes = assignLanes(bd.Tools, bd.End)
		t.Turns = append(t.Turns, bd.TurnBand)
	}
	// Drop from the history the records a rewind undid.
	for _, m := range b.history {
		if len(m.Seqs) > 0 && s.IsRewound(m.Seqs[0]) {
			continue
		}
		t.History = append(t.History, m)
	}
	for _, c := range b.commands {
		t.Commands = append(t.Commands, *c)
	}
	return t
}

// assignLanes puts each span in the first lane free at its start (spans
// sorted by start), so calls that overlap in time sit side by side; a span
// with no end runs to the band's end (or its own start). It returns the
// number of lanes.
func assignLanes(spans []ToolSpan, bandEnd time.Time) int {
	order := make([]int, len(spans))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return spans[a].Start.Compare(spans[b].Start) })
	var ends []time.Time
	for _, i := range order {
		sp := &spans[i]
		end := sp.End
		if end.IsZero() {
			// Still running when the turn ended (or died): it overlaps
			// every call that started before the end.
			end = bandEnd.Add(time.Nanosecond)
		}
		if end.Before(sp.Start) {
			end = sp.Start
		}
		lane := -1
		for l, e := range ends {
			if !e.After(sp.Start) {
				lane = l
				break
			}
		}
		if lane < 0 {
			lane = len(ends)
			ends = append(ends, end)
		} else {
			ends[lane] = end
		}
		sp.Lane = lane
	}
	return len(ends)
}

func category(ev events.Event) string {
	if ev.Err != nil {
		return "invalid"
	}
	t := string(ev.Type)
	switch {
	case ev.Type == events.TypeTurnFailed || ev.Type == events.TypeErrorRecorded:
		return "error"
	case strings.HasPrefix(t, "session."):
		return "session"
	case strings.HasPrefix(t, "turn."):
		return "turn"
	case strings.HasPrefix(t, "message."):
		return "message"
	case strings.HasPrefix(t, "tool_call."):
		return "tool"
	case strings.HasPrefix(t, "distillation."):
		return "distillation"
	case strings.HasPrefix(t, "snapshot."):
		return "snapshot"
	case strings.HasPrefix(t, "recovery."), strings.HasPrefix(t, "breaker."):
		return "recovery"
	}
	return "other"
}

// resultText is the text of a tool_result's content: the string, or its
// text blocks joined.
func resultText(raw []byte) string {
	if len(raw) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var blocks []events.ContentBlock
	if json.Unmarshal(raw, &blocks) == nil {
		parts := make([]string, 0, len(blocks))
		for _, c := range blocks {
			if c.Type == events.BlockText {
				parts = append(parts, c.Text)
			} else {
				parts = append(parts, "["+c.Type+"]")
			}
		}
		return strings.Join(parts, "\n")
	}
	return string(raw)
}

// clipRunes returns s cut to n runes, and whether it was cut.
func clipRunes(s string, n int) (string, bool) {
	if utf8.RuneCountInString(s) <= n {
		return s, false
	}
	i := 0
	for j := range s {
		if i == n {
			return s[:j], true
		}
		i++
	}
	return s, false
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
