// Package worker executes recovery commands (package recovery is their
// contract): a Worker joins the workers' partition group, consumes the
// AGENT_RECOVERY partitions the group gives it in strict per-session
// order, runs each command's effect in the log or its strategy chain
// against the runtime (control requests, retries with backoff, circuit
// breakers per provider), and records every attempt and outcome in the
// session's own event log. Deciding whether something is broken is the
// reconciler's job.
package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/clock"
	"github.com/turnstone-dev/turnstone/internal/erasure"
	"github.com/turnstone-dev/turnstone/internal/pgroup"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// Config configures a Worker. The zero value takes the defaults.
type Config struct {
	// Name identifies the worker in recovery.attempted events and in the
	// status bucket. Default "<hostname>-<pid>".
	Name string
	// Delivery is what the worker expects of the partition consumers'
	// delivery settings (recovery.DeliveryConfig). The worker writes no
	// setting (`engine setup` is their one writer): a field left zero
	// takes what the consumers hold; a field set must be what they hold,
	// or Open refuses with a *recovery.SettingsError naming each
	// difference and changes nothing.
	Delivery recovery.DeliveryConfig
	// ControlTimeout bounds each control request to the runtime. Default
	// 10 seconds.
	ControlTimeout time.Duration
	// ConflictRetries is how many times a command is re-planned when the
	// session changed between the worker's read and its append. Default 8.
	ConflictRetries int
	// Chains overrides the default strategy chains per error class (see
	// DefaultChains); classes it does not name keep theirs.
	Chains recovery.Chains
	// Breaker configures the circuit breaker of each tenant's provider.
	Breaker BreakerConfig
	// Clock is the time source of retries and breakers (nil: SystemClock).
	Clock clock.Clock
	// Heartbeat and TTL configure the workers' partition group
	// (pgroup.Config; zero: 1 s and 5 s): each worker consumes only the
	// partitions it owns.
	Heartbeat time.Duration
	TTL       time.Duration
	// OnCommand, when set, is called as each delivery of a command ends,
	// with its kind, how it ended (an outcome; "skipped" when already done;
	// "parked"; "invalid"; "redeliver" when it will come again) and how
	// long it took (metrics).
	OnCommand func(kind, outcome string, took time.Duration)
	// OnLease, when set, is called when the worker takes partition p
	// (held, with its lease's fencing token) and the moment that lease
	// ends (not held, with the same token) (metrics).
	OnLease func(p int, token uint64, held bool)
}

func (c *Config) setDefaults() {
	if c.Name == "" {
		host, _ := os.Hostname()
		c.Name = host + "-" + strconv.Itoa(os.Getpid())
	}
	if c.ControlTimeout == 0 {
		c.ControlTimeout = 10 * time.Second
	}
	if c.ConflictRetries == 0 {
		c.ConflictRetries = 8
	}
}

// Validate reports every out-of-range field, joined.
func (c *Config) Validate() error {
	errs := []error{c.Delivery.Validate(), c.Breaker.Validate()}
	if c.Chains != nil {
		errs = append(errs, c.Chains.Validate())
	}
	if c.ControlTimeout < 0 {
		errs = append(errs, fmt.Errorf("control timeout: must not be negative, got %s", c.ControlTimeout))
	}
	if c.ConflictRetries < 0 {
		errs = append(errs, fmt.Errorf("conflict retries: must not be negative, got %d", c.ConflictRetries))
	}
	return errors.Join(errs...)
}

