package events

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestSummary(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		turn string
		p    Payload
		want []string
	}{
		{"turn failed", "t1", &TurnFailed{Stage: StageHistory, Error: ErrorInfo{Message: "history\nload failed", Kind: KindLogic}}, []string{"FAILED in history", "[logic] history load failed"}},
		{"message", "", &MessageAppended{Role: RoleAssistant, Content: []ContentBlock{
			{Type: BlockText, Text: "Let me look."},
			{Type: BlockToolUse, ID: "toolu_1", Name: "Bash", Input: json.RawMessage(`{"command":"ls"}`)},
		}}, []string{"assistant:", `"Let me look."`, "tool_use Bash toolu_1"}},
		{"tool result error", "", &MessageAppended{Role: RoleUser, Content: []ContentBlock{
			{Type: BlockToolResult, ToolUseID: "toolu_1", IsError: true, Content: json.RawMessage(`[{"type":"text","text":"denied"}]`)},
		}}, []string{"tool_result toolu_1 ERROR", "denied"}},
		{"error streak", "", &ErrorRecorded{ErrorInfo: ErrorInfo{Message: "overloaded", Kind: KindTransient, HTTPStatus: 529}, Consecutive: 3}, []string{"529", "3 in a row"}},
		{"distilled", "", &DistillationCompleted{TokensBefore: 167094, Trigger: "auto"}, []string{"167094 -> 0 tokens", "(auto)"}},
		// One vocabulary: the class names what went wrong, not the kind.
		{"no runtime", "", &RecoveryAttempted{CommandID: "distill-1", Kind: "distill", Attempt: 1, Strategy: "distill", Result: AttemptFailed,
			Class: "runtime_unavailable", Error: &ErrorInfo{Message: "no runtime answers agent.ctl.t.s: nats: no responders", Kind: KindTransient}},
			[]string{"attempt 1 (distill): failed (runtime_unavailable): no runtime answers"}},
		{"not retried", "", &RecoveryCompleted{CommandID: "retry_turn-1", Kind: "retry_turn", Outcome: OutcomeFailed, Strategy: "pause", Attempts: 1,
			Detail: "retry_turn: not retried (authentication); session paused"},
			[]string{"retry_turn retry_turn-1: FAILED (strategy pause, 1 attempt(s)): retry_turn: not retried (authentication); session paused"}},
		{"abandoned", "t1", &TurnAbandoned{LastStageCompleted: StageHistory, Stage: StageExecute, Reason: "deadline"},
			[]string{"ABANDONED in execute (last stage completed: history): deadline"}},
		{"abandoned, old key", "t1", &TurnAbandoned{LastStage: StageContext, Reason: "deadline"},
			[]string{"ABANDONED in history (last stage completed: context)"}},
		{"abandoned before any stage", "t1", &TurnAbandoned{Reason: "deadline"},
			[]string{"ABANDONED in context (last stage completed: none)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := New("a", "s", tt.turn, tt.p)
			if err != nil {
				t.Fatal(err)
			}
			got := e.Summary()
			if strings.Contains(got, "\n") {
				t.Errorf("summary has a newline: %q", got)
			}
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("Summary() = %q, want it to contain %q", got, w)
				}
			}
		})
	}
	for _, tt := range tests {
		if strings.Contains(tt.name, "runtime") {
			e, _ := New("a", "s", tt.turn, tt.p)
			if strings.Contains(e.Summary(), "[transient]") {
				t.Errorf("a runtime_unavailable attempt reads as transient: %q", e.Summary())
			}
		}
	}
	bad := Event{Err: &EventError{Session: "s", Seq: 7, Err: errors.New("broken")}}
	if got := bad.Summary(); !strings.HasPrefix(got, "INVALID") || !strings.Contains(got, "seq 7") {
		t.Errorf("invalid event summary = %q", got)
	}
}
