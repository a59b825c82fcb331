package events

import (
	"context"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
)

// CountThrough estimates how many events the session has at stream
// sequences up to seq: the events from its first on minus those after
// seq, each counted by a one-message batched direct get (ADR-31: the
// reply's Nats-Num-Pending), the first asked first. Events appended
// between the two reads make it lower than the truth; a replica a moment
// behind the leader answering the second read can make it higher. So it
// is a cheap first look (the projector's check of a snapshot against the
// log), to be confirmed by reading the events. 0 when the session has no
// event. Errors: ErrLogUnavailable.
func (l *Log) CountThrough(ctx context.Context, tenant, session string, seq uint64) (int, error) {
	subject := l.SessionSubject(tenant, session)
	all, err := l.countFrom(ctx, subject, 1)
	if err != nil {
		return 0, fmt.Errorf("count events of %s/%s: %w", tenant, session, err)
	}
	after, err := l.countFrom(ctx, subject, seq+1)
	if err != nil {
		return 0, fmt.Errorf("count events of %s/%s: %w", tenant, session, err)
	}
	return max(all-after, 0), nil
}

// Head returns the stream sequence of the session's first event and how
// many events it has, as one replica counted them when it answered (one
// batched direct get, ADR-31). ErrSessionNotFound when it has none;
// ErrLogUnavailable.
func (l *Log) Head(ctx context.Context, tenant, session string) (first uint64, n int, err error) {
	first, n, err = l.headFrom(ctx, l.SessionSubject(tenant, session), 1)
	if err != nil {
		return 0, 0, fmt.Errorf("head of %s/%s: %w", tenant, session, err)
	}
	if n == 0 {
		return 0, 0, fmt.Errorf("head of %s/%s: %w", tenant, session, ErrSessionNotFound)
	}
	return first, n, nil
}

// countFrom is how many messages subject holds from stream sequence seq
// on, as the server counted them when it answered.
func (l *Log) countFrom(ctx context.Context, subject string, seq uint64) (int, error) {
	_, n, err := l.headFrom(ctx, subject, seq)
	return n, err
}

// headFrom returns the sequence of the first message on subject from seq
// on and how many there are from it on.
func (l *Log) headFrom(ctx context.Context, subject string, seq uint64) (uint64, int, error) {
	ctx, cancel := l.withTimeout(ctx)
	defer cancel()
	nc := l.js.Conn()
	inbox := nats.NewInbox()
	replies := make(chan *nats.Msg, 4)
	sub, err := nc.ChanSubscribe(inbox, replies)
	if err != nil {
		return 0, 0, unavailable(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	body, _ := marshal(directRequest{Seq: seq, NextBySubj: subject, Batch: 1})
	if err := nc.PublishRequest("$JS.API.DIRECT.GET."+EventsStream, inbox, body); err != nil {
		return 0, 0, unavailable(err)
	}
	select {
	case msg := <-replies:
		switch status := msg.Header.Get("Status"); status {
		case "":
			pending, err := strconv.Atoi(msg.Header.Get("Nats-Num-Pending"))
			if err != nil {
				return 0, 0, unavailable(fmt.Errorf("direct get: bad Nats-Num-Pending %q", msg.Header.Get("Nats-Num-Pending")))
			}
			at, err := strconv.ParseUint(msg.Header.Get("Nats-Sequence"), 10, 64)
			if err != nil {
				return 0, 0, unavailable(fmt.Errorf("direct get: bad Nats-Sequence %q", msg.Header.Get("Nats-Sequence")))
			}
			return at, pending + 1, nil
		case "404":
			return 0, 0, nil
		default:
			return 0, 0, unavailable(fmt.Errorf("direct get: status %s %s", status, msg.Header.Get("Description")))
		}
	case <-ctx.Done():
		return 0, 0, unavailable(ctx.Err())
	}
}
