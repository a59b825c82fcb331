package test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/pgroup"
	"github.com/turnstone-dev/turnstone/recovery"
)

// consumerSettings reads every recovery consumer's configuration, by name.
func consumerSettings(t *testing.T, js jetstream.JetStream) map[string]jetstream.ConsumerConfig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := map[string]jetstream.ConsumerConfig{}
	for p := 0; p < events.DefaultPartitions; p++ {
		c, err := js.Consumer(ctx, recovery.Stream, recovery.ConsumerName(p))
		if err != nil {
			t.Fatal(err)
		}
		out[c.CachedInfo().Name] = c.CachedInfo().Config
	}
	return out
}

// checkDelivery fails the test unless every recovery consumer holds want.
func checkDelivery(t *testing.T, js jetstream.JetStream, when string, want recovery.DeliveryConfig) map[string]jetstream.ConsumerConfig {
	t.Helper()
	got := consumerSettings(t, js)
	for name, c := range got {
		if d := recovery.DeliveryOf(c); d != want {
			t.Fatalf("%s: consumer %s holds %s, want %s", when, name, d, want)
		}
	}
	return got
}

// TestEngineSetupIsTheOnlyWriterOfConsumerSettings: engine setup changes
// the workers' consumer settings; an engine restart, `recovery list` and
// `recovery issue` leave them as set; a worker started with other
// settings is refused, names each difference, and changes nothing (no
// consumer, no membership); a worker that expects what is stored, or
// nothing, runs (issues 19 and 21).
func TestEngineSetupIsTheOnlyWriterOfConsumerSettings(t *testing.T) {
	skipShort(t, "runs engine and worker processes")
	parallel(t)
	dir := t.TempDir()
	port := freePort(t)
	eng := startEngineAt(t, dir, port)
	_, js, log := connectJS(t, eng.url)
	checkDelivery(t, js, "after serve's own setup", recovery.DeliveryConfig{}.WithDefaults())

	set := recovery.DeliveryConfig{AckWait: 30 * time.Second, MaxDeliver: 2, PinnedTTL: 3 * time.Second}
	out := run(t, eng.url, "setup", "--ack-wait", "30s", "--max-deliver", "2", "--pinned-ttl", "3s")
	if !strings.Contains(out, "recovery consumers: ack-wait 30s, max-deliver 2, pinned-ttl 3s") {
		t.Fatalf("engine setup printed:\n%s", out)
	}
	before := checkDelivery(t, js, "after engine setup", set)
	// The change is recorded, with the old and the new value.
	var recs []struct {
		Action, Reason string
		Changes        []string
	}
	if err := json.Unmarshal([]byte(run(t, eng.url, "audit", "--json", "--action", "streams_updated")), &recs); err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || !strings.Contains(strings.Join(recs[0].Changes, "\n"), "ack-wait: 10s -> 30s") {
		t.Fatalf("audit records: %+v", recs)
	}
	// Setup again without the flags changes nothing.
	run(t, eng.url, "setup")
	checkDelivery(t, js, "after engine setup without flags", set)

	// An engine restart runs setup on its embedded server: it keeps them.
	eng.stop(t)
	eng = startEngineAt(t, dir, port)
	_, js, log = connectJS(t, eng.url)
	checkDelivery(t, js, "after an engine restart", set)

	// The recovery commands read and issue; they write no setting.
	ctx := context.Background()
	ev, _ := events.New("acme", "s1", "", &events.SessionStarted{})
	if _, err := log.Append(ctx, []events.Event{ev}); err != nil {
		t.Fatal(err)
	}
	run(t, eng.url, "recovery", "list")
	run(t, eng.url, "recovery", "issue", "acme/s1", "--kind", "pause_session", "--reason", "settings test")
	checkDelivery(t, js, "after recovery list and issue", set)

	// A worker started with other settings is refused at once, names
	// each difference (flag and stored value) and what to run, and
	// changes nothing.
	bad := startProc(t, eng.url, "worker", "--name", "w-other", "--ack-wait", "10s", "--max-deliver", "5", "--pinned-ttl", "3s")
	if code := bad.wait(t, 20*time.Second); code == 0 {
		t.Fatalf("worker with other settings exited 0:\n%s", bad.errOut)
	}
	msg := bad.errOut.String()
	for _, want := range []string{
		"--ack-wait 10s, but AGENT_RECOVERY recovery-p0..recovery-p7 holds 30s",
		"--max-deliver 5, but AGENT_RECOVERY recovery-p0..recovery-p7 holds 2",
		"engine setup --ack-wait 10s --max-deliver 5",
		"nothing was changed",
	} {
		if !strings.Contains(msg, want) {
			t.Fatalf("worker's refusal does not say %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "--pinned-ttl 3s,") {
		t.Fatalf("worker's refusal names a setting that agrees:\n%s", msg)
	}
	after := checkDelivery(t, js, "after the refused worker", set)
	for name, c := range after {
		if fmt.Sprint(c) != fmt.Sprint(before[name]) {
			t.Fatalf("consumer %s changed:\n  before %+v\n  after  %+v", name, before[name], c)
		}
	}
	recs2, err := pgroup.List(ctx, js, "", recovery.WorkerGroup)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs2 {
		if r.Member == "w-other" {
			t.Fatalf("the refused worker joined the group: %+v", r)
		}
	}

	// A worker that expects the stored settings runs, and so does one
	// that names none.
	good := startProc(t, eng.url, "worker", "--name", "w-same", "--ack-wait", "30s", "--max-deliver", "2")
	plain := startProc(t, eng.url, "worker", "--name", "w-plain")
	deadline := time.Now().Add(20 * time.Second)
	for {
		recs, err := pgroup.List(ctx, js, "", recovery.WorkerGroup)
		joined := map[string]bool{}
		for _, r := range recs {
			joined[r.Member] = true
		}
		if err == nil && joined["w-same"] && joined["w-plain"] {
			break
		}
		if time.Now().After(deadline) || good.exited() || plain.exited() {
			t.Fatalf("workers did not join (%v, %v):\n%s\n%s", recs, err, good.errOut, plain.errOut)
		}
		time.Sleep(50 * time.Millisecond)
	}
	checkDelivery(t, js, "with two workers running", set)
}
