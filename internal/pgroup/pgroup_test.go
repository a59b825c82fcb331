package pgroup

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
)

// acting tracks, for each partition, the members acting on it: those
// whose lease (the context OnAcquire got) is live. A member that is given
// a partition while another's lease on it is live breaks the invariant,
// and the test fails.
type acting struct {
	t      *testing.T
	mu     sync.Mutex
	leases map[int]map[string]context.Context
	tokens map[int]uint64
	taken  int // take-overs from a holder whose lease ran out
}

func newActing(t *testing.T) *acting {
	return &acting{t: t, leases: map[int]map[string]context.Context{}, tokens: map[int]uint64{}}
}

func (a *acting) config(name string, partitions int) Config {
	return Config{
		Group: "engines", Member: name, Partitions: partitions, CreateBucket: true,
		// A heartbeat a fifth of the default's and a TTL of six of them
		// (the defaults: five): 200 ms, so that one of the package's
		// parallel tests, slowed by the race detector and the others, still
		// beats within its bounds (100 ms missed a 300 ms bound in CI).
		Heartbeat: 200 * time.Millisecond, TTL: 1200 * time.Millisecond,
		OnAcquire: func(ctx context.Context, p int, lease Lease) error {
			a.mu.Lock()
			defer a.mu.Unlock()
			for other, lctx := range a.leases[p] {
				if other != name && lctx.Err() == nil {
					a.t.Errorf("%s acquires partition %d while %s's lease on it is live", name, p, other)
				}
			}
			if lease.Token <= a.tokens[p] {
				a.t.Errorf("%s acquires partition %d with token %d, not above the last holder's %d", name, p, lease.Token, a.tokens[p])
			}
			a.tokens[p] = lease.Token
			if lease.TakenOver {
				a.taken++
			}
			if a.leases[p] == nil {
				a.leases[p] = map[string]context.Context{}
			}
			a.leases[p][name] = ctx
			return nil
		},
		OnRelease: func(_ context.Context, p int, fenced bool) {
			a.mu.Lock()
			defer a.mu.Unlock()
			if lctx := a.leases[p][name]; fenced && lctx != nil && lctx.Err() == nil {
				a.t.Errorf("%s released partition %d as fenced with its lease live", name, p)
			}
			delete(a.leases[p], name)
		},
	}
}

// counts is how many partitions each member acts on.
func (a *acting) counts() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := map[string]int{}
	for _, by := range a.leases {
		for name, ctx := range by {
			if ctx.Err() == nil {
				c[name]++
			}
		}
	}
	return c
}

