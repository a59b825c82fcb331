// Package pgroup is a partitioned consumer group on NATS JetStream: the
// members of a group (Turnstone's engines, or its recovery workers) share
// a fixed number of partitions, and at most one member acts on a
// partition at any time.
//
// Everything lives in one KV bucket (default turnstone_members, history
// 1, entries kept 3 × TTL after their last write):
//
//   - <group>.<member>: the member's Record, rewritten every Heartbeat. It
//     says who is alive (for the assignment) and what the member acts on.
//   - <group>.claim.<p>: the claim on partition p: who holds it. A claim
//     is a lease: its holder rewrites it every Heartbeat, each write
//     conditional on the revision it wrote before (KV Update, JetStream's
//     expected last subject sequence), and acts on p only while its last
//     acknowledged write was sent less than FenceAfter ago, on its own
//     clock.
//
// The assignment is deterministic (Assign: rendezvous hashing with
// balanced loads over the live members, a member being live while the
// revision of its record changes within TTL), so members agree without a
// leader. A member takes a partition the assignment gives it by writing
// its claim, conditionally: a claim that does not exist (Create), or one
// whose revision this member has watched stay the same for TTL on its own
// clock (Update on that revision). Two takers cannot both succeed: the
// write is a compare-and-set at the stream's leader, so the claim's
// revision is a fencing token. A member that loses a partition in the
// assignment lets it go (OnRelease), writes its record without it, then
// deletes the claim; a member whose claim writes fail stops acting on the
// partition when its lease runs out (FenceAfter after the last write that
// was acknowledged), before anyone may take it (TTL after the last write
// anyone saw). docs/scaling.md states the invariant and its bound.
//
// Nothing a member concludes rests on another process's clock, or on a
// read: a member that cannot read the bucket (a stream leader election)
// sees no revision change and concludes nothing for TTL after its own
// writes work again, and a take-over decided on a stale read is refused
// by the conditional write.
//
// The bound: a dead member's partitions are taken within TTL plus one
// Heartbeat after the last claim write the taker saw (6 s with the
// defaults), and the taker's record shows them within one more (7 s); a
// partition moving between live members (one joins or leaves) moves within
// a Heartbeat or so. cmd/bench's handover figure measures it.
//
// It is the pattern of Synadia's orbit.go/pcgroups (served at v0.2.2),
// written here on nats.go's jetstream package because pcgroups has no
// heartbeat rebalance: its membership is a list of member names in the
// group's KV configuration, fixed at creation (static groups) or changed
// by an administrator's add and drop (elastic groups). A member that
// dies keeps its partitions until someone drops it, and only another
// instance of the same member name takes them over. Turnstone's engines
// and workers join by starting and must lose a dead member's partitions
// within a bound, unattended; elastic groups also copy the stream into a
// work-queue stream, a second copy of every event the log does not need.
// Turnstone adds leases and fencing tokens in the KV bucket to it.
package pgroup

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// Defaults of Config.
const (
	DefaultBucket    = "turnstone_members"
	DefaultHeartbeat = time.Second
	DefaultTTL       = 5 * time.Second
)

// Errors of the package. Match them with errors.Is.
var (
	// ErrInvalidConfig wraps every rule a Config breaks.
	ErrInvalidConfig = errors.New("invalid partition group config")
	// ErrNoBucket: the membership bucket does not exist and the member
	// may not create it (Config.CreateBucket false; an operator sets it
	// up).
	ErrNoBucket = errors.New("membership bucket missing")
)

// Config configures a member of a partition group.
type Config struct {
	// Group names the group ("engines", "workers"): a KV key token
	// ([A-Za-z0-9_-]).
	Group string
	// Member names this member, unique in the group: a KV key token.
	// Default "<hostname>-<pid>-<4 random hex>".
	Member string
	// Partitions is how many partitions the group shares (the event
	// log's partition count). Required.
	Partitions int
	// Bucket is the KV bucket of records and claims. Default
	// "turnstone_members".
	Bucket string
	// Heartbeat is how often the member writes its record and its
	// claims, and recomputes the assignment. Default 1 s.
	Heartbeat time.Duration
	// TTL is how long a record or a claim must keep its revision, as this
	// member watches it, before the member counts its writer dead (and
	// may take the claim). Default 5 s; at least 3 heartbeats.
	TTL time.Duration
	// FenceAfter is how long after the last acknowledged write of a claim
	// (its send time, on this member's clock) the member stops acting on
	// the partition if no later write was acknowledged. Default two
	// thirds of TTL; shorter than TTL. TTL − FenceAfter is the margin for
	// the two clocks' rates and for a write sent before the fence landing
	// after it.
	FenceAfter time.Duration
	// CreateBucket lets the member create the bucket when it is missing
	// (with Replicas replicas). Under auth an operator creates it and
	// members only use it.
	CreateBucket bool
	Replicas     int
	// Info is shown with the member by List (kind, version, addresses).
	Info map[string]string
	// OnAcquire is called, on the member's goroutine, when the member
	// took partition p's claim. ctx is the lease: it is done the moment
	// the member must stop acting on p (the lease ran out, the claim was
	// lost, the partition is released), so every action on p runs under
	// it or checks it first. An error is logged, the claim let go, and
	// the partition tried again on the next heartbeat.
	OnAcquire func(ctx context.Context, p int, lease Lease) error
	// OnRelease is called, on the member's goroutine, when the member no
	// longer holds partition p: fenced true when the lease ended on its
	// own (not renewed in time, or the claim was lost), after the lease's
	// context is done, so the callback must stop at once and must not
	// touch p again (no acknowledgement, no unpin: another member may
	// hold it); fenced false when the member lets p go (the assignment
	// moved it, or it leaves) while the lease still holds: it may finish
	// what it received and hand the partition over (unpin). It must stop
	// consuming p before it returns.
	OnRelease func(ctx context.Context, p int, fenced bool)
}

