package otel

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/otel/otlptest"
)

// otlpExporter returns an OTLP exporter (protocol grpc or http/protobuf)
// to rcv, configured as an engine is: by the standard variables.
func otlpExporter(t *testing.T, rcv *otlptest.Receiver, protocol string) ExportConfig {
	t.Helper()
	endpoint := rcv.HTTP
	if protocol == ProtocolGRPC {
		endpoint = rcv.GRPC
	}
	env := map[string]string{EnvEndpoint: endpoint, EnvProtocol: protocol, EnvScheduleDelay: "100"}
	cfg, err := ConfigFromEnv(func(k string) string { return env[k] })
	if err != nil || !cfg.Enabled {
		t.Fatalf("config: %+v %v", cfg, err)
	}
	return cfg
}

// waitSpans waits until rcv holds at least n spans.
func waitSpans(t *testing.T, rcv *otlptest.Receiver, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for rcv.SpanCount() < n {
		if time.Now().After(deadline) {
			t.Fatalf("the receiver has %d spans after %s, want %d", rcv.SpanCount(), within, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func keys(spans []otlptest.Span) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Key()
	}
	slices.Sort(out)
	return out
}

// TestLiveExportMatchesBackfill: sessions exported live (over OTLP/gRPC,
// as their events are stored) and backfilled afterwards (over
// OTLP/HTTP) arrive as identical spans, ids included, at a real OTLP
// receiver; each span once.
func TestLiveExportMatchesBackfill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	log := newLog(t)
	if err := EnsureConsumers(ctx, log.JetStream(), log.Partitions()); err != nil {
		t.Fatal(err)
	}
	live := otlptest.Start(t)
	lc := otlpExporter(t, live, ProtocolGRPC)
	exp, err := NewSpanExporter(ctx, lc)
	if err != nil {
		t.Fatal(err)
	}
	x, err := NewExporter(log, exp, ExporterConfig{Map: lc.Map, Batch: lc.Batch}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := x.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Close(context.Background()) })

	importFiles(t, log, "live", smallFiles(t)...)
	sessions := sessionRefs(t, log, "live")

	back := otlptest.Start(t)
	bc := otlpExporter(t, back, ProtocolHTTP)
	bexp, err := NewSpanExporter(ctx, bc)
	if err != nil {
		t.Fatal(err)
	}
	stats, err := Backfill(ctx, log, bexp, sessions, BackfillConfig{Map: bc.Map, Batch: bc.Batch})
	if err != nil {
		t.Fatal(err)
	}
	_ = bexp.Shutdown(ctx)
	if stats.Spans == 0 || back.SpanCount() != stats.Spans {
		t.Fatalf("backfill: %+v, the receiver has %d spans", stats, back.SpanCount())
	}
	waitSpans(t, live, stats.Spans, 30*time.Second)
	// Nothing more comes: the live export sent each span once.
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		if live.SpanCount() > stats.Spans {
			t.Fatalf("live export sent %d spans, the backfill %d", live.SpanCount(), stats.Spans)
		}
		time.Sleep(20 * time.Millisecond)
	}
	a, b := keys(live.Spans()), keys(back.Spans())
	if !slices.Equal(a, b) {
		for i := range min(len(a), len(b)) {
			if a[i] != b[i] {
				t.Fatalf("first difference:\nlive     %s\nbackfill %s", a[i], b[i])
			}
		}
	}
	if r, _ := live.Refused(); r != 0 {
		t.Fatalf("the receiver refused %d requests", r)
	}
	for _, s := range live.Spans() {
		if s.SchemaURL != SchemaURL || s.Scope != ScopeName || s.Resource["service.name"] != DefaultServiceName {
			t.Fatalf("span %q: scope %q schema %q resource %v", s.Name, s.Scope, s.SchemaURL, s.Resource)
		}
	}
	lags, err := x.Lags(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for p, lag := range lags {
		if lag != 0 {
			t.Errorf("partition %d: export lag %d after everything arrived", p, lag)
		}
	}
}

