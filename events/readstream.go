package events

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/internal/resend"
)

// ReadStream calls fn with every message an ordered consumer of st with
// cfg delivers, in order, up to the last one pending when the read
// started, fetching up to batch messages at a time (0: 1,000). It returns
// fn's first error, or JetStream's.
//
// It is how Turnstone reads a whole stream or bucket (`engine recovery
// list`, the fleet index) and it works on replicated streams: every Fetch
// of an ordered consumer creates a new ephemeral consumer, and on a
// JetStream cluster the first pull sent to a consumer just created can
// meet "no responders" (the consumer is not yet running on the server
// chosen for it; about one fetch in fifteen on an R3 stream with
// nats-server 2.15). ReadStream retries such a pull from where the read
// stopped, with a growing pause, for up to about 6 seconds, instead of
// failing the read. Ordered consumers' Next, which creates a consumer for
// every message, fails there after a few messages; do not use it.
func ReadStream(ctx context.Context, st jetstream.Stream, cfg jetstream.OrderedConsumerConfig, batch int, fn func(jetstream.Msg) error) error {
	if batch <= 0 {
		batch = 1000
	}
	cons, err := st.OrderedConsumer(ctx, cfg)
	if err != nil {
		return fmt.Errorf("read stream: %w", err)
	}
	var info *jetstream.ConsumerInfo
	err = retryTransient(ctx, noResponders, func() error {
		var err error
		info, err = cons.Info(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("read stream: %w", err)
	}
	remaining := info.NumPending
	for remaining > 0 {
		n := 0
		err := retryTransient(ctx, noResponders, func() error {
			msgs, err := cons.Fetch(int(min(remaining, uint64(batch))), jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				return err
			}
			for msg := range msgs.Messages() {
				n++
				meta, err := msg.Metadata()
				if err != nil {
					return err
				}
				remaining = meta.NumPending
				if err := fn(msg); err != nil {
					return &callbackError{err}
				}
			}
			if err := msgs.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !(n > 0 && errors.Is(err, nats.ErrTimeout)) {
				return err
			}
			return nil
		})
		var cbErr *callbackError
		if errors.As(err, &cbErr) {
			return cbErr.err
		}
		if err != nil {
			return fmt.Errorf("read stream: %w", err)
		}
		if n == 0 {
			break // nothing more came within the wait: what was pending is gone (a limit, a purge)
		}
	}
	return nil
}

// callbackError carries ReadStream's callback's error out of the retry.
type callbackError struct{ err error }

func (e *callbackError) Error() string { return e.err.Error() }

// retryTransient runs op again while it fails with an error transient
// reports, on internal/resend's schedule (pausing 50 ms, then about 1.5
// times as long each time, each pause randomized by half, up to 1 s, for
// at most 10 tries: about 3.5 s of pauses), within ctx; any other result
// is returned at once. When ctx ends first, the error is ctx's, with the
// last answer's.
func retryTransient(ctx context.Context, transient func(error) bool, op func() error) error {
	var last error
	err := backoff.Retry(func() error {
		err := op()
		if err != nil && !transient(err) {
			return backoff.Permanent(err)
		}
		last = err
		return err
	}, backoff.WithContext(backoff.WithMaxRetries(resend.BackOff(), resend.Tries-1), ctx))
	if err != nil && last != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return fmt.Errorf("%w (the last answer: %w)", err, last)
	}
	return err
}

// noResponders: nothing listened on the request's subject (a stream just
// created, or whose leader just moved, before its interest reached the
// server this client is connected to).
func noResponders(err error) bool { return errors.Is(err, nats.ErrNoResponders) }

// leaderUnavailable is noResponders for a JetStream API request that a
// stream's leader answers, and also errNoAnswer (a try had no answer in
// its time: the leader is gone and the others do not know it yet) and
// JetStream's "temporarily unavailable" (10008), which nats-server
// answers to a "get message" request from a node that knows the meta
// group, or the stream's group, to be without a leader (jsMsgGetRequest):
// for the seconds of an election, though the stream itself lost nothing.
func leaderUnavailable(err error) bool {
	var apiErr *jetstream.APIError
	return noResponders(err) || errors.Is(err, errNoAnswer) || errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrCodeClusterNotAvail
}

// errNoAnswer: a try of a request that only a stream's leader answers
// had no answer within its time (leaderTry).
var errNoAnswer = errors.New("no answer from the stream's leader")

// jsErrCodeClusterNotAvail is JetStream's JSClusterNotAvailErr, "JetStream
// system temporarily unavailable" (nats-server's errors.json; nats.go's
// jetstream names no constant for it).
const jsErrCodeClusterNotAvail jetstream.ErrorCode = 10008
