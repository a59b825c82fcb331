package otel

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// script appends events of one session, a second apart.
type script struct {
	t               *testing.T
	log             *events.Log
	tenant, session string
	at              time.Time
}

func (s *script) add(turn string, ps ...events.Payload) []events.Event {
	s.t.Helper()
	var evs []events.Event
	for _, p := range ps {
		s.at = s.at.Add(time.Second)
		e, err := events.NewAt(s.at, events.NewID(), s.tenant, s.session, turn, p)
		if err != nil {
			s.t.Fatal(err)
		}
		evs = append(evs, e)
	}
	if _, err := s.log.Append(context.Background(), evs); err != nil {
		s.t.Fatal(err)
	}
	return evs
}

func one(t *testing.T, spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d spans named %q, want 1; spans: %v", len(found), name, names(spans))
	}
	return found[0]
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

func eventNamed(s tracetest.SpanStub, name string) bool {
	for _, e := range s.Events {
		if e.Name == name {
			return true
		}
	}
	return false
}

// TestOrphanRepairAndFailures: a crash mid-tool ends in an abandoned turn
// (Error, turn_abandoned), an orphaned tool (Error, its anomaly event at
// the moment the turn's end declared it) and the repair's recovery span
// under it with its outcome; a failed turn says its provider's error
// code; a model call that failed is a chat span with status Error.
func TestOrphanRepairAndFailures(t *testing.T) {
	t.Parallel()
	log := newLog(t)
	s := &script{t: t, log: log, tenant: "map", session: "crash", at: time.Date(2026, 2, 19, 10, 0, 0, 0, time.UTC)}
	input, _ := json.Marshal(map[string]string{"path": "a"})
	s.add("", &events.SessionStarted{Runtime: "refruntime 1", Provider: "bedrock"})
	s.add("t1", &events.TurnStarted{Prompt: "go", Trigger: "user"},
		&events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: "text", Text: "go"}}},
		&events.MessageAppended{Role: events.RoleAssistant, MessageID: "msg_1", Model: "claude-x", Usage: &events.Usage{InputTokens: 3, OutputTokens: 4},
			Content: []events.ContentBlock{{Type: "tool_use", ID: "toolu_a", Name: "Read", Input: input}}})
	// The runtime died: the turn is abandoned, which declares the orphan.
	abandoned := s.add("t1", &events.TurnAbandoned{Reason: "deadline passed", LastStageCompleted: "history", Stage: "execute"})
	// A worker repairs it: the synthetic result, then the command's
	// attempt and outcome.
	lost, _ := json.Marshal("lost")
	s.add("", &events.MessageAppended{Role: events.RoleUser, Synthetic: true, Content: []events.ContentBlock{{Type: "tool_result", ToolUseID: "toolu_a", IsError: true, Content: lost}}},
		&events.RecoveryAttempted{CommandID: "repair_orphans-1", Kind: "repair_orphans", Attempt: 1, Strategy: "repair_orphans", Result: events.AttemptOK},
		&events.RecoveryCompleted{CommandID: "repair_orphans-1", Kind: "repair_orphans", Outcome: events.OutcomeRecovered, Attempts: 1, Detail: "repaired 1 orphaned tool_use"})
	// A turn whose model call failed, then the turn.
	s.add("t2", &events.TurnStarted{Prompt: "again"},
		&events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: "text", Text: "again"}}},
		&events.ErrorRecorded{ErrorInfo: events.ErrorInfo{Message: "overloaded", Kind: events.KindTransient, Provider: "anthropic", HTTPStatus: 529, Code: "overloaded_error"}, Consecutive: 1},
		&events.TurnFailed{Stage: "execute", Error: events.ErrorInfo{Message: "overloaded", Kind: events.KindTransient, HTTPStatus: 529, Code: "overloaded_error"}})

	spans := backfill(t, log, sessionRefs(t, log, "map"), BackfillConfig{})
	var turn1, turn2 tracetest.SpanStub
	for _, sp := range byOp(spans)[OpInvokeAgent] {
		switch attr(sp, KeyTurnID) {
		case "t1":
			turn1 = sp
		case "t2":
			turn2 = sp
		}
	}
	if turn1.Name != "invoke_agent refruntime" || turn2.Name != turn1.Name {
		t.Fatalf("turn spans: %v", names(spans))
	}
	if turn1.Status.Code != codes.Error || attr(turn1, KeyErrorType) != ErrTurnAbandoned || attr(turn1, KeyTurnStage) != "execute" {
		t.Errorf("abandoned turn: status %v, error.type %q, stage %q", turn1.Status, attr(turn1, KeyErrorType), attr(turn1, KeyTurnStage))
	}
	if attr(turn1, KeyProviderName) != "aws.bedrock" {
		t.Errorf("provider %q, want aws.bedrock", attr(turn1, KeyProviderName))
	}
	tool := one(t, spans, "execute_tool Read")
	if tool.Status.Code != codes.Error || attr(tool, KeyErrorType) != ErrOrphan || attr(tool, KeyToolCallID) != "toolu_a" {
		t.Errorf("orphan's span: status %v, error.type %q", tool.Status, attr(tool, KeyErrorType))
	}
	if !eventNamed(tool, EventAnomaly) || !tool.EndTime.Equal(abandoned[0].Time) {
		t.Errorf("orphan's span: events %v, end %s, want its anomaly at the turn's end %s", tool.Events, tool.EndTime, abandoned[0].Time)
	}
	for _, e := range tool.Events {
		if e.Name == EventAnomaly && !e.Time.Equal(abandoned[0].Time) {
			t.Errorf("anomaly at %s, the turn ended at %s", e.Time, abandoned[0].Time)
		}
	}
	if tool.Parent.SpanID() != turn1.SpanContext.SpanID() || tool.SpanContext.TraceID() != turn1.SpanContext.TraceID() {
		t.Error("the tool's span is not under its turn")
	}
	repair := one(t, spans, "recovery repair_orphans")
	if repair.Parent.SpanID() != tool.SpanContext.SpanID() || repair.SpanContext.TraceID() != tool.SpanContext.TraceID() {
		t.Errorf("the repair's span is not under the orphan's")
	}
	if attr(repair, KeyOutcome) != string(events.OutcomeRecovered) || repair.Status.Code == codes.Error || !eventNamed(repair, EventResolved) {
		t.Errorf("repair span: outcome %q status %v events %v", attr(repair, KeyOutcome), repair.Status, repair.Events)
	}
	for _, e := range repair.Events {
		if e.Name == EventResolved {
			for _, kv := range e.Attributes {
				if kv.Key == KeyRule && kv.Value.AsString() != string(projections.RuleToolUseWithoutResult) {
					t.Errorf("resolved %s", kv.Value.AsString())
				}
			}
		}
	}

	if attr(turn2, KeyOperationName) != OpInvokeAgent || attr(turn2, KeyErrorType) != "overloaded_error" || turn2.Status.Code != codes.Error {
		t.Errorf("failed turn: %q error.type %q status %v", turn2.Name, attr(turn2, KeyErrorType), turn2.Status)
	}
	var failedCall tracetest.SpanStub
	for _, s := range byOp(spans)[OpChat] {
		if s.Status.Code == codes.Error {
			failedCall = s
		}
	}
	if attr(failedCall, KeyErrorType) != "overloaded_error" || !eventNamed(failedCall, EventException) || failedCall.Parent.SpanID() != turn2.SpanContext.SpanID() {
		t.Errorf("failed model call: %q error.type %q events %v", failedCall.Name, attr(failedCall, KeyErrorType), failedCall.Events)
	}
	// Two turns, two traces; every span carries the three attributes.
	if turn1.SpanContext.TraceID() == turn2.SpanContext.TraceID() {
		t.Error("two turns share a trace")
	}
	for _, sp := range spans {
		if attr(sp, KeyOperationName) == "" || attr(sp, KeyProviderName) == "" || attr(sp, KeyConversationID) != "map/crash" ||
			attr(sp, KeySessionID) != "map/crash" || attr(sp, KeyOpenInferenceKind) == "" {
			t.Errorf("span %q: %v", sp.Name, sp.Attributes)
		}
	}
}

