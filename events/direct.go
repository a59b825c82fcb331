package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

// directBatch is how many messages one batched direct get asks for.
const directBatch = 512

// directRequest is a batched direct get (JetStream ADR-31, nats-server
// 2.11+): up to Batch messages on NextBySubj from Seq (or StartTime),
// stopping after UpToSeq. The stream must allow direct access.
type directRequest struct {
	Seq        uint64     `json:"seq,omitempty"`
	NextBySubj string     `json:"next_by_subj"`
	Batch      int        `json:"batch"`
	UpToSeq    uint64     `json:"up_to_seq,omitempty"`
	StartTime  *time.Time `json:"start_time,omitempty"`
}

var errDirectDone = errors.New("direct get: no more messages")

// readDirect delivers the messages on subject from opts' start point up to
// last with batched direct gets: no consumer is created, so reading a
// session costs one request per directBatch events.
func (l *Log) readDirect(ctx context.Context, subject string, last uint64, opts ReadOptions, fn func(Event) error) error {
	if opts.UntilSeq != 0 && opts.UntilSeq < last {
		last = opts.UntilSeq
	}
	nc := l.js.Conn()
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return unavailable(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	req := directRequest{Seq: opts.FromSeq, NextBySubj: subject, Batch: directBatch, UpToSeq: last}
	if req.Seq == 0 {
		req.Seq = 1
		if !opts.FromTime.IsZero() {
			t := opts.FromTime.UTC()
			req.Seq, req.StartTime = 0, &t
		}
	}
	for {
		body, _ := json.Marshal(req)
		if err := nc.PublishRequest("$JS.API.DIRECT.GET."+EventsStream, inbox, body); err != nil {
			return unavailable(err)
		}
		next, err := l.directBatch(ctx, sub, last, fn)
		if errors.Is(err, errDirectDone) {
			return nil
		}
		if err != nil {
			return err
		}
		req = directRequest{Seq: next, NextBySubj: subject, Batch: directBatch, UpToSeq: last}
	}
}

// directBatch reads one batch's replies and returns the sequence to ask for
// next, errDirectDone when the read is complete, or an error.
func (l *Log) directBatch(ctx context.Context, sub *nats.Subscription, last uint64, fn func(Event) error) (uint64, error) {
	var seq uint64
	for {
		wctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
		msg, err := sub.NextMsgWithContext(wctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			return 0, unavailable(fmt.Errorf("direct get: %w", err))
		}
		if status := msg.Header.Get("Status"); status != "" {
			switch status {
			case "204": // end of batch
				pending, _ := strconv.ParseUint(msg.Header.Get("Nats-Num-Pending"), 10, 64)
				if pending == 0 || seq == 0 || seq >= last {
					return 0, errDirectDone
				}
				return seq + 1, nil
			case "404":
				return 0, errDirectDone
			default:
				return 0, unavailable(fmt.Errorf("direct get: status %s %s", status, msg.Header.Get("Description")))
			}
		}
		seq, err = strconv.ParseUint(msg.Header.Get("Nats-Sequence"), 10, 64)
		if err != nil {
			return 0, unavailable(fmt.Errorf("direct get: bad Nats-Sequence %q", msg.Header.Get("Nats-Sequence")))
		}
		if seq > last {
			continue // drain the batch
		}
		stored, _ := time.Parse(time.RFC3339Nano, msg.Header.Get("Nats-Time-Stamp"))
		if err := fn(DecodeStoredAt(msg.Header.Get("Nats-Subject"), seq, stored, msg.Data)); err != nil {
			return 0, err
		}
	}
}
