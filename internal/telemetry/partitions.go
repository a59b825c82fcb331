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

// SetPartitionLease records that this process holds partition p of group
// with the lease's fencing token (pgroup.Lease.Token).
func (m *Metrics) SetPartitionLease(group string, p int, token uint64) {
	if m == nil {
		return
	}
	m.leaseMu.Lock()
	defer m.leaseMu.Unlock()
	if m.leases == nil {
		m.leases = map[string]uint64{}
	}
	m.leases[group+"/"+strconv.Itoa(p)] = token
	m.partitionLease.WithLabelValues(group, strconv.Itoa(p)).Set(float64(token))
}

// EndPartitionLease removes the series of partition p of group when it is
// still the lease of token: a lease that ended after a later one began
// leaves the later one's alone.
func (m *Metrics) EndPartitionLease(group string, p int, token uint64) {
	if m == nil {
		return
	}
	m.leaseMu.Lock()
	defer m.leaseMu.Unlock()
	k := group + "/" + strconv.Itoa(p)
	if t, ok := m.leases[k]; ok && t == token {
		delete(m.leases, k)
		m.partitionLease.DeleteLabelValues(group, strconv.Itoa(p))
	}
}

// PinMoved counts a move of a partition's pin away from this process
// (group "engines" or "workers").
func (m *Metrics) PinMoved(group string) {
	if m == nil {
		return
	}
	m.pinMoves.WithLabelValues(group).Inc()
}

// SnapshotDisagreed counts a session whose snapshot or held state
// disagreed with the log (the log won).
func (m *Metrics) SnapshotDisagreed() {
	if m == nil {
		return
	}
	m.snapshotMisses.Inc()
}
