package otel

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/erasure"
	"github.com/turnstone-dev/turnstone/projections"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Defaults of ExporterConfig and of the export consumers.
const (
	// DefaultDurable prefixes the export consumers' names:
	// "turnstone-otel-p<partition>".
	DefaultDurable = "turnstone-otel"
	// DefaultGroup is the pinned_client priority group the engines pull
	// the export consumers in, as they pull the projector's.
	DefaultGroup = projections.DefaultProjectorGroup
	// DefaultAckWait is how long an engine may hold an event of the
	// export unacknowledged before JetStream delivers it again; the
	// exporter marks what it holds in progress while a backend is down.
	DefaultAckWait = time.Minute
	// DefaultMaxAckPending bounds the events of one partition delivered
	// to the export and not yet acknowledged (exported).
	DefaultMaxAckPending = 4096
	// DefaultMaxSessions and DefaultIdleEvict bound the sessions whose
	// open spans the export holds in memory (an evicted session is
	// restored from the log at its next event).
	DefaultMaxSessions = 10000
	DefaultIdleEvict   = time.Minute
)

// ConsumerName is the export consumer of partition p for durable (""
// for DefaultDurable): "<durable>-p<p>".
func ConsumerName(durable string, p int) string {
	if durable == "" {
		durable = DefaultDurable
	}
	return durable + "-p" + strconv.Itoa(p)
}

// ConsumerConfig is the durable consumer the live export reads partition p
// through, apart from the projector's, so that a backend that is down
// delays the export and never the engine: the events of agent.evt.<p>.>
// stored after the consumer was created (DeliverNew: the live export
// starts when it is set up; `engine export otel` sends the history),
// acknowledged cumulatively (AckAll) once their spans are exported,
// pulled by one engine at a time (the pinned_client priority policy,
// ADR-42, in group).
func ConsumerConfig(durable, group string, p int) jetstream.ConsumerConfig {
	if group == "" {
		group = DefaultGroup
	}
	return jetstream.ConsumerConfig{
		Durable:        ConsumerName(durable, p),
		Description:    fmt.Sprintf("Turnstone OpenTelemetry export: the sessions of partition %d", p),
		FilterSubject:  events.StoredPartitionFilter(p),
		AckPolicy:      jetstream.AckAllPolicy,
		AckWait:        DefaultAckWait,
		MaxAckPending:  DefaultMaxAckPending,
		DeliverPolicy:  jetstream.DeliverNewPolicy,
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PriorityGroups: []string{group},
		PinnedTTL:      10 * time.Second,
	}
}

// EnsureConsumers creates or updates the export consumer of every
// partition: `engine setup` does (engine.WithOTelExport), and an engine
// that sets up JetStream itself, when its export is on. An exporter never
// creates them (Exporter.Acquire waits for them to exist).
func EnsureConsumers(ctx context.Context, js jetstream.JetStream, partitions int) error {
	st, err := js.Stream(ctx, events.EventsStream)
	if err != nil {
		return fmt.Errorf("export consumers: %w", err)
	}
	for p := 0; p < partitions; p++ {
		if _, err := st.CreateOrUpdateConsumer(ctx, ConsumerConfig("", "", p)); err != nil {
			return fmt.Errorf("export consumer %s: %w", ConsumerName("", p), err)
		}
	}
	return nil
}

// ErrNoConsumer is wrapped by Acquire's error when the partition's export
// consumer does not exist: run `engine setup` with the export on.
var ErrNoConsumer = errors.New("the export consumer does not exist: run engine setup with OTEL_EXPORTER_OTLP_ENDPOINT set")

