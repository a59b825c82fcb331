package events

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"
)

// JSErrCodeBatchDuplicateID is JetStream's error code for an atomic
// publish batch that holds a Nats-Msg-Id already stored within the
// stream's duplicate window ("atomic publish batch contains duplicate
// message id", nats-server's JSAtomicPublishContainsDuplicateMessageErr;
// ADR-50). JetStream refuses the whole batch instead of answering it as a
// duplicate, as it does for a single message.
const JSErrCodeBatchDuplicateID = 10201

// Resends of an atomic batch (an atomic or conditional Append, or a batch
// through the engine's ingest) are made idempotent here, not by
// JetStream: JetStream answers a batch sent again after a lost reply with
// error 10201 (one of its ids is stored) or, for a conditional one, with
// a wrong last sequence (10071, 10164: the batch itself moved the session
// on). Either answer sends the log looking for the batch in its session,
// and when every event of the call is stored there as that call stored
// it (consecutive stream sequences, the same ids in the same order, right
// after the expected sequence or, for a batch without a condition, within
// the duplicate window), the original acks are returned with Duplicate
// set. The ids win over the
// expectation: a call is judged a resend before it is judged a conflict.
// docs/events.md ("Sending again") is the contract.

// resendLooks is how many times a refused batch is looked for before it
// is judged not a resend (a read may be served by a replica a moment
// behind the stream's leader), and resendPause the pause between looks.
const (
	resendLooks = 3
	resendPause = 150 * time.Millisecond
)

// errNotResent is a look that did not find the batch (looked for again).
var errNotResent = errors.New("batch not found in its session")

// resent looks for evs, one session's events sent as one atomic batch, in
// the log: stored at consecutive sequences, in order, with the same ids,
// as the session's first events after sequence expect when conditional
// (the publisher's condition: the batch can only have been stored there),
// else among its events stored within the stream's duplicate window (a
// batch sent without a condition: Atomic). It returns their acks,
// Duplicate set, and true when found; nil and false when not. Append uses
// it when JetStream refuses a batch (10201, 10071, 10164). Errors:
// ErrLogUnavailable.
func (l *Log) resent(ctx context.Context, evs []Event, expect uint64, conditional bool) ([]Ack, bool, error) {
	if len(evs) == 0 {
		return nil, false, nil
	}
	tenant, session := evs[0].Tenant, evs[0].Session
	ids := make([]string, len(evs))
	for i := range evs {
		if evs[i].Tenant != tenant || evs[i].Session != session || evs[i].ID == "" {
			return nil, false, nil
		}
		ids[i] = evs[i].ID
	}
	if conditional {
		return l.resentAfter(ctx, tenant, session, ids, expect)
	}
	return l.resentWithin(ctx, tenant, session, ids)
}

// resentAfter checks the session's first len(ids) events after sequence
// after against ids.
func (l *Log) resentAfter(ctx context.Context, tenant, session string, ids []string, after uint64) ([]Ack, bool, error) {
	var got []Event
	err := l.ReadSession(ctx, tenant, session, ReadOptions{FromSeq: after + 1}, func(ev Event) error {
		got = append(got, ev)
		if len(got) == len(ids) {
			return errFound
		}
		return nil
	})
	if err != nil && !errors.Is(err, errFound) && !errors.Is(err, ErrSessionNotFound) {
		return nil, false, err
	}
	acks, ok := matchBatch(got, ids)
	return acks, ok, nil
}

// resentWithin looks for ids among the session's events stored within the
// duplicate window (the only ones JetStream can have refused the batch
// for).
func (l *Log) resentWithin(ctx context.Context, tenant, session string, ids []string) ([]Ack, bool, error) {
	window := l.cfg.DuplicateWindow
	if window <= 0 {
		window = DefaultDuplicateWindow
	}
	from := time.Now().Add(-window - time.Minute) // a minute for clocks and store time
	var tail []Event                              // the events from the first id's on
	err := l.ReadSession(ctx, tenant, session, ReadOptions{FromTime: from}, func(ev Event) error {
		if len(tail) == 0 && ev.ID != ids[0] {
			return nil
		}
		tail = append(tail, ev)
		if len(tail) == len(ids) {
			return errFound
		}
		return nil
	})
	if err != nil && !errors.Is(err, errFound) && !errors.Is(err, ErrSessionNotFound) {
		return nil, false, err
	}
	acks, ok := matchBatch(tail, ids)
	return acks, ok, nil
}

var errFound = errors.New("found")

// matchBatch reports whether got are the events of ids stored as one
// batch: the same ids in order at consecutive sequences; it returns their
// acks, as duplicates.
func matchBatch(got []Event, ids []string) ([]Ack, bool) {
	if len(got) != len(ids) {
		return nil, false
	}
	acks := make([]Ack, len(ids))
	for i, ev := range got {
		if ev.ID != ids[i] || ev.Seq != got[0].Seq+uint64(i) {
			return nil, false
		}
		acks[i] = Ack{ID: ev.ID, Seq: ev.Seq, Duplicate: true}
	}
	return acks, true
}

// batchRefusal tells what JetStream's refusal of an atomic batch means for
// a resend: dup is true for error 10201 (an id of the batch is stored),
// conflict for a wrong last sequence (10071, 10164). Both send the caller
// looking for the batch (resent) before it answers.
func batchRefusal(err error) (dup, conflict bool) {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false, false
	}
	switch apiErr.ErrorCode {
	case JSErrCodeBatchDuplicateID:
		return true, false
	case jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant:
		return false, true
	}
	return false, false
}

// resendOrRefusal answers a batch JetStream refused with apiErr: the
// original acks when the call was stored before (a resend: resent, after
// expect when conditional, else within the duplicate window), else the
// refusal as the log's error (ErrConflict, ErrDuplicateID).
func (l *Log) resendOrRefusal(ctx context.Context, evs []Event, conditional bool, expect uint64, apiErr *jetstream.APIError) ([]Ack, error) {
	dup, conflict := batchRefusal(apiErr)
	if !dup && !conflict {
		return nil, fmt.Errorf("append events: %w", classify(apiErr))
	}
	looks := 1
	if dup {
		// JetStream says an id of the batch is stored: look again if a
		// replica answered before it had it.
		looks = resendLooks
	}
	var (
		acks    []Ack
		looked  int
		lookErr error // a look that failed: no more looks
	)
	err := backoff.Retry(func() error {
		looked++
		a, found, err := l.resent(ctx, evs, expect, conditional)
		switch {
		case err != nil:
			lookErr = err
			return backoff.Permanent(err)
		case !found:
			return errNotResent
		}
		acks = a
		return nil
	}, backoff.WithContext(backoff.WithMaxRetries(backoff.NewConstantBackOff(resendPause), uint64(looks-1)), ctx))
	switch {
	case err == nil:
		return acks, nil
	case lookErr != nil:
		return nil, fmt.Errorf("append events: %w (looking for a resent batch: %w)", classify(apiErr), lookErr)
	case looked < looks: // ctx ended between two looks
		return nil, fmt.Errorf("append events: %w: %w", ErrLogUnavailable, err)
	}
	if dup {
		return nil, fmt.Errorf("append events: %w: %w", ErrDuplicateID, apiErr)
	}
	return nil, fmt.Errorf("append events: %w", classify(apiErr))
}
