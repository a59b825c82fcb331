package telemetry

import (
	"fmt"
	"testing"

	"github.com/turnstone-dev/turnstone/events"
)

// BenchmarkObserveEvent measures ObserveEvent over a mix of turn and
// message events across 1,000 sessions.
func BenchmarkObserveEvent(b *testing.B) {
	s := newStream(b)
	var evs []events.Event
	for i := range 1000 {
		session := fmt.Sprintf("s%d", i)
		evs = append(evs,
			s.ev("acme", session, "t", &events.TurnStarted{}),
			s.ev("acme", session, "t", &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: "text", Text: "hi"}}}),
			s.ev("acme", session, "t", &events.TurnFailed{Stage: events.StageExecute, Error: events.ErrorInfo{Message: "x"}}),
		)
	}
	m := NewMetrics(Namespace)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		ev := evs[i%len(evs)]
		ev.Seq += uint64(i/len(evs)) * s.seq // a new sequence each round
		m.ObserveEvent(ev)
	}
}