// Worker executes recovery commands. It pulls from every partition's
// consumer in PriorityGroup; NATS pins each partition to one worker of the
// group, so a session's commands run one at a time, in publish order, and
// move to another worker when this one dies. Each command's effect, attempts
// and outcome are appended to the session's own log.
type Worker struct {
	nc    *nats.Conn
	log   *events.Log
	store *projections.SnapshotStore
	cfg   Config
	l     zerolog.Logger

	chains   recovery.Chains
	breakers *Breakers
	follower *events.Follower

	kv     jetstream.KeyValue
	member *pgroup.Member
	// delivery holds each partition consumer's delivery settings as the
	// worker last read them (at Open, then at each acquire), by consumer
	// name: a command is kept alive, redelivered and parked by the
	// settings of the consumer that delivered it.
	delivery sync.Map // string -> recovery.DeliveryConfig
	gate     *erasure.Gate
	notice   *nats.Subscription
	mu       sync.Mutex
	ccs      map[int]jetstream.ConsumeContext
	runCtx   context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

// New returns a worker that executes commands against log, talking to
// runtimes over nc. logger may be nil.
func New(nc *nats.Conn, log *events.Log, cfg Config, logger *zerolog.Logger) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("new worker: %w", err)
	}
	cfg.setDefaults()
	store, err := projections.NewSnapshotStore(log.JetStream(), projections.SnapshotConfig{})
	if err != nil {
		return nil, fmt.Errorf("new worker: %w", err)
	}
	w := &Worker{nc: nc, log: log, store: store, cfg: cfg, l: zerolog.Nop(), chains: recovery.DefaultChains().Override(cfg.Chains),
		ccs: map[int]jetstream.ConsumeContext{}, gate: erasure.NewGate(erasure.Config{})}
	if logger != nil {
		w.l = logger.With().Str("worker", cfg.Name).Logger()
	}
	bcfg := cfg.Breaker
	bcfg.Clock = cfg.Clock
	bcfg.OnChange = w.recordBreaker
	if w.breakers, err = NewBreakers(bcfg); err != nil {
		return nil, fmt.Errorf("new worker: %w", err)
	}
	return w, nil
}

// Name is the worker's name.
func (w *Worker) Name() string { return w.cfg.Name }

// Open checks the recovery stream, its partition consumers and the status
// bucket (recovery.Check; it creates and changes none of them: `engine
// setup` does), joins the workers' partition group and consumes the
// partitions the group gives it (pgroup: balanced over the live workers,
// taken over within its bound when a worker dies). Commands run on
// goroutines the worker owns until Close.
//
// Errors: a *recovery.SettingsError when Config.Delivery asks for
// settings the consumers do not hold; recovery.ErrNotSetUp (wrapped) when
// the stream, a consumer or the status bucket does not exist.
func (w *Worker) Open(ctx context.Context) error {
	js := w.log.JetStream()
	stored, err := recovery.Check(ctx, js, w.log.Partitions(), w.cfg.Delivery)
	if err != nil {
		return fmt.Errorf("open worker: %w", err)
	}
	w.cfg.Delivery = stored
	w.kv, err = js.KeyValue(ctx, recovery.StatusBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		err = fmt.Errorf("%w: bucket %s does not exist (an operator creates it: engine setup)", recovery.ErrNotSetUp, recovery.StatusBucket)
	}
	if err != nil {
		return fmt.Errorf("open worker: %w", err)
	}
	w.runCtx, w.cancel = context.WithCancel(context.Background())
	// Answer erase notices before joining, so that an eraser that sees
	// this worker in the group hears from it.
	w.notice, err = erasure.Listen(w.nc, erasure.MemberConfig{Gate: w.gate, Group: recovery.WorkerGroup, Member: pgroupName(w.cfg.Name)}, &w.l)
	if err != nil {
		w.stop()
		return fmt.Errorf("open worker: %w", err)
	}
	// Mirror the breaker changes every worker records.
	w.follower, err = w.log.Follow(w.runCtx, events.FollowOptions{Session: events.BreakersSession}, w.mirrorBreaker)
	if err != nil {
		w.stop()
		return fmt.Errorf("open worker: follow breakers: %w", err)
	}
	w.member, err = pgroup.Join(ctx, w.log.JetStream(), pgroup.Config{
		Group: recovery.WorkerGroup, Member: pgroupName(w.cfg.Name), Partitions: w.log.Partitions(),
		Heartbeat: w.cfg.Heartbeat, TTL: w.cfg.TTL, Replicas: w.log.Config().Replicas,
		Info:      map[string]string{"kind": "worker", "name": w.cfg.Name},
		OnAcquire: w.acquire,
		OnRelease: w.release,
	}, &w.l)
	if err != nil {
		w.stop()
		return fmt.Errorf("open worker: %w", err)
	}
	w.l.Info().Ints("partitions", w.member.Owned()).Int("of", w.log.Partitions()).Msg("worker joined the recovery group")
	return nil
}

// pgroupName is the worker's name as a group member token.
func pgroupName(name string) string {
	b := []byte(name)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			b[i] = '-'
		}
	}
	return string(b)
}

