package forensics_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/forensics"
	"github.com/turnstone-dev/turnstone/projections"
)

var t0 = time.Date(2026, 11, 22, 16, 0, 0, 0, time.UTC)

// session is a small session in the shape of a crash and its repair:
// turn 1 runs two tools in parallel and completes; turn 2 dies after its
// tool_use (the orphan is declared at its turn.failed); a repair command
// answers the orphan with a synthetic tool_result.
type session struct {
	evs []events.Event
	at  map[string]uint64 // name -> seq
}

func newSession(t *testing.T) *session {
	s := &session{at: map[string]uint64{}}
	seq := uint64(100)
	add := func(name string, dt time.Duration, turn string, p events.Payload) {
		seq += 3 // sequences of one session are sparse in the stream
		ev, err := events.NewAt(t0.Add(dt), events.NewID(), "acme", "s1", turn, p)
		if err != nil {
			t.Fatal(err)
		}
		ev.Seq = seq
		s.evs = append(s.evs, ev)
		if name != "" {
			s.at[name] = seq
		}
	}
	text := func(s string) []events.ContentBlock { return []events.ContentBlock{{Type: "text", Text: s}} }
	add("start", 0, "", &events.SessionStarted{Runtime: "refruntime 1", Model: "m1", Provider: "anthropic"})
	add("t1", time.Second, "t1", &events.TurnStarted{Prompt: "build it"})
	add("", time.Second, "t1", &events.MessageAppended{Role: events.RoleUser, Content: text("build it")})
	add("", 2*time.Second, "t1", &events.TurnStageCompleted{Stage: events.StageContext, DurationMS: 900})
	add("uses", 3*time.Second, "t1", &events.MessageAppended{Role: events.RoleAssistant, Content: []events.ContentBlock{
		{Type: "tool_use", ID: "toolu_a", Name: "Read", Input: []byte(`{"path":"a"}`)},
		{Type: "tool_use", ID: "toolu_b", Name: "Grep", Input: []byte(`{"q":"<script>alert(1)</script>"}`)},
	}})
	add("", 3*time.Second, "t1", &events.ToolCallStarted{ToolUseID: "toolu_a", Name: "Read"})
	add("", 3*time.Second+100*time.Millisecond, "t1", &events.ToolCallStarted{ToolUseID: "toolu_b", Name: "Grep"})
	add("", 5*time.Second, "t1", &events.ToolCallCompleted{ToolUseID: "toolu_a", Name: "Read", DurationMS: 2000})
	add("", 5*time.Second, "t1", &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: "tool_result", ToolUseID: "toolu_a", Content: []byte(`"a"`)}}})
	add("", 6*time.Second, "t1", &events.ToolCallCompleted{ToolUseID: "toolu_b", Name: "Grep", DurationMS: 2900})
	add("answered", 6*time.Second, "t1", &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: "tool_result", ToolUseID: "toolu_b", Content: []byte(`"b"`)}}})
	add("", 7*time.Second, "t1", &events.MessageAppended{Role: events.RoleAssistant, Content: text("done")})
	add("t1end", 7*time.Second, "t1", &events.TurnCompleted{DurationMS: 6000})
	add("t2", 10*time.Second, "t2", &events.TurnStarted{Prompt: "run the suite"})
	add("", 10*time.Second, "t2", &events.MessageAppended{Role: events.RoleUser, Content: text("run the suite")})
	add("orphan", 11*time.Second, "t2", &events.MessageAppended{Role: events.RoleAssistant, Content: []events.ContentBlock{{Type: "tool_use", ID: "toolu_c", Name: "Bash", Input: []byte(`{}`)}}})
	add("", 11*time.Second, "t2", &events.ToolCallStarted{ToolUseID: "toolu_c", Name: "Bash"})
	add("declared", 12*time.Second, "t2", &events.TurnFailed{Stage: events.StageExecute, Error: events.ErrorInfo{Message: "runtime died", Kind: events.KindUnknown}})
	add("repair", 20*time.Second, "", &events.MessageAppended{Role: events.RoleUser, Synthetic: true, Content: []events.ContentBlock{{Type: "tool_result", ToolUseID: "toolu_c", IsError: true, Content: []byte(`"lost"`)}}})
	add("attempt", 20*time.Second, "", &events.RecoveryAttempted{CommandID: "repair-1", Kind: "repair_orphans", Attempt: 1, Strategy: "repair_orphans", Result: "ok"})
	add("outcome", 20*time.Second, "", &events.RecoveryCompleted{CommandID: "repair-1", Kind: "repair_orphans", Outcome: events.OutcomeRecovered, Strategy: "repair_orphans", Attempts: 1})
	return s
}

