// Package engine wires one Turnstone engine process: the event log, the
// snapshot store, the projector, the reconciler, the runtimes' presence
// and the metrics, and its membership in the engines' partition group
// (package pgroup), which decides the partitions it folds and reconciles.
// cmd/engine serve, internal/enginetest and cmd/bench run engines through it.
//
// Open joins the group and takes the engine's share of the partitions
// before it returns; Close leaves the group (the other engines take the
// partitions at once) and stops every part. Several engines on one log
// share the partitions: each partition is folded by one engine at a time
// (its consumer's pinned_client priority group), a dead engine's
// partitions are taken over within pgroup's bound (6 s by default), and
// the reconciler's commands keep deterministic ids, so a command decided
// twice during a handover is stored once.
package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/internal/audit"
	"github.com/turnstone-dev/turnstone/internal/clock"
	"github.com/turnstone-dev/turnstone/internal/erasure"
	"github.com/turnstone-dev/turnstone/internal/ingestserver"
	"github.com/turnstone-dev/turnstone/internal/otel"
	"github.com/turnstone-dev/turnstone/internal/pgroup"
	"github.com/turnstone-dev/turnstone/internal/presence"
	"github.com/turnstone-dev/turnstone/internal/reconciler"
	"github.com/turnstone-dev/turnstone/internal/telemetry"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Group is the name of the engines' partition group:
// projections.EngineGroup.
const Group = projections.EngineGroup

// Config configures one engine. The zero value runs an engine with every
// default that sets up what it needs (no auth).
type Config struct {
	// Name identifies the engine in its group, logs and `engine members`
	// ([A-Za-z0-9_-]). Default "<hostname>-<pid>-<random>".
	Name string
	// Log configures the event log. Settings left zero keep the existing
	// streams' (see events.Open).
	Log events.Config
	// Policy is the reconciler's (nil: the defaults).
	Policy *reconciler.Policy
	// SnapshotEvery, MaxSessions, IdleEvict and CompressAfter configure the
	// projector (projections.ProjectorConfig; zero: its defaults).
	SnapshotEvery int
	MaxSessions   int
	IdleEvict     time.Duration
	CompressAfter time.Duration
	// Heartbeat and TTL configure the partition group (pgroup.Config;
	// zero: its defaults, 1 s and 5 s).
	Heartbeat time.Duration
	TTL       time.Duration
	// Presence configures the runtimes' presence tracker.
	Presence presence.Config
	// Clock is the reconciler's clock (nil: the system's); Tick its tick;
	// MaxCommandBytes its bound on a command (0: recovery.MaxCommandBytes).
	Clock           clock.Clock
	Tick            time.Duration
	MaxCommandBytes int
	// Metrics, when set, observes every event, violation and command.
	Metrics *telemetry.Metrics
	// MetricsEvery is how often the engine reads its partitions' lags
	// (and its OpenTelemetry export's) into Metrics. Default 5 s.
	MetricsEvery time.Duration
	// OnApply and OnIssue, when set, observe each event folded (see
	// projections.ProjectorConfig.OnApply) and each command issued.
	OnApply func(s *projections.Session, ev events.Event, applied bool, vs []projections.Violation)
	OnIssue func(recovery.Command)
	// UseExisting: create and update nothing (streams, consumers,
	// buckets must exist: an operator ran `engine setup`). For an engine
	// whose NATS permissions do not allow it (docs/security.md).
	UseExisting bool
	// OTel, when set, exports what the engine folds to an OpenTelemetry
	// backend (package otel, docs/otel.md), through a durable consumer
	// per partition of its own: only the partitions the engine owns, and
	// a backend that is down delays the export, never the engine.
	OTel *OTelConfig
	// RetentionEvery is how often the engine erases the sessions of its
	// partitions that are older than their tenant's retention (the
	// policy's retention.max_age; none by default). Default 1 minute;
	// negative: never.
	RetentionEvery time.Duration
	// MapIngest, when set, is called with the event stream's partition
	// count once the log is open, before the engine subscribes to its
	// partitions' appends: it puts ingest.IngestMapping in place on the
	// server (embedded.Server.AddMapping for the embedded server without
	// accounts; under auth the accounts' configuration carries it). An
	// error stops Open.
	MapIngest func(partitions int) error
	// Ingest configures the engine's ingest server (its Shared, Gate and
	// observers are the engine's).
	Ingest ingestserver.Config
}

