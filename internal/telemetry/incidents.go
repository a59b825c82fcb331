package telemetry

// SetOpenIncidents records the fleet's open incidents (package correlate:
// an incident is open while its latest signal is recent and some of its
// sessions have not recovered), counted by the class of their key (an
// error class such as "overloaded", or an anomaly such as
// "tool_use_without_result"), in incidents_open{class}; the classes not
// in byClass go back to no series. Every engine reports the whole fleet's
// incidents, so aggregate the series across engines with max, not sum.
func (m *Metrics) SetOpenIncidents(byClass map[string]int) {
	if m == nil {
		return
	}
	m.incidentsOpen.Reset()
	for class, n := range byClass {
		m.incidentsOpen.WithLabelValues(label(class)).Set(float64(n))
	}
}
