package pgroup

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
)

// owners tracks which member owns each partition, as OnAcquire and
// OnRelease report it. Two members may both hold a partition for a moment
// during a handover (the consumer's pin keeps one receiver), but a member
// must never be told the previous owner is dead (and so unpin) while that
// owner still holds the partition.
type owners struct {
	t     *testing.T
	mu    sync.Mutex
	by    map[int]string
	alive map[string]bool
}

func (o *owners) config(name string, partitions int) Config {
	return Config{
		Group: "engines", Member: name, Partitions: partitions, CreateBucket: true,
		Heartbeat: 100 * time.Millisecond, TTL: 600 * time.Millisecond,
		OnAcquire: func(_ context.Context, p int, previousDead bool) error {
			o.mu.Lock()
			defer o.mu.Unlock()
			if cur, ok := o.by[p]; ok && previousDead && o.alive[cur] {
				o.t.Errorf("%s acquires partition %d as if its owner were dead, still owned by live %s", name, p, cur)
			}
			o.by[p] = name
			return nil
		},
		OnRelease: func(_ context.Context, p int) {
			o.mu.Lock()
			defer o.mu.Unlock()
			if o.by[p] == name {
				delete(o.by, p)
			}
		},
	}
}

func (o *owners) counts() map[string]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := map[string]int{}
	for _, m := range o.by {
		c[m]++
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
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: not within %s", what, within)
	return 0
}

func TestMembersShareThePartitionsAndTakeOverADeadOne(t *testing.T) {
	srv := embeddedtest.Start(t)
	ctx := context.Background()
	o := &owners{t: t, by: map[int]string{}, alive: map[string]bool{"a": true, "b": true, "c": true, "d": true}}
	var members []*Member
	for _, name := range []string{"a", "b", "c"} {
		_, js := embeddedtest.Connect(t, srv)
		m, err := Join(ctx, js, o.config(name, 8), nil)
		if err != nil {
			t.Fatal(err)
		}
		members = append(members, m)
	}
	balanced := func() bool {
		c := o.counts()
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

	// b dies without a word: its goroutine stops, its heartbeat record stays.
	b := members[1]
	b.cancel()
	<-b.done
	o.mu.Lock()
	o.alive["b"] = false
	o.mu.Unlock()
	took := waitFor(t, "b's partitions owned by a and c", 5*time.Second, func() bool {
		c := o.counts()
		return c["a"]+c["c"] == 8
	})
	if bound := b.cfg.TTL + 3*b.cfg.Heartbeat; took > bound {
		t.Errorf("takeover took %s, over its bound %s", took, bound)
	}

	// A fourth member joins and takes its share from the others.
	_, js := embeddedtest.Connect(t, srv)
	d, err := Join(ctx, js, o.config("d", 8), nil)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "d takes its share", 5*time.Second, func() bool { return o.counts()["d"] >= 2 })
	waitFor(t, "a and c let go of d's share", 5*time.Second, func() bool {
		c := o.counts()
		return c["a"]+c["c"]+c["d"] == 8 && c["a"] >= 2 && c["c"] >= 2
	})

	// A member that leaves hands over at once.
	if err := d.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "d's partitions back", 2*time.Second, func() bool { c := o.counts(); return c["a"]+c["c"] == 8 })

	recs, err := List(ctx, js, "", "engines")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range recs {
		names = append(names, r.Member)
	}
	sort.Strings(names)
	if got := fmt.Sprint(names); got != "[a b c]" { // b's record lingers until the bucket's TTL
		t.Fatalf("List = %s, want [a b c]", got)
	}
	for _, m := range []*Member{members[0], members[2]} {
		if err := m.Leave(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A member whose heartbeats fail lets go of everything before the others
// count it dead.
func TestAMemberThatCannotBeatIsFenced(t *testing.T) {
	srv := embeddedtest.Start(t)
	ctx := context.Background()
	o := &owners{t: t, by: map[int]string{}, alive: map[string]bool{}}
	nc, js := embeddedtest.Connect(t, srv)
	m, err := Join(ctx, js, o.config("lonely", 4), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Leave(ctx) }()
	if got := len(m.Owned()); got != 4 {
		t.Fatalf("owns %d partitions, want 4", got)
	}
	nc.Close() // its heartbeats fail from now on
	m.mu.Lock()
	last := m.lastBeat
	m.mu.Unlock()
	waitFor(t, "fenced", 3*time.Second, func() bool { return len(m.Owned()) == 0 })
	// The others count it dead TTL after its last heartbeat reached them.
	if took := time.Since(last); took > m.cfg.TTL {
		t.Fatalf("released %s after its last heartbeat; the others take over after %s", took, m.cfg.TTL)
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
	o := &owners{t: t, by: map[int]string{}, alive: map[string]bool{"e1": true, "e2": true}}
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
	waitFor(t, "two engines share the partitions", 10*time.Second, func() bool {
		own, err = ReadOwnership(ctx, js, "", time.Now(), 0)
		c := map[string]int{}
		for p := 0; p < 4; p++ {
			c[own.Owner("engines", p)]++
		}
		return err == nil && c["e1"] == 2 && c["e2"] == 2 && len(own.Members) == 3
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
