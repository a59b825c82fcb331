package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/turnstone-dev/turnstone/events"
)

// benchTenant is the tenant of every synthetic session.
const benchTenant = "bench"

// eventBytes is the encoded size the workload pads its events to.
const eventBytes = 500

// turnLen is how many events one synthetic turn has (see turnEvent).
const turnLen = 6

// cleanSentences and needleSentences fill the text of the synthetic
// events. One event in four (by its seed) starts with a needle sentence,
// whose words pass the masking prefilter ("token", "through"), as about a
// quarter of the records of the shipped Claude Code transcripts do; none is
// a secret, so masking replaces nothing.
var (
	cleanSentences = []string{
		"I'll read the configuration file first and then run the test suite again. ",
		"The handler returns early when the request has no body, so the counter is never updated. ",
		"The build passes now; the failing case was an off-by-one in the pagination cursor. ",
		"Next I will add a table test for the empty input and for a single element. ",
		"The logs show the worker restarted twice while the queue was draining. ",
		"This function is only called from the command line entry point, not from the server. ",
	}
	needleSentences = []string{
		"Let me check how the retry loop refreshes the token before it calls the API again. ",
		"I walked through the migration and the new column is nullable, as the schema expects. ",
	}
)

// filler returns text of exactly n bytes for the event of the given seed.
func filler(n, seed int) string {
	if n <= 0 {
		return ""
	}
	var b strings.Builder
	if seed%4 == 0 {
		b.WriteString(needleSentences[(seed/4)%len(needleSentences)])
	}
	for i := seed; b.Len() < n; i++ {
		b.WriteString(cleanSentences[i%len(cleanSentences)])
	}
	return b.String()[:n]
}

// sessionName is the session token of the i-th synthetic session.
func sessionName(prefix string, i int) string { return fmt.Sprintf("%s%06d", prefix, i) }

// turnID is the turn token of a session's t-th turn.
func turnID(t int) string { return fmt.Sprintf("t%d", t) }

// mustJSON encodes v, which the workload builds from strings it makes
// itself (always encodable): a failure is a bug of the workload.
func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("bench workload: %v", err))
	}
	return b
}

// turnEvent builds step k (0..turnLen-1) of turn t of a session: turn.started,
// the user's prompt, an assistant tool_use, the user's tool_result, the
// assistant's answer, turn.completed. Every event but turn.completed is
// padded to eventBytes encoded (turn.completed has no free text: about 240
// bytes); seed picks its text (see filler). The id is a fresh ULID.
func turnEvent(session string, t, k, seed int, at time.Time) events.Event {
	turn := turnID(t)
	toolID := fmt.Sprintf("toolu_%s_%d", session, t)
	var p events.Payload
	// pad returns how long the text must be for the event to encode to
	// eventBytes, given the payload with a one-byte text (so that the
	// field, which may be omitted when empty, is counted).
	pad := func(p events.Payload) int {
		ev, _ := events.NewAt(at, events.NewID(), benchTenant, session, turn, p)
		b, _ := ev.Encode()
		return eventBytes - len(b) + 1
	}
	switch k {
	case 0:
		tp := &events.TurnStarted{Trigger: "user", Prompt: "x"}
		tp.Prompt = filler(pad(tp), seed)
		p = tp
	case 1:
		m := &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: events.BlockText, Text: "x"}}}
		m.Content[0].Text = filler(pad(m), seed)
		p = m
	case 2:
		m := &events.MessageAppended{Role: events.RoleAssistant, Model: "claude-sonnet-4-5", MessageID: "msg_" + session + turn,
			Content: []events.ContentBlock{{Type: events.BlockToolUse, ID: toolID, Name: "Bash", Input: json.RawMessage(`{"command":"go test ./...","description":"x"}`)}}}
		m.Content[0].Input = mustJSON(map[string]string{"command": "go test ./...", "description": filler(pad(m), seed)})
		p = m
	case 3:
		m := &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: events.BlockToolResult, ToolUseID: toolID, Content: json.RawMessage(`"x"`)}}}
		m.Content[0].Content = mustJSON(filler(pad(m), seed))
		p = m
	case 4:
		m := &events.MessageAppended{Role: events.RoleAssistant, Model: "claude-sonnet-4-5", MessageID: "msg_" + session + turn + "b", StopReason: "end_turn",
			Content: []events.ContentBlock{{Type: events.BlockText, Text: "x"}}}
		m.Content[0].Text = filler(pad(m), seed)
		p = m
	default:
		p = &events.TurnCompleted{Reason: "end_turn", DurationMS: 4200}
	}
	ev, err := events.NewAt(at, events.NewID(), benchTenant, session, turn, p)
	if err != nil {
		panic(err) // the payloads above always encode
	}
	return ev
}

