package projections

import (
	"fmt"
	"testing"
	"time"

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
