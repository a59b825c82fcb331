package reconciler_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/enginetest"
	"github.com/turnstone-dev/turnstone/projections"
)

// appendAll appends the events of one session in order, failing the test
// on an error.
func (e *env) appendAll(session string, steps ...st) {
	e.t.Helper()
	for _, st := range steps {
		e.append(session, st.turn, st.p)
	}
}

// held polls cond on the projector's copy of a session's state (real
// time, up to 60 s), advancing the reconciler's clock a second each round:
// for sessions too large to restore from their whole log at every poll.
// A state the projector no longer holds (idle for its IdleEvict, a minute
// of real time, while the test waited on another session) is restored
// from the log instead, as the engine would at the session's next event,
// at most every 5 s (a restore of the huge session under the race detector
// takes CPU the engine under test needs).
func (e *env) held(what string, cond func(*projections.Session) bool, session string) *projections.Session {
	e.t.Helper()
	var restored time.Time
	state := func(always bool) *projections.Session {
		if s, ok := e.Projector.Session("acme", session); ok {
			return s
		}
		if !always && time.Since(restored) < 5*time.Second {
			return nil
		}
		restored = time.Now()
		return e.state(session)
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if s := state(false); s != nil && cond(s) {
			return s
		}
		e.clock.Advance(time.Second)
		time.Sleep(50 * time.Millisecond)
	}
	s := state(true)
	e.t.Fatalf("%s: not reached; the state: paused %v (%s), %d orphans, commands %+v", what, s.Paused, s.PauseCause, s.Totals.Orphans, s.Commands)
	return nil
}

// st is one event to append: its turn and payload.
type st = struct {
	turn string
	p    events.Payload
}

func toolUse(id string) events.ContentBlock {
	return events.ContentBlock{Type: events.BlockToolUse, ID: id, Name: "Bash", Input: json.RawMessage(`{"command":"make"}`)}
}

func asstMsg(blocks ...events.ContentBlock) *events.MessageAppended {
	return &events.MessageAppended{Role: events.RoleAssistant, Content: blocks}
}

func userMsg(blocks ...events.ContentBlock) *events.MessageAppended {
	return &events.MessageAppended{Role: events.RoleUser, Content: blocks}
}

