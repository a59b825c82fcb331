package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/internal/otel/otlptest"
)

// TestOTelExportsACrashedRuntime runs the engine, a worker and the
// reference runtime as processes, the engine configured for OpenTelemetry
// by the standard variables alone, against a real OTLP receiver. The
// runtime crashes between a tool_use and its result; the turn is
// abandoned and the reconciler repairs the orphan. The backend receives,
// live, the crashed tools' execute_tool spans with status Error and their
// anomaly events, and the repair as a child span of the orphan's; `engine
// export otel` of the same session then sends identical spans.
func TestOTelExportsACrashedRuntime(t *testing.T) {
	skipShort(t, "runs engine processes")
	parallel(t)
	live := otlptest.Start(t)
	eng := startEngineEnvAt(t, t.TempDir(), freePort(t), []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + live.HTTP, "OTEL_BSP_SCHEDULE_DELAY=100", "OTEL_SERVICE_NAME=turnstone-e2e",
	}, "--sync", "1s")
	_, wout := startWorker(t, eng.url, "w1")

	session := crashAndAbandon(t, eng)

	// Live: the orphans' spans, their anomalies, the repair under them.
	var orphans []otlptest.Span
	var repair otlptest.Span
	deadline := time.Now().Add(45 * time.Second)
	for {
		orphans, repair = nil, otlptest.Span{}
		byID := map[string]otlptest.Span{}
		for _, s := range live.Spans() {
			byID[s.SpanID] = s
		}
		for _, s := range byID {
			if s.Attrs["gen_ai.operation.name"] == "execute_tool" && s.StatusCode == "ERROR" && s.Attrs["error.type"] == "tool_use_without_result" {
				orphans = append(orphans, s)
			}
			if s.Name == "recovery repair_orphans" && s.Attrs["turnstone.recovery.outcome"] == "recovered" {
				repair = s
			}
		}
		if len(orphans) == 2 && repair.SpanID != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 45s: %d orphaned tool spans, repair %q; spans: %v\nworker: %s", len(orphans), repair.Name, spanNames(live.Spans()), wout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, o := range orphans {
		if !hasEvent(o, "turnstone.anomaly") {
			t.Errorf("orphan span %s without its anomaly event: %+v", o.Name, o.Events)
		}
		if o.Attrs["gen_ai.tool.call.id"] == "" || o.Attrs["gen_ai.conversation.id"] != "demo/"+session || o.Resource["service.name"] != "turnstone-e2e" {
			t.Errorf("orphan span %s: %v resource %v", o.Name, o.Attrs, o.Resource)
		}
	}
	if repair.ParentID != orphans[0].SpanID && repair.ParentID != orphans[1].SpanID || repair.TraceID != orphans[0].TraceID {
		t.Errorf("the repair's span (parent %s) is not under an orphan's (%s, %s)", repair.ParentID, orphans[0].SpanID, orphans[1].SpanID)
	}
	var abandoned bool
	for _, s := range live.Spans() {
		if s.Attrs["gen_ai.operation.name"] == "invoke_agent" && s.Attrs["error.type"] == "turn_abandoned" && s.SpanID == orphans[0].ParentID {
			abandoned = true
		}
	}
	if !abandoned {
		t.Error("the orphans' parent is not the abandoned turn's invoke_agent span with error.type turn_abandoned")
	}

	// Backfill of the same session: the same spans. Wait for the live
	// export to have sent everything first (its lag on /metrics is the
	// engine's; here: no new span for a while).
	waitQuiet(t, live)
	back := otlptest.Start(t)
	cmd := exec.Command(filepath.Join(binDir, "engine"), "export", "otel", "demo/"+session)
	cmd.Env = append(withoutNATSURL(), "TURNSTONE_NATS_URL="+eng.url, "OTEL_EXPORTER_OTLP_ENDPOINT="+back.GRPC,
		"OTEL_EXPORTER_OTLP_PROTOCOL=grpc", "OTEL_SERVICE_NAME=turnstone-e2e")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("engine export otel: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), "exported") {
		t.Errorf("export report: %q", stdout.String())
	}
	a, b := uniqueKeys(live.Spans()), uniqueKeys(back.Spans())
	if !slices.Equal(a, b) {
		t.Fatalf("live export: %d spans; engine export otel: %d\nlive: %v\nbackfill: %v", len(a), len(b), a, b)
	}
}

// crashAndAbandon runs the reference runtime with a crash between a
// turn's two tool_use blocks and their results (it exits with status 3),
// abandons the crashed turn by hand (the reconciler then repairs the
// orphans), and returns the session.
func crashAndAbandon(t *testing.T, eng *engineProc) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rt := exec.CommandContext(ctx, filepath.Join(binDir, "refruntime"), "--nats-url", eng.url, "--tenant", "demo",
		"--sessions", "1", "--turns", "2", "--tools", "2", "--fault", "crash-mid-tool", "--exit-on-crash")
	rt.Env = withoutNATSURL()
	out, err := rt.Output()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Fatalf("refruntime: want exit status 3 (crash), got %v", err)
	}
	session := strings.TrimSpace(string(out))
	var state struct {
		InFlight []string `json:"in_flight"`
	}
	if err := json.Unmarshal([]byte(run(t, eng.url, "inspect", "demo/"+session, "--json")), &state); err != nil || len(state.InFlight) != 1 {
		t.Fatalf("in flight after the crash: %v %v", state.InFlight, err)
	}
	run(t, eng.url, "recovery", "issue", "demo/"+session, "--kind", "abandon_turn", "--turn", state.InFlight[0], "--reason", "runtime crashed")
	return session
}

func hasEvent(s otlptest.Span, name string) bool {
	for _, e := range s.Events {
		if e.Name == name {
			return true
		}
	}
	return false
}

func spanNames(spans []otlptest.Span) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name+"("+s.StatusCode+")")
	}
	return out
}

// uniqueKeys is the set of the spans' whole renderings, sorted (a span
// the live export sent twice, which its at-least-once delivery allows,
// counts once).
func uniqueKeys(spans []otlptest.Span) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range spans {
		if k := s.Key(); !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// waitQuiet waits until rcv received no new span for a second.
func waitQuiet(t *testing.T, rcv *otlptest.Receiver) {
	t.Helper()
	n, since := rcv.SpanCount(), time.Now()
	deadline := time.Now().Add(30 * time.Second)
	for time.Since(since) < time.Second {
		if time.Now().After(deadline) {
			t.Fatal("spans keep arriving")
		}
		time.Sleep(50 * time.Millisecond)
		if m := rcv.SpanCount(); m != n {
			n, since = m, time.Now()
		}
	}
}
