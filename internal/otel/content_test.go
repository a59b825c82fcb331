package otel

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

const secret = "sk-ant-api03-AbCdEf0123456789_xyz-QQ"

// seedSession appends a session whose every text (the prompt, the
// assistant's text and thinking, a tool's input and its result) holds a
// marker, and the prompt and the tool's result a secret.
func seedSession(t *testing.T, log *events.Log, tenant string) {
	t.Helper()
	at := time.Date(2026, 2, 19, 10, 0, 0, 0, time.UTC)
	n := 0
	ev := func(turn string, p events.Payload) events.Event {
		n++
		e, err := events.NewAt(at.Add(time.Duration(n)*time.Second), events.NewID(), tenant, "s1", turn, p)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	input, _ := json.Marshal(map[string]string{"command": "grep MARKER-input ."})
	result, _ := json.Marshal("MARKER-result: token " + secret)
	evs := []events.Event{
		ev("", &events.SessionStarted{Runtime: "claude-code 2.1.39", Provider: "anthropic", Model: "claude-sonnet-4"}),
		ev("t1", &events.TurnStarted{Prompt: "MARKER-prompt use " + secret, Trigger: "user"}),
		ev("t1", &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: "text", Text: "MARKER-user use " + secret}}}),
		ev("t1", &events.MessageAppended{Role: events.RoleAssistant, MessageID: "msg_1", Model: "claude-sonnet-4", StopReason: "tool_use",
			Usage: &events.Usage{InputTokens: 10, OutputTokens: 5, CacheReadTokens: 100},
			Content: []events.ContentBlock{{Type: "thinking", Thinking: "MARKER-thinking"}, {Type: "text", Text: "MARKER-text"},
				{Type: "tool_use", ID: "toolu_1", Name: "Bash", Input: input}}}),
		ev("t1", &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: "tool_result", ToolUseID: "toolu_1", Content: result}}}),
		ev("t1", &events.MessageAppended{Role: events.RoleAssistant, MessageID: "msg_2", Model: "claude-sonnet-4", StopReason: "end_turn",
			Usage: &events.Usage{InputTokens: 20, OutputTokens: 7}, Content: []events.ContentBlock{{Type: "text", Text: "MARKER-answer"}}}),
		ev("t1", &events.TurnCompleted{}),
	}
	if _, err := log.Append(context.Background(), evs); err != nil {
		t.Fatal(err)
	}
}

// values returns every attribute value of the spans and their events.
func values(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		for _, kv := range s.Attributes {
			out = append(out, kv.Value.Emit())
		}
		for _, e := range s.Events {
			for _, kv := range e.Attributes {
				out = append(out, kv.Value.Emit())
			}
		}
		out = append(out, s.Name, s.Status.Description)
	}
	return out
}

// TestContentIsOptIn: with capture off (the default) no message text is
// in any attribute; with it on, the input and output messages, the
// prompt and the tool's arguments and result are there, and the seeded
// secret arrives masked, as the log stores it.
func TestContentIsOptIn(t *testing.T) {
	t.Parallel()
	log := newLog(t)
	seedSession(t, log, "content")
	sessions := sessionRefs(t, log, "content")

	off, err := ConfigFromEnv(func(string) string { return "" })
	if err != nil || off.Map.CaptureContent {
		t.Fatalf("default config: %+v %v", off, err)
	}
	spans := backfill(t, log, sessions, BackfillConfig{Map: off.Map})
	if len(spans) != 4 {
		t.Fatalf("%d spans, want a turn, two chats and a tool", len(spans))
	}
	for _, v := range values(spans) {
		if strings.Contains(v, "MARKER") || strings.Contains(v, secret) || strings.Contains(v, "REDACTED") {
			t.Errorf("message text in an attribute with capture off: %q", v)
		}
	}

	on, err := ConfigFromEnv(func(k string) string {
		if k == EnvCaptureContent {
			return "true"
		}
		return ""
	})
	if err != nil || !on.Map.CaptureContent {
		t.Fatalf("capture config: %+v %v", on, err)
	}
	spans = backfill(t, log, sessions, BackfillConfig{Map: on.Map})
	all := strings.Join(values(spans), "\n")
	for _, m := range []string{"MARKER-prompt", "MARKER-user", "MARKER-thinking", "MARKER-text", "MARKER-input", "MARKER-result", "MARKER-answer"} {
		if !strings.Contains(all, m) {
			t.Errorf("capture on: %s is in no attribute", m)
		}
	}
	if strings.Contains(all, secret) {
		t.Fatal("the secret arrived unmasked")
	}
	if strings.Count(all, "[REDACTED]") < 2 {
		t.Errorf("the secret did not arrive masked:\n%s", all)
	}
	for _, s := range spans {
		for _, k := range []string{string(KeyInputMessages), string(KeyOutputMessages)} {
			v := attr(s, attrKey(k))
			if v == "" {
				continue
			}
			var msgs []struct {
				Role  string           `json:"role"`
				Parts []map[string]any `json:"parts"`
			}
			if err := json.Unmarshal([]byte(v), &msgs); err != nil || len(msgs) == 0 || msgs[0].Role == "" || len(msgs[0].Parts) == 0 {
				t.Errorf("%s of %q is not the conventions' message list: %v %s", k, s.Name, err, v)
			}
		}
	}
	chat := byOp(spans)[OpChat]
	if len(chat) != 2 || !hasAttr(chat[0], KeyInputMessages) || !hasAttr(chat[0], KeyOutputMessages) {
		t.Fatalf("chat spans: %v", chat)
	}
	// The usage: every input token, cached ones included.
	if got := attrInt(chat[0], KeyInputTokens); got != 110 || attrInt(chat[0], KeyCacheReadTokens) != 100 {
		t.Errorf("input tokens %d, cache read %d; want 110, 100", got, attrInt(chat[0], KeyCacheReadTokens))
	}
}