// OTelConfig is an engine's live OpenTelemetry export.
type OTelConfig struct {
	// Exporter receives the spans (otel.NewSpanExporter); the engine
	// shuts it down when it closes.
	Exporter sdktrace.SpanExporter
	// Export configures the export; its Shared and Gate are the engine's.
	Export otel.ExporterConfig
}

// Validate reports every out-of-range field, joined.
func (c *Config) Validate() error {
	var errs []error
	if c.Name != "" && !events.ValidToken(c.Name) {
		errs = append(errs, fmt.Errorf("name: %q is not a token of [A-Za-z0-9_-]", c.Name))
	}
	if err := c.Log.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("log: %w", err))
	}
	if c.SnapshotEvery < 0 || c.MaxSessions < 0 || c.IdleEvict < 0 || c.Heartbeat < 0 || c.TTL < 0 || c.Tick < 0 || c.MetricsEvery < 0 {
		errs = append(errs, errors.New("snapshot every, max sessions, idle evict, heartbeat, ttl, tick, metrics every: must not be negative"))
	}
	if err := c.Presence.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("presence: %w", err))
	}
	if c.OTel != nil {
		if c.OTel.Exporter == nil {
			errs = append(errs, errors.New("otel: no exporter"))
		}
		if err := c.OTel.Export.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("otel: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Engine is one running engine. Its parts are exported for the CLI and
// tests to read; treat them as owned by the engine.
type Engine struct {
	Log        *events.Log
	Store      *projections.SnapshotStore
	Projector  *projections.Projector
	Reconciler *reconciler.Reconciler
	Presence   *presence.Tracker
	Ingest     *ingestserver.Server
	// OTel is the live OpenTelemetry export (nil when Config.OTel is).
	OTel *otel.Exporter
	// Gate is the engine's erasure gate (package erasure): the
	// projector, the reconciler and the ingest write through it.
	Gate *erasure.Gate

	nc     *nats.Conn
	notice *nats.Subscription
	js     jetstream.JetStream
	cfg    Config
	l      zerolog.Logger
	member *pgroup.Member

	mu      sync.Mutex
	joining bool // the partitions taken by Join are a restart's
	closed  bool
	leases  map[int]context.Context // the partitions held, by their leases (pgroup)
	runCtx  context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// SetupConfig is what `engine setup` sets. Every setting left zero keeps
// the existing streams' and consumers' (a new one takes its default), so
// running setup again changes nothing unless asked.
type SetupConfig struct {
	// Log is the event log's: partitions of a new stream, replicas,
	// UpdateStreams (see events.Config; UseExisting is ignored).
	Log events.Config
	// Delivery is the recovery consumers' (the workers' ack wait, max
	// deliver and pinned TTL; recovery.DeliveryConfig).
	Delivery recovery.DeliveryConfig
	// OTelExport creates (or updates) the live OpenTelemetry export's
	// consumers too (otel.EnsureConsumers): `engine setup` when the OTLP
	// endpoint is set or --otel is given, and an engine that sets up
	// JetStream itself with its export on. They deliver the events stored
	// after they were created: history is exported with `engine export
	// otel`.
	OTelExport bool
}

// Setup creates or updates everything an engine and its workers need on
// JetStream: the event and snapshot streams (events.Open with cfg.Log),
// the recovery stream, its partition consumers (with cfg.Delivery) and
// status bucket, the projector's partition consumers, the reconciler's
// probe bucket, the quarantine stream, the fleet index, the members bucket
// and the audit stream, and with OTelExport the export's consumers. It is
// the one writer of their settings: `engine setup` runs it (with operator
// credentials under auth), and so does Open unless Config.UseExisting
// (`engine serve` on the embedded server it owns), with no setting given,
// so that a restart changes nothing. Every setting it changes in an
// existing stream, bucket or consumer it writes is recorded in the audit
// stream (an operator's own edit of one is undone, and so recorded), as is
// its deletion of the single projector consumer of earlier versions. It
// is idempotent, and returns the log it opened.
func Setup(ctx context.Context, js jetstream.JetStream, cfg SetupConfig, logger *zerolog.Logger) (*events.Log, error) {
	lcfg := cfg.Log
	lcfg.UseExisting = false
	log, err := events.Open(ctx, js, lcfg, logger)
	if err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	// The other streams and buckets it writes: what an update changes in
	// their settings (an operator's edit undone, a new version's value)
	// is recorded too, from their settings before and after.
	others := []string{ingest.QuarantineStream, audit.Stream, "KV_" + projections.IndexBucket,
		"KV_" + reconciler.ProbeBucket, "KV_" + reconciler.ActivityBucket, "KV_" + pgroup.DefaultBucket}
	before, err := streamConfigs(ctx, js, others)
	if err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	// And the consumers on the event stream: the projector's and, with
	// the export, the OTel export's, and the projector consumer of
	// earlier versions, which setup deletes (the recovery consumers'
	// changes come from recovery.Setup).
	families := [][]string{consumerNames(log.Partitions(), func(p int) string { return projections.ProjectorConsumerName("", p) })}
	if cfg.OTelExport {
		families = append(families, consumerNames(log.Partitions(), func(p int) string { return otel.ConsumerName("", p) }))
	}
	named := []string{projections.DefaultDurable}
	for _, names := range families {
		named = append(named, names...)
	}
	consumersBefore, err := consumerConfigs(ctx, js, events.EventsStream, named)
	if err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	_, consumerChanges, err := recovery.Setup(ctx, log, cfg.Delivery)
	if err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	if err := projections.EnsureProjectorConsumers(ctx, js, projections.ProjectorConfig{}, log.Partitions()); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	if cfg.OTelExport {
		if err := otel.EnsureConsumers(ctx, js, log.Partitions()); err != nil {
			return nil, fmt.Errorf("setup: %w", err)
		}
	}
	replicas := log.Config().Replicas
	if err := reconciler.EnsureProbeBucket(ctx, js, replicas); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	if err := reconciler.EnsureActivityBucket(ctx, js, replicas); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	_, had := js.KeyValue(ctx, projections.IndexBucket)
	if err := ingestserver.EnsureQuarantineStream(ctx, js, replicas); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	if err := projections.EnsureIndexBucket(ctx, js, replicas); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	if errors.Is(had, jetstream.ErrBucketNotFound) {
		// A log from before the index: summarise what it holds, once.
		store, err := projections.NewSnapshotStore(js, projections.SnapshotConfig{})
		if err != nil {
			return nil, fmt.Errorf("setup: %w", err)
		}
		n, err := projections.RebuildIndex(ctx, log, store)
		if err != nil {
			return nil, fmt.Errorf("setup: %w", err)
		}
		if n > 0 && logger != nil {
			logger.Info().Int("sessions", n).Msg("fleet index built from the log")
		}
	}
	if _, err := pgroup.OpenBucket(ctx, js, pgroup.DefaultBucket, true, replicas, pgroup.DefaultTTL); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	if err := audit.Ensure(ctx, js, replicas); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	changes := append(log.Changed(), consumerChanges...)
	after, err := streamConfigs(ctx, js, others)
	if err != nil {
		return nil, fmt.Errorf("setup: streams and buckets brought to this version's settings but not recorded: %w", err)
	}
	for _, name := range others {
		if b, ok := before[name]; ok {
			if a, ok := after[name]; ok {
				changes = append(changes, events.Changes(b, a)...)
			}
		}
	}
	consumersAfter, err := consumerConfigs(ctx, js, events.EventsStream, named)
	if err != nil {
		return nil, fmt.Errorf("setup: consumers brought to this version's settings but not recorded: %w", err)
	}
	changes = append(changes, eventConsumerChanges(families, consumersBefore, consumersAfter)...)
	if len(changes) > 0 {
		reason := "engine setup: this version's settings"
		var asked []string
		if cfg.Log.UpdateStreams {
			asked = append(asked, "--update-streams")
		}
		if d := cfg.Delivery.String(); d != "" {
			asked = append(asked, d)
		}
		if len(asked) > 0 {
			reason = "engine setup " + strings.Join(asked, ", ")
		}
		if _, err := audit.Append(ctx, js, audit.Record{Action: audit.ActionStreamsUpdated, Who: audit.Who(js.Conn()), Reason: reason, Changes: changes}); err != nil {
			return nil, fmt.Errorf("setup: stream settings changed (%s) but not recorded: %w", strings.Join(changes, "; "), err)
		}
		if logger != nil {
			logger.Warn().Strs("changes", changes).Msg("stream settings changed; recorded in " + audit.Stream)
		}
	}
	return log, nil
}

// streamConfigs reads the configuration of each of the streams in names
// that exists. An error other than a missing stream (which setup creates)
// fails it: a change setup made or is about to make could not be
// recorded.
func streamConfigs(ctx context.Context, js jetstream.JetStream, names []string) (map[string]jetstream.StreamConfig, error) {
	out := make(map[string]jetstream.StreamConfig, len(names))
	for _, name := range names {
		st, err := js.Stream(ctx, name)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
		case err != nil:
			return nil, fmt.Errorf("read stream %s: %w", name, err)
		default:
			out[name] = st.CachedInfo().Config
		}
	}
	return out, nil
}

// consumerConfigs reads the configuration of each of the consumers of
// stream named in names that exists. An error other than a missing
// consumer fails it: a change setup made or is about to make could not
// be recorded.
func consumerConfigs(ctx context.Context, js jetstream.JetStream, stream string, names []string) (map[string]jetstream.ConsumerConfig, error) {
	out := make(map[string]jetstream.ConsumerConfig, len(names))
	for _, name := range names {
		c, err := js.Consumer(ctx, stream, name)
		switch {
		case errors.Is(err, jetstream.ErrConsumerNotFound):
		case err != nil:
			return nil, fmt.Errorf("read consumer %s of %s: %w", name, stream, err)
		default:
			out[name] = c.CachedInfo().Config
		}
	}
	return out, nil
}

// consumerNames names the consumer of each partition, name(p), in
// partition order.
func consumerNames(partitions int, name func(p int) string) []string {
	names := make([]string, partitions)
	for p := range names {
		names[p] = name(p)
	}
	return names
}

// eventConsumerChanges describes what setup changed in the consumers of
// the event stream, from their settings before and after: for each
// family (one consumer per partition), "consumers AGENT_EVENTS
// <names> <setting>: <old> -> <new>" for each setting changed, with
// <names> "<first>..<last>" when every consumer of the family changed
// alike, else the ones that did; and, when it was there before and is
// not after, that the single projector consumer of earlier versions was
// deleted. A consumer created by setup is no change.
func eventConsumerChanges(families [][]string, before, after map[string]jetstream.ConsumerConfig) []string {
	var out []string
	for _, names := range families {
		changed := map[string][]string{} // "ack-wait: 30s -> 10s" -> consumers
		var order []string
		for _, name := range names {
			b, had := before[name]
			a, has := after[name]
			if !had || !has {
				continue
			}
			for _, d := range events.ConsumerChanges(b, a) {
				if changed[d] == nil {
					order = append(order, d)
				}
				changed[d] = append(changed[d], name)
			}
		}
		for _, d := range order {
			who := strings.Join(changed[d], ",")
			if len(changed[d]) == len(names) && len(names) > 1 {
				who = names[0] + ".." + names[len(names)-1]
			}
			out = append(out, "consumers "+events.EventsStream+" "+who+" "+d)
		}
	}
	// What setup deletes: the single projector consumer of earlier
	// versions.
	if _, had := before[projections.DefaultDurable]; had {
		if _, has := after[projections.DefaultDurable]; !has {
			out = append(out, "consumer "+events.EventsStream+" "+projections.DefaultDurable+" deleted (the single projector consumer of earlier versions)")
		}
	}
	return out
}

// Open starts an engine on nc: it sets up JetStream (unless
// Config.UseExisting), starts the projector, the reconciler and the
// presence tracker, and joins the engines' group, taking its share of the
// partitions, before it returns. logger may be nil. Close stops it.
func Open(ctx context.Context, nc *nats.Conn, cfg Config, logger *zerolog.Logger) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("open engine: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("open engine: %w", err)
	}
	if cfg.Name == "" {
		// Known before the engine joins its group: it answers erase
		// notices addressed to its members by that name.
		cfg.Name = pgroup.MemberName()
	}
	if cfg.RetentionEvery == 0 {
		cfg.RetentionEvery = time.Minute
	}
	if cfg.MetricsEvery == 0 {
		cfg.MetricsEvery = 5 * time.Second
	}
	e := &Engine{nc: nc, js: js, cfg: cfg, l: zerolog.Nop(), Gate: erasure.NewGate(erasure.Config{}), leases: map[int]context.Context{}}
	if logger != nil {
		e.l = logger.With().Str("component", "engine").Logger()
	}
	e.runCtx, e.cancel = context.WithCancel(context.Background())
	ok := false
	defer func() {
		if !ok {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = e.Close(cctx)
		}
	}()

	lcfg := cfg.Log
	if cfg.UseExisting {
		lcfg.UseExisting = true
		e.Log, err = events.Open(ctx, js, lcfg, logger)
	} else {
		e.Log, err = Setup(ctx, js, SetupConfig{Log: lcfg, OTelExport: cfg.OTel != nil}, logger)
	}
	if err != nil {
		return nil, fmt.Errorf("open engine: %w", err)
	}
	if cfg.OTel != nil {
		if e.OTel, err = openOTel(ctx, e, cfg, logger); err != nil {
			_ = cfg.OTel.Exporter.Shutdown(ctx)
			return nil, fmt.Errorf("open engine: %w", err)
		}
	}
	if e.Store, err = projections.NewSnapshotStore(js, projections.SnapshotConfig{}); err != nil {
		return nil, fmt.Errorf("open engine: %w", err)
	}
	e.recordPolicy(ctx)
	if e.Presence, err = presence.New(nc, cfg.Presence, logger); err != nil {
		return nil, fmt.Errorf("open engine: %w", err)
	}
	if err := e.Presence.Open(ctx); err != nil {
		return nil, fmt.Errorf("open engine: %w", err)
	}

	m := cfg.Metrics
	var rec *reconciler.Reconciler // set below, before any event is folded
	if cfg.UseExisting {
		if err := projections.CheckProjectorConsumers(ctx, js, projections.ProjectorConfig{}, e.Log.Partitions()); err != nil {
			return nil, fmt.Errorf("open engine: %w", err)
		}
	}
	e.Projector, err = projections.NewProjector(e.Log, e.Store, projections.ProjectorConfig{
		SnapshotEvery: cfg.SnapshotEvery, MaxSessions: cfg.MaxSessions, IdleEvict: cfg.IdleEvict, CompressAfter: cfg.CompressAfter,
		Shared: true, Index: true, Gate: e.Gate, UseExisting: cfg.UseExisting,
		OnApply: func(s *projections.Session, ev events.Event, applied bool, vs []projections.Violation) {
			if m != nil {
				m.ObserveEvent(ev)
				for _, v := range vs {
					m.ObserveViolation(string(v.Rule))
				}
				// The sessions, orphans and violations gauges: the View's
				// status and counts, also when a restore folded the event.
				m.ObserveSession(s)
			}
			if cfg.OnApply != nil {
				cfg.OnApply(s, ev, applied, vs)
			}
			rec.Observe(s, ev, applied, vs)
		},
		OnPinMoved: e.pinMoved,
		OnSnapshotMismatch: func(_, _ string, _, _ int) {
			m.SnapshotDisagreed()
		},
	}, logger)
	if err != nil {
		return nil, fmt.Errorf("open engine: %w", err)
	}
	rcfg := reconciler.Config{Policy: cfg.Policy, Clock: cfg.Clock, Tick: cfg.Tick, Presence: e.Presence, MaxCommandBytes: cfg.MaxCommandBytes, Gate: e.Gate,
		Owns: e.owns}
	rcfg.OnIssue = func(c recovery.Command) {
		if m != nil {
			m.CommandIssued(string(c.Kind))
		}
		if cfg.OnIssue != nil {
			cfg.OnIssue(c)
		}
	}
	if m != nil {
		rcfg.OnTick = m.ReconcilerTicked
		rcfg.OnFailClosed = func(err error) {
			if err != nil {
				m.SetFailClosed(true, err.Error())
			} else {
				m.SetFailClosed(false, "")
			}
		}
	}
	rec = reconciler.New(e.Log, e.Projector, rcfg, logger)
	e.Reconciler = rec
	if err := e.Projector.Open(ctx); err != nil {
		return nil, fmt.Errorf("open engine: %w", err)
	}
	if err := rec.Open(ctx); err != nil {
		return nil, fmt.Errorf("open engine: %w", err)
	}

	// The ingest answers the appends of the partitions the engine owns
	// (acquire, release), and reads of any session.
	if cfg.MapIngest != nil {
		if err := cfg.MapIngest(e.Log.Partitions()); err != nil {
			return nil, fmt.Errorf("open engine: ingest mapping: %w", err)
		}
	}
	icfg := cfg.Ingest
	icfg.Shared, icfg.UseExisting, icfg.Gate = true, true, e.Gate
	if m != nil {
		icfg.OnAppend, icfg.OnReceive, icfg.OnQuarantineDrop = m.IngestOutcome, m.IngestReceived, m.QuarantineDropped
	}
	if e.Ingest, err = ingestserver.NewServer(nc, e.Log, icfg, logger); err != nil {
		return nil, fmt.Errorf("open engine: %w", err)
	}
	if err := e.Ingest.Open(ctx); err != nil {
		return nil, fmt.Errorf("open engine: %w", err)
	}

	// Answer erase notices before joining: an eraser that sees this
	// engine in the group hears from it.
	e.notice, err = erasure.Listen(nc, erasure.MemberConfig{Gate: e.Gate, Group: Group, Member: cfg.Name, Forget: e.forget}, logger)
	if err != nil {
		return nil, fmt.Errorf("open engine: %w", err)
	}
	e.mu.Lock()
	e.joining = true
	e.mu.Unlock()
	e.member, err = pgroup.Join(ctx, js, pgroup.Config{
		Group: Group, Member: cfg.Name, Partitions: e.Log.Partitions(), Heartbeat: cfg.Heartbeat, TTL: cfg.TTL,
		CreateBucket: !cfg.UseExisting, Replicas: e.Log.Config().Replicas,
		Info:      map[string]string{"kind": "engine"},
		OnAcquire: e.acquire,
		OnRelease: e.release,
	}, logger)
	e.mu.Lock()
	e.joining = false
	e.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("open engine: %w", err)
	}
	ok = true
	if m != nil {
		e.wg.Add(1)
		go e.observeLoop(m)
	}
	if cfg.RetentionEvery > 0 {
		e.wg.Add(1)
		go e.retentionLoop()
	}
	// Debug: the process says it is ready once everything around the
	// engine listens too (engine serve's "engine ready").
	e.l.Debug().Str("name", e.member.Name()).Ints("partitions", e.member.Owned()).Int("of", e.Log.Partitions()).Msg("engine open")
	return e, nil
}