// spreadEvents builds n events round-robin over sessions sessions named
// prefix000000...: event j belongs to session j%sessions and is step
// (j/sessions)%turnLen of turn (j/sessions)/turnLen of it, so each session's
// events form whole, valid turns in order. Sessions start with turn.started
// (no session.started: the contract does not need it).
func spreadEvents(prefix string, n, sessions int) []events.Event {
	at := time.Now().UTC()
	evs := make([]events.Event, n)
	for j := range evs {
		i, r := j%sessions, j/sessions
		evs[j] = turnEvent(sessionName(prefix, i), r/turnLen, r%turnLen, j, at)
	}
	return evs
}

// freshCopy returns evs with new ids, so that appending them again is not
// dropped as a duplicate of the first append within the duplicate window.
func freshCopy(evs []events.Event) []events.Event {
	out := make([]events.Event, len(evs))
	copy(out, evs)
	for i := range out {
		out[i].ID = events.NewID()
	}
	return out
}

// sessionEvents builds the n events of one long session: whole turns, and
// every distillEvery events (0: never) a distillation (started and
// completed, over the history so far, between two turns), as a runtime
// compacts a context window that fills up.
func sessionEvents(session string, n, distillEvery int) []events.Event {
	at := time.Now().UTC()
	evs := make([]events.Event, 0, n)
	sinceDistill := 0
	for t := 0; len(evs) < n; t++ {
		if distillEvery > 0 && sinceDistill >= distillEvery && len(evs)+2 <= n {
			for _, p := range []events.Payload{
				&events.DistillationStarted{},
				&events.DistillationCompleted{TokensBefore: 180000, TokensAfter: 12000, Trigger: "auto", Summary: filler(300, t)},
			} {
				ev, _ := events.NewAt(at, events.NewID(), benchTenant, session, "", p)
				evs = append(evs, ev)
			}
			sinceDistill = 0
		}
		for k := 0; k < turnLen && len(evs) < n; k++ {
			evs = append(evs, turnEvent(session, t, k, len(evs), at))
			sinceDistill++
		}
	}
	return evs
}

// idleSession builds the events of one short, idle session: session.started
// and one completed turn with a short prompt and answer.
func idleSession(session string, at time.Time) []events.Event {
	turn := turnID(0)
	ps := []events.Payload{
		&events.SessionStarted{Runtime: "bench", Model: "claude-sonnet-4-5", Provider: "anthropic"},
		&events.TurnStarted{Prompt: "fix the failing test", Trigger: "user"},
		&events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: events.BlockText, Text: "fix the failing test"}}},
		&events.MessageAppended{Role: events.RoleAssistant, Model: "claude-sonnet-4-5", StopReason: "end_turn",
			Content: []events.ContentBlock{{Type: events.BlockText, Text: "Done: the test expected the old error text."}}},
		&events.TurnCompleted{Reason: "end_turn", DurationMS: 3100},
	}
	evs := make([]events.Event, len(ps))
	for i, p := range ps {
		t := turn
		if i == 0 {
			t = ""
		}
		ev, err := events.NewAt(at, events.NewID(), benchTenant, session, t, p)
		if err != nil {
			panic(err)
		}
		evs[i] = ev
	}
	return evs
}

// encodeAll runs what Log.Append does to each event before it publishes it
// (Validate, Mask, Encode) and returns the bodies: the bytes the raw
// JetStream baseline publishes.
func encodeAll(evs []events.Event) ([][]byte, error) {
	bodies := make([][]byte, len(evs))
	for i := range evs {
		ev := evs[i]
		if err := events.Validate(&ev); err != nil {
			return nil, fmt.Errorf("workload event %d: %w", i, err)
		}
		events.Mask(&ev)
		b, err := ev.Encode()
		if err != nil {
			return nil, err
		}
		bodies[i] = b
	}
	return bodies, nil
}

// meanSize is the mean length of bodies.
func meanSize(bodies [][]byte) float64 {
	if len(bodies) == 0 {
		return 0
	}
	n := 0
	for _, b := range bodies {
		n += len(b)
	}
	return float64(n) / float64(len(bodies))
}
