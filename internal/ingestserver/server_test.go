package ingestserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/internal/ingestserver"
	"github.com/turnstone-dev/turnstone/internal/ingestserver/ingesttest"
)

type env struct {
	t   *testing.T
	nc  *nats.Conn // a publisher's connection
	js  jetstream.JetStream
	log *events.Log // the engine's view of the log
	cl  *ingest.Client
}

func newEnv(t *testing.T) *env {
	t.Helper()
	srv := embeddedtest.Start(t)
	enc, _ := embeddedtest.Connect(t, srv)
	log := ingesttest.Serve(t, enc)
	nc, js := embeddedtest.Connect(t, srv)
	cl, err := ingest.NewClient(nc, ingest.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, nc: nc, js: js, log: log, cl: cl}
}

func (e *env) event(tenant, session, turn string, p events.Payload) events.Event {
	e.t.Helper()
	ev, err := events.New(tenant, session, turn, p)
	if err != nil {
		e.t.Fatal(err)
	}
	ev.Source = "urn:agent:test"
	return ev
}

// raw sends a hand-written body as a plain NATS request, as a client in
// any language would, and decodes the reply.
func (e *env) raw(subject, body string, hdr map[string]string) ingest.PubAck {
	e.t.Helper()
	m := nats.NewMsg(subject)
	m.Data = []byte(body)
	for k, v := range hdr {
		m.Header.Set(k, v)
	}
	resp, err := e.nc.RequestMsg(m, 30*time.Second) // a 1 MiB event under the race detector takes a while
	if err != nil {
		e.t.Fatalf("request %s: %v", subject, err)
	}
	var ack ingest.PubAck
	if err := json.Unmarshal(resp.Data, &ack); err != nil {
		e.t.Fatalf("reply %q: %v", resp.Data, err)
	}
	return ack
}

func (e *env) stored(tenant, session string) []events.Event {
	e.t.Helper()
	var out []events.Event
	err := e.log.ReadSession(context.Background(), tenant, session, events.ReadOptions{}, func(ev events.Event) error {
		out = append(out, ev)
		return nil
	})
	if err != nil && !errors.Is(err, events.ErrSessionNotFound) {
		e.t.Fatal(err)
	}
	return out
}

