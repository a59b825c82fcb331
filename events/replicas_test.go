package events

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// scalingStream is an events stream whose replica count an operator
// changes under a running process: its cached info says what the last
// Info read, and Info reads the count now set.
type scalingStream struct {
	jetstream.Stream
	cached   atomic.Pointer[jetstream.StreamInfo]
	replicas atomic.Int32
	reads    atomic.Int32
}

func (s *scalingStream) info(replicas int) *jetstream.StreamInfo {
	return &jetstream.StreamInfo{Config: jetstream.StreamConfig{Name: EventsStream, Replicas: replicas}}
}

func (s *scalingStream) CachedInfo() *jetstream.StreamInfo { return s.cached.Load() }

func (s *scalingStream) Info(context.Context, ...jetstream.StreamInfoOpt) (*jetstream.StreamInfo, error) {
	s.reads.Add(1)
	i := s.info(int(s.replicas.Load()))
	s.cached.Store(i)
	return i, nil
}

// A stream scaled from one replica to three while a Log is open is read
// the replicated way once the Log's view of it is replicasRecheck old:
// the info is read again in the background, once however many reads ask.
func TestReplicatedFollowsAStreamScaledUnderIt(t *testing.T) {
	t.Parallel()
	s := &scalingStream{}
	s.cached.Store(s.info(1))
	s.replicas.Store(1)
	l := &Log{events: s, cfg: Config{Timeout: time.Second}}
	l.infoAt.Store(time.Now().UnixNano()) // as Open leaves it
	s.replicas.Store(3)                   // engine setup --replicas 3
	if l.replicated() {
		t.Fatal("replicated before the stream's info was read again")
	}
	if n := s.reads.Load(); n != 0 {
		t.Fatalf("the info was read %d times before it was %s old", n, replicasRecheck)
	}
	l.infoAt.Store(time.Now().Add(-replicasRecheck - time.Second).UnixNano())
	for range 50 {
		l.replicated()
	}
	deadline := time.Now().Add(5 * time.Second)
	for !l.replicated() {
		if time.Now().After(deadline) {
			t.Fatal("still read as one replica after the info was due again")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := s.reads.Load(); n != 1 {
		t.Fatalf("the info was read %d times, want once", n)
	}
	// A Log that Open did not make (infoAt 0) never reads it again.
	other := &Log{events: s, cfg: Config{Timeout: time.Second}}
	other.replicated()
	time.Sleep(20 * time.Millisecond)
	if n := s.reads.Load(); n != 1 {
		t.Fatalf("a Log without an opening read the info: %d reads", n)
	}
}