// recordPolicy records the reconciler policy the engine runs with in the
// audit stream, when it differs from the one last recorded, so that
// `engine whatif --baseline recorded` knows the policy in force. An
// engine that may not write the audit stream says so and runs on.
func (e *Engine) recordPolicy(ctx context.Context) {
	p := e.cfg.Policy
	if p == nil {
		p = reconciler.DefaultPolicy()
	}
	text, err := p.YAML()
	if err == nil {
		_, err = audit.RecordPolicy(ctx, e.js, audit.Who(e.nc), "engine "+e.cfg.Name+" started with this policy", text)
	}
	if err != nil {
		e.l.Warn().Err(err).Msg("the policy in force is not recorded in " + audit.Stream + " (engine whatif --baseline recorded will not know it)")
	}
}

// acquire starts folding and reconciling partition p under its lease
// (ctx: done the moment the engine must stop acting on p), and scans its
// sessions (restart recovery, or what the previous holder left) in the
// background; then it starts answering the partition's appends.
func (e *Engine) acquire(ctx context.Context, p int, lease pgroup.Lease) error {
	if err := e.Projector.Acquire(ctx, p, lease.TakenOver); err != nil {
		return err
	}
	if e.OTel != nil {
		e.OTel.Acquire(ctx, p, lease.TakenOver)
	}
	if err := e.Ingest.Acquire(ctx, p); err != nil {
		if e.OTel != nil {
			e.OTel.Release(ctx, p)
		}
		e.Projector.Release(ctx, p, false)
		return err
	}
	e.mu.Lock()
	restart, closed := e.joining, e.closed
	if !closed {
		e.leases[p] = ctx
		e.wg.Add(1)
	}
	e.mu.Unlock()
	if closed {
		return nil
	}
	if m := e.cfg.Metrics; m != nil {
		m.SetPartitionLease(Group, p, lease.Token)
		// The lease's series goes the moment the lease ends.
		context.AfterFunc(ctx, func() { m.EndPartitionLease(Group, p, lease.Token) })
	}
	go func() {
		defer e.wg.Done()
		_ = e.Reconciler.Scan(ctx, []int{p}, restart)
		// The fleet index holds every session of the partition: rows a
		// previous owner could not store are rebuilt from the log.
		n, err := e.Projector.ReconcileIndex(ctx, p)
		switch {
		case err != nil && ctx.Err() == nil:
			e.l.Warn().Err(err).Int("partition", p).Msg("fleet index not reconciled with the log; the projector tries again while it holds the partition")
		case n > 0:
			e.l.Info().Int("partition", p).Int("rows", n).Msg("fleet index: rows the log holds but the index missed, rebuilt")
		}
	}()
	return nil
}

