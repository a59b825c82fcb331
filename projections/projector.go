package projections

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/turnstone-dev/turnstone/events"
)

// Defaults of ProjectorConfig.
const (
	DefaultSnapshotEvery = 100
	DefaultDurable       = "turnstone-projector"
	DefaultIdleEvict     = time.Minute
	DefaultCompressAfter = 5 * time.Second
	DefaultMaxSessions   = 10000
	// DefaultProjectorGroup is the priority group the engines pull the
	// projector consumers in: the pinned_client policy (ADR-42) delivers
	// each partition to one engine at a time.
	DefaultProjectorGroup = "engines"
	// DefaultProjectorAckWait is how long an engine may hold an event
	// unacknowledged before JetStream delivers it again.
	DefaultProjectorAckWait = 30 * time.Second
	// DefaultProjectorMaxAckPending bounds the events of one partition
	// delivered and not yet acknowledged.
	DefaultProjectorMaxAckPending = 1024
	// PullExpiry is how long, at most, a pull request of a partition's
	// holder lasts (PullExpiryFor makes it shorter for a shorter pinned
	// TTL): inside the pin's TTL (10 s by default), so that a holder of an
	// idle partition renews its pin (each request does) and never loses
	// it for want of events (ADR-42), and a lost server is noticed within
	// two missed idle heartbeats (half of it each).
	PullExpiry = 4 * time.Second
)

// ProjectorConfig configures a Projector. The zero value takes the
// defaults. The hooks are given here, at construction, and never change.
type ProjectorConfig struct {
	// SnapshotEvery is how many events of a session (snapshot.taken events
	// not counted) pass between two of its snapshots. Default 100.
	SnapshotEvery int
	// Durable prefixes the name of the durable consumer of each partition:
	// "<Durable>-p<partition>", which remembers the engines' position
	// across restarts and handovers. Default "turnstone-projector".
	Durable string
	// Group is the pinned_client priority group the consumers are pulled
	// in. Default "engines".
	Group string
	// AckWait and MaxAckPending are the consumers' (see the defaults).
	AckWait       time.Duration
	MaxAckPending int
	// UseExisting: Acquire never creates a partition's consumer (engine
	// setup does: EnsureProjectorConsumers); a missing one is an error
	// wrapping jetstream.ErrConsumerNotFound. False: Acquire creates a
	// missing one.
	UseExisting bool
	// Shared says the projector shares the partitions with other engines
	// (a partition group drives Acquire and Release). When false, Open
	// acquires every partition: the projector is the only one.
	Shared bool
	// IdleEvict is how long a session may go without an event before its
	// state leaves memory. Default 1 minute.
	IdleEvict time.Duration
	// CompressAfter is how long a session with no turn in flight may go
	// without an event before the projector holds its state in compressed
	// form (its JSON compressed: a few hundred bytes for a short session,
	// about a quarter of the JSON for a long one) until its next event or
	// a reader expands it again. Default 5 seconds; negative: never.
	CompressAfter time.Duration
	// MaxSessions bounds the session states held in memory: past it, the
	// least recently active leave. Default 10,000. A state that left is
	// restored (last snapshot + at most SnapshotEvery events) when its
	// next event comes, so leaving writes nothing.
	MaxSessions int
	// OnAnomaly, when set, is called with each violation as the projector
	// folds the event that broke it.
	OnAnomaly func(Anomaly)
	// OnApply, when set, is called after each event is folded, on the
	// goroutine of the event's partition, with the session's state (read
	// it there; do not keep it: the projector goes on changing it), the
	// event, whether the fold applied it (false for a redelivery), and the
	// violations it gave rise to. The reconciler and the metrics hang off
	// it; it must not block for long, as the partition's next event waits
	// for it. Calls for different partitions run concurrently.
	OnApply func(s *Session, ev events.Event, applied bool, vs []Violation)
	// OnRelease, when set, is called after a partition was released, with
	// its number (the reconciler forgets that partition's sessions).
	OnRelease func(partition int)
	// OnPinMoved, when set, is called when the pin of a partition's
	// consumer moved away from this projector while it held the
	// partition (the partition's states were dropped: see Acquire).
	OnPinMoved func(partition int)
	// OnSnapshotMismatch, when set, is called when a session's snapshot,
	// or the state the projector held, counted fewer events up to its last
	// sequence than the log holds (folded, logged): the log won, and the
	// session was refolded from it.
	OnSnapshotMismatch func(tenant, session string, folded, logged int)
	// Index makes the projector keep the fleet index (IndexBucket, which
	// must exist: EnsureIndexBucket): a Summary per session, written
	// before the event is acknowledged when what the reconciler acts on
	// changed, and within IndexEvery otherwise.
	Index bool
	// IndexEvery is how often the summaries that changed otherwise are
	// written. Default 1 second.
	IndexEvery time.Duration
	// Gate, when set, is the engine's erasure gate: the fold of an event
	// (and every write it causes: snapshot, index entry) holds it, an
	// event of a session being erased or of an erased sequence is
	// acknowledged without being folded, and no write is made for a
	// session whose erase began after its event was taken (package
	// erasure). Forget drops the erased sessions' states. Nil: nothing is
	// ever being erased.
	Gate ErasureGate
}

// ErasureGate is what the projector asks of an erasure gate (the engine's
// *erasure.Gate implements it), so that no write is made from a state
// read before an erase of its session began.
type ErasureGate interface {
	// Epoch is the count of erases begun; take it before reading the
	// state a write is decided from.
	Epoch() uint64
	// Enter asks to write for the session: false when it is being
	// erased, or an erase of it began after since (an Epoch). On true,
	// Leave must follow once the write is stored or has failed.
	Enter(tenant, session string, since uint64) bool
	// Leave ends a write Enter allowed.
	Leave(tenant, session string)
	// Skip reports whether the event at stream sequence seq of the
	// session is erased or being erased: it is acknowledged, not folded.
	Skip(tenant, session string, seq uint64) bool
}

// noGate is the ErasureGate of a projector without one: nothing is being
// erased.
type noGate struct{}

func (noGate) Epoch() uint64                     { return 0 }
func (noGate) Enter(string, string, uint64) bool { return true }
func (noGate) Leave(string, string)              {}
func (noGate) Skip(string, string, uint64) bool  { return false }

