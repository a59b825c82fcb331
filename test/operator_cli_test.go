package test

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnstone-dev/turnstone/internal/auth"
)

// TestOperatorsFirstHour runs the commands a newcomer types in their first
// hour, on a real engine serving TLS, and checks what they answer (issue
// 20): --version, the connection errors, contexts, a missing argument,
// --session TENANT/SESSION, a replay before the first event, --since in
// days, the diff's ends, and a log that says each thing once.
func TestOperatorsFirstHour(t *testing.T) {
	parallel(t)
	certs := t.TempDir()
	if _, err := auth.WriteCerts(auth.CertConfig{Dir: certs, Hosts: []string{"127.0.0.1"}}); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	serve := exec.Command(filepath.Join(binDir, "engine"), "serve", "--data", t.TempDir(), "--sync", "1s",
		"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--telemetry-listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		"--tls-cert", filepath.Join(certs, auth.ServerCertFile), "--tls-key", filepath.Join(certs, auth.ServerKeyFile))
	serve.Env = withoutNATSURL()
	var log syncBuffer
	serve.Stdout, serve.Stderr = &log, &log
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = serve.Process.Kill(); _ = serve.Wait() })
	waitFor(t, "the engine serving TLS is ready", func() bool { return strings.Contains(log.String(), "engine ready") })
	url := fmt.Sprintf("tls://127.0.0.1:%d", port)
	ca := filepath.Join(certs, auth.CAFile)
	config := t.TempDir()
	env := append(withoutNATSURL(), "XDG_CONFIG_HOME="+config, "HOME="+config)
	cli := func(bin string, args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(filepath.Join(binDir, bin), args...)
		cmd.Env = env
		var out, errOut syncBuffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		code := 0
		if err != nil {
			code = exitCode(t, err)
		}
		return out.String(), errOut.String(), code
	}
	ok := func(bin string, args ...string) string {
		t.Helper()
		out, errOut, code := cli(bin, args...)
		if code != 0 {
			t.Fatalf("%s %s: exit %d\n%s%s", bin, strings.Join(args, " "), code, out, errOut)
		}
		return out
	}
	fails := func(says []string, bin string, args ...string) string {
		t.Helper()
		out, errOut, code := cli(bin, args...)
		if code == 0 {
			t.Errorf("%s %s: exit 0, want an error\n%s", bin, strings.Join(args, " "), out)
		}
		for _, s := range says {
			if !strings.Contains(errOut, s) {
				t.Errorf("%s %s: stderr %q lacks %q", bin, strings.Join(args, " "), errOut, s)
			}
		}
		return errOut
	}

	// --version says what each binary was built from.
	if v := ok("engine", "--version"); !strings.Contains(v, "nats-server  v") || !strings.Contains(v, "(embedded)") || !strings.Contains(v, "go           go1.") {
		t.Errorf("engine --version:\n%s", v)
	}
	for _, bin := range []string{"worker", "refruntime"} {
		if v := ok(bin, "--version"); !strings.Contains(v, bin+" ") || !strings.Contains(v, "(the version it is tested with; not linked)") {
			t.Errorf("%s --version:\n%s", bin, v)
		}
	}

	// A TLS server reached without its CA: the error names --tls-ca, and
	// does not ask whether the engine runs.
	errOut := fails([]string{"--tls-ca"}, "engine", "sessions", "--nats-url", url)
	if strings.Contains(errOut, "engine serve` running") {
		t.Errorf("a TLS failure suggests the engine is not running: %s", errOut)
	}
	// A context saves the flags; every binary honours it.
	ok("engine", "context", "save", "tls", "--nats-url", url, "--tls-ca", ca, "--select")
	ok("engine", "sessions")
	session := strings.TrimSpace(ok("refruntime", "--tenant", "demo", "--turns", "2"))
	other := strings.TrimSpace(ok("refruntime", "--tenant", "demo", "--turns", "1"))
	if !strings.HasPrefix(session, "rt-") || !strings.HasPrefix(other, "rt-") {
		t.Fatalf("refruntime through the context printed %q, %q", session, other)
	}
	w := exec.Command(filepath.Join(binDir, "worker"), "--name", "ctx-worker")
	w.Env = env
	var wlog syncBuffer
	w.Stderr = &wlog
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Process.Kill(); _ = w.Wait() })
	waitFor(t, "the worker joins through the selected context", func() bool {
		return strings.Contains(wlog.String(), "worker joined the recovery group")
	})

	// A missing argument says which, with an example.
	fails([]string{"missing SESSION", "for example: engine inspect"}, "engine", "inspect")
	fails([]string{"missing SESSION"}, "engine", "replay")
	// A replay before the session's first event is an error saying where
	// it starts.
	var sums []struct {
		Session  string
		FirstSeq uint64 `json:"first_seq"`
		LastSeq  uint64 `json:"last_seq"`
	}
	waitFor(t, "both sessions indexed", func() bool {
		_ = json.Unmarshal([]byte(ok("engine", "sessions", "--json")), &sums)
		return len(sums) == 2
	})
	var later struct {
		Session  string
		FirstSeq uint64
		LastSeq  uint64
	}
	for _, s := range sums {
		if s.FirstSeq > later.FirstSeq {
			later.Session, later.FirstSeq, later.LastSeq = s.Session, s.FirstSeq, s.LastSeq
		}
	}
	fails([]string{"--until-seq 1: no event of the session up to it", fmt.Sprintf("starts at seq %d", later.FirstSeq)},
		"engine", "replay", "demo/"+later.Session, "--until-seq", "1")
	if out := ok("engine", "replay", "demo/"+later.Session, "--until-seq", fmt.Sprint(later.FirstSeq)); !strings.Contains(out, "1 events replayed") {
		t.Errorf("replay to the first event:\n%s", out)
	}
	// --session takes TENANT/SESSION, as the table prints it.
	ok("engine", "recovery", "issue", "demo/"+session, "--kind", "resume_session", "--reason", "by hand")
	for _, arg := range []string{"demo/" + session, session, session[:8]} {
		if out := ok("engine", "recovery", "list", "--session", arg); !strings.Contains(out, "demo/"+session) {
			t.Errorf("recovery list --session %s lists nothing:\n%s", arg, out)
		}
	}
	if out := ok("engine", "recovery", "list", "--session", "other/"+session); strings.Contains(out, session) {
		t.Errorf("recovery list --session other/...: lists another tenant's command:\n%s", out)
	}
	// --since takes days, as the policy file does.
	ok("engine", "incidents", "--since", "1d")
	ok("engine", "incidents", "--by", "session", "--since", "7d")
	fails([]string{`"7d"`}, "engine", "incidents", "--since", "1w")
	// The diff names the sequence its "to" stands for.
	out := ok("engine", "diff", "demo/"+later.Session, "--from", "0")
	if strings.Contains(out, "seq 0 (state") || !strings.Contains(out, fmt.Sprintf("to          seq %d (the last event)", later.LastSeq)) {
		t.Errorf("diff --from 0:\n%s", out)
	}
	// The engine says each thing once.
	for _, line := range []string{"serving /metrics and /healthz", "engine ready"} {
		if n := strings.Count(log.String(), line); n != 1 {
			t.Errorf("the engine logged %q %d times:\n%s", line, n, log.String())
		}
	}
}