// ExporterConfig configures an Exporter. The zero value takes the
// defaults.
type ExporterConfig struct {
	// Map is how sessions map to spans (Backfill takes the same).
	Map MapConfig
	// Batch is the export's batching (OTEL_BSP_*).
	Batch Batch
	// Resource describes the engine in every span (ResourceFromEnv).
	Resource *resource.Resource
	// Durable and Group name the consumers (ConsumerName) and their
	// priority group. Defaults DefaultDurable, DefaultGroup.
	Durable string
	Group   string
	// Shared says the export shares the partitions with other engines
	// (the engine's partition group drives Acquire and Release); when
	// false, Open acquires every partition.
	Shared bool
	// MaxSessions and IdleEvict bound the sessions held in memory.
	MaxSessions int
	IdleEvict   time.Duration
	// RetryMax is the longest wait between two tries of an export that
	// fails. Default 5 seconds.
	RetryMax time.Duration
	// Gate, when set, is the engine's erasure gate: an event of a
	// session being erased (or of an erased sequence) is acknowledged
	// without being exported, and its session's state forgotten.
	Gate *erasure.Gate
	// OnExport, when set, is called after each export call with the
	// spans it sent and its error (nil: exported).
	OnExport func(spans int, err error)
}

func (c *ExporterConfig) setDefaults() {
	c.Batch.setDefaults()
	c.Map.setDefaults()
	if c.Durable == "" {
		c.Durable = DefaultDurable
	}
	if c.Group == "" {
		c.Group = DefaultGroup
	}
	if c.MaxSessions <= 0 {
		c.MaxSessions = DefaultMaxSessions
	}
	if c.IdleEvict <= 0 {
		c.IdleEvict = DefaultIdleEvict
	}
	if c.RetryMax <= 0 {
		c.RetryMax = 5 * time.Second
	}
}

// Validate reports every out-of-range field, joined.
func (c *ExporterConfig) Validate() error {
	var errs []error
	if c.MaxSessions < 0 || c.IdleEvict < 0 || c.RetryMax < 0 {
		errs = append(errs, errors.New("max sessions, idle evict, retry max: must not be negative"))
	}
	if c.Map.MaxContentBytes < 0 {
		errs = append(errs, errors.New("max content bytes: must not be negative"))
	}
	if c.Durable != "" && !events.ValidToken(c.Durable) {
		errs = append(errs, fmt.Errorf("durable: %q is not a token of [A-Za-z0-9_-]", c.Durable))
	}
	return errors.Join(errs...)
}

// Exporter is the live export of an engine: for each partition the
// engine owns, it reads the partition's events through the partition's
// export consumer (its own, beside the projector's), replays each session
// (projections.Replayer) into spans, exports them, and only then
// acknowledges the events. A backend that is down stops the export
// (which holds what it read, retrying) while the engine folds, appends
// and reconciles as before; when the backend is back, the export catches
// up from where it stopped, losing nothing. Its lag is
// Lags (on /metrics: otel_export_lag).
//
// A session the export does not hold in memory (new to it since it
// acquired the partition, or evicted) is restored by replaying its events
// before the one delivered, silently: the spans of those events were
// exported already. The same log gives the same spans (Backfill's), with
// the same ids.
type Exporter struct {
	log *events.Log
	exp sdktrace.SpanExporter
	cfg ExporterConfig
	l   zerolog.Logger

	mu     sync.Mutex
	parts  map[int]*partWorker
	closed bool

	spans    atomic.Int64
	failures atomic.Int64
}

// NewExporter returns an export of log's sessions to exp. logger may be
// nil. The exporter is closed (exp shut down) by Close.
func NewExporter(log *events.Log, exp sdktrace.SpanExporter, cfg ExporterConfig, logger *zerolog.Logger) (*Exporter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("new otel exporter: %w", err)
	}
	cfg.setDefaults()
	e := &Exporter{log: log, exp: exp, cfg: cfg, l: zerolog.Nop(), parts: map[int]*partWorker{}}
	if logger != nil {
		e.l = logger.With().Str("component", "otel").Logger()
	}
	return e, nil
}

// Open acquires every partition unless the exporter is Shared.
func (e *Exporter) Open(ctx context.Context) error {
	if e.cfg.Shared {
		return nil
	}
	for p := 0; p < e.log.Partitions(); p++ {
		e.Acquire(ctx, p, false)
	}
	return nil
}

