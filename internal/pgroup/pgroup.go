// Package pgroup is a partitioned consumer group on NATS JetStream: the
// members of a group (Turnstone's engines, or its recovery workers) share
// a fixed number of partitions, each owned by exactly one live member.
//
// Membership lives in JetStream: each member puts a heartbeat into a KV
// bucket (key <group>.<member>) every Heartbeat; a member unheard for TTL
// is dead. The assignment is deterministic (Assign: rendezvous hashing
// with balanced loads over the live members), so members agree without a
// leader. A member that gains a partition starts consuming it and a member
// that loses one stops (OnAcquire, OnRelease); each partition has its own
// durable consumer with the pinned_client priority policy (ADR-42), so
// even while two members briefly both believe they own a partition, the
// server delivers to one of them only. The new owner unpins the consumer
// when the previous owner is dead; a live previous owner unpins it itself
// when it lets go.
//
// Fencing: a member whose heartbeats fail for FenceAfter (two thirds of
// TTL by default) releases every partition until a heartbeat succeeds, so
// it has stopped before the others, who wait a full TTL, take over.
//
// The bound: a dead member's partitions are owned again within TTL plus
// one Heartbeat after its last heartbeat (6 s with the defaults), and the
// survivor's own next heartbeat records them within one more (7 s); a
// joining member takes its share within one Heartbeat of its first
// heartbeat. cmd/bench's handover figure measures it.
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
	// Bucket is the KV bucket of heartbeats. Default "turnstone_members".
	Bucket string
	// Heartbeat is how often the member writes its heartbeat and
	// recomputes the assignment. Default 1 s.
	Heartbeat time.Duration
	// TTL is how long a member may go unheard before the others count it
	// dead. Default 5 s; at least 3 heartbeats.
	TTL time.Duration
	// FenceAfter is how long this member's heartbeats may fail before it
	// releases every partition. Default two thirds of TTL.
	FenceAfter time.Duration
	// CreateBucket lets the member create the bucket when it is missing
	// (with Replicas replicas). Under auth an operator creates it and
	// members only use it.
	CreateBucket bool
	Replicas     int
	// Info is shown with the member by List (kind, version, addresses).
	Info map[string]string
	// OnAcquire is called, on the member's goroutine, when the member
	// gains partition p; previousDead says the previous owner is not a
	// live member (the caller should unpin the partition's consumer). An
	// error is logged and the partition retried on the next heartbeat.
	OnAcquire func(ctx context.Context, p int, previousDead bool) error
	// OnRelease is called, on the member's goroutine, when the member
	// loses partition p (the assignment moved it, the member is fenced or
	// leaving). It must stop consuming p before it returns.
	OnRelease func(ctx context.Context, p int)
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
	return errors.Join(errs...)
}

// Record is what a member's heartbeat holds: who it is, what it owns,
// and when it started and last beat (its own clock).
type Record struct {
	Group      string            `json:"group"`
	Member     string            `json:"member"`
	Partitions []int             `json:"partitions"`
	Started    time.Time         `json:"started"`
	Beat       time.Time         `json:"beat"`
	Info       map[string]string `json:"info,omitempty"`
}

// Member is one member of a partition group. Create it with Join; Leave
// releases its partitions and removes it.
type Member struct {
	kv  jetstream.KeyValue
	cfg Config
	l   zerolog.Logger

	mu       sync.Mutex
	seen     map[string]time.Time // live members -> when last heard (local clock)
	owned    map[int]bool
	assigned []string // the latest assignment computed
	lastBeat time.Time
	fenced   bool
	started  time.Time
	changes  int

	cancel context.CancelFunc
	done   chan struct{}
}

