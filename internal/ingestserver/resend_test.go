package ingestserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/internal/ingestserver"
)

// Every form of append, sent twice with the same ids through the engine
// as a publisher does after a lost reply, is answered the second time
// with the original acks and duplicate set, at once (the client retries
// nothing here: RetryFor is negative), and stores nothing twice (issue
// 21): through ingest.Client (plain one event, plain several, conditional
// one event, conditional batch), and through plain NATS requests as a
// client in any language sends them (one event with Nats-Msg-Id, one
// event with the expected sequence, a batch with it, a batch without).
func TestEveryResendThroughTheEngineReturnsTheOriginalAcks(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	cl, err := ingest.NewClient(e.nc, ingest.ClientConfig{RetryFor: -1})
	if err != nil {
		t.Fatal(err)
	}
	last := func(session string) uint64 {
		t.Helper()
		n, err := cl.LastSeq(ctx, "acme", session)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	twice := func(name string, evs []events.Event, opts ...events.AppendOption) {
		t.Helper()
		first, err := cl.Append(ctx, evs, opts...)
		if err != nil {
			t.Fatalf("client, %s: first send: %v", name, err)
		}
		again, err := cl.Append(ctx, evs, opts...)
		if err != nil {
			t.Fatalf("client, %s: second send: %v, want the original acks", name, err)
		}
		for i := range first {
			if first[i].Duplicate || !again[i].Duplicate || again[i].Seq != first[i].Seq {
				t.Fatalf("client, %s: ack %d: first %+v, again %+v; want the original, duplicate", name, i, first[i], again[i])
			}
		}
	}
	twice("conditional batch", []events.Event{
		e.event("acme", "c1", "", &events.SessionStarted{Runtime: "test"}),
		e.event("acme", "c1", "t1", &events.TurnStarted{Prompt: "hi"}),
	}, events.ExpectLastSeq(0))
	twice("conditional one event", []events.Event{e.event("acme", "c1", "t1", &events.TurnCompleted{})}, events.ExpectLastSeq(last("c1")))
	twice("plain one event", []events.Event{e.event("acme", "c1", "t2", &events.TurnStarted{})})
	twice("plain several", []events.Event{
		e.event("acme", "c1", "t2", &events.TurnCompleted{}),
		e.event("acme", "c1", "", &events.SessionPaused{Reason: "x"}),
	})
	if n := len(e.stored("acme", "c1")); n != 6 {
		t.Fatalf("client: %d events stored, want 6", n)
	}

	// Plain NATS requests.
	body := func(session, turn, typ, data string) (string, string) {
		id := events.NewID()
		b := fmt.Sprintf(`{"specversion":"1.0","id":%q,"type":%q,"source":"urn:agent:raw","time":"2026-02-19T10:00:00Z","tenant":"acme","session":%q`, id, typ, session)
		if turn != "" {
			b += fmt.Sprintf(`,"turn":%q`, turn)
		}
		return id, b + `,"data":` + data + `}`
	}
	rawTwice := func(name, session, payload string, hdr map[string]string, count int) {
		t.Helper()
		subject := events.EventSubject("acme", session)
		first := e.raw(subject, payload, hdr)
		if first.Error != nil || first.Seq == 0 || first.Duplicate {
			t.Fatalf("raw, %s: first send: %+v %+v", name, first, first.Error)
		}
		again := e.raw(subject, payload, hdr)
		if again.Error != nil || !again.Duplicate || again.Seq != first.Seq || again.Count != first.Count || again.Count != count {
			t.Fatalf("raw, %s: first %+v, again %+v (error %+v); want the original reply, duplicate", name, first, again, again.Error)
		}
	}
	id, started := body("r1", "", "session.started", `{}`)
	rawTwice("one event, Nats-Msg-Id", "r1", started, map[string]string{jetstream.MsgIDHeader: id}, 0)
	_, t1 := body("r1", "t1", "turn.started", `{"prompt":"hi"}`)
	// One event: no count in the reply (docs/events.md: a batch's reply
	// says how many), conditional or not.
	rawTwice("one event, expected sequence", "r1", t1, map[string]string{jetstream.ExpectedLastSubjSeqHeader: strconv.FormatUint(last("r1"), 10)}, 0)
	_, done := body("r1", "t1", "turn.completed", `{}`)
	_, t2 := body("r1", "t2", "turn.started", `{}`)
	rawTwice("batch, expected sequence", "r1", "["+done+","+t2+"]", map[string]string{jetstream.ExpectedLastSubjSeqHeader: strconv.FormatUint(last("r1"), 10)}, 2)
	_, done2 := body("r1", "t2", "turn.completed", `{}`)
	_, paused := body("r1", "", "session.paused", `{"reason":"x"}`)
	rawTwice("batch, no condition", "r1", "["+done2+","+paused+"]", nil, 2)
	if n := len(e.stored("acme", "r1")); n != 6 {
		t.Fatalf("raw: %d events stored, want 6", n)
	}

	// A batch that reuses a stored id with a new event is refused for it
	// (10201), and the new event is not stored.
	_, t3 := body("r1", "t3", "turn.started", `{}`)
	ack := e.raw(events.EventSubject("acme", "r1"), "["+t3+","+paused+"]", nil)
	if ack.Error == nil || ack.Error.ErrCode != events.JSErrCodeBatchDuplicateID || !strings.Contains(ack.Error.Description, "another call") {
		t.Fatalf("a batch reusing a stored id: %+v %+v, want error 10201", ack, ack.Error)
	}
	if n := len(e.stored("acme", "r1")); n != 6 {
		t.Fatalf("%d events stored after a refused batch, want 6", n)
	}
}

// TestPipelinedAppendsKeepTheirOrderThroughNoResponders: a publisher
// that sends one session's events one after another without waiting for
// each reply (as any client may) gets them stored in the order it sent
// them, even when they meet "no responders" (here the stream is gone and
// comes back 300 ms later): the ingest sends each again in the lane's
// order. nats.go's own retry sent each from a timer of its own, which
// stored them shuffled.
func TestPipelinedAppendsKeepTheirOrderThroughNoResponders(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	if err := e.js.DeleteStream(ctx, events.EventsStream); err != nil {
		t.Fatal(err)
	}
	back := e.streamBackAfter(300 * time.Millisecond)
	evs := []events.Event{e.event("acme", "s1", "", &events.SessionStarted{Runtime: "test"})}
	for i := range 20 {
		turn := fmt.Sprintf("t%d", i)
		evs = append(evs, e.event("acme", "s1", turn, &events.TurnStarted{Prompt: "hi"}), e.event("acme", "s1", turn, &events.TurnCompleted{}))
	}
	inbox := nats.NewInbox()
	replies, err := e.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		body, err := ev.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if err := e.nc.PublishRequest("agent.evt.acme.s1", inbox, body); err != nil {
			t.Fatal(err)
		}
	}
	for range evs {
		m, err := replies.NextMsg(30 * time.Second)
		if err != nil {
			t.Fatalf("reply: %v", err)
		}
		var ack ingest.PubAck
		if err := json.Unmarshal(m.Data, &ack); err != nil || ack.Error != nil {
			t.Fatalf("reply %s: %v", m.Data, err)
		}
	}
	if err := <-back; err != nil {
		t.Fatal(err)
	}
	got := e.stored("acme", "s1")
	if len(got) != len(evs) {
		t.Fatalf("%d events stored, want %d", len(got), len(evs))
	}
	for i := range got {
		if got[i].ID != evs[i].ID {
			t.Fatalf("position %d of the session holds event %d: the order sent was not kept", i, slices.IndexFunc(evs, func(x events.Event) bool { return x.ID == got[i].ID }))
		}
	}
}