// Lease is what a member holds a partition by (Config.OnAcquire).
type Lease struct {
	// Token is the claim's revision when the member took it: a fencing
	// token, larger for every later holder of the partition.
	Token uint64
	// TakenOver says the claim was taken from a holder whose lease had
	// run out (it died, or could not write): the partition's consumer may
	// still be pinned to it and hold its deliveries, so the new holder
	// should unpin it and deliver again what it left unacknowledged.
	TakenOver bool
}

func (c *Config) setDefaults() {
	if c.Member == "" {
		c.Member = MemberName()
	}
	if c.Bucket == "" {
		c.Bucket = DefaultBucket
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.FenceAfter == 0 {
		c.FenceAfter = c.TTL * 2 / 3
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
}

// Validate reports every rule the config breaks, joined; each wraps
// ErrInvalidConfig.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, a...)))
	}
	if !validToken(c.Group) {
		bad("group: %q is not a token of [A-Za-z0-9_-]", c.Group)
	}
	if c.Member != "" && !validToken(c.Member) {
		bad("member: %q is not a token of [A-Za-z0-9_-]", c.Member)
	}
	if c.Partitions < 1 {
		bad("partitions: must be at least 1, got %d", c.Partitions)
	}
	if c.Heartbeat < 0 || c.TTL < 0 || c.FenceAfter < 0 {
		bad("heartbeat, ttl, fence after: must not be negative")
	}
	hb, ttl := c.Heartbeat, c.TTL
	if hb == 0 {
		hb = DefaultHeartbeat
	}
	if ttl == 0 {
		ttl = DefaultTTL
	}
	if ttl < 3*hb {
		bad("ttl: must be at least 3 heartbeats (%s), got %s", 3*hb, ttl)
	}
	if c.FenceAfter != 0 && c.FenceAfter >= ttl {
		bad("fence after: must be shorter than ttl (%s), got %s", ttl, c.FenceAfter)
	}
	if c.FenceAfter != 0 && c.FenceAfter < hb {
		bad("fence after: must be at least one heartbeat (%s), got %s", hb, c.FenceAfter)
	}
	return errors.Join(errs...)
}

// Record is what a member's record holds: who it is, the partitions it
// acts on when it wrote it, its incarnation (new at every Join), and when
// it started and wrote it (its own clock).
type Record struct {
	Group       string            `json:"group"`
	Member      string            `json:"member"`
	Partitions  []int             `json:"partitions"`
	Started     time.Time         `json:"started"`
	Beat        time.Time         `json:"beat"`
	Incarnation string            `json:"incarnation,omitempty"`
	Info        map[string]string `json:"info,omitempty"`
}

// Claim is what a claim on a partition holds: its holder and the
// holder's incarnation, and when the holder took it (its own clock).
type Claim struct {
	Group       string    `json:"group"`
	Partition   int       `json:"partition"`
	Member      string    `json:"member"`
	Incarnation string    `json:"incarnation"`
	Since       time.Time `json:"since"`
}

// claimToken is the middle token of a claim's key: <group>.claim.<p>.
const claimToken = "claim"

// ClaimKey is the key of partition p's claim in group.
func ClaimKey(group string, p int) string {
	return group + "." + claimToken + "." + strconv.Itoa(p)
}

// Member is one member of a partition group. Create it with Join; Leave
// releases its partitions and removes it.
type Member struct {
	kv  jetstream.KeyValue
	cfg Config
	l   zerolog.Logger
	inc string

	// beatMu serialises the writes of the record.
	beatMu sync.Mutex

	mu       sync.Mutex
	recRev   uint64              // the record's revision as this member last wrote it
	lastBeat time.Time           // send time of the last acknowledged record write
	grace    time.Time           // nothing is counted dead on what was seen before this
	members  map[string]observed // the others' records
	claims   map[int]*claimSeen  // the claims, as last seen
	held     map[int]*hold
	fenced   bool // the record's writes fail past FenceAfter (logged once)
	started  time.Time
	changes  int
	assigned []string

	kick   chan struct{} // a lease ended, or the watch saw something to act on
	cancel context.CancelFunc
	done   chan struct{}
	wg     sync.WaitGroup
}

