// Package presence tracks the agent runtimes present on NATS, so that the
// reconciler acts on live sessions only and resumes a session paused
// because its runtime was away once the runtime is back.
//
// A runtime announces itself the way NATS services do, with the
// nats.go/micro service framework (`nats micro list`, ADR-32): a service
// named recovery.PresenceService whose metadata says the tenant it serves (recovery.PresenceMetaTenant)
// and the sessions (recovery.PresenceMetaSessions: "*", or a prefix of session tokens). The
// claim is only believed once the runtime answers a control request with
// action "ping" on agent.ctl.<tenant>._presence (recovery.PresenceSession): only a
// client that may subscribe to the tenant's control subjects can answer
// it, so under auth (docs/security.md) one tenant cannot pose as
// another's runtime. A runtime that answers control requests but does not
// run a micro service is found too, for the tenants the Tracker is told
// to Watch. docs/control.md says what a runtime must do.
package presence

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/rs/zerolog"
	"github.com/turnstone-dev/turnstone/recovery"
)

// ErrAbsent: no runtime answers the tenant's control subjects (NATS no
// responders).
var ErrAbsent = errors.New("no runtime present")

// Runtime is one runtime instance, as its micro service described itself
// and as the ping found it.
type Runtime struct {
	// ID, Version and Metadata are the micro service's.
	ID       string            `json:"id"`
	Version  string            `json:"version"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// Tenant and Sessions are from the metadata (Sessions "*" when not
	// set).
	Tenant   string `json:"tenant"`
	Sessions string `json:"sessions"`
	// Verified is set once a control ping on the tenant's subjects was
	// answered since the instance was last seen.
	Verified bool `json:"verified"`
	// FirstSeen and LastSeen are when the tracker first and last heard of
	// the instance (its clock).
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
}

// Serves reports whether the runtime claims session (its Sessions is "*"
// or a prefix of it).
func (r *Runtime) Serves(session string) bool {
	return servesSession(r.Sessions, session)
}

func servesSession(pattern, session string) bool {
	return pattern == "" || pattern == "*" || strings.HasPrefix(session, pattern)
}

// Discover asks every runtime for its identity ($SRV.PING.turnstone-runtime)
// and returns the answers gathered within wait, sorted by tenant then id.
// Runtimes whose metadata names no valid tenant are left out. Errors: the
// connection's (a publish or subscribe that failed).
func Discover(ctx context.Context, nc *nats.Conn, wait time.Duration) ([]Runtime, error) {
	subject, err := micro.ControlSubject(micro.PingVerb, recovery.PresenceService, "")
	if err != nil {
		return nil, fmt.Errorf("discover runtimes: %w", err)
	}
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("discover runtimes: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(subject, inbox, nil); err != nil {
		return nil, fmt.Errorf("discover runtimes: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var out []Runtime
	for {
		msg, err := sub.NextMsgWithContext(wctx)
		if err != nil {
			break // the wait is over (or ctx ended): what came is the answer
		}
		var ping micro.Ping
		if json.Unmarshal(msg.Data, &ping) != nil || ping.Name != recovery.PresenceService {
			continue
		}
		r := Runtime{ID: ping.ID, Version: ping.Version, Metadata: ping.Metadata,
			Tenant: ping.Metadata[recovery.PresenceMetaTenant], Sessions: ping.Metadata[recovery.PresenceMetaSessions]}
		if r.Sessions == "" {
			r.Sessions = "*"
		}
		if !validToken(r.Tenant) {
			continue
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Tenant != out[j].Tenant {
			return out[i].Tenant < out[j].Tenant
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// Ping sends a control ping to agent.ctl.<tenant>._presence and returns
// nil when any runtime answers, ErrAbsent when none listens (no
// responders), or another error (a timeout: something listens but did not
// answer within timeout; the connection's errors).
func Ping(ctx context.Context, nc *nats.Conn, tenant string, timeout time.Duration) error {
	_, err := PingClaims(ctx, nc, tenant, timeout)
	return err
}

// PingClaims is Ping that also returns the turns the answering runtime
// claims to work on (recovery.PresenceReply.Turns, at most
// recovery.MaxClaimedTurns; none from a reply that is not JSON).
func PingClaims(ctx context.Context, nc *nats.Conn, tenant string, timeout time.Duration) ([]recovery.TurnRef, error) {
	req, err := json.Marshal(recovery.ControlRequest{Action: recovery.ActionPing, Tenant: tenant, Session: recovery.PresenceSession,
		Reason: "presence check by the engine", DeadlineMS: timeout.Milliseconds()})
	if err != nil {
		return nil, fmt.Errorf("ping %s: %w", tenant, err)
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	msg, err := nc.RequestWithContext(rctx, recovery.ControlSubject(tenant, recovery.PresenceSession), req)
	switch {
	case err == nil:
		var reply recovery.PresenceReply
		if json.Unmarshal(msg.Data, &reply) != nil {
			return nil, nil
		}
		claims := reply.Turns[:min(len(reply.Turns), recovery.MaxClaimedTurns)]
		return claims, nil
	case errors.Is(err, nats.ErrNoResponders):
		return nil, fmt.Errorf("ping %s: %w", tenant, ErrAbsent)
	default:
		return nil, fmt.Errorf("ping %s: %w", tenant, err)
	}
}

// validToken is events.ValidToken, without importing events for it.
func validToken(s string) bool {
	if len(s) == 0 || len(s) > 128 {
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

// Config configures a Tracker. The zero value takes the defaults.
type Config struct {
	// Interval is how often the tracker discovers runtimes and pings the
	// tenants. Default 2 seconds.
	Interval time.Duration
	// Wait is how long a discovery gathers answers, and a ping waits for
	// its reply. Default 500 ms.
	Wait time.Duration
	// Expire is how long a runtime instance, or a tenant's answer to a
	// ping, counts as present after it was last heard. Default 3 ×
	// Interval.
	Expire time.Duration
	// Tenants are pinged every round, whether or not a micro service
	// claims them. Under auth (docs/security.md) the engine lives in
	// another account than the tenants' runtimes, and a $SRV.PING does
	// not cross accounts: the engine pings the control subject of every
	// tenant of its auth spec instead, and a runtime that answers serves
	// all of its tenant's sessions.
	Tenants []string
	// OnChange, when set, is called (on the tracker's goroutine) when a
	// tenant's runtime becomes present (true) or absent (false).
	OnChange func(tenant string, present bool)
}

func (c *Config) setDefaults() {
	if c.Interval == 0 {
		c.Interval = 2 * time.Second
	}
	if c.Wait == 0 {
		c.Wait = 500 * time.Millisecond
	}
	if c.Expire == 0 {
		c.Expire = 3 * c.Interval
	}
}

// Validate reports every field out of range, joined.
func (c *Config) Validate() error {
	var errs []error
	if c.Interval < 0 {
		errs = append(errs, fmt.Errorf("interval: must not be negative, got %s", c.Interval))
	}
	if c.Wait < 0 {
		errs = append(errs, fmt.Errorf("wait: must not be negative, got %s", c.Wait))
	}
	if c.Expire < 0 {
		errs = append(errs, fmt.Errorf("expire: must not be negative, got %s", c.Expire))
	}
	for _, t := range c.Tenants {
		if !validToken(t) {
			errs = append(errs, fmt.Errorf("tenants: %q is not a token of [A-Za-z0-9_-]", t))
		}
	}
	return errors.Join(errs...)
}

// Tracker keeps the runtimes present: every Interval it discovers the
// micro services named recovery.PresenceService, then pings each tenant they claim,
// each of Config.Tenants and each tenant it was told to Watch. A tenant is present while its last
// answered ping is younger than Expire. It is safe for concurrent use.
type Tracker struct {
	nc  *nats.Conn
	cfg Config
	l   zerolog.Logger

	mu        sync.Mutex
	instances map[string]*Runtime                       // by instance id
	answered  map[string]time.Time                      // tenant -> when the last ping answered was sent
	claims    map[string]map[recovery.TurnRef]time.Time // tenant -> turn claimed -> when the ping claiming it was sent
	present   map[string]bool                           // tenant -> present at the last round
	watched   map[string]bool

	cancel context.CancelFunc
	done   chan struct{}
	kick   chan struct{}
}

// New returns a tracker on nc. logger may be nil.
func New(nc *nats.Conn, cfg Config, logger *zerolog.Logger) (*Tracker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("new presence tracker: %w", err)
	}
	cfg.setDefaults()
	t := &Tracker{nc: nc, cfg: cfg, l: zerolog.Nop(), instances: map[string]*Runtime{}, answered: map[string]time.Time{}, claims: map[string]map[recovery.TurnRef]time.Time{},
		present: map[string]bool{}, watched: map[string]bool{}, kick: make(chan struct{}, 1)}
	for _, tenant := range cfg.Tenants {
		t.watched[tenant] = true
	}
	if logger != nil {
		t.l = logger.With().Str("component", "presence").Logger()
	}
	return t, nil
}

// Open runs one round at once, then one every Interval on a goroutine the
// tracker owns until Close.
func (t *Tracker) Open(ctx context.Context) error {
	runCtx, cancel := context.WithCancel(context.Background())
	t.cancel, t.done = cancel, make(chan struct{})
	t.Round(ctx)
	go func() {
		defer close(t.done)
		tick := time.NewTicker(t.cfg.Interval)
		defer tick.Stop()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-tick.C:
			case <-t.kick:
			}
			t.Round(runCtx)
		}
	}()
	return nil
}

// Close stops the tracker and waits for its goroutine, or for ctx.
func (t *Tracker) Close(ctx context.Context) error {
	if t.cancel == nil {
		return nil
	}
	t.cancel()
	select {
	case <-t.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close presence tracker: %w", ctx.Err())
	}
}

// Watch adds tenant to the tenants pinged every round even when no micro
// service claims it (a session of it waits for its runtime), and asks for
// a round soon.
func (t *Tracker) Watch(tenant string) {
	t.mu.Lock()
	added := !t.watched[tenant]
	t.watched[tenant] = true
	t.mu.Unlock()
	if added {
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
}

// Present reports whether a runtime serving the session is present: the
// tenant answered a ping within Expire, and either no micro service of the
// tenant is known (a runtime without one serves the whole tenant) or one
// of them claims the session.
func (t *Tracker) Present(tenant, session string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.present[tenant] {
		return false
	}
	claimed := false
	for _, r := range t.instances {
		if r.Tenant != tenant {
			continue
		}
		claimed = true
		if r.Serves(session) {
			return true
		}
	}
	return !claimed
}

// AnsweredAt returns when the latest presence ping that a runtime
// serving the session answered was sent (the tracker's clock), or zero
// when none is present. A session paused because its runtime was gone is
// resumed only on an answer to a ping sent after the pause (reconciler).
func (t *Tracker) AnsweredAt(tenant, session string) time.Time {
	if !t.Present(tenant, session) {
		return time.Time{}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.answered[tenant]
}

// Claimed returns when a runtime of the tenant last claimed, in an answer
// to a presence ping within Expire, that it works on the session's turn
// (recovery.PresenceReply.Turns), or zero; only while a runtime serving
// the session is present.
func (t *Tracker) Claimed(tenant, session, turn string) time.Time {
	if !t.Present(tenant, session) {
		return time.Time{}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	at := t.claims[tenant][recovery.TurnRef{Session: session, Turn: turn}]
	if time.Since(at) > t.cfg.Expire {
		return time.Time{}
	}
	return at
}

// Runtimes returns the runtime instances known, sorted by tenant then id.
func (t *Tracker) Runtimes() []Runtime {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Runtime, 0, len(t.instances))
	for _, r := range t.instances {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Tenant != out[j].Tenant {
			return out[i].Tenant < out[j].Tenant
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Round discovers the runtimes and pings their tenants and the watched
// ones once, updating what Present answers, and calls OnChange for each
// tenant whose presence changed. Open runs it every Interval; tests may
// call it directly.
func (t *Tracker) Round(ctx context.Context) {
	now := time.Now()
	found, err := Discover(ctx, t.nc, t.cfg.Wait)
	if err != nil {
		t.l.Debug().Err(err).Msg("discovery failed")
	}
	t.mu.Lock()
	for i := range found {
		r := found[i]
		if have, ok := t.instances[r.ID]; ok {
			r.FirstSeen, r.Verified = have.FirstSeen, have.Verified
		} else {
			r.FirstSeen = now
		}
		r.LastSeen = now
		t.instances[r.ID] = &r
	}
	tenants := map[string]bool{}
	for id, r := range t.instances {
		if now.Sub(r.LastSeen) > t.cfg.Expire {
			delete(t.instances, id)
			continue
		}
		tenants[r.Tenant] = true
	}
	for tenant := range t.watched {
		tenants[tenant] = true
	}
	t.mu.Unlock()

	names := make([]string, 0, len(tenants))
	for tenant := range tenants {
		names = append(names, tenant)
	}
	sort.Strings(names)
	for _, tenant := range names {
		// The time the ping is sent: an answer proves a runtime that was
		// there after it (a runtime that died earlier cannot answer).
		sent := time.Now()
		claims, err := PingClaims(ctx, t.nc, tenant, t.cfg.Wait)
		t.mu.Lock()
		if err == nil {
			t.answered[tenant] = sent
			if len(claims) > 0 {
				c := t.claims[tenant]
				if c == nil {
					c = map[recovery.TurnRef]time.Time{}
					t.claims[tenant] = c
				}
				for _, ref := range claims {
					c[ref] = sent
				}
			}
		} else if !errors.Is(err, ErrAbsent) {
			t.l.Debug().Err(err).Str("tenant", tenant).Msg("ping not answered")
		} else {
			delete(t.answered, tenant) // no responders: gone at once
			delete(t.claims, tenant)
		}
		t.mu.Unlock()
	}

	var changed []string
	t.mu.Lock()
	for tenant := range t.answered {
		if now.Sub(t.answered[tenant]) > t.cfg.Expire {
			delete(t.answered, tenant)
		}
	}
	for tenant, c := range t.claims {
		for ref, at := range c {
			if now.Sub(at) > t.cfg.Expire {
				delete(c, ref)
			}
		}
		if len(c) == 0 {
			delete(t.claims, tenant)
		}
	}
	for tenant := range t.answered {
		if !t.present[tenant] {
			t.present[tenant] = true
			changed = append(changed, tenant)
		}
	}
	for tenant := range t.present {
		if _, ok := t.answered[tenant]; !ok {
			delete(t.present, tenant)
			changed = append(changed, tenant)
		}
	}
	for _, r := range t.instances {
		r.Verified = t.present[r.Tenant]
	}
	presentNow := make(map[string]bool, len(changed))
	for _, tenant := range changed {
		presentNow[tenant] = t.present[tenant]
	}
	t.mu.Unlock()
	sort.Strings(changed)
	for _, tenant := range changed {
		t.l.Info().Str("tenant", tenant).Bool("present", presentNow[tenant]).Msg("runtime presence changed")
		if t.cfg.OnChange != nil {
			t.cfg.OnChange(tenant, presentNow[tenant])
		}
	}
}
