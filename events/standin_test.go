package events

// Tests of the log against a stand-in for JetStream: a plain NATS server
// and a subscriber that answers as nats-server does, in the states a real
// cluster passes through too briefly to be caught at will.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// On a replicated stream the last event of a session comes from the
// stream's leader, through JetStream's "get message" API. While the
// cluster elects a leader, the nodes that know it is gone answer that
// request "JetStream system temporarily unavailable" (10008), and until
// they know it none answers: LastSeq waits both out, within its context,
// as it waits out "no responders"; "not found" (10037) is an answer,
// given at once. The leader is a stand-in here: a plain NATS server (no
// JetStream) and a subscriber that answers the API's subject as
// nats-server does, unavailable or silent the first times.
func TestLastSeqWaitsOutALeaderElection(t *testing.T) {
	t.Parallel()
	nc, js := withoutJetStream(t)
	const unavailable = `{"type":"io.nats.jetstream.api.v1.stream_msg_get_response","error":{"code":503,"err_code":10008,"description":"JetStream system temporarily unavailable"}}`
	var asked atomic.Int32
	var answer func(n int32) string
	sub, err := nc.Subscribe("$JS.API.STREAM.MSG.GET."+EventsStream, func(m *nats.Msg) {
		if a := answer(asked.Add(1)); a != "" { // "": silent, as every node is while a killed leader is not yet missed
			_ = m.Respond([]byte(a))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	l := &Log{js: js, events: replicatedStream{}, cfg: Config{Timeout: 5 * time.Second}, partitions: 1}

	// Unavailable twice, then the leader's answer.
	answer = func(n int32) string {
		if n <= 2 {
			return unavailable
		}
		return `{"type":"io.nats.jetstream.api.v1.stream_msg_get_response","message":{"subject":"x","seq":7,"time":"2026-11-27T00:00:00Z"}}`
	}
	seq, err := l.LastSeq(context.Background(), "acme", "s1")
	if err != nil || seq != 7 || asked.Load() != 3 {
		t.Fatalf("LastSeq after two unavailable answers: %d, %v, asked %d times; want 7 after 3", seq, err, asked.Load())
	}

	// Silent at first (the leader was killed, and the others do not know
	// it yet): asked again after leaderTry.
	asked.Store(0)
	answer = func(n int32) string {
		if n == 1 {
			return ""
		}
		return `{"type":"io.nats.jetstream.api.v1.stream_msg_get_response","message":{"subject":"x","seq":9,"time":"2026-11-27T00:00:00Z"}}`
	}
	start := time.Now()
	seq, err = l.LastSeq(context.Background(), "acme", "s1")
	if err != nil || seq != 9 || asked.Load() != 2 || time.Since(start) < leaderTry {
		t.Fatalf("LastSeq after a try with no answer: %d, %v, asked %d times in %s; want 9 after 2, one leaderTry apart", seq, err, asked.Load(), time.Since(start).Round(time.Millisecond))
	}

	// Not found: at once.
	asked.Store(0)
	answer = func(int32) string {
		return `{"type":"io.nats.jetstream.api.v1.stream_msg_get_response","error":{"code":404,"err_code":10037,"description":"no message found"}}`
	}
	if _, err := l.LastSeq(context.Background(), "acme", "s1"); !errors.Is(err, ErrSessionNotFound) || asked.Load() != 1 {
		t.Fatalf("LastSeq of a session with no event: %v, asked %d times; want ErrSessionNotFound at once", err, asked.Load())
	}

	// Unavailable throughout: ErrLogUnavailable when the context ends,
	// saying why.
	answer = func(int32) string { return unavailable }
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	start = time.Now()
	_, err = l.LastSeq(ctx, "acme", "s1")
	if !errors.Is(err, ErrLogUnavailable) || !strings.Contains(err.Error(), "temporarily unavailable") || time.Since(start) > 3*time.Second {
		t.Fatalf("LastSeq through an election that outlasts its context: %v after %s; want ErrLogUnavailable naming the last answer", err, time.Since(start).Round(time.Millisecond))
	}
}

// replicatedStream is the events stream as a Log sees it when opened on
// three replicas.
type replicatedStream struct{ jetstream.Stream }

func (replicatedStream) CachedInfo() *jetstream.StreamInfo {
	return &jetstream.StreamInfo{Config: jetstream.StreamConfig{Name: EventsStream, Replicas: 3}}
}

// withoutJetStream starts a NATS server without JetStream, for a test
// whose subscriber stands in for JetStream, and returns a connection to
// it with its JetStream context.
func withoutJetStream(t *testing.T) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// An append whose first events meet "no responders" (no stream listening
// yet) and whose later ones would find the stream, as when the stream's
// interest reaches the server midway through the events sent at once,
// still stores them in the order given: the stand-in stream answers the
// first three messages it receives "no responders" (a reply with status
// 503 and no body, as nats-server sends when nothing listens) and stores
// every later one. Sent all at once, events 3 to 40 would be stored before
// events 0 to 2 were sent again.
func TestAppendKeepsItsOrderWhenTheStreamAppearsMidway(t *testing.T) {
	t.Parallel()
	nc, js := withoutJetStream(t)
	var mu sync.Mutex
	var received int
	var stored []string
	sub, err := nc.Subscribe(EventSubjectPrefix+".>", func(m *nats.Msg) {
		mu.Lock()
		received++
		if received <= 3 {
			mu.Unlock()
			_ = m.RespondMsg(&nats.Msg{Header: nats.Header{"Status": []string{"503"}}})
			return
		}
		stored = append(stored, m.Header.Get(jetstream.MsgIDHeader))
		seq := len(stored)
		mu.Unlock()
		_ = m.Respond(fmt.Appendf(nil, `{"stream":%q,"seq":%d}`, EventsStream, seq))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	l := &Log{js: js, events: replicatedStream{}, cfg: Config{Timeout: 5 * time.Second, MaxEventBytes: DefaultMaxEventBytes}, partitions: 1}
	var evs []Event
	for i := range 41 {
		e, err := New("acme", "s1", "t1", &TurnStarted{Prompt: fmt.Sprint(i)})
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, e)
	}
	acks, err := l.Append(context.Background(), evs)
	if err != nil || len(acks) != len(evs) {
		t.Fatalf("append: %d acks, %v", len(acks), err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(stored) != len(evs) {
		t.Fatalf("%d events stored, want %d", len(stored), len(evs))
	}
	for i, id := range stored {
		if id != evs[i].ID || acks[i].Seq != uint64(i+1) {
			t.Fatalf("stored at position %d: event %d (ack seq %d); want the order given", i, slices.IndexFunc(evs, func(e Event) bool { return e.ID == id }), acks[i].Seq)
		}
	}
}
