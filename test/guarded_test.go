package test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
)

// TestServeUnderAuthGuardsTheWebViewAndKeepsMetricsFreeOfTenantData:
// `engine serve --auth` with the web view on answers 401 without the
// operator's web token (the sign-in page, or JSON to a client asking for
// it), 403 with a wrong one, and the page with the token `engine auth
// token` prints, as a bearer header or through the sign-in form's
// cookie; and /metrics, which answers anyone, holds no session name and
// nothing a tenant sent, only the tenant's name in the labels that carry
// it.
func TestServeUnderAuthGuardsTheWebViewAndKeepsMetricsFreeOfTenantData(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	spec := filepath.Join(dir, "auth.yaml")
	if err := os.WriteFile(spec, []byte("tenants: [acme]\ncredentials: ./credentials\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ui, tele := fmt.Sprintf("127.0.0.1:%d", freePort(t)), fmt.Sprintf("127.0.0.1:%d", freePort(t))
	port := freePort(t)
	cmd := exec.Command(filepath.Join(binDir, "engine"), "serve", "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--data", filepath.Join(dir, "data"),
		"--auth", spec, "--ui-listen", ui, "--telemetry-listen", tele, "--sync", "1s")
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr, cmd.Env = out, out, withoutNATSURL()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(out.String(), "engine ready"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("engine did not get ready: %s", out)
		}
	}
	eng := &engineProc{cmd: cmd, url: fmt.Sprintf("nats://127.0.0.1:%d", port), out: out}

	// A tenant's session, with a name and a prompt that must not leak.
	acme, err := nats.NkeyOptionFromSeed(filepath.Join(dir, "credentials", "acme.nk"))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(eng.url, acme)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cl, _ := ingest.NewClient(nc, ingest.ClientConfig{})
	ctx := context.Background()
	var evs []events.Event
	for _, p := range []events.Payload{&events.SessionStarted{Runtime: "canary-runtime"}, &events.TurnStarted{Prompt: "PROMPT-CANARY-41"},
		&events.ErrorRecorded{ErrorInfo: events.ErrorInfo{Message: "ERROR-CANARY-42"}}, &events.TurnCompleted{}} {
		ev, err := events.New("acme", "session-canary-43", "t1", p)
		if err != nil {
			t.Fatal(err)
		}
		ev.Source = "urn:agent:canary"
		evs = append(evs, ev)
	}
	if _, err := cl.Append(ctx, evs); err != nil {
		t.Fatal(err)
	}

	get := func(path string, hdr map[string]string) (int, string, http.Header) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+ui+path, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	token := strings.TrimSpace(run(t, eng.url, "auth", "token", spec))
	for _, c := range []struct {
		path   string
		hdr    map[string]string
		status int
		has    string
	}{
		{"/ui/", nil, http.StatusUnauthorized, "Sign in"},
		{"/ui/session/acme/session-canary-43", nil, http.StatusUnauthorized, "web token"},
		{"/ui/", map[string]string{"Accept": "application/json"}, http.StatusUnauthorized, `"error"`},
		{"/ui/", map[string]string{"Authorization": "Bearer nope"}, http.StatusForbidden, "not the operator"},
		{"/ui/", map[string]string{"Cookie": "turnstone_web=forged"}, http.StatusForbidden, "not the operator"},
		{"/ui/static/app.css", nil, http.StatusOK, ""},
		{"/ui/session/acme/session-canary-43", map[string]string{"Authorization": "Bearer " + token}, http.StatusOK, "session-canary-43"},
	} {
		status, body, _ := get(c.path, c.hdr)
		if status != c.status || !strings.Contains(body, c.has) {
			t.Errorf("GET %s %v: %d, want %d with %q:\n%.300s", c.path, c.hdr, status, c.status, c.has, body)
		}
		if status != http.StatusOK && strings.Contains(body, "session-canary-43") {
			t.Errorf("GET %s %v: a refusal shows the session", c.path, c.hdr)
		}
	}
	// A browser: the sign-in form sets the cookie.
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.PostForm("http://"+ui+"/ui/login", url.Values{"token": {token}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "turnstone_web" {
			cookie = c
		}
	}
	if resp.StatusCode != http.StatusSeeOther || cookie == nil || !cookie.HttpOnly || cookie.Value == token {
		t.Fatalf("sign-in: %d, cookie %+v", resp.StatusCode, cookie)
	}
	if status, body, _ := get("/ui/", map[string]string{"Cookie": "turnstone_web=" + cookie.Value}); status != http.StatusOK || !strings.Contains(body, "session-canary-43") {
		t.Fatalf("signed in: %d\n%.300s", status, body)
	}

	// /metrics: counts and the tenant's name in labels, nothing more.
	deadline := time.Now().Add(10 * time.Second)
	var body string
	for {
		r, err := http.Get("http://" + tele + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		body = string(b)
		if metric(body, "turnstone_turns_completed_total") >= 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if metric(body, "turnstone_turns_completed_total") < 1 {
		t.Fatalf("/metrics never counted the turn:\n%s", body)
	}
	for _, secret := range []string{"session-canary-43", "PROMPT-CANARY", "ERROR-CANARY", "canary-runtime", "urn:agent:canary"} {
		if strings.Contains(body, secret) {
			t.Errorf("/metrics holds %q", secret)
		}
	}
	for _, line := range strings.Split(body, "\n") {
		if strings.Contains(line, "acme") && !strings.Contains(line, `tenant="acme"`) {
			t.Errorf("/metrics names the tenant outside a tenant label: %s", line)
		}
	}
}
