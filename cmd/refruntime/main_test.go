package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/internal/ingestserver/ingesttest"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// TestMain runs the command itself when REFRUNTIME_ARGS is set, so a
// test can run it as a separate process (and watch it crash).
func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv("REFRUNTIME_ARGS"); ok {
		os.Exit(run(context.Background(), strings.Fields(args), os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestParseFlags(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		ok   bool
	}{
		"defaults":             {nil, true},
		"fault":                {[]string{"--fault", "stage-throws:history"}, true},
		"crash and exit":       {[]string{"--fault", "crash-mid-tool", "--exit-on-crash"}, true},
		"exit without crash":   {[]string{"--fault", "hang", "--exit-on-crash"}, false},
		"bad fault":            {[]string{"--fault", "provider:200"}, false},
		"negative":             {[]string{"--sessions", "-1"}, false},
		"bad prefix":           {[]string{"--session-prefix", "a.b"}, false},
		"positional arguments": {[]string{"extra"}, false},
		"unknown flag":         {[]string{"--nope"}, false},
	} {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			err := NewMain(&out, &out).ParseFlags(tc.args)
			if (err == nil) != tc.ok {
				t.Errorf("ParseFlags(%q) = %v", tc.args, err)
			}
		})
	}
}

func readSession(t *testing.T, log *events.Log, tenant, session string) []events.Event {
	t.Helper()
	var evs []events.Event
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := log.ReadSession(ctx, tenant, session, events.ReadOptions{}, func(ev events.Event) error {
		if ev.Err != nil {
			t.Errorf("seq %d: %v", ev.Seq, ev.Err)
		}
		evs = append(evs, ev)
		return nil
	}); err != nil {
		t.Fatalf("read %s: %v", session, err)
	}
	return evs
}

func TestRunSessionsAndServe(t *testing.T) {
	srv := embeddedtest.Start(t)
	nc, _ := embeddedtest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	inc, _ := embeddedtest.Connect(t, srv)
	log := ingesttest.Serve(t, inc)

	var stdout, stderr syncBuffer
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan int, 1)
	go func() {
		done <- run(runCtx, []string{"--nats-url", srv.ClientURL(), "--tenant", "acme", "--sessions", "2", "--turns", "2", "--tools", "2", "--fault", "provider:529", "--serve"}, &stdout, &stderr)
	}()

	// The sessions are printed as they start; wait for both to be recorded.
	var ids []string
	deadline := time.Now().Add(20 * time.Second)
	for {
		ids = strings.Fields(stdout.String())
		if len(ids) == 2 {
			evs := readSessionIfAny(log, "acme", ids[1])
			if len(evs) > 0 && evs[len(evs)-1].Type == events.TypeTurnFailed {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("sessions not recorded; stdout %q stderr %s", stdout.String(), stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, id := range ids {
		s := projections.Fold(readSession(t, log, "acme", id))
		if len(s.Turns) != 2 || s.Turns[0].Status != projections.TurnCompleted || s.Turns[1].Status != projections.TurnFailed || s.Errors.Total == 0 {
			t.Errorf("%s: turns %+v", id, s.Turns)
		}
	}

	// --serve answers control requests for its sessions.
	body, _ := json.Marshal(recovery.ControlRequest{CommandID: "c1", Attempt: 1, Action: recovery.ActionSwitchProvider, Tenant: "acme", Session: ids[0]})
	msg, err := nc.Request(recovery.ControlSubject("acme", ids[0]), body, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var reply recovery.ControlReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil || reply.Outcome != recovery.ReplyOK || reply.Provider != "bedrock" {
		t.Errorf("reply %s (%v)", msg.Data, err)
	}

	stop()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit status %d; stderr %s", code, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("--serve did not stop when its context ended")
	}
	if _, err := nc.Request(recovery.ControlSubject("acme", ids[0]), body, 5*time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("request after the command stopped: %v, want no responders", err)
	}
}

func readSessionIfAny(log *events.Log, tenant, session string) []events.Event {
	var evs []events.Event
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = log.ReadSession(ctx, tenant, session, events.ReadOptions{}, func(ev events.Event) error {
		evs = append(evs, ev)
		return nil
	})
	return evs
}

func TestExitOnCrash(t *testing.T) {
	srv := embeddedtest.Start(t)
	nc, _ := embeddedtest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	inc, _ := embeddedtest.Connect(t, srv)
	log := ingesttest.Serve(t, inc)

	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "REFRUNTIME_ARGS=--nats-url "+srv.ClientURL()+" --tenant acme --sessions 2 --turns 2 --fault crash-mid-tool --exit-on-crash")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != ExitCrash {
		t.Fatalf("exit: %v, want status %d; stderr %s", err, ExitCrash, stderr.String())
	}
	ids := strings.Fields(stdout.String())
	if len(ids) != 1 {
		t.Fatalf("stdout %q: want the one session that crashed", stdout.String())
	}

	evs := readSession(t, log, "acme", ids[0])
	if last := evs[len(evs)-1]; last.Type != events.TypeToolCallStarted {
		t.Errorf("last event %s, want tool_call.started", last.Type)
	}
	s := projections.Fold(evs)
	if len(s.Pending) != 1 || len(s.InFlight) != 1 || len(s.Turns) != 2 {
		t.Errorf("pending %v, in flight %v, %d turns", s.Pending, s.InFlight, len(s.Turns))
	}

	// A new process that adopts the session answers for it.
	var out, errOut syncBuffer
	serveCtx, stop := context.WithCancel(ctx)
	done := make(chan int, 1)
	go func() {
		done <- run(serveCtx, []string{"--nats-url", srv.ClientURL(), "--tenant", "acme", "--sessions", "0", "--serve", "--adopt"}, &out, &errOut)
	}()
	defer func() {
		stop()
		<-done
	}()
	body, _ := json.Marshal(recovery.ControlRequest{CommandID: "n1", Attempt: 1, Action: recovery.ActionNotice, Tenant: "acme", Session: ids[0], Notice: "turn abandoned"})
	var reply recovery.ControlReply
	for {
		msg, err := nc.Request(recovery.ControlSubject("acme", ids[0]), body, 5*time.Second)
		if errors.Is(err, nats.ErrNoResponders) && ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond) // not subscribed yet
			continue
		}
		if err != nil {
			t.Fatalf("request: %v; stderr %s", err, errOut.String())
		}
		if err := json.Unmarshal(msg.Data, &reply); err != nil {
			t.Fatal(err)
		}
		break
	}
	if reply.Outcome != recovery.ReplyOK {
		t.Errorf("adopted notice: %+v", reply)
	}
}

// TestHelp: the command builds and prints its help (a flag defined twice
// panics when the command is built, before any test of a run).
func TestHelp(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"--help"}, &out, &errOut); code != 0 {
		t.Fatalf("--help: exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "--turn-deadline") {
		t.Fatalf("--help does not name --turn-deadline:\n%s", out.String())
	}
}
