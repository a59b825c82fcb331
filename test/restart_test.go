package test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestEngineKilledWithTurnsInFlight kills the engine with SIGKILL while
// turns are in flight, starts it again, and checks that every one of them
// ends in an outcome without any new event arriving for its session.
func TestEngineKilledWithTurnsInFlight(t *testing.T) {
	skipShort(t, "kills engine processes")
	parallel(t)
	dir := t.TempDir()
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte("turn_deadline: 4s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	eng := startEngineAt(t, dir, port, "--sync", "1s", "--policy", policy, "--telemetry-listen", "")
	startWorker(t, eng.url, "w1")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rt := exec.CommandContext(ctx, filepath.Join(binDir, "refruntime"), "--nats-url", eng.url, "--tenant", "demo",
		"--sessions", "3", "--turns", "1", "--fault", "hang")
	rt.Env = withoutNATSURL()
	out, err := rt.Output()
	if err != nil {
		t.Fatalf("refruntime: %v", err)
	}
	sessions := strings.Fields(string(out))
	if len(sessions) != 3 {
		t.Fatalf("refruntime printed %q, want 3 session ids", out)
	}
	inFlight := func() int {
		var list []struct {
			Session string
			Status  string
		}
		if err := json.Unmarshal([]byte(run(t, eng.url, "sessions", "--tenant", "demo", "--json")), &list); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, s := range list {
			if s.Status == "in_turn" {
				n++
			}
		}
		return n
	}
	if n := inFlight(); n != 3 {
		t.Fatalf("%d sessions with a turn in flight before the kill, want 3", n)
	}

	if err := eng.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = eng.cmd.Wait()
	eng = startEngineAt(t, dir, port, "--sync", "1s", "--policy", policy, "--telemetry-listen", "")

	deadline := time.Now().Add(45 * time.Second)
	for inFlight() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("turns still in flight 45s after the restart; engine:\n%s", eng.out)
		}
		time.Sleep(250 * time.Millisecond)
	}
	for _, s := range sessions {
		var st struct {
			Turns []struct {
				Status, Reason string
			} `json:"turns"`
		}
		if err := json.Unmarshal([]byte(run(t, eng.url, "inspect", "demo/"+s, "--json")), &st); err != nil {
			t.Fatal(err)
		}
		for _, tn := range st.Turns {
			if tn.Status != "abandoned" || !strings.Contains(tn.Reason, "last stage") {
				t.Errorf("%s: turn %+v, want abandoned naming its last stage", s, tn)
			}
		}
	}
	eng.stop(t)
}
