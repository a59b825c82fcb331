// Package reconciler is the engine's control loop: it compares each
// session's projected state with the invariants and deadlines of
// docs/design.md, and issues recovery commands (idempotent ids) or answers
// (distillation.skipped). It decides; the recovery workers execute.
//
// It hangs off the projector (its OnApply calls Observe), so every event
// is judged as it is folded; a ticker catches deadlines that pass while
// nothing happens; and when the engine takes a partition it scans the
// partition's sessions (Scan), so turns and requests left in flight by a
// crash or a dead engine are resolved without waiting for new events. When the log cannot be written it fails closed: it stops issuing,
// says why (logs, Healthy, metrics), keeps what it could not do, and
// carries on once the log is writable again. When one action is refused
// (too large, invalid: recovery.Refused), that is its session's matter
// alone: the action is parked in the session's log with its reason, the
// session is paused (cause parked), and every other session is served as
// before.
package reconciler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/clock"
	"github.com/turnstone-dev/turnstone/internal/erasure"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// Config configures a Reconciler.
type Config struct {
	// Policy is what it enforces (nil: DefaultPolicy).
	Policy *Policy
	// Clock is its time source (nil: clock.SystemClock); tests drive
	// deadlines with a clock.FakeClock.
	Clock clock.Clock
	// Tick is how often it checks deadlines and pending requests, and
	// retries what it could not do while failed closed. Default 1 second.
	Tick time.Duration
	// QueueSize bounds the actions waiting to be carried out. Default 4096.
	QueueSize int
	// MaxCommandBytes bounds the JSON body of a command it issues; a larger
	// one is refused (events.ErrTooLarge) and parked for its session.
	// Default (and at most) recovery.MaxCommandBytes.
	MaxCommandBytes int
	// OnIssue, when set, is called with each command issued (metrics).
	OnIssue func(recovery.Command)
	// OnFailClosed, when set, is called when the reconciler fails closed
	// (err set) or opens again (err nil).
	OnFailClosed func(err error)
	// OnTick, when set, is called at the end of each tick (every Tick: the
	// pass over due deadlines, pending requests and rescans), whether it
	// failed closed or not: a sign that the control loop is alive
	// (metrics).
	OnTick func()
	// Presence tells which runtimes are present (nil: none is ever
	// present; sessions are live by the live horizon only). A
	// *presence.Tracker implements it.
	Presence Presence
	// Owns, when set, says whether the engine may act on partition p now
	// (it holds p's lease: package pgroup). An action of a session in a
	// partition the engine does not hold when the action's turn to be
	// carried out comes is dropped, not carried out: the partition's
	// holder decides for it (issue 21: at most one owner acts on a
	// partition). Nil: every partition is the engine's.
	Owns func(p int) bool
	// Gate, when set, is the engine's erasure gate: an action is carried
	// out only if no erase of its session began since the state it was
	// decided from was read, and Forget drops what the reconciler holds
	// of erased sessions (package erasure).
	Gate *erasure.Gate
	// ActivityEvery is how often, at most, the activity of a subagent
	// session is written for its parent's engine (ActivityBucket): a sign
	// of life of the parent's turn no older than this. Default 1 second.
	ActivityEvery time.Duration
	// MaxRecheck is how many events of a session the reconciler folds,
	// before it carries out an action, to bring the state the action was
	// decided from up to the session's log; past it the action is
	// dropped as decided on stale state, and the session is judged again
	// once its projection has caught up. Default 1000.
	MaxRecheck int
}

// Presence is what the reconciler asks of the runtimes' presence:
// whether a runtime serving a session is present, and to keep an eye on a
// tenant whose session waits for its runtime. *presence.Tracker
// implements it.
type Presence interface {
	// Present reports whether a runtime serving the session is present.
	Present(tenant, session string) bool
	// AnsweredAt is when the latest presence ping that a runtime serving
	// the session answered was sent (zero when none is present).
	AnsweredAt(tenant, session string) time.Time
	// Claimed is when a present runtime last claimed, in its answer to a
	// presence ping, that it works on the turn (zero when none did
	// lately): a sign of life of the turn.
	Claimed(tenant, session, turn string) time.Time
	// Watch keeps an eye on a tenant whose session waits for its runtime.
	Watch(tenant string)
}

