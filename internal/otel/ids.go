package otel

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"sync"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Trace and span ids derive from the log: each is the SHA-256 of a kind,
// the session and the ids of the event (and block) the span starts at,
// cut to 16 bytes (a trace id) or 8 (a span id). The same log always
// gives the same ids, so a second export of it (live or backfill, on any
// engine) sends identical spans and a backend that keys spans by id
// stores them once.

// hashID returns the SHA-256 of the parts joined by a separator that no
// token or ULID holds.
func hashID(parts ...string) [32]byte {
	h := sha256.New()
	h.Write([]byte("turnstone-otel"))
	for _, p := range parts {
		h.Write([]byte{0})
		h.Write([]byte(p))
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}

// traceIDOf is the trace id of parts (never the invalid all-zero id).
func traceIDOf(parts ...string) trace.TraceID {
	sum := hashID(append([]string{"trace"}, parts...)...)
	var id trace.TraceID
	copy(id[:], sum[:16])
	if !id.IsValid() {
		id[15] = 1
	}
	return id
}

// spanIDOf is the span id of parts (never the invalid all-zero id).
func spanIDOf(parts ...string) trace.SpanID {
	sum := hashID(append([]string{"span"}, parts...)...)
	var id trace.SpanID
	copy(id[:], sum[:8])
	if !id.IsValid() {
		id[7] = 1
	}
	return id
}

// spanRef names a span: its trace and its id.
type spanRef struct {
	Trace trace.TraceID
	Span  trace.SpanID
}

func (r spanRef) valid() bool { return r.Trace.IsValid() && r.Span.IsValid() }

// idsKey carries the ids a span is to get through the context its span
// starts with, to idGenerator.
type idsKey struct{}

// withIDs returns ctx carrying the ids of the span about to start.
func withIDs(ctx context.Context, ref spanRef) context.Context {
	return context.WithValue(ctx, idsKey{}, ref)
}

// idGenerator gives a span the ids withIDs put in its context: the SDK's
// tracer asks its IDGenerator for a new span's ids, and this one answers
// with the ids derived from the log. A span started without them (not by
// this package) gets random ids.
type idGenerator struct{}

var _ sdktrace.IDGenerator = idGenerator{}

// NewIDs implements sdktrace.IDGenerator.
func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if ref, ok := ctx.Value(idsKey{}).(spanRef); ok && ref.valid() {
		return ref.Trace, ref.Span
	}
	var t trace.TraceID
	var s trace.SpanID
	_, _ = rand.Read(t[:])
	_, _ = rand.Read(s[:])
	return t, s
}

// NewSpanID implements sdktrace.IDGenerator.
func (idGenerator) NewSpanID(ctx context.Context, _ trace.TraceID) trace.SpanID {
	if ref, ok := ctx.Value(idsKey{}).(spanRef); ok && ref.Span.IsValid() {
		return ref.Span
	}
	var s trace.SpanID
	_, _ = rand.Read(s[:])
	return s
}

// collector is a SpanProcessor that keeps the spans that ended until
// take: the caller exports them itself, and acknowledges the events they
// came from once the export succeeded, so that a span is never dropped.
type collector struct {
	mu    sync.Mutex
	spans []sdktrace.ReadOnlySpan
}

var _ sdktrace.SpanProcessor = (*collector)(nil)

func (c *collector) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

func (c *collector) OnEnd(s sdktrace.ReadOnlySpan) {
	c.mu.Lock()
	c.spans = append(c.spans, s)
	c.mu.Unlock()
}

func (c *collector) Shutdown(context.Context) error   { return nil }
func (c *collector) ForceFlush(context.Context) error { return nil }

// take returns the spans that ended since the last take.
func (c *collector) take() []sdktrace.ReadOnlySpan {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.spans
	c.spans = nil
	return s
}

// len is how many spans wait.
func (c *collector) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.spans)
}