func (s *session) until(seq uint64) []events.Event {
	var out []events.Event
	for _, ev := range s.evs {
		if seq == 0 || ev.Seq <= seq {
			out = append(out, ev)
		}
	}
	return out
}

// reader serves a session's events as the log would.
type reader []events.Event

func (r reader) ReadSession(_ context.Context, _, _ string, opts events.ReadOptions, fn func(events.Event) error) error {
	for _, ev := range r {
		if ev.Seq < opts.FromSeq || (opts.UntilSeq != 0 && ev.Seq > opts.UntilSeq) {
			continue
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
	return nil
}

func TestCompare(t *testing.T) {
	s := newSession(t)
	cases := []struct {
		name       string
		from, to   string
		status     string // from -> to
		ended      []string
		answered   []string
		messages   int
		raised     int
		resolved   int
		orphans    []string
		commands   []string
		turnsStart []string
	}{
		{"turn 1 from its tool uses to its end", "uses", "t1end", "in_turn -> idle", []string{"t1:in_flight->completed"}, []string{"toolu_a", "toolu_b"}, 2, 0, 0, nil, nil, nil},
		{"the crash", "t1end", "declared", "idle -> broken", []string{"t2:->failed"}, nil, 2, 1, 0, []string{"toolu_c:declared"}, nil, []string{"t2"}},
		{"the repair", "declared", "outcome", "broken -> idle", nil, []string{"toolu_c"}, 1, 0, 1, []string{"toolu_c:repaired"}, []string{"repair-1:->recovered"}, nil},
		{"everything", "", "", " -> idle", []string{"t1:->completed", "t2:->failed"}, []string{"toolu_a", "toolu_b", "toolu_c"}, 7, 1, 1, []string{"toolu_c:declared_and_repaired"}, []string{"repair-1:->recovered"}, []string{"t1", "t2"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			from, to := s.at[c.from], s.at[c.to]
			d, err := forensics.DiffLog(context.Background(), reader(s.evs), "acme", "s1", from, to)
			if err != nil {
				t.Fatal(err)
			}
			// The two points are the two folds.
			a, b := projections.Fold(s.until(from)), projections.Fold(s.until(to))
			if from == 0 {
				a = &projections.Session{}
			}
			if d.From.LastSeq != a.LastSeq || d.To.LastSeq != b.LastSeq || d.To.Events != b.Events || d.MessagesAdded != b.Totals.Messages-a.Totals.Messages {
				t.Errorf("points %+v %+v against folds %d %d", d.From, d.To, a.LastSeq, b.LastSeq)
			}
			if got := d.From.Status + " -> " + d.To.Status; got != c.status && !(from == 0 && strings.HasSuffix(got, strings.TrimPrefix(c.status, " "))) {
				t.Errorf("status %q, want %q", got, c.status)
			}
			var ended, answered, orphans, commands, started []string
			for _, x := range d.TurnsEnded {
				ended = append(ended, x.ID+":"+x.Before+"->"+x.After)
			}
			for _, x := range d.ToolCallsAnswered {
				answered = append(answered, x.ToolUseID)
			}
			for _, x := range d.Orphans {
				orphans = append(orphans, x.ToolUseID+":"+x.Change)
			}
			for _, x := range d.Commands {
				commands = append(commands, x.ID+":"+x.Before+"->"+x.After)
			}
			for _, x := range d.TurnsStarted {
				started = append(started, x.ID)
			}
			check := func(what string, got, want []string) {
				if !slices.Equal(got, want) {
					t.Errorf("%s %v, want %v", what, got, want)
				}
			}
			check("ended", ended, c.ended)
			check("answered", answered, c.answered)
			check("orphans", orphans, c.orphans)
			check("commands", commands, c.commands)
			check("started", started, c.turnsStart)
			if d.MessagesAdded != c.messages || d.RaisedCount != c.raised || d.ResolvedCount != c.resolved || len(d.Raised) != c.raised || len(d.Resolved) != c.resolved {
				t.Errorf("messages %d raised %d/%d resolved %d/%d, want %d %d %d", d.MessagesAdded, d.RaisedCount, len(d.Raised), d.ResolvedCount, len(d.Resolved), c.messages, c.raised, c.resolved)
			}
		})
	}
	if _, err := forensics.DiffLog(context.Background(), reader(s.evs), "acme", "s1", 200, 150); err == nil {
		t.Error("a range from after to was accepted")
	}
}

func TestTimeline(t *testing.T) {
	s := newSession(t)
	tl, err := forensics.BuildTimeline(context.Background(), reader(s.evs), "acme", "s1", 0, forensics.TimelineConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if len(tl.Events) != len(s.evs) || len(tl.Turns) != 2 {
		t.Fatalf("%d events, %d bands", len(tl.Events), len(tl.Turns))
	}
	t1, t2 := tl.Turns[0], tl.Turns[1]
	if t1.Status != "completed" || len(t1.Stages) != 1 || len(t1.Tools) != 2 || t1.Lanes != 2 {
		t.Errorf("turn 1: %+v", t1)
	}
	if a := t1.Tools[0]; a.Name != "Read" || a.DurationMS != 2000 || a.Status != "answered" || a.Lane == t1.Tools[1].Lane {
		t.Errorf("turn 1 tools side by side: %+v", t1.Tools)
	}
	if t2.Status != "failed" || len(t2.Tools) != 1 || t2.Tools[0].Status != "repaired" || t2.Tools[0].DeclaredSeq != s.at["declared"] {
		t.Errorf("turn 2: %+v", t2)
	}
	// The orphan is marked at the event that declared it.
	for _, it := range tl.Events {
		hasOrphan := slices.ContainsFunc(it.Anomalies, func(v projections.Violation) bool { return v.Rule == projections.RuleToolUseWithoutResult })
		if hasOrphan != (it.Seq == s.at["declared"]) {
			t.Errorf("seq %d %s: anomaly %v", it.Seq, it.Type, it.Anomalies)
		}
	}
	// The history as the model sees it: records of one role merged, the
	// repair marked synthetic.
	var roles []string
	for _, m := range tl.History {
		r := m.Role
		if m.Synthetic {
			r += "*"
		}
		roles = append(roles, r)
	}
	if strings.Join(roles, " ") != "user assistant user assistant user assistant user*" {
		t.Errorf("history roles %v", roles)
	}
	if len(tl.Commands) != 1 || tl.Commands[0].Outcome != string(events.OutcomeRecovered) || len(tl.Commands[0].Attempts) != 1 {
		t.Errorf("commands %+v", tl.Commands)
	}

	// Until the event before the repair: broken, the orphan open, no
	// command, no synthetic message; the tool_use record marked orphaned.
	before, err := forensics.BuildTimeline(context.Background(), reader(s.evs), "acme", "s1", s.at["repair"]-1, forensics.TimelineConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if before.State.Status() != projections.StatusBroken || len(before.Commands) != 0 || before.Turns[1].Tools[0].Status != "orphaned" {
		t.Errorf("before the repair: status %s, commands %d, tool %+v", before.State.Status(), len(before.Commands), before.Turns[1].Tools[0])
	}
	for _, it := range before.Events {
		if it.Seq == s.at["orphan"] && !slices.Equal(it.Orphaned, []string{"toolu_c"}) {
			t.Errorf("the tool_use record is not marked orphaned: %+v", it)
		}
	}
	for _, m := range before.History {
		if m.Synthetic {
			t.Error("a synthetic message before the repair")
		}
	}

	// Bounds: a small window keeps the latest events and counts the rest.
	small, err := forensics.BuildTimeline(context.Background(), reader(s.evs), "acme", "s1", 0, forensics.TimelineConfig{MaxEvents: 4, MaxTurns: 1, MaxHistory: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(small.Events) > 5 || small.EventsBefore+len(small.Events) != len(s.evs) || len(small.Turns) > 1 || len(small.History) > 2 {
		t.Errorf("bounds: %d events (+%d before), %d turns, %d messages", len(small.Events), small.EventsBefore, len(small.Turns), len(small.History))
	}
}