// observed is a record or claim revision and when this member first saw
// it (its own clock).
type observed struct {
	rev   uint64
	since time.Time
}

// claimSeen is a claim as this member last saw it.
type claimSeen struct {
	observed
	holder, inc string
	absent      bool // deleted, or never written
}

// hold is a claim this member holds, and the lease it gives.
type hold struct {
	rev     uint64    // the claim's revision as this member last wrote it
	token   uint64    // its revision when taken
	renewed time.Time // send time of the last acknowledged write
	ctx     context.Context
	cancel  context.CancelFunc
	timer   *time.Timer // ends the lease FenceAfter after renewed
}

// live reports whether the lease holds now.
func (h *hold) live(now time.Time, fence time.Duration) bool {
	return h.ctx.Err() == nil && now.Sub(h.renewed) < fence
}

// Join writes the member's record, starts watching the group, takes the
// partitions the assignment gives it whose claims are free (OnAcquire)
// before it returns, and then keeps writing its record and claims and
// rebalancing on goroutines it owns until Leave. Partitions whose claims
// are held by members unheard of (a restart under the same name counts:
// it is a new incarnation) are taken once their claims have kept their
// revision for TTL. Errors: a Config that fails Validate; ErrNoBucket;
// JetStream's.
func Join(ctx context.Context, js jetstream.JetStream, cfg Config, logger *zerolog.Logger) (*Member, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("join partition group: %w", err)
	}
	cfg.setDefaults()
	kv, err := OpenBucket(ctx, js, cfg.Bucket, cfg.CreateBucket, cfg.Replicas, cfg.TTL)
	if err != nil {
		return nil, fmt.Errorf("join partition group %s: %w", cfg.Group, err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	now := time.Now()
	m := &Member{kv: kv, cfg: cfg, l: zerolog.Nop(), inc: hex.EncodeToString(b[:]), members: map[string]observed{},
		claims: map[int]*claimSeen{}, held: map[int]*hold{}, started: now.UTC(), grace: now,
		kick: make(chan struct{}, 1), done: make(chan struct{})}
	if logger != nil {
		m.l = logger.With().Str("component", "pgroup").Str("group", cfg.Group).Str("member", cfg.Member).Logger()
	}
	if err := m.beat(ctx); err != nil {
		return nil, fmt.Errorf("join partition group %s: %w", cfg.Group, err)
	}
	w, err := kv.Watch(ctx, cfg.Group+".>")
	if err != nil {
		return nil, fmt.Errorf("join partition group %s: watch: %w", cfg.Group, err)
	}
	// The initial values, up to the marker that ends them.
	for e := range w.Updates() {
		if e == nil {
			break
		}
		m.observe(e)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	m.wg.Add(2)
	go m.keep(runCtx) // the leases taken next are kept while Join takes the others
	m.rebalance(ctx)
	go m.run(runCtx, w)
	go func() { m.wg.Wait(); close(m.done) }()
	m.l.Info().Ints("partitions", m.Owned()).Str("incarnation", m.inc).Msg("joined")
	return m, nil
}

// OpenBucket returns the membership KV bucket, creating it when create is
// set (history 1, entries kept 3 × ttl after their last write, so a dead
// member's record and claims go away by themselves).
func OpenBucket(ctx context.Context, js jetstream.JetStream, bucket string, create bool, replicas int, ttl time.Duration) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if err == nil {
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("bucket %s: %w", bucket, err)
	}
	if !create {
		return nil, fmt.Errorf("%w: %s (an operator creates it: engine setup)", ErrNoBucket, bucket)
	}
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	kv, err = js.CreateKeyValue(ctx, BucketConfig(bucket, replicas, ttl))
	if errors.Is(err, jetstream.ErrBucketExists) {
		return js.KeyValue(ctx, bucket)
	}
	if err != nil {
		return nil, fmt.Errorf("create bucket %s: %w", bucket, err)
	}
	return kv, nil
}

// BucketConfig is the membership bucket's configuration.
func BucketConfig(bucket string, replicas int, ttl time.Duration) jetstream.KeyValueConfig {
	if replicas < 1 {
		replicas = 1
	}
	return jetstream.KeyValueConfig{
		Bucket:      bucket,
		Description: "Turnstone partition group members (records and partition claims)",
		History:     1,
		TTL:         3 * ttl,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		MaxBytes:    64 << 20,
	}
}

// Name is the member's name.
func (m *Member) Name() string { return m.cfg.Member }

// Owned returns the partitions the member acts on now (their leases
// hold), in order.
func (m *Member) Owned() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ownedLocked(time.Now())
}

func (m *Member) ownedLocked(now time.Time) []int {
	out := []int{}
	for p, h := range m.held {
		if h.live(now, m.cfg.FenceAfter) {
			out = append(out, p)
		}
	}
	sort.Ints(out)
	return out
}

