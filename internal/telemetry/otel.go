package telemetry

import "strconv"

// SetOTelLags records the lag of the OpenTelemetry export (events stored
// and not yet exported) of each partition this engine exports, and
// forgets the partitions it no longer exports.
func (m *Metrics) SetOTelLags(lags map[int]uint64) {
	if m == nil {
		return
	}
	m.otelLag.Reset()
	for p, lag := range lags {
		m.otelLag.WithLabelValues(strconv.Itoa(p)).Set(float64(lag))
	}
}

// OTelExport counts one export call of the OpenTelemetry export: the
// spans it sent, or a failure (err set; the call is tried again).
func (m *Metrics) OTelExport(spans int, err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.otelFailures.Inc()
		return
	}
	m.otelSpans.Add(float64(spans))
}