// owns reports whether the engine may act on partition p now: it holds
// p's lease and the lease has not ended.
func (e *Engine) owns(p int) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	lease, ok := e.leases[p]
	return ok && lease.Err() == nil
}

// pinMoved: the pin of partition p's consumer moved away while the engine
// held p (the projector dropped the partition's states). The partition's
// sessions are judged again from the log, so that what broke while
// another client held the pin is resolved now.
func (e *Engine) pinMoved(p int) {
	e.cfg.Metrics.PinMoved(Group)
	e.mu.Lock()
	lease, ok := e.leases[p]
	if ok && !e.closed {
		e.wg.Add(1)
	}
	e.mu.Unlock()
	if !ok || e.closed {
		return
	}
	go func() {
		defer e.wg.Done()
		_ = e.Reconciler.Scan(lease, []int{p}, false)
	}()
}

// forget drops the erased scope's state from the projector and the
// reconciler (erasure.MemberConfig.Forget).
func (e *Engine) forget(scope erasure.Scope) {
	if e.Projector != nil {
		e.Projector.Forget(scope.Covers)
	}
	if e.Reconciler != nil {
		e.Reconciler.Forget(scope)
	}
	if e.OTel != nil {
		e.OTel.Forget(scope)
	}
}

// release stops answering partition p's appends (once those it took are
// answered, so the next owner appends a session's events after them),
// then stops folding and reconciling it: at once when fenced (the lease
// ended), else after the events delivered are folded.
func (e *Engine) release(ctx context.Context, p int, fenced bool) {
	e.mu.Lock()
	delete(e.leases, p)
	e.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, 2*e.Log.Config().Timeout)
	e.Ingest.Release(rctx, p)
	cancel()
	if e.OTel != nil {
		e.OTel.Release(ctx, p)
	}
	e.Projector.Release(ctx, p, fenced)
	e.Reconciler.Release(p)
}