func (c *Config) setDefaults() {
	if c.Policy == nil {
		c.Policy = DefaultPolicy()
	}
	if c.Clock == nil {
		c.Clock = clock.SystemClock
	}
	if c.Tick == 0 {
		c.Tick = time.Second
	}
	if c.QueueSize == 0 {
		c.QueueSize = 4096
	}
	if c.MaxCommandBytes <= 0 || c.MaxCommandBytes > recovery.MaxCommandBytes {
		c.MaxCommandBytes = recovery.MaxCommandBytes
	}
	if c.ActivityEvery <= 0 {
		c.ActivityEvery = time.Second
	}
	if c.MaxRecheck <= 0 {
		c.MaxRecheck = 1000
	}
}

// Reconciler is the control loop. Create it with New, have the
// projector's OnApply call Observe, then Open; Close stops it.
type Reconciler struct {
	log  *events.Log
	js   jetstream.JetStream
	proj *projections.Projector
	cfg  Config
	l    zerolog.Logger

	mu        sync.Mutex
	done      map[string]bool                 // action keys carried out (or dropped as done)
	queued    map[string]bool                 // action keys waiting
	watch     map[string]time.Time            // sessions with turns in flight or pending requests: key -> since
	reqSeen   map[string]time.Time            // "<session key>/<requested seq>" -> first seen
	turnSeen  map[string]map[string]time.Time // session key -> turn in flight -> first seen in flight
	failWrite bool                            // failErr came from a write, not the probe
	probeKV   jetstream.KeyValue
	actKV     jetstream.KeyValue       // ActivityBucket (nil: none)
	written   map[string]activityWrite // activity key -> what was written of it, and what waits
	behind    map[string]uint64        // session key -> the log's last sequence its state must reach to be judged
	due       map[string]time.Time     // watched session key -> when time alone may next change its judgement
	staleN    uint64                   // actions dropped as decided on stale state
	failErr   error
	rescan    []int // partitions whose scan is to be done again
	queue     chan queued
	order     uint64      // actions enqueued so far
	forgotten []forgotten // erased scopes whose queued actions are dropped
	runCtx    context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
}

// queued is an action waiting to be carried out: the gate's epoch before
// the state it was decided from was read, and its place in the queue.
type queued struct {
	Action
	since, order uint64
}

// forgotten is an erased scope: the actions of its sessions queued up to
// order are dropped.
type forgotten struct {
	scope erasure.Scope
	order uint64
}

// New returns a reconciler over log that reads session states from proj.
// logger may be nil.
func New(log *events.Log, proj *projections.Projector, cfg Config, logger *zerolog.Logger) *Reconciler {
	cfg.setDefaults()
	r := &Reconciler{
		log: log, js: log.JetStream(), proj: proj, cfg: cfg, l: zerolog.Nop(),
		done: map[string]bool{}, queued: map[string]bool{}, watch: map[string]time.Time{}, reqSeen: map[string]time.Time{}, turnSeen: map[string]map[string]time.Time{},
		written: map[string]activityWrite{}, behind: map[string]uint64{}, due: map[string]time.Time{},
		queue: make(chan queued, cfg.QueueSize),
	}
	if logger != nil {
		r.l = logger.With().Str("component", "reconciler").Logger()
	}
	return r
}

// Observe judges the session whose event the projector just folded; it is
// the projector's OnApply (projections.ProjectorConfig). It is judged even
// when the fold did not apply the event (the first event of a session the
// projector restores is already in the restored state): judging is
// idempotent. Safe for concurrent use.
func (r *Reconciler) Observe(s *projections.Session, ev events.Event, _ bool, _ []projections.Violation) {
	// The projector holds the gate while it folds and calls Observe, so
	// an erase that begins now waits for this judgement, and Forget then
	// drops what it queued.
	r.noteActivity(s, ev)
	r.judge(s, r.cfg.Gate.Epoch())
}

// Forget drops what the reconciler holds of the sessions of scope (an
// erase began or ended: package erasure): their watches, the turns and
// requests it saw, and the actions queued for them, which are dropped
// when their turn comes.
func (r *Reconciler) Forget(scope erasure.Scope) {
	r.mu.Lock()
	defer r.mu.Unlock()
	covered := func(k string) bool {
		parts := strings.SplitN(k, "/", 3)
		return len(parts) >= 2 && scope.Covers(parts[0], parts[1])
	}
	for k := range r.watch {
		if covered(k) {
			delete(r.watch, k)
			delete(r.due, k)
		}
	}
	for k := range r.turnSeen {
		if covered(k) {
			delete(r.turnSeen, k)
		}
	}
	for k := range r.reqSeen {
		if covered(k) {
			delete(r.reqSeen, k)
		}
	}
	r.forgotten = append(r.forgotten, forgotten{scope: scope, order: r.order})
}