func (c *ProjectorConfig) setDefaults() {
	if c.Gate == nil {
		c.Gate = noGate{}
	}
	if c.SnapshotEvery == 0 {
		c.SnapshotEvery = DefaultSnapshotEvery
	}
	if c.Durable == "" {
		c.Durable = DefaultDurable
	}
	if c.Group == "" {
		c.Group = DefaultProjectorGroup
	}
	if c.AckWait == 0 {
		c.AckWait = DefaultProjectorAckWait
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = DefaultProjectorMaxAckPending
	}
	if c.IdleEvict == 0 {
		c.IdleEvict = DefaultIdleEvict
	}
	if c.CompressAfter == 0 {
		c.CompressAfter = DefaultCompressAfter
	}
	if c.MaxSessions == 0 {
		c.MaxSessions = DefaultMaxSessions
	}
	if c.IndexEvery == 0 {
		c.IndexEvery = time.Second
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
	if c.AckWait < 0 || c.MaxAckPending < 0 {
		errs = append(errs, errors.New("ack wait, max ack pending: must not be negative"))
	}
	return errors.Join(errs...)
}

// EngineGroup is the name of the engines' partition group (the members
// bucket's group): engines share the projector consumers of AGENT_EVENTS'
// partitions in it.
const EngineGroup = "engines"

// PullExpiryFor is the expiry of the pull requests of a consumer whose
// pinned TTL (priority_timeout) is pinnedTTL: PullExpiry, or less than
// half the TTL when that is shorter, and at least 1 s (nats.go's floor).
func PullExpiryFor(pinnedTTL time.Duration) time.Duration {
	d := PullExpiry
	if pinnedTTL > 0 && pinnedTTL*2/5 < d {
		d = pinnedTTL * 2 / 5
	}
	return max(d, time.Second)
}

// ProjectorConsumerName is the durable consumer of partition p for a
// projector whose Durable is durable: "<durable>-p<p>".
func ProjectorConsumerName(durable string, p int) string {
	if durable == "" {
		durable = DefaultDurable
	}
	return durable + "-p" + strconv.Itoa(p)
}

// ProjectorConsumerConfig is the durable consumer of partition p: the
// events stored under agent.evt.<p>.>, explicit acks, and the
// pinned_client priority policy on the group (ADR-42), so that one engine
// at a time receives the partition and another takes over when it stops
// pulling (PinnedTTL) or is unpinned.
func ProjectorConsumerConfig(cfg ProjectorConfig, p int) jetstream.ConsumerConfig {
	cfg.setDefaults()
	return jetstream.ConsumerConfig{
		Durable:        ProjectorConsumerName(cfg.Durable, p),
		Description:    fmt.Sprintf("Turnstone projector: the sessions of partition %d", p),
		FilterSubject:  events.StoredPartitionFilter(p),
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        cfg.AckWait,
		MaxAckPending:  cfg.MaxAckPending,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PriorityGroups: []string{cfg.Group},
		PinnedTTL:      10 * time.Second,
	}
}

// EnsureProjectorConsumers creates or updates the durable consumer of
// every partition (the engine's setup, or an operator's: engine setup).
// The single consumer of earlier versions (Durable, without a partition)
// is deleted when it exists.
func EnsureProjectorConsumers(ctx context.Context, js jetstream.JetStream, cfg ProjectorConfig, partitions int) error {
	cfg.setDefaults()
	st, err := js.Stream(ctx, events.EventsStream)
	if err != nil {
		return fmt.Errorf("projector consumers: %w", err)
	}
	for p := 0; p < partitions; p++ {
		if _, err := st.CreateOrUpdateConsumer(ctx, ProjectorConsumerConfig(cfg, p)); err != nil {
			return fmt.Errorf("projector consumer %s: %w", ProjectorConsumerName(cfg.Durable, p), err)
		}
	}
	if err := st.DeleteConsumer(ctx, cfg.Durable); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("delete the single projector consumer of earlier versions: %w", err)
	}
	return nil
}

// CheckProjectorConsumers checks, changing nothing, that the durable
// consumer of every partition exists and reads its partition's events
// (ProjectorConsumerConfig's filter): a process that may not create them
// (ProjectorConfig.UseExisting) calls it before it starts. The error
// names each consumer that is missing (wrapping
// jetstream.ErrConsumerNotFound: engine setup creates them) or filters
// other subjects; or the stream's or the server's error.
func CheckProjectorConsumers(ctx context.Context, js jetstream.JetStream, cfg ProjectorConfig, partitions int) error {
	cfg.setDefaults()
	st, err := js.Stream(ctx, events.EventsStream)
	if err != nil {
		return fmt.Errorf("projector consumers: %w", err)
	}
	var missing, wrong []string
	for p := 0; p < partitions; p++ {
		name := ProjectorConsumerName(cfg.Durable, p)
		cons, err := st.Consumer(ctx, name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			missing = append(missing, name)
			continue
		}
		if err != nil {
			return fmt.Errorf("projector consumer %s: %w", name, err)
		}
		if got, want := cons.CachedInfo().Config.FilterSubject, events.StoredPartitionFilter(p); got != want {
			wrong = append(wrong, fmt.Sprintf("%s filters %q, not %q", name, got, want))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("projector consumers %s of stream %s: %w", strings.Join(missing, ", "), events.EventsStream, jetstream.ErrConsumerNotFound)
	}
	if len(wrong) > 0 {
		return fmt.Errorf("projector consumers of stream %s: %s; engine setup makes them again", events.EventsStream, strings.Join(wrong, "; "))
	}
	return nil
}

// PartitionState is where the projector consumer of one partition stands:
// the events not yet delivered (Pending: the partition's lag), delivered
// and not yet acknowledged (AckPending), the stream sequence of the last
// delivered, and the id of the pinned client ("" when none is pinned).
type PartitionState struct {
	Partition  int    `json:"partition"`
	Pending    uint64 `json:"pending"`
	AckPending int    `json:"ack_pending"`
	Delivered  uint64 `json:"delivered_seq"`
	PinnedID   string `json:"pinned_id,omitempty"`
}

// PartitionStates reads the state of the projector consumer of each of the
// partitions (durable: ProjectorConfig.Durable, "" for the default), in
// the order of partitions. A partition whose consumer does not exist is
// an error wrapping jetstream.ErrConsumerNotFound, naming it; so is any
// other error of the server's.
func PartitionStates(ctx context.Context, js jetstream.JetStream, durable string, partitions []int) ([]PartitionState, error) {
	st, err := js.Stream(ctx, events.EventsStream)
	if err != nil {
		return nil, fmt.Errorf("partition states: %w", err)
	}
	out := make([]PartitionState, 0, len(partitions))
	for _, p := range partitions {
		c, err := st.Consumer(ctx, ProjectorConsumerName(durable, p))
		if err != nil {
			return nil, fmt.Errorf("partition %d: %w", p, err)
		}
		ci, err := c.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("partition %d: %w", p, err)
		}
		ps := PartitionState{Partition: p, Pending: ci.NumPending, AckPending: ci.NumAckPending, Delivered: ci.Delivered.Stream}
		for _, g := range ci.PriorityGroups {
			if g.PinnedClientID != "" {
				ps.PinnedID = g.PinnedClientID
			}
		}
		out = append(out, ps)
	}
	return out, nil
}

