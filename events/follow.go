package events

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
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
	cfg := orderedConfig(filter, opts.FromSeq, opts.FromTime)
	cctx, cancel := l.withTimeout(ctx)
	cons, err := l.events.OrderedConsumer(cctx, cfg)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("follow: %w", unavailable(err))
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		seq, stored, _, err := deliveredMeta(msg)
		if err != nil {
			return
		}
		fn(DecodeStoredAt(msg.Subject(), seq, stored, msg.Data()))
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

// orderedConfig is an ordered consumer of the events on filter from
// fromSeq, else from fromTime (store time), else from the first.
func orderedConfig(filter string, fromSeq uint64, fromTime time.Time) jetstream.OrderedConsumerConfig {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}}
	switch {
	case fromSeq > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, fromSeq
	case !fromTime.IsZero():
		t := fromTime
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	}
	return cfg
}

// readOrdered delivers, through an ordered consumer of cfg, the events up
// to stream sequence last (or until none is pending), in stream order, to
// fn on the caller's goroutine. The consumer's goroutine decodes the
// events while fn folds the ones before: the two run in parallel. They are
// handed over in batches of readBatch (the last one, at the end, shorter),
// so that the channel operation and the wake-up of each goroutine are paid
// once per batch, not per event: a fifth of the fold's CPU above a raw
// read was that hand-off (BENCHMARKS.md, "Fold, a fifth pass"). A batch is
// handed over when full or at the end; a read that fails may so have
// decoded up to readBatch-1 events past the last one fn saw.
// It returns fn's first error, ctx's, or ErrLogUnavailable when no event
// comes for Config.Timeout.
func (l *Log) readOrdered(ctx context.Context, cfg jetstream.OrderedConsumerConfig, last uint64, fn func(Event) error) error {
	cctx, cancel := l.withTimeout(ctx)
	cons, err := l.events.OrderedConsumer(cctx, cfg)
	cancel()
	if err != nil {
		return unavailable(err)
	}
	type batch struct {
		evs []Event
		end bool  // nothing after these to deliver
		err error // after these, the read failed
	}
	// Batches go round: free -> the handler fills one -> full -> fn ->
	// free. One more than full holds is being filled, one more is with fn.
	full := make(chan *batch, readAheadBatches)
	free := make(chan *batch, readAheadBatches+2)
	for range readAheadBatches + 2 {
		free <- &batch{evs: make([]Event, 0, readBatch)}
	}
	quit := make(chan struct{})
	// cur is the batch being filled. The handler's calls come one at a
	// time, except across a reset of the ordered consumer on another
	// goroutine (a reconnect), which can start the new subscription's
	// handler while the old one still waits to hand over a batch: mu,
	// held while it waits, keeps them one at a time and in order (the
	// new subscription starts after the message the old one holds).
	var mu sync.Mutex
	var cur *batch
	// lastMsg is when (time.Since(start)) the handler took its latest
	// message: the wait for the server is for the next event, even while
	// its batch fills.
	start := time.Now()
	var lastMsg atomic.Int64
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		lastMsg.Store(int64(time.Since(start)))
		mu.Lock()
		defer mu.Unlock()
		if cur == nil {
			select {
			case cur = <-free:
			case <-quit:
				return
			}
		}
		if seq, stored, pending, err := deliveredMeta(msg); err != nil {
			cur.err = unavailable(err)
		} else if seq > last {
			cur.end = true
		} else {
			cur.evs = append(cur.evs, DecodeStoredAt(msg.Subject(), seq, stored, msg.Data()))
			cur.end = seq == last || pending == 0
			if !cur.end && len(cur.evs) < readBatch {
				return
			}
		}
		select {
		case full <- cur:
			cur = nil
		case <-quit:
		}
	})
	if err != nil {
		return unavailable(err)
	}
	defer cc.Stop()
	defer close(quit) // first: a handler waiting for a batch gives up
	timer := time.NewTimer(l.cfg.Timeout)
	defer timer.Stop()
	for {
		select {
		case b := <-full:
			for i := range b.evs {
				if err := fn(b.evs[i]); err != nil {
					return err
				}
				if err := ctx.Err(); err != nil {
					return err // not the rest of the batch
				}
			}
			switch {
			case b.err != nil:
				return b.err
			case b.end:
				return nil
			}
			clear(b.evs) // the batch keeps no body
			b.evs = b.evs[:0]
			free <- b
			timer.Reset(l.cfg.Timeout) // the wait is for the server, not fn
		case <-timer.C:
			if idle := time.Since(start) - time.Duration(lastMsg.Load()); idle < l.cfg.Timeout {
				timer.Reset(l.cfg.Timeout - idle) // events come, slower than a batch fills
				continue
			}
			return unavailable(fmt.Errorf("no event within %s", l.cfg.Timeout))
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// readBatch is how many decoded events readOrdered hands to fn at a time,
// and readAheadBatches how many full batches it holds for fn (256 events
// ahead, as one event at a time it held before).
const readBatch, readAheadBatches = 64, 4

// deliveredMeta reads what the log needs of a message a consumer
// delivered (its stream sequence, store time and how many messages the
// consumer has yet to deliver) from the message's reply subject, as
// jetstream.Msg.Metadata does, without allocating its MsgMetadata. The
// subject is "$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>"
// or, from newer servers, with a domain and an account hash after
// "$JS.ACK." and a token at the end (nats.go's parser.GetMetadataFields
// gives the rule); for anything else it asks Metadata.
func deliveredMeta(msg jetstream.Msg) (seq uint64, stored time.Time, pending uint64, err error) {
	reply := msg.Reply()
	if rest, ok := strings.CutPrefix(reply, "$JS.ACK."); ok {
		n := strings.Count(rest, ".") + 1 // tokens after "$JS.ACK."
		skip := 0
		switch {
		case n == 7:
		case n >= 9:
			skip = 2 // domain, account hash
		default:
			n = -1
		}
		if n > 0 {
			var tok [9]string
			for i := 0; i < skip+7; i++ {
				tok[i], rest, _ = strings.Cut(rest, ".")
			}
			t := tok[skip:]
			// t: stream, consumer, delivered, sseq, cseq, tm, pending
			s, ok1 := parseUint(t[3])
			tm, ok2 := parseUint(t[5])
			p, ok3 := parseUint(t[6])
			if ok1 && ok2 && ok3 {
				return s, time.Unix(0, int64(tm)), p, nil
			}
		}
	}
	meta, err := msg.Metadata()
	if err != nil {
		return 0, time.Time{}, 0, err
	}
	return meta.Sequence.Stream, meta.Timestamp, meta.NumPending, nil
}

// parseUint parses a decimal number of at most 19 digits.
func parseUint(s string) (uint64, bool) {
	if len(s) == 0 || len(s) > 19 {
		return 0, false
	}
	var n uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	return n, true
}
