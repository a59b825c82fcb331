package projections

import (
	"testing"
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
