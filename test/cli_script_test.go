package test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
)

// exitCode is the exit status of a finished command (0 for nil).
func exitCode(t *testing.T, err error) int {
	t.Helper()
	if err == nil {
		return 0
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("not an exit status: %v", err)
	}
	return exit.ExitCode()
}

// wantFail checks that `engine ARGS` exited with status 1 and that its
// stderr holds each of says.
func wantFail(t *testing.T, url string, says []string, args ...string) string {
	t.Helper()
	_, errOut, err := runErr(url, args...)
	if code := exitCode(t, err); code != 1 {
		t.Errorf("engine %s: exit status %d, want 1; stderr: %s", strings.Join(args, " "), code, errOut)
	}
	for _, s := range says {
		if !strings.Contains(errOut, s) {
			t.Errorf("engine %s: stderr %q lacks %q", strings.Join(args, " "), errOut, s)
		}
	}
	return errOut
}

// TestCLICanBeScripted asserts the exit status and the message of the
// CLI's edges: imports of files that are not transcripts, invalid flag
// values, recovery show --json, subjects that name no session, and text
// output that prints stored terminal escape sequences escaped.
func TestCLICanBeScripted(t *testing.T) {
	skipShort(t, "runs engine processes")
	parallel(t)
	eng := startEngine(t, t.TempDir(), "--sync", "1s")
	dir := t.TempDir()
	random := make([]byte, 4096)
	_, _ = rand.Read(random)
	for name, body := range map[string][]byte{"random.jsonl": random, "empty.jsonl": nil} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// engine import: not a transcript fails, naming it; bad lines are
	// summed up after the first few.
	for _, f := range []string{"../README.md", "../go.mod", filepath.Join(dir, "random.jsonl")} {
		errOut := wantFail(t, eng.url, []string{"not a transcript", "yielded no session", "more bad lines"}, "import", "--format", "claude-code", "--quiet", f)
		if n := strings.Count(errOut, "skipped: "+f+":"); n == 0 || n > 5 {
			t.Errorf("import %s: %d bad lines shown one by one, want 1 to 5:\n%s", f, n, errOut)
		}
	}
	out, errOut, err := runErr(eng.url, "import", "--format", "claude-code", "--quiet", filepath.Join(dir, "empty.jsonl"))
	if exitCode(t, err) != 0 || !strings.Contains(errOut, "empty:") || !strings.Contains(out, "0 sessions") {
		t.Errorf("import of an empty file: %v\n%s%s", err, out, errOut)
	}

	// Invalid flag values list the valid ones.
	wantFail(t, eng.url, []string{`--state "bogus"`, "pending, running, completed, parked, skipped"}, "recovery", "list", "--state", "bogus")
	wantFail(t, eng.url, []string{`--kind "bogus"`, "repair_orphans", "abort_session"}, "recovery", "issue", "x", "--kind", "bogus")
	wantFail(t, eng.url, []string{`--tenant "*"`}, "sessions", "--tenant", "*")
	help := run(t, eng.url, "recovery", "issue", "--help")
	if !strings.Contains(help, "[--reason TEXT]") || strings.Contains(help, "--reason TEXT\n") || !strings.Contains(help, `(default "issued by hand")`) {
		t.Errorf("recovery issue --help presents --reason as required:\n%s", help)
	}

	// A session whose prompt, error and pause reason hold terminal
	// sequences (a title change, a screen clear).
	_, js, log := connectJS(t, eng.url)
	const esc = "\x1b]0;pwned\x07\x1b[2J"
	var evs []events.Event
	for _, st := range []struct {
		turn string
		p    events.Payload
	}{
		{"", &events.SessionStarted{Runtime: "test " + esc}},
		{"t1", &events.TurnStarted{Prompt: "hello " + esc}},
		{"t1", &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: events.BlockText, Text: "hello " + esc}}}},
		{"t1", &events.TurnFailed{Stage: events.StageExecute, Error: events.ErrorInfo{Message: "boom " + esc, Kind: events.KindLogic}}},
		{"", &events.SessionPaused{Reason: "held " + esc}},
	} {
		ev, err := events.New("esc", "s1", st.turn, st.p)
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	if _, err := log.Append(context.Background(), evs); err != nil {
		t.Fatal(err)
	}
	// An event published on a subject with a literal "*": the engine
	// refuses it (the contract forbids the token) and quarantines it.
	body, _ := evs[0].Encode()
	m := nats.NewMsg("agent.evt.esc.*")
	m.Data = body
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err = js.PublishMsg(ctx, m)
	cancel()
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != ingest.CodeInvalid {
		t.Fatalf("publish on a literal *: %v, want the engine's error %d", err, ingest.CodeInvalid)
	}
	// One stored under such a subject (by a writer with access to the
	// stream, or an earlier version's transform) is never invisible.
	m = nats.NewMsg("agent.evt.0.esc.*")
	m.Data = body
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	_, err = js.PublishMsg(ctx, m)
	cancel()
	if err != nil {
		t.Fatalf("store under a literal *: %v", err)
	}

	sessions := run(t, eng.url, "sessions", "--tenant", "esc")
	if !strings.Contains(sessions, "invalid") || !strings.Contains(sessions, "invalid: subject agent.evt.0.esc.* (1 event(s))") {
		t.Errorf("sessions does not report the subject with a literal *:\n%s", sessions)
	}
	var views []struct {
		Session, Status, Subject string
		StatusDetail             string `json:"status_detail"`
	}
	if err := json.Unmarshal([]byte(run(t, eng.url, "sessions", "--json")), &views); err != nil {
		t.Fatal(err)
	}
	invalid := 0
	for _, v := range views {
		if v.Status == "invalid" && v.Subject == "agent.evt.0.esc.*" {
			invalid++
		}
	}
	if invalid != 1 {
		t.Errorf("sessions --json lists the invalid subject %d times: %+v", invalid, views)
	}
	if broken := run(t, eng.url, "sessions", "--broken", "--tenant", "esc"); !strings.Contains(broken, "agent.evt.0.esc.*") {
		t.Errorf("sessions --broken leaves out the invalid subject:\n%s", broken)
	}
	if inc := run(t, eng.url, "incidents", "--by", "session", "--tenant", "esc"); !strings.Contains(inc, "agent.evt.0.esc.*") || !strings.Contains(inc, "esc/s1") {
		t.Errorf("incidents:\n%s", inc)
	}

	// Every text reader prints the sequences escaped, never raw.
	waitProjectorIdle(t, js)
	run(t, eng.url, "recovery", "issue", "esc/s1", "--kind", "resume_session", "--reason", "go on "+esc)
	var rows []struct {
		Command struct{ ID, Kind string } `json:"command"`
	}
	if err := json.Unmarshal([]byte(run(t, eng.url, "recovery", "list", "--session", "s1", "--json")), &rows); err != nil {
		t.Fatalf("recovery list --json: %v", err)
	}
	rows = slices.DeleteFunc(rows, func(r struct {
		Command struct{ ID, Kind string } `json:"command"`
	}) bool {
		return r.Command.Kind != "resume_session"
	})
	if len(rows) != 1 {
		t.Fatalf("recovery list --json: %+v, want the resume_session issued", rows)
	}
	for _, args := range [][]string{
		{"sessions"}, {"inspect", "esc/s1"}, {"replay", "esc/s1"}, {"diff", "esc/s1", "--from", "0"}, {"incidents"}, {"incidents", "--by", "session"}, {"recovery", "list"}, {"recovery", "show", rows[0].Command.ID},
	} {
		out := run(t, eng.url, args...)
		if strings.ContainsAny(out, "\x1b\x07") {
			t.Errorf("engine %s prints a raw control character:\n%q", strings.Join(args, " "), out)
		}
		if args[0] == "inspect" || args[0] == "replay" {
			if !strings.Contains(out, `\x1b]0;pwned\x07`) {
				t.Errorf("engine %s does not show the prompt escaped:\n%s", strings.Join(args, " "), out)
			}
		}
	}

	// recovery show --json: the command, its status, its events.
	var shown struct {
		Command struct{ ID, Kind, Reason string } `json:"command"`
		Seq     uint64                            `json:"seq"`
		Status  struct{ State string }            `json:"status"`
		Events  []json.RawMessage                 `json:"events"`
	}
	if err := json.Unmarshal([]byte(run(t, eng.url, "recovery", "show", rows[0].Command.ID, "--json")), &shown); err != nil {
		t.Fatal(err)
	}
	if shown.Command.ID != rows[0].Command.ID || shown.Command.Kind != "resume_session" || shown.Seq == 0 || shown.Status.State != "pending" || shown.Events == nil {
		t.Errorf("recovery show --json: %+v", shown)
	}

	// inspect --json always has in_flight, also once no turn is in flight
	// (the README's snippet reads it).
	var st map[string]json.RawMessage
	if err := json.Unmarshal([]byte(run(t, eng.url, "inspect", "esc/s1", "--json")), &st); err != nil {
		t.Fatal(err)
	}
	if string(st["in_flight"]) != "[]" {
		t.Errorf("inspect --json in_flight = %s, want []", st["in_flight"])
	}

	// A worker's telemetry port in use is said at once, with the flag.
	l, port := listen(t)
	defer l.Close()
	start := time.Now()
	wcmd := exec.Command(filepath.Join(binDir, "worker"), "--nats-url", eng.url, "--telemetry-listen", fmt.Sprintf("127.0.0.1:%d", port))
	wcmd.Env = withoutNATSURL()
	wout, err := wcmd.CombinedOutput()
	if exitCode(t, err) != 1 || !strings.Contains(string(wout), "address in use") || !strings.Contains(string(wout), "--telemetry-listen") || time.Since(start) > 5*time.Second {
		t.Errorf("worker on a busy telemetry port: %v after %s: %s", err, time.Since(start), wout)
	}

	// Logs written to a pipe have no colour.
	if out := eng.out.String(); strings.Contains(out, "\x1b[") || !strings.Contains(out, "INF") {
		t.Errorf("the engine's log to a pipe is coloured (or empty):\n%q", out)
	}
	rt := exec.Command(filepath.Join(binDir, "refruntime"), "--nats-url", eng.url, "--tenant", "colour", "--turns", "1", "--verbose")
	rt.Env = withoutNATSURL()
	var rtErr bytes.Buffer
	rt.Stderr = &rtErr
	if err := rt.Run(); err != nil {
		t.Fatalf("refruntime: %v\n%s", err, rtErr.String())
	}
	if strings.Contains(rtErr.String(), "\x1b[") || rtErr.Len() == 0 {
		t.Errorf("refruntime's log to a pipe is coloured (or empty):\n%q", rtErr.String())
	}
	eng.stop(t)
}