// Backlog is how many events the projector (durable: ProjectorConfig.Durable,
// "" for the default) has still to fold, over every partition: those its
// consumers have not delivered yet (NumPending) and those delivered and
// not acknowledged yet (NumAckPending; an event is acknowledged once the
// index row it changed is stored). 0 means the fleet index shows the
// status of every event stored when the consumers were read. It reads
// AGENT_EVENTS' consumer list (one request per 256 consumers). Errors:
// the stream or its consumer list cannot be read.
func Backlog(ctx context.Context, js jetstream.JetStream, durable string) (uint64, error) {
	if durable == "" {
		durable = DefaultDurable
	}
	st, err := js.Stream(ctx, events.EventsStream)
	if err != nil {
		return 0, fmt.Errorf("projector backlog: %w", err)
	}
	var n uint64
	list := st.ListConsumers(ctx)
	for ci := range list.Info() {
		p, ok := strings.CutPrefix(ci.Name, durable+"-p")
		if _, err := strconv.Atoi(p); !ok || err != nil {
			continue
		}
		n += ci.NumPending + uint64(max(ci.NumAckPending, 0))
	}
	if err := list.Err(); err != nil {
		return 0, fmt.Errorf("projector backlog: %w", err)
	}
	return n, nil
}

// Anomaly is a violation the projector saw arise, with the session it
// belongs to.
type Anomaly struct {
	Tenant, Session string
	Violation
}

// Projector follows the event log, one durable consumer per partition,
// keeps the state of each active session of the partitions it owns in
// memory, snapshots a session every SnapshotEvery events (recording a
// snapshot.taken event in its log), and reports each violation as it
// arises. Each partition is folded on its own goroutine, so a slow or
// huge session delays only its own partition.
//
// A session it does not hold (new to it since it acquired the partition,
// or evicted) is restored from its last snapshot plus the events after
// it, so a restart or a handover costs one restore per active session,
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

	mu       sync.Mutex
	sessions map[string]*tracked
	lru      lru // most recently active first
	// started is when the projector was made: tracked.touched counts
	// from it, on the monotonic clock.
	started     time.Time
	parts       map[int]*partition
	newFast     int // sessions folded from empty without a restore (new ones)
	nCompressed int // states held in compressed form
	// unsent are index rows of sessions no longer held (evicted while
	// their row was not stored yet), by key: the index loop writes them
	// until they are stored.
	unsent map[string]indexRow
	// suspect are the partitions held whose fleet index may not match
	// the log, each with the time from which it is reconciled: states were
	// dropped (the pin moved) while their row was not stored, a
	// ReconcileIndex did not finish, or a row's write failed or went
	// unanswered (it may still be stored later, over a newer row: a
	// stream electing a leader). The index loop reconciles them with the
	// log (ReconcileIndex) until it succeeds or the partition is let go;
	// reconciling are those it is reconciling now.
	suspect     map[int]time.Time
	reconciling map[int]bool
	indexWake   chan struct{}

	runCtx  context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	pinSubs []*nats.Subscription
}

// tracked is a session the projector tracks. It is what an idle state
// held costs beside its compressed form, so its fields are packed
// (184 bytes: the 192-byte size class, where it was in the 224).
type tracked struct {
	key     string
	tenant  string
	session string
	// state is the session's state, or nil while it is held in compressed
	// form (see compressState).
	state      *Session
	compressed []byte
	// touched is when the session last had an event, as time since
	// Projector.started.
	touched time.Duration
	// prev and next link the projector's lru; listed says t is in it.
	prev, next *tracked
	partition  int32
	sinceSnap  int32
	listed     bool
	// indexed is the attention of the summary last written to the index;
	// dirty says the summary changed since; subject is the session's
	// stored subject (for a subject that names no valid session).
	dirty   bool
	indexed attention
	subject string
}

// attention is what the reconciler acts on, of a session's state (see
// Summary.Attention): comparable, and cheap to compute per event.
type attention struct {
	status   SessionStatus
	cause    events.PauseCause
	inFlight int32
	orphans  int32
	written  bool
	pending  bool
	paused   bool
	history  bool
}

func attentionOf(s *Session) attention {
	return attention{written: true, status: s.Status(), inFlight: int32(len(s.InFlight)), pending: s.PendingDistillation() != nil,
		paused: s.Paused, cause: s.PauseCause, orphans: int32(s.openOrphans()), history: s.History}
}

// partition is one partition the projector folds: its consumer, the
// lease it is folded under, the pin its deliveries carry, and the
// acknowledgements that wait for an index write.
type partition struct {
	cc       jetstream.ConsumeContext
	acks     chan pendingAck
	done     chan struct{}
	lease    context.Context
	consumer string

	mu        sync.Mutex
	closed    bool
	releasing bool   // Release began: consumption is not started again
	pin       string // the Nats-Pin-Id of the last delivery ("" before the first)
	lost      bool   // the pin was seen to move away since
}

// wait hands pa to the acker; once the partition is released the event
// is left unacknowledged, for the next owner.
func (ps *partition) wait(pa pendingAck) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if !ps.closed {
		ps.acks <- pa
	}
}

// close stops the acker once it acknowledged what it holds.
func (ps *partition) close() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if !ps.closed {
		ps.closed = true
		close(ps.acks)
	}
}

// pendingAck is an event whose acknowledgement waits until the index
// write it caused is stored; the write holds the erasure gate until then.
type pendingAck struct {
	msg             jetstream.Msg
	fut             jetstream.PubAckFuture
	part            int
	key             string
	tenant, session string
}

// NewProjector returns a projector over log that saves snapshots in store,
// with cfg's zero values set to their defaults; it starts nothing (Open
// does). logger may be nil. The only error is cfg.Validate's.
func NewProjector(log *events.Log, store *SnapshotStore, cfg ProjectorConfig, logger *zerolog.Logger) (*Projector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("new projector: %w", err)
	}
	cfg.setDefaults()
	p := &Projector{log: log, store: store, cfg: cfg, l: zerolog.Nop(), sessions: map[string]*tracked{}, started: time.Now(),
		parts: map[int]*partition{}, unsent: map[string]indexRow{},
		suspect: map[int]time.Time{}, reconciling: map[int]bool{}, indexWake: make(chan struct{}, 1)}
	if logger != nil {
		p.l = logger.With().Str("component", "projector").Logger()
	}
	return p, nil
}

