package projections

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/turnstone-dev/turnstone/events"
)

// TestProjectorBoundsTheStatesItHolds: past MaxSessions the least recently
// active states leave memory, and a session that left is restored, exactly,
// when its next event comes.
func TestProjectorBoundsTheStatesItHolds(t *testing.T) {
	ctx := testContext(t)
	js := startJetStream(t)
	// One partition: the events come in one order (partitions are folded
	// concurrently, so "least recently active" is only defined within
	// one).
	log, err := events.Open(ctx, js, events.Config{Partitions: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewProjector(log, newStore(t, js), ProjectorConfig{MaxSessions: 3, Durable: "bounded"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	add := func(session string, pl events.Payload, turn string) {
		ev, err := events.New(testTenant, session, turn, pl)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := log.Append(ctx, []events.Event{ev}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 8; i++ {
		s := fmt.Sprintf("s%d", i)
		add(s, &events.SessionStarted{}, "")
		add(s, &events.TurnStarted{Prompt: "go"}, "t1")
	}
	waitHeld := func() {
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, ok := p.Session(testTenant, "s7"); ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the projector did not reach s7")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitHeld()
	if n := p.Held(); n > 3 {
		t.Fatalf("holds %d states, MaxSessions is 3", n)
	}
	if _, ok := p.Session(testTenant, "s0"); ok {
		t.Fatal("s0, the least recently active, is still held")
	}
	// s0 comes back with its next event, restored exactly.
	add("s0", &events.TurnCompleted{}, "t1")
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, ok := p.Session(testTenant, "s0")
		if ok && s.Totals.Turns == 1 && s.Turns[0].Status == TurnCompleted && s.Events == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("s0 not restored: %+v", s)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestProjectorCompactsIdleStates: a session with no turn in flight and no
// event for CompressAfter is held in compressed form; a reader gets the same
// state from it, and its next event folds on it exactly. A session with a
// turn in flight stays whole.
func TestProjectorCompactsIdleStates(t *testing.T) {
	ctx := testContext(t)
	js := startJetStream(t)
	log, err := events.Open(ctx, js, events.Config{Partitions: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewProjector(log, newStore(t, js), ProjectorConfig{CompressAfter: 50 * time.Millisecond, Durable: "compact"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	var all []events.Event
	add := func(session, turn string, pl events.Payload) {
		ev, err := events.New(testTenant, session, turn, pl)
		if err != nil {
			t.Fatal(err)
		}
		acks, err := log.Append(ctx, []events.Event{ev})
		if err != nil {
			t.Fatal(err)
		}
		if session == "idle" {
			ev.Seq = acks[0].Seq
			all = append(all, ev)
		}
	}
	add("idle", "", &events.SessionStarted{Runtime: "r"})
	add("idle", "t1", &events.TurnStarted{Prompt: "go"})
	add("idle", "t1", &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: events.BlockText, Text: "go"}}})
	add("idle", "t1", &events.TurnCompleted{})
	add("busy", "t1", &events.TurnStarted{Prompt: "go"})
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("waited 10 s for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("one compressed state", func() bool { return p.Compressed() == 1 })
	time.Sleep(200 * time.Millisecond) // many compaction rounds
	if n, held := p.Compressed(), p.Held(); n != 1 || held != 2 {
		t.Fatalf("%d compressed states of %d held, want the idle one of 2", n, held)
	}
	stored := func(s *Session) *Session { // the log's clock, which the test's events lack
		c := s.Clone()
		c.FirstStored, c.LastStored, c.LastLiveStored = time.Time{}, time.Time{}, time.Time{}
		for i := range c.Turns {
			c.Turns[i].SeenAt, c.Turns[i].ActiveAt = time.Time{}, time.Time{}
		}
		return c
	}
	got, ok := p.Session(testTenant, "idle")
	if !ok || string(mustJSON(t, stored(got))) != string(mustJSON(t, FoldLog(all))) {
		t.Fatalf("the compressed state reads back as %+v", got)
	}
	add("idle", "t2", &events.TurnStarted{Prompt: "again"})
	waitFor("the next event folded", func() bool {
		s, ok := p.Session(testTenant, "idle")
		return ok && s.Events == len(all)
	})
	if p.Compressed() != 0 {
		t.Fatal("the session is in a turn, and still compact")
	}
	got, _ = p.Session(testTenant, "idle")
	if string(mustJSON(t, stored(got))) != string(mustJSON(t, FoldLog(all))) {
		t.Fatalf("folded on a compressed state:\n%s\nwant\n%s", mustJSON(t, stored(got)), mustJSON(t, FoldLog(all)))
	}
}

// TestUseExistingAcquireCreatesNoConsumer: with UseExisting, acquiring a
// partition whose consumer is missing fails (wrapping
// jetstream.ErrConsumerNotFound) and creates none; without it, Acquire
// creates the missing consumer, as before.
func TestUseExistingAcquireCreatesNoConsumer(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	js := startJetStream(t)
	log, err := events.Open(ctx, js, events.Config{Partitions: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, events.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	name := ProjectorConsumerName("existing", 1)
	for _, useExisting := range []bool{true, false} {
		p, err := NewProjector(log, newStore(t, js), ProjectorConfig{Durable: "existing", Shared: true, UseExisting: useExisting}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Open(ctx); err != nil {
			t.Fatal(err)
		}
		err = p.Acquire(ctx, 1, false)
		_, lookup := st.Consumer(ctx, name)
		_ = p.Close(ctx)
		if useExisting {
			if !errors.Is(err, jetstream.ErrConsumerNotFound) {
				t.Fatalf("UseExisting: Acquire without the consumer: %v, want jetstream.ErrConsumerNotFound", err)
			}
			if !errors.Is(lookup, jetstream.ErrConsumerNotFound) {
				t.Fatalf("UseExisting: consumer %s after Acquire: %v, want none created", name, lookup)
			}
			if err := CheckProjectorConsumers(ctx, js, ProjectorConfig{Durable: "existing"}, 2); !errors.Is(err, jetstream.ErrConsumerNotFound) {
				t.Fatalf("CheckProjectorConsumers with none: %v, want jetstream.ErrConsumerNotFound", err)
			}
			continue
		}
		if err != nil || lookup != nil {
			t.Fatalf("without UseExisting: Acquire %v, consumer %s %v; want it created", err, name, lookup)
		}
	}
	if err := EnsureProjectorConsumers(ctx, js, ProjectorConfig{Durable: "existing"}, 2); err != nil {
		t.Fatal(err)
	}
	if err := CheckProjectorConsumers(ctx, js, ProjectorConfig{Durable: "existing"}, 2); err != nil {
		t.Fatalf("CheckProjectorConsumers after EnsureProjectorConsumers: %v", err)
	}
}

// TestProjectorConsumesAgainAfterItsConsumerIsDeleted: nats.go stops a
// consumption for good when its consumer is deleted; a projector that
// still holds the partition consumes it again, retrying until the
// consumer is back (an operator's `engine setup` recreates it), and
// folds what comes after as it folded what came before.
func TestProjectorConsumesAgainAfterItsConsumerIsDeleted(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	js := startJetStream(t)
	log, err := events.Open(ctx, js, events.Config{Partitions: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := ProjectorConfig{Durable: "again"}
	p, err := NewProjector(log, newStore(t, js), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	add := func(pl events.Payload, turn string) {
		ev, err := events.New(testTenant, "s1", turn, pl)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := log.Append(ctx, []events.Event{ev}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor := func(what string, events int) {
		deadline := time.Now().Add(15 * time.Second)
		for {
			s, ok := p.Session(testTenant, "s1")
			if ok && s.Events == events {
				return
			}
			if time.Now().After(deadline) {
				held := -1
				if ok {
					held = s.Events
				}
				t.Fatalf("%s: the projector holds the session with %d events (-1: not held), want %d", what, held, events)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	add(&events.SessionStarted{}, "")
	add(&events.TurnStarted{Prompt: "go"}, "t1")
	waitFor("before the delete", 2)

	st, err := js.Stream(ctx, events.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteConsumer(ctx, ProjectorConsumerName(cfg.Durable, 0)); err != nil {
		t.Fatal(err)
	}
	add(&events.TurnCompleted{}, "t1")
	time.Sleep(300 * time.Millisecond) // a few tries against the missing consumer
	if s, _ := p.Session(testTenant, "s1"); s != nil && s.Events != 2 {
		t.Fatalf("folded %d events with no consumer", s.Events)
	}
	if err := EnsureProjectorConsumers(ctx, js, cfg, 1); err != nil {
		t.Fatal(err)
	}
	waitFor("after the consumer is back", 3)
	add(&events.TurnStarted{Prompt: "again"}, "t2")
	waitFor("an event after it is back", 4)
	if s, _ := p.Session(testTenant, "s1"); s.Totals.Turns != 2 || s.Turns[0].Status != TurnCompleted {
		t.Fatalf("state after consuming again: %+v", s)
	}
}
