package test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/internal/engine"
	"github.com/turnstone-dev/turnstone/internal/pgroup"
)

// TestReadyMeansEveryPartitionIsOwned: an engine killed and started again
// at once finds its previous run's claims in the group, not yet expired:
// it says it is up but not ready, and how many partitions have no live
// owner, and says "engine ready" only once it owns every one of them.
func TestReadyMeansEveryPartitionIsOwned(t *testing.T) {
	if testing.Short() {
		t.Skip("an engine process killed and restarted: not in -short")
	}
	parallel(t)
	dir := t.TempDir()
	port := freePort(t)
	eng := startEngineAt(t, dir, port, "--sync", "1s")
	killEngine(t, eng)
	eng = startEngineAt(t, dir, port, "--sync", "1s")
	readyAt := time.Now() // it has printed "engine ready" (checked below)
	out := eng.out.String()
	ready := strings.Index(out, "engine ready")
	up := regexp.MustCompile(`engine up, not ready yet: it owns (\d) of 8 partitions; (\d) have no live owner`).FindStringSubmatchIndex(out)
	if up == nil || up[0] > ready {
		t.Fatalf("a restart within the previous run's claims: want \"engine up, not ready yet\" with the count, then \"engine ready\":\n%s", out)
	}
	nc, err := nats.Connect(eng.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	// Its first heartbeat after "engine ready" (one a second) records
	// that it owns all eight. The wait for that beat is loose (10 s) for
	// a loaded machine; what the beat says is not.
	var recs []pgroup.Record
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if recs, err = pgroup.List(context.Background(), js, pgroup.DefaultBucket, engine.Group); err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if !r.Beat.After(readyAt) {
				continue // the killed engine's, or a beat from before ready
			}
			if len(r.Partitions) != 8 {
				t.Fatalf("\"engine ready\", but its heartbeat after it lists %d of the 8 partitions: %+v", len(r.Partitions), r)
			}
			return
		}
	}
	t.Fatalf("\"engine ready\", but no heartbeat of an engine within 10 s after it: %+v", recs)
}