// acquire starts consuming partition p's commands under its lease (ctx:
// done the moment the worker must stop acting on p). When the previous
// holder's lease ran out (lease.TakenOver), its pin is lifted. The
// consumer is reset to its acknowledgement floor before it is consumed,
// so a command an earlier holder (this worker too, before a fence) was
// running comes again at once, not after AckWait (commands are
// idempotent: what it recorded is found done or stored once). Pull
// requests expire inside the consumer's pinned TTL, so the pin stays
// while the partition is idle.
func (w *Worker) acquire(ctx context.Context, p int, lease pgroup.Lease) error {
	js := w.log.JetStream()
	name := recovery.ConsumerName(p)
	if lease.TakenOver {
		if err := pgroup.Unpin(ctx, js, recovery.Stream, name, recovery.PriorityGroup); err != nil {
			w.l.Debug().Err(err).Int("partition", p).Msg("unpin")
		}
	}
	w.redeliver(ctx, p)
	cons, err := js.Consumer(ctx, recovery.Stream, name)
	if err != nil {
		return fmt.Errorf("consumer %s: %w", name, err)
	}
	d := recovery.DeliveryOf(cons.CachedInfo().Config)
	if d != w.cfg.Delivery {
		w.l.Info().Str("consumer", name).Str("settings", d.String()).Msg("consumer settings changed by engine setup since the worker opened; following them")
	}
	w.delivery.Store(name, d)
	cc, err := cons.Consume(func(msg jetstream.Msg) { w.handle(ctx, msg) },
		jetstream.PullPriorityGroup(recovery.PriorityGroup), jetstream.PullMaxMessages(1),
		jetstream.PullExpiry(projections.PullExpiryFor(cons.CachedInfo().Config.PinnedTTL)))
	if err != nil {
		return fmt.Errorf("consume %s: %w", name, err)
	}
	w.mu.Lock()
	w.ccs[p] = cc
	w.mu.Unlock()
	if w.cfg.OnLease != nil {
		w.cfg.OnLease(p, lease.Token, true)
		context.AfterFunc(ctx, func() { w.cfg.OnLease(p, lease.Token, false) })
	}
	return nil
}

// redeliver resets partition p's consumer to its acknowledgement floor.
func (w *Worker) redeliver(ctx context.Context, p int) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := w.log.JetStream().ResetConsumer(rctx, recovery.Stream, recovery.ConsumerName(p)); err != nil && rctx.Err() == nil {
		w.l.Debug().Err(err).Int("partition", p).Msg("reset to the acknowledgement floor")
	}
}

// release stops consuming partition p. Let go (not fenced): the command in
// progress finishes, then the pin is lifted so the next holder receives
// the partition at once. Fenced (the lease ended on its own): it stops at
// once; the command in progress was cancelled with the lease, is not
// acknowledged, and the pin is left alone (another worker may hold the
// partition already).
func (w *Worker) release(ctx context.Context, p int, fenced bool) {
	w.mu.Lock()
	cc, ok := w.ccs[p]
	delete(w.ccs, p)
	w.mu.Unlock()
	if !ok {
		return
	}
	if fenced {
		cc.Stop()
	} else {
		cc.Drain()
	}
	select {
	case <-cc.Closed():
	case <-ctx.Done():
		cc.Stop()
	}
	if fenced {
		return
	}
	uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := pgroup.Unpin(uctx, w.log.JetStream(), recovery.Stream, recovery.ConsumerName(p), recovery.PriorityGroup); err != nil {
		w.l.Debug().Err(err).Int("partition", p).Msg("unpin")
	}
}

// Rebalances is how many times the worker's set of partitions changed.
func (w *Worker) Rebalances() int {
	if w.member == nil {
		return 0
	}
	return w.member.Rebalances()
}

// Partitions returns the partitions the worker consumes now.
func (w *Worker) Partitions() []int {
	if w.member == nil {
		return nil
	}
	return w.member.Owned()
}

func (w *Worker) stop() {
	w.mu.Lock()
	for p, cc := range w.ccs {
		cc.Stop()
		delete(w.ccs, p)
	}
	w.mu.Unlock()
	if w.follower != nil {
		w.follower.Stop()
	}
	if w.notice != nil {
		_ = w.notice.Unsubscribe()
	}
	if w.cancel != nil {
		w.cancel()
	}
}

