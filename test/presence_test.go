package test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// TestRuntimeKilledMidTurnIsGoneOnce kills the reference runtime (a
// process serving control requests) in the middle of a turn it runs for a
// retry, then starts it again: the engine says the runtime is gone
// exactly once, the session pauses once for runtime_unavailable, no
// resume_session is issued while the runtime is away (a presence known
// from before the death is not a return), and once the new runtime
// answers, exactly one resume_session is.
func TestRuntimeKilledMidTurnIsGoneOnce(t *testing.T) {
	skipShort(t, "kills a runtime process and waits out presence")
	parallelLong(t)
	tele := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	eng := startEngine(t, t.TempDir(), "--sync", "1s", "--telemetry-listen", tele)
	startWorker(t, eng.url, "w1")
	_, js, log := connectJS(t, eng.url)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// A runtime whose turn fails on an overloaded provider; the worker's
	// retry makes it run the turn again, slowly (a second per stage).
	rt := exec.CommandContext(ctx, filepath.Join(binDir, "refruntime"), "--nats-url", eng.url, "--tenant", "pr",
		"--sessions", "1", "--turns", "1", "--fault", "provider:529", "--stage-delay", "1s", "--serve")
	rt.Env = withoutNATSURL()
	stdout, err := rt.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	rtOut := &syncBuffer{}
	rt.Stderr = rtOut
	if err := rt.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if rt.ProcessState == nil {
			_ = rt.Process.Kill()
			_ = rt.Wait()
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("refruntime printed no session: %v\n%s", err, rtOut)
	}
	session := strings.TrimSpace(line)
	state := func() *projections.Session {
		s, err := projections.Restore(ctx, log, nil, "pr", session)
		if errors.Is(err, events.ErrSessionNotFound) {
			return &projections.Session{} // printed before its first event is stored
		}
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	waitFor := func(what string, within time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(within)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %s; engine:\n%s", what, within, eng.out)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// ticks is how many passes the engine's reconciler has made
	// (turnstone_reconciler_ticks_total, one a second); passes waits for
	// n more: the span in which a wrong command would have been issued,
	// counted in the reconciler's own judgements, not in wall time a
	// loaded machine may spend elsewhere.
	ticks := func() float64 {
		body, err := httpGetBody("http://" + tele + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		return metric(body, "turnstone_reconciler_ticks_total")
	}
	passes := func(what string, n float64) {
		t.Helper()
		from := ticks()
		waitFor(what, time.Duration(n)*5*time.Second, func() bool { return ticks() >= from+n })
	}
	gone := regexp.MustCompile(`runtime presence changed.*present=false.*tenant=pr|tenant=pr.*present=false`)
	back := regexp.MustCompile(`runtime presence changed.*present=true.*tenant=pr|tenant=pr.*present=true`)
	count := func(re *regexp.Regexp) int { return len(re.FindAllString(eng.out.String(), -1)) }
	waitFor("the runtime present", 20*time.Second, func() bool { return count(back) >= 1 })
	// Mid-turn: the retry's turn is in flight in the runtime.
	waitFor("the retried turn in flight", 60*time.Second, func() bool {
		s := state()
		for _, tn := range s.Turns {
			if tn.Trigger == "retry" && tn.Status == projections.TurnInFlight {
				return true
			}
		}
		return false
	})
	if err := rt.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = rt.Wait()

	resumes := func() int {
		cmds, err := recovery.SessionCommands(ctx, js, "pr", session)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, c := range cmds {
			if c.Kind == recovery.KindResumeSession {
				n++
			}
		}
		return n
	}
	waitFor("the session paused for its runtime", 60*time.Second, func() bool {
		s := state()
		return s.Paused && s.PauseCause == events.CauseRuntimeUnavailable
	})
	waitFor("the runtime gone", 20*time.Second, func() bool { return count(gone) >= 1 })
	// Away: eight reconciler passes, a second apart, which span four
	// presence rounds (2 s each).
	passes("eight reconciler passes with the runtime away", 8)
	if n := resumes(); n != 0 {
		t.Fatalf("%d resume_session while the runtime is dead; engine:\n%s", n, eng.out)
	}
	if n := count(gone); n != 1 {
		t.Fatalf("the runtime went %d times, want once; engine:\n%s", n, eng.out)
	}
	pauses := 0
	for _, c := range state().Commands {
		if c.PauseCause == events.CauseRuntimeUnavailable {
			pauses++
		}
	}
	if pauses != 1 {
		t.Fatalf("%d pauses for runtime_unavailable, want 1", pauses)
	}
	backBefore := count(back)

	// A new runtime process, answering for the sessions the dead one ran.
	rt2 := exec.CommandContext(ctx, filepath.Join(binDir, "refruntime"), "--nats-url", eng.url, "--tenant", "pr",
		"--sessions", "0", "--serve", "--adopt")
	rt2.Env = withoutNATSURL()
	if err := rt2.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = rt2.Process.Kill()
		_ = rt2.Wait()
	})
	waitFor("one resume_session once the runtime is back", 30*time.Second, func() bool { return resumes() >= 1 })
	waitFor("the session resumed", 30*time.Second, func() bool { return !state().Paused })
	passes("five reconciler passes after the resume", 5)
	if n := resumes(); n != 1 {
		t.Fatalf("%d resume_session after the runtime came back, want exactly 1; engine:\n%s", n, eng.out)
	}
	if n, b := count(gone), count(back); n != 1 || b != backBefore+1 {
		t.Fatalf("presence changes: gone %d, back %d (before the restart %d), want gone once and back once more; engine:\n%s", n, b, backBefore, eng.out)
	}
}