// observeLoop feeds the partition metrics every MetricsEvery.
func (e *Engine) observeLoop(m *telemetry.Metrics) {
	defer e.wg.Done()
	tick := time.NewTicker(e.cfg.MetricsEvery)
	defer tick.Stop()
	for {
		owned := e.member.Owned()
		m.SetPartitions(Group, len(owned), e.member.Rebalances())
		ctx, cancel := context.WithTimeout(e.runCtx, 5*time.Second)
		if states, err := projections.PartitionStates(ctx, e.js, "", owned); err == nil {
			lags := make(map[int]uint64, len(states))
			for _, st := range states {
				lags[st.Partition] = st.Pending
			}
			m.SetPartitionLags(lags)
		}
		if e.OTel != nil {
			if lags, err := e.OTel.Lags(ctx); err == nil {
				m.SetOTelLags(lags)
			}
		}
		cancel()
		select {
		case <-e.runCtx.Done():
			return
		case <-tick.C:
		}
	}
}

// Name is the engine's name in its group.
func (e *Engine) Name() string {
	if e.member == nil {
		return e.cfg.Name
	}
	return e.member.Name()
}

// Partitions returns the partitions the engine owns now.
func (e *Engine) Partitions() []int {
	if e.member == nil {
		return nil
	}
	return e.member.Owned()
}

