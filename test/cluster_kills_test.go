package test

import "testing"

// TestClusterKills runs the package's two tests that kill processes and
// nats-server nodes of a three-node cluster of their own,
// LeaderKillKeepsOneOwnerPerPartition and ScaleOutOnAThreeNodeCluster,
// side by side, before any of the package's parallel tests start (a
// serial test's parallel subtests end before it does). Each mostly waits
// on elections, leases and deadlines (10-50% of 2 cores, measured), and
// each bounds handovers and repairs in time, so they share the machine
// with each other, not with the package's other tests. Run one alone:
// go test ./test -run 'TestClusterKills/ScaleOut'.
func TestClusterKills(t *testing.T) {
	t.Run("LeaderKillKeepsOneOwnerPerPartition", func(t *testing.T) {
		t.Parallel()
		leaderKillKeepsOneOwnerPerPartition(t)
	})
	t.Run("ScaleOutOnAThreeNodeCluster", func(t *testing.T) {
		t.Parallel()
		scaleOutOnAThreeNodeCluster(t)
	})
}
