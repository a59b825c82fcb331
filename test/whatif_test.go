package test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/whatif"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// TestWhatifReplaysTheRecordedPolicy records the reference runtime's
// hang, crash-mid-tool and provider-error sessions under an engine and a
// worker (processes, real time, a policy with short deadlines), then runs
// `engine whatif`: with the policy the engine recorded in force, every
// decision is the one recorded (the diff is empty); with turn_deadline
// shortened, the hang's abandon changes to the new time; the log's last
// sequences and the command list are the same after as before; and two
// runs print byte-identical JSON.
func TestWhatifReplaysTheRecordedPolicy(t *testing.T) {
	skipShort(t, "runs engine processes")
	parallel(t)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte("turn_deadline: 6s\ntool_deadline: 6s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	eng := startEngine(t, t.TempDir(), "--sync", "1s", "--policy", policy)
	startWorker(t, eng.url, "w1")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sessions := map[string]string{}
	for _, fault := range []string{"hang", "crash-mid-tool", "provider:529"} {
		rt := exec.CommandContext(ctx, filepath.Join(binDir, "refruntime"), "--nats-url", eng.url, "--tenant", "wi", "--sessions", "1", "--turns", "1", "--fault", fault)
		rt.Env = withoutNATSURL()
		out, err := rt.Output()
		if err != nil {
			t.Fatalf("refruntime --fault %s: %v\n%s", fault, err, out)
		}
		sessions[fault] = strings.TrimSpace(string(out))
	}
	_, js, log := connectJS(t, eng.url)
	// Wait for what the reconciler decides on each: the hang abandoned,
	// the crash abandoned and its orphan repaired, the provider error
	// retried (its chain then pauses: the runtime has exited).
	want := map[string][]recovery.Kind{
		"hang":           {recovery.KindAbandonTurn},
		"crash-mid-tool": {recovery.KindAbandonTurn, recovery.KindRepairOrphans},
		"provider:529":   {recovery.KindRetryTurn},
	}
	deadline := time.Now().Add(60 * time.Second)
	for fault, kinds := range want {
		for {
			cmds, err := recovery.SessionCommands(ctx, js, "wi", sessions[fault])
			if err != nil {
				t.Fatal(err)
			}
			var got []recovery.Kind
			for _, c := range cmds {
				got = append(got, c.Kind)
			}
			done := len(got) >= len(kinds)
			for i := range kinds {
				done = done && got[i] == kinds[i]
			}
			s, err := projections.Restore(ctx, log, nil, "wi", sessions[fault])
			settled := err == nil && len(s.InFlight) == 0
			for _, c := range s.Commands {
				settled = settled && c.Done()
			}
			if done && settled && len(s.Commands) >= len(kinds) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: commands %v, want %v; engine:\n%s", fault, got, kinds, eng.out)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	streamSeqs := func() (uint64, uint64) {
		t.Helper()
		var seqs [2]uint64
		for i, name := range []string{events.EventsStream, recovery.Stream} {
			st, err := js.Stream(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			info, err := st.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			seqs[i] = info.State.LastSeq
		}
		return seqs[0], seqs[1]
	}
	lastSeqs := func() (uint64, uint64, string) {
		t.Helper()
		ev, rec := streamSeqs()
		return ev, rec, run(t, eng.url, "recovery", "list", "--json")
	}
	// The worker's chain for the provider error ends in a pause: wait
	// until the log is quiet (neither stream has grown for a second)
	// before it is read twice.
	ev0, rec0 := streamSeqs()
	for quiet, deadline := time.Now(), time.Now().Add(30*time.Second); time.Since(quiet) < time.Second; {
		if time.Now().After(deadline) {
			t.Fatalf("the log is still growing 30 s after the commands finished; engine:\n%s", eng.out)
		}
		time.Sleep(100 * time.Millisecond)
		if ev, rec := streamSeqs(); ev != ev0 || rec != rec0 {
			ev0, rec0, quiet = ev, rec, time.Now()
		}
	}
	ev0, rec0, list0 := lastSeqs()

	first := run(t, eng.url, "whatif", "--tenant", "wi", "--json")
	second := run(t, eng.url, "whatif", "--tenant", "wi", "--json")
	if first != second {
		t.Fatalf("two runs differ:\n%s\n---\n%s", first, second)
	}
	var res []whatif.Result
	if err := json.Unmarshal([]byte(first), &res); err != nil {
		t.Fatal(err)
	}
	byFault := map[string]whatif.Result{}
	for fault, s := range sessions {
		for _, r := range res {
			if r.Session == s {
				byFault[fault] = r
			}
		}
	}
	for fault, kinds := range want {
		r := byFault[fault]
		if r.FirstDivergence != nil || len(r.Decisions) != len(kinds) {
			t.Errorf("%s under the recorded policy: %+v, want %v, each the same as recorded", fault, r, kinds)
			continue
		}
		for i, d := range r.Decisions {
			if d.Change != whatif.Same || d.Kind != string(kinds[i]) {
				t.Errorf("%s: decision %d %+v, want %s the same as recorded", fault, i, d, kinds[i])
			}
		}
	}

	shorter := filepath.Join(t.TempDir(), "shorter.yaml")
	if err := os.WriteFile(shorter, []byte("turn_deadline: 1s\ntool_deadline: 6s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := run(t, eng.url, "whatif", "--tenant", "wi", "--policy", shorter, "--json")
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Session != sessions["hang"] {
			continue
		}
		if len(r.Decisions) != 1 || r.FirstDivergence == nil {
			t.Fatalf("hang with turn_deadline 1s: %+v, want one changed abandon", r)
		}
		d := r.Decisions[0]
		if d.Kind != string(recovery.KindAbandonTurn) || d.Change != whatif.Changed || !d.Time.Before(d.BaselineTime.Add(-4*time.Second)) {
			t.Fatalf("hang with turn_deadline 1s: %+v, want the abandon changed to about 5 s earlier", d)
		}
	}
	text := run(t, eng.url, "whatif", "wi/"+sessions["hang"], "--policy", shorter)
	if !strings.Contains(text, "changed (was seq") || !strings.Contains(text, "abandon_turn") {
		t.Errorf("the text output does not show the changed abandon:\n%s", text)
	}

	if ev1, rec1, list1 := lastSeqs(); ev1 != ev0 || rec1 != rec0 || list1 != list0 {
		t.Fatalf("whatif changed the log: events %d -> %d, commands %d -> %d, list changed %v", ev0, ev1, rec0, rec1, list0 != list1)
	}
}
