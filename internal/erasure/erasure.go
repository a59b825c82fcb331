// Package erasure is how Turnstone's processes take part in erasing a
// tenant's or a session's data without bringing it back from memory.
//
// An erase (engine.Erase: `engine erase`, or an engine's retention sweep)
// runs in three steps, each a core NATS request on NoticeSubject that
// every live engine and worker answers:
//
//  1. begin: each process blocks the scope in its Gate (no write of the
//     scope starts; ingest appends of it are answered "try again"), waits
//     for the writes of the scope it has in flight to be stored, drops
//     the scope's state from memory (the projector's sessions, the
//     reconciler's watches and queued actions), and confirms. The eraser
//     purges nothing until every live member confirmed.
//  2. The eraser purges the scope's events, snapshots, commands, command
//     statuses, fleet index entries and quarantine records, twice (the
//     second pass catches a write that was in the server's queues).
//  3. end: with the streams' last sequences after the purge
//     (watermarks). Each process lifts the block and remembers the
//     watermarks for a while: a delivery of an erased sequence (one its
//     client had buffered before the purge) is ignored, and work that
//     started before the erase began (an action the reconciler queued, a
//     command a worker is running) is refused its writes for good, since
//     its state came from the erased data.
//
// A process that dies mid-erase leaves nothing blocked for long: a block
// lifts by itself after Config.BlockFor. Nothing of the design needs the
// notices to be durable: the data is purged, so a process that starts
// after the erase finds nothing to remember.
package erasure

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/turnstone-dev/turnstone/events"
)

// NoticeSubject is the core NATS subject erase notices are requested on.
// Every engine and worker subscribes (no queue group: each answers).
// Under auth only the operator and the engines (retention) may publish
// to it; docs/security.md.
const NoticeSubject = "agent.admin.erase"

// Defaults of Config.
const (
	// DefaultBlockFor is how long a begun erase blocks its scope when its
	// end never comes (the eraser died).
	DefaultBlockFor = 2 * time.Minute
	// DefaultRememberFor is how long an ended erase's watermarks are
	// remembered: longer than any redelivery of a message a client had
	// buffered before the purge (the consumers' AckWait is 30 s).
	DefaultRememberFor = 10 * time.Minute
	// maxNotices bounds the erases remembered; the oldest ended go first.
	maxNotices = 10000
)

// Errors of the package. Match them with errors.Is.
var (
	// ErrInvalidScope: a scope names no tenant, or a token that cannot be
	// one.
	ErrInvalidScope = errors.New("invalid erase scope")
	// ErrErasing: a write was refused because its session is being
	// erased, or was erased after the write's state was read. Nothing was
	// written; the work that wanted it is moot.
	ErrErasing = errors.New("session being erased")
)

// Scope is what one erase removes: every session of Tenant when Sessions
// is empty, else those sessions of Tenant.
type Scope struct {
	Tenant   string   `json:"tenant"`
	Sessions []string `json:"sessions,omitempty"`
}

// Validate reports a scope whose tenant or sessions are not tokens
// (events.ValidToken), wrapping ErrInvalidScope.
func (s Scope) Validate() error {
	if !events.ValidToken(s.Tenant) {
		return fmt.Errorf("%w: tenant %q is not a token of [A-Za-z0-9_-]", ErrInvalidScope, s.Tenant)
	}
	for _, x := range s.Sessions {
		if !events.ValidToken(x) {
			return fmt.Errorf("%w: session %q is not a token of [A-Za-z0-9_-]", ErrInvalidScope, x)
		}
	}
	return nil
}

// Whole reports whether the scope is a whole tenant.
func (s Scope) Whole() bool { return len(s.Sessions) == 0 }

// Covers reports whether the session is in the scope.
func (s Scope) Covers(tenant, session string) bool {
	return tenant == s.Tenant && (len(s.Sessions) == 0 || slices.Contains(s.Sessions, session))
}

// String is "acme/*" for a tenant, "acme/s1" for one session, "acme/{s1,
// s2}" for several.
func (s Scope) String() string {
	switch len(s.Sessions) {
	case 0:
		return s.Tenant + "/*"
	case 1:
		return s.Tenant + "/" + s.Sessions[0]
	}
	return s.Tenant + "/{" + strings.Join(s.Sessions, ", ") + "}"
}

// Phase is the step of an erase a notice announces.
type Phase string

// The phases of an erase.
const (
	PhaseBegin Phase = "begin"
	PhaseEnd   Phase = "end"
	PhaseAbort Phase = "abort"
)

