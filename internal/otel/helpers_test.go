package otel

import (
	"context"
	"os"
	"testing"

	"github.com/rs/zerolog"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/claudecode"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// transcriptsDir is where the shared real transcripts live, beside the
// repository.
const transcriptsDir = "../../../shared/data/transcripts/claude-code"

func transcriptFiles(t testing.TB) []string {
	t.Helper()
	if _, err := os.Stat(transcriptsDir); err != nil {
		t.Fatalf("real transcripts not found at %s (the shared data sits beside the repository): %v", transcriptsDir, err)
	}
	files, err := claudecode.Expand([]string{transcriptsDir})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 20 {
		t.Fatalf("found %d transcript files, want the 25 shipped", len(files))
	}
	return files
}

// newLog opens a log on an embedded server of its own.
func newLog(t testing.TB) *events.Log {
	t.Helper()
	srv := embeddedtest.Start(t)
	_, js := embeddedtest.Connect(t, srv)
	log, err := events.Open(context.Background(), js, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return log
}

// importFiles imports Claude Code transcripts into log under tenant.
func importFiles(t testing.TB, log *events.Log, tenant string, files ...string) {
	t.Helper()
	rep, err := claudecode.Import(context.Background(), claudecode.LogStore(log), files, claudecode.Options{Tenant: tenant}, nil)
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if len(rep.Diagnostics) != 0 {
		t.Fatalf("import diagnostics: %v", rep.Diagnostics)
	}
}

// sessionRefs lists a tenant's sessions.
func sessionRefs(t testing.TB, log *events.Log, tenant string) []SessionRef {
	t.Helper()
	rs, err := log.Sessions(context.Background(), tenant)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]SessionRef, len(rs))
	for i, r := range rs {
		out[i] = SessionRef{Tenant: r.Tenant, Session: r.Session, Events: r.Events}
	}
	return out
}

// backfill exports sessions into an in-memory exporter and returns the
// spans.
func backfill(t testing.TB, log *events.Log, sessions []SessionRef, cfg BackfillConfig) tracetest.SpanStubs {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	if _, err := Backfill(context.Background(), log, exp, sessions, cfg); err != nil {
		t.Fatal(err)
	}
	return exp.GetSpans()
}

// attr returns a span's attribute value as a string ("" when absent).
func attr(s tracetest.SpanStub, k attribute.Key) string {
	for _, kv := range s.Attributes {
		if kv.Key == k {
			return kv.Value.Emit()
		}
	}
	return ""
}

func attrInt(s tracetest.SpanStub, k attribute.Key) int64 {
	for _, kv := range s.Attributes {
		if kv.Key == k {
			return kv.Value.AsInt64()
		}
	}
	return 0
}

func hasAttr(s tracetest.SpanStub, k attribute.Key) bool {
	for _, kv := range s.Attributes {
		if kv.Key == k {
			return true
		}
	}
	return false
}

// byOp groups spans by gen_ai.operation.name.
func byOp(spans tracetest.SpanStubs) map[string][]tracetest.SpanStub {
	out := map[string][]tracetest.SpanStub{}
	for _, s := range spans {
		op := attr(s, KeyOperationName)
		out[op] = append(out[op], s)
	}
	return out
}

var _ sdktrace.SpanExporter = (*tracetest.InMemoryExporter)(nil)

func newConverter(t testing.TB, tenant string) *claudecode.Converter {
	t.Helper()
	c, err := claudecode.NewConverter(claudecode.Options{Tenant: tenant})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// testLogger logs to the test's output.
func testLogger(t testing.TB) *zerolog.Logger {
	l := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel)
	return &l
}

func attrKey(k string) attribute.Key { return attribute.Key(k) }