// Owns reports whether the member may act on partition p now: it holds
// p's claim and the lease has not run out, on this member's clock, at
// this instant.
func (m *Member) Owns(p int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	h, ok := m.held[p]
	return ok && h.live(time.Now(), m.cfg.FenceAfter)
}

// Token returns the fencing token of the member's lease on partition p
// (Lease.Token) and whether it holds p now.
func (m *Member) Token(p int) (uint64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h, ok := m.held[p]
	if !ok || !h.live(time.Now(), m.cfg.FenceAfter) {
		return 0, false
	}
	return h.token, true
}

// Members returns the live members as this member sees them, sorted.
func (m *Member) Members() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.liveLocked(time.Now())
}

// Rebalances is how many times the member's set of partitions changed.
func (m *Member) Rebalances() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changes
}

// Leave releases every partition (OnRelease), deletes the member's record
// and claims so the others take them at once, and stops its goroutines.
func (m *Member) Leave(ctx context.Context) error {
	if m.cancel != nil {
		m.cancel()
		select {
		case <-m.done:
		case <-ctx.Done():
			return fmt.Errorf("leave partition group: %w", ctx.Err())
		}
	}
	revs := m.letGo(ctx, m.heldPartitions())
	// The record first, so that no record names a partition once its
	// claim is free.
	if err := m.kv.Delete(ctx, m.key()); err != nil {
		return fmt.Errorf("leave partition group: %w", err)
	}
	m.deleteClaims(ctx, revs)
	m.l.Info().Msg("left")
	return nil
}

func (m *Member) key() string { return m.cfg.Group + "." + m.cfg.Member }

// keep writes the member's record and renews its claims every Heartbeat,
// on a goroutine of its own, so that nothing the member's callbacks do
// delays a lease.
func (m *Member) keep(ctx context.Context) {
	defer m.wg.Done()
	tick := time.NewTicker(m.cfg.Heartbeat)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		err := m.beat(ctx)
		if err != nil && ctx.Err() == nil {
			m.l.Warn().Err(err).Msg("record not written")
		}
		m.mu.Lock()
		writing := time.Since(m.lastBeat) < m.cfg.FenceAfter
		if writing != !m.fenced {
			m.fenced = !writing
			if m.fenced {
				m.l.Warn().Dur("since_last_write", time.Since(m.lastBeat)).Msg("fenced: the record cannot be written; claims are no longer renewed")
			} else {
				m.l.Info().Msg("the record is written again")
			}
		}
		m.mu.Unlock()
		if writing {
			// A member whose record cannot be written lets its claims run
			// out too: the others count it dead, and may then take them.
			m.renew(ctx)
		}
		m.wake()
	}
}

// wake asks the member's goroutine to look at the group again.
func (m *Member) wake() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// beat writes the member's record, conditional on the revision it wrote
// last; a record changed by anyone else is taken back (a new incarnation
// of the same name, or the bucket's TTL removed it).
func (m *Member) beat(ctx context.Context) error {
	m.beatMu.Lock()
	defer m.beatMu.Unlock()
	send := time.Now()
	m.mu.Lock()
	rec := Record{Group: m.cfg.Group, Member: m.cfg.Member, Partitions: m.ownedLocked(send), Started: m.started,
		Beat: send.UTC(), Incarnation: m.inc, Info: m.cfg.Info}
	rev := m.recRev
	m.mu.Unlock()
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("heartbeat record: %w", err)
	}
	bctx, cancel := context.WithTimeout(ctx, m.cfg.Heartbeat)
	defer cancel()
	var nrev uint64
	if rev == 0 {
		nrev, err = m.kv.Create(bctx, m.key(), b)
		if errors.Is(err, jetstream.ErrKeyExists) {
			nrev, err = m.takeBack(bctx, b)
		}
	} else {
		nrev, err = m.kv.Update(bctx, m.key(), b, rev)
		if casFailed(err) {
			nrev, err = m.takeBack(bctx, b)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		// Nothing seen from now on counts before this member can write
		// again: it concludes nothing about the others from a silence
		// that may be its own.
		m.grace = time.Now()
		return err
	}
	m.recRev, m.lastBeat = nrev, send
	return nil
}

// takeBack writes the record over whatever holds its key now: the
// member's own earlier write whose acknowledgement was lost, a previous
// incarnation of the same name, or nothing (the bucket's TTL removed it).
func (m *Member) takeBack(ctx context.Context, b []byte) (uint64, error) {
	e, err := m.kv.Get(ctx, m.key())
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return m.kv.Create(ctx, m.key(), b)
	}
	if err != nil {
		return 0, err
	}
	var r Record
	if json.Unmarshal(e.Value(), &r) == nil && r.Incarnation != "" && r.Incarnation != m.inc && time.Since(m.started) > m.cfg.TTL {
		m.l.Error().Str("other_incarnation", r.Incarnation).Msg("another process writes this member's record: two members share the name " + m.cfg.Member)
	}
	return m.kv.Update(ctx, m.key(), b, e.Revision())
}

