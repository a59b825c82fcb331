package engine_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/internal/engine"
	"github.com/turnstone-dev/turnstone/internal/otel"
	"github.com/turnstone-dev/turnstone/internal/otel/otlptest"
	"github.com/turnstone-dev/turnstone/internal/telemetry"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestOTelBackendDown: while the OTLP backend refuses connections, the
// engine appends and folds as fast as with it up (its export has its own
// consumer), the export's lag shows on /metrics, and when the backend
// comes back the export catches up with every span, once.
func TestOTelBackendDown(t *testing.T) {
	t.Parallel()
	srv := embeddedtest.Start(t)
	nc, _ := embeddedtest.Connect(t, srv)
	pub, _ := embeddedtest.Connect(t, srv)
	ctx := context.Background()
	rcv := otlptest.Start(t)
	env := map[string]string{otel.EnvEndpoint: rcv.HTTP, otel.EnvScheduleDelay: "50", otel.EnvExportTimeout: "2000"}
	xc, err := otel.ConfigFromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	exp, err := otel.NewSpanExporter(ctx, xc)
	if err != nil {
		t.Fatal(err)
	}
	m := telemetry.NewMetrics(telemetry.Namespace)
	e, err := engine.Open(ctx, nc, engine.Config{Name: "otel", Metrics: m, MetricsEvery: 100 * time.Millisecond, OTel: &engine.OTelConfig{Exporter: exp,
		Export: otel.ExporterConfig{Map: xc.Map, Batch: xc.Batch, RetryMax: 200 * time.Millisecond}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.Close(cctx)
	})
	client, err := ingest.NewClient(pub, ingest.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	// Each round: one turn of a tool call in each of 8 sessions, every
	// append timed.
	round := func(r int) []time.Duration {
		var took []time.Duration
		for i := 0; i < 8; i++ {
			s := fmt.Sprintf("s%d", i)
			turn := fmt.Sprintf("t%d", r)
			tool := fmt.Sprintf("toolu_%d_%d", r, i)
			for _, p := range []events.Payload{
				&events.TurnStarted{Prompt: "go"},
				&events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: "text", Text: "go"}}},
				&events.MessageAppended{Role: events.RoleAssistant, MessageID: "msg_" + tool, Model: "claude-x", Usage: &events.Usage{InputTokens: 1, OutputTokens: 1},
					Content: []events.ContentBlock{{Type: "tool_use", ID: tool, Name: "Read", Input: []byte(`{}`)}}},
				&events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: "tool_result", ToolUseID: tool, Content: []byte(`"ok"`)}}},
				&events.TurnCompleted{},
			} {
				ev, err := events.New("acme", s, turn, p)
				if err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				if _, err := client.Append(ctx, []events.Event{ev}); err != nil {
					t.Fatal(err)
				}
				took = append(took, time.Since(start))
			}
		}
		return took
	}
	folded := func(rounds int) bool {
		for i := 0; i < 8; i++ {
			s, err := e.Session(ctx, "acme", fmt.Sprintf("s%d", i))
			if err != nil || s.Totals.Turns != rounds || len(s.InFlight) != 0 {
				return false
			}
		}
		return true
	}

	up := round(0)
	eventually(t, "round 0 exported", 10*time.Second, func() bool { return rcv.SpanCount() == 8*3 })
	rcv.Stop()
	var down []time.Duration
	for r := 1; r <= 3; r++ {
		down = append(down, round(r)...)
	}
	// The engine folded everything while the export could not send.
	eventually(t, "the engine folds with the backend down", 10*time.Second, func() bool { return folded(4) })
	if n := rcv.SpanCount(); n != 8*3 {
		t.Fatalf("the receiver got %d spans while down", n)
	}
	lag := func() uint64 {
		lags, err := e.OTel.Lags(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var n uint64
		for _, l := range lags {
			n += l
		}
		return n
	}
	if lag() == 0 {
		t.Fatal("no export lag while the backend is down")
	}
	eventually(t, "the lag on /metrics", 12*time.Second, func() bool { return metricSum(t, m, "turnstone_otel_export_lag") > 0 })
	eventually(t, "export failures counted", 5*time.Second, func() bool {
		return metricSum(t, m, "turnstone_otel_export_failures_total") > 0
	})
	// The append latency did not move: the median with the backend down
	// is within noise of the median with it up (a send that waited on
	// the backend would add its export timeout, 2 s).
	if mu, md := median(up), median(down); md > 3*mu+20*time.Millisecond {
		t.Errorf("median append latency %s with the backend down, %s with it up", md, mu)
	}

	rcv.Restart()
	eventually(t, "the export catches up", 20*time.Second, func() bool { return rcv.SpanCount() >= 8*3*4 && lag() == 0 })
	// Nothing lost, nothing twice: what arrived is what a backfill of the
	// log sends.
	refs, err := e.Log.Sessions(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	var sessions []otel.SessionRef
	for _, r := range refs {
		sessions = append(sessions, otel.SessionRef{Tenant: r.Tenant, Session: r.Session})
	}
	mem := tracetest.NewInMemoryExporter()
	if _, err := otel.Backfill(ctx, e.Log, mem, sessions, otel.BackfillConfig{}); err != nil {
		t.Fatal(err)
	}
	var want, got []string
	for _, s := range mem.GetSpans() {
		want = append(want, s.SpanContext.SpanID().String()+" "+s.Name)
	}
	for _, s := range rcv.Spans() {
		got = append(got, s.SpanID+" "+s.Name)
	}
	sort.Strings(want)
	sort.Strings(got)
	if !slices.Equal(want, got) {
		t.Fatalf("received %d spans, the log makes %d:\n%s", len(got), len(want), diff(want, got))
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// metricSum is the sum of a metric's samples in m's registry.
func metricSum(t *testing.T, m *telemetry.Metrics, name string) float64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, x := range mf.GetMetric() {
			switch {
			case x.GetGauge() != nil:
				sum += x.GetGauge().GetValue()
			case x.GetCounter() != nil:
				sum += x.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func diff(want, got []string) string {
	w, g := map[string]int{}, map[string]int{}
	for _, s := range want {
		w[s]++
	}
	for _, s := range got {
		g[s]++
	}
	var b strings.Builder
	for k, n := range w {
		if g[k] != n {
			fmt.Fprintf(&b, "%s: want %d, got %d\n", k, n, g[k])
		}
	}
	for k, n := range g {
		if _, ok := w[k]; !ok {
			fmt.Fprintf(&b, "%s: want 0, got %d\n", k, n)
		}
	}
	return b.String()
}