// dropped reports whether q belongs to a scope forgotten after it was
// queued, and forgets the scopes no queued action can belong to any more
// (the queue is in order).
func (r *Reconciler) dropped(q queued) bool {
	tenant, session := actionSession(q.Action)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forgotten = slices.DeleteFunc(r.forgotten, func(f forgotten) bool { return f.order < q.order })
	for _, f := range r.forgotten {
		if q.order <= f.order && f.scope.Covers(tenant, session) {
			return true
		}
	}
	return false
}

// owned reports whether the engine holds the partition of a's session
// now (Config.Owns).
func (r *Reconciler) owned(a Action) bool {
	if r.cfg.Owns == nil {
		return true
	}
	tenant, session := actionSession(a)
	if tenant == "" {
		return true
	}
	return r.cfg.Owns(events.Partition(tenant, session, r.log.Partitions()))
}

// actionSession is the session an action writes to.
func actionSession(a Action) (tenant, session string) {
	switch {
	case a.Command != nil:
		return a.Command.Tenant, a.Command.Session
	case len(a.Events) > 0:
		return a.Events[0].Tenant, a.Events[0].Session
	}
	return "", ""
}

// Open starts the loop on goroutines the reconciler owns until Close. The
// recovery stream and the probe bucket must exist (recovery.Setup and
// EnsureProbeBucket, run by the engine's setup); without the bucket the
// write probe is skipped.
func (r *Reconciler) Open(ctx context.Context) error {
	if kv, err := r.js.KeyValue(ctx, ProbeBucket); err == nil {
		r.probeKV = kv
	} else if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return fmt.Errorf("open reconciler: bucket %s: %w", ProbeBucket, err)
	}
	if kv, err := r.js.KeyValue(ctx, ActivityBucket); err == nil {
		r.actKV = kv
	} else if errors.Is(err, jetstream.ErrBucketNotFound) {
		r.l.Warn().Msg("bucket " + ActivityBucket + " does not exist (run engine setup): a subagent's activity is no sign of life of its parent's turn")
	} else {
		return fmt.Errorf("open reconciler: bucket %s: %w", ActivityBucket, err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	r.runCtx, r.cancel = runCtx, cancel
	r.wg.Add(2)
	go r.executeLoop(runCtx)
	go r.tickLoop(runCtx)
	return nil
}

// EnsureProbeBucket creates or updates the key-value bucket the reconciler
// writes to each tick (file storage, one small value, replicas replicas).
func EnsureProbeBucket(ctx context.Context, js jetstream.JetStream, replicas int) error {
	if replicas < 1 {
		replicas = 1
	}
	_, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: ProbeBucket, Description: "Turnstone reconciler write probe", History: 1,
		Storage: jetstream.FileStorage, Replicas: replicas, MaxBytes: 1 << 20,
	})
	if err != nil {
		return fmt.Errorf("bucket %s: %w", ProbeBucket, err)
	}
	return nil
}

// Scan judges every session of the given partitions once, restored from
// its snapshot and tail (restart recovery: turns and requests left in
// flight by a crash or by a dead engine). With restart set, the policy's
// restart rule applies to the turns found in flight. A scan that fails is
// retried on the ticks that follow.
func (r *Reconciler) Scan(ctx context.Context, partitions []int, restart bool) error {
	if err := r.scan(ctx, partitions, restart); err != nil {
		r.l.Warn().Err(err).Ints("partitions", partitions).Msg("scan incomplete; it is retried")
		r.mu.Lock()
		r.rescan = mergePartitions(r.rescan, partitions)
		r.mu.Unlock()
		return err
	}
	return nil
}

// Release forgets what the reconciler watches in partition p (another
// engine owns it now).
func (r *Reconciler) Release(p int) {
	parts := r.log.Partitions()
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range r.watch {
		tenant, session, _ := strings.Cut(k, "/")
		if events.Partition(tenant, session, parts) == p {
			delete(r.watch, k)
			delete(r.due, k)
		}
	}
	r.rescan = slices.DeleteFunc(r.rescan, func(x int) bool { return x == p })
}

// mergePartitions adds the partitions of more to have that it does not
// hold yet, and returns them sorted.
func mergePartitions(have, more []int) []int {
	out := slices.Clone(have)
	for _, p := range more {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// Close stops the loop and waits for it, or for ctx to end.
func (r *Reconciler) Close(ctx context.Context) error {
	if r.cancel != nil {
		r.cancel()
	}
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close reconciler: %w", ctx.Err())
	}
}

// Healthy returns nil, or why the reconciler has failed closed.
func (r *Reconciler) Healthy() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failErr
}

