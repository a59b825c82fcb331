package telemetry

import "strconv"

// SetPartitions records that this process owns owned partitions of group
// ("engines", "workers") and that its set changed rebalances times.
func (m *Metrics) SetPartitions(group string, owned, rebalances int) {
	if m == nil {
		return
	}
	m.partitionsOwned.WithLabelValues(group).Set(float64(owned))
	m.rebalances.WithLabelValues(group).Set(float64(rebalances))
}

// SetPartitionLags records the lag (events not yet delivered) of each
// partition this engine owns, and forgets the partitions it no longer
// owns.
func (m *Metrics) SetPartitionLags(lags map[int]uint64) {
	if m == nil {
		return
	}
	m.partitionLag.Reset()
	for p, lag := range lags {
		m.partitionLag.WithLabelValues(strconv.Itoa(p)).Set(float64(lag))
	}
}