// Open starts the projector's housekeeping on a goroutine it owns until
// Close, and, unless the projector is Shared, acquires every partition.
// Errors: a partition that cannot be acquired (Acquire's error; nothing
// keeps running then); when Shared, the subscription to the consumers'
// pin advisories.
func (p *Projector) Open(ctx context.Context) error {
	p.runCtx, p.cancel = context.WithCancel(context.Background())
	p.wg.Add(1)
	go p.evictLoop(p.runCtx)
	if p.cfg.Index {
		p.wg.Add(1)
		go p.indexLoop(p.runCtx)
	}
	if p.cfg.Shared {
		return p.watchPins()
	}
	for part := 0; part < p.log.Partitions(); part++ {
		if err := p.Acquire(p.runCtx, part, false); err != nil {
			p.cancel()
			p.wg.Wait()
			return fmt.Errorf("open projector: %w", err)
		}
	}
	return nil
}

// Acquire starts folding partition part under lease: it pulls the
// partition's durable consumer (created with ProjectorConsumerConfig when
// it does not exist yet, unless UseExisting: then its absence is an error
// wrapping jetstream.ErrConsumerNotFound) in the priority group, and
// folds and acknowledges only while lease is live: once it is done (the
// partition group fenced this engine, or let the partition go) nothing
// more is folded, written or acknowledged, and what was delivered is left
// for the next holder. takenOver says the previous holder's lease ran out: the
// consumer is unpinned (waiting for its pin to expire would only delay).
// The consumer is reset to its acknowledgement floor, so what an earlier
// holder (this projector too, before its lease ended) was delivered and
// never acknowledged comes again at once, not after AckWait (ADR-42; the
// consumer reset of nats-server 2.14+); what comes again folded already is
// skipped by the fold.
//
// The projector holds no state of the partition when it acquires it, and
// drops every state of the partition the moment the consumer's pin is
// seen to move away from it (a delivery with another Nats-Pin-Id, a pull
// refused for a wrong pin id, a PINNED or UNPINNED advisory): another
// holder may have folded and acknowledged events meanwhile, so each
// session is restored from its snapshot and the log at its next event,
// never continued from what this projector folded before. Acquiring a
// partition held is a no-op.
func (p *Projector) Acquire(lease context.Context, part int, takenOver bool) error {
	p.mu.Lock()
	_, held := p.parts[part]
	p.mu.Unlock()
	if held {
		return nil
	}
	ctx, cancel := context.WithTimeout(lease, p.log.Config().Timeout)
	defer cancel()
	js := p.log.JetStream()
	st, err := js.Stream(ctx, events.EventsStream)
	if err != nil {
		return fmt.Errorf("acquire partition %d: %w", part, err)
	}
	name := ProjectorConsumerName(p.cfg.Durable, part)
	cons, err := st.Consumer(ctx, name)
	if errors.Is(err, jetstream.ErrConsumerNotFound) && !p.cfg.UseExisting {
		cons, err = st.CreateConsumer(ctx, ProjectorConsumerConfig(p.cfg, part))
	}
	if err != nil {
		return fmt.Errorf("acquire partition %d: consumer %s: %w", part, name, err)
	}
	// Nothing of the partition is held from before: whatever was, another
	// holder may have moved past it.
	p.dropPartition(part)
	if takenOver {
		if err := st.UnpinConsumer(ctx, name, p.cfg.Group); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			p.l.Debug().Err(err).Int("partition", part).Msg("unpin")
		}
	}
	// What an earlier holder (this engine too, before a fence) was
	// delivered and did not acknowledge comes again now, not after
	// AckWait.
	if _, err := st.ResetConsumer(ctx, name); err != nil {
		p.l.Debug().Err(err).Int("partition", part).Msg("reset to the acknowledgement floor")
	}
	ps := &partition{acks: make(chan pendingAck, p.cfg.MaxAckPending), done: make(chan struct{}), lease: lease, consumer: name}
	go p.acker(ps)
	cc, err := p.consume(ps, part, cons)
	if err != nil {
		ps.close()
		<-ps.done
		return fmt.Errorf("acquire partition %d: consume: %w", part, err)
	}
	ps.cc = cc
	p.mu.Lock()
	p.parts[part] = ps
	p.mu.Unlock()
	p.wg.Add(1)
	go p.keepConsuming(ps, part, cons)
	return nil
}

// consume starts pulling partition part's consumer into the fold.
func (p *Projector) consume(ps *partition, part int, cons jetstream.Consumer) (jetstream.ConsumeContext, error) {
	lease := ps.lease
	return cons.Consume(func(msg jetstream.Msg) {
		if lease.Err() != nil {
			return // fenced: not folded, not acknowledged; the next holder has it
		}
		if p.pinMoved(ps, part, msg.Headers().Get(pinHeader)) {
			// Synchronously, before this delivery is folded: the states of
			// the partition are restored from the log as their events come.
			p.dropPartition(part)
			p.wg.Add(1)
			go p.redeliver(part, ps.consumer)
		}
		meta, err := msg.Metadata()
		if err != nil {
			_ = msg.Term()
			return
		}
		ev := events.DecodeStoredAt(msg.Subject(), meta.Sequence.Stream, meta.Timestamp, msg.Data())
		fut, ok := p.apply(lease, part, ev)
		if lease.Err() != nil {
			return // the lease ended while it folded: left for the next holder
		}
		if !ok {
			_ = msg.NakWithDelay(time.Second)
			return
		}
		if fut != nil {
			ps.wait(pendingAck{msg: msg, fut: fut, part: part, key: ev.Tenant + "/" + ev.Session, tenant: ev.Tenant, session: ev.Session})
			return
		}
		_ = msg.Ack()
	}, jetstream.PullPriorityGroup(p.cfg.Group), jetstream.PullMaxMessages(256),
		jetstream.PullExpiry(PullExpiryFor(cons.CachedInfo().Config.PinnedTTL)),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			switch {
			case errors.Is(err, jetstream.ErrPinIDMismatch):
				p.pinLost(part, "a pull was refused: the pin moved")
			case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrBadRequest):
				p.l.Warn().Err(err).Int("partition", part).Msg("the partition's consumer stopped")
			}
		}))
}

