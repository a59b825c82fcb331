// Package otlptest runs an OTLP trace receiver in the test's process, on
// free loopback ports: the OTLP protocol's own generated Go code
// (go.opentelemetry.io/proto/otlp, which the exporters send with) over
// HTTP (POST /v1/traces, protobuf, gzip or not) and gRPC
// (opentelemetry.proto.collector.trace.v1.TraceService/Export). It
// refuses a request a backend would (a span without valid ids, a name,
// or with its end before its start) and keeps the spans of the others.
// It can be stopped and started again on the same ports: a backend that
// goes down (its ports refuse connections) and comes back.
//
// It stands in for a backend in the tests that run in CI; the
// OpenTelemetry Collector's own receiver costs the suite more than a
// minute of compilation, and Jaeger (test/otel_jaeger_test.go) several.
package otlptest

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Span is one span the receiver received, flattened: ids in hex, the
// resource's and the span's attributes as strings, events, and status.
type Span struct {
	TraceID, SpanID, ParentID string
	Name                      string
	Kind                      string
	Start, End                time.Time
	Attrs                     map[string]string
	Resource                  map[string]string
	Scope, SchemaURL          string
	Events                    []Event
	StatusCode                string
	StatusMessage             string
}

// Event is a span event.
type Event struct {
	Name  string
	Time  time.Time
	Attrs map[string]string
}

// Receiver is an OTLP trace receiver.
type Receiver struct {
	// discard: count the spans, keep none (New(false)).
	discard bool
	// HTTP is the OTLP/HTTP endpoint, "http://127.0.0.1:<port>" (a value
	// of OTEL_EXPORTER_OTLP_ENDPOINT: traces go to /v1/traces); GRPC the
	// OTLP/gRPC one.
	HTTP, GRPC string

	httpAddr, grpcAddr string

	mu       sync.Mutex
	spans    []Span
	count    int
	requests int
	refused  int
	httpSrv  *http.Server
	grpcSrv  *grpc.Server
}

// Start starts a receiver on two free loopback ports; it stops at test
// end.
func Start(tb testing.TB) *Receiver {
	tb.Helper()
	r, err := New(true)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(r.Stop)
	return r
}

// New starts a receiver on two free loopback ports, for a program that is
// not a test (a benchmark): keep false counts the spans and keeps none.
// The caller stops it.
func New(keep bool) (*Receiver, error) {
	r := &Receiver{discard: !keep}
	// The first start serves on the listeners that found the free ports:
	// a port closed and listened on again could meanwhile be the local
	// port of some connection (the kernel hands out both from one range),
	// and stay taken for as long as it lives.
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("otlp receiver: %w", err)
	}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		hl.Close()
		return nil, fmt.Errorf("otlp receiver: %w", err)
	}
	r.httpAddr, r.grpcAddr = hl.Addr().String(), gl.Addr().String()
	r.HTTP = "http://" + r.httpAddr
	r.GRPC = "http://" + r.grpcAddr
	r.serve(hl, gl)
	return r, nil
}

// listen listens on addr, waiting for a port just released to be free.
func listen(addr string) (net.Listener, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		l, err := net.Listen("tcp", addr)
		if err == nil || time.Now().After(deadline) {
			return l, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Restart starts the receiver again on its ports (a no-op while it
// runs); it panics if a port cannot be had within 10 seconds (one
// released by Stop can meanwhile be taken, as the local port of some
// connection: a test that restarts a receiver accepts that).
func (r *Receiver) Restart() {
	if err := r.start(); err != nil {
		panic(err)
	}
}

func (r *Receiver) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.httpSrv != nil {
		return nil
	}
	hl, err := listen(r.httpAddr)
	if err != nil {
		return fmt.Errorf("otlp receiver: %w", err)
	}
	gl, err := listen(r.grpcAddr)
	if err != nil {
		hl.Close()
		return fmt.Errorf("otlp receiver: %w", err)
	}
	r.serveLocked(hl, gl)
	return nil
}

// serve serves OTLP/HTTP on hl and OTLP/gRPC on gl.
func (r *Receiver) serve(hl, gl net.Listener) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.serveLocked(hl, gl)
}

func (r *Receiver) serveLocked(hl, gl net.Listener) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.serveHTTP)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	gs := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(gs, traceService{r: r})
	r.httpSrv, r.grpcSrv = hs, gs
	go func() { _ = hs.Serve(hl) }()
	go func() { _ = gs.Serve(gl) }()
}

// Stop shuts the receiver down: its ports refuse connections until
// Restart.
func (r *Receiver) Stop() {
	r.mu.Lock()
	h, g := r.httpSrv, r.grpcSrv
	r.httpSrv, r.grpcSrv = nil, nil
	r.mu.Unlock()
	if h == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = h.Shutdown(ctx)
	g.Stop()
}