// Join puts the member's first heartbeat, starts watching the group and
// takes its share of the partitions (OnAcquire) before it returns; it
// then keeps beating and rebalancing on a goroutine it owns until Leave.
// Errors: a Config that fails Validate; ErrNoBucket; JetStream's.
func Join(ctx context.Context, js jetstream.JetStream, cfg Config, logger *zerolog.Logger) (*Member, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("join partition group: %w", err)
	}
	cfg.setDefaults()
	kv, err := OpenBucket(ctx, js, cfg.Bucket, cfg.CreateBucket, cfg.Replicas, cfg.TTL)
	if err != nil {
		return nil, fmt.Errorf("join partition group %s: %w", cfg.Group, err)
	}
	m := &Member{kv: kv, cfg: cfg, l: zerolog.Nop(), seen: map[string]time.Time{}, owned: map[int]bool{},
		started: time.Now().UTC(), done: make(chan struct{})}
	if logger != nil {
		m.l = logger.With().Str("component", "pgroup").Str("group", cfg.Group).Str("member", cfg.Member).Logger()
	}
	if err := m.beat(ctx); err != nil {
		return nil, fmt.Errorf("join partition group %s: %w", cfg.Group, err)
	}
	w, err := kv.Watch(ctx, cfg.Group+".*")
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
	m.rebalance(ctx)
	runCtx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	go m.run(runCtx, w)
	m.l.Info().Ints("partitions", m.Owned()).Msg("joined")
	return m, nil
}

// OpenBucket returns the membership KV bucket, creating it when create is
// set (history 1, entries kept 3 × ttl after their last heartbeat, so a
// dead member's record goes away by itself).
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
		Description: "Turnstone partition group members (heartbeats)",
		History:     1,
		TTL:         3 * ttl,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		MaxBytes:    64 << 20,
	}
}

// Name is the member's name.
func (m *Member) Name() string { return m.cfg.Member }

// Owned returns the partitions the member owns now, in order.
func (m *Member) Owned() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return sortedKeys(m.owned)
}

// Owns reports whether the member owns partition p now.
func (m *Member) Owns(p int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.owned[p]
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

// Leave releases every partition (OnRelease), deletes the member's
// heartbeat so the others rebalance at once, and stops its goroutine.
func (m *Member) Leave(ctx context.Context) error {
	if m.cancel != nil {
		m.cancel()
		select {
		case <-m.done:
		case <-ctx.Done():
			return fmt.Errorf("leave partition group: %w", ctx.Err())
		}
	}
	m.releaseAll(ctx)
	if err := m.kv.Delete(ctx, m.key()); err != nil {
		return fmt.Errorf("leave partition group: %w", err)
	}
	m.l.Info().Msg("left")
	return nil
}

func (m *Member) key() string { return m.cfg.Group + "." + m.cfg.Member }

func (m *Member) run(ctx context.Context, w jetstream.KeyWatcher) {
	defer close(m.done)
	defer func() {
		if w != nil {
			_ = w.Stop()
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
				continue
			}
			if e != nil && m.observe(e) {
				m.rebalance(ctx)
			}
		case <-tick.C:
			if err := m.beat(ctx); err != nil && ctx.Err() == nil {
				m.l.Warn().Err(err).Msg("heartbeat failed")
			}
			m.rebalance(ctx)
			if w == nil {
				if nw, err := m.kv.Watch(ctx, m.cfg.Group+".*"); err == nil {
					w, updates = nw, nw.Updates()
				}
			}
		}
	}
}

// beat writes the member's heartbeat.
func (m *Member) beat(ctx context.Context) error {
	start := time.Now()
	rec := Record{Group: m.cfg.Group, Member: m.cfg.Member, Partitions: m.Owned(), Started: m.started, Beat: start.UTC(), Info: m.cfg.Info}
	if rec.Partitions == nil {
		rec.Partitions = []int{}
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("heartbeat record: %w", err)
	}
	bctx, cancel := context.WithTimeout(ctx, m.cfg.FenceAfter)
	defer cancel()
	if _, err := m.kv.Put(bctx, m.key(), b); err != nil {
		return err
	}
	m.mu.Lock()
	m.lastBeat = start // when it was sent: the conservative end of the lease
	m.seen[m.cfg.Member] = start
	m.mu.Unlock()
	return nil
}

// observe records a KV update of the group; it reports whether the set
// of live members changed.
func (m *Member) observe(e jetstream.KeyValueEntry) bool {
	name := strings.TrimPrefix(e.Key(), m.cfg.Group+".")
	m.mu.Lock()
	defer m.mu.Unlock()
	_, known := m.seen[name]
	switch e.Operation() {
	case jetstream.KeyValueDelete, jetstream.KeyValuePurge:
		if name == m.cfg.Member {
			return false // our own record, deleted by Leave or an operator: the next beat restores it
		}
		delete(m.seen, name)
		return known
	}
	// A record that is already older than TTL (a dead member's, delivered
	// by the initial watch) does not count as alive.
	if time.Since(e.Created()) > m.cfg.TTL {
		return false
	}
	m.seen[name] = time.Now()
	return !known
}

