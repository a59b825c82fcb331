package projections

import (
	"testing"
)

// BenchmarkFold folds a realistic synthetic session (200 turns: prompts,
// thinking, tool calls with kilobyte results, stages, errors,
// distillations) and reports events per second.
func BenchmarkFold(b *testing.B) {
	evs := synth(b, 42, 200, true)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		s := &Session{}
		for _, ev := range evs {
			s.Apply(ev)
		}
	}
	b.ReportMetric(float64(b.N*len(evs))/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(len(evs)), "events/op")
}
