package events

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

// directBatch is how many messages one batched direct get asks for.
const directBatch = 512

// directRequest is a batched direct get (JetStream ADR-31, nats-server
// 2.11+): up to Batch messages on NextBySubj from Seq (or StartTime).
// The stream must allow direct access.
type directRequest struct {
	Seq        uint64     `json:"seq,omitzero"`
	NextBySubj string     `json:"next_by_subj"`
	Batch      int        `json:"batch"`
	StartTime  *time.Time `json:"start_time,omitzero"`
}

// errDirectDone ends a read: every message asked for was delivered.
var errDirectDone = errors.New("direct get: no more messages")

// errDirectNone: the first batch found no message at all on the subject
// from the start point.
var errDirectNone = errors.New("direct get: no message")

// readDirect delivers the messages on subject from opts' start point with
// batched direct gets: no consumer is created, so reading a session costs
// one request per directBatch events. It delivers the messages the server
// counted when it answered the first request (the Nats-Num-Pending of the
// first reply), so events appended during the read are not delivered, and
// stops after opts.UntilSeq. It returns errDirectNone when there is no
// message from the start point.
//
// The replies of one request are at most directBatch messages and an
// end-of-batch status, and the next request goes out only once they are
// all read, so a channel of directBatch+1 holds them: a read allocates a
// few KiB, not the 64K-message channel of a SubscribeSync.
func (l *Log) readDirect(ctx context.Context, subject string, opts ReadOptions, fn func(Event) error) error {
	nc := l.js.Conn()
	inbox := nats.NewInbox()
	replies := make(chan *nats.Msg, directBatch+1)
	sub, err := nc.ChanSubscribe(inbox, replies)
	if err != nil {
		return unavailable(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	req := directRequest{Seq: opts.FromSeq, NextBySubj: subject, Batch: directBatch}
	if req.Seq == 0 {
		req.Seq = 1
		if !opts.FromTime.IsZero() {
			t := opts.FromTime.UTC()
			req.Seq, req.StartTime = 0, &t
		}
	}
	r := directRead{until: opts.UntilSeq, fn: fn}
	for {
		body, err := marshal(req)
		if err != nil {
			return fmt.Errorf("direct get request: %w", err)
		}
		if err := nc.PublishRequest("$JS.API.DIRECT.GET."+EventsStream, inbox, body); err != nil {
			return unavailable(err)
		}
		next, err := r.batch(ctx, replies, l.cfg.Timeout)
		if errors.Is(err, errDirectDone) {
			return nil
		}
		if err != nil {
			return err
		}
		req = directRequest{Seq: next, NextBySubj: subject, Batch: directBatch}
	}
}

// directRead is the state of one readDirect: how many messages are left to
// deliver (-1 until the first reply tells), and where to stop.
type directRead struct {
	left    int64
	started bool
	until   uint64
	fn      func(Event) error
}

// batch reads one batch's replies and returns the sequence to ask for
// next, errDirectDone when the read is complete, errDirectNone when the
// first batch found nothing, or an error.
func (r *directRead) batch(ctx context.Context, replies <-chan *nats.Msg, timeout time.Duration) (uint64, error) {
	var seq uint64
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		var msg *nats.Msg
		select {
		case msg = <-replies:
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-timer.C:
			return 0, unavailable(fmt.Errorf("direct get: no reply within %s", timeout))
		}
		if !timer.Stop() {
			<-timer.C
		}
		timer.Reset(timeout)
		if status := msg.Header.Get("Status"); status != "" {
			switch status {
			case "204": // end of batch
				if seq == 0 || r.left <= 0 {
					return 0, errDirectDone
				}
				return seq + 1, nil
			case "404":
				if !r.started {
					return 0, errDirectNone
				}
				return 0, errDirectDone
			default:
				return 0, unavailable(fmt.Errorf("direct get: status %s %s", status, msg.Header.Get("Description")))
			}
		}
		var err error
		seq, err = strconv.ParseUint(msg.Header.Get("Nats-Sequence"), 10, 64)
		if err != nil {
			return 0, unavailable(fmt.Errorf("direct get: bad Nats-Sequence %q", msg.Header.Get("Nats-Sequence")))
		}
		if !r.started {
			// The server counted the messages from the start point when it
			// answered: this one and Nats-Num-Pending after it.
			pending, _ := strconv.ParseInt(msg.Header.Get("Nats-Num-Pending"), 10, 64)
			r.left, r.started = pending+1, true
		}
		if r.until != 0 && seq > r.until {
			return 0, errDirectDone
		}
		stored, _ := time.Parse(time.RFC3339Nano, msg.Header.Get("Nats-Time-Stamp"))
		if err := r.fn(DecodeStoredAt(msg.Header.Get("Nats-Subject"), seq, stored, msg.Data)); err != nil {
			return 0, err
		}
		if r.left--; r.left <= 0 || seq == r.until {
			return 0, errDirectDone
		}
	}
}
