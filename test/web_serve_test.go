package test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestServeWebViewAndIncidentMetrics starts `engine serve --ui-listen`
// as a process: the web view lists a session the reference runtime failed
// with a provider's 529, the incidents page shows it, and /metrics counts
// the open incident by its class.
func TestServeWebViewAndIncidentMetrics(t *testing.T) {
	parallel(t)
	ui := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	tele := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	eng := startEngine(t, t.TempDir(), "--sync", "1s", "--ui-listen", ui, "--telemetry-listen", tele, "--incidents-every", "200ms")
	if !strings.Contains(eng.out.String(), "serving the web view") {
		t.Fatalf("the engine does not say it serves the web view:\n%s", eng.out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rt := exec.CommandContext(ctx, filepath.Join(binDir, "refruntime"), "--nats-url", eng.url, "--tenant", "web", "--sessions", "1", "--turns", "1", "--fault", "provider:529")
	rt.Env = withoutNATSURL()
	out, err := rt.Output()
	if err != nil {
		t.Fatalf("refruntime: %v\n%s", err, out)
	}
	session := strings.TrimSpace(string(out))
	get := httpGet
	waitFor(t, "the web view lists the session", func() bool {
		code, body := get("http://" + ui + "/ui/?tenant=web")
		return code == 200 && strings.Contains(body, `data-session="web/`+session+`"`)
	})
	if code, body := get("http://" + ui + "/ui/session/web/" + session); code != 200 || !strings.Contains(body, "turn.failed") {
		t.Errorf("the session page: %d\n%s", code, body)
	}
	if code, body := get("http://" + ui + "/ui/incidents"); code != 200 || !strings.Contains(body, `data-class="overloaded"`) {
		t.Errorf("the incidents page: %d\n%s", code, body)
	}
	waitFor(t, "/metrics counts the open incident", func() bool {
		_, body := get("http://" + tele + "/metrics")
		return metric(body, `turnstone_incidents_open{class="overloaded"}`) >= 1
	})
	// The view is off by default.
	if code, _ := get("http://" + tele + "/ui/"); code != http.StatusNotFound {
		t.Errorf("the telemetry address serves /ui/: %d", code)
	}
}

// httpGet returns the status and body of a GET of u (status 0 and the
// error's text when it fails).
func httpGet(u string) (int, string) {
	resp, err := http.Get(u)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