// TestSidechainWithoutParent: a subagent whose parent is not in the log
// is a trace of its own, grouped with its parent's session.
func TestSidechainWithoutParent(t *testing.T) {
	t.Parallel()
	log := newLog(t)
	s := &script{t: t, log: log, tenant: "side", session: "p_agent-1", at: time.Date(2026, 2, 19, 10, 0, 0, 0, time.UTC)}
	s.add("", &events.SessionStarted{Kind: "subagent", ParentSession: "p", ParentToolUseID: "toolu_missing", Labels: map[string]string{"subagent_type": "Explore"}})
	s.add("t1", &events.TurnStarted{Prompt: "look"}, &events.TurnCompleted{})
	spans := backfill(t, log, sessionRefs(t, log, "side"), BackfillConfig{})
	if len(spans) != 1 || spans[0].Parent.SpanID().IsValid() {
		t.Fatalf("spans %v", names(spans))
	}
	if attr(spans[0], KeySessionID) != "side/p" || attr(spans[0], KeyAgentName) != "Explore" || spans[0].Name != "invoke_agent Explore" {
		t.Errorf("subagent turn: %q session.id %q agent %q", spans[0].Name, attr(spans[0], KeySessionID), attr(spans[0], KeyAgentName))
	}
}

func TestProviderName(t *testing.T) {
	for _, c := range []struct{ provider, model, want string }{
		{"anthropic", "", "anthropic"},
		{"Bedrock", "", "aws.bedrock"},
		{"vertex", "", "gcp.vertex_ai"},
		{"", "claude-sonnet-4", "anthropic"},
		{"", "gpt-5-codex", "openai"},
		{"", "o3-mini", "openai"},
		{"", "gemini-2.5", "gcp.gemini"},
		{"", "", "unknown"},
		{"groq", "llama", "groq"},
	} {
		if got := ProviderName(c.provider, c.model); got != c.want {
			t.Errorf("ProviderName(%q, %q) = %q, want %q", c.provider, c.model, got, c.want)
		}
	}
}