// listen holds a TCP port on the loopback until the test closes it.
func listen(t *testing.T) (net.Listener, int) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, l.Addr().(*net.TCPAddr).Port
}

// TestBusyPortsAreReportedAtOnce starts `engine serve` on a port another
// process holds, for each of its listening flags: it must exit at once
// saying "address in use" and naming the flag, not wait for the server.
func TestBusyPortsAreReportedAtOnce(t *testing.T) {
	parallel(t)
	_, busy := listen(t)
	for _, tc := range []struct {
		flag string
		args []string
	}{
		{"--listen", []string{"--listen", fmt.Sprintf("127.0.0.1:%d", busy), "--telemetry-listen", ""}},
		{"--telemetry-listen", []string{"--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--telemetry-listen", fmt.Sprintf("127.0.0.1:%d", busy)}},
	} {
		start := time.Now()
		cmd := exec.Command(filepath.Join(binDir, "engine"), append([]string{"serve", "--data", t.TempDir()}, tc.args...)...)
		cmd.Env = withoutNATSURL()
		out, err := cmd.CombinedOutput()
		took := time.Since(start)
		if exitCode(t, err) != 1 || !strings.Contains(string(out), "address in use") || !strings.Contains(string(out), "choose another with "+tc.flag) {
			t.Errorf("%s on a busy port: %v: %s", tc.flag, err, out)
		}
		if took > 3*time.Second {
			t.Errorf("%s on a busy port took %s to fail, want at once", tc.flag, took)
		}
	}
}