// maxRemembered bounds the keys of actions done and of requests seen the
// reconciler remembers.
const maxRemembered = 100000

func key(tenant, session string) string { return tenant + "/" + session }

// judge decides for one session and queues what is new. It runs on the
// projector's goroutine (or the tick's, with a copy of the state). since
// is the erasure gate's epoch before s was read.
func (r *Reconciler) judge(s *projections.Session, since uint64) {
	if s == nil || s.Session == "" || strings.HasPrefix(s.Session, "_") {
		return
	}
	k := key(s.Tenant, s.Session)
	now := r.cfg.Clock.Now()
	waiting := s.Paused && s.PauseCause == events.CauseRuntimeUnavailable && !s.History
	if waiting && r.cfg.Presence != nil {
		r.cfg.Presence.Watch(s.Tenant)
	}
	r.mu.Lock()
	if len(s.InFlight) > 0 || s.PendingDistillation() != nil || waiting {
		if _, ok := r.watch[k]; !ok {
			r.watch[k] = now
		}
	} else {
		delete(r.watch, k)
	}
	// The turns in flight, each from when it was first seen in flight;
	// a turn that ended is forgotten, and so is a session with none (an
	// idle session costs the reconciler nothing).
	if len(s.InFlight) == 0 {
		delete(r.turnSeen, k)
	} else {
		seen := r.turnSeen[k]
		if seen == nil {
			if len(r.turnSeen) >= maxRemembered {
				clear(r.turnSeen) // at worst a turn's deadline starts again
			}
			seen = make(map[string]time.Time, len(s.InFlight))
			r.turnSeen[k] = seen
		}
		for id := range seen {
			if !slices.Contains(s.InFlight, id) {
				delete(seen, id)
			}
		}
		for _, id := range s.InFlight {
			if _, ok := seen[id]; !ok {
				seen[id] = now
			}
		}
	}
	if d := s.PendingDistillation(); d != nil {
		rk := fmt.Sprintf("%s/%d", k, d.RequestedSeq)
		if _, ok := r.reqSeen[rk]; !ok {
			if len(r.reqSeen) >= maxRemembered {
				clear(r.reqSeen) // at worst a request waits its grace again
			}
			r.reqSeen[rk] = now
		}
	}
	// Never act on stale state: a session whose state was found behind
	// its log (an action decided from it was dropped, see current) is
	// judged again only once its state has caught up.
	if b, ok := r.behind[k]; ok {
		if s.LastSeq < b {
			r.mu.Unlock()
			return
		}
		delete(r.behind, k)
	}
	r.mu.Unlock()
	actions, due := r.decide(r.runContext(), s, now)
	r.mu.Lock()
	// A session waiting for its runtime is judged at every tick: its
	// runtime may come back at any time.
	if _, watched := r.watch[k]; watched && !due.IsZero() && !waiting {
		r.due[k] = due
	} else {
		delete(r.due, k)
	}
	r.mu.Unlock()
	r.enqueue(actions, since)
}

// runContext is the reconciler's run context, or a background one
// before Open.
func (r *Reconciler) runContext() context.Context {
	if r.runCtx != nil {
		return r.runCtx
	}
	return context.Background()
}

// decide runs Decide on s at now with what the reconciler knows beside
// the state: presence, when it first saw each turn and request, and, for
// a turn that would be abandoned, the signs of life the state does not
// carry (a runtime's claim, a subagent session's activity), read only
// then. It also returns when time alone may next change the decision
// (NextDue; zero: nothing waits on time).
func (r *Reconciler) decide(ctx context.Context, s *projections.Session, now time.Time) ([]Action, time.Time) {
	k := key(s.Tenant, s.Session)
	policy := r.cfg.Policy.For(s.Tenant)
	present := r.cfg.Presence != nil && r.cfg.Presence.Present(s.Tenant, s.Session)
	in := Input{
		State: s, Now: now, Policy: policy, Live: Live(s, now, policy, present), RuntimePresent: present,
		RequestSeenAt: func(seq uint64) time.Time {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.reqSeen[fmt.Sprintf("%s/%d", k, seq)]
		},
		TurnSeenAt: func(turn string) time.Time {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.turnSeen[k][turn]
		},
	}
	if present {
		in.RuntimeAnsweredAt = r.cfg.Presence.AnsweredAt(s.Tenant, s.Session)
	}
	actions := Decide(in)
	var turns []string
	for _, a := range actions {
		if a.Command != nil && a.Command.Kind == recovery.KindAbandonTurn && a.Command.Turn != "" {
			turns = append(turns, a.Command.Turn)
		}
	}
	if len(turns) == 0 || in.RestartAbandon {
		return actions, NextDue(in)
	}
	in.Activity = r.signsOfLife(ctx, s, turns)
	if len(in.Activity) == 0 {
		return actions, NextDue(in)
	}
	return Decide(in), NextDue(in)
}