// Notice is the body of a request on NoticeSubject (JSON). ID names the
// erase (the same in its three notices); EventsSeq and CommandsSeq, on
// end, are AGENT_EVENTS' and AGENT_RECOVERY's last sequences after the
// purge: every message of the scope at or below them was erased.
type Notice struct {
	ID          string `json:"id"`
	Phase       Phase  `json:"phase"`
	Scope       Scope  `json:"scope"`
	EventsSeq   uint64 `json:"events_seq,omitzero"`
	CommandsSeq uint64 `json:"commands_seq,omitzero"`
}

// Confirm is a member's reply to a notice: who it is (its partition
// group and member name), and Error when it could not do its part (the
// eraser then purges nothing).
type Confirm struct {
	Group  string `json:"group"`
	Member string `json:"member"`
	Error  string `json:"error,omitempty"`
}

// Config configures a Gate. The zero value takes the defaults.
type Config struct {
	// BlockFor and RememberFor: see DefaultBlockFor, DefaultRememberFor.
	BlockFor    time.Duration
	RememberFor time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

type key struct{ tenant, session string }

// notice is an erase as a gate remembers it.
type notice struct {
	id       string
	scope    Scope
	sessions map[string]bool // nil: the whole tenant
	epoch    uint64
	blocked  bool
	expires  time.Time // blocked: when the block lifts by itself; ended: when it is forgotten
	events   uint64
	commands uint64
}

func (n *notice) covers(tenant, session string) bool {
	return tenant == n.scope.Tenant && (n.sessions == nil || n.sessions[session])
}

// Gate is one process's side of erasure: the writes of a scope being
// erased are refused (Enter), the deliveries of erased sequences are
// skipped (Skip, SkipCommand), and Begin waits for the writes in flight.
// Every write a Turnstone process makes for a session (an append, a
// snapshot, an index entry, a command, a status) goes through Enter and
// Leave. A nil *Gate allows everything and skips nothing. It is safe for
// concurrent use.
type Gate struct {
	cfg Config

	mu       sync.Mutex
	epoch    uint64
	notices  []*notice
	inflight map[key]int
	waiters  int
	changed  chan struct{}
}

// NewGate returns a gate with nothing blocked.
func NewGate(cfg Config) *Gate {
	if cfg.BlockFor <= 0 {
		cfg.BlockFor = DefaultBlockFor
	}
	if cfg.RememberFor <= 0 {
		cfg.RememberFor = DefaultRememberFor
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Gate{cfg: cfg, inflight: map[key]int{}, changed: make(chan struct{})}
}

// Epoch is the gate's count of erases begun. Take it before reading the
// state a write will be decided from, and pass it to Enter.
func (g *Gate) Epoch() uint64 {
	if g == nil {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.epoch
}

// Enter asks to write for the session. It returns false when the session
// is being erased, or when an erase of it began after since (an Epoch
// taken before the caller read the state it writes from): the caller
// must not write. On true the caller must call Leave once the write is
// stored or has failed.
func (g *Gate) Enter(tenant, session string, since uint64) bool {
	if g == nil {
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.notices) > 0 {
		now := g.cfg.Now()
		g.pruneLocked(now)
		for _, n := range g.notices {
			if n.covers(tenant, session) && (n.blocked || n.epoch > since) {
				return false
			}
		}
	}
	g.inflight[key{tenant, session}]++
	return true
}

// Leave ends a write Enter allowed.
func (g *Gate) Leave(tenant, session string) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	k := key{tenant, session}
	if g.inflight[k] <= 1 {
		delete(g.inflight, k)
	} else {
		g.inflight[k]--
	}
	if g.waiters > 0 {
		close(g.changed)
		g.changed = make(chan struct{})
	}
}

// Blocked reports whether the session is being erased now.
func (g *Gate) Blocked(tenant, session string) bool {
	if g == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.notices) == 0 {
		return false
	}
	g.pruneLocked(g.cfg.Now())
	for _, n := range g.notices {
		if n.blocked && n.covers(tenant, session) {
			return true
		}
	}
	return false
}

// Skip reports whether a delivered event of the session, stored at
// stream sequence seq, is to be ignored: the session is being erased, or
// was erased up to a watermark at or above seq (the delivery is of an
// erased event).
func (g *Gate) Skip(tenant, session string, seq uint64) bool {
	return g.skip(tenant, session, seq, false)
}

// SkipCommand is Skip for a recovery command stored at seq in
// AGENT_RECOVERY.
func (g *Gate) SkipCommand(tenant, session string, seq uint64) bool {
	return g.skip(tenant, session, seq, true)
}

func (g *Gate) skip(tenant, session string, seq uint64, command bool) bool {
	if g == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.notices) == 0 {
		return false
	}
	g.pruneLocked(g.cfg.Now())
	for _, n := range g.notices {
		if !n.covers(tenant, session) {
			continue
		}
		mark := n.events
		if command {
			mark = n.commands
		}
		if n.blocked || seq <= mark {
			return true
		}
	}
	return false
}

