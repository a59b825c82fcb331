package events

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// FollowOptions choose what Follow delivers: one session (Tenant and
// Session set), one tenant (Tenant set), sessions of one name in every
// tenant (Session set: "_breakers"), or every session (both empty);
// from FromSeq, from FromTime (store time), or from the beginning.
type FollowOptions struct {
	Tenant   string
	Session  string
	FromSeq  uint64
	FromTime time.Time
}

// Follower is a running Follow. Stop it with Stop; Closed is closed once
// it has stopped and fn will not be called again.
type Follower struct {
	cc     jetstream.ConsumeContext
	once   sync.Once
	closed chan struct{}
}

// Stop stops delivery. It is safe to call more than once and from fn.
func (f *Follower) Stop() { f.once.Do(f.cc.Stop) }

// Closed is closed when the follower has stopped.
func (f *Follower) Closed() <-chan struct{} { return f.closed }

// Follow calls fn with each event stored from the start point on, in stream
// order, including events appended after the call, until Stop is called or
// ctx ends. fn runs on one goroutine at a time; an invalid stored event is
// delivered with Err set (see Event). JetStream's ordered consumer
// re-creates itself after a gap or a server restart, so delivery resumes
// where it stopped.
func (l *Log) Follow(ctx context.Context, opts FollowOptions, fn func(Event)) (*Follower, error) {
	filter := EventSubjectPrefix + ".>"
	switch {
	case opts.Tenant != "" && opts.Session != "":
		filter = l.SessionSubject(opts.Tenant, opts.Session)
	case opts.Tenant != "":
		filter = EventSubjectPrefix + ".*." + opts.Tenant + ".*"
	case opts.Session != "":
		filter = EventSubjectPrefix + ".*.*." + opts.Session
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}}
	switch {
	case opts.FromSeq > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, opts.FromSeq
	case !opts.FromTime.IsZero():
		t := opts.FromTime
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	}
	cctx, cancel := l.withTimeout(ctx)
	cons, err := l.events.OrderedConsumer(cctx, cfg)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("follow: %w", unavailable(err))
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		meta, err := msg.Metadata()
		if err != nil {
			return
		}
		fn(DecodeStoredAt(msg.Subject(), meta.Sequence.Stream, meta.Timestamp, msg.Data()))
	})
	if err != nil {
		return nil, fmt.Errorf("follow: %w", unavailable(err))
	}
	f := &Follower{cc: cc, closed: make(chan struct{})}
	go func() {
		select {
		case <-ctx.Done():
			f.Stop()
		case <-cc.Closed():
		}
		<-cc.Closed()
		close(f.closed)
	}()
	return f, nil
}
