package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// metric returns the value of a Prometheus sample line "name value" (or
// the sum over its label sets) in body.
func metric(body, name string) float64 {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? ([0-9.e+-]+)$`)
	sum := 0.0
	for _, m := range re.FindAllStringSubmatch(body, -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		sum += v
	}
	return sum
}

// TestEngineMetricsAccountForEveryTurn runs the reference runtime with
// each fault it knows against an engine process and a worker process, and
// checks on /metrics that no turn is left without an outcome after its
// deadline and that started = completed + failed + abandoned + in flight.
func TestEngineMetricsAccountForEveryTurn(t *testing.T) {
	skipShort(t, "runs engine processes")
	parallel(t)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte("turn_deadline: 3s\ntool_deadline: 3s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tele := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	eng := startEngine(t, t.TempDir(), "--sync", "1s", "--policy", policy, "--telemetry-listen", tele)
	startWorker(t, eng.url, "w1")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sessions := map[string]string{}
	for _, fault := range []string{"", "crash-mid-tool", "stage-throws:history", "provider:529", "provider:429", "provider:401", "hang"} {
		args := []string{"--nats-url", eng.url, "--tenant", "demo", "--sessions", "1", "--turns", "2"}
		if fault != "" {
			args = append(args, "--fault", fault)
		}
		rt := exec.CommandContext(ctx, filepath.Join(binDir, "refruntime"), args...)
		rt.Env = withoutNATSURL()
		out, err := rt.Output()
		if err != nil {
			t.Fatalf("refruntime --fault %s: %v\n%s", fault, err, out)
		}
		sessions[fault] = strings.TrimSpace(string(out))
	}
	scrape := func(path string) (int, string) {
		resp, err := http.Get("http://" + tele + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	deadline := time.Now().Add(60 * time.Second)
	var body string
	for {
		_, body = scrape("/metrics")
		// Every turn ended, and the crashed one's orphan was repaired
		// (the repair follows the abandon: allow it its round trip).
		if metric(body, "turnstone_turns_in_flight") == 0 && metric(body, "turnstone_turns_started_total") >= 14 &&
			metric(body, "turnstone_orphan_repairs_total") > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("turns still in flight after their deadline:\n%s", body)
		}
		time.Sleep(250 * time.Millisecond)
	}
	started := metric(body, "turnstone_turns_started_total")
	ended := metric(body, "turnstone_turns_completed_total") + metric(body, "turnstone_turns_failed_total") +
		metric(body, "turnstone_turns_abandoned_total") + metric(body, "turnstone_turns_in_flight")
	if started != ended {
		t.Fatalf("started %v != completed + failed + abandoned + in flight = %v", started, ended)
	}
	for _, name := range []string{"turnstone_turns_abandoned_total", "turnstone_orphan_repairs_total", "turnstone_commands_issued_total", "turnstone_recovery_outcomes_total"} {
		if metric(body, name) == 0 {
			t.Errorf("%s is 0", name)
		}
	}
	if code, b := scrape("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz %d: %s", code, b)
	}

	// engine incidents --by session lists the six sessions with a fault,
	// not the clean one, newest first, each with a first anomaly and a
	// recovery outcome.
	var incidents []struct {
		Session      string `json:"session"`
		FirstAnomaly *struct {
			What   string `json:"what"`
			Detail string `json:"detail"`
		} `json:"first_anomaly"`
		LastCommand *struct {
			Kind    string `json:"kind"`
			Outcome string `json:"outcome"`
			Parked  bool   `json:"parked"`
		} `json:"last_command"`
		LastTime time.Time `json:"last_time"`
	}
	if err := json.Unmarshal([]byte(run(t, eng.url, "incidents", "--by", "session", "--json", "--since", "1h")), &incidents); err != nil {
		t.Fatal(err)
	}
	if len(incidents) != len(sessions)-1 {
		t.Fatalf("%d incidents, want %d: %+v", len(incidents), len(sessions)-1, incidents)
	}
	for i, in := range incidents {
		if in.Session == sessions[""] {
			t.Errorf("the clean session is listed as an incident: %+v", in)
		}
		// A stage that throws a logic error ends its turn failed with its
		// stage; no recovery applies to it.
		if in.FirstAnomaly == nil || in.FirstAnomaly.What == "" || (in.LastCommand == nil && in.Session != sessions["stage-throws:history"]) ||
			(in.LastCommand != nil && in.LastCommand.Outcome == "" && !in.LastCommand.Parked) {
			t.Errorf("incident %+v lacks its first anomaly or recovery outcome", in)
		}
		if i > 0 && in.LastTime.After(incidents[i-1].LastTime) {
			t.Errorf("incidents not newest first")
		}
	}
	if table := run(t, eng.url, "incidents", "--by", "session"); !strings.Contains(table, "FIRST ANOMALY") {
		t.Errorf("incidents table:\n%s", table)
	}
	// The correlated incidents (the default) name every faulted session,
	// and never the clean one.
	var correlated []struct {
		Sessions []struct {
			Session string `json:"session"`
		} `json:"sessions"`
	}
	if err := json.Unmarshal([]byte(run(t, eng.url, "incidents", "--json", "--since", "1h")), &correlated); err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{}
	for _, in := range correlated {
		for _, a := range in.Sessions {
			named[a.Session] = true
		}
	}
	for fault, s := range sessions {
		if named[s] != (fault != "") {
			t.Errorf("session of fault %q named by the correlated incidents: %v", fault, named[s])
		}
	}
}