// Close leaves the workers' group: the command in progress on each
// partition finishes (or ctx ends) and the partitions move to the other
// workers at once. A command cut short is redelivered to another worker
// after the consumer's AckWait.
func (w *Worker) Close(ctx context.Context) error {
	var err error
	if w.member != nil {
		err = w.member.Leave(ctx)
	}
	done := make(chan struct{})
	go func() {
		w.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		w.stop()
		return err
	case <-ctx.Done():
		w.stop()
		return fmt.Errorf("close worker: %w", ctx.Err())
	}
}

// handle runs one delivered command to its end: ack when its outcome is
// recorded (or it was already), park it after its last delivery, or nak it
// for a later redelivery when the log or JetStream failed.
func (w *Worker) handle(lease context.Context, msg jetstream.Msg) {
	w.wg.Add(1)
	defer w.wg.Done()
	if lease.Err() != nil {
		return // fenced: not run, not acknowledged; the next holder has it
	}
	ctx := lease
	start := time.Now()
	kind, ended := "unknown", "redeliver"
	defer func() {
		if w.cfg.OnCommand != nil {
			w.cfg.OnCommand(kind, ended, time.Since(start))
		}
	}()
	meta, err := msg.Metadata()
	if err != nil {
		_ = msg.Term()
		return
	}
	var cmd recovery.Command
	if err = json.Unmarshal(msg.Data(), &cmd); err == nil {
		err = cmd.Validate()
	} else {
		err = fmt.Errorf("%w: %v", recovery.ErrInvalidCommand, err)
	}
	if cmd.Kind != "" {
		kind = string(cmd.Kind)
	}
	// Erasure: every write this command makes is refused if an erase of
	// its session begins from now on (the state it is decided from is
	// read after this point).
	ctx = withEpoch(ctx, w.gate.Epoch())
	if w.gate.Blocked(cmd.Tenant, cmd.Session) {
		// Being erased: the command goes with its session, unless the
		// erase is given up; then it comes again.
		ended = "erasing"
		_ = msg.NakWithDelay(time.Second)
		return
	}
	if w.gate.SkipCommand(cmd.Tenant, cmd.Session, meta.Sequence.Stream) {
		ended = "erased"
		_ = msg.Term()
		return
	}
	if err != nil {
		ended = "invalid"
		w.l.Error().Str("error", shorten(err.Error(), maxLoggedError)).Uint64("seq", meta.Sequence.Stream).Msg("command refused")
		if events.ValidToken(cmd.Tenant) && events.ValidToken(cmd.Session) && cmd.ID != "" {
			if cmd.Kind == "" {
				cmd.Kind = "unknown"
			}
			_ = w.park(ctx, cmd, meta, "invalid command: "+err.Error())
		}
		_ = msg.TermWithReason("invalid command")
		return
	}
	delivery := w.deliveryOf(meta.Consumer)
	stop := keepAlive(msg, delivery.AckWait)
	outcome, err := w.execute(ctx, cmd, meta)
	stop()
	if lease.Err() != nil {
		// The lease ended while it ran: the partition may be another
		// worker's now; it runs the command again (idempotent) and
		// acknowledges it.
		ended = "fenced"
		return
	}
	if err == nil {
		ended = outcome
		if err := msg.DoubleAck(ctx); err != nil {
			w.l.Warn().Err(err).Str("command", cmd.ID).Msg("ack lost; the command will be redelivered and found done")
		}
		return
	}
	if errors.Is(err, erasure.ErrErasing) {
		// Its session is being erased (it comes again if the erase is
		// given up) or was erased since it started (moot).
		if w.gate.Blocked(cmd.Tenant, cmd.Session) {
			ended = "erasing"
			_ = msg.NakWithDelay(time.Second)
			return
		}
		ended = "erased"
		_ = msg.TermWithReason("session erased")
		return
	}
	// A refusal (too large, invalid) comes back the same on every
	// delivery: park it at once, for its session only.
	if refused := recovery.Refused(err); refused || int(meta.NumDelivered) >= delivery.MaxDeliver {
		reason := fmt.Sprintf("failed on all %d deliveries: %v", meta.NumDelivered, err)
		if refused {
			reason = fmt.Sprintf("refused: %v", err)
		}
		if perr := w.park(ctx, cmd, meta, reason); perr != nil {
			if recovery.Refused(perr) {
				// Not even the park can be written: drop the command, once.
				w.l.Error().Str("error", shorten(perr.Error(), maxLoggedError)).Str("command", cmd.ID).Msg("park refused; the command is dropped")
				ended = "parked"
				_ = msg.TermWithReason("refused")
				return
			}
			w.l.Error().Err(perr).Str("command", cmd.ID).Msg("park failed; leaving the command for redelivery")
			_ = msg.NakWithDelay(delivery.AckWait)
			return
		}
		ended = "parked"
		_ = msg.Term()
		return
	}
	delay := time.Duration(meta.NumDelivered) * time.Second
	w.l.Warn().Err(err).Str("command", cmd.ID).Uint64("delivery", meta.NumDelivered).Dur("retry_in", delay).Msg("command failed; will be redelivered")
	_ = msg.NakWithDelay(delay)
}

