package test

import (
	"sync"
	"testing"
)

// TestClusterKills runs the package's two tests that kill processes and
// nats-server nodes of a three-node cluster of their own,
// LeaderKillKeepsOneOwnerPerPartition and ScaleOutOnAThreeNodeCluster,
// side by side, as one of the package's parallel tests: the two subtests
// run on goroutines of their own (not t.Parallel), so that they start
// together, as soon as this test starts, and hold one of the package's
// slots between them (admitted before the shorter tests: parallelLong).
// Each mostly waits on elections, leases and deadlines (10-50% of 2
// cores, measured) and bounds handovers and repairs in time, with
// margins measured beside the package's other tests under the race
// detector. Run one alone:
// go test ./test -run 'TestClusterKills/ScaleOut'.
func TestClusterKills(t *testing.T) {
	parallelLong(t)
	var wg sync.WaitGroup
	wg.Go(func() { t.Run("LeaderKillKeepsOneOwnerPerPartition", leaderKillKeepsOneOwnerPerPartition) })
	wg.Go(func() { t.Run("ScaleOutOnAThreeNodeCluster", scaleOutOnAThreeNodeCluster) })
	wg.Wait()
}