// renew rewrites each claim the member holds, conditional on the revision
// it wrote last, all at once; each acknowledged write extends its lease
// from the write's send time. A claim found changed by another member is
// lost: its lease ends at once.
func (m *Member) renew(ctx context.Context) {
	m.mu.Lock()
	type job struct {
		p   int
		h   *hold
		rev uint64
	}
	var jobs []job
	for p, h := range m.held {
		if h.ctx.Err() == nil {
			jobs = append(jobs, job{p, h, h.rev})
		}
	}
	m.mu.Unlock()
	if len(jobs) == 0 {
		return
	}
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			send := time.Now()
			rctx, cancel := context.WithTimeout(ctx, m.cfg.Heartbeat)
			defer cancel()
			v, err := m.claimValue(j.p)
			if err != nil {
				return // the lease runs out by itself
			}
			rev, err := m.kv.Update(rctx, ClaimKey(m.cfg.Group, j.p), v, j.rev)
			if err == nil {
				m.extend(j.h, rev, send)
				return
			}
			if !casFailed(err) {
				return // the lease runs out by itself unless a later write works
			}
			// Written by someone else since: ours only if it is our own
			// write whose acknowledgement was lost.
			e, gerr := m.kv.Get(rctx, ClaimKey(m.cfg.Group, j.p))
			if gerr == nil {
				var c Claim
				if json.Unmarshal(e.Value(), &c) == nil && c.Member == m.cfg.Member && c.Incarnation == m.inc {
					m.mu.Lock()
					j.h.rev = e.Revision() // no extension: its send time is unknown
					m.mu.Unlock()
					return
				}
			}
			if gerr == nil || errors.Is(gerr, jetstream.ErrKeyNotFound) {
				m.l.Warn().Int("partition", j.p).Msg("claim lost: another member holds it; stopping at once")
				j.h.cancel()
			}
		}()
	}
	wg.Wait()
}

// extend records an acknowledged write of a held claim sent at send.
func (m *Member) extend(h *hold, rev uint64, send time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h.rev = rev
	if h.ctx.Err() != nil || send.Before(h.renewed) {
		return // the lease ended already: the partition is taken anew
	}
	h.renewed = send
	h.timer.Reset(m.cfg.FenceAfter - time.Since(send))
}

// claimValue is partition p's Claim held by this member, encoded.
// Errors: the encoder's (a Claim of strings, an int and the time now
// always encodes).
func (m *Member) claimValue(p int) ([]byte, error) {
	return json.Marshal(Claim{Group: m.cfg.Group, Partition: p, Member: m.cfg.Member, Incarnation: m.inc, Since: time.Now().UTC()})
}

func (m *Member) run(ctx context.Context, w jetstream.KeyWatcher) {
	defer m.wg.Done()
	defer func() {
		if w != nil {
			stopWatch(w)
		}
	}()
	tick := time.NewTicker(m.cfg.Heartbeat)
	defer tick.Stop()
	updates := w.Updates()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-updates:
			if !ok {
				updates, w = nil, nil // lost (the connection closed): watched again on a tick
				m.mu.Lock()
				m.grace = time.Now()
				m.mu.Unlock()
				continue
			}
			if e != nil && m.observe(e) {
				m.reap(ctx)
				m.rebalance(ctx)
			}
		case <-m.kick:
			m.reap(ctx)
		case <-tick.C:
			if w == nil {
				// Unwatched, it sees no revision change: it counts nobody
				// dead until it watches again.
				m.mu.Lock()
				m.grace = time.Now()
				m.mu.Unlock()
				if nw, err := m.kv.Watch(ctx, m.cfg.Group+".>"); err == nil {
					w, updates = nw, nw.Updates()
				}
			}
			m.reap(ctx)
			m.rebalance(ctx)
		}
	}
}

// observe records a KV update of the group; it reports whether it may
// change what the member should do (a member came or went, a claim was
// let go or changed hands).
func (m *Member) observe(e jetstream.KeyValueEntry) bool {
	rest, ok := strings.CutPrefix(e.Key(), m.cfg.Group+".")
	if !ok {
		return false
	}
	gone := e.Operation() == jetstream.KeyValueDelete || e.Operation() == jetstream.KeyValuePurge
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if ps, isClaim := strings.CutPrefix(rest, claimToken+"."); isClaim {
		p, err := strconv.Atoi(ps)
		if err != nil || p < 0 || p >= m.cfg.Partitions {
			return false
		}
		prev := m.claims[p]
		if gone {
			m.claims[p] = &claimSeen{observed: observed{rev: e.Revision(), since: now}, absent: true}
			return prev == nil || !prev.absent
		}
		if prev != nil && !prev.absent && prev.rev == e.Revision() {
			return false
		}
		c := m.decodeClaim(p, e)
		m.claims[p] = &claimSeen{observed: observed{rev: e.Revision(), since: now}, holder: c.Member, inc: c.Incarnation}
		return prev == nil || prev.absent || prev.holder != c.Member || prev.inc != c.Incarnation
	}
	if strings.Contains(rest, ".") || rest == m.cfg.Member {
		return false
	}
	prev, known := m.members[rest]
	if gone {
		delete(m.members, rest)
		return known
	}
	if known && prev.rev == e.Revision() {
		return false
	}
	m.members[rest] = observed{rev: e.Revision(), since: now}
	// A member unheard for TTL that writes again is live again.
	return !known || now.Sub(maxTime(prev.since, m.grace)) > m.cfg.TTL
}