// deliveryOf is the delivery settings of the consumer named consumer, as
// the worker last read them.
func (w *Worker) deliveryOf(consumer string) recovery.DeliveryConfig {
	if d, ok := w.delivery.Load(consumer); ok {
		return d.(recovery.DeliveryConfig)
	}
	return w.cfg.Delivery
}

// keepAlive tells JetStream the command is still being worked on, every
// third of ackWait, until the returned stop is called.
func keepAlive(msg jetstream.Msg, ackWait time.Duration) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(ackWait / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	}()
	return func() { close(done) }
}

// commandsAllowedWhilePaused may run on a paused session; the others are
// parked until it is resumed.
func allowedWhilePaused(k recovery.Kind) bool {
	switch k {
	case recovery.KindResumeSession, recovery.KindAbortSession, recovery.KindPauseSession, recovery.KindRepairOrphans, recovery.KindAbandonTurn, recovery.KindRewindSession, recovery.KindForkSession:
		return true
	}
	return false
}

// execute brings the command to a recorded outcome. It returns an error
// only when the outcome could not be recorded (the log or JetStream
// failed): then the command is delivered again and finds the state as it
// left it.
func (w *Worker) execute(ctx context.Context, cmd recovery.Command, meta *jetstream.MsgMetadata) (string, error) {
	for try := 0; ; try++ {
		state, err := w.restore(ctx, cmd.Tenant, cmd.Session)
		if err != nil {
			return "", err
		}
		if rec := state.Command(cmd.ID); rec != nil && state.CommandDone(cmd.ID) {
			w.l.Info().Str("command", cmd.ID).Msg("already done; skipped")
			return "skipped", w.setStatus(ctx, cmd, meta, recovery.StateCompleted, rec.Outcome, rec.Attempts, "")
		}
		if state.Paused && !allowedWhilePaused(cmd.Kind) {
			return "parked", w.park(ctx, cmd, meta, "session paused: "+state.PauseReason)
		}
		_ = w.setStatus(ctx, cmd, meta, recovery.StateRunning, "", 0, "")
		var run effect
		switch {
		case cmd.Kind == recovery.KindForkSession:
			run = w.forkEffect
		case cmd.Kind.NeedsRuntime() || cmd.Kind == recovery.KindResumeSession || cmd.Kind == recovery.KindAbandonTurn || cmd.Kind == recovery.KindAbortSession:
			run = w.runtimeEffect
		default:
			run = w.logEffect
		}
		outcome, attempts, err := run(ctx, cmd, state)
		if errors.Is(err, events.ErrConflict) && try < w.cfg.ConflictRetries {
			continue // the session moved on: read it again and decide again
		}
		if err != nil {
			return "", err
		}
		return string(outcome), w.setStatus(ctx, cmd, meta, recovery.StateCompleted, outcome, attempts, "")
	}
}

type effect func(ctx context.Context, cmd recovery.Command, state *projections.Session) (outcome events.Outcome, attempts int, err error)

func (w *Worker) restore(ctx context.Context, tenant, session string) (*projections.Session, error) {
	s, err := projections.Restore(ctx, w.log, w.store, tenant, session)
	if errors.Is(err, events.ErrSessionNotFound) {
		return &projections.Session{Tenant: tenant, Session: session}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read session %s/%s: %w", tenant, session, err)
	}
	return s, nil
}