func TestClientAppendsAndReadsThroughTheEngine(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	evs := []events.Event{
		e.event("acme", "s1", "", &events.SessionStarted{Runtime: "test"}),
		e.event("acme", "s1", "t1", &events.TurnStarted{Prompt: "hi"}),
	}
	acks, err := e.cl.Append(ctx, evs)
	if err != nil {
		t.Fatal(err)
	}
	if len(acks) != 2 || acks[1].Seq <= acks[0].Seq {
		t.Fatalf("acks %+v", acks)
	}
	// A retry of the same events is stored once.
	again, err := e.cl.Append(ctx, evs)
	if err != nil || !again[0].Duplicate || again[0].Seq != acks[0].Seq {
		t.Fatalf("retry: %+v %v", again, err)
	}
	// Conditional: on the right sequence it is stored, on a stale one it
	// is a conflict.
	last, err := e.cl.LastSeq(ctx, "acme", "s1")
	if err != nil || last != acks[1].Seq {
		t.Fatalf("last seq %d %v, want %d", last, err, acks[1].Seq)
	}
	done := e.event("acme", "s1", "t1", &events.TurnCompleted{})
	if _, err := e.cl.Append(ctx, []events.Event{done}, events.ExpectLastSeq(last)); err != nil {
		t.Fatal(err)
	}
	stale := e.event("acme", "s1", "t2", &events.TurnStarted{})
	if _, err := e.cl.Append(ctx, []events.Event{stale}, events.ExpectLastSeq(last)); !errors.Is(err, events.ErrConflict) {
		t.Fatalf("stale conditional append: %v, want ErrConflict", err)
	}
	var read []events.Event
	if err := e.cl.ReadSession(ctx, "acme", "s1", events.ReadOptions{}, func(ev events.Event) error {
		read = append(read, ev)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(read) != 3 || read[2].Type != events.TypeTurnCompleted || read[0].Stored.IsZero() || read[0].Err != nil {
		t.Fatalf("read %d events: %+v", len(read), read)
	}
	if _, err := e.cl.LastSeq(ctx, "acme", "nope"); !errors.Is(err, events.ErrSessionNotFound) {
		t.Fatalf("missing session: %v", err)
	}
}

// A client that is not the Go library: hand-written JSON in a plain
// request. Secrets are masked before they are stored; what breaks the
// contract is refused, quarantined with its reason, and the publisher
// hears why; the events around it are stored.
func TestRawPublishersAreValidatedMaskedAndQuarantined(t *testing.T) {
	e := newEnv(t)
	id := func() string { return events.NewID() }
	now := time.Now().UTC().Format(time.RFC3339Nano)
	good := fmt.Sprintf(`{"specversion":"1.0","id":%q,"type":"message.appended","source":"urn:agent:node","time":%q,"tenant":"acme","session":"raw","data":{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"export AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY and Authorization: Bearer abcdefghijklmnopqrstuvwxyz012345"}]}}`, id(), now)
	if ack := e.raw("agent.evt.acme.raw", good, nil); ack.Error != nil || ack.Seq == 0 {
		t.Fatalf("valid raw event: %+v", ack.Error)
	}
	for _, c := range []struct {
		name, subject, body string
		code                int
	}{
		{"not JSON", "agent.evt.acme.raw", `{"specversion":`, ingest.CodeInvalid},
		{"missing fields", "agent.evt.acme.raw", `{"specversion":"1.0","type":"turn.started"}`, ingest.CodeInvalid},
		{"body names another tenant's session", "agent.evt.acme.raw",
			fmt.Sprintf(`{"specversion":"1.0","id":%q,"type":"session.started","source":"urn:x","time":%q,"tenant":"globex","session":"victim","data":{}}`, id(), now), ingest.CodeInvalid},
		{"Turnstone's own type", "agent.evt.acme.raw",
			fmt.Sprintf(`{"specversion":"1.0","id":%q,"type":"recovery.completed","source":"urn:x","time":%q,"tenant":"acme","session":"raw","data":{"command_id":"c","kind":"repair_orphans","outcome":"recovered"}}`, id(), now), ingest.CodeForbidden},
		{"Turnstone's own source", "agent.evt.acme.raw",
			fmt.Sprintf(`{"specversion":"1.0","id":%q,"type":"turn.completed","source":"urn:turnstone:worker:w1","time":%q,"tenant":"acme","session":"raw","turn":"t1","data":{}}`, id(), now), ingest.CodeForbidden},
	} {
		ack := e.raw(c.subject, c.body, nil)
		if ack.Error == nil || ack.Error.ErrCode != c.code || !strings.Contains(ack.Error.Description, "quarantined") {
			t.Errorf("%s: reply %+v, want error %d naming the quarantine", c.name, ack.Error, c.code)
		}
	}
	stored := e.stored("acme", "raw")
	if len(stored) != 1 {
		t.Fatalf("%d events stored, want the one valid event", len(stored))
	}
	if s := string(stored[0].Raw); strings.Contains(s, "wJalrXUtnFEMI") || strings.Contains(s, "abcdefghijklmnopqrstuvwxyz012345") {
		t.Fatalf("a secret reached the log: %s", s)
	}
	if got := e.stored("globex", "victim"); len(got) != 0 {
		t.Fatalf("the other tenant's session got %d events", len(got))
	}
	// The quarantine is written off the reply's path (bounded, async):
	// its records arrive shortly after the refusals.
	var rejects []ingestserver.Reject
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var err error
		if rejects, err = ingestserver.Rejects(context.Background(), e.js, ingestserver.RejectFilter{}); err != nil {
			t.Fatal(err)
		}
		if len(rejects) >= 5 || time.Now().After(deadline) {
			break
		}
	}
	if len(rejects) != 5 || rejects[2].Tenant != "acme" || !strings.Contains(rejects[2].Reason, "globex/victim") {
		t.Fatalf("rejects %+v", rejects)
	}
}

// Only the engine that owns a session's partition answers: with two
// servers splitting the partitions, each request gets one reply, and
// every event is stored once.
func TestOnlyThePartitionsOwnerAnswers(t *testing.T) {
	srv := embeddedtest.Start(t)
	enc, js := embeddedtest.Connect(t, srv)
	ctx := context.Background()
	log, err := events.Open(ctx, js, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, even := range []bool{true, false} {
		s, err := ingestserver.NewServer(enc, log, ingestserver.Config{Shared: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Open(ctx); err != nil {
			t.Fatal(err)
		}
		defer s.Close(ctx)
		for p := range log.Partitions() {
			if (p%2 == 0) == even {
				if err := s.Acquire(ctx, p); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	nc, _ := embeddedtest.Connect(t, srv)
	var replies atomic.Int64
	inbox := nats.NewInbox()
	sub, _ := nc.Subscribe(inbox, func(*nats.Msg) { replies.Add(1) })
	defer sub.Unsubscribe()
	for i := 0; i < 20; i++ {
		ev, _ := events.New("acme", fmt.Sprintf("s%d", i), "", &events.SessionStarted{})
		ev.Source = "urn:agent:test"
		b, _ := ev.Encode()
		if err := nc.PublishRequest(events.EventSubject("acme", ev.Session), inbox, b); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for replies.Load() < 20 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	if n := replies.Load(); n != 20 {
		t.Fatalf("%d replies to 20 requests", n)
	}
	refs, err := log.Sessions(ctx, "acme")
	if err != nil || len(refs) != 20 {
		t.Fatalf("%d sessions stored (%v)", len(refs), err)
	}
	for _, r := range refs {
		if r.Events != 1 {
			t.Fatalf("%s: %d events", r.Session, r.Events)
		}
	}
}

// A publisher that starts with the engines (docker compose starts them
// together) reads before any engine serves: the read is asked again until
// one answers, within RetryFor; with RetryFor negative it fails at once.
func TestClientReadWaitsForAnEngine(t *testing.T) {
	srv := embeddedtest.Start(t)
	nc, _ := embeddedtest.Connect(t, srv)
	noRetry, err := ingest.NewClient(nc, ingest.ClientConfig{RetryFor: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := noRetry.LastSeq(ctx, "acme", "s1"); !errors.Is(err, events.ErrLogUnavailable) {
		t.Fatalf("no engine, no retry: %v, want ErrLogUnavailable", err)
	}
	cl, err := ingest.NewClient(nc, ingest.ClientConfig{RetryFor: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	read := make(chan error, 1)
	go func() {
		_, err := cl.LastSeq(ctx, "acme", "s1")
		read <- err
	}()
	time.Sleep(500 * time.Millisecond)
	enc, _ := embeddedtest.Connect(t, srv)
	ingesttest.Serve(t, enc)
	if err := <-read; !errors.Is(err, events.ErrSessionNotFound) {
		t.Fatalf("an engine starting 0.5 s later: %v, want its answer (ErrSessionNotFound)", err)
	}
}

// TestNoRespondersWhenNoEngineOwnsThePartition: on a server with the
// ingest mapping (here the embedded server's global account, as a
// publisher without credentials uses it), an append of a partition no
// engine owns gets "no responders" at once, the publisher's signal to
// retry; one of an owned partition is answered; and after Release the
// partition's appends go unanswered again, without waiting.
func TestNoRespondersWhenNoEngineOwnsThePartition(t *testing.T) {
	t.Parallel()
	srv := embeddedtest.Start(t)
	enc, js := embeddedtest.Connect(t, srv)
	ctx := context.Background()
	log, err := events.Open(ctx, js, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.AddMapping(ingest.IngestMapping(log.Partitions())); err != nil {
		t.Fatal(err)
	}
	var mapped, unmapped atomic.Int64
	s, err := ingestserver.NewServer(enc, log, ingestserver.Config{Shared: true, OnReceive: func(_, _ int, m bool) {
		if m {
			mapped.Add(1)
		} else {
			unmapped.Add(1)
		}
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	if err := s.Acquire(ctx, 0); err != nil {
		t.Fatal(err)
	}
	nc, _ := embeddedtest.Connect(t, srv)
	send := func(session string) error {
		ev, _ := events.New("acme", session, "", &events.SessionStarted{})
		ev.Source = "urn:agent:test"
		b, _ := ev.Encode()
		_, err := nc.Request(events.EventSubject("acme", session), b, 2*time.Second)
		return err
	}
	owned, other := "", ""
	for i := 0; owned == "" || other == ""; i++ {
		name := fmt.Sprintf("s%d", i)
		switch events.Partition("acme", name, log.Partitions()) {
		case 0:
			owned = name
		case 1:
			other = name
		}
	}
	if err := send(owned); err != nil {
		t.Fatalf("owned partition: %v", err)
	}
	start := time.Now()
	if err := send(other); !errors.Is(err, nats.ErrNoResponders) || time.Since(start) > time.Second {
		t.Fatalf("partition no engine owns: %v after %s, want no responders at once", err, time.Since(start))
	}
	s.Release(ctx, 0)
	if err := send(owned); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("after release: %v, want no responders", err)
	}
	if mapped.Load() != 1 || unmapped.Load() != 0 {
		t.Fatalf("received %d mapped, %d unmapped; want the one owned append, mapped", mapped.Load(), unmapped.Load())
	}
}

// TestRefusalsAreAnsweredAtOnceWhateverTheQuarantine: with the
// quarantine stream gone (its writes fail), a refused event is still
// answered within 100 ms, and each record that could not be written is
// counted as dropped, never waited for.
func TestRefusalsAreAnsweredAtOnceWhateverTheQuarantine(t *testing.T) {
	// Not parallel: it measures latencies, which other tests would take CPU from.
	srv := embeddedtest.Start(t)
	enc, js := embeddedtest.Connect(t, srv)
	ctx := context.Background()
	log, err := events.Open(ctx, js, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var dropped atomic.Int64
	s, err := ingestserver.NewServer(enc, log, ingestserver.Config{OnQuarantineDrop: func() { dropped.Add(1) }}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	if err := js.DeleteStream(ctx, ingest.QuarantineStream); err != nil {
		t.Fatal(err)
	}
	nc, _ := embeddedtest.Connect(t, srv)
	const n = 20
	var took []time.Duration
	for i := 0; i < n; i++ {
		subject := "agent.evt.acme.s1"
		if i%2 == 1 {
			subject = "agent.evt.acme.bad:token"
		}
		start := time.Now()
		resp, err := nc.Request(subject, []byte(`{"not": "an event"`), 5*time.Second)
		took = append(took, time.Since(start))
		if err != nil || took[i] > time.Second {
			t.Fatalf("refusal %d: %v after %s", i, err, took[i])
		}
		var ack ingest.PubAck
		if json.Unmarshal(resp.Data, &ack) != nil || ack.Error == nil || ack.Error.ErrCode != ingest.CodeInvalid {
			t.Fatalf("refusal %d: %s", i, resp.Data)
		}
	}
	// A quarantine write fails only after its publish does: the replies
	// never waited for it (the race detector and a shared machine slow a
	// reply, not by seconds).
	if p90 := percentile(took, 90); p90 >= 100*time.Millisecond {
		t.Fatalf("refusals answered in p90 %s, want under 100 ms", p90)
	}
	deadline := time.Now().Add(10 * time.Second)
	for dropped.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d records counted dropped", dropped.Load(), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