// TestHeadOfLineSessionDoesNotHoldTheOthers is issue 9's head-of-line
// session: 108 orphaned tool calls whose ids are 100 KB each, after tool
// outputs of 900 KB, beside a session whose one orphan's id is so long
// that no event can hold its repair, and four ordinary broken sessions
// with one orphan each, appended after both. The ordinary ones are
// repaired as fast as ever; the huge one is repaired in several records
// under the event limit; the unrepairable one is parked, with its reason,
// and paused; and the reconciler is not failed closed.
//
// Under the race detector (where the full size takes 11 s, 3 without
// it) and under -short, every size is an eighth: an event limit of
// 128 KiB instead of 1 MiB, ids of 12.5 KiB, outputs of 112 KiB, the
// unrepairable id of 125,000 bytes. The same records, in the same
// proportion to the limit, take the same paths (a repair split into
// several records, a tool_result that no event can hold); the full size
// runs without race or -short in CI's full-size pass.
func TestHeadOfLineSessionDoesNotHoldTheOthers(t *testing.T) {
	t.Parallel()
	k := 1 // every size is divided by k
	if raceEnabled || testing.Short() {
		k = 8
	}
	e := newEnv(t, "", events.Config{MaxEventBytes: events.DefaultMaxEventBytes / k})
	ctx := context.Background()
	died := func() st { return st{"t1", &events.TurnAbandoned{Reason: "the process died"}} }

	// The huge session: two tool calls answered with 900 KB outputs, then
	// one assistant message of 12 records of 9 tool_use blocks, each id
	// 100 KB, and the turn ends without their results.
	output, _ := json.Marshal(strings.Repeat("build output line\n", 900<<10/18/k))
	e.appendAll("huge", st{"t1", &events.TurnStarted{Prompt: "build everything"}}, st{"t1", userMsg(events.ContentBlock{Type: events.BlockText, Text: "go"})})
	for i := range 2 {
		id := fmt.Sprintf("toolu_small_%d", i)
		e.appendAll("huge", st{"t1", asstMsg(toolUse(id))},
			st{"t1", userMsg(events.ContentBlock{Type: events.BlockToolResult, ToolUseID: id, Content: output})})
	}
	for r := range 12 {
		var blocks []events.ContentBlock
		for i := range 9 {
			blocks = append(blocks, toolUse(fmt.Sprintf("toolu_%03d_%s", r*9+i, strings.Repeat("x", 100<<10/k))))
		}
		e.appendAll("huge", st{"t1", asstMsg(blocks...)})
	}
	e.appendAll("huge", died())

	// The unrepairable session: one orphan whose id leaves room in its
	// own event but not in a tool_result's.
	e.appendAll("toobig", st{"t1", &events.TurnStarted{Prompt: "go"}}, st{"t1", userMsg(events.ContentBlock{Type: events.BlockText, Text: "go"})},
		st{"t1", asstMsg(toolUse("toolu_big_" + strings.Repeat("y", 1_000_000/k)))}, died())

	// The ordinary sessions, on other partitions than the two large ones:
	// a worker runs a partition's commands one at a time, in order, so a
	// session that shares the huge one's partition waits for its repair
	// (issue 9's partition groups bound that; this test is about the
	// reconciler and the state).
	busy := map[int]bool{events.Partition("acme", "huge", e.log.Partitions()): true, events.Partition("acme", "toobig", e.log.Partitions()): true}
	var plain []string
	for i := 0; len(plain) < 4; i++ {
		if s := fmt.Sprintf("plain-%d", i); !busy[events.Partition("acme", s, e.log.Partitions())] {
			plain = append(plain, s)
		}
	}
	start := time.Now()
	for i, s := range plain {
		e.appendAll(s, st{"t1", &events.TurnStarted{Prompt: "go"}}, st{"t1", userMsg(events.ContentBlock{Type: events.BlockText, Text: "go"})},
			st{"t1", asstMsg(toolUse(fmt.Sprintf("toolu_plain_%d", i)))}, died())
	}
	repaired := func(s *projections.Session) bool {
		return s.Totals.Orphans > 0 && len(s.OrphanedToolUseIDs()) == 0 && commandOutcome(s, "repair_orphans") == events.OutcomeRecovered
	}
	for _, s := range plain {
		e.eventually(s+" repaired", time.Second, repaired, s)
	}
	t.Logf("ordinary sessions repaired in %s", time.Since(start))
	// Their usual time is well under a second; the bound leaves room for
	// a slow machine, not for waiting on the huge sessions.
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("the ordinary sessions took %s to be repaired", took)
	}

	s := e.held("the huge session repaired", repaired, "huge")
	if s.Totals.Orphans != 108 {
		t.Errorf("huge session: %d orphans, want 108", s.Totals.Orphans)
	}
	var detail string
	for _, c := range s.Commands {
		if c.Kind == "repair_orphans" {
			detail = c.Detail
		}
	}
	if !strings.HasPrefix(detail, "repaired 108 orphaned tool_use in ") {
		t.Errorf("huge session's repair: %q, want the 108 orphans repaired in several records", detail)
	}
	var synthetic int
	_ = e.log.ReadSession(ctx, "acme", "huge", events.ReadOptions{FromSeq: s.Turns[0].EndedSeq}, func(ev events.Event) error {
		if p, err := ev.Payload(); err == nil {
			if m, ok := p.(*events.MessageAppended); ok && m.Synthetic {
				synthetic++
			}
		}
		return nil
	})
	if synthetic < 2 {
		t.Errorf("the repair was written in %d records, want it split", synthetic)
	}

	s = e.held("the unrepairable session parked", func(s *projections.Session) bool {
		return s.Paused && commandOutcome(s, "repair_orphans") == "parked"
	}, "toobig")
	var park string
	var deliveries int
	for _, c := range s.Commands {
		if c.Kind == "repair_orphans" {
			park, deliveries = c.ParkReason, c.Deliveries
		}
	}
	if s.PauseCause != events.CauseParked || !strings.Contains(park, "refused") || !strings.Contains(park, "event too large") {
		t.Errorf("toobig: paused %v (%s), park reason %q", s.Paused, s.PauseCause, park)
	}
	if deliveries != 1 {
		t.Errorf("toobig: parked after %d deliveries; a refusal is parked at the first", deliveries)
	}
	if !s.Anomalous() || s.Status() != projections.StatusPaused {
		t.Errorf("toobig is not flagged: status %s, anomalous %v", s.Status(), s.Anomalous())
	}

	if err := e.rec.Healthy(); err != nil {
		t.Fatalf("the reconciler failed closed: %v", err)
	}
}

