package projections

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/turnstone-dev/turnstone/events"
)

// BenchmarkFold folds a realistic synthetic session (200 turns: prompts,
// thinking, tool calls with kilobyte results, stages, errors,
// distillations, recovery records, rewinds) and reports events per second.
func BenchmarkFold(b *testing.B) {
	evs := synth(b, 42, 200, true)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		FoldLog(evs)
	}
	b.ReportMetric(float64(b.N*len(evs))/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(len(evs)), "events/op")
}

// BenchmarkFoldStored is the client's side of the fold figure of cmd/bench,
// without the server: stored bodies of whole turns (a prompt, a tool_use,
// its result, an answer, about 500 bytes each) round robin over 2,000
// sessions, each decoded (events.DecodeStored) and applied to its
// session's state. It reports events per second and the bytes and
// allocations per event, which the garbage collector pays for.
func BenchmarkFoldStored(b *testing.B) {
	const sessions, turns = 2000, 2
	text := strings.Repeat("The handler returns early when the request has no body, so the counter is never updated. ", 5)[:400]
	var bodies [][]byte
	var subjects []string
	at := epoch
	for t := 0; t < turns; t++ {
		turn := fmt.Sprintf("t%d", t)
		for k := 0; k < 6; k++ {
			for i := 0; i < sessions; i++ {
				session := fmt.Sprintf("s%06d", i)
				tool := fmt.Sprintf("toolu_%s_%d", session, t)
				var p events.Payload
				switch k {
				case 0:
					p = &events.TurnStarted{Trigger: "user", Prompt: text}
				case 1:
					p = user(events.ContentBlock{Type: events.BlockText, Text: text})
				case 2:
					in, _ := json.Marshal(map[string]string{"command": "go test ./...", "description": text})
					p = asst(events.ContentBlock{Type: events.BlockToolUse, ID: tool, Name: "Bash", Input: in})
				case 3:
					c, _ := json.Marshal(text)
					p = user(events.ContentBlock{Type: events.BlockToolResult, ToolUseID: tool, Content: c})
				case 4:
					p = asst(events.ContentBlock{Type: events.BlockText, Text: text})
				default:
					p = &events.TurnCompleted{Reason: "end_turn", DurationMS: 4200}
				}
				ev, err := events.NewAt(at, events.NewID(), testTenant, session, turn, p)
				if err != nil {
					b.Fatal(err)
				}
				body, err := ev.Encode()
				if err != nil {
					b.Fatal(err)
				}
				bodies = append(bodies, body)
				subjects = append(subjects, events.StoredEventSubject(3, testTenant, session))
			}
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	for b.Loop() {
		states := make(map[string]*Session, sessions)
		for i, body := range bodies {
			ev := events.DecodeStored(subjects[i], uint64(i+1), body)
			s := states[ev.Session]
			if s == nil {
				s = &Session{}
				states[ev.Session] = s
			}
			s.Apply(ev)
		}
		n += len(bodies)
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(len(bodies)), "events/op")
}

// BenchmarkFoldWithView folds the events of BenchmarkFold one by one and
// takes Session.View after every event, as the engine does for its
// metrics: the read model must not cost the fold much.
func BenchmarkFoldWithView(b *testing.B) {
	evs := synth(b, 42, 200, true)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		var s Session
		for _, ev := range evs {
			s.Apply(ev) // a rewind's refold is left out: it costs the same with or without View
			_ = s.View()
		}
	}
	b.ReportMetric(float64(b.N*len(evs))/b.Elapsed().Seconds(), "events/s")
}