// Acquire starts exporting partition part through its export consumer
// (EnsureConsumers), on a goroutine of its own. It never fails: while the
// consumer cannot be read (JetStream unavailable, or the consumer not set
// up: ErrNoConsumer) the goroutine logs why and tries again, and the
// engine's other work goes on. unpin asks the server to unpin the
// consumer first (the previous owner is dead). Acquiring a partition held
// is a no-op.
func (e *Exporter) Acquire(ctx context.Context, part int, unpin bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, held := e.parts[part]; held || e.closed {
		return
	}
	col := &collector{}
	tp := newProvider(e.cfg.Resource, col)
	wctx, cancel := context.WithCancel(context.Background())
	w := &partWorker{e: e, part: part, unpin: unpin, col: col, tp: tp, m: newMapper(tp, e.log, e.cfg.Map),
		sessions: map[string]*liveSession{}, cancel: cancel, done: make(chan struct{})}
	e.parts[part] = w
	go w.run(wctx)
}

// consumer looks the partition's export consumer up (and unpins it once
// when asked), trying again until it is found or ctx ends.
func (w *partWorker) consumer(ctx context.Context) (jetstream.Consumer, bool) {
	e := w.e
	name := ConsumerName(e.cfg.Durable, w.part)
	var logged time.Time
	for ctx.Err() == nil {
		cons, err := func() (jetstream.Consumer, error) {
			lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			st, err := e.log.JetStream().Stream(lctx, events.EventsStream)
			if err != nil {
				return nil, err
			}
			cons, err := st.Consumer(lctx, name)
			if errors.Is(err, jetstream.ErrConsumerNotFound) {
				return nil, fmt.Errorf("consumer %s: %w", name, ErrNoConsumer)
			}
			if err != nil {
				return nil, fmt.Errorf("consumer %s: %w", name, err)
			}
			if w.unpin {
				if err := st.UnpinConsumer(lctx, name, e.cfg.Group); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
					e.l.Debug().Err(err).Int("partition", w.part).Msg("unpin")
				}
			}
			return cons, nil
		}()
		if err == nil {
			return cons, true
		}
		if time.Since(logged) > time.Minute {
			e.l.Error().Err(err).Int("partition", w.part).Msg("export: cannot read the export consumer; trying again")
			logged = time.Now()
		}
		sleep(ctx, 2*time.Second)
	}
	return nil, false
}

// Release stops exporting partition part: what it read is exported and
// acknowledged if the backend takes it within ctx, else left for the next
// owner (who exports it again, with the same ids). Releasing a partition
// not held is a no-op.
func (e *Exporter) Release(ctx context.Context, part int) {
	e.mu.Lock()
	w, held := e.parts[part]
	delete(e.parts, part)
	e.mu.Unlock()
	if !held {
		return
	}
	w.stop(ctx)
	uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if st, err := e.log.JetStream().Stream(uctx, events.EventsStream); err == nil {
		_ = st.UnpinConsumer(uctx, ConsumerName(e.cfg.Durable, part), e.cfg.Group)
	}
}

// Partitions returns the partitions the exporter exports now, in order.
func (e *Exporter) Partitions() []int {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]int, 0, len(e.parts))
	for p := range e.parts {
		out = append(out, p)
	}
	sort.Ints(out)
	return out
}

// Close releases every partition and shuts the span exporter down.
func (e *Exporter) Close(ctx context.Context) error {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	for _, p := range e.Partitions() {
		e.Release(ctx, p)
	}
	if err := e.exp.Shutdown(ctx); err != nil {
		return fmt.Errorf("close otel exporter: %w", err)
	}
	return nil
}

// Forget drops the erased scope's sessions from memory.
func (e *Exporter) Forget(scope erasure.Scope) {
	e.mu.Lock()
	ws := make([]*partWorker, 0, len(e.parts))
	for _, w := range e.parts {
		ws = append(ws, w)
	}
	e.mu.Unlock()
	for _, w := range ws {
		w.forget(func(tenant, session string) bool { return scope.Covers(tenant, session) })
	}
}

// Exported is how many spans the exporter exported since it started, and
// how many export calls failed.
func (e *Exporter) Exported() (spans, failures int64) { return e.spans.Load(), e.failures.Load() }

