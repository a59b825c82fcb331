package telemetry

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Namespace is the metric namespace of Turnstone's processes: pass it to
// NewMetrics.
const Namespace = "turnstone"

// WorkerCommandBuckets are the upper bounds, in seconds, of the
// worker_command_seconds histogram: a log-only command takes milliseconds,
// one that calls the runtime up to its control timeout (10 s by default)
// per attempt, with retries in between.
var WorkerCommandBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// Metrics holds Turnstone's Prometheus metrics in a registry of its own
// (never prometheus.DefaultRegisterer). The package documentation lists
// every metric, its type and what feeds it.
//
// Every method is safe for concurrent use, and every method of a nil
// *Metrics does nothing (Registry returns nil, FailClosed false), so a
// component can take an optional *Metrics and call it unconditionally.
type Metrics struct {
	reg   *prometheus.Registry
	turns *turnTracker
	views *viewTracker

	events        *prometheus.CounterVec
	redelivered   prometheus.Counter
	invalid       prometheus.Counter
	orphanRepairs prometheus.Counter
	distillations *prometheus.CounterVec
	outcomes      *prometheus.CounterVec
	attempts      *prometheus.CounterVec
	parked        *prometheus.CounterVec
	breakers      *prometheus.GaugeVec
	violations    *prometheus.CounterVec

	issued     *prometheus.CounterVec
	failClosed prometheus.Gauge
	ticks      *prometheus.CounterVec // no labels: see NewMetrics

	workerCommands *prometheus.CounterVec
	workerSeconds  *prometheus.HistogramVec

	partitionsOwned *prometheus.GaugeVec
	rebalances      *prometheus.GaugeVec
	partitionLag    *prometheus.GaugeVec
	partitionLease  *prometheus.GaugeVec
	pinMoves        *prometheus.CounterVec
	snapshotMisses  prometheus.Counter

	incidentsOpen *prometheus.GaugeVec

	otelLag      *prometheus.GaugeVec
	otelSpans    prometheus.Counter
	otelFailures prometheus.Counter

	leaseMu sync.Mutex
	leases  map[string]uint64 // "<group>/<partition>" -> the token of its series

	ingestRequests *prometheus.CounterVec
	ingestBytes    *prometheus.CounterVec
	ingestOutcomes *prometheus.CounterVec
	quarDropped    prometheus.Counter

	failMu     sync.Mutex
	failOn     bool
	failReason string
}