// TestALongOutageIsAnsweredWithinOneWindow: while the stream answers no
// one for longer than the ingest sends refused events again
// (noResponderWindow, 3.5 s), a lane of pipelined requests is answered
// 503 within about that window in all, not one window per event or per
// group of a tenant's appends in flight (a first version of the ordered
// resend took 15.7 s for 200 requests, against 2 s before it).
func TestALongOutageIsAnsweredWithinOneWindow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	if err := e.js.DeleteStream(ctx, events.EventsStream); err != nil {
		t.Fatal(err)
	}
	inbox := nats.NewInbox()
	replies, err := e.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	start := time.Now()
	for i := range n {
		ev := e.event("acme", fmt.Sprintf("s%d", i%3), "", &events.SessionStarted{Runtime: "test"})
		body, err := ev.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if err := e.nc.PublishRequest("agent.evt.acme."+ev.Session, inbox, body); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		m, err := replies.NextMsg(30 * time.Second)
		if err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		var ack ingest.PubAck
		if err := json.Unmarshal(m.Data, &ack); err != nil || ack.Error == nil || ack.Error.ErrCode != ingest.CodeUnavailable {
			t.Fatalf("reply %d %s (%v): want unavailable", i, m.Data, err)
		}
	}
	if took := time.Since(start); took > 8*time.Second {
		t.Errorf("%d requests answered in %s while the stream was gone: want about one window (3.5 s)", n, took)
	}
}

// TestAnOutageLongAgoDoesNotCutTheNextOneShort: a lane whose last outage
// ended without a stored event (the stream came back, then nothing was
// sent for a while) sends refused events again in the next outage, as
// any: the window starts again once no event was refused for a window.
func TestAnOutageLongAgoDoesNotCutTheNextOneShort(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	send := func(ev events.Event) ingest.PubAck {
		t.Helper()
		body, err := ev.Encode()
		if err != nil {
			t.Fatal(err)
		}
		resp, err := e.nc.Request("agent.evt.acme.s1", body, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var ack ingest.PubAck
		if err := json.Unmarshal(resp.Data, &ack); err != nil {
			t.Fatal(err)
		}
		return ack
	}
	// A first outage that outlasts the window: the event is refused.
	if err := e.js.DeleteStream(ctx, events.EventsStream); err != nil {
		t.Fatal(err)
	}
	if ack := send(e.event("acme", "s1", "", &events.SessionStarted{Runtime: "test"})); ack.Error == nil {
		t.Fatalf("an event in an outage past the window: %+v, want unavailable", ack)
	}
	if _, err := events.Open(ctx, e.js, events.Config{}, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(ingestserver.NoResponderWindow + 200*time.Millisecond) // nothing sent, nothing refused
	// A second, short outage: its event is sent again and stored.
	if err := e.js.DeleteStream(ctx, events.EventsStream); err != nil {
		t.Fatal(err)
	}
	back := e.streamBackAfter(300 * time.Millisecond)
	ack := send(e.event("acme", "s1", "", &events.SessionStarted{Runtime: "test"}))
	if err := <-back; err != nil {
		t.Fatal(err)
	}
	if ack.Error != nil || ack.Seq == 0 {
		t.Fatalf("an event in a short outage after a long-ago one: %+v, want it stored", ack)
	}
}

// streamBackAfter creates the event stream again (events.Open) after d,
// on a goroutine of its own, and sends Open's error on the channel it
// returns: the stream's absence meanwhile is "no responders".
func (e *env) streamBackAfter(d time.Duration) <-chan error {
	back := make(chan error, 1)
	go func() {
		time.Sleep(d)
		_, err := events.Open(context.Background(), e.js, events.Config{}, nil)
		back <- err
	}()
	return back
}