// Begin blocks the notice's scope (or refreshes the block of a notice
// begun already) and waits until no write of the scope is in flight, or
// ctx ends (then the block stays, to lift by itself or on Abort).
func (g *Gate) Begin(ctx context.Context, n Notice) error {
	if g == nil {
		return nil
	}
	if err := n.Scope.Validate(); err != nil {
		return err
	}
	g.mu.Lock()
	now := g.cfg.Now()
	g.pruneLocked(now)
	found := false
	for _, x := range g.notices {
		if x.id == n.ID {
			x.blocked, x.expires, found = true, now.Add(g.cfg.BlockFor), true
		}
	}
	if !found {
		g.addLocked(n, true, now.Add(g.cfg.BlockFor))
	}
	g.mu.Unlock()
	for {
		g.mu.Lock()
		busy := false
		for k, c := range g.inflight {
			if c > 0 && n.Scope.Covers(k.tenant, k.session) {
				busy = true
				break
			}
		}
		if !busy {
			g.mu.Unlock()
			return nil
		}
		g.waiters++
		ch := g.changed
		g.mu.Unlock()
		select {
		case <-ch:
			g.mu.Lock()
			g.waiters--
			g.mu.Unlock()
		case <-ctx.Done():
			g.mu.Lock()
			g.waiters--
			g.mu.Unlock()
			return fmt.Errorf("erase %s: writes of %s still in flight: %w", n.ID, n.Scope, ctx.Err())
		}
	}
}

// End lifts the notice's block and remembers its watermarks for
// RememberFor. An end whose begin this gate never saw (the process
// joined mid-erase) is remembered as well, with a new epoch.
func (g *Gate) End(n Notice) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.cfg.Now()
	for _, x := range g.notices {
		if x.id == n.ID {
			x.blocked, x.expires, x.events, x.commands = false, now.Add(g.cfg.RememberFor), n.EventsSeq, n.CommandsSeq
			return
		}
	}
	x := g.addLocked(n, false, now.Add(g.cfg.RememberFor))
	x.events, x.commands = n.EventsSeq, n.CommandsSeq
}

// Abort forgets a notice whose erase was given up (nothing was purged).
func (g *Gate) Abort(n Notice) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.notices = slices.DeleteFunc(g.notices, func(x *notice) bool { return x.id == n.ID })
}