// TestLiveExportRestoresOpenSpans: an exporter that stops in the middle
// of a session (a handover, a restart) is replaced by another, which
// restores the session's open spans from the log (the turn and tools
// the first half opened end in the second); the spans arrive whole and
// once, as a backfill sends them.
func TestLiveExportRestoresOpenSpans(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	log := newLog(t)
	if err := EnsureConsumers(ctx, log.JetStream(), log.Partitions()); err != nil {
		t.Fatal(err)
	}
	rcv := otlptest.Start(t)
	cfg := otlpExporter(t, rcv, ProtocolHTTP)
	start := func() *Exporter {
		exp, err := NewSpanExporter(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		x, err := NewExporter(log, exp, ExporterConfig{Map: cfg.Map, Batch: cfg.Batch}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := x.Open(ctx); err != nil {
			t.Fatal(err)
		}
		return x
	}
	// A session written in two halves, an exporter for each: the first
	// half opens a turn (and tools) the second half ends.
	evs := convert(t, smallFiles(t)[2], "handover")
	half := len(evs) / 2
	x := start()
	if _, err := log.Append(ctx, evs[:half]); err != nil {
		t.Fatal(err)
	}
	waitLag(t, x, 0)
	_ = x.Close(ctx)
	if _, err := log.Append(ctx, evs[half:]); err != nil {
		t.Fatal(err)
	}
	x = start()
	t.Cleanup(func() { _ = x.Close(context.Background()) })
	waitLag(t, x, 0)

	back := otlptest.Start(t)
	bc := otlpExporter(t, back, ProtocolHTTP)
	bexp, _ := NewSpanExporter(ctx, bc)
	if _, err := Backfill(ctx, log, bexp, sessionRefs(t, log, "handover"), BackfillConfig{}); err != nil {
		t.Fatal(err)
	}
	_ = bexp.Shutdown(ctx)
	a, b := keys(rcv.Spans()), keys(back.Spans())
	if !slices.Equal(a, b) {
		t.Fatalf("live across a handover: %d spans; backfill: %d", len(a), len(b))
	}
}

// convert converts one transcript into events of tenant.
func convert(t *testing.T, file, tenant string) []events.Event {
	t.Helper()
	c := newConverter(t, tenant)
	res, err := c.ConvertFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var evs []events.Event
	for _, s := range res.Sessions {
		evs = append(evs, s.Events...)
	}
	return evs
}

// waitLag waits until every partition's export lag is at most n.
func waitLag(t *testing.T, x *Exporter, n uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		lags, err := x.Lags(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var total uint64
		for _, l := range lags {
			total += l
		}
		if total <= n && len(lags) > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("export lag %v after 30s", lags)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLiveExportHandsBackWhatItCouldNotSend: an exporter that stops while
// its backend is down hands the events it read back; the next one (the
// backend up again) exports every span of them. (Events handed back while
// the old owner's pull request still waits at the server come again after
// the consumer's AckWait: a minute by default, 2 s here.)
func TestLiveExportHandsBackWhatItCouldNotSend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	log := newLog(t)
	st, err := log.JetStream().Stream(ctx, events.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	for p := 0; p < log.Partitions(); p++ {
		cc := ConsumerConfig("hand", "", p)
		cc.AckWait = 2 * time.Second
		if _, err := st.CreateOrUpdateConsumer(ctx, cc); err != nil {
			t.Fatal(err)
		}
	}
	rcv := otlptest.Start(t)
	rcv.Stop()
	cfg := otlpExporter(t, rcv, ProtocolHTTP)
	start := func() *Exporter {
		exp, err := NewSpanExporter(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		x, err := NewExporter(log, exp, ExporterConfig{Durable: "hand", Map: cfg.Map, Batch: cfg.Batch, RetryMax: 100 * time.Millisecond}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := x.Open(ctx); err != nil {
			t.Fatal(err)
		}
		return x
	}
	x := start()
	evs := convert(t, smallFiles(t)[1], "back")
	if _, err := log.Append(ctx, evs); err != nil {
		t.Fatal(err)
	}
	// Everything is delivered to x, which cannot send it.
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, failures := x.Exported()
		if failures > 0 && pendingOf(t, log, "hand") == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the events were not all delivered to the exporter")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_ = x.Close(cctx)
	cancel()
	if rcv.SpanCount() != 0 {
		t.Fatal("spans arrived at a stopped backend")
	}
	rcv.Restart()
	y := start()
	t.Cleanup(func() { _ = y.Close(context.Background()) })
	waitLag(t, y, 0)
	mem := backfill(t, log, sessionRefs(t, log, "back"), BackfillConfig{})
	got := map[string]int{}
	for _, s := range rcv.Spans() {
		got[s.SpanID]++
	}
	for _, s := range mem {
		if got[s.SpanContext.SpanID().String()] == 0 {
			t.Errorf("span %q was lost", s.Name)
		}
	}
	if len(got) != len(mem) {
		t.Errorf("%d distinct spans arrived, the log makes %d", len(got), len(mem))
	}
}

// pendingOf is how many events the export consumers have not delivered.
func pendingOf(t *testing.T, log *events.Log, durable string) uint64 {
	t.Helper()
	st, err := log.JetStream().Stream(context.Background(), events.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for p := 0; p < log.Partitions(); p++ {
		c, err := st.Consumer(context.Background(), ConsumerName(durable, p))
		if err != nil {
			t.Fatal(err)
		}
		ci, err := c.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		n += ci.NumPending
	}
	return n
}

// smallFiles are the short shipped transcripts: a clean short session, a
// tool-heavy one, one with a subagent, and an older Claude Code's.
func smallFiles(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, f := range []string{"spotter/short.jsonl", "spotter/tool_heavy.jsonl", "spotter/subagent.jsonl", "ccviewer/1af7fc5e-8455-4414-9ccd-011d40f70b2a.jsonl"} {
		out = append(out, filepath.Join(transcriptsDir, f))
	}
	return out
}