// liveLocked returns the live members, sorted; m.mu must be held. A
// member is live while the revision of its record last changed within
// TTL, as this member saw it, counting nothing seen before its own
// writes last failed.
func (m *Member) liveLocked(now time.Time) []string {
	live := []string{m.cfg.Member}
	for name, o := range m.members {
		if now.Sub(maxTime(o.since, m.grace)) <= m.cfg.TTL {
			live = append(live, name)
		}
	}
	sort.Strings(live)
	return live
}

// reap hands the partitions whose leases ended on their own to OnRelease
// (fenced), so the callbacks stop what they were doing; the claims stay
// this member's in the bucket until someone takes them.
func (m *Member) reap(ctx context.Context) {
	m.mu.Lock()
	var ended []int
	for p, h := range m.held {
		if h.ctx.Err() != nil {
			ended = append(ended, p)
			delete(m.held, p)
			m.changes++
		}
	}
	m.mu.Unlock()
	sort.Ints(ended)
	for _, p := range ended {
		m.l.Warn().Int("partition", p).Msg("lease ended: stopped acting on the partition")
		if m.cfg.OnRelease != nil {
			rctx, cancel := context.WithTimeout(ctx, m.cfg.TTL)
			m.cfg.OnRelease(rctx, p, true)
			cancel()
		}
	}
}

// rebalance computes the assignment over the live members, lets go of the
// partitions it no longer gives this member and takes those it does.
func (m *Member) rebalance(ctx context.Context) {
	now := time.Now()
	m.mu.Lock()
	for name, o := range m.members {
		if now.Sub(maxTime(o.since, m.grace)) > 3*m.cfg.TTL {
			delete(m.members, name) // long gone; its record has expired
		}
	}
	live := m.liveLocked(now)
	owner := Assign(m.cfg.Group, live, m.cfg.Partitions)
	if !slices.Equal(owner, m.assigned) && m.assigned != nil {
		m.l.Debug().Strs("live", live).Msg("assignment changed")
	}
	m.assigned = owner
	writing := now.Sub(m.lastBeat) < m.cfg.FenceAfter
	var lose, gain []int
	for p := range m.held {
		if p >= len(owner) || owner[p] != m.cfg.Member {
			lose = append(lose, p)
		}
	}
	if writing {
		for p, o := range owner {
			if _, ok := m.held[p]; !ok && o == m.cfg.Member {
				gain = append(gain, p)
			}
		}
	}
	m.mu.Unlock()
	if len(lose) > 0 {
		sort.Ints(lose)
		revs := m.letGo(ctx, lose)
		// The record without them first, so that no record names a
		// partition once its claim is free; if it cannot be written the
		// claims run out instead.
		if err := m.beat(ctx); err == nil {
			m.deleteClaims(ctx, revs)
		}
	}
	for _, p := range gain {
		m.take(ctx, p)
	}
}

func (m *Member) heldPartitions() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]int, 0, len(m.held))
	for p := range m.held {
		out = append(out, p)
	}
	sort.Ints(out)
	return out
}

// letGo releases partitions while their leases hold (OnRelease, not
// fenced), then ends the leases; it returns the claims' revisions, for
// deleteClaims.
func (m *Member) letGo(ctx context.Context, ps []int) map[int]uint64 {
	revs := map[int]uint64{}
	for _, p := range ps {
		m.mu.Lock()
		h, ok := m.held[p]
		m.mu.Unlock()
		if !ok {
			continue
		}
		fenced := h.ctx.Err() != nil
		if m.cfg.OnRelease != nil {
			rctx, cancel := context.WithTimeout(ctx, m.cfg.TTL)
			m.cfg.OnRelease(rctx, p, fenced)
			cancel()
		}
		m.mu.Lock()
		h.cancel()
		h.timer.Stop()
		delete(m.held, p)
		m.changes++
		if !fenced {
			revs[p] = h.rev
		}
		m.mu.Unlock()
		m.l.Info().Int("partition", p).Msg("released")
	}
	return revs
}