// keepConsuming consumes partition part again whenever its consumption
// stops on its own (nats.go stops it on a terminal status: the consumer
// deleted, a bad request) while the lease holds, so that a held partition
// is never left unfolded; what was delivered and not acknowledged comes
// again (reset). It returns when the lease ends or the partition is
// released.
func (p *Projector) keepConsuming(ps *partition, part int, cons jetstream.Consumer) {
	defer p.wg.Done()
	// Between tries: from 100 ms, doubling up to 5 s, for as long as the
	// lease holds.
	b := backoff.NewExponentialBackOff(backoff.WithInitialInterval(100*time.Millisecond), backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(0), backoff.WithMaxInterval(5*time.Second), backoff.WithMaxElapsedTime(0))
	for {
		ps.mu.Lock()
		cc := ps.cc
		ps.mu.Unlock()
		select {
		case <-ps.lease.Done():
			return
		case <-p.runCtx.Done():
			return
		case <-cc.Closed():
		}
		err := backoff.Retry(func() error {
			ps.mu.Lock()
			releasing := ps.releasing
			ps.mu.Unlock()
			if releasing || ps.lease.Err() != nil || p.runCtx.Err() != nil {
				return backoff.Permanent(errReleased)
			}
			p.l.Warn().Int("partition", part).Msg("the partition's consumption stopped while it is held: consuming again")
			p.dropPartition(part)
			p.wg.Add(1)
			p.redeliver(part, ps.consumer)
			ncc, err := p.consume(ps, part, cons)
			if err != nil {
				return err
			}
			ps.mu.Lock()
			if ps.releasing {
				ps.mu.Unlock()
				ncc.Stop()
				return backoff.Permanent(errReleased)
			}
			ps.cc = ncc
			ps.mu.Unlock()
			return nil
		}, backoff.WithContext(b, ps.lease))
		if err != nil { // released, or the lease ended
			return
		}
	}
}

// errReleased: the partition was released, or its lease or the projector
// ended, while its consumption was being started again.
var errReleased = errors.New("partition released")

// acker acknowledges the events of a partition that wait for their index
// write, in order, once it is stored; an event whose write failed is
// delivered again (and the summary written again).
func (p *Projector) acker(ps *partition) {
	defer close(ps.done)
	for pa := range ps.acks {
		timer := time.NewTimer(p.cfg.AckWait / 2)
		select {
		case <-pa.fut.Ok():
			if ps.lease.Err() == nil {
				_ = pa.msg.Ack()
			}
		case err := <-pa.fut.Err():
			p.indexFailed(pa.part, pa.key, err)
			// Not at once: a bucket without a leader refuses at once, and
			// the event would come back, and its row be refused, in a loop
			// until one is elected.
			_ = pa.msg.NakWithDelay(indexRetryDelay)
		case <-timer.C:
			p.indexFailed(pa.part, pa.key, errors.New("no ack from the index"))
			_ = pa.msg.Nak()
		}
		timer.Stop()
		p.cfg.Gate.Leave(pa.tenant, pa.session)
	}
}

// indexFailed marks a session's summary to be written again. A write
// the bucket refused for want of a leader ("no responders": an election,
// over in seconds) is logged at debug level, other failures as warnings.
func (p *Projector) indexFailed(part int, key string, err error) {
	lvl := p.l.Warn()
	if errors.Is(err, jetstream.ErrNoStreamResponse) {
		lvl = p.l.Debug()
	}
	lvl.Err(err).Str("session", key).Msg("index write failed; the event is delivered again")
	p.mu.Lock()
	if t, ok := p.sessions[key]; ok {
		t.indexed, t.dirty = attention{}, true
	}
	p.suspectIndexLater(part)
	p.mu.Unlock()
}

// Release stops folding partition part and forgets the partition's
// session states. fenced false (the engine lets the partition go while
// its lease holds): it drains the partition's consumer (the events
// delivered are folded and acknowledged) and unpins it so that the next
// holder receives it at once. fenced true (the lease ended on its own):
// it stops at once, acknowledges nothing more and leaves the pin alone
// (another engine may hold the partition already). Releasing a partition
// not held is a no-op.
func (p *Projector) Release(ctx context.Context, part int, fenced bool) {
	p.mu.Lock()
	ps, held := p.parts[part]
	delete(p.parts, part)
	p.mu.Unlock()
	if !held {
		return
	}
	ps.mu.Lock()
	ps.releasing = true
	cc := ps.cc
	ps.mu.Unlock()
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
	ps.close()
	select {
	case <-ps.done:
	case <-ctx.Done():
	}
	if p.cfg.Index && !fenced {
		// The rows not stored yet are this owner's to write: the next
		// one writes a session's only when its next event comes. A
		// fenced owner writes nothing more.
		p.flushRows(ctx, part)
	}
	if !fenced {
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if st, err := p.log.JetStream().Stream(uctx, events.EventsStream); err == nil {
			_ = st.UnpinConsumer(uctx, ProjectorConsumerName(p.cfg.Durable, part), p.cfg.Group)
		}
	}
	p.dropPartition(part)
	if p.cfg.OnRelease != nil {
		p.cfg.OnRelease(part)
	}
}

// Partitions returns the partitions the projector folds now, in order.
func (p *Projector) Partitions() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]int, 0, len(p.parts))
	for part := range p.parts {
		out = append(out, part)
	}
	sort.Ints(out)
	return out
}