// NewMetrics returns metrics named namespace_<name> (Namespace:
// "turnstone_turns_started_total") in a new registry, which also holds the
// Go runtime and process collectors. namespace may be empty; it panics if
// namespace makes an invalid metric name (it must match
// [a-zA-Z_][a-zA-Z0-9_]*), as it is a constant of the caller.
func NewMetrics(namespace string) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help})
	}
	counterVec := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, labels)
	}
	m.turns = newTurnTracker(namespace)
	m.views = newViewTracker(namespace)
	m.events = counterVec("events_total", "Events observed once, by type (\"unknown\" for types this version does not know).", "type")
	m.redelivered = counter("events_redelivered_total", "Events dropped because their session's stream sequence was already observed (redeliveries).")
	m.invalid = counter("invalid_events_total", "Events that break the wire contract or whose data does not decode.")
	m.orphanRepairs = counter("orphan_repairs_total", "repair_orphans recovery commands that ended recovered or degraded.")
	m.distillations = counterVec("distillations_total", "Distillations: result \"run\" (reason is the trigger) or \"skipped\" (reason is why).", "result", "reason")
	m.outcomes = counterVec("recovery_outcomes_total", "Recovery commands ended (recovery.completed), by kind, strategy and outcome.", "kind", "strategy", "outcome")
	m.attempts = counterVec("recovery_attempts_total", "Recovery attempts (recovery.attempted), by kind, result and error class.", "kind", "result", "class")
	m.parked = counterVec("commands_parked_total", "Recovery commands parked after their last delivery failed (recovery.parked), by kind.", "kind")
	m.breakers = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "breaker_state",
		Help: "Circuit breaker state per tenant and provider: 0 closed, 1 half_open, 2 open."}, []string{"tenant", "provider"})
	m.violations = counterVec("violations_total", "Invariant violations the projector saw arise, by rule.", "rule")
	m.issued = counterVec("commands_issued_total", "Recovery commands the reconciler issued, by kind.", "kind")
	m.failClosed = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "reconciler_fail_closed",
		Help: "1 while the reconciler fails closed (issues no command), else 0."})
	// No labels, but a vector: the series appears with the first tick, so
	// that a worker (which runs no reconciler) has none to alert on.
	m.ticks = counterVec("reconciler_ticks_total", "Passes of the engine's reconciler control loop (deadlines, pending requests, retries): one per tick, 1 s by default, failed closed or not. A rate of 0 on an engine means the loop is stuck.")
	m.workerCommands = counterVec("worker_commands_total", "Recovery commands this worker handled, by kind and outcome.", "kind", "outcome")
	m.workerSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "worker_command_seconds",
		Help: "Seconds this worker took over a recovery command, from delivery to its end, by kind.", Buckets: WorkerCommandBuckets}, []string{"kind"})

	m.partitionsOwned = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "partitions_owned",
		Help: "Partitions this process owns in its partition group (engines or workers)."}, []string{"group"})
	m.rebalances = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "partition_rebalances",
		Help: "Times this process's set of partitions changed since it started, by group."}, []string{"group"})
	m.partitionLag = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "partition_lag",
		Help: "Events of a partition this engine owns not yet delivered to it (its projector consumer's pending count)."}, []string{"partition"})

	m.partitionLease = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "partition_lease",
		Help: "The fencing token (claim revision) of each partition this process holds a lease on now, by group; a partition not held has no series."}, []string{"group", "partition"})
	m.pinMoves = counterVec("partition_pin_moves_total", "Times the pin of a partition's consumer moved away from this process while it held the partition (its states dropped, refolded from snapshots), by group.", "group")
	m.snapshotMisses = counter("snapshot_disagreements_total", "Sessions whose snapshot (or held state) counted fewer events than the log holds up to its last sequence: the log won, the session was refolded from it.")

	m.incidentsOpen = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "incidents_open",
		Help: "Open fleet incidents (package correlate), by the class of their key: an error class or an anomaly rule."}, []string{"class"})

	m.otelLag = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "otel_export_lag",
		Help: "Events of a partition this engine owns not yet exported to OpenTelemetry (its export consumer's pending and unacknowledged counts)."}, []string{"partition"})
	m.otelSpans = counter("otel_spans_exported_total", "Spans the OpenTelemetry export sent (package otel).")
	m.otelFailures = counter("otel_export_failures_total", "OpenTelemetry export calls that failed (each is tried again).")

	m.ingestRequests = counterVec("ingest_requests_total", "Append requests this engine took off the ingest subjects, by partition and path (mapped: the server's subject mapping sent it here; unmapped: a server without the mapping sent it to every engine).", "partition", "path")
	m.ingestBytes = counterVec("ingest_received_bytes_total", "Bytes (body and headers) of the append requests this engine took, by partition and path.", "partition", "path")
	m.ingestOutcomes = counterVec("ingest_outcomes_total", "Append requests this engine answered, by outcome.", "outcome")
	m.quarDropped = counter("quarantine_dropped_total", "Refused events whose quarantine record was not written: the quarantine queue was full, or the write failed.")

	m.reg.MustRegister(
		m.ingestRequests, m.ingestBytes, m.ingestOutcomes, m.quarDropped,
		m.partitionsOwned, m.rebalances, m.partitionLag, m.partitionLease, m.pinMoves, m.snapshotMisses, m.incidentsOpen,
		m.otelLag, m.otelSpans, m.otelFailures,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.turns, m.views,
		m.events, m.redelivered, m.invalid, m.orphanRepairs, m.distillations, m.outcomes, m.attempts,
		m.parked, m.breakers, m.violations, m.issued, m.failClosed, m.ticks, m.workerCommands, m.workerSeconds,
	)
	return m
}

// Registry returns the registry the metrics live in, to register more
// collectors or to gather them; nil for a nil *Metrics.
func (m *Metrics) Registry() *prometheus.Registry {
	if m == nil {
		return nil
	}
	return m.reg
}

// Handler returns an http.Handler serving the registry in the Prometheus
// exposition formats (promhttp.HandlerFor). For a nil *Metrics it serves an
// empty registry.
func (m *Metrics) Handler() http.Handler {
	reg := prometheus.NewRegistry()
	if m != nil {
		reg = m.reg
	}
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, ErrorHandling: promhttp.ContinueOnError})
}