// event builds an event the worker writes for cmd, with an id derived from
// the command id and key, so a repeat of the same step is stored once.
func (w *Worker) event(cmd recovery.Command, session, turn, key string, p events.Payload) events.Event {
	at := cmd.IssuedAt
	if at.IsZero() {
		at = time.Unix(0, 0)
	}
	ev, _ := events.NewAt(time.Now().UTC(), events.DeterministicID(at, cmd.ID+"/"+session+"/"+key), cmd.Tenant, session, turn, p)
	ev.Source = "urn:turnstone:worker:" + w.cfg.Name
	return ev
}

func (w *Worker) attempted(cmd recovery.Command, n int, strategy string, result events.AttemptResult, class string, e *events.ErrorInfo, d time.Duration) events.Event {
	return w.event(cmd, cmd.Session, "", fmt.Sprintf("attempt/%d", n), &events.RecoveryAttempted{
		CommandID: cmd.ID, Kind: string(cmd.Kind), Attempt: n, Strategy: strategy, Worker: w.cfg.Name,
		Result: result, Class: class, Error: e, DurationMS: d.Milliseconds(),
	})
}

func (w *Worker) completed(cmd recovery.Command, outcome events.Outcome, strategy string, attempts int, detail string) events.Event {
	return w.event(cmd, cmd.Session, "", "completed", &events.RecoveryCompleted{
		CommandID: cmd.ID, Kind: string(cmd.Kind), Outcome: outcome, Strategy: strategy, Attempts: attempts, Detail: events.MaskString(detail),
	})
}

// park sets the command aside: recovery.parked in the session's log, the
// session paused (so nothing of it runs out of order after the gap), and
// the status bucket updated.
func (w *Worker) park(ctx context.Context, cmd recovery.Command, meta *jetstream.MsgMetadata, reason string) error {
	reason = events.MaskString(shorten(reason, maxParkReason))
	state, err := w.restore(ctx, cmd.Tenant, cmd.Session)
	if err != nil {
		return err
	}
	evs := []events.Event{w.event(cmd, cmd.Session, "", "parked", &events.RecoveryParked{
		CommandID: cmd.ID, Kind: string(cmd.Kind), Reason: reason, Deliveries: int(meta.NumDelivered),
	})}
	if !state.Paused {
		evs = append(evs, w.event(cmd, cmd.Session, "", "parked/pause", &events.SessionPaused{
			Reason: fmt.Sprintf("command %s (%s) parked: %s", cmd.ID, cmd.Kind, reason),
			Cause:  events.CauseParked, CommandID: cmd.ID, Kind: string(cmd.Kind),
		}))
	}
	// One atomic batch: a worker that died between the two would leave a
	// parked command's session running. Its ids are the command's, so a
	// delivery before this one may have stored the park alone (the
	// session was paused then): the batch is refused for that id, and the
	// events go one by one, the stored one answered as a duplicate.
	_, err = w.append(ctx, evs, events.Atomic())
	if errors.Is(err, events.ErrDuplicateID) {
		_, err = w.append(ctx, evs)
	}
	if err != nil {
		return fmt.Errorf("park %s: %w", cmd.ID, err)
	}
	w.l.Warn().Str("command", cmd.ID).Str("session", cmd.Tenant+"/"+cmd.Session).Str("reason", reason).Msg("command parked; session paused")
	return w.setStatus(ctx, cmd, meta, recovery.StateParked, "", 0, reason)
}

func (w *Worker) setStatus(ctx context.Context, cmd recovery.Command, meta *jetstream.MsgMetadata, state recovery.State, outcome events.Outcome, attempts int, reason string) error {
	if w.kv == nil {
		return nil
	}
	st := recovery.Status{ID: cmd.ID, Kind: cmd.Kind, Tenant: cmd.Tenant, Session: cmd.Session, State: state, Outcome: outcome,
		Attempts: attempts, Worker: w.cfg.Name, Reason: reason, UpdatedAt: time.Now().UTC()}
	if meta != nil {
		st.Seq = meta.Sequence.Stream
	}
	b, err := json.Marshal(st, json.Deterministic(true))
	if err != nil {
		return fmt.Errorf("status of %s: %w", cmd.ID, err)
	}
	if !w.gate.Enter(cmd.Tenant, cmd.Session, epochOf(ctx)) {
		return fmt.Errorf("status of %s: %w", cmd.ID, erasure.ErrErasing)
	}
	defer w.gate.Leave(cmd.Tenant, cmd.Session)
	if _, err := w.kv.Put(ctx, cmd.ID, b); err != nil {
		return fmt.Errorf("status of %s: %w", cmd.ID, err)
	}
	return nil
}