// Close releases every partition (draining what was delivered) and waits
// for the projector's goroutines, or for ctx to end. It writes no
// snapshot: a session is restored from its last snapshot plus at most
// SnapshotEvery events, whenever it stopped.
func (p *Projector) Close(ctx context.Context) error {
	for _, part := range p.Partitions() {
		p.Release(ctx, part, false)
	}
	if p.pinSubs != nil {
		for _, sub := range p.pinSubs {
			_ = sub.Unsubscribe()
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
	if t.state == nil {
		s, err := decompressState(t.compressed) // a copy already
		if err != nil {
			p.l.Warn().Err(err).Str("session", t.key).Msg("compressed state does not expand; it is restored at its next event")
			p.drop(t)
			return nil, false
		}
		return s, true
	}
	return t.state.Clone(), true
}

// Compressed is how many of the session states the projector holds are in
// compressed form (see ProjectorConfig.CompressAfter).
func (p *Projector) Compressed() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nCompressed
}

// expand makes t's state whole again; p.mu must be held. It reports false
// when the compressed form does not expand (it cannot happen: the form never
// leaves memory), and t is then dropped.
func (p *Projector) expand(t *tracked) bool {
	if t.state != nil {
		return true
	}
	s, err := decompressState(t.compressed)
	if err != nil {
		p.l.Warn().Err(err).Str("session", t.key).Msg("compressed state does not expand; restoring it")
		p.drop(t)
		return false
	}
	t.state, t.compressed = s, nil
	if p.sessions[t.key] == t {
		p.nCompressed--
	}
	return true
}

// apply folds ev, an event of partition part, into its session's state.
// Events of one partition come one at a time (its consumer's goroutine);
// p.mu guards the map and the LRU, and a state while Session copies it.
// It returns the index write to wait for before the event is
// acknowledged, or nil.
func (p *Projector) apply(ctx context.Context, part int, ev events.Event) (jetstream.PubAckFuture, bool) {
	key := ev.Tenant + "/" + ev.Session
	gate := p.cfg.Gate
	// The fold holds the gate: an erase that begins waits for it, and
	// drops the state it leaves (Forget).
	since := gate.Epoch()
	if !gate.Enter(ev.Tenant, ev.Session, since) {
		// Being erased: the event goes with the rest of the session. The
		// state is dropped, so that if the erase is given up the session
		// is restored from the log (which still holds this event).
		p.forgetKey(key)
		return nil, true
	}
	defer gate.Leave(ev.Tenant, ev.Session)
	if gate.Skip(ev.Tenant, ev.Session, ev.Seq) {
		return nil, true // a delivery of an erased event, buffered before the purge
	}
	p.mu.Lock()
	t, ok := p.sessions[key]
	p.mu.Unlock()
	if !ok {
		state, err := p.current(ctx, ev)
		if err != nil {
			// Never folded from the middle of a session: the event comes
			// again, and the session is restored then.
			p.l.Warn().Err(err).Str("session", key).Uint64("seq", ev.Seq).Msg("restore failed; the event is delivered again")
			return nil, false
		}
		t = &tracked{key: key, tenant: ev.Tenant, session: ev.Session, partition: int32(part), state: state, touched: time.Since(p.started)}
		if state.LastSnapshotSeq == 0 && state.Events > 0 {
			// Read from the log alone, never snapshotted: the events it
			// folded (this one among them, so its Apply below is a no-op)
			// count toward the next snapshot as if they had come one by
			// one; else a session written faster than it was first read
			// would never be snapshotted.
			t.sinceSnap = int32(min(state.Events, p.cfg.SnapshotEvery))
		}
		p.mu.Lock()
		p.sessions[key] = t
		p.lru.pushFront(t)
		for p.lru.len() > p.cfg.MaxSessions {
			p.retire(p.lru.back())
		}
		p.mu.Unlock()
	}
	// st is the state this goroutine folds: the partition's events come
	// one at a time, so nothing else changes it, and the field t.state
	// (which the compressor may set while st is read) is only read under
	// p.mu.
	p.mu.Lock()
	if !p.expand(t) {
		p.mu.Unlock()
		return p.apply(ctx, part, ev) // dropped: restored from the log
	}
	t.touched = time.Since(p.started)
	if t.listed {
		p.lru.moveToFront(t)
	}
	st := t.state
	before := st.LastSeq
	vs := st.Apply(ev)
	applied := st.LastSeq > before
	if applied && ev.Type != events.TypeSnapshotTaken {
		t.sinceSnap++
	}
	rewound := st.NeedsRefold
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
		fresh, err := st.refoldedLog(ctx, p.log, base)
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
			if p.cfg.OnApply != nil {
				p.cfg.OnApply(st, ev, applied, vs)
			}
			return nil, true
		}
		// Snapshot it at once, so that the next restore need not refold.
		st = fresh
		t.state, t.sinceSnap = st, int32(p.cfg.SnapshotEvery)
		p.mu.Unlock()
	}

	p.mu.Lock()
	var snap *Session
	if int(t.sinceSnap) >= p.cfg.SnapshotEvery {
		// Saved from this goroutine, the only one that changes the state,
		// before the partition's next event: no copy needed.
		snap = st
		t.sinceSnap = 0
	}
	var fut jetstream.PubAckFuture
	if p.cfg.Index && ctx.Err() == nil {
		if t.subject == "" {
			t.subject = ev.Subject
		}
		if att := attentionOf(st); att != t.indexed {
			// The index write holds the gate until it is stored (the
			// acker leaves it).
			if gate.Enter(ev.Tenant, ev.Session, since) {
				fut = p.putSummary(t.summary(st))
				if fut == nil {
					gate.Leave(ev.Tenant, ev.Session)
				}
			}
			if fut != nil {
				t.indexed, t.dirty = att, false
			} else {
				// Not sent (too many writes outstanding, the connection
				// down): the index loop writes it until it is stored.
				t.dirty = true
			}
		} else if applied {
			t.dirty = true
		}
	}
	p.mu.Unlock()

	p.report(ev, vs)
	if p.cfg.OnApply != nil {
		p.cfg.OnApply(st, ev, applied, vs)
	}
	if snap != nil && ctx.Err() == nil {
		if fresh := p.checked(ctx, snap); fresh != snap {
			// The state missed events: the log's fold replaces it, and
			// that is what is saved.
			p.mu.Lock()
			if p.sessions[key] == t {
				if t.state == nil { // compressed while the log was read
					t.compressed = nil
					p.nCompressed--
				}
				t.state, t.indexed, t.dirty = fresh, attention{}, true
			}
			p.mu.Unlock()
			snap = fresh
		}
		p.snapshot(ctx, snap)
	}
	return fut, true
}

// summary is the session's index row and its key: st's Summary (st is
// t's state, whole), or, for a subject that names no valid session, an
// invalid row.
func (t *tracked) summary(st *Session) indexRow {
	if validIndexKey(st.Tenant, st.Session) {
		return indexRow{key: IndexKey(int(t.partition), st.Tenant, st.Session), sum: st.Summary(int(t.partition))}
	}
	_, tenant, session, _, why := events.ParseStoredSubject(t.subject)
	return indexRow{key: invalidIndexKey(int(t.partition), t.subject),
		sum: InvalidSubjectSummary(t.subject, tenant, session, int(t.partition), st.Events, why)}
}

// indexRow is an index entry to write.
type indexRow struct {
	key string
	sum Summary
}