func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		http.Error(w, fmt.Sprintf("content type %q: want application/x-protobuf", ct), http.StatusUnsupportedMediaType)
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var msg coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &msg); err != nil {
		http.Error(w, "not an ExportTraceServiceRequest: "+err.Error(), http.StatusBadRequest)
		return
	}
	if err := r.accept(&msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = io.Copy(w, bytes.NewReader(out))
}

type traceService struct {
	coltracepb.UnimplementedTraceServiceServer
	r *Receiver
}

func (s traceService) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	if err := s.r.accept(req); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// accept checks every span of req and keeps them all, or none.
func (r *Receiver) accept(req *coltracepb.ExportTraceServiceRequest) error {
	var got []Span
	var errs []error
	for _, rs := range req.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				if err := check(s); err != nil {
					errs = append(errs, err)
					continue
				}
				got = append(got, flatten(s, res, ss.GetScope().GetName(), ss.GetSchemaUrl()))
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	if len(errs) > 0 {
		r.refused++
		return errors.Join(errs...)
	}
	r.count += len(got)
	if !r.discard {
		r.spans = append(r.spans, got...)
	}
	return nil
}

// check refuses what a backend cannot store.
func check(s *tracepb.Span) error {
	zero := func(b []byte) bool { return bytes.Count(b, []byte{0}) == len(b) }
	switch {
	case len(s.GetTraceId()) != 16 || zero(s.GetTraceId()):
		return fmt.Errorf("span %q: invalid trace id %x", s.GetName(), s.GetTraceId())
	case len(s.GetSpanId()) != 8 || zero(s.GetSpanId()):
		return fmt.Errorf("span %q: invalid span id %x", s.GetName(), s.GetSpanId())
	case len(s.GetParentSpanId()) != 0 && len(s.GetParentSpanId()) != 8:
		return fmt.Errorf("span %q: invalid parent span id %x", s.GetName(), s.GetParentSpanId())
	case s.GetName() == "":
		return errors.New("span without a name")
	case s.GetEndTimeUnixNano() < s.GetStartTimeUnixNano():
		return fmt.Errorf("span %q ends before it starts", s.GetName())
	}
	return nil
}

func flatten(s *tracepb.Span, res map[string]string, scope, schema string) Span {
	sp := Span{
		TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()), Name: s.GetName(),
		Kind:  strings.TrimPrefix(s.GetKind().String(), "SPAN_KIND_"),
		Start: time.Unix(0, int64(s.GetStartTimeUnixNano())).UTC(), End: time.Unix(0, int64(s.GetEndTimeUnixNano())).UTC(),
		Attrs: attrs(s.GetAttributes()), Resource: res, Scope: scope, SchemaURL: schema,
		StatusCode: strings.TrimPrefix(s.GetStatus().GetCode().String(), "STATUS_CODE_"), StatusMessage: s.GetStatus().GetMessage(),
	}
	if p := s.GetParentSpanId(); len(p) == 8 {
		sp.ParentID = hex.EncodeToString(p)
	}
	for _, e := range s.GetEvents() {
		sp.Events = append(sp.Events, Event{Name: e.GetName(), Time: time.Unix(0, int64(e.GetTimeUnixNano())).UTC(), Attrs: attrs(e.GetAttributes())})
	}
	return sp
}

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		out[kv.GetKey()] = value(kv.GetValue())
	}
	return out
}

// value renders an attribute value: a string as it is, numbers and
// booleans in Go's form, an array as ["a","b"].
func value(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	case *commonpb.AnyValue_DoubleValue:
		return fmt.Sprint(x.DoubleValue)
	case *commonpb.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	case *commonpb.AnyValue_ArrayValue:
		var parts []string
		for _, e := range x.ArrayValue.GetValues() {
			parts = append(parts, fmt.Sprintf("%q", value(e)))
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
	return ""
}

// Spans returns every span received, in the order received (a span sent
// twice is there twice).
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// SpanCount is how many spans it received.
func (r *Receiver) SpanCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count
}

// Refused is how many export requests it refused, of how many.
func (r *Receiver) Refused() (refused, requests int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.refused, r.requests
}

// Key renders a span whole (ids, parent, name, kind, times, status,
// attributes, events) for comparing two exports of the same spans.
func (s Span) Key() string {
	keys := make([]string, 0, len(s.Attrs))
	for k := range s.Attrs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "%s/%s<-%s %q %s %d..%d %s:%q", s.TraceID, s.SpanID, s.ParentID, s.Name, s.Kind,
		s.Start.UnixNano(), s.End.UnixNano(), s.StatusCode, s.StatusMessage)
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%s", k, s.Attrs[k])
	}
	for _, e := range s.Events {
		ek := make([]string, 0, len(e.Attrs))
		for k := range e.Attrs {
			ek = append(ek, k)
		}
		sort.Strings(ek)
		fmt.Fprintf(&b, " [%s@%d", e.Name, e.Time.UnixNano())
		for _, k := range ek {
			fmt.Fprintf(&b, " %s=%s", k, e.Attrs[k])
		}
		b.WriteString("]")
	}
	return b.String()
}