// Lags returns, for each partition the exporter exports, the events not
// yet exported: its consumer's pending count plus those delivered and
// not yet acknowledged.
func (e *Exporter) Lags(ctx context.Context) (map[int]uint64, error) {
	st, err := e.log.JetStream().Stream(ctx, events.EventsStream)
	if err != nil {
		return nil, fmt.Errorf("otel lags: %w", err)
	}
	out := map[int]uint64{}
	for _, p := range e.Partitions() {
		c, err := st.Consumer(ctx, ConsumerName(e.cfg.Durable, p))
		if err != nil {
			return nil, fmt.Errorf("otel lag of partition %d: %w", p, err)
		}
		ci, err := c.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("otel lag of partition %d: %w", p, err)
		}
		out[p] = ci.NumPending + uint64(ci.NumAckPending)
	}
	return out, nil
}

// liveSession is a session the export holds: its replay and its mapper.
type liveSession struct {
	rep     *projections.Replayer
	sm      *sessionMapper
	touched time.Time
}

// partWorker exports one partition, on its own goroutine.
type partWorker struct {
	e     *Exporter
	part  int
	unpin bool
	cons  jetstream.Consumer
	col   *collector
	tp    *sdktrace.TracerProvider
	m     *mapper

	mu       sync.Mutex
	sessions map[string]*liveSession

	// ackFloor is the last stream sequence acknowledged (AckAll): the
	// consumer's at the start, then the worker's own.
	ackFloor uint64

	cancel   context.CancelFunc
	done     chan struct{}
	stopOnce sync.Once
	flushCtx atomic.Pointer[context.Context]
}

// stop ends the worker: it exports and acknowledges what it holds if it
// can within ctx, and returns when the worker has stopped.
func (w *partWorker) stop(ctx context.Context) {
	w.stopOnce.Do(func() {
		w.flushCtx.Store(&ctx)
		w.cancel()
	})
	select {
	case <-w.done:
	case <-ctx.Done():
	}
}

func (w *partWorker) forget(covers func(tenant, session string) bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, ls := range w.sessions {
		if covers(ls.sm.tenant, ls.sm.session) {
			delete(w.sessions, k)
		}
	}
}

// maxHeld bounds the events a worker holds read and not yet
// acknowledged: past it, it exports before it reads more.
const maxHeld = DefaultMaxAckPending / 2

// run reads, maps, exports and acknowledges until ctx ends.
func (w *partWorker) run(ctx context.Context) {
	defer close(w.done)
	defer func() { _ = w.tp.Shutdown(context.Background()) }()
	cons, ok := w.consumer(ctx)
	if !ok {
		return
	}
	w.cons = cons
	if ci, err := cons.Info(ctx); err == nil {
		w.ackFloor = ci.AckFloor.Stream
	}
	cfg := w.e.cfg
	var (
		pending   []jetstream.Msg // read, mapped, not yet acknowledged
		firstSpan time.Time       // when the oldest span waiting was made
		lastEvict = time.Now()
		it        jetstream.MessagesContext
	)
	defer func() {
		if it != nil {
			it.Stop()
		}
	}()
	fail := func(err error) {
		// The state may hold events whose spans were not exported: forget
		// it all, and have what is pending delivered again.
		w.e.l.Warn().Err(err).Int("partition", w.part).Msg("export: mapping failed; the events are delivered again")
		for _, m := range pending {
			_ = m.NakWithDelay(time.Second)
		}
		pending = nil
		_ = w.col.take()
		w.mu.Lock()
		w.sessions = map[string]*liveSession{}
		w.mu.Unlock()
		sleep(ctx, time.Second)
	}
	for {
		if ctx.Err() != nil {
			w.final(pending)
			if it != nil {
				// Hand the events pulled and not read yet back too, for
				// the next owner to have at once.
				it.Drain()
				for {
					m, err := it.Next(jetstream.NextMaxWait(200 * time.Millisecond))
					if err != nil {
						break
					}
					_ = m.Nak()
				}
				it = nil
			}
			return
		}
		if it == nil {
			var err error
			if it, err = cons.Messages(jetstream.PullMaxMessages(256), jetstream.PullPriorityGroup(cfg.Group)); err != nil {
				w.e.l.Warn().Err(err).Int("partition", w.part).Msg("export: cannot pull; trying again")
				it = nil
				sleep(ctx, time.Second)
				continue
			}
		}
		full := w.col.len() >= cfg.Batch.MaxExportBatchSize || w.col.len() >= cfg.Batch.MaxQueueSize || len(pending) >= maxHeld
		if !full {
			// Read while events come; once none comes within the wait,
			// what was read is exported (spans: once ScheduleDelay has
			// passed since the oldest was made; none: at once).
			wait := 250 * time.Millisecond
			if len(pending) > 0 {
				wait = time.Millisecond
				if w.col.len() > 0 {
					wait = max(time.Until(firstSpan.Add(cfg.Batch.ScheduleDelay)), time.Millisecond)
				}
			}
			msg, err := it.Next(jetstream.NextMaxWait(wait))
			switch {
			case err == nil:
				pending = append(pending, msg)
				before := w.col.len()
				if err := w.handle(ctx, msg); err != nil {
					if ctx.Err() == nil {
						fail(err)
					}
					continue
				}
				if before == 0 && w.col.len() > 0 {
					firstSpan = time.Now()
				}
				continue
			case errors.Is(err, nats.ErrTimeout):
			default:
				if ctx.Err() == nil {
					w.e.l.Debug().Err(err).Int("partition", w.part).Msg("export: pull ended; pulling again")
					it.Stop()
					it = nil
					sleep(ctx, 200*time.Millisecond)
				}
				continue
			}
		}
		if len(pending) == 0 || !full && w.col.len() > 0 && time.Since(firstSpan) < cfg.Batch.ScheduleDelay {
			continue
		}
		if !w.export(ctx, pending) {
			continue // ctx ended: final() decides
		}
		w.ack(pending[len(pending)-1])
		pending = nil
		if time.Since(lastEvict) > 10*time.Second {
			w.evict()
			lastEvict = time.Now()
		}
	}
}

