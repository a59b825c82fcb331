package reconciler_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/reconciler"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// timed is one event of a turn and when the log stored it (an offset
// from the start).
type timed struct {
	at   time.Duration
	turn string
	p    events.Payload
}

// foldTimed folds events stored at start plus each one's offset.
func foldTimed(t *testing.T, start time.Time, evs ...timed) *projections.Session {
	t.Helper()
	s := &projections.Session{}
	for i, x := range evs {
		ev, err := events.NewAt(start.Add(x.at), events.NewID(), "acme", "s1", x.turn, x.p)
		if err != nil {
			t.Fatal(err)
		}
		ev.Seq, ev.Stored, ev.Source = uint64(i+1), start.Add(x.at), "urn:agent:test"
		s.Apply(ev)
	}
	return s
}

func callTool(id, name, input string) *events.MessageAppended {
	return &events.MessageAppended{Role: events.RoleAssistant, Content: []events.ContentBlock{
		{Type: events.BlockToolUse, ID: id, Name: name, Input: json.RawMessage(input)}}}
}

func toolAnswer(id string) *events.MessageAppended {
	return &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{
		{Type: events.BlockToolResult, ToolUseID: id, Content: json.RawMessage(`"ok"`)}}}
}

// abandons decides on s at start+after and returns the abandon_turn
// commands.
func abandons(s *projections.Session, p *reconciler.Policy, start time.Time, after time.Duration, activity map[string]time.Time) []recovery.Command {
	var out []recovery.Command
	for _, a := range reconciler.Decide(reconciler.Input{State: s, Now: start.Add(after), Policy: p, Live: true, Activity: activity}) {
		if a.Command != nil && a.Command.Kind == recovery.KindAbandonTurn {
			out = append(out, *a.Command)
		}
	}
	return out
}

// A turn that works (a tool call every 40 s for 5 minutes) is never
// abandoned with a deadline of 120 s: the deadline counts from its latest
// event. Silent for the deadline after its last event, it is.
func TestDeadlineCountsFromTheLatestSignOfLife(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	p, err := reconciler.ParsePolicy([]byte("turn_deadline: 120s\n"))
	if err != nil {
		t.Fatal(err)
	}
	evs := []timed{{0, "t1", &events.TurnStarted{}}}
	for i := range 8 {
		id := "toolu_" + string(rune('a'+i))
		at := time.Duration(i+1) * 40 * time.Second
		evs = append(evs, timed{at, "t1", callTool(id, "Read", `{"file_path":"x"}`)}, timed{at + time.Second, "t1", toolAnswer(id)})
	}
	last := 8*40*time.Second + time.Second
	// At any time before the next event, nothing: the turn is working.
	for n := 1; n < len(evs); n++ {
		s := foldTimed(t, start, evs[:n]...)
		if got := abandons(s, p, start, evs[n].at-time.Millisecond, nil); len(got) != 0 {
			t.Fatalf("after event %d: abandoned at %s while working: %+v", n, evs[n].at, got)
		}
	}
	s := foldTimed(t, start, evs...)
	if got := abandons(s, p, start, last+119*time.Second, nil); len(got) != 0 {
		t.Fatalf("abandoned %s after its last event: %+v", 119*time.Second, got)
	}
	got := abandons(s, p, start, last+120*time.Second, nil)
	if len(got) != 1 || !strings.Contains(got[0].Reason, "no sign of life for 2m0s (turn_deadline) since its latest event") {
		t.Fatalf("silent for the deadline: %+v, want one abandon naming the sign of life", got)
	}
	in := reconciler.Input{State: s, Now: start.Add(last), Policy: p, Live: true}
	if due := reconciler.NextDue(in); !due.Equal(start.Add(last + 120*time.Second)) {
		t.Fatalf("NextDue %s, want the deadline after the last event", due)
	}
}

// A pending Bash call that declared a timeout longer than the deadline is
// given its timeout plus tool_timeout_grace; one without is not.
func TestDeclaredToolTimeoutExtendsTheDeadline(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	p, err := reconciler.ParsePolicy([]byte("turn_deadline: 10s\ntool_deadline: 10s\ntool_timeout_grace: 5s\n"))
	if err != nil {
		t.Fatal(err)
	}
	s := foldTimed(t, start,
		timed{0, "t1", &events.TurnStarted{}},
		timed{time.Second, "t1", callTool("toolu_1", "Bash", `{"command":"make test","timeout":60000}`)})
	if tc := s.ToolCall("toolu_1"); tc == nil || tc.TimeoutMS != 60000 {
		t.Fatalf("tool call %+v, want timeout_ms 60000", tc)
	}
	if got := abandons(s, p, start, 65*time.Second, nil); len(got) != 0 {
		t.Fatalf("abandoned within the call's timeout and grace: %+v", got)
	}
	got := abandons(s, p, start, 66*time.Second, nil)
	if len(got) != 1 || !strings.Contains(got[0].Reason, "declared a timeout of 1m0s") {
		t.Fatalf("past timeout and grace: %+v", got)
	}
	// The result came: the turn's own deadline counts again.
	s2 := foldTimed(t, start,
		timed{0, "t1", &events.TurnStarted{}},
		timed{time.Second, "t1", callTool("toolu_1", "Bash", `{"command":"make test","timeout":60000}`)},
		timed{40 * time.Second, "t1", toolAnswer("toolu_1")})
	if got := abandons(s2, p, start, 49*time.Second, nil); len(got) != 0 {
		t.Fatalf("abandoned 9s after the result: %+v", got)
	}
	if got := abandons(s2, p, start, 50*time.Second, nil); len(got) != 1 {
		t.Fatalf("10s after the result: %+v, want one abandon", got)
	}
	// Without a declared timeout (Read has none; Bash without one): the deadline.
	for _, input := range []string{`{"command":"sleep 100"}`, `{"command":"x","timeout":"soon"}`} {
		s3 := foldTimed(t, start, timed{0, "t1", &events.TurnStarted{}}, timed{time.Second, "t1", callTool("toolu_1", "Bash", input)})
		if got := abandons(s3, p, start, 11*time.Second, nil); len(got) != 1 {
			t.Fatalf("%s: %+v, want one abandon at the deadline", input, got)
		}
	}
	// Codex's timeout_ms, any tool.
	s4 := foldTimed(t, start, timed{0, "t1", &events.TurnStarted{}}, timed{time.Second, "t1", callTool("call_1", "shell", `{"command":["make"],"timeout_ms":30000}`)})
	if got := abandons(s4, p, start, 35*time.Second, nil); len(got) != 0 {
		t.Fatalf("codex timeout_ms: %+v", got)
	}
}