// ObserveViolation counts one invariant violation of rule (a
// projections.Rule such as "tool_use_without_result") in violations_total.
func (m *Metrics) ObserveViolation(rule string) {
	if m == nil {
		return
	}
	m.violations.WithLabelValues(label(rule)).Inc()
}

// IngestReceived counts an append request the engine's ingest took for
// partition, of size bytes, mapped (by the server's subject mapping) or
// not, in ingest_requests_total and ingest_received_bytes_total.
func (m *Metrics) IngestReceived(partition, bytes int, mapped bool) {
	if m == nil {
		return
	}
	path := "unmapped"
	if mapped {
		path = "mapped"
	}
	p := strconv.Itoa(partition)
	m.ingestRequests.WithLabelValues(p, path).Inc()
	m.ingestBytes.WithLabelValues(p, path).Add(float64(bytes))
}

// IngestOutcome counts an append request's outcome (ingestserver.Config.
// OnAppend's words) in ingest_outcomes_total.
func (m *Metrics) IngestOutcome(outcome string) {
	if m == nil {
		return
	}
	m.ingestOutcomes.WithLabelValues(label(outcome)).Inc()
}

// QuarantineDropped counts a refused event whose quarantine record was not
// written in quarantine_dropped_total.
func (m *Metrics) QuarantineDropped() {
	if m == nil {
		return
	}
	m.quarDropped.Inc()
}

// CommandIssued counts one recovery command of kind (a recovery.Kind such
// as "repair_orphans") issued by the reconciler in commands_issued_total.
func (m *Metrics) CommandIssued(kind string) {
	if m == nil {
		return
	}
	m.issued.WithLabelValues(label(kind)).Inc()
}

// ReconcilerTicked counts one pass of the reconciler's control loop in
// reconciler_ticks_total (reconciler.Config.OnTick).
func (m *Metrics) ReconcilerTicked() {
	if m == nil {
		return
	}
	m.ticks.WithLabelValues().Inc()
}

// SetFailClosed records whether the reconciler fails closed (issues no
// command because it cannot trust what it sees) and why: the
// reconciler_fail_closed gauge becomes 1 or 0, and FailClosed and
// FailClosedCheck report reason. The reason is not a label (it is free
// text); it is kept for the health check.
func (m *Metrics) SetFailClosed(closed bool, reason string) {
	if m == nil {
		return
	}
	m.failMu.Lock()
	defer m.failMu.Unlock()
	m.failOn, m.failReason = closed, reason
	if !closed {
		m.failReason = ""
	}
	if closed {
		m.failClosed.Set(1)
	} else {
		m.failClosed.Set(0)
	}
}

// FailClosed reports what the last SetFailClosed set: whether the
// reconciler fails closed, and why (empty when it does not).
func (m *Metrics) FailClosed() (closed bool, reason string) {
	if m == nil {
		return false, ""
	}
	m.failMu.Lock()
	defer m.failMu.Unlock()
	return m.failOn, m.failReason
}

// FailClosedCheck returns a health check (for Health.Register) that fails,
// with an error wrapping ErrFailClosed and carrying the reason, while the
// reconciler fails closed. For a nil *Metrics the check always passes.
func (m *Metrics) FailClosedCheck() func(context.Context) error {
	return func(context.Context) error {
		if closed, reason := m.FailClosed(); closed {
			return fmt.Errorf("%w: %s", ErrFailClosed, reason)
		}
		return nil
	}
}

// WorkerCommand records that a worker finished handling one recovery
// command of kind with outcome, after took (from delivery to the end;
// negative counts as zero): worker_commands_total{kind,outcome} grows by
// one and worker_command_seconds{kind} observes took in seconds. outcome is
// the recovery outcome ("recovered", "degraded", "failed") or what the
// worker did instead ("parked", "invalid", "redeliver", "skipped").
func (m *Metrics) WorkerCommand(kind, outcome string, took time.Duration) {
	if m == nil {
		return
	}
	kind = label(kind)
	m.workerCommands.WithLabelValues(kind, label(outcome)).Inc()
	m.workerSeconds.WithLabelValues(kind).Observe(max(took, 0).Seconds())
}