// ack acknowledges msg and every event before it (AckAll), and moves the
// worker's ack floor.
func (w *partWorker) ack(msg jetstream.Msg) {
	_ = msg.Ack()
	if meta, err := msg.Metadata(); err == nil {
		w.mu.Lock()
		if meta.Sequence.Stream > w.ackFloor {
			w.ackFloor = meta.Sequence.Stream
		}
		w.mu.Unlock()
	}
}

// final exports and acknowledges what the worker holds when it stops, if
// the backend takes it before the release's context ends; else it hands
// the events back (a nak), for the next owner to export at once.
func (w *partWorker) final(pending []jetstream.Msg) {
	if len(pending) == 0 {
		return
	}
	ctx := context.Background()
	if p := w.flushCtx.Load(); p != nil {
		ctx = *p
	}
	ctx, cancel := context.WithTimeout(ctx, w.e.cfg.Batch.ExportTimeout)
	defer cancel()
	if w.export(ctx, pending) {
		w.ack(pending[len(pending)-1])
		return
	}
	for _, m := range pending {
		_ = m.Nak()
	}
}

// export sends every span waiting, in batches, retrying each until it is
// exported or ctx ends (false). While it retries it marks the events it
// holds in progress, so that JetStream does not deliver them again.
func (w *partWorker) export(ctx context.Context, pending []jetstream.Msg) bool {
	cfg := w.e.cfg
	spans := w.col.take()
	lastProgress := time.Now()
	for len(spans) > 0 {
		n := min(len(spans), cfg.Batch.MaxExportBatchSize)
		batch := spans[:n]
		b := backoff.NewExponentialBackOff()
		b.InitialInterval = 100 * time.Millisecond
		b.MaxInterval = cfg.RetryMax
		b.MaxElapsedTime = 0
		for {
			tctx, cancel := context.WithTimeout(ctx, cfg.Batch.ExportTimeout)
			err := w.e.exp.ExportSpans(tctx, batch)
			cancel()
			if cfg.OnExport != nil {
				cfg.OnExport(len(batch), err)
			}
			if err == nil {
				w.e.spans.Add(int64(len(batch)))
				break
			}
			w.e.failures.Add(1)
			if ctx.Err() != nil {
				w.col.mu.Lock()
				w.col.spans = append(spans, w.col.spans...) // kept for final()
				w.col.mu.Unlock()
				return false
			}
			w.e.l.Warn().Err(err).Int("partition", w.part).Int("spans", len(batch)).Msg("export failed; retrying (the engine goes on)")
			if time.Since(lastProgress) > DefaultAckWait/3 {
				for _, m := range pending {
					_ = m.InProgress()
				}
				lastProgress = time.Now()
			}
			sleep(ctx, b.NextBackOff())
		}
		spans = spans[n:]
	}
	return true
}

