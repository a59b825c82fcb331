package events

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A read whose events come slower than a batch of them fills, but each
// within Config.Timeout of the one before, is not "unavailable": the wait
// readOrdered bounds is for the next event, not the next batch. The
// consumer here is a stand-in that delivers 70 events 10 ms apart under
// a 150 ms timeout (a batch of 64 takes 0.64 s to fill).
func TestReadOrderedWaitsForEventsNotBatches(t *testing.T) {
	t.Parallel()
	const n = 70
	l := &Log{cfg: Config{Timeout: 150 * time.Millisecond},
		events: slowStream{msgs: storedBodies(t, n), every: 10 * time.Millisecond}}
	got := 0
	start := time.Now()
	err := l.readOrdered(context.Background(), jetstream.OrderedConsumerConfig{}, n, func(ev Event) error {
		if ev.Err != nil || ev.Seq != uint64(got+1) {
			return fmt.Errorf("event %d: seq %d, %v", got, ev.Seq, ev.Err)
		}
		got++
		return nil
	})
	if err != nil || got != n {
		t.Fatalf("read %d of %d events in %s: %v", got, n, time.Since(start).Round(time.Millisecond), err)
	}
}

// A server that stops delivering mid-read is reported unavailable one
// Config.Timeout after the last event it delivered, not up to two (as a
// check of "any event since the timer was set" would): 22 events 10 ms
// apart, then nothing, under a 200 ms timeout.
func TestReadOrderedStallIsUnavailableAfterOneTimeout(t *testing.T) {
	t.Parallel()
	const timeout = 200 * time.Millisecond
	s := slowStream{msgs: storedBodies(t, 100), every: 10 * time.Millisecond, stallAfter: 22, last: new(atomic.Int64)}
	l := &Log{cfg: Config{Timeout: timeout}, events: s}
	err := l.readOrdered(context.Background(), jetstream.OrderedConsumerConfig{}, 100, func(Event) error { return nil })
	after := time.Since(time.Unix(0, s.last.Load()))
	if !errors.Is(err, ErrLogUnavailable) {
		t.Fatalf("a stalled read: %v, want ErrLogUnavailable", err)
	}
	if after < timeout || after > timeout*3/2 {
		t.Fatalf("unavailable %s after the last event; want one timeout, %s", after.Round(time.Millisecond), timeout)
	}
}

// fn sees no event after ctx ended, even within a batch.
func TestReadOrderedStopsAtCancelMidBatch(t *testing.T) {
	t.Parallel()
	l := &Log{cfg: Config{Timeout: time.Second}, events: slowStream{msgs: storedBodies(t, 200)}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := 0
	err := l.readOrdered(ctx, jetstream.OrderedConsumerConfig{}, 200, func(Event) error {
		n++
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) || n != 1 {
		t.Fatalf("fn called %d times, read %v; want once, context.Canceled", n, err)
	}
}

// storedBodies returns n encoded events of acme/s1.
func storedBodies(t *testing.T, n int) [][]byte {
	t.Helper()
	bodies := make([][]byte, n)
	for i := range bodies {
		ev, err := NewAt(time.Unix(1767225600, 0).UTC(), NewID(), "acme", "s1", "", &SessionResumed{})
		if err != nil {
			t.Fatal(err)
		}
		if bodies[i], err = ev.Encode(); err != nil {
			t.Fatal(err)
		}
	}
	return bodies
}

// slowStream is an AGENT_EVENTS whose ordered consumer delivers msgs,
// one every every, as JetStream does (subject, reply with the metadata):
// only the first stallAfter of them when it is set (the others stay
// pending), recording in last when (UnixNano) it delivered the latest.
type slowStream struct {
	jetstream.Stream
	msgs       [][]byte
	every      time.Duration
	stallAfter int
	last       *atomic.Int64
}

func (s slowStream) OrderedConsumer(context.Context, jetstream.OrderedConsumerConfig) (jetstream.Consumer, error) {
	return slowConsumer{s: s}, nil
}

type slowConsumer struct {
	jetstream.Consumer
	s slowStream
}

func (c slowConsumer) Consume(handler jetstream.MessageHandler, _ ...jetstream.PullConsumeOpt) (jetstream.ConsumeContext, error) {
	cc := &slowConsume{stop: make(chan struct{}), closed: make(chan struct{})}
	go func() {
		defer close(cc.closed)
		for i, body := range c.s.msgs {
			if i == c.s.stallAfter && i > 0 {
				<-cc.stop
				return
			}
			select {
			case <-time.After(c.s.every):
			case <-cc.stop:
				return
			}
			if c.s.last != nil {
				c.s.last.Store(time.Now().UnixNano())
			}
			seq := uint64(i + 1)
			handler(slowMsg{subject: StoredEventSubject(0, "acme", "s1"), body: body,
				reply: fmt.Sprintf("$JS.ACK.%s.c.1.%d.%d.%d.%d", EventsStream, seq, seq, time.Now().UnixNano(), len(c.s.msgs)-i-1)})
		}
	}()
	return cc, nil
}

type slowConsume struct {
	jetstream.ConsumeContext
	stop, closed chan struct{}
	stopped      bool
}

func (c *slowConsume) Stop() {
	if !c.stopped {
		c.stopped = true
		close(c.stop)
	}
}

func (c *slowConsume) Closed() <-chan struct{} { return c.closed }

type slowMsg struct {
	jetstream.Msg
	subject, reply string
	body           []byte
}

func (m slowMsg) Subject() string { return m.subject }
func (m slowMsg) Reply() string   { return m.reply }
func (m slowMsg) Data() []byte    { return m.body }