// deleteClaims deletes claims the member let go, each conditional on the
// revision it wrote last. The deletes share one deadline, TTL: a claim
// not deleted by then has run out anyway, and the others take it as they
// take a dead member's. (A deadline of one Heartbeat per delete let a
// server slowed for 200 ms turn a Leave's hand-over into a TTL's wait.)
func (m *Member) deleteClaims(ctx context.Context, revs map[int]uint64) {
	dctx, cancel := context.WithTimeout(ctx, m.cfg.TTL)
	defer cancel()
	for p, rev := range revs {
		key := ClaimKey(m.cfg.Group, p)
		err := m.kv.Delete(dctx, key, jetstream.LastRevision(rev))
		if err != nil {
			// A renewal the member gave up waiting for (its context ended
			// as it left) may still have been stored: the claim is then at
			// a later revision than the one remembered. Still this
			// incarnation's, it is deleted at that revision.
			if e, gerr := m.kv.Get(dctx, key); gerr == nil {
				var c Claim
				if json.Unmarshal(e.Value(), &c) == nil && c.Member == m.cfg.Member && c.Incarnation == m.inc {
					err = m.kv.Delete(dctx, key, jetstream.LastRevision(e.Revision()))
				}
			}
		}
		if err != nil {
			m.l.Warn().Err(err).Int("partition", p).Msg("claim not deleted; it runs out after the TTL")
		}
	}
}

// take tries to take partition p's claim: one that is free, this
// incarnation's own (its lease ran out and nobody took it), or one whose
// revision has stayed the same for TTL as this member watched it. The
// write is conditional: of two members trying at once, one wins.
func (m *Member) take(ctx context.Context, p int) {
	now := time.Now()
	m.mu.Lock()
	c := m.claims[p]
	grace := m.grace
	m.mu.Unlock()
	key := ClaimKey(m.cfg.Group, p)
	tctx, cancel := context.WithTimeout(ctx, m.cfg.Heartbeat)
	defer cancel()
	send := time.Now()
	v, err := m.claimValue(p)
	if err != nil {
		m.l.Warn().Err(err).Int("partition", p).Msg("claim not encoded; tried again on the next heartbeat")
		return
	}
	var rev uint64
	takenOver := false
	switch {
	case c == nil || c.absent:
		rev, err = m.kv.Create(tctx, key, v)
	case c.holder == m.cfg.Member && c.inc == m.inc:
		rev, err = m.kv.Update(tctx, key, v, c.rev)
	case now.Sub(maxTime(c.since, grace)) > m.cfg.TTL:
		rev, err = m.kv.Update(tctx, key, v, c.rev)
		takenOver = true
	default:
		return // held by a live member: it lets go, or its lease runs out
	}
	if err != nil {
		if casFailed(err) || errors.Is(err, jetstream.ErrKeyExists) {
			m.refresh(tctx, p)
		} else {
			m.l.Debug().Err(err).Int("partition", p).Msg("claim not written; tried again on the next heartbeat")
		}
		return
	}
	hctx, hcancel := context.WithCancel(context.Background())
	h := &hold{rev: rev, token: rev, renewed: send, ctx: hctx, cancel: hcancel}
	h.timer = time.AfterFunc(m.cfg.FenceAfter-time.Since(send), func() {
		hcancel()
		m.wake()
	})
	m.mu.Lock()
	m.held[p] = h
	m.claims[p] = &claimSeen{observed: observed{rev: rev, since: time.Now()}, holder: m.cfg.Member, inc: m.inc}
	m.changes++
	m.mu.Unlock()
	if m.cfg.OnAcquire != nil {
		if err := m.cfg.OnAcquire(hctx, p, Lease{Token: rev, TakenOver: takenOver}); err != nil {
			m.l.Warn().Err(err).Int("partition", p).Msg("acquire failed; retried on the next heartbeat")
			m.mu.Lock()
			hcancel()
			h.timer.Stop()
			delete(m.held, p)
			rev := h.rev
			m.mu.Unlock()
			m.deleteClaims(ctx, map[int]uint64{p: rev})
			return
		}
	}
	m.l.Info().Int("partition", p).Uint64("token", rev).Bool("taken_over", takenOver).Msg("acquired")
}

// refresh reads partition p's claim after a conditional write of it
// failed: what the watch showed was not current.
func (m *Member) refresh(ctx context.Context, p int) {
	e, err := m.kv.Get(ctx, ClaimKey(m.cfg.Group, p))
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		m.claims[p] = &claimSeen{observed: observed{since: now}, absent: true}
	case err == nil:
		if prev := m.claims[p]; prev != nil && !prev.absent && prev.rev == e.Revision() {
			return
		}
		c := m.decodeClaim(p, e)
		m.claims[p] = &claimSeen{observed: observed{rev: e.Revision(), since: now}, holder: c.Member, inc: c.Incarnation}
	}
}

// decodeClaim decodes the claim entry e of partition p. An entry that
// does not decode (written by something other than a member) is logged
// and read as held by no live member: nothing renews it, so a member
// takes it over once it has gone unchanged for Config.TTL, as it takes
// over a dead member's claim, and none takes the partition before.
func (m *Member) decodeClaim(p int, e jetstream.KeyValueEntry) Claim {
	var c Claim
	if err := json.Unmarshal(e.Value(), &c); err != nil {
		m.l.Warn().Err(err).Int("partition", p).Uint64("revision", e.Revision()).
			Msg("a claim that does not decode: taken over once it has gone unchanged for the group's TTL")
		return Claim{}
	}
	return c
}

