package test

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestWorkerProcessRepairsACrashedRuntime runs the whole path as separate
// processes: the engine, a worker, and the reference runtime, which exits
// (status 3) right after storing a tool_use. The turn is abandoned through
// `engine recovery issue` (before its deadline) and the
// orphan repaired by the reconciler; `engine recovery list` and `engine
// replay` show each attempt and outcome.
func TestWorkerProcessRepairsACrashedRuntime(t *testing.T) {
	parallel(t)
	eng := startEngine(t, t.TempDir(), "--sync", "1s")
	_, wout := startWorker(t, eng.url, "w1")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rt := exec.CommandContext(ctx, filepath.Join(binDir, "refruntime"), "--nats-url", eng.url, "--tenant", "demo",
		"--sessions", "1", "--turns", "2", "--fault", "crash-mid-tool", "--exit-on-crash")
	rt.Env = withoutNATSURL()
	out, err := rt.Output()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Fatalf("refruntime: want exit status 3 (crash), got %v", err)
	}
	session := strings.TrimSpace(string(out))
	if session == "" || strings.Contains(session, "\n") {
		t.Fatalf("refruntime printed %q, want one session id", out)
	}

	inspect := func() map[string]json.RawMessage {
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(run(t, eng.url, "inspect", "demo/"+session, "--json")), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	var inFlight []string
	_ = json.Unmarshal(inspect()["in_flight"], &inFlight)
	if len(inFlight) != 1 {
		t.Fatalf("in flight after the crash: %v", inFlight)
	}
	waitState := func(kind string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			var rows []struct {
				Command struct{ Kind string } `json:"command"`
				Status  struct{ State, Outcome string }
			}
			_ = json.Unmarshal([]byte(run(t, eng.url, "recovery", "list", "--session", session, "--json")), &rows)
			for _, r := range rows {
				if r.Command.Kind == kind && r.Status.State == "completed" {
					return
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("%s did not complete; worker said:\n%s", kind, wout)
	}
	run(t, eng.url, "recovery", "issue", "demo/"+session, "--kind", "abandon_turn", "--turn", inFlight[0], "--reason", "runtime crashed")
	waitState("abandon_turn")
	// Abandoning the turn declares its tool_use orphaned; the engine's
	// reconciler issues the repair by itself.
	waitState("repair_orphans")
	var orphans []string
	m := inspect()
	_ = json.Unmarshal(m["orphaned_tool_use_ids"], &orphans)
	var status string
	_ = json.Unmarshal(m["status"], &status)
	if len(orphans) != 0 || status == "broken" {
		t.Fatalf("after repair: orphans %v, status %s", orphans, status)
	}
	replay := run(t, eng.url, "replay", "demo/"+session)
	for _, want := range []string{"turn.abandoned", "tool_use_without_result", "(synthetic)", "recovery.attempted", "repair_orphans", "RECOVERED"} {
		if !strings.Contains(replay, want) {
			t.Errorf("replay lacks %q:\n%s", want, replay)
		}
	}
	list := run(t, eng.url, "recovery", "list")
	if !strings.Contains(list, "abandon_turn") || !strings.Contains(list, "repair_orphans") {
		t.Errorf("recovery list:\n%s", list)
	}
}
