package telemetry

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/turnstone-dev/turnstone/events"
)

// startServer starts a server on a free port of 127.0.0.1 and closes it
// when the test ends.
func startServer(tb testing.TB, m *Metrics, h *Health) *Server {
	tb.Helper()
	logger := zerolog.New(zerolog.NewTestWriter(tb))
	srv := NewServer("127.0.0.1:0", m, h, &logger)
	if err := srv.Start(); err != nil {
		tb.Fatalf("start: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			tb.Errorf("close: %v", err)
		}
	})
	return srv
}

func get(tb testing.TB, url string) (int, string, http.Header) {
	tb.Helper()
	resp, err := http.Get(url)
	if err != nil {
		tb.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("GET %s: read body: %v", url, err)
	}
	return resp.StatusCode, string(b), resp.Header
}

func TestServerEndToEnd(t *testing.T) {
	m := NewMetrics(Namespace)
	h := NewHealth()
	var mu sync.Mutex
	var natsErr error
	h.Register("nats", func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		return natsErr
	})
	setNATS := func(err error) { mu.Lock(); natsErr = err; mu.Unlock() }

	srv := startServer(t, m, h)
	if srv.Addr() == "" || strings.HasSuffix(srv.Addr(), ":0") {
		t.Fatalf("Addr() = %q, want the bound address", srv.Addr())
	}
	base := "http://" + srv.Addr()

	s := newStream(t)
	for _, ev := range []events.Event{
		s.ev("acme", "s1", "t1", &events.TurnStarted{}),
		s.ev("acme", "s1", "t1", &events.TurnFailed{Stage: events.StageExecute, Error: events.ErrorInfo{Message: "x"}}),
		s.ev("acme", "s1", "", &events.RecoveryCompleted{CommandID: "c", Kind: "repair_orphans", Outcome: "recovered"}),
		s.ev("acme", events.BreakersSession, "", &events.BreakerChanged{Provider: "anthropic", From: "closed", To: "open"}),
	} {
		m.ObserveEvent(ev)
	}
	m.ObserveViolation("tool_use_without_result")

	code, body, hdr := get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d\n%s", code, body)
	}
	if ct := hdr.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("GET /metrics Content-Type %q", ct)
	}
	// No reconciler tick yet (a worker's registry never has one): no
	// series to alert on.
	if strings.Contains(body, "turnstone_reconciler_ticks_total") {
		t.Errorf("GET /metrics has turnstone_reconciler_ticks_total before any tick")
	}
	m.ReconcilerTicked()
	m.ReconcilerTicked()
	if _, body, _ = get(t, base+"/metrics"); !strings.Contains(body, "\nturnstone_reconciler_ticks_total 2\n") {
		t.Errorf("GET /metrics after two ticks lacks \"turnstone_reconciler_ticks_total 2\"")
	}
	for _, want := range []string{
		"turnstone_turns_started_total 1",
		`turnstone_turns_failed_total{stage="execute"} 1`,
		"turnstone_turns_in_flight 0",
		"turnstone_orphan_repairs_total 1",
		`turnstone_breaker_state{provider="anthropic",tenant="acme"} 2`,
		`turnstone_violations_total{rule="tool_use_without_result"} 1`,
		`turnstone_events_total{type="turn.started"} 1`,
		"turnstone_reconciler_fail_closed 0",
		"go_goroutines",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("GET /metrics lacks %q", want)
		}
	}

	health := func(wantCode int) Report {
		t.Helper()
		code, body, hdr := get(t, base+"/healthz")
		if code != wantCode {
			t.Fatalf("GET /healthz: %d, want %d\n%s", code, wantCode, body)
		}
		if ct := hdr.Get("Content-Type"); ct != "application/json" {
			t.Errorf("GET /healthz Content-Type %q", ct)
		}
		var rep Report
		if err := json.Unmarshal([]byte(body), &rep); err != nil {
			t.Fatalf("GET /healthz: %v\n%s", err, body)
		}
		return rep
	}
	if rep := health(http.StatusOK); rep.Status != "ok" || rep.Checks["nats"].Status != "ok" {
		t.Errorf("healthy: %+v", rep)
	}

	setNATS(errors.New("nats: no servers available for connection"))
	h.Register("reconciler", m.FailClosedCheck())
	m.SetFailClosed(true, "projector lagging")
	rep := health(http.StatusServiceUnavailable)
	if rep.Status != "failing" {
		t.Errorf("failing: status %q", rep.Status)
	}
	if c := rep.Checks["nats"]; c.Status != "failing" || c.Error != "nats: no servers available for connection" {
		t.Errorf("failing nats check: %+v", c)
	}
	if c := rep.Checks["reconciler"]; c.Status != "failing" || !strings.Contains(c.Error, "projector lagging") {
		t.Errorf("failing reconciler check: %+v", c)
	}

	setNATS(nil)
	m.SetFailClosed(false, "")
	if rep := health(http.StatusOK); rep.Status != "ok" || len(rep.Checks) != 2 {
		t.Errorf("healthy again: %+v", rep)
	}

	if code, _, _ := get(t, base+"/nope"); code != http.StatusNotFound {
		t.Errorf("GET /nope: %d, want 404", code)
	}
	resp, err := http.Post(base+"/healthz", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /healthz: %d, want 405", resp.StatusCode)
	}
}