// TestRefusedCommandIsParkedForItsSessionOnly runs the reconciler with a
// command limit so small that its repair of one session is refused before
// it is sent: the reconciler parks it in that session's log (paused,
// cause parked, the reason), does not fail closed, does not issue it
// again, and goes on deciding for the other sessions.
func TestRefusedCommandIsParkedForItsSessionOnly(t *testing.T) {
	t.Parallel()
	e := &env{t: t}
	eng := enginetest.Start(t, enginetest.Options{MaxCommandBytes: 700})
	e.Engine, e.js, e.log, e.rec, e.clock, e.rt = eng, eng.JS, eng.Log, eng.Reconciler, eng.Clock, eng.Runtime
	died := st{"t1", &events.TurnAbandoned{Reason: "the process died"}}
	// A repair of four orphans with long ids is over 700 bytes; a repair
	// of one short id is not.
	e.appendAll("wide", st{"t1", &events.TurnStarted{Prompt: "go"}}, st{"t1", userMsg(events.ContentBlock{Type: events.BlockText, Text: "go"})},
		st{"t1", asstMsg(toolUse("toolu_"+strings.Repeat("a", 58)), toolUse("toolu_"+strings.Repeat("b", 58)),
			toolUse("toolu_"+strings.Repeat("c", 58)), toolUse("toolu_"+strings.Repeat("d", 58)))}, died)
	e.appendAll("narrow", st{"t1", &events.TurnStarted{Prompt: "go"}}, st{"t1", userMsg(events.ContentBlock{Type: events.BlockText, Text: "go"})},
		st{"t1", asstMsg(toolUse("toolu_1"))}, died)

	s := e.eventually("the wide repair parked", time.Second, func(s *projections.Session) bool {
		return s.Paused && commandOutcome(s, "repair_orphans") == "parked"
	}, "wide")
	if s.PauseCause != events.CauseParked || !strings.Contains(s.PauseReason, "event too large") || len(s.OrphanedToolUseIDs()) != 4 {
		t.Errorf("wide: cause %s, reason %q, orphans %v", s.PauseCause, s.PauseReason, s.OrphanedToolUseIDs())
	}
	e.eventually("the narrow one repaired", time.Second, func(s *projections.Session) bool {
		return len(s.OrphanedToolUseIDs()) == 0 && commandOutcome(s, "repair_orphans") == events.OutcomeRecovered
	}, "narrow")
	if err := e.rec.Healthy(); err != nil {
		t.Fatalf("failed closed on a refusal: %v", err)
	}
	// Judged again (a tick, a new event), the parked command is not
	// issued: nothing was ever sent for it.
	e.append("wide", "", &events.SessionResumed{Reason: "a person looked"})
	e.clock.Advance(5 * time.Second)
	time.Sleep(300 * time.Millisecond)
	if got := e.commands("wide"); len(got) != 0 {
		t.Errorf("commands issued for the refused session: %v", got)
	}
}

// TestParkAfterAFailedWriteOpensAgain: the reconciler fails closed when
// the park of a refused command cannot be written (the session's subject
// refuses new messages), and opens again once the park is written on a
// later try. A parked action is done without execute's openAgain; before,
// the reconciler then stayed closed, its rescans held, until some other
// action was written.
func TestParkAfterAFailedWriteOpensAgain(t *testing.T) {
	t.Parallel()
	e := &env{t: t}
	eng := enginetest.Start(t, enginetest.Options{MaxCommandBytes: 700})
	e.Engine, e.js, e.log, e.rec, e.clock, e.rt = eng, eng.JS, eng.Log, eng.Reconciler, eng.Clock, eng.Runtime
	ctx := context.Background()
	e.appendAll("wide", st{"t1", &events.TurnStarted{Prompt: "go"}}, st{"t1", userMsg(events.ContentBlock{Type: events.BlockText, Text: "go"})},
		st{"t1", asstMsg(toolUse("toolu_"+strings.Repeat("a", 58)), toolUse("toolu_"+strings.Repeat("b", 58)),
			toolUse("toolu_"+strings.Repeat("c", 58)), toolUse("toolu_"+strings.Repeat("d", 58)))})
	// The session's subject takes one more message (the turn's end), then
	// refuses: the park's events cannot be written.
	st0, err := e.js.Stream(ctx, events.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	saved := st0.CachedInfo().Config
	limited := saved
	limited.MaxMsgsPerSubject, limited.Discard, limited.DiscardNewPerSubject = 4, jetstream.DiscardNew, true
	if _, err := e.js.UpdateStream(ctx, limited); err != nil {
		t.Fatal(err)
	}
	e.appendAll("wide", st{"t1", &events.TurnAbandoned{Reason: "the process died"}})
	e.waitHealthy(true)
	if e.rec.Healthy() == nil {
		t.Fatal("not failed closed while the park cannot be written")
	}
	if _, err := e.js.UpdateStream(ctx, saved); err != nil {
		t.Fatal(err)
	}
	s := e.eventually("the repair parked once the subject takes messages", time.Second, func(s *projections.Session) bool {
		return s.Paused && commandOutcome(s, "repair_orphans") == "parked"
	}, "wide")
	if s.PauseCause != events.CauseParked {
		t.Errorf("cause %s, reason %q", s.PauseCause, s.PauseReason)
	}
	e.waitHealthy(false)
	if err := e.rec.Healthy(); err != nil {
		t.Fatalf("still failed closed after the park was written: %v", err)
	}
}