func (r *Reconciler) enqueue(actions []Action, since uint64) {
	for _, a := range actions {
		r.mu.Lock()
		dup := r.done[a.Key] || r.queued[a.Key]
		if !dup {
			r.queued[a.Key] = true
		}
		r.order++
		q := queued{Action: a, since: since, order: r.order}
		r.mu.Unlock()
		if dup {
			continue
		}
		r.queue <- q
	}
}

// scan judges the sessions of the partitions that may need the
// reconciler. It reads the fleet index (projections.ReadIndex) and
// restores only the sessions whose summary says something is open (turns
// in flight, a pending distillation, open orphans, a pause waiting for
// its runtime), so an engine with 100,000 idle sessions is ready in a
// moment; without an index it lists the log. At start (restart) the
// policy's restart rule applies to the turns found in flight.
func (r *Reconciler) scan(ctx context.Context, partitions []int, restart bool) error {
	// Each partition once: a read of the index with one filter twice is
	// refused (JetStream error 10136), and would be on every retry.
	partitions = mergePartitions(nil, partitions)
	if len(partitions) == 0 {
		return nil
	}
	type ref struct{ tenant, session string }
	var refs []ref
	sums, err := projections.ReadIndex(ctx, r.js, projections.IndexFilter{Partitions: partitions})
	switch {
	case err == nil:
		for _, m := range sums {
			if m.NeedsReconciler() {
				refs = append(refs, ref{m.Tenant, m.Session})
			}
		}
	case errors.Is(err, jetstream.ErrBucketNotFound):
		all, err := r.log.Sessions(ctx, "")
		if err != nil {
			return err
		}
		for _, x := range all {
			if slices.Contains(partitions, x.Partition) {
				refs = append(refs, ref{x.Tenant, x.Session})
			}
		}
	default:
		return err
	}
	r.l.Info().Ints("partitions", partitions).Int("sessions", len(refs)).Msg("scanning the sessions that may need the reconciler")
	for _, x := range refs {
		if strings.HasPrefix(x.session, "_") {
			continue
		}
		since := r.cfg.Gate.Epoch()
		s, err := r.state(ctx, x.tenant, x.session)
		if errors.Is(err, events.ErrSessionNotFound) {
			continue // erased since the index was read
		}
		if err != nil {
			return err
		}
		if restart && len(s.InFlight) > 0 {
			r.l.Info().Str("session", key(x.tenant, x.session)).Strs("turns", s.InFlight).
				Str("policy", r.cfg.Policy.For(x.tenant).Restart.InFlightTurns).Msg("turns in flight at start")
			if p := r.cfg.Policy.For(x.tenant); p.Restart.InFlightTurns == "abandon" {
				now := r.cfg.Clock.Now()
				present := r.cfg.Presence != nil && r.cfg.Presence.Present(s.Tenant, s.Session)
				r.enqueue(Decide(Input{State: s, Now: now, Policy: p, RestartAbandon: true, Live: Live(s, now, p, present), RuntimePresent: present}), since)
			}
		}
		r.judge(s, since)
	}
	return nil
}

// state returns the session's current state: the projector's copy, or the
// log's (snapshot and tail) when the projector does not hold it.
func (r *Reconciler) state(ctx context.Context, tenant, session string) (*projections.Session, error) {
	if r.proj != nil {
		if s, ok := r.proj.Session(tenant, session); ok {
			return s, nil
		}
	}
	store, err := projections.NewSnapshotStore(r.js, projections.SnapshotConfig{})
	if err != nil {
		return nil, err
	}
	return projections.Restore(ctx, r.log, store, tenant, session)
}

func (r *Reconciler) tickLoop(ctx context.Context) {
	defer r.wg.Done()
	for {
		t := r.cfg.Clock.NewTimer(r.cfg.Tick)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		r.tick(ctx)
		if r.cfg.OnTick != nil {
			r.cfg.OnTick()
		}
	}
}