// Member is the engine's membership in the engines' group.
func (e *Engine) Member() *pgroup.Member { return e.member }

// Healthy returns nil, or why the engine cannot do its work: the NATS
// connection is down, or the reconciler failed closed.
func (e *Engine) Healthy() error {
	if !e.nc.IsConnected() {
		return fmt.Errorf("nats connection %s", e.nc.Status())
	}
	if e.Reconciler != nil {
		return e.Reconciler.Healthy()
	}
	return nil
}

// Session returns the session's current state: the projector's copy when
// this engine holds it, else its snapshot and tail from the log.
func (e *Engine) Session(ctx context.Context, tenant, session string) (*projections.Session, error) {
	if s, ok := e.Projector.Session(tenant, session); ok {
		return s, nil
	}
	return projections.Restore(ctx, e.Log, e.Store, tenant, session)
}

// Close leaves the group (releasing every partition: the others take them
// at once), stops the reconciler, the projector and the presence tracker,
// and waits for them or for ctx. It does not close the NATS connection.
func (e *Engine) Close(ctx context.Context) error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	e.mu.Unlock()
	var errs []error
	if e.Ingest != nil {
		errs = append(errs, e.Ingest.Close(ctx))
	}
	if e.member != nil {
		errs = append(errs, e.member.Leave(ctx))
	}
	if e.notice != nil {
		_ = e.notice.Unsubscribe()
	}
	if e.cancel != nil {
		e.cancel()
	}
	e.wg.Wait()
	if e.Reconciler != nil {
		errs = append(errs, e.Reconciler.Close(ctx))
	}
	if e.Projector != nil {
		if err := e.Projector.Close(ctx); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, err)
		}
	}
	if e.Presence != nil {
		errs = append(errs, e.Presence.Close(ctx))
	}
	if e.OTel != nil {
		errs = append(errs, e.OTel.Close(ctx))
	}
	return errors.Join(errs...)
}

