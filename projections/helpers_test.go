package projections

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
)

const (
	testTenant  = "acme"
	testSession = "s1"
)

var epoch = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// step is one event of a test session: a payload and the turn it belongs
// to, or a ready-made event (for invalid and unknown ones).
type step struct {
	turn string
	p    events.Payload
	raw  *events.Event
}

func in(turn string, p events.Payload) step { return step{turn: turn, p: p} }
func at(p events.Payload) step              { return step{p: p} }
func rawStep(ev events.Event) step          { return step{raw: &ev} }

// build turns steps into events with sequences 1, 2, ... and times one
// second apart.
func build(tb testing.TB, steps []step) []events.Event {
	tb.Helper()
	out := make([]events.Event, 0, len(steps))
	for i, st := range steps {
		seq := uint64(i + 1)
		when := epoch.Add(time.Duration(seq) * time.Second)
		if st.raw != nil {
			ev := *st.raw
			ev.Seq = seq
			if ev.Tenant == "" && ev.Session == "" {
				ev.Tenant, ev.Session = testTenant, testSession
			}
			out = append(out, ev)
			continue
		}
		ev, err := events.NewAt(when, events.DeterministicID(when, fmt.Sprint(seq)), testTenant, testSession, st.turn, st.p)
		if err != nil {
			tb.Fatalf("build event %d: %v", seq, err)
		}
		ev.Seq = seq
		out = append(out, ev)
	}
	return out
}

func user(blocks ...events.ContentBlock) *events.MessageAppended {
	return &events.MessageAppended{Role: events.RoleUser, Content: blocks}
}

func asst(blocks ...events.ContentBlock) *events.MessageAppended {
	return &events.MessageAppended{Role: events.RoleAssistant, Content: blocks, Model: "claude-sonnet-4-5"}
}

func text(s string) events.ContentBlock { return events.ContentBlock{Type: events.BlockText, Text: s} }

func use(id, name string) events.ContentBlock {
	return events.ContentBlock{Type: events.BlockToolUse, ID: id, Name: name, Input: json.RawMessage(`{"command": "ls -la", "timeout": 30}`)}
}

func result(id string) events.ContentBlock {
	return events.ContentBlock{Type: events.BlockToolResult, ToolUseID: id, Content: json.RawMessage(`"total 0\nfile.go"`)}
}

func started(prompt string) *events.TurnStarted { return &events.TurnStarted{Prompt: prompt} }
func completed() *events.TurnCompleted          { return &events.TurnCompleted{} }

func errInfo(msg string) events.ErrorInfo {
	return events.ErrorInfo{Message: msg, Kind: events.KindTransient, Provider: "anthropic", HTTPStatus: 529, Code: "overloaded_error"}
}

// rules lists a state's violations as "seq:rule".
func rules(vs []Violation) []string {
	out := make([]string, 0, len(vs))
	for _, v := range vs {
		out = append(out, fmt.Sprintf("%d:%s", v.Seq, v.Rule))
	}
	return out
}

func mustJSON(tb testing.TB, v any) []byte {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatalf("marshal: %v", err)
	}
	return b
}

// applyLog applies ev to s as FoldLog does: when a rewind asks for a
// refold, it refolds from all (the session's whole log; the events after
// s.LastSeq are ignored).
func applyLog(tb testing.TB, s *Session, ev events.Event, all []events.Event) []Violation {
	tb.Helper()
	vs := s.Apply(ev)
	if s.NeedsRefold {
		if err := s.Refold(sliceSource(all)); err != nil {
			tb.Fatalf("refold: %v", err)
		}
	}
	return vs
}

