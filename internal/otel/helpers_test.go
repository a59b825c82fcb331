package otel

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/claudecode"
	"github.com/turnstone-dev/turnstone/internal/embedded"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/internal/importer/importertest"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// transcriptsDir is where the shared real transcripts live, beside the
// repository.
const transcriptsDir = "../../../shared/data/transcripts/claude-code"

// sampleInline is the one larger transcript a sampled run takes: Claude
// Code 1.0, with six subagents written inline and linked to their Task
// calls.
const sampleInline = "ccviewer/fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl"

// sampled reports whether the tests over the shipped transcripts take a
// sample of them: under the race detector (which slows decoding JSON
// twentyfold and finds nothing more in the large files) and under -short.
// The full-size pass of .ci/run takes them all.
func sampled() bool { return raceEnabled || testing.Short() }

// transcriptFiles returns the shipped transcripts: all 25, or when
// sampled, those of at most 256 KiB (subagent and compaction files, short
// sessions, a 1.0 session with inline subagents) and sampleInline; the
// five long spotter sessions (some 3 MB each, 15 of the 17 MB) are left
// out.
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
	if !sampled() {
		return files
	}
	out := importertest.Sample(t, files, filepath.Join(transcriptsDir, filepath.FromSlash(sampleInline)))
	if len(out) < 15 || len(out) == len(files) {
		t.Fatalf("the sample holds %d of the %d shipped transcripts", len(out), len(files))
	}
	return out
}

// shared is one log holding every shipped transcript under tenant
// "real", imported once for the tests that only read it.
var shared struct {
	once sync.Once
	srv  *embedded.Server
	dir  string
	log  *events.Log
	err  error
}

// TestMain stops the shared server and removes its store at the end.
func TestMain(m *testing.M) {
	code := m.Run()
	if shared.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = shared.srv.Close(ctx)
		cancel()
	}
	if shared.dir != "" {
		_ = os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

// sharedLog returns the shared log, importing the transcripts on first
// use (on an embedded server that lives as long as the test binary).
func sharedLog(t testing.TB) *events.Log {
	t.Helper()
	files := transcriptFiles(t)
	shared.once.Do(func() {
		dir, err := os.MkdirTemp("", "turnstone-otel-test-")
		if err != nil {
			shared.err = err
			return
		}
		shared.dir = dir
		srv, err := embedded.Start(embedded.Config{Host: "127.0.0.1", Port: -1, DataDir: dir}, nil)
		if err != nil {
			shared.err = err
			return
		}
		shared.srv = srv
		nc, err := srv.Connect()
		if err != nil {
			shared.err = err
			return
		}
		js, err := jetstream.New(nc)
		if err != nil {
			shared.err = err
			return
		}
		if shared.log, err = events.Open(context.Background(), js, events.Config{}, nil); err != nil {
			shared.err = err
			return
		}
		rep, err := claudecode.Import(context.Background(), claudecode.LogStore(shared.log), files, claudecode.Options{Tenant: "real"}, nil)
		if err == nil && len(rep.Diagnostics) > 0 {
			err = fmt.Errorf("import diagnostics: %v", rep.Diagnostics)
		}
		shared.err = err
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.log
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