// liveLocked returns the live members, sorted; m.mu must be held.
func (m *Member) liveLocked(now time.Time) []string {
	var live []string
	for name, at := range m.seen {
		if name == m.cfg.Member || now.Sub(at) <= m.cfg.TTL {
			live = append(live, name)
		}
	}
	sort.Strings(live)
	return live
}

// rebalance computes the assignment over the live members and moves the
// member's partitions to match it.
func (m *Member) rebalance(ctx context.Context) {
	now := time.Now()
	m.mu.Lock()
	for name, at := range m.seen {
		if name != m.cfg.Member && now.Sub(at) > m.cfg.TTL {
			delete(m.seen, name)
			m.l.Info().Str("dead", name).Msg("member unheard for its TTL: counted dead")
		}
	}
	fenced := now.Sub(m.lastBeat) > m.cfg.FenceAfter
	if fenced != m.fenced {
		m.fenced = fenced
		if fenced {
			m.l.Warn().Dur("since_last_heartbeat", now.Sub(m.lastBeat)).Msg("fenced: heartbeats fail; releasing every partition")
		} else {
			m.l.Info().Msg("heartbeats work again; taking partitions")
		}
	}
	live := m.liveLocked(now)
	prev := m.assigned
	if prev == nil {
		// Joining: the partitions were the others' until now.
		others := slices.DeleteFunc(slices.Clone(live), func(n string) bool { return n == m.cfg.Member })
		prev = Assign(m.cfg.Group, others, m.cfg.Partitions)
	}
	owner := Assign(m.cfg.Group, live, m.cfg.Partitions)
	m.assigned = owner
	var want []int
	if !fenced {
		for p, o := range owner {
			if o == m.cfg.Member {
				want = append(want, p)
			}
		}
	}
	var lose, gain []int
	for p := range m.owned {
		if !slices.Contains(want, p) {
			lose = append(lose, p)
		}
	}
	for _, p := range want {
		if !m.owned[p] {
			gain = append(gain, p)
		}
	}
	alive := map[string]bool{}
	for _, name := range live {
		alive[name] = true
	}
	m.mu.Unlock()
	sort.Ints(lose)

	for _, p := range lose {
		if m.cfg.OnRelease != nil {
			m.cfg.OnRelease(ctx, p)
		}
		m.mu.Lock()
		delete(m.owned, p)
		m.changes++
		m.mu.Unlock()
		m.l.Info().Int("partition", p).Msg("released")
	}
	for _, p := range gain {
		// The previous owner, when it is alive, lets go itself (and
		// unpins); only a dead one's pin is lifted here.
		previousDead := true
		if p < len(prev) && prev[p] != "" && prev[p] != m.cfg.Member && alive[prev[p]] {
			previousDead = false
		}
		if m.cfg.OnAcquire != nil {
			if err := m.cfg.OnAcquire(ctx, p, previousDead); err != nil {
				m.l.Warn().Err(err).Int("partition", p).Msg("acquire failed; retried on the next heartbeat")
				continue
			}
		}
		m.mu.Lock()
		m.owned[p] = true
		m.changes++
		m.mu.Unlock()
		m.l.Info().Int("partition", p).Bool("previous_owner_dead", previousDead).Msg("acquired")
	}
}

// releaseAll releases every partition the member owns.
func (m *Member) releaseAll(ctx context.Context) {
	for _, p := range m.Owned() {
		if m.cfg.OnRelease != nil {
			m.cfg.OnRelease(ctx, p)
		}
		m.mu.Lock()
		delete(m.owned, p)
		m.mu.Unlock()
	}
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
// group then member. ErrNoBucket when the bucket does not exist.
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
	defer func() { _ = w.Stop() }()
	var out []Record
	for e := range w.Updates() {
		if e == nil {
			break
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
