package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/projections"
)

// TestReplayRefoldsARewindFromTheLog replays a session with a rewind: the
// replayer holds no event, so it refolds from the log, and ends in the
// state a fold of the whole log gives.
func TestReplayRefoldsARewindFromTheLog(t *testing.T) {
	ctx := context.Background()
	_, js := embeddedtest.Connect(t, embeddedtest.Start(t))
	log, err := events.Open(ctx, js, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	add := func(turn string, p events.Payload) uint64 {
		t.Helper()
		ev, err := events.New("acme", "s1", turn, p)
		if err != nil {
			t.Fatal(err)
		}
		acks, err := log.Append(ctx, []events.Event{ev})
		if err != nil {
			t.Fatal(err)
		}
		return acks[0].Seq
	}
	add("t1", &events.TurnStarted{Prompt: "one"})
	end := add("t1", &events.TurnCompleted{})
	add("t2", &events.TurnStarted{Prompt: "two, rewound"})
	add("", &events.SessionRewound{ToSeq: end, Reason: "undo t2"})
	add("t3", &events.TurnStarted{Prompt: "three"})
	add("t3", &events.TurnCompleted{})

	var out bytes.Buffer
	r := &replayer{w: &out}
	state, err := projections.Replay(ctx, log, "acme", "s1", projections.ReplayRange{}, r.step)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.end(state); err != nil {
		t.Fatal(err)
	}
	want, err := projections.Restore(ctx, log, nil, "acme", "s1")
	if err != nil {
		t.Fatal(err)
	}
	if state.Totals.Turns != 2 || state.Turn("t2") != nil || state.Status() != projections.StatusIdle || want.Totals.Turns != 2 {
		t.Errorf("replayed state: %d turns, t2 %+v, status %s (a fold of the log: %d turns)", state.Totals.Turns, state.Turn("t2"), state.Status(), want.Totals.Turns)
	}
	if !strings.Contains(out.String(), "6 events replayed: idle; turns 2") {
		t.Errorf("replay output:\n%s", out.String())
	}
}