// tick re-judges the sessions whose deadlines or pending requests may have
// come due, and rescans everything after a failure.
func (r *Reconciler) tick(ctx context.Context) {
	r.flushActivity()
	if err := r.probe(ctx); err != nil {
		r.failClosed(err, false)
		return
	}
	// A failed write clears when a write succeeds, or when the action it
	// failed on is otherwise done (executeLoop): then the probe.
	r.open(false)
	r.mu.Lock()
	var rescan []int
	if r.failErr == nil {
		rescan, r.rescan = r.rescan, nil
	}
	keys := make([]string, 0, len(r.watch))
	now := r.cfg.Clock.Now()
	for k := range r.watch {
		// A session whose next deadline is still to come is not judged
		// again before it (an event judges it meanwhile): a long
		// tool_deadline keeps many sessions watched for hours, and a
		// judgement copies the state.
		if due, ok := r.due[k]; ok && now.Before(due) {
			continue
		}
		keys = append(keys, k)
	}
	r.mu.Unlock()
	if len(rescan) > 0 {
		if err := r.scan(ctx, rescan, false); err != nil {
			r.l.Debug().Err(err).Ints("partitions", rescan).Msg("scan incomplete; it is retried")
			r.mu.Lock()
			r.rescan = mergePartitions(r.rescan, rescan)
			r.mu.Unlock()
		}
		// The watched sessions are judged too: a scan that keeps failing
		// (the index's stream electing a leader) must not hold back the
		// deadlines of the sessions already known.
	}
	for _, k := range keys {
		tenant, session, _ := strings.Cut(k, "/")
		since := r.cfg.Gate.Epoch()
		s, err := r.state(ctx, tenant, session)
		if errors.Is(err, events.ErrSessionNotFound) {
			// Erased: nothing to watch.
			r.mu.Lock()
			delete(r.watch, k)
			delete(r.due, k)
			r.mu.Unlock()
			continue
		}
		if err != nil {
			continue
		}
		r.judge(s, since)
	}
}

// probe checks that the log can be written: the events stream and the
// recovery stream (where commands go) answer and have room for another
// event or command (their MaxBytes, the account's storage). It returns
// why not, wrapping events.ErrLogUnavailable.
func (r *Reconciler) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := r.probeStream(ctx, events.EventsStream, int64(r.log.Config().MaxEventBytes)); err != nil {
		return err
	}
	if err := r.probeStream(ctx, recovery.Stream, int64(r.cfg.MaxCommandBytes)); err != nil {
		return err
	}
	acct, err := r.js.AccountInfo(ctx)
	if err != nil {
		return fmt.Errorf("%w: account info: %v", events.ErrLogUnavailable, err)
	}
	if max := acct.Limits.MaxStore; max > 0 && max-int64(acct.Store) < int64(r.log.Config().MaxEventBytes) {
		return fmt.Errorf("%w: JetStream storage is full: %d of %d bytes used", events.ErrLogUnavailable, acct.Store, max)
	}
	// A real write, for the limits no info shows (the server's own store).
	if r.probeKV != nil {
		if _, err := r.probeKV.Put(ctx, "reconciler", []byte(r.cfg.Clock.Now().UTC().Format(time.RFC3339Nano))); err != nil {
			return fmt.Errorf("%w: JetStream cannot store: %v", events.ErrLogUnavailable, err)
		}
	}
	return nil
}

// probeStream checks that stream name answers and has room for margin
// more bytes: under its MaxBytes when it discards new messages at the
// limit (one that discards old ones, or has no limit, always has room).
func (r *Reconciler) probeStream(ctx context.Context, name string, margin int64) error {
	st, err := r.js.Stream(ctx, name) // one info request; CachedInfo is its answer
	if err != nil {
		return fmt.Errorf("%w: stream %s: %v", events.ErrLogUnavailable, name, err)
	}
	info := st.CachedInfo()
	if max := info.Config.MaxBytes; info.Config.Discard == jetstream.DiscardNew && max > 0 && max-int64(info.State.Bytes) < margin {
		return fmt.Errorf("%w: stream %s is full: %d of %d bytes used", events.ErrLogUnavailable, name, info.State.Bytes, max)
	}
	return nil
}

// ProbeBucket is the key-value bucket the reconciler writes to each tick to
// learn that JetStream can still store: events.ProbeBucket.
const ProbeBucket = events.ProbeBucket

