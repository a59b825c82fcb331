package projections

import (
	"testing"

	"github.com/turnstone-dev/turnstone/events"
)

// withID is an assistant message of the response msgID.
func withID(msgID string, blocks ...events.ContentBlock) *events.MessageAppended {
	m := asst(blocks...)
	m.MessageID = msgID
	return m
}

// TestResponseContinuedAfterItsResults: an importer that read a response
// cut by the end of a file records its first blocks and the result
// written between them, then, from the grown file, the rest of the
// response as a message.appended of the same message_id. The history is
// the one the model API saw, and the one the whole response gives: one
// assistant message with both tool calls, one user message with both
// results, both calls answered, no violation, the same output streak.
func TestResponseContinuedAfterItsResults(t *testing.T) {
	whole := build(t, []step{
		in("t1", started("run both")), in("t1", user(text("run both"))),
		in("t1", withID("msg_1", text("Running."), use("A", "Bash"), use("B", "Bash"))),
		in("t1", user(result("A"))), in("t1", user(result("B"))),
		in("t1", withID("msg_2", text("Done."))),
		in("t1", completed()),
	})
	pieces := build(t, []step{
		in("t1", started("run both")), in("t1", user(text("run both"))),
		in("t1", withID("msg_1", text("Running."), use("A", "Bash"))),
		in("t1", user(result("A"))),
		in("t1", withID("msg_1", use("B", "Bash"))), // the grown file: the rest of msg_1
		in("t1", user(result("B"))),
		in("t1", withID("msg_2", text("Done."))),
		in("t1", completed()),
	})
	w, p := FoldLog(whole), FoldLog(pieces)
	if p.Totals.Violations != 0 || p.Totals.Orphans != 0 || p.Totals.Messages != 4 || w.Totals.Messages != 4 {
		t.Fatalf("pieces: violations %v, %d orphans, %d messages (whole: %d)", rules(p.Violations), p.Totals.Orphans, p.Totals.Messages, w.Totals.Messages)
	}
	for i := range w.Messages {
		wm, pm := w.Messages[i], p.Messages[i]
		if wm.Role != pm.Role || len(wm.Blocks) != len(pm.Blocks) || wm.Hash != pm.Hash || wm.ToolUses != pm.ToolUses || wm.MessageID != pm.MessageID {
			t.Errorf("message %d: whole %+v, pieces %+v", i, wm, pm)
		}
	}
	if a := p.Messages[1]; a.ToolUses != 2 || a.Blocks[2].ID != "B" || a.MessageID != "msg_1" {
		t.Errorf("the continued message: %+v", a)
	}
	for _, id := range []string{"A", "B"} {
		if tc := p.toolCall(id); tc == nil || tc.Status != ToolAnswered || tc.Message != 2 {
			t.Errorf("tool call %s: %+v", id, tc)
		}
	}
	if w.Outputs.Hash != p.Outputs.Hash || w.Outputs.Count != p.Outputs.Count || w.Outputs.Message != p.Outputs.Message {
		t.Errorf("output streak: whole %+v, pieces %+v", w.Outputs, p.Outputs)
	}

	// Another response after the results is a new assistant message, as
	// is one of the same id after a user message that is not only
	// results: the model API saw the person's words in between.
	for name, next := range map[string][]step{
		"another response": {in("t1", withID("msg_9", use("B", "Bash"))), in("t1", user(result("B")))},
		"after words":      {in("t1", user(text("and B?"))), in("t1", withID("msg_1", use("B", "Bash"))), in("t1", user(result("B")))},
	} {
		steps := []step{
			in("t1", started("run both")), in("t1", user(text("run both"))),
			in("t1", withID("msg_1", text("Running."), use("A", "Bash"))),
			in("t1", user(result("A"))),
		}
		s := FoldLog(build(t, append(steps, next...)))
		if s.Messages[len(s.Messages)-2].Role != events.RoleAssistant || s.Messages[1].ToolUses != 1 {
			t.Errorf("%s: messages %+v", name, s.Messages)
		}
	}
}

// TestContinuedOutputCountsOnce: a repeated output recorded in pieces
// extends the streak exactly as the whole output does.
func TestContinuedOutputCountsOnce(t *testing.T) {
	var whole, pieces []step
	for i, turn := range []string{"t1", "t2", "t3"} {
		id := "msg_" + turn
		a, b := "A"+turn, "B"+turn
		whole = append(whole, in(turn, started("again")), in(turn, user(text("again"))),
			in(turn, withID(id, use(a, "Bash"), use(b, "Bash"))), in(turn, user(result(a))), in(turn, user(result(b))), in(turn, completed()))
		if i < 2 {
			pieces = append(pieces, whole[len(whole)-6:]...)
			continue
		}
		pieces = append(pieces, in(turn, started("again")), in(turn, user(text("again"))),
			in(turn, withID(id, use(a, "Bash"))), in(turn, user(result(a))), in(turn, withID(id, use(b, "Bash"))), in(turn, user(result(b))), in(turn, completed()))
	}
	w, p := FoldLog(build(t, whole)), FoldLog(build(t, pieces))
	if w.Outputs.Count < 2 || p.Outputs.Count != w.Outputs.Count || p.Outputs.Hash != w.Outputs.Hash || p.Outputs.Message != w.Outputs.Message {
		t.Fatalf("streak: whole %+v, pieces %+v", w.Outputs, p.Outputs)
	}
}