func TestServerLifecycle(t *testing.T) {
	srv := NewServer("127.0.0.1:0", nil, nil, nil)
	if srv.Addr() != "" {
		t.Errorf("Addr() before Start = %q", srv.Addr())
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); !errors.Is(err, ErrServerStarted) {
		t.Errorf("second Start: %v, want ErrServerStarted", err)
	}
	base := "http://" + srv.Addr()
	// Nil metrics and health: an empty registry, always healthy.
	if code, body, _ := get(t, base+"/healthz"); code != http.StatusOK || !strings.Contains(body, `"status":"ok"`) {
		t.Errorf("GET /healthz with nil health: %d %s", code, body)
	}
	if code, _, _ := get(t, base+"/metrics"); code != http.StatusOK {
		t.Errorf("GET /metrics with nil metrics: %d", code)
	}

	// Close waits for a request in progress.
	h := NewHealth()
	release := make(chan struct{})
	entered := make(chan struct{})
	h.Register("slow", func(ctx context.Context) error {
		close(entered)
		<-release
		return nil
	})
	slow := NewServer("127.0.0.1:0", nil, h, nil)
	if err := slow.Start(); err != nil {
		t.Fatal(err)
	}
	got := make(chan int, 1)
	go func() {
		resp, err := http.Get("http://" + slow.Addr() + "/healthz")
		if err != nil {
			got <- -1
			return
		}
		resp.Body.Close()
		got <- resp.StatusCode
	}()
	<-entered
	closed := make(chan error, 1)
	go func() { closed <- slow.Close(context.Background()) }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a request was in progress", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
	if code := <-got; code != http.StatusOK {
		t.Errorf("request in progress during Close: %d, want 200", code)
	}

	// Close with an expired context cuts the wait short.
	stuck := NewHealth()
	stuckEntered := make(chan struct{})
	unstick := make(chan struct{})
	defer close(unstick)
	stuck.Register("stuck", func(ctx context.Context) error { close(stuckEntered); <-unstick; return nil })
	s3 := NewServer("127.0.0.1:0", nil, stuck, nil)
	if err := s3.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		if resp, err := http.Get("http://" + s3.Addr() + "/healthz"); err == nil {
			resp.Body.Close()
		}
	}()
	<-stuckEntered
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s3.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close with a stuck request: %v, want DeadlineExceeded", err)
	}

	if err := srv.Close(context.Background()); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := srv.Close(context.Background()); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := srv.Start(); !errors.Is(err, ErrServerClosed) {
		t.Errorf("Start after Close: %v, want ErrServerClosed", err)
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Error("GET after Close succeeded")
	}
	if err := NewServer("127.0.0.1:0", nil, nil, nil).Close(context.Background()); err != nil {
		t.Errorf("Close of a server never started: %v", err)
	}
	if err := NewServer("256.0.0.1:99999", nil, nil, nil).Start(); err == nil {
		t.Error("Start on a bad address succeeded")
	}
}