// synth generates a realistic session of about turns turns, deterministic
// for a seed: prompts, thinking, text, tool calls with tool_call.* events
// and kilobyte results, stage events, provider errors and retries, a
// distillation every so often (inline or between turns), identical
// re-runs of failed tool calls (flaky-suspected when they pass), the same
// final answer turn after turn (an output streak), pauses, recovery
// commands (attempts, outcomes, parks), breaker changes, forks, rewinds to
// the end of an earlier turn (nested ones too), and, when anomalies is set,
// the occasional orphan, repaired orphan, late result, invalid event and
// unknown type. Sequences start at 1 and skip numbers, as a stream shared
// by many sessions does.
func synth(tb testing.TB, seed uint64, turns int, anomalies bool) []events.Event {
	tb.Helper()
	rng := newRand(seed)
	// rerun decides the re-runs: its own source, so that the rest of the
	// session is what it was before re-runs were generated.
	rerun := newRand(seed ^ 0x5eed)
	var out []events.Event
	seq := uint64(0)
	when := epoch
	add := func(turn string, p events.Payload) {
		seq += 1 + uint64(rng.IntN(3))
		when = when.Add(time.Duration(50+rng.IntN(3000)) * time.Millisecond)
		ev, err := events.NewAt(when, events.DeterministicID(when, fmt.Sprint(seq)), testTenant, testSession, turn, p)
		if err != nil {
			tb.Fatalf("synth: %v", err)
		}
		ev.Seq = seq
		out = append(out, ev)
	}
	addRaw := func(ev events.Event) {
		seq++
		ev.Seq, ev.Time, ev.ID = seq, when, events.DeterministicID(when, fmt.Sprint(seq))
		ev.Tenant, ev.Session = testTenant, testSession
		out = append(out, ev)
	}
	bigText := strings.Repeat("func main() { fmt.Println(\"hello, 世界\") }\n", 40)
	toolNames := []string{"Bash", "Read", "Edit", "Grep", "Write"}

	add("", &events.SessionStarted{Runtime: "claude-code 2.1.38", Model: "claude-sonnet-4-5", Provider: "anthropic",
		Labels: map[string]string{"cwd": "/repo", "branch": "main", "host": "dev-1"}})
	tool := 0
	var last struct { // the latest tool_use, for re-runs
		name   string
		input  json.RawMessage
		failed bool
	}
	var boundaries []uint64 // the sequences at which a turn and its aftermath ended
	breakerOpen := false
	command := func(kind string, n int) string { return fmt.Sprintf("%s-%d-%d", kind, n, seq) }
	for n := 1; n <= turns; n++ {
		turn := fmt.Sprintf("t%d", n)
		// The same prompt every turn: an answer repeated to it is a loop
		// (invariant 4's output streak compares the input answered).
		add(turn, &events.TurnStarted{Prompt: "please fix the bug in the parser", Trigger: "user", DeadlineMS: 600000})
		add(turn, user(text("please fix the bug in the parser")))
		add(turn, &events.TurnStageCompleted{Stage: events.StageContext, DurationMS: 12})
		add(turn, &events.TurnStageCompleted{Stage: events.StageHistory, DurationMS: 3})
		rounds := 1 + rng.IntN(4)
		failed := false
		for r := 0; r < rounds; r++ {
			if rng.IntN(12) == 0 {
				for k := 0; k < 1+rng.IntN(3); k++ {
					add(turn, &events.ErrorRecorded{ErrorInfo: errInfo(fmt.Sprintf("overloaded (request req_%d)", rng.IntN(1e6))), Consecutive: k + 1, Stage: events.StageExecute})
				}
			}
			calls := rng.IntN(3)
			blocks := []events.ContentBlock{{Type: events.BlockThinking, Thinking: "Let me look at the parser first.", Signature: "sig"}}
			if calls == 0 {
				blocks = append(blocks, text("Done: the parser now handles empty input."))
			}
			add(turn, &events.MessageAppended{Role: events.RoleAssistant, Content: blocks[:1], MessageID: fmt.Sprintf("msg_%d_%d", n, r), Model: "claude-sonnet-4-5"})
			if len(blocks) > 1 {
				add(turn, &events.MessageAppended{Role: events.RoleAssistant, Content: blocks[1:], MessageID: fmt.Sprintf("msg_%d_%d", n, r), Model: "claude-sonnet-4-5", StopReason: "end_turn"})
			}
			var ids []string
			for c := 0; c < calls; c++ {
				tool++
				id := fmt.Sprintf("toolu_%05d", tool)
				ids = append(ids, id)
				name := toolNames[rng.IntN(len(toolNames))]
				input := json.RawMessage(fmt.Sprintf(`{"file_path": "/repo/parser_%d.go", "limit": 200}`, c))
				if c == 0 && last.failed && rerun.IntN(2) == 0 {
					name, input = last.name, last.input // the same call again
				}
				last.name, last.input, last.failed = name, input, false
				add(turn, &events.MessageAppended{Role: events.RoleAssistant, MessageID: fmt.Sprintf("msg_%d_%d", n, r), Model: "claude-sonnet-4-5", StopReason: "tool_use",
					Content: []events.ContentBlock{{Type: events.BlockToolUse, ID: id, Name: name, Input: input}}})
				add(turn, &events.ToolCallStarted{ToolUseID: id, Name: name})
				add(turn, &events.ToolCallCompleted{ToolUseID: id, Name: name, DurationMS: int64(rng.IntN(5000))})
			}
			for i, id := range ids {
				if anomalies && rng.IntN(40) == 0 {
					continue // the process died before the result: an orphan
				}
				content, _ := json.Marshal(bigText[:200+rng.IntN(len(bigText)-200)])
				cb := events.ContentBlock{Type: events.BlockToolResult, ToolUseID: id, Content: content, IsError: rng.IntN(10) == 0}
				if i == len(ids)-1 {
					last.failed = cb.IsError
				}
				if anomalies && i == 0 && rng.IntN(60) == 0 {
					add(turn, user(text("[interrupted]"), cb)) // results not first
					continue
				}
				add(turn, user(cb))
			}
			if calls == 0 {
				break
			}
			if rng.IntN(25) == 0 { // Claude Code's inline auto-compaction
				add(turn, &events.DistillationRequested{Reason: "auto: context 92% full"})
				add(turn, &events.DistillationStarted{})
				add(turn, &events.DistillationCompleted{TokensBefore: 180000, TokensAfter: 12000, Trigger: "auto", Summary: "summary"})
				add(turn, &events.MessageAppended{Role: events.RoleUser, Meta: true, Content: []events.ContentBlock{text("This session is being continued from a previous conversation. Summary: ...")}})
			}
			if r == rounds-1 && rng.IntN(15) == 0 {
				add(turn, &events.TurnFailed{Stage: events.StageExecute, Error: errInfo("stream ended early")})
				failed = true
			}
		}
		if anomalies && !failed && rng.IntN(20) == 0 {
			// The process dies between a tool_use and its result; the
			// turn fails, and a repair_orphans command answers the orphan.
			tool++
			id := fmt.Sprintf("toolu_%05d", tool)
			last.failed = false // its result will be a repair: no run to re-run
			add(turn, &events.MessageAppended{Role: events.RoleAssistant, Model: "claude-sonnet-4-5", StopReason: "tool_use",
				Content: []events.ContentBlock{{Type: events.BlockToolUse, ID: id, Name: "Bash", Input: json.RawMessage(`{"command": "make"}`)}}})
			add(turn, &events.TurnFailed{Stage: events.StageExecute, Error: errInfo("worker killed")})
			failed = true
			cmd := command("repair_orphans", n)
			add("", &events.RecoveryAttempted{CommandID: cmd, Kind: "repair_orphans", Attempt: 1, Result: "ok", Strategy: "synthesize_error_result"})
			add("", &events.MessageAppended{Role: events.RoleUser, Synthetic: true, Content: []events.ContentBlock{
				{Type: events.BlockToolResult, ToolUseID: id, IsError: true, Content: json.RawMessage(`"interrupted: the process ended before the tool returned"`)}}})
			add("", &events.RecoveryCompleted{CommandID: cmd, Kind: "repair_orphans", Outcome: events.OutcomeRecovered, Attempts: 1})
		}
		if !failed {
			add(turn, &events.TurnStageCompleted{Stage: events.StageExecute, DurationMS: 2300})
			add(turn, &events.TurnStageCompleted{Stage: events.StageFinalize, DurationMS: 8})
			add(turn, &events.TurnCompleted{Reason: "end_turn"})
		}
		switch {
		case rng.IntN(20) == 0:
			add("", &events.DistillationRequested{Reason: "manual"})
			if rng.IntN(3) == 0 {
				add("", &events.DistillationSkipped{Reason: "user_cancelled"})
			} else {
				add("", &events.DistillationStarted{})
				add("", &events.DistillationCompleted{TokensBefore: 90000, TokensAfter: 8000, Trigger: "manual"})
				add("", &events.MessageAppended{Role: events.RoleUser, Meta: true, Content: []events.ContentBlock{text("Summary of the conversation so far.")}})
			}
		case rng.IntN(30) == 0:
			add("", &events.SessionPaused{Reason: "provider down"})
			add("", &events.SessionResumed{Reason: "provider back"})
		case rng.IntN(40) == 0:
			add("", &events.SnapshotTaken{CoversSeq: seq, Version: Version})
		}
		switch {
		case rng.IntN(25) == 0:
			breakerOpen = !breakerOpen
			from, to := "closed", "open"
			if !breakerOpen {
				from, to = "open", "closed"
			}
			add("", &events.BreakerChanged{Provider: []string{"anthropic", "bedrock"}[rng.IntN(2)], From: from, To: to, Failures: 5, Reason: "5 failures in 30s"})
		case rng.IntN(40) == 0:
			cmd := command("fork_session", n)
			add("", &events.SessionForked{ForkSession: fmt.Sprintf("s1-fork-%d", n), AtSeq: seq, CommandID: cmd})
			add("", &events.RecoveryCompleted{CommandID: cmd, Kind: "fork_session", Outcome: events.OutcomeRecovered})
		case rng.IntN(40) == 0:
			cmd := command("switch_provider", n)
			add("", &events.RecoveryAttempted{CommandID: cmd, Kind: "switch_provider", Attempt: 1, Result: "failed", Class: "transient",
				Error: &events.ErrorInfo{Message: "runtime did not answer"}})
			add("", &events.RecoveryParked{CommandID: cmd, Kind: "switch_provider", Reason: "no runtime answered", Deliveries: 5})
		}
		if len(boundaries) >= 2 && rng.IntN(20) == 0 {
			// Rewind to the end of one of the last few turns: the latest
			// one (nothing to undo) or an earlier one, possibly before an
			// earlier rewind's target (nested).
			to := boundaries[len(boundaries)-1-rng.IntN(min(len(boundaries), 6))]
			cmd := command("rewind_session", n)
			add("", &events.RecoveryAttempted{CommandID: cmd, Kind: "rewind_session", Attempt: 1, Result: "ok"})
			add("", &events.SessionRewound{ToSeq: to, Reason: "loop detected", CommandID: cmd})
			add("", &events.RecoveryCompleted{CommandID: cmd, Kind: "rewind_session", Outcome: events.OutcomeRecovered, Attempts: 1})
		}
		boundaries = append(boundaries, seq)
		if anomalies {
			switch rng.IntN(50) {
			case 0:
				addRaw(events.Event{Type: events.TypeMessageAppended, Data: json.RawMessage(`{"role":`),
					Err: &events.EventError{Tenant: testTenant, Session: testSession, ID: "x", Err: events.ErrMalformed}})
			case 1:
				addRaw(rawEvent("agent.heartbeat", turn, `{"alive":true}`))
			case 2:
				add(turn, &events.TurnCompleted{}) // a second end
			}
		}
	}
	return out
}

// rawEvent is an event of any type and data, built by hand: for unknown
// types and for data that does not fit its type.
func rawEvent(typ events.Type, turn, data string) events.Event {
	return events.Event{
		SpecVersion: events.SpecVersion,
		ID:          events.DeterministicID(epoch, string(typ)+data),
		Type:        typ,
		Source:      events.DefaultSource,
		Time:        epoch,
		Tenant:      testTenant,
		Session:     testSession,
		Turn:        turn,
		Data:        json.RawMessage(data),
	}
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }

// sampled reports whether the tests that fold the same events many times
// fold a documented sample: under the race detector (see race_test.go) and
// under -short. The full-size pass of .ci/run runs them whole, without
// the race detector and without -short.
func sampled() bool { return raceEnabled || testing.Short() }
