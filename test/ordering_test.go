package test

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/recovery"
)

// testDelivery are the recovery consumers' settings the tests' workers
// run with: shorter than the defaults, so that a dead worker's command
// comes back quickly.
var testDelivery = []string{"--ack-wait", "3s", "--pinned-ttl", "2s"}

// startWorker sets the recovery consumers to testDelivery (engine setup,
// their one writer: idempotent, so a second worker changes nothing) and
// starts a `worker` process against url that expects them; it is killed
// at test end if it still runs.
func startWorker(t *testing.T, url, name string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	// The workers' delivery settings are written by setup, as an operator
	// does; setup is asked again while it times out (a cluster electing a
	// consumer's leader after a node was lost).
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, errOut, err := runErr(url, append([]string{"setup"}, testDelivery...)...)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("engine setup: %v\n%s", err, errOut)
		}
		time.Sleep(500 * time.Millisecond)
	}
	args := append([]string{"--nats-url", url, "--name", name}, testDelivery...)
	cmd := exec.Command(filepath.Join(binDir, "worker"), append(args, "--control-timeout", "2s", "--log-level", "warn")...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = withoutNATSURL()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd, out
}

func connectJS(t *testing.T, url string) (*nats.Conn, jetstream.JetStream, *events.Log) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var log *events.Log
	// On a cluster just set up, a stream's leader may still be elected.
	untilAvailable(t, "open the log", func() (err error) {
		log, err = events.Open(context.Background(), js, events.Config{}, nil)
		return err
	})
	return nc, js, log
}

// TestCommandsRunInPublishOrderAcrossWorkerDeath publishes 1,000 commands
// over 50 sessions to 3 worker processes and kills one with SIGKILL midway:
// every session's commands must be executed in publish order, none lost,
// and no command's effect recorded twice.
func TestCommandsRunInPublishOrderAcrossWorkerDeath(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process ordering test")
	}
	parallel(t)
	const sessions, perSession = 50, 20
	eng := startEngine(t, t.TempDir(), "--sync", "1s")
	_, js, log := connectJS(t, eng.url)
	ctx := context.Background()
	for s := 0; s < sessions; s++ {
		ev, _ := events.New("order", fmt.Sprintf("s%02d", s), "", &events.SessionStarted{})
		if _, err := log.Append(ctx, []events.Event{ev}); err != nil {
			t.Fatal(err)
		}
	}
	workers := make([]*exec.Cmd, 3)
	outs := make([]*syncBuffer, 3)
	for i := range workers {
		workers[i], outs[i] = startWorker(t, eng.url, fmt.Sprintf("w%d", i))
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i, o := range outs {
				logProcessOutput(t, fmt.Sprintf("worker-w%d", i), o.String())
			}
		}
	})
	start := time.Now()

	// Publish round-robin: command i of every session, then i+1.
	published := map[string][]string{}
	for i := 0; i < perSession; i++ {
		for s := 0; s < sessions; s++ {
			session := fmt.Sprintf("s%02d", s)
			kind := recovery.KindPauseSession
			if i%2 == 1 {
				kind = recovery.KindResumeSession
			}
			c := recovery.NewCommand(kind, "order", session, "", fmt.Sprintf("ordering step %d", i), []uint64{uint64(i)})
			if _, dup, err := recovery.Issue(ctx, js, c); err != nil || dup {
				t.Fatalf("issue %s: dup %v err %v", c.ID, dup, err)
			}
			published[session] = append(published[session], c.ID)
		}
	}

	completed := func() int {
		n := 0
		st, _ := js.Stream(ctx, events.EventsStream)
		info, err := st.Info(ctx, jetstream.WithSubjectFilter("agent.evt.*.order.*"))
		if err != nil {
			t.Fatal(err)
		}
		n = int(info.State.Msgs)
		return n
	}
	// Each command writes its effect, an attempt and an outcome: wait until
	// about a third is done, then kill a worker.
	total := sessions + sessions*perSession*3
	deadline := time.Now().Add(3 * time.Minute)
	for completed() < total/3 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d events after 3 minutes", completed(), total)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Kill the worker that has run the most commands so far: it holds
	// partitions, so their commands must fail over to the others.
	busiest, byWorker := busiestWorker(t, js)
	victim := workers[busiest]
	if err := victim.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = victim.Wait()
	t.Logf("killed worker w%d (commands so far by worker: %v) with SIGKILL at %d of %d events after %s",
		busiest, byWorker, completed(), total, time.Since(start))
	killed := fmt.Sprintf("w%d", busiest)

	for completed() < total {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d events after 3 minutes", completed(), total)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("all %d events after %s", total, time.Since(start))
	time.Sleep(500 * time.Millisecond) // anything extra would show now

	failedOver := 0
	for s := 0; s < sessions; s++ {
		session := fmt.Sprintf("s%02d", s)
		var done, effects, ranBy []string
		attempts := map[string]int{}
		err := log.ReadSession(ctx, "order", session, events.ReadOptions{}, func(ev events.Event) error {
			p, err := ev.Payload()
			if err != nil {
				return fmt.Errorf("seq %d: %w", ev.Seq, err)
			}
			switch p := p.(type) {
			case *events.RecoveryCompleted:
				done = append(done, p.CommandID)
			case *events.RecoveryAttempted:
				attempts[p.CommandID]++
				ranBy = append(ranBy, p.Worker)
			case *events.SessionPaused:
				effects = append(effects, "pause")
			case *events.SessionResumed:
				effects = append(effects, "resume")
			case *events.RecoveryParked:
				t.Errorf("%s: command %s parked: %s", session, p.CommandID, p.Reason)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(done, " ") != strings.Join(published[session], " ") {
			t.Fatalf("%s: commands completed in order\n%v\nwant publish order\n%v", session, done, published[session])
		}
		for _, id := range published[session] {
			if attempts[id] != 1 {
				t.Errorf("%s: command %s has %d attempts recorded, want 1", session, id, attempts[id])
			}
		}
		if len(ranBy) > 0 && ranBy[0] == killed && ranBy[len(ranBy)-1] != killed {
			failedOver++
		}
		want := strings.TrimSpace(strings.Repeat("pause resume ", perSession/2))
		if got := strings.Join(effects, " "); got != want {
			t.Fatalf("%s: effects %q, want each exactly once, alternating", session, got)
		}
	}

	if failedOver == 0 {
		t.Fatalf("no session's commands moved from the killed worker %s to another", killed)
	}
	t.Logf("%d sessions failed over from %s", failedOver, killed)

	// Every status is final.
	kv, err := js.KeyValue(ctx, recovery.StatusBucket)
	if err != nil {
		t.Fatal(err)
	}
	for session, ids := range published {
		for _, id := range ids {
			e, err := kv.Get(ctx, id)
			if err != nil {
				t.Fatalf("%s %s: no status: %v", session, id, err)
			}
			var st recovery.Status
			_ = json.Unmarshal(e.Value(), &st)
			if st.State != recovery.StateCompleted {
				t.Fatalf("%s %s: status %+v", session, id, st)
			}
		}
	}
}

// busiestWorker returns the index of the worker (named w<i>) that
// completed the most commands so far (commandsByWorker), and the counts.
func busiestWorker(t *testing.T, js jetstream.JetStream) (int, map[string]int) {
	t.Helper()
	counts := commandsByWorker(t, js)
	best, bestN := 0, -1
	for i := 0; i < 3; i++ {
		if n := counts[fmt.Sprintf("w%d", i)]; n > bestN {
			best, bestN = i, n
		}
	}
	return best, counts
}