// executeLoop carries out queued actions one at a time, in order. When the
// log cannot be written it fails closed: the action is kept and retried
// every tick until it works. An action the log refuses (recovery.Refused:
// too large, invalid) is parked for its session (see park) and the loop
// goes on with the next: one session's refusal never holds the others.
func (r *Reconciler) executeLoop(ctx context.Context) {
	defer r.wg.Done()
	for {
		var q queued
		select {
		case <-ctx.Done():
			return
		case q = <-r.queue:
		}
		a := q.Action
		if r.dropped(q) || !r.owned(a) {
			r.forget(a.Key)
			continue
		}
		moot := false
		for {
			// Failed closed by the probe: issue nothing until it passes.
			// Failed by a write: retrying this action is the probe.
			r.mu.Lock()
			err, byWrite := r.failErr, r.failWrite
			r.mu.Unlock()
			if err == nil || byWrite {
				// The gate: nothing is written for a session being erased,
				// or erased since the state this action comes from was
				// read (the action is moot: dropped).
				tenant, session := actionSession(a)
				if !r.owned(a) {
					moot = true // the partition's lease ended meanwhile
					break
				}
				if !r.cfg.Gate.Enter(tenant, session, q.since) {
					moot = true
					break
				}
				// Never act on stale state: the session's log may hold
				// events the state this was decided from did not.
				var still bool
				if still, err = r.current(ctx, a); err == nil && !still {
					r.cfg.Gate.Leave(tenant, session)
					moot = true
					break
				}
				if err == nil {
					err = r.execute(ctx, a)
				}
				if recovery.Refused(err) {
					err = r.park(ctx, a, err)
				}
				r.cfg.Gate.Leave(tenant, session)
			}
			if err == nil || ctx.Err() != nil {
				break
			}
			if errors.Is(err, events.ErrConflict) {
				// The session moved on: drop the answer, not done (a
				// done key is never written again); the next judgement
				// decides again from the new state.
				moot = true
				break
			}
			r.failClosed(err, true)
			t := r.cfg.Clock.NewTimer(r.cfg.Tick)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C():
			}
		}
		if ctx.Err() == nil {
			// Failed closed by a write, this action was the write to
			// retry; it is done now (written, parked, dropped as moot or
			// on a conflict), so the probe decides again (next tick)
			// whether to open and rescan. Otherwise the reconciler would
			// stay closed, with its rescans held, until another action
			// came to be written (a parked one does not open it).
			r.mu.Lock()
			r.failWrite = false
			r.mu.Unlock()
		}
		if moot {
			// Not done: judging the session again (after an erase that
			// was given up, or once its state caught up with its log)
			// queues it again if it still holds.
			r.forget(a.Key)
			continue
		}
		r.mu.Lock()
		delete(r.queued, a.Key)
		if ctx.Err() == nil {
			if len(r.done) >= maxRemembered {
				// Forgetting is safe: a re-issued command has the same id,
				// so JetStream drops it within its duplicate window and a
				// worker skips it after (its outcome is in the log).
				clear(r.done)
			}
			r.done[a.Key] = true
		}
		r.mu.Unlock()
	}
}

// park sets aside an action the log refused (cause, a recovery.Refused
// error), for its session only: a recovery.parked naming the command (for
// a command) and a session.paused with cause parked (unless the session
// is paused already) in the session's log, each with the reason clipped
// to maxParkReason bytes, and one warning in the engine's log. The
// session then shows as paused in `sessions`, `inspect` and `incidents`,
// and a judgement of it issues the same command no more (the state
// records it parked), after a restart too. It returns nil once that is
// written, or when writing it is refused in its turn (logged; nothing more
// can be done for the action); the log's error when the log cannot be
// written (the caller fails closed and tries again).
func (r *Reconciler) park(ctx context.Context, a Action, cause error) error {
	var tenant, session, what, cmdID, kind string
	switch {
	case a.Command != nil:
		tenant, session, cmdID, kind = a.Command.Tenant, a.Command.Session, a.Command.ID, string(a.Command.Kind)
		what = fmt.Sprintf("command %s (%s)", cmdID, kind)
	case len(a.Events) > 0:
		tenant, session = a.Events[0].Tenant, a.Events[0].Session
		what = fmt.Sprintf("the reconciler's %s", a.Events[0].Type)
	default:
		return nil
	}
	reason := events.MaskString(clipBytes(fmt.Sprintf("refused: %v", cause), maxParkReason))
	r.l.Warn().Str("session", key(tenant, session)).Str("action", what).Str("reason", reason).
		Msg("action refused; parked for its session only, the other sessions carry on")
	at := time.Unix(0, 0).UTC() // the ids must not depend on when it is decided
	event := func(k string, p events.Payload) (events.Event, error) {
		ev, err := events.NewAt(r.cfg.Clock.Now().UTC(), events.DeterministicID(at, "reconciler/refused/"+a.Key+"/"+k), tenant, session, "", p)
		ev.Source = "urn:turnstone:reconciler"
		return ev, err
	}
	var evs []events.Event
	if a.Command != nil {
		ev, err := event("parked", &events.RecoveryParked{CommandID: cmdID, Kind: kind, Reason: reason})
		if err != nil {
			return nil
		}
		evs = append(evs, ev)
	}
	if s, err := r.state(ctx, tenant, session); err != nil && !errors.Is(err, events.ErrSessionNotFound) {
		return err
	} else if s == nil || !s.Paused {
		ev, err := event("pause", &events.SessionPaused{Reason: what + " " + reason, Cause: events.CauseParked, CommandID: cmdID, Kind: kind})
		if err != nil {
			return nil
		}
		evs = append(evs, ev)
	}
	if len(evs) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// One atomic batch: the park and the pause stand or fall together. Its
	// ids are the command's, so an earlier park may have stored the first
	// alone (the session was paused then): the batch is refused for that
	// id, and the events go one by one, the stored one a duplicate.
	_, err := r.log.Append(ctx, evs, events.Atomic())
	if errors.Is(err, events.ErrDuplicateID) {
		_, err = r.log.Append(ctx, evs)
	}
	if err != nil {
		if recovery.Refused(err) {
			r.l.Error().Str("session", key(tenant, session)).Str("error", clipBytes(err.Error(), maxParkReason)).Msg("the park of a refused action was refused too; the action is dropped")
			return nil
		}
		return fmt.Errorf("park %s: %w", what, err)
	}
	return nil
}