// append appends evs as the log does, through the erasure gate: nothing
// is written for a session being erased, or erased since the command's
// handling began (the epoch in ctx); the error then wraps
// erasure.ErrErasing.
func (w *Worker) append(ctx context.Context, evs []events.Event, opts ...events.AppendOption) ([]events.Ack, error) {
	since := epochOf(ctx)
	var entered [][2]string
	defer func() {
		for _, k := range entered {
			w.gate.Leave(k[0], k[1])
		}
	}()
	for _, ev := range evs {
		k := [2]string{ev.Tenant, ev.Session}
		if slices.Contains(entered, k) {
			continue
		}
		if !w.gate.Enter(ev.Tenant, ev.Session, since) {
			return nil, fmt.Errorf("append to %s/%s: %w", ev.Tenant, ev.Session, erasure.ErrErasing)
		}
		entered = append(entered, k)
	}
	return w.log.Append(ctx, evs, opts...)
}

type epochKey struct{}

// withEpoch carries the erasure gate's epoch at the start of a command's
// handling to the writes it makes.
func withEpoch(ctx context.Context, epoch uint64) context.Context {
	return context.WithValue(ctx, epochKey{}, epoch)
}

// epochOf is the epoch withEpoch put in ctx; 0 when none (then any erase
// that ever began refuses the write: safe).
func epochOf(ctx context.Context) uint64 {
	e, _ := ctx.Value(epochKey{}).(uint64)
	return e
}

// Gate is the worker's erasure gate (package erasure).
func (w *Worker) Gate() *erasure.Gate { return w.gate }

// Bounds of what the worker writes about a command it cannot run: the
// reason of a park (in recovery.parked, session.paused, the status
// bucket) and an error in its log, in bytes.
const (
	maxParkReason  = 1 << 10
	maxLoggedError = 1 << 10
)

// shorten returns s cut to at most n bytes, at a character boundary, with
// "…" (and how many bytes were cut) when it cut.
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return fmt.Sprintf("%s… (%d more bytes)", s[:i], len(s)-i)
}

// recordBreaker appends a breaker's change of state to its tenant's
// events.BreakersSession log.
func (w *Worker) recordBreaker(c BreakerChange) {
	at := c.At
	if at.IsZero() {
		at = time.Now().UTC()
	}
	id := events.DeterministicID(at, fmt.Sprintf("%s/%s/%s/%s->%s/%d", w.cfg.Name, c.Tenant, c.Provider, c.From, c.To, at.UnixNano()))
	ev, err := events.NewAt(at, id, c.Tenant, events.BreakersSession, "", c.Event())
	if err == nil {
		ev.Source = "urn:turnstone:worker:" + w.cfg.Name
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = w.append(withEpoch(ctx, w.gate.Epoch()), []events.Event{ev})
	}
	if err != nil {
		w.l.Warn().Err(err).Str("provider", c.Provider).Msg("breaker change not recorded")
		return
	}
	w.l.Warn().Str("tenant", c.Tenant).Str("provider", c.Provider).Str("from", string(c.From)).Str("to", string(c.To)).Msg("circuit breaker changed")
}

// mirrorBreaker applies a breaker change recorded by any worker.
func (w *Worker) mirrorBreaker(ev events.Event) {
	if ev.Err != nil || ev.Type != events.TypeBreakerChanged {
		return
	}
	p, err := ev.Payload()
	if err != nil {
		return
	}
	_ = w.breakers.Apply(ChangeFromEvent(ev.Tenant, ev.Time, p.(*events.BreakerChanged)))
}

// Breakers is the worker's registry of circuit breakers.
func (w *Worker) Breakers() *Breakers { return w.breakers }