// casFailed reports whether err is JetStream's refusal of a conditional
// write: wrong last sequence (10071; 10164 on a replicated stream).
func casFailed(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// MemberName is the default name of a member: "<host>-<pid>-<random>",
// a token of [A-Za-z0-9_-]. A process that must know its name before it
// joins (to answer requests addressed to it) takes one here.
func MemberName() string {
	host, _ := os.Hostname()
	var b [2]byte
	_, _ = rand.Read(b[:])
	return token(host) + "-" + fmt.Sprint(os.Getpid()) + "-" + hex.EncodeToString(b[:])
}

// List returns the records of the members of group (every group when
// group is empty) found in the bucket, live or not yet expired, sorted by
// group then member (the partitions' claims are not records: left out).
// ErrNoBucket when the bucket does not exist.
func List(ctx context.Context, js jetstream.JetStream, bucket, group string) ([]Record, error) {
	if bucket == "" {
		bucket = DefaultBucket
	}
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrNoBucket, bucket)
	}
	if err != nil {
		return nil, fmt.Errorf("list members: %w", err)
	}
	filter := ">"
	if group != "" {
		filter = group + ".*"
	}
	w, err := kv.Watch(ctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("list members: %w", err)
	}
	defer stopWatch(w)
	var out []Record
	for e := range w.Updates() {
		if e == nil {
			break
		}
		if strings.Count(e.Key(), ".") != 1 {
			continue // a partition's claim, not a member's record
		}
		var r Record
		if json.Unmarshal(e.Value(), &r) == nil {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Group != out[j].Group {
			return out[i].Group < out[j].Group
		}
		return out[i].Member < out[j].Member
	})
	return out, nil
}

// Ownership is the partition groups as their members' heartbeat records
// show them: the members heard recently, sorted by group then member, and
// the owner of each partition in each group.
type Ownership struct {
	Members []Record
	// Owners maps a group to the owner of each partition a member of it
	// claims: Owners["engines"][3] is the engine that owns partition 3
	// ("" when none does).
	Owners map[string]map[int]string
}

// Owner is the member of group that owns partition p, or "".
func (o Ownership) Owner(group string, p int) string { return o.Owners[group][p] }

// ReadOwnership reads the members of every group in bucket ("":
// DefaultBucket) and keeps those heard within stale of now (0: twice
// DefaultTTL; an older record is one of a member that is gone and whose
// key has not expired yet). ErrNoBucket when the bucket does not exist.
// It is what `engine members` shows.
func ReadOwnership(ctx context.Context, js jetstream.JetStream, bucket string, now time.Time, stale time.Duration) (Ownership, error) {
	if stale <= 0 {
		stale = 2 * DefaultTTL
	}
	recs, err := List(ctx, js, bucket, "")
	if err != nil {
		return Ownership{}, err
	}
	o := Ownership{Members: []Record{}, Owners: map[string]map[int]string{}}
	for _, r := range recs {
		if now.Sub(r.Beat) > stale {
			continue
		}
		o.Members = append(o.Members, r)
		if o.Owners[r.Group] == nil {
			o.Owners[r.Group] = map[int]string{}
		}
		for _, p := range r.Partitions {
			o.Owners[r.Group][p] = r.Member
		}
	}
	return o, nil
}

// Unpin asks the server to unpin the pinned client of consumer's priority
// group on stream (ADR-42), so that the next pull of another member is
// pinned at once. A consumer with no pin is not an error.
func Unpin(ctx context.Context, js jetstream.JetStream, stream, consumer, group string) error {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("unpin %s: %w", consumer, err)
	}
	if err := st.UnpinConsumer(ctx, consumer, group); err != nil {
		return fmt.Errorf("unpin %s: %w", consumer, err)
	}
	return nil
}

func sortedKeys(m map[int]bool) []int {
	out := make([]int, 0, len(m))
	for p := range m {
		out = append(out, p)
	}
	sort.Ints(out)
	return out
}

func validToken(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// token maps s onto [A-Za-z0-9_-].
func token(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			b[i] = '-'
		}
	}
	if len(b) == 0 {
		return "member"
	}
	if len(b) > 64 {
		b = b[:64]
	}
	return string(b)
}

// stopWatch stops a KV watch without waiting for its consumer to be
// deleted. KeyWatcher.Stop unsubscribes, then deletes the watch's
// ephemeral consumer with a request that waits out its timeout (5 s) when
// the consumer sat on a node that is gone: a Leave would hold its
// partitions, and a listing its caller, that long after a node loss. The
// unsubscribe is what matters; the delete finishes in the background (or
// the server drops the consumer once it has no interest).
func stopWatch(w jetstream.KeyWatcher) {
	go func() { _ = w.Stop() }()
}