// maxParkReason bounds, in bytes, the reason park writes and logs.
const maxParkReason = 1 << 10

// clipBytes returns s cut to at most n bytes at a character boundary, with
// "…" and how many bytes were cut when it cut.
func clipBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return fmt.Sprintf("%s… (%d more bytes)", s[:i], len(s)-i)
}

func (r *Reconciler) forget(k string) {
	r.mu.Lock()
	delete(r.queued, k)
	r.mu.Unlock()
}

func (r *Reconciler) execute(ctx context.Context, a Action) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if a.Command != nil {
		if body, err := json.Marshal(a.Command); err == nil && len(body) > r.cfg.MaxCommandBytes {
			return fmt.Errorf("issue %s: %w: %d bytes encoded, the limit is %d", a.Command.ID, events.ErrTooLarge, len(body), r.cfg.MaxCommandBytes)
		}
		if _, dup, err := recovery.Issue(ctx, r.js, *a.Command); err != nil {
			return fmt.Errorf("issue %s: %w", a.Command.ID, err)
		} else if !dup {
			r.l.Info().Str("command", a.Command.ID).Str("session", key(a.Command.Tenant, a.Command.Session)).Msg(a.Why)
			if r.cfg.OnIssue != nil {
				r.cfg.OnIssue(*a.Command)
			}
		}
	} else if len(a.Events) > 0 {
		if _, err := r.log.Append(ctx, a.Events, events.ExpectLastSeq(a.ExpectSeq)); err != nil {
			return err
		}
		r.l.Info().Str("session", key(a.Events[0].Tenant, a.Events[0].Session)).Msg(a.Why)
	}
	r.openAgain()
	return nil
}

func (r *Reconciler) failClosed(err error, byWrite bool) {
	r.mu.Lock()
	first := r.failErr == nil
	r.failErr, r.failWrite = err, byWrite
	if r.proj != nil {
		// Judge everything again once the log is writable: what was
		// decided meanwhile may have been dropped.
		r.rescan = mergePartitions(r.rescan, r.proj.Partitions())
	}
	r.mu.Unlock()
	if first {
		r.l.Error().Err(err).Msg("failed closed: the log cannot be written; no command is issued until it can")
		if r.cfg.OnFailClosed != nil {
			r.cfg.OnFailClosed(err)
		}
	}
}

// openAgain clears a failed-closed state after a write succeeded.
func (r *Reconciler) openAgain() { r.open(true) }

// open clears a failed-closed state: any (a write succeeded), or only one
// the probe set (the probe passed; a failed write stays until its action
// is done). The check and the clear are one step under mu, so a write
// that fails meanwhile is not cleared by a probe that passed before it.
func (r *Reconciler) open(byWriteToo bool) {
	r.mu.Lock()
	if r.failWrite && !byWriteToo {
		r.mu.Unlock()
		return
	}
	was := r.failErr
	r.failErr, r.failWrite = nil, false
	r.mu.Unlock()
	if was != nil {
		r.l.Info().Msg("the log is writable again; issuing commands")
		if r.cfg.OnFailClosed != nil {
			r.cfg.OnFailClosed(nil)
		}
	}
}
