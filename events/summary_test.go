package events

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestSummary(t *testing.T) {
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
	bad := Event{Err: &EventError{Session: "s", Seq: 7, Err: errors.New("broken")}}
	if got := bad.Summary(); !strings.HasPrefix(got, "INVALID") || !strings.Contains(got, "seq 7") {
		t.Errorf("invalid event summary = %q", got)
	}
}
