package claudecode_test

import (
	"context"
	"maps"
	"testing"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/claudecode"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
)

func TestLogStore(t *testing.T) {
	ctx := context.Background()
	srv := embeddedtest.Start(t)
	_, js := embeddedtest.Connect(t, srv)
	log, err := events.Open(ctx, js, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	store := claudecode.LogStore(log)

	ids, err := store.EventIDs(ctx, "acme", "s1")
	if err != nil || ids == nil || len(ids) != 0 {
		t.Fatalf("EventIDs of a session the log does not hold = %v, %v; want an empty set, nil", ids, err)
	}

	want := map[string]struct{}{}
	var evs []events.Event
	for _, p := range []events.Payload{&events.SessionStarted{}, &events.TurnStarted{Prompt: "hi"}} {
		ev, err := events.New("acme", "s1", "t1", p)
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
		want[ev.ID] = struct{}{}
	}
	if err := store.Append(ctx, evs); err != nil {
		t.Fatal(err)
	}
	ids, err = store.EventIDs(ctx, "acme", "s1")
	if err != nil || !maps.Equal(ids, want) {
		t.Fatalf("EventIDs = %v, %v; want %v, nil", ids, err, want)
	}
}
