package events_test

import (
	"context"
	"errors"
	"testing"

	"github.com/turnstone-dev/turnstone/events"
)

// Every form of append sent twice with the same ids, as a publisher does
// after a lost reply, is answered the second time with the original acks,
// Duplicate set, and stores nothing twice (issue 21): plain, conditional
// (one event), and a conditional batch; also a conditional call resent
// after another writer appended behind it.
func TestEveryResendReturnsTheOriginalAcks(t *testing.T) {
	t.Parallel()
	l, _ := openLog(t, events.Config{})
	ctx := context.Background()
	twice := func(name string, evs []events.Event, opts ...events.AppendOption) []events.Ack {
		t.Helper()
		first, err := l.Append(ctx, evs, opts...)
		if err != nil {
			t.Fatalf("%s: first send: %v", name, err)
		}
		again, err := l.Append(ctx, evs, opts...)
		if err != nil {
			t.Fatalf("%s: second send: %v, want the original acks", name, err)
		}
		if len(again) != len(first) {
			t.Fatalf("%s: %d acks, then %d", name, len(first), len(again))
		}
		for i := range first {
			if first[i].Duplicate || !again[i].Duplicate || again[i].Seq != first[i].Seq || again[i].ID != first[i].ID {
				t.Fatalf("%s: ack %d: first %+v, again %+v; want the original, Duplicate set", name, i, first[i], again[i])
			}
		}
		return first
	}
	start := ev(t, "acme", "s1", "", &events.SessionStarted{Runtime: "test"})
	turn := ev(t, "acme", "s1", "t1", &events.TurnStarted{Prompt: "hi"})
	acks := twice("conditional batch", []events.Event{start, turn}, events.ExpectLastSeq(0))
	msg := ev(t, "acme", "s1", "t1", &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: "text", Text: "hi"}}})
	acks = twice("conditional one event", []events.Event{msg}, events.ExpectLastSeq(acks[1].Seq))
	plain := []events.Event{
		ev(t, "acme", "s1", "t1", &events.TurnCompleted{}),
		ev(t, "acme", "s1", "", &events.SessionPaused{Reason: "x"}),
	}
	twice("plain", plain)

	// Another writer appends behind a conditional call; the call sent
	// again is still its own, not a conflict.
	last, _ := l.LastSeq(ctx, "acme", "s1")
	resumed := ev(t, "acme", "s1", "", &events.SessionResumed{})
	first, err := l.Append(ctx, []events.Event{resumed}, events.ExpectLastSeq(last))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(ctx, []events.Event{ev(t, "acme", "s1", "", &events.SessionPaused{Reason: "y"})}); err != nil {
		t.Fatal(err)
	}
	again, err := l.Append(ctx, []events.Event{resumed}, events.ExpectLastSeq(last))
	if err != nil || !again[0].Duplicate || again[0].Seq != first[0].Seq {
		t.Fatalf("resent behind another writer: %+v %v, want the original ack", again, err)
	}

	// A new call on a stale sequence is a conflict, not a resend.
	stale := ev(t, "acme", "s1", "t2", &events.TurnStarted{})
	if _, err := l.Append(ctx, []events.Event{stale}, events.ExpectLastSeq(last)); !errors.Is(err, events.ErrConflict) {
		t.Fatalf("a new event on a stale sequence: %v, want ErrConflict", err)
	}
	// A call that reuses a stored id in another batch is refused for it,
	// and not as unavailable (it would be refused on every retry).
	now, _ := l.LastSeq(ctx, "acme", "s1")
	fresh := ev(t, "acme", "s1", "t3", &events.TurnStarted{})
	_, err = l.Append(ctx, []events.Event{fresh, turn}, events.ExpectLastSeq(now))
	if !errors.Is(err, events.ErrDuplicateID) || errors.Is(err, events.ErrLogUnavailable) {
		t.Fatalf("a batch reusing a stored id: %v, want ErrDuplicateID", err)
	}

	// Each event is stored once.
	seen := map[string]int{}
	for _, e := range readAll(t, l, "acme", "s1", events.ReadOptions{}) {
		seen[e.ID]++
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("event %s stored %d times", id, n)
		}
	}
	if len(seen) != 7 {
		t.Errorf("%d events stored, want 7", len(seen))
	}
}