func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < within {
		if cond() {
			return time.Since(start)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s: not within %s", what, within)
	return 0
}

func TestMembersShareThePartitionsAndTakeOverADeadOne(t *testing.T) {
	t.Parallel()
	srv := embeddedtest.Start(t)
	ctx := context.Background()
	a := newActing(t)
	var members []*Member
	for _, name := range []string{"a", "b", "c"} {
		_, js := embeddedtest.Connect(t, srv)
		m, err := Join(ctx, js, a.config(name, 8), nil)
		if err != nil {
			t.Fatal(err)
		}
		members = append(members, m)
	}
	balanced := func() bool {
		c := a.counts()
		total := 0
		for _, n := range c {
			if n < 2 || n > 3 {
				return false
			}
			total += n
		}
		return len(c) == 3 && total == 8
	}
	waitFor(t, "8 partitions over 3 members", 5*time.Second, balanced)

	// b dies without a word: its goroutines stop, its record and claims
	// stay; its leases run out by themselves.
	b := members[1]
	b.cancel()
	<-b.done
	died := time.Now()
	took := waitFor(t, "b's partitions taken by a and c", 5*time.Second, func() bool {
		c := a.counts()
		return c["a"]+c["c"] == 8
	})
	if bound := b.cfg.TTL + 3*b.cfg.Heartbeat; took > bound {
		t.Errorf("take-over took %s, over its bound %s", took, bound)
	}
	if a.taken == 0 {
		t.Error("no partition was taken over from the dead member")
	}
	t.Logf("b's partitions taken %s after it stopped", time.Since(died).Round(time.Millisecond))

	// A fourth member joins and takes its share from the others, which
	// let it go first.
	_, js := embeddedtest.Connect(t, srv)
	d, err := Join(ctx, js, a.config("d", 8), nil)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "d takes its share", 5*time.Second, func() bool {
		c := a.counts()
		return c["d"] >= 2 && c["a"]+c["c"]+c["d"] == 8 && c["a"] >= 2 && c["c"] >= 2
	})

	// A member that leaves hands over at once: when Leave returns, its
	// claims are deleted (not left to run out), and the others, watching
	// the bucket, take them. The bound is loose (two TTLs), as the
	// package's tests share two cores with the rest of CI; the deleted
	// claims are what shows the hand-over did not wait for a TTL.
	dHeld := d.heldPartitions()
	if len(dHeld) == 0 {
		t.Fatal("d holds no partition before it leaves")
	}
	if err := d.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	left := time.Now()
	for _, p := range dHeld {
		e, err := d.kv.Get(ctx, ClaimKey(d.cfg.Group, p))
		var c Claim
		if err == nil && json.Unmarshal(e.Value(), &c) == nil && c.Member == "d" {
			t.Errorf("partition %d: d's claim is still in the bucket after Leave (revision %d)", p, e.Revision())
		}
	}
	waitFor(t, "d's partitions back", 2*d.cfg.TTL, func() bool { c := a.counts(); return c["a"]+c["c"] == 8 })
	t.Logf("d's partitions back %s after it left", time.Since(left).Round(time.Millisecond))

	recs, err := List(ctx, js, "", "")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range recs {
		names = append(names, r.Member)
	}
	sort.Strings(names)
	if got := fmt.Sprint(names); got != "[a b c]" { // b's record lingers until the bucket's TTL; claims are not listed
		t.Fatalf("List = %s, want [a b c]", got)
	}
	for _, m := range []*Member{members[0], members[2]} {
		if err := m.Leave(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A member whose writes fail stops acting on every partition FenceAfter
// after its last acknowledged write, before anyone may count it dead
// (TTL), and the survivor takes them only after that.
func TestAMemberThatCannotWriteIsFencedBeforeItIsTakenOver(t *testing.T) {
	t.Parallel()
	srv := embeddedtest.Start(t)
	ctx := context.Background()
	a := newActing(t)
	nc, js := embeddedtest.Connect(t, srv)
	lonely, err := Join(ctx, js, a.config("lonely", 4), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(lonely.Owned()); got != 4 {
		t.Fatalf("owns %d partitions, want 4", got)
	}
	_, js2 := embeddedtest.Connect(t, srv)
	other, err := Join(ctx, js2, a.config("other", 4), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Leave(ctx) }()
	waitFor(t, "shared", 3*time.Second, func() bool { c := a.counts(); return c["lonely"] == 2 && c["other"] == 2 })

	nc.Close() // its writes fail from now on; it is alive
	lonely.mu.Lock()
	var last time.Time
	for _, h := range lonely.held {
		last = maxTime(last, h.renewed)
	}
	lonely.mu.Unlock()
	waitFor(t, "fenced", 3*time.Second, func() bool { return len(lonely.Owned()) == 0 && a.counts()["lonely"] == 0 })
	fenced := time.Since(last)
	if fenced > lonely.cfg.TTL {
		t.Fatalf("stopped %s after its last acknowledged write; the others may take over after %s", fenced, lonely.cfg.TTL)
	}
	waitFor(t, "taken over", 3*time.Second, func() bool { return a.counts()["other"] == 4 })
	if took := time.Since(last); took < lonely.cfg.TTL {
		t.Fatalf("taken over %s after the last write, before the TTL %s", took, lonely.cfg.TTL)
	}
	t.Logf("fenced %s after its last write, taken over %s after it", fenced.Round(time.Millisecond), time.Since(last).Round(time.Millisecond))
	lonely.cancel()
	<-lonely.done
}

// A member whose view of the bucket is stale (it saw a claim keep its
// revision for TTL while the holder renewed it) cannot take the claim:
// the conditional write is refused, and the member reads the claim
// again.
func TestAStaleViewNeverTakesALiveClaim(t *testing.T) {
	t.Parallel()
	srv := embeddedtest.Start(t)
	ctx := context.Background()
	a := newActing(t)
	_, js := embeddedtest.Connect(t, srv)
	holder, err := Join(ctx, js, a.config("holder", 2), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Leave(ctx) }()
	// The stale member joins nothing: only its take is run, on a view
	// the test sets.
	cfg := a.config("stale", 2)
	cfg.setDefaults()
	stale := &Member{kv: holder.kv, cfg: cfg, inc: "stale1", members: map[string]observed{}, claims: map[int]*claimSeen{},
		held: map[int]*hold{}, kick: make(chan struct{}, 1)}
	waitFor(t, "holder holds both", 2*time.Second, func() bool { return a.counts()["holder"] == 2 })
	for p := range 2 {
		stale.claims[p] = &claimSeen{observed: observed{rev: 1, since: time.Now().Add(-24 * time.Hour)}, holder: "holder", inc: holder.inc}
	}
	for p := range 2 {
		stale.take(ctx, p)
	}
	if got := stale.heldPartitions(); len(got) != 0 {
		t.Fatalf("the stale member took %v from a live holder", got)
	}
	stale.mu.Lock()
	for p := range 2 {
		if c := stale.claims[p]; c.rev == 1 || time.Since(c.since) > time.Minute {
			t.Errorf("claim %d not read again after the refused write: %+v", p, c)
		}
	}
	stale.mu.Unlock()
	if c := a.counts(); c["holder"] != 2 {
		t.Fatalf("acting: %v", c)
	}
}

// A member whose own writes failed concludes nothing about the others
// from the silence: it counts none of them dead until TTL after it can
// write again.
func TestAMemberThatCouldNotWriteCountsNobodyDead(t *testing.T) {
	t.Parallel()
	srv := embeddedtest.Start(t)
	ctx := context.Background()
	a := newActing(t)
	_, js := embeddedtest.Connect(t, srv)
	m, err := Join(ctx, js, a.config("m", 2), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Leave(ctx) }()
	m.mu.Lock()
	m.members["quiet"] = observed{rev: 1, since: time.Now().Add(-time.Hour)}
	m.grace = time.Now() // its own write just failed
	live := m.liveLocked(time.Now())
	m.mu.Unlock()
	if fmt.Sprint(live) != "[m quiet]" {
		t.Fatalf("live right after its own failure: %v, want the quiet member still counted", live)
	}
	m.mu.Lock()
	m.grace = time.Now().Add(-2 * m.cfg.TTL)
	live = m.liveLocked(time.Now())
	m.mu.Unlock()
	if fmt.Sprint(live) != "[m]" {
		t.Fatalf("live a TTL after: %v, want the quiet member dead", live)
	}
}

// TestReadOwnership: the members heard recently, with the owner of every
// partition of each group; a record past the staleness bound is left out.
func TestReadOwnership(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := embeddedtest.Connect(t, embeddedtest.Start(t))
	if _, err := ReadOwnership(ctx, js, "", time.Now(), 0); err == nil {
		t.Fatal("no bucket: want ErrNoBucket")
	}
	o := newActing(t)
	var ms []*Member
	for _, name := range []string{"e1", "e2"} {
		m, err := Join(ctx, js, o.config(name, 4), nil)
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	wcfg := o.config("w1", 4)
	wcfg.Group, wcfg.OnAcquire, wcfg.OnRelease = "workers", nil, nil
	w, err := Join(ctx, js, wcfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ms = append(ms, w)
	t.Cleanup(func() {
		for _, m := range ms {
			_ = m.Leave(context.Background())
		}
	})
	var own Ownership
	waitFor(t, "two engines share the partitions, one worker holds them all", 10*time.Second, func() bool {
		own, err = ReadOwnership(ctx, js, "", time.Now(), 0)
		c := map[string]int{}
		for p := 0; p < 4; p++ {
			c[own.Owner("engines", p)]++
			c[own.Owner("workers", p)]++
		}
		return err == nil && c["e1"] == 2 && c["e2"] == 2 && c["w1"] == 4 && len(own.Members) == 3
	})
	for p := 0; p < 4; p++ {
		if own.Owner("workers", p) != "w1" {
			t.Fatalf("partition %d: worker %q, want w1", p, own.Owner("workers", p))
		}
	}
	if own.Members[0].Group != "engines" || own.Members[2].Group != "workers" {
		t.Fatalf("members not sorted by group: %+v", own.Members)
	}
	// Read as if much later: every record is stale.
	late, err := ReadOwnership(ctx, js, "", time.Now().Add(time.Hour), 0)
	if err != nil || len(late.Members) != 0 || late.Owner("engines", 0) != "" {
		t.Fatalf("an hour later: %+v, %v", late, err)
	}
}

// A claim that does not decode (not written by a member) is logged and
// held by no live member: the partition is taken over once the claim has
// gone unchanged for TTL, as a dead member's would be, and not before;
// the other partition is taken at once.
func TestAClaimThatDoesNotDecodeIsTakenOverAfterTTL(t *testing.T) {
	t.Parallel()
	srv := embeddedtest.Start(t)
	ctx := context.Background()
	a := newActing(t)
	_, js := embeddedtest.Connect(t, srv)
	cfg := a.config("a", 2)
	kv, err := OpenBucket(ctx, js, DefaultBucket, true, 1, cfg.TTL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, ClaimKey(cfg.Group, 0), []byte("not a claim")); err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer // read once the member has left
	logger := zerolog.New(&logged)
	joined := time.Now()
	m, err := Join(ctx, js, cfg, &logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Leave(ctx) }) // when a check fails before it leaves
	holds := func(p int) func() bool {
		return func() bool {
			a.mu.Lock()
			defer a.mu.Unlock()
			lctx := a.leases[p]["a"]
			return lctx != nil && lctx.Err() == nil
		}
	}
	waitFor(t, "partition 1, unclaimed, taken", 5*time.Second, holds(1))
	waitFor(t, "partition 0, under a claim that does not decode, taken over", 10*time.Second, holds(0))
	if took := time.Since(joined); took < cfg.TTL {
		t.Fatalf("partition 0 taken %s after joining, before its claim went unchanged for TTL (%s)", took, cfg.TTL)
	}
	a.mu.Lock()
	taken := a.taken
	a.mu.Unlock()
	if taken != 1 {
		t.Fatalf("%d take-overs, want 1 (partition 0)", taken)
	}
	if err := m.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logged.String(), "a claim that does not decode") {
		t.Fatalf("the claim that does not decode was not logged: %s", logged.String())
	}
}
