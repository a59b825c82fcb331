package ingest_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/events/sessionlogtest"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/internal/ingestserver"
	"github.com/turnstone-dev/turnstone/internal/ingestserver/ingesttest"
)

// TestClientIsASessionLog runs the SessionLog suite against ingest.Client
// through a real ingest server (as an engine that owns every partition
// runs it): the same checks the direct log passes.
func TestClientIsASessionLog(t *testing.T) {
	t.Parallel()
	srv := embeddedtest.Start(t)
	nc, _ := embeddedtest.Connect(t, srv)
	ingesttest.Serve(t, nc)
	c, err := ingest.NewClient(nc, ingest.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	sessionlogtest.Run(t, c, sessionlogtest.Features{})
}

// TestClientKeepsTheOrderWhileNoEngineAnswers: the events of one Append,
// sent as pipelined requests while no engine answers yet (here one
// starts 300 ms later, as after a partition changes hands), are stored in
// the call's order: the client sends the unanswered ones again itself,
// in order. nats.go's own retry on "no responders" sent each again from a
// timer of its own, which stored them shuffled.
func TestClientKeepsTheOrderWhileNoEngineAnswers(t *testing.T) {
	t.Parallel()
	srv := embeddedtest.Start(t)
	nc, _ := embeddedtest.Connect(t, srv)
	enc, js := embeddedtest.Connect(t, srv)
	ctx := context.Background()
	log, err := events.Open(ctx, js, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ingest.NewClient(nc, ingest.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	var engine *ingestserver.Server
	go func() {
		time.Sleep(300 * time.Millisecond)
		s, err := ingestserver.NewServer(enc, log, ingestserver.Config{}, nil)
		if err == nil {
			err = s.Open(ctx)
		}
		engine = s
		started <- err
	}()
	evs := []events.Event{newEvent(t, "s1", "", &events.SessionStarted{Runtime: "test"})}
	for i := range 20 {
		turn := fmt.Sprintf("t%d", i)
		evs = append(evs, newEvent(t, "s1", turn, &events.TurnStarted{Prompt: "hi"}), newEvent(t, "s1", turn, &events.TurnCompleted{}))
	}
	acks, err := c.Append(ctx, evs)
	if serr := <-started; serr != nil {
		t.Fatal(serr)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = engine.Close(cctx)
	})
	if err != nil || len(acks) != len(evs) {
		t.Fatalf("append while no engine answered yet: %d acks, %v", len(acks), err)
	}
	var got []events.Event
	if err := log.ReadSession(ctx, "acme", "s1", events.ReadOptions{}, func(ev events.Event) error {
		got = append(got, ev)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(evs) {
		t.Fatalf("%d events stored, want %d", len(got), len(evs))
	}
	for i := range got {
		if got[i].ID != evs[i].ID {
			t.Fatalf("position %d of the session holds event %d: the call's order was not kept", i, slices.IndexFunc(evs, func(x events.Event) bool { return x.ID == got[i].ID }))
		}
	}
}

func newEvent(t *testing.T, session, turn string, p events.Payload) events.Event {
	t.Helper()
	ev, err := events.New("acme", session, turn, p)
	if err != nil {
		t.Fatal(err)
	}
	ev.Source = "urn:agent:test"
	return ev
}
