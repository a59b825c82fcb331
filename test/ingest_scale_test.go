package test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/internal/engine"
	"github.com/turnstone-dev/turnstone/internal/pgroup"
)

// ingestByPartition reads an engine's /metrics: the append requests it
// took on the mapped path by partition, and on the unmapped path in all.
func ingestByPartition(t *testing.T, addr string) (map[int]float64, float64) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	re := regexp.MustCompile(`(?m)^turnstone_ingest_requests_total\{partition="(\d+)",path="(\w+)"\} ([0-9.e+]+)$`)
	mapped, unmapped := map[int]float64{}, 0.0
	for _, m := range re.FindAllStringSubmatch(string(body), -1) {
		p, _ := strconv.Atoi(m[1])
		v, _ := strconv.ParseFloat(m[3], 64)
		if m[2] == "mapped" {
			mapped[p] += v
		} else {
			unmapped += v
		}
	}
	return mapped, unmapped
}

// startSecondEngine runs `engine serve` on an existing server (url) and
// waits until it says it is up.
func startSecondEngine(t *testing.T, url string, args ...string) *engineProc {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "engine"), append([]string{"serve", "--nats-url", url}, args...)...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = withoutNATSURL()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &engineProc{cmd: cmd, url: url, out: out}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), "engine ready") && !strings.Contains(out.String(), "engine up") {
		if time.Now().After(deadline) {
			t.Fatalf("second engine did not start: %s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return p
}

// owners waits until the engines' group has want live members, each
// with a share, and returns each one's partitions.
func owners(t *testing.T, js jetstream.JetStream, want, partitions int) map[string][]int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		recs, err := pgroup.List(context.Background(), js, pgroup.DefaultBucket, engine.Group)
		got := map[string][]int{}
		total := 0
		if err == nil {
			for _, r := range recs {
				if time.Since(r.Beat) < 2*time.Second && len(r.Partitions) > 0 {
					got[r.Member] = r.Partitions
					total += len(r.Partitions)
				}
			}
		}
		if len(got) == want && total == partitions {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("engines' group: %v (%v), want %d members sharing %d partitions", got, err, want, partitions)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestEachEngineReceivesOnlyItsPartitionsAppends: with two engines on one
// server (the first runs it, embedded; the second connects to it), the
// server's partition mapping sends each append to the engine that owns
// its session's partition only: each engine's /metrics counts appends of
// its own partitions alone, none came unmapped, neither received them
// all, and the two counts add up to the appends sent. When the second
// engine stops, the first takes its partitions, and a session appended
// through the handover keeps its order.
func TestEachEngineReceivesOnlyItsPartitionsAppends(t *testing.T) {
	if testing.Short() {
		t.Skip("two engine processes: not in -short")
	}
	parallel(t)
	t1, t2 := fmt.Sprintf("127.0.0.1:%d", freePort(t)), fmt.Sprintf("127.0.0.1:%d", freePort(t))
	e1 := startEngine(t, t.TempDir(), "--name", "e1", "--telemetry-listen", t1, "--sync", "1s")
	e2 := startSecondEngine(t, e1.url, "--name", "e2", "--telemetry-listen", t2)
	nc, err := nats.Connect(e1.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	log, err := events.Open(ctx, js, events.Config{UseExisting: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	n := log.Partitions()
	own := owners(t, js, 2, n)

	// A publisher without credentials (no accounts: the server's global
	// account maps its publishes).
	cl, err := ingest.NewClient(nc, ingest.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	const sessions, each = 400, 5
	var evs []events.Event
	for s := 0; s < sessions; s++ {
		for i := 0; i < each; i++ {
			ev, _ := events.New("scale", fmt.Sprintf("s%03d", s), "", &events.MessageAppended{Role: "user", Content: []events.ContentBlock{{Type: "text", Text: fmt.Sprint(i)}}})
			ev.Source = "urn:agent:scale"
			evs = append(evs, ev)
		}
	}
	if _, err := cl.Append(ctx, evs); err != nil {
		t.Fatal(err)
	}
	sent := float64(len(evs))
	got := map[string]map[int]float64{}
	sum := 0.0
	for name, addr := range map[string]string{"e1": t1, "e2": t2} {
		mapped, unmapped := ingestByPartition(t, addr)
		total := 0.0
		for p, v := range mapped {
			if !slices.Contains(own[name], p) {
				t.Errorf("engine %s received %v appends of partition %d, which %v owns", name, v, p, own)
			}
			total += v
		}
		if unmapped != 0 {
			t.Errorf("engine %s received %v appends unmapped", name, unmapped)
		}
		if total == 0 || total >= sent {
			t.Errorf("engine %s received %v of the %v appends", name, total, sent)
		}
		got[name] = mapped
		sum += total
	}
	if sum != sent {
		t.Fatalf("the engines received %v appends in all, %v were sent: %v", sum, sent, got)
	}

	// Handover: one session appended event by event while e2 stops.
	moved := ""
	for s := 0; moved == ""; s++ {
		if name := fmt.Sprintf("h%d", s); slices.Contains(own["e2"], events.Partition("scale", name, n)) {
			moved = name
		}
	}
	var ids []string
	var wg sync.WaitGroup
	wg.Add(1)
	errs := make(chan error, 1)
	go func() {
		defer wg.Done()
		for i := 0; i < 60; i++ {
			ev, _ := events.New("scale", moved, "", &events.MessageAppended{Role: "user", Content: []events.ContentBlock{{Type: "text", Text: fmt.Sprint(i)}}})
			ev.Source = "urn:agent:scale"
			if _, err := cl.Append(ctx, []events.Event{ev}); err != nil {
				errs <- err
				return
			}
			ids = append(ids, ev.ID)
			time.Sleep(20 * time.Millisecond)
		}
	}()
	time.Sleep(300 * time.Millisecond)
	e2.stop(t)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatalf("append through the handover: %v", err)
	default:
	}
	var stored []string
	if err := log.ReadSession(ctx, "scale", moved, events.ReadOptions{}, func(ev events.Event) error {
		stored = append(stored, ev.ID)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(stored, ids) {
		t.Fatalf("session %s through the handover: stored %d events, sent %d, or out of order", moved, len(stored), len(ids))
	}
	if mapped, _ := ingestByPartition(t, t1); mapped[events.Partition("scale", moved, n)] == 0 {
		t.Fatalf("e1 never received the partition it took over: %v", mapped)
	}
}