// Erasing returns the scopes being erased now, and those ended and still
// remembered, for logs and tests.
func (g *Gate) Erasing() (blocked, ended []Scope) {
	if g == nil {
		return nil, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pruneLocked(g.cfg.Now())
	for _, n := range g.notices {
		if n.blocked {
			blocked = append(blocked, n.scope)
		} else {
			ended = append(ended, n.scope)
		}
	}
	return blocked, ended
}

func (g *Gate) addLocked(n Notice, blocked bool, expires time.Time) *notice {
	g.epoch++
	x := &notice{id: n.ID, scope: n.Scope, epoch: g.epoch, blocked: blocked, expires: expires}
	if len(n.Scope.Sessions) > 0 {
		x.sessions = make(map[string]bool, len(n.Scope.Sessions))
		for _, s := range n.Scope.Sessions {
			x.sessions[s] = true
		}
	}
	g.notices = append(g.notices, x)
	if len(g.notices) > maxNotices {
		// Forget the oldest ended erases first.
		sort.SliceStable(g.notices, func(i, j int) bool {
			return !g.notices[i].blocked && (g.notices[j].blocked || g.notices[i].expires.Before(g.notices[j].expires))
		})
		g.notices = g.notices[len(g.notices)-maxNotices:]
	}
	return x
}

// pruneLocked lifts expired blocks and forgets expired ends.
func (g *Gate) pruneLocked(now time.Time) {
	g.notices = slices.DeleteFunc(g.notices, func(x *notice) bool { return now.After(x.expires) })
}

// MemberConfig configures a process's answers to erase notices.
type MemberConfig struct {
	// Gate is the process's gate (required).
	Gate *Gate
	// Group and Member name the process as its partition group does
	// (engine.Group, recovery.WorkerGroup; the member's name): the eraser
	// waits for a confirmation from every live member of both groups.
	Group, Member string
	// Forget, when set, drops the scope's state from memory; it is called
	// after the gate blocked the scope and its writes in flight ended,
	// and again on end.
	Forget func(Scope)
	// Wait bounds how long a begin waits for the writes in flight.
	// Default 10 seconds.
	Wait time.Duration
}

// Listen subscribes nc to NoticeSubject and answers each notice for the
// member until the returned subscription is unsubscribed (or drained).
// logger may be nil.
func Listen(nc *nats.Conn, cfg MemberConfig, logger *zerolog.Logger) (*nats.Subscription, error) {
	if cfg.Gate == nil || cfg.Group == "" || cfg.Member == "" {
		return nil, errors.New("listen for erase notices: gate, group and member are required")
	}
	if cfg.Wait <= 0 {
		cfg.Wait = 10 * time.Second
	}
	l := zerolog.Nop()
	if logger != nil {
		l = logger.With().Str("component", "erasure").Logger()
	}
	sub, err := nc.Subscribe(NoticeSubject, func(m *nats.Msg) {
		conf := Confirm{Group: cfg.Group, Member: cfg.Member}
		var n Notice
		if err := json.Unmarshal(m.Data, &n); err != nil || n.ID == "" {
			conf.Error = "bad notice"
			respond(m, conf)
			return
		}
		if err := n.Scope.Validate(); err != nil {
			conf.Error = err.Error()
			respond(m, conf)
			return
		}
		switch n.Phase {
		case PhaseBegin:
			ctx, cancel := context.WithTimeout(context.Background(), cfg.Wait)
			err := cfg.Gate.Begin(ctx, n)
			cancel()
			if err != nil {
				conf.Error = err.Error()
				break
			}
			if cfg.Forget != nil {
				cfg.Forget(n.Scope)
			}
			l.Info().Str("erase", n.ID).Str("scope", n.Scope.String()).Msg("erase begun: scope blocked and forgotten")
		case PhaseEnd:
			cfg.Gate.End(n)
			if cfg.Forget != nil {
				cfg.Forget(n.Scope)
			}
			l.Info().Str("erase", n.ID).Str("scope", n.Scope.String()).Uint64("events_seq", n.EventsSeq).Msg("erase ended")
		case PhaseAbort:
			cfg.Gate.Abort(n)
			l.Warn().Str("erase", n.ID).Str("scope", n.Scope.String()).Msg("erase aborted")
		default:
			conf.Error = fmt.Sprintf("unknown phase %q", n.Phase)
		}
		respond(m, conf)
	})
	if err != nil {
		return nil, fmt.Errorf("listen for erase notices: %w", err)
	}
	if err := nc.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("listen for erase notices: %w", err)
	}
	return sub, nil
}

func respond(m *nats.Msg, c Confirm) {
	if m.Reply == "" {
		return
	}
	c.Error = strings.ToValidUTF8(c.Error, "\uFFFD") // JSON strings are UTF-8
	b, err := json.Marshal(c)
	if err != nil {
		// Not encodable (a group or member name that is not a token):
		// no answer, and the eraser reports this member as missing.
		return
	}
	_ = m.Respond(b)
}

// Announce sends notice n to every member and collects the confirmations
// until each of expect ("<group>.<member>") answered, or ctx ends. It
// returns the confirmations received and the members of expect that did
// not answer. Members that answer but are not in expect are kept too.
func Announce(ctx context.Context, nc *nats.Conn, n Notice, expect []string) (got []Confirm, missing []string, err error) {
	b, err := json.Marshal(n)
	if err != nil {
		return nil, nil, fmt.Errorf("announce erase: %w", err)
	}
	inbox := nc.NewRespInbox()
	ch := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, nil, fmt.Errorf("announce erase: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(NoticeSubject, inbox, b); err != nil {
		return nil, nil, fmt.Errorf("announce erase: %w", err)
	}
	want := map[string]bool{}
	for _, e := range expect {
		want[e] = true
	}
	for len(want) > 0 {
		select {
		case m := <-ch:
			var c Confirm
			if json.Unmarshal(m.Data, &c) != nil {
				continue
			}
			got = append(got, c)
			delete(want, c.Group+"."+c.Member)
		case <-ctx.Done():
			for e := range want {
				missing = append(missing, e)
			}
			sort.Strings(missing)
			return got, missing, nil
		}
	}
	return got, nil, nil
}
