package projections

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/turnstone-dev/turnstone/events"
)

// Defaults of ProjectorConfig.
const (
	DefaultSnapshotEvery = 100
	DefaultDurable       = "turnstone-projector"
	DefaultIdleEvict     = time.Minute
	DefaultMaxSessions   = 10000
)

// ProjectorConfig configures a Projector. The zero value takes the
// defaults.
type ProjectorConfig struct {
	// SnapshotEvery is how many events of a session (snapshot.taken events
	// not counted) pass between two of its snapshots. Default 100.
	SnapshotEvery int
	// Durable names the JetStream durable consumer that remembers the
	// projector's position across restarts. Default "turnstone-projector".
	Durable string
	// IdleEvict is how long a session may go without an event before its
	// state leaves memory. Default 1 minute.
	IdleEvict time.Duration
	// MaxSessions bounds the session states held in memory: past it, the
	// least recently active leave. Default 10,000. A state that left is
	// restored (last snapshot + at most SnapshotEvery events) when its
	// next event comes, so leaving writes nothing.
	MaxSessions int
}

func (c *ProjectorConfig) setDefaults() {
	if c.SnapshotEvery == 0 {
		c.SnapshotEvery = DefaultSnapshotEvery
	}
	if c.Durable == "" {
		c.Durable = DefaultDurable
	}
	if c.IdleEvict == 0 {
		c.IdleEvict = DefaultIdleEvict
	}
	if c.MaxSessions == 0 {
		c.MaxSessions = DefaultMaxSessions
	}
}

// Validate reports every out-of-range field, joined.
func (c *ProjectorConfig) Validate() error {
	var errs []error
	if c.SnapshotEvery < 0 {
		errs = append(errs, fmt.Errorf("snapshot every: must not be negative, got %d", c.SnapshotEvery))
	}
	if c.IdleEvict < 0 {
		errs = append(errs, fmt.Errorf("idle evict: must not be negative, got %s", c.IdleEvict))
	}
	if c.MaxSessions < 0 {
		errs = append(errs, fmt.Errorf("max sessions: must not be negative, got %d", c.MaxSessions))
	}
	return errors.Join(errs...)
}

// Anomaly is a violation the projector saw arise, with the session it
// belongs to.
type Anomaly struct {
	Tenant, Session string
	Violation
}

// Projector follows the whole event log with a durable consumer, keeps the
// state of each active session in memory, snapshots a session every
// SnapshotEvery events (recording a snapshot.taken event in its log), and
// reports each violation as it arises. A session it has not seen since it
// started (or since it was evicted) is restored from its last snapshot plus
// the events after it, so a restart costs one restore per active session,
// not a replay of the log. A session.rewound that undoes events makes it
// refold the session from its log up to the rewind (from the latest
// snapshot when the rewind leaves it intact) and snapshot it at once, so
// that the next restore need not refold again; the events after the
// rewind are then folded, and their violations reported, as they come.
type Projector struct {
	log   *events.Log
	store *SnapshotStore
	cfg   ProjectorConfig
	l     zerolog.Logger

	// OnAnomaly, when set before Open, is called with each violation as the
	// projector folds the event that broke it.
	OnAnomaly func(Anomaly)
	// OnApply, when set before Open, is called after each event is folded,
	// on the projector's goroutine, with the session's state (read it
	// there; do not keep it: the projector goes on changing it), the
	// event, whether the fold applied it (false for a redelivery), and the
	// violations it gave rise to. The reconciler and the metrics hang off
	// it; it must not block for long, as the next event waits for it.
	OnApply func(s *Session, ev events.Event, applied bool, vs []Violation)

	mu       sync.Mutex
	sessions map[string]*tracked
	lru      *list.List // of *tracked, most recently active first

	cc     jetstream.ConsumeContext
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type tracked struct {
	key       string
	state     *Session
	sinceSnap int
	touched   time.Time
	elem      *list.Element
}

// NewProjector returns a projector over log that saves snapshots in store.
// logger may be nil.
func NewProjector(log *events.Log, store *SnapshotStore, cfg ProjectorConfig, logger *zerolog.Logger) (*Projector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("new projector: %w", err)
	}
	cfg.setDefaults()
	p := &Projector{log: log, store: store, cfg: cfg, l: zerolog.Nop(), sessions: map[string]*tracked{}, lru: list.New()}
	if logger != nil {
		p.l = logger.With().Str("component", "projector").Logger()
	}
	return p, nil
}