// putSummary publishes an index row, asynchronously; nil when it could
// not be sent. nats.go's retry on "no responders" is off: it sends a
// refused write again from a timer of its own, so an older row of a key
// could land after a newer one and stay, with success reported. A row
// not stored is written again from the state as it is then (writeRows,
// acker), which never goes back.
func (p *Projector) putSummary(r indexRow) jetstream.PubAckFuture {
	m := r.sum
	b, err := encodeState(m)
	if err != nil {
		return nil
	}
	fut, err := p.log.JetStream().PublishAsync("$KV."+IndexBucket+"."+r.key, b, jetstream.WithRetryAttempts(0))
	if err != nil {
		// Written again until it is stored (writeRows).
		p.l.Debug().Err(err).Str("session", m.Tenant+"/"+m.Session).Msg("index write not sent; written again")
		return nil
	}
	return fut
}

// indexLoop writes, every IndexEvery, the summaries that changed without
// a change the reconciler acts on (counts, times).
func (p *Projector) indexLoop(ctx context.Context) {
	defer p.wg.Done()
	tick := time.NewTicker(p.cfg.IndexEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			p.writeRows(ctx, nil)
		case <-p.indexWake:
		}
		p.reconcileSuspects()
	}
}

// suspectIndex marks partition part's index to be reconciled with the
// log by the index loop, at once (p.mu must be held), unless a reconcile
// is due later already (suspectIndexLater): that one covers this, and
// running before it would leave what a write still landing undoes.
// Ignored without an index.
func (p *Projector) suspectIndex(part int) {
	if !p.cfg.Index {
		return
	}
	if now := time.Now(); p.suspect[part].Before(now) {
		p.suspect[part] = now
	}
	select {
	case p.indexWake <- struct{}{}:
	default:
	}
}

// indexRetryDelay is how long an event whose index write was refused
// waits before it is delivered again (and its row written again).
const indexRetryDelay = 250 * time.Millisecond

// indexSettle is how long after a row's write failed or went unanswered
// its partition is reconciled: long enough for a write the client gave up
// on (no ack in time), which the stream may still store, to have landed,
// so that the reconcile sees and sets right whatever it left.
const indexSettle = 5 * time.Second

// suspectIndexLater marks partition part's index to be reconciled
// indexSettle from now, or later when a later failure pushes it on (p.mu
// must be held). Ignored without an index.
func (p *Projector) suspectIndexLater(part int) {
	if !p.cfg.Index {
		return
	}
	if at := time.Now().Add(indexSettle); at.After(p.suspect[part]) {
		p.suspect[part] = at
	}
}

// reconcileSuspects starts a ReconcileIndex of each suspect partition the
// projector still holds under a live lease, one at a time per partition,
// each on a goroutine of its own (a restore can take a while, and the
// index loop goes on writing rows meanwhile). A partition let go is no
// longer this projector's to reconcile: its next owner reconciles it when
// it takes it. A reconcile that fails, or leaves a row behind, marks the
// partition suspect again (ReconcileIndex), and it is tried again at the
// next tick.
func (p *Projector) reconcileSuspects() {
	type job struct {
		part  int
		lease context.Context
	}
	var jobs []job
	now := time.Now()
	p.mu.Lock()
	for part, from := range p.suspect {
		ps, held := p.parts[part]
		if !held || ps.lease.Err() != nil {
			delete(p.suspect, part)
			continue
		}
		if p.reconciling[part] || now.Before(from) {
			continue // marked again while it runs (it runs again after), or not yet due
		}
		delete(p.suspect, part)
		p.reconciling[part] = true
		jobs = append(jobs, job{part, ps.lease})
	}
	p.mu.Unlock()
	for _, j := range jobs {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			ctx, cancel := context.WithCancel(j.lease)
			defer cancel()
			defer context.AfterFunc(p.runCtx, cancel)()
			n, err := p.ReconcileIndex(ctx, j.part)
			switch {
			case err != nil && ctx.Err() == nil:
				p.l.Warn().Err(err).Int("partition", j.part).Msg("fleet index not reconciled with the log; tried again")
			case n > 0:
				// Rows that were wrong for a while: a write failed or went
				// unanswered, or states were dropped owing their rows.
				p.l.Warn().Int("partition", j.part).Int("rows", n).Msg("fleet index: rows found stale or missing after a failed write or a pin move, set right from the log")
			}
			p.mu.Lock()
			delete(p.reconciling, j.part)
			p.mu.Unlock()
		}()
	}
}

// writeRows writes the index rows due: the summaries of the sessions held
// that changed since their row was written, and the rows of sessions no
// longer held that were not stored (of partition part only, when part is
// not nil). A row not stored (not sent, refused, or no ack in time: a
// stream electing a leader after a node is lost) is written again on the
// next call, until it is; nothing else would write it until the session
// changes. Nothing is written for a partition whose lease ended.
func (p *Projector) writeRows(ctx context.Context, part *int) {
	since := p.cfg.Gate.Epoch()
	p.mu.Lock()
	leased := func(q int) bool {
		ps, held := p.parts[q]
		return held && ps.lease.Err() == nil
	}
	var due []indexRow
	var keys []string // the sessions' keys, by due's index
	for key, t := range p.sessions {
		if part != nil && int(t.partition) != *part {
			continue
		}
		if part == nil && !leased(int(t.partition)) {
			continue
		}
		// compressIdle leaves dirty states whole, but a state compressed
		// while its row was being written is marked dirty again when the
		// write fails (redo, indexFailed): made whole, its row is written.
		if t.dirty && p.expand(t) {
			due = append(due, t.summary(t.state))
			keys = append(keys, key)
			t.dirty = false
		}
	}
	for key, r := range p.unsent {
		if part != nil && r.sum.Partition != *part {
			continue
		}
		if part == nil && !leased(r.sum.Partition) {
			// Released, or its lease ended: its next owner reconciles
			// the index against the log when it takes the partition.
			delete(p.unsent, key)
			continue
		}
		if _, ok := p.sessions[key]; ok {
			// Held again (whole or compressed): its state is the newer,
			// and its first fold since wrote its own row.
			delete(p.unsent, key)
			continue
		}
		due = append(due, r)
		keys = append(keys, key)
		delete(p.unsent, key)
	}
	p.mu.Unlock()
	redo := func(key string, r indexRow) {
		p.mu.Lock()
		if t, ok := p.sessions[key]; ok {
			t.dirty = true
		} else if _, newer := p.unsent[key]; !newer {
			p.unsent[key] = r
		}
		p.mu.Unlock()
	}
	// In windows, so that a burst of rows (a restart, 100,000 new
	// sessions) never exceeds the writes JetStream lets be outstanding.
	for start := 0; start < len(due); start += rowWindow {
		end := min(start+rowWindow, len(due))
		p.writeWindow(ctx, due[start:end], keys[start:end], since, redo)
	}
}

