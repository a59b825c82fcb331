package telemetry

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/turnstone-dev/turnstone/events"
)

// stream hands out events as the log would: each with the next stream
// sequence, like the events of several sessions sharing one stream.
type stream struct {
	tb  testing.TB
	seq uint64
}

func newStream(tb testing.TB) *stream {
	tb.Helper()
	return &stream{tb: tb}
}

// ev builds an event of tenant/session (turn may be empty) with the next
// stream sequence.
func (s *stream) ev(tenant, session, turn string, p events.Payload) events.Event {
	s.tb.Helper()
	ev, err := events.New(tenant, session, turn, p)
	if err != nil {
		s.tb.Fatalf("events.New(%s): %v", p.EventType(), err)
	}
	if err := events.Validate(&ev); err != nil {
		s.tb.Fatalf("test event %s is invalid: %v", ev, err)
	}
	s.seq++
	ev.Seq = s.seq
	return ev
}

// value returns the value of the counter or gauge name (with the
// namespace) whose labels are exactly labels, from a gather of reg, and
// whether there is one.
func value(tb testing.TB, reg prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	tb.Helper()
	m := find(tb, reg, name, labels)
	switch {
	case m == nil:
		return 0, false
	case m.Counter != nil:
		return m.Counter.GetValue(), true
	case m.Gauge != nil:
		return m.Gauge.GetValue(), true
	}
	tb.Fatalf("%s is neither a counter nor a gauge", name)
	return 0, false
}

// sum returns the sum of every series of the counter or gauge name.
func sum(tb testing.TB, reg prometheus.Gatherer, name string) float64 {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatalf("gather: %v", err)
	}
	var total float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return total
}

func find(tb testing.TB, reg prometheus.Gatherer, name string, labels map[string]string) *dto.Metric {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.Metric {
			if len(m.Label) != len(labels) {
				continue
			}
			for _, lp := range m.Label {
				if v, ok := labels[lp.GetName()]; !ok || v != lp.GetValue() {
					continue metrics
				}
			}
			return m
		}
	}
	return nil
}

// turnEquation returns both sides of started == completed + failed +
// abandoned + in_flight, from one gather.
func turnEquation(tb testing.TB, reg prometheus.Gatherer) (started, ended float64) {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		var total float64
		for _, m := range mf.Metric {
			total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
		switch mf.GetName() {
		case "turnstone_turns_started_total":
			started = total
		case "turnstone_turns_completed_total", "turnstone_turns_failed_total", "turnstone_turns_abandoned_total", "turnstone_turns_in_flight":
			ended += total
		}
	}
	return started, ended
}