// Activity the state does not carry (a subagent's, a runtime's claim)
// keeps a turn alive; turn_max_duration bounds a turn whatever its signs
// of life.
func TestActivityAndMaxDuration(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	p, err := reconciler.ParsePolicy([]byte("turn_deadline: 10s\ntool_deadline: 10s\nturn_max_duration: 1m\n"))
	if err != nil {
		t.Fatal(err)
	}
	s := foldTimed(t, start, timed{0, "t1", &events.TurnStarted{}}, timed{time.Second, "t1", callTool("toolu_1", "Task", `{"prompt":"look"}`)})
	act := map[string]time.Time{"t1": start.Add(30 * time.Second)}
	if got := abandons(s, p, start, 39*time.Second, act); len(got) != 0 {
		t.Fatalf("abandoned while its subagent works: %+v", got)
	}
	got := abandons(s, p, start, 40*time.Second, act)
	if len(got) != 1 || !strings.Contains(got[0].Reason, "activity outside its session") {
		t.Fatalf("10s after the subagent's last activity: %+v", got)
	}
	act["t1"] = start.Add(time.Hour)
	got = abandons(s, p, start, 60*time.Second, act)
	if len(got) != 1 || !strings.Contains(got[0].Reason, "turn_max_duration") {
		t.Fatalf("at turn_max_duration: %+v", got)
	}
	if got := abandons(s, p, start, 59*time.Second, act); len(got) != 0 {
		t.Fatalf("before turn_max_duration with a sign of life: %+v", got)
	}
}

func TestPolicyYAMLRoundTrips(t *testing.T) {
	t.Parallel()
	src := "turn_deadline: 30s\nturn_max_duration: 2h\ntool_timeout_grace: 0s\ntenants:\n  acme:\n    turn_deadline: 5m\n    orphans:\n      repair: false\n"
	p, err := reconciler.ParsePolicy([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	text, err := p.YAML()
	if err != nil {
		t.Fatal(err)
	}
	q, err := reconciler.ParsePolicy(text)
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	again, _ := q.YAML()
	if string(again) != string(text) {
		t.Fatalf("not stable:\n%s\n---\n%s", text, again)
	}
	if a := q.For("acme"); time.Duration(a.TurnDeadline) != 5*time.Minute || *a.Orphans.Repair || time.Duration(a.TurnMaxDuration) != 2*time.Hour {
		t.Fatalf("acme after a round trip: %+v", a)
	}
	if time.Duration(q.ToolTimeoutGrace) != 0 {
		t.Fatalf("a grace of 0 came back as %s", time.Duration(q.ToolTimeoutGrace))
	}
}

// A turn with a tool call pending waits tool_deadline (the tool runs, or
// the runtime waits for a person); without one, turn_deadline. A session
// stays live until its turn's deadline has passed, whatever the horizon.
func TestToolDeadlineWhileACallIsPending(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	p := reconciler.DefaultPolicy()
	waiting := foldTimed(t, start, timed{0, "t1", &events.TurnStarted{}}, timed{time.Second, "t1", callTool("toolu_1", "WebFetch", `{"url":"https://example.com"}`)})
	if got := abandons(waiting, p, start, time.Second+119*time.Minute, nil); len(got) != 0 {
		t.Fatalf("a call pending 1h59m (a person away from a permission prompt): %+v", got)
	}
	if !reconciler.Live(waiting, start.Add(time.Second+2*time.Hour), p, false) {
		t.Fatal("not live when its turn falls due: the turn would never end")
	}
	got := abandons(waiting, p, start, time.Second+2*time.Hour, nil)
	if len(got) != 1 || !strings.Contains(got[0].Reason, "tool_deadline") {
		t.Fatalf("pending 2h: %+v", got)
	}
	thinking := foldTimed(t, start, timed{0, "t1", &events.TurnStarted{}}, timed{time.Second, "t1", &events.MessageAppended{Role: events.RoleUser,
		Content: []events.ContentBlock{{Type: events.BlockText, Text: "plan it"}}}})
	if got := abandons(thinking, p, start, time.Second+9*time.Minute, nil); len(got) != 0 {
		t.Fatalf("the model silent 9 min: %+v", got)
	}
	if got := abandons(thinking, p, start, time.Second+10*time.Minute, nil); len(got) != 1 {
		t.Fatalf("the model silent 10 min: %+v, want one abandon", got)
	}
	idle := foldTimed(t, start, timed{0, "t1", &events.TurnStarted{}}, timed{time.Second, "t1", &events.TurnCompleted{}})
	if reconciler.Live(idle, start.Add(31*time.Minute), p, false) {
		t.Fatal("an idle session is live past the horizon")
	}
}