// handle maps one delivered event.
func (w *partWorker) handle(ctx context.Context, msg jetstream.Msg) error {
	meta, err := msg.Metadata()
	if err != nil {
		return nil // not a stream message: nothing to map
	}
	ev := events.DecodeStoredAt(msg.Subject(), meta.Sequence.Stream, meta.Timestamp, msg.Data())
	if ev.Tenant == "" || ev.Session == "" {
		return nil // a subject that names no session
	}
	key := ev.Tenant + "/" + ev.Session
	gate := w.e.cfg.Gate
	if gate.Skip(ev.Tenant, ev.Session, ev.Seq) || gate.Blocked(ev.Tenant, ev.Session) {
		w.mu.Lock()
		delete(w.sessions, key)
		w.mu.Unlock()
		return nil
	}
	ls, err := w.session(ctx, ev)
	if err != nil {
		return err
	}
	ls.touched = time.Now()
	step, ok, err := ls.rep.Apply(ctx, ev)
	if err != nil {
		return err
	}
	if !ok {
		return nil // a redelivery of an event folded already
	}
	return ls.sm.step(ctx, step)
}

// session returns the session of ev, restoring it when the worker does
// not hold it: its events before ev are replayed; the spans of those the
// consumer's ack floor covers were exported already and are not emitted
// again, those of the events after it (delivered to an owner before this
// one, or to this one before an eviction, and not acknowledged) are: a
// span may then be sent twice, with the same ids, never lost.
func (w *partWorker) session(ctx context.Context, ev events.Event) (*liveSession, error) {
	key := ev.Tenant + "/" + ev.Session
	w.mu.Lock()
	ls := w.sessions[key]
	floor := w.ackFloor
	w.mu.Unlock()
	if ls != nil {
		return ls, nil
	}
	log := w.e.log
	sm := w.m.newSession(ev.Tenant, ev.Session)
	ls = &liveSession{sm: sm}
	first, err := log.FirstSeq(ctx, ev.Tenant, ev.Session)
	if err != nil && !errors.Is(err, events.ErrSessionNotFound) {
		return nil, fmt.Errorf("restore %s: %w", key, err)
	}
	if ev.Seq <= 1 || first == 0 || first >= ev.Seq {
		ls.rep = projections.NewReplayer(log)
	} else {
		state, err := projections.Replay(ctx, log, ev.Tenant, ev.Session, projections.ReplayRange{To: ev.Seq - 1},
			func(st projections.Step) error {
				sm.silent = st.Event.Seq <= floor
				return sm.step(ctx, st)
			})
		sm.silent = false
		if err != nil {
			return nil, fmt.Errorf("restore %s: %w", key, err)
		}
		ls.rep = projections.NewReplayerFrom(log, state)
	}
	w.mu.Lock()
	w.sessions[key] = ls
	over := len(w.sessions) - w.e.cfg.MaxSessions
	w.mu.Unlock()
	if over > 0 {
		w.evictOldest(over)
	}
	return ls, nil
}

// evict forgets the sessions idle for IdleEvict whose events are all
// acknowledged (a restore emits nothing of them again).
func (w *partWorker) evict() {
	cut := time.Now().Add(-w.e.cfg.IdleEvict)
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, ls := range w.sessions {
		if ls.touched.Before(cut) && ls.rep.State().LastSeq <= w.ackFloor {
			delete(w.sessions, k)
		}
	}
}

// evictOldest forgets the n sessions touched longest ago.
func (w *partWorker) evictOldest(n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	type kv struct {
		k string
		t time.Time
	}
	all := make([]kv, 0, len(w.sessions))
	for k, ls := range w.sessions {
		all = append(all, kv{k, ls.touched})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].t.Before(all[j].t) })
	for i := 0; i < n && i < len(all); i++ {
		delete(w.sessions, all[i].k)
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