// rowWindow is how many index rows writeRows has outstanding at once.
const rowWindow = 512

// writeWindow sends rows and waits for them to be stored, holding each
// session's erasure gate until then (so that an erase purges after it);
// redo takes back each row not stored.
func (p *Projector) writeWindow(ctx context.Context, rows []indexRow, keys []string, since uint64, redo func(string, indexRow)) {
	gate := p.cfg.Gate
	var sent []indexRow
	var sentKeys []string
	var futs []jetstream.PubAckFuture
	for i, r := range rows {
		m := r.sum
		if !gate.Enter(m.Tenant, m.Session, since) {
			continue // erased since the summary was taken
		}
		if fut := p.putSummary(r); fut != nil {
			sent, sentKeys, futs = append(sent, r), append(sentKeys, keys[i]), append(futs, fut)
		} else {
			gate.Leave(m.Tenant, m.Session)
			redo(keys[i], r)
		}
	}
	timer := time.NewTimer(p.cfg.AckWait / 2)
	defer timer.Stop()
	expired := false
	for i, fut := range futs {
		stored := false
		if !expired {
			select {
			case <-fut.Ok():
				stored = true
			case <-fut.Err():
			case <-timer.C:
				expired = true
			case <-ctx.Done():
				expired = true
			}
		} else {
			select {
			case <-fut.Ok():
				stored = true
			default:
			}
		}
		gate.Leave(sent[i].sum.Tenant, sent[i].sum.Session)
		if !stored {
			redo(sentKeys[i], sent[i])
			p.mu.Lock()
			p.suspectIndexLater(sent[i].sum.Partition)
			p.mu.Unlock()
		}
	}
}

// flushRows writes partition part's rows not stored yet, trying again
// while ctx allows (a partition being released).
func (p *Projector) flushRows(ctx context.Context, part int) {
	for try := 0; try < 5 && ctx.Err() == nil; try++ {
		p.writeRows(ctx, &part)
		p.mu.Lock()
		left := 0
		for _, t := range p.sessions {
			if int(t.partition) == part && t.dirty {
				left++
			}
		}
		for _, r := range p.unsent {
			if r.sum.Partition == part {
				left++
			}
		}
		p.mu.Unlock()
		if left == 0 {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// NewSessionsFast is how many sessions the projector folded from an
// empty state because their first event was the one it received (no
// snapshot looked up, no log read).
func (p *Projector) NewSessionsFast() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.newFast
}

// report logs the violations ev gave rise to and passes them to OnAnomaly.
func (p *Projector) report(ev events.Event, vs []Violation) {
	for _, v := range vs {
		p.l.Warn().Str("tenant", ev.Tenant).Str("session", ev.Session).Uint64("seq", v.Seq).
			Str("rule", string(v.Rule)).Str("tool_use_id", v.ToolUseID).Msg(v.Detail)
		if p.cfg.OnAnomaly != nil {
			p.cfg.OnAnomaly(Anomaly{Tenant: ev.Tenant, Session: ev.Session, Violation: v})
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

// evictLoop lets idle states go (IdleEvict) and compresses the idle ones
// it keeps (CompressAfter).
func (p *Projector) evictLoop(ctx context.Context) {
	defer p.wg.Done()
	every := p.cfg.IdleEvict / 4
	if p.cfg.CompressAfter > 0 {
		every = min(every, max(p.cfg.CompressAfter/2, 10*time.Millisecond))
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			p.evict(ctx, now)
			if p.cfg.CompressAfter > 0 {
				p.compressIdle(now)
			}
		}
	}
}

// compressBatch is how many states compressIdle looks at per hold of p.mu.
const compressBatch = 64

// compressIdle holds in compressed form the states of the sessions with no
// turn in flight that have had no event for CompressAfter, least recently
// active first. It holds p.mu for compressBatch states at a time, so the
// partitions' folds go on between.
func (p *Projector) compressIdle(now time.Time) {
	p.mu.Lock()
	t := p.lru.back()
	p.mu.Unlock()
	for t != nil {
		p.mu.Lock()
		for n := 0; t != nil && n < compressBatch; n++ {
			if !t.listed { // dropped meanwhile: start again next tick
				p.mu.Unlock()
				return
			}
			if p.idleFor(now, t) < p.cfg.CompressAfter {
				p.mu.Unlock()
				return // the rest are more recent
			}
			next := t.prev
			s := t.state
			if s != nil && len(s.InFlight) == 0 && !s.NeedsRefold && !t.dirty {
				if c, err := compressState(s); err == nil {
					t.state, t.compressed = nil, c
					p.nCompressed++
				}
			}
			t = next
		}
		p.mu.Unlock()
	}
}

func (p *Projector) evict(_ context.Context, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for t := p.lru.back(); t != nil; {
		if p.idleFor(now, t) < p.cfg.IdleEvict {
			return // the rest are more recent
		}
		prev := t.prev
		p.retire(t)
		t = prev
	}
}

// Forget drops from memory the state of every session that covers
// reports (an erase of them began: the engine passes its scope's Covers)
// and returns how many it dropped. A snapshot or index entry is never
// written from a dropped state; the next event of such a session restores
// it from the log, as after an eviction.
func (p *Projector) Forget(covers func(tenant, session string) bool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, t := range p.sessions {
		if covers(t.tenant, t.session) {
			p.drop(t)
			n++
		}
	}
	for key, r := range p.unsent {
		if covers(r.sum.Tenant, r.sum.Session) {
			delete(p.unsent, key)
		}
	}
	return n
}

func (p *Projector) forgetKey(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := p.sessions[key]; ok {
		p.drop(t)
	}
}

// retire forgets a session's state to make room or because it is idle,
// keeping its index row to write when the last one was not stored; p.mu
// must be held.
func (p *Projector) retire(t *tracked) {
	if p.cfg.Index && t.dirty && p.expand(t) {
		p.unsent[t.key] = t.summary(t.state)
	}
	p.drop(t)
}

// drop forgets a session's state; p.mu must be held.
func (p *Projector) drop(t *tracked) {
	if t.state == nil && p.sessions[t.key] == t {
		p.nCompressed--
	}
	delete(p.sessions, t.key)
	p.lru.remove(t)
}

// idleFor is how long t has had no event, at now.
func (p *Projector) idleFor(now time.Time, t *tracked) time.Duration {
	return now.Sub(p.started) - t.touched
}

// Held is how many session states the projector holds in memory.
func (p *Projector) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sessions)
}