// openOTel starts the engine's live export: it checks the export's
// consumers exist (an engine that may not create them needs an operator's
// `engine setup` with the export on) and shares the partitions the
// engine owns.
func openOTel(ctx context.Context, e *Engine, cfg Config, logger *zerolog.Logger) (*otel.Exporter, error) {
	st, err := e.js.Stream(ctx, events.EventsStream)
	if err != nil {
		return nil, fmt.Errorf("otel export: %w", err)
	}
	if _, err := st.Consumer(ctx, otel.ConsumerName("", 0)); errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("otel export: %w", otel.ErrNoConsumer)
	} else if err != nil {
		return nil, fmt.Errorf("otel export: %w", err)
	}
	xc := cfg.OTel.Export
	xc.Shared, xc.Gate = true, e.Gate
	if m := cfg.Metrics; m != nil {
		prev := xc.OnExport
		xc.OnExport = func(spans int, err error) {
			m.OTelExport(spans, err)
			if prev != nil {
				prev(spans, err)
			}
		}
	}
	x, err := otel.NewExporter(e.Log, cfg.OTel.Exporter, xc, logger)
	if err != nil {
		return nil, fmt.Errorf("otel export: %w", err)
	}
	return x, nil
}

// Coverage is how the engines' group covers the event stream's
// partitions at a moment: the partitions this engine owns, and those no
// engine answers now (nobody owns them, or only an engine unheard for
// more than two heartbeats, whose claim has yet to expire: a previous
// run's, killed). Publishers of an uncovered partition's sessions get
// "no responders" and retry.
type Coverage struct {
	Partitions int
	Owned      []int
	Uncovered  []int
	// Silent are the engines unheard for two heartbeats that still claim
	// partitions, with how long they have been silent.
	Silent map[string]time.Duration
}