// Open creates (or resumes) the durable consumer and starts folding events
// on a goroutine the projector owns until Close.
func (p *Projector) Open(ctx context.Context) error {
	js := p.log.JetStream()
	st, err := js.Stream(ctx, events.EventsStream)
	if err != nil {
		return fmt.Errorf("open projector: %w", err)
	}
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       p.cfg.Durable,
		Description:   "Turnstone projector: folds every session",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       time.Minute,
		MaxAckPending: 4096,
		FilterSubject: events.EventSubjectPrefix + ".>",
	})
	if err != nil {
		return fmt.Errorf("open projector: consumer %s: %w", p.cfg.Durable, err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	p.cc, err = cons.Consume(func(msg jetstream.Msg) {
		meta, err := msg.Metadata()
		if err != nil {
			_ = msg.Term()
			return
		}
		p.apply(runCtx, events.DecodeStoredAt(msg.Subject(), meta.Sequence.Stream, meta.Timestamp, msg.Data()))
		_ = msg.Ack()
	})
	if err != nil {
		cancel()
		return fmt.Errorf("open projector: consume: %w", err)
	}
	p.wg.Add(1)
	go p.evictLoop(runCtx)
	return nil
}

// Close stops consuming and waits for the projector's goroutines, or for
// ctx to end. It writes no snapshot: a session is restored from its last
// snapshot plus at most SnapshotEvery events, whenever it stopped.
func (p *Projector) Close(ctx context.Context) error {
	if p.cc != nil {
		p.cc.Drain()
		select {
		case <-p.cc.Closed():
		case <-ctx.Done():
		}
	}
	if p.cancel != nil {
		p.cancel()
	}
	p.wg.Wait()
	return ctx.Err()
}

// Session returns a copy of the state the projector holds for a session in
// memory, and whether it holds one.
func (p *Projector) Session(tenant, session string) (*Session, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.sessions[tenant+"/"+session]
	if !ok {
		return nil, false
	}
	return t.state.Clone(), true
}

func (p *Projector) apply(ctx context.Context, ev events.Event) {
	key := ev.Tenant + "/" + ev.Session
	p.mu.Lock()
	t, ok := p.sessions[key]
	p.mu.Unlock()
	if !ok {
		state, err := Restore(ctx, p.log, p.store, ev.Tenant, ev.Session)
		if err != nil {
			// The log is the truth: fold from this event and let the
			// next restore set it right.
			p.l.Warn().Err(err).Str("session", key).Msg("restore failed; folding from this event")
			state = &Session{}
		}
		t = &tracked{key: key, state: state}
		p.mu.Lock()
		p.sessions[key] = t
		t.elem = p.lru.PushFront(t)
		for p.lru.Len() > p.cfg.MaxSessions {
			p.drop(p.lru.Back().Value.(*tracked))
		}
		p.mu.Unlock()
	}
	p.mu.Lock()
	t.touched = time.Now()
	if t.elem != nil {
		p.lru.MoveToFront(t.elem)
	}
	before := t.state.LastSeq
	vs := t.state.Apply(ev)
	applied := t.state.LastSeq > before
	if applied && ev.Type != events.TypeSnapshotTaken {
		t.sinceSnap++
	}
	rewound := t.state.NeedsRefold
	p.mu.Unlock()

	if rewound {
		// A rewind undid events: refold the session from its log up to
		// the rewind, from its latest snapshot when the rewind leaves that
		// intact. The consumer delivers one event at a time, so no Apply
		// runs meanwhile: the state is only read until the swap.
		var base *Session
		if snap, err := p.store.Load(ctx, ev.Tenant, ev.Session); err == nil {
			base = snap
		}
		fresh, err := t.state.refoldedLog(ctx, p.log, base)
		p.mu.Lock()
		if err != nil {
			// Forget the state: the session is restored (and refolded)
			// when its next event comes.
			p.l.Warn().Err(err).Str("session", key).Msg("refold after a rewind failed")
			if p.sessions[key] == t {
				p.drop(t)
			}
			p.mu.Unlock()
			p.report(ev, vs)
			if p.OnApply != nil {
				p.OnApply(t.state, ev, applied, vs)
			}
			return
		}
		// Snapshot it at once, so that the next restore need not refold.
		t.state, t.sinceSnap = fresh, p.cfg.SnapshotEvery
		p.mu.Unlock()
	}

	p.mu.Lock()
	var snap *Session
	if t.sinceSnap >= p.cfg.SnapshotEvery {
		snap = t.state.Clone()
		t.sinceSnap = 0
	}
	p.mu.Unlock()

	p.report(ev, vs)
	if p.OnApply != nil {
		p.OnApply(t.state, ev, applied, vs)
	}
	if snap != nil {
		p.snapshot(ctx, snap)
	}
}

// report logs the violations ev gave rise to and passes them to OnAnomaly.
func (p *Projector) report(ev events.Event, vs []Violation) {
	for _, v := range vs {
		p.l.Warn().Str("tenant", ev.Tenant).Str("session", ev.Session).Uint64("seq", v.Seq).
			Str("rule", string(v.Rule)).Str("tool_use_id", v.ToolUseID).Msg(v.Detail)
		if p.OnAnomaly != nil {
			p.OnAnomaly(Anomaly{Tenant: ev.Tenant, Session: ev.Session, Violation: v})
		}
	}
}

// snapshot saves s and records a snapshot.taken event in its session's log,
// with an id derived from the covered sequence so a repeat is stored once.
func (p *Projector) snapshot(ctx context.Context, s *Session) {
	if err := p.store.Save(ctx, s); err != nil {
		p.l.Warn().Err(err).Str("session", s.Tenant+"/"+s.Session).Msg("snapshot not saved")
		return
	}
	id := events.DeterministicID(s.LastTime, fmt.Sprintf("%s/%s/snapshot/%d", s.Tenant, s.Session, s.LastSeq))
	ev, err := events.NewAt(s.LastTime, id, s.Tenant, s.Session, "", &events.SnapshotTaken{CoversSeq: s.LastSeq, Version: Version})
	if err == nil {
		_, err = p.log.Append(ctx, []events.Event{ev})
	}
	if err != nil {
		p.l.Warn().Err(err).Str("session", s.Tenant+"/"+s.Session).Msg("snapshot.taken not recorded")
	}
}

func (p *Projector) evictLoop(ctx context.Context) {
	defer p.wg.Done()
	tick := time.NewTicker(p.cfg.IdleEvict / 4)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			p.evict(ctx, now)
		}
	}
}

func (p *Projector) evict(_ context.Context, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for e := p.lru.Back(); e != nil; {
		t := e.Value.(*tracked)
		if now.Sub(t.touched) < p.cfg.IdleEvict {
			return // the rest are more recent
		}
		prev := e.Prev()
		p.drop(t)
		e = prev
	}
}

// drop forgets a session's state; p.mu must be held.
func (p *Projector) drop(t *tracked) {
	delete(p.sessions, t.key)
	if t.elem != nil {
		p.lru.Remove(t.elem)
		t.elem = nil
	}
}

// Held is how many session states the projector holds in memory.
func (p *Projector) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sessions)
}