// Covered reports whether every partition has a live owner.
func (c Coverage) Covered() bool { return len(c.Uncovered) == 0 }

// Coverage reads the engines' heartbeats and reports the group's
// coverage of the partitions (this engine's own partitions as it holds
// them). Errors: the members bucket cannot be read.
func (e *Engine) Coverage(ctx context.Context) (Coverage, error) {
	c := Coverage{Partitions: e.Log.Partitions(), Owned: e.Partitions(), Silent: map[string]time.Duration{}}
	recs, err := pgroup.List(ctx, e.js, pgroup.DefaultBucket, Group)
	if err != nil {
		return c, fmt.Errorf("coverage: %w", err)
	}
	beat := e.cfg.Heartbeat
	if beat == 0 {
		beat = pgroup.DefaultHeartbeat
	}
	covered := make([]bool, c.Partitions)
	for _, p := range c.Owned {
		covered[p] = true
	}
	now := time.Now()
	for _, r := range recs {
		if r.Member == e.Name() {
			continue
		}
		if since := now.Sub(r.Beat); since > 2*beat+beat/2 {
			if len(r.Partitions) > 0 {
				c.Silent[r.Member] = since.Round(100 * time.Millisecond)
			}
			continue
		}
		for _, p := range r.Partitions {
			if p >= 0 && p < len(covered) {
				covered[p] = true
			}
		}
	}
	for p, ok := range covered {
		if !ok {
			c.Uncovered = append(c.Uncovered, p)
		}
	}
	return c, nil
}

// WaitCovered waits until every partition has a live owner (Coverage),
// or ctx ends, and returns the last coverage seen.
func (e *Engine) WaitCovered(ctx context.Context) (Coverage, error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := e.Coverage(ctx)
		if err == nil && c.Covered() {
			return c, nil
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return c, err
			}
			return c, nil
		case <-tick.C:
		}
	}
}
