package ingest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
)

// ClientConfig configures a Client. The zero value takes the defaults.
type ClientConfig struct {
	// Timeout bounds each request when the caller's context has no
	// deadline. Default 5 seconds.
	Timeout time.Duration
	// MaxPending bounds the appends in flight. Default 4096.
	MaxPending int
	// RetryFor is how long Append keeps sending the events no engine
	// acknowledged (no engine answers; the session's partition is moving
	// to another engine), with exponential back-off, before it gives up
	// with events.ErrLogUnavailable: in the call's order, from the first
	// one not acknowledged, so that one session's events keep their order.
	// The events' ids make a retry safe.
	// Reads (ReadSession, LastSeq) are asked again for as long while no
	// engine answers at all (no responders). Default 30 seconds;
	// negative: no retry.
	RetryFor time.Duration
}

// Client is the publisher's side of the ingest, in Go: an
// events.SessionLog that appends through the engine
// (agent.evt.<tenant>.<session>) and reads through it
// (agent.read.<tenant>.<session>), so it needs no access to the streams:
// under auth a tenant's credentials are enough. The client validates and
// encodes the events; the engine validates them again and masks them. It
// is safe for concurrent use.
type Client struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	cfg ClientConfig
}

var _ events.SessionLog = (*Client)(nil)

// NewClient returns a client on nc, with cfg's zero values set to their
// defaults (Timeout events.DefaultTimeout, MaxPending 4,096, RetryFor
// 30 s). A negative Timeout or MaxPending is an error; so is nats.go's
// refusal of the JetStream context. It sends nothing.
func NewClient(nc *nats.Conn, cfg ClientConfig) (*Client, error) {
	if cfg.Timeout < 0 || cfg.MaxPending < 0 {
		return nil, errors.New("new ingest client: timeout and max pending must not be negative")
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = events.DefaultTimeout
	}
	if cfg.MaxPending == 0 {
		cfg.MaxPending = 4096
	}
	if cfg.RetryFor == 0 {
		cfg.RetryFor = 30 * time.Second
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(cfg.MaxPending))
	if err != nil {
		return nil, fmt.Errorf("new ingest client: %w", err)
	}
	return &Client{nc: nc, js: js, cfg: cfg}, nil
}

// Append sends evs to the engine, in order, and returns one Ack per event
// (see events.Log.Append for the semantics). Nothing is sent when any
// event breaks the contract (events.Validate, here); the engine validates
// again, masks, and quarantines what it refuses. With events.Atomic (two
// or more events) or events.ExpectLastSeq the events (of one session) are
// one request, stored as one atomic batch or not at all; one event with
// Atomic alone is sent as any one event is, atomic as it is. Errors: events.ErrInvalid
// (refused here or by the engine, which quarantines it),
// events.ErrTooLarge, events.ErrConflict, events.ErrDuplicateID,
// events.ErrLogUnavailable (no engine answers: try again; the ids make a
// retry safe), ctx's error when ctx ended before anything was sent
// (nothing is).
func (c *Client) Append(ctx context.Context, evs []events.Event, opts ...events.AppendOption) ([]events.Ack, error) {
	if len(evs) == 0 {
		return nil, nil
	}
	bodies := make([][]byte, len(evs))
	var errs []error
	for i := range evs {
		ev := &evs[i]
		// Validated here too, so that a call with an invalid event sends
		// none of its events, as events.Log.Append does (the
		// sessionlogtest suite checks both): the engine answers each
		// request on its own, and would store the valid ones sent before.
		// The engine validates again, masks, and refuses (quarantines)
		// what it must.
		if err := events.Validate(ev); err != nil {
			errs = append(errs, &events.EventError{Tenant: ev.Tenant, Session: ev.Session, ID: ev.ID, Err: fmt.Errorf("event %d: %w", i, err)})
			continue
		}
		b, err := ev.Encode()
		if err != nil {
			errs = append(errs, &events.EventError{Tenant: ev.Tenant, Session: ev.Session, ID: ev.ID, Err: err})
			continue
		}
		bodies[i] = b
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("append events: %w", errors.Join(errs...))
	}
	if err := ctx.Err(); err != nil {
		// Nothing is sent: an async publish would go out whatever ctx
		// says, and its ack could race ctx's end.
		return nil, fmt.Errorf("append events: %w", err)
	}
	seq, conditional := events.ExpectedLastSeq(opts...)
	// One event is atomic as it is: with events.Atomic alone it goes out
	// as an unconditional one does (as events.Log.Append sends it).
	batch := conditional || events.IsAtomic(opts...) && len(evs) > 1
	acks := make([]events.Ack, len(evs))
	from := 0 // the first event not acknowledged yet
	b := backoff.WithContext(backoff.NewExponentialBackOff(backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMaxInterval(2*time.Second), backoff.WithMaxElapsedTime(max(c.cfg.RetryFor, 0))), ctx)
	for {
		var got []events.Ack
		var err error
		if batch {
			got, err = c.appendBatch(ctx, evs, bodies, conditional, seq)
		} else {
			got, err = c.appendAsync(ctx, evs[from:], bodies[from:])
		}
		n := 0 // how many came back acknowledged, in order
		for n < len(got) && got[n].Seq != 0 {
			n++
		}
		copy(acks[from:], got[:n])
		from += n
		if err == nil && from == len(evs) {
			return acks, nil
		}
		if err == nil {
			err = fmt.Errorf("append events: %w: %d events not acknowledged", events.ErrLogUnavailable, len(evs)-from)
		}
		// Only an unanswered append is sent again: a refusal (invalid,
		// conflict, too large) is the answer. The events from the first
		// one not acknowledged are sent again in order; those stored
		// meanwhile come back as duplicates.
		if !errors.Is(err, events.ErrLogUnavailable) || c.cfg.RetryFor < 0 {
			return acks[:from], err
		}
		wait := b.NextBackOff()
		if wait == backoff.Stop {
			return acks[:from], err
		}
		select {
		case <-ctx.Done():
			return acks[:from], err
		case <-time.After(wait):
		}
	}
}

func (c *Client) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, c.cfg.Timeout)
}

// appendAsync sends each event as its own request, pipelined; the
// engine's JetStream-shaped replies are read by the JetStream client.
// nats.go's retry on "no responders" is off: it sends each refused
// request again from a timer of its own, which could store one session's
// events in another order; Append sends the unanswered ones again itself,
// in order.
func (c *Client) appendAsync(ctx context.Context, evs []events.Event, bodies [][]byte) ([]events.Ack, error) {
	futures := make([]jetstream.PubAckFuture, len(evs))
	for i := range evs {
		m := nats.NewMsg(events.EventSubject(evs[i].Tenant, evs[i].Session))
		m.Data = bodies[i]
		m.Header.Set(jetstream.MsgIDHeader, evs[i].ID)
		f, err := c.js.PublishMsgAsync(m, jetstream.WithRetryAttempts(0))
		if err != nil {
			return nil, fmt.Errorf("append event %s: %w", evs[i].ID, classify(err))
		}
		futures[i] = f
	}
	acks := make([]events.Ack, len(evs))
	var errs []error
	timer := time.NewTimer(c.cfg.Timeout)
	defer timer.Stop()
	for i, f := range futures {
		select {
		case pa := <-f.Ok():
			acks[i] = events.Ack{ID: evs[i].ID, Seq: pa.Sequence, Duplicate: pa.Duplicate}
		case err := <-f.Err():
			errs = append(errs, fmt.Errorf("append event %s: %w", evs[i].ID, classify(err)))
		case <-ctx.Done():
			return nil, fmt.Errorf("append events: %w: %w", events.ErrLogUnavailable, ctx.Err())
		case <-timer.C:
			return nil, fmt.Errorf("append events: %w: no reply within %s", events.ErrLogUnavailable, c.cfg.Timeout)
		}
		timer.Reset(c.cfg.Timeout)
	}
	if len(errs) > 0 {
		return acks, errors.Join(errs...)
	}
	return acks, nil
}

// appendBatch sends the events as one request (a JSON array), which the
// engine stores as one atomic batch: conditional on the session's last
// sequence being expect when conditional.
func (c *Client) appendBatch(ctx context.Context, evs []events.Event, bodies [][]byte, conditional bool, expect uint64) ([]events.Ack, error) {
	for i := range evs {
		if evs[i].Tenant != evs[0].Tenant || evs[i].Session != evs[0].Session {
			return nil, fmt.Errorf("append events: %w: an atomic or conditional append takes events of one session", events.ErrInvalid)
		}
	}
	if len(evs) > events.MaxAtomicEvents {
		return nil, fmt.Errorf("append events: %w: an atomic append takes at most %d events, got %d", events.ErrInvalid, events.MaxAtomicEvents, len(evs))
	}
	body := []byte{'['}
	for i, b := range bodies {
		if i > 0 {
			body = append(body, ',')
		}
		body = append(body, b...)
	}
	body = append(body, ']')
	m := nats.NewMsg(events.EventSubject(evs[0].Tenant, evs[0].Session))
	m.Data = body
	if conditional {
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(expect, 10))
	}
	if len(evs) == 1 {
		m.Header.Set(jetstream.MsgIDHeader, evs[0].ID)
	}
	rctx, cancel := c.withTimeout(ctx)
	defer cancel()
	resp, err := c.nc.RequestMsgWithContext(rctx, m)
	if err != nil {
		return nil, fmt.Errorf("append events: %w", classify(err))
	}
	var ack PubAck
	if err := json.Unmarshal(resp.Data, &ack); err != nil {
		return nil, fmt.Errorf("append events: %w: bad reply %q", events.ErrLogUnavailable, resp.Data)
	}
	if ack.Error != nil {
		return nil, fmt.Errorf("append events: %w", classify(ack.Error))
	}
	acks := make([]events.Ack, len(evs))
	for j := range evs {
		acks[j] = events.Ack{ID: evs[j].ID, Seq: ack.Seq - uint64(len(evs)-1-j), Duplicate: ack.Duplicate}
	}
	return acks, nil
}

// classify turns an ingest error into the log's sentinels.
func classify(err error) error {
	code := 0
	var apiErr *APIError
	var jsErr *jetstream.APIError
	switch {
	case errors.As(err, &apiErr):
		code = apiErr.ErrCode
	case errors.As(err, &jsErr):
		code = int(jsErr.ErrorCode)
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoStreamResponse):
		return fmt.Errorf("%w: no engine answers (is engine serve running?): %w", events.ErrLogUnavailable, err)
	}
	switch code {
	case CodeInvalid, CodeForbidden, CodeUnsupportedHeader, CodeStreamNotMatch:
		return fmt.Errorf("%w: %w", events.ErrInvalid, err)
	case int(jetstream.JSErrCodeStreamWrongLastSequence), int(jetstream.JSErrCodeStreamWrongLastSequenceConstant), CodeWrongLastMsgID:
		return fmt.Errorf("%w: %w", events.ErrConflict, err)
	case int(jetstream.JSErrCodeStreamMessageExceedsMaximum):
		return fmt.Errorf("%w: %w", events.ErrTooLarge, err)
	case events.JSErrCodeBatchDuplicateID:
		return fmt.Errorf("%w: %w", events.ErrDuplicateID, err)
	}
	return fmt.Errorf("%w: %w", events.ErrLogUnavailable, err)
}

// read asks for one page. While no engine answers (no responders: none
// is running yet, as when a runtime starts with the engines; or no reply
// in time: the engine that took the request lost its server, or the log
// is unavailable), it asks again with the appends' back-off for up to
// RetryFor; a read is safe to repeat.
func (c *Client) read(ctx context.Context, tenant, session string, req ReadRequest) (*ReadReply, error) {
	b := backoff.WithContext(backoff.NewExponentialBackOff(backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMaxInterval(2*time.Second), backoff.WithMaxElapsedTime(max(c.cfg.RetryFor, 0))), ctx)
	for {
		rep, err := c.readOnce(ctx, tenant, session, req)
		if !errors.Is(err, events.ErrLogUnavailable) || c.cfg.RetryFor < 0 || ctx.Err() != nil {
			return rep, err
		}
		wait := b.NextBackOff()
		if wait == backoff.Stop {
			return rep, err
		}
		select {
		case <-ctx.Done():
			return rep, err
		case <-time.After(wait):
		}
	}
}

// readOnce asks for one page once.
func (c *Client) readOnce(ctx context.Context, tenant, session string, req ReadRequest) (*ReadReply, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("read session %s/%s: %w", tenant, session, err)
	}
	rctx, cancel := c.withTimeout(ctx)
	defer cancel()
	resp, err := c.nc.RequestWithContext(rctx, ReadSubject(tenant, session), b)
	if err != nil {
		return nil, fmt.Errorf("read session %s/%s: %w", tenant, session, classify(err))
	}
	var rep ReadReply
	if err := json.Unmarshal(resp.Data, &rep); err != nil {
		return nil, fmt.Errorf("read session %s/%s: %w: bad reply", tenant, session, events.ErrLogUnavailable)
	}
	if rep.Error != nil {
		if rep.Error.Code == 404 {
			return nil, fmt.Errorf("read session %s/%s: %w", tenant, session, events.ErrSessionNotFound)
		}
		return nil, fmt.Errorf("read session %s/%s: %w", tenant, session, classify(rep.Error))
	}
	return &rep, nil
}

// LastSeq returns the stream sequence of the session's last event, or 0
// and events.ErrSessionNotFound.
func (c *Client) LastSeq(ctx context.Context, tenant, session string) (uint64, error) {
	rep, err := c.read(ctx, tenant, session, ReadRequest{MaxEvents: -1})
	if err != nil {
		return 0, err
	}
	return rep.LastSeq, nil
}

// ReadSession calls fn with each stored event of the session, in stream
// order, from opts.FromSeq (opts.FromTime is not supported here) to the
// last at the start of the read (or opts.UntilSeq), page by page. Events
// that break the contract come with Err set, as events.Log delivers them.
func (c *Client) ReadSession(ctx context.Context, tenant, session string, opts events.ReadOptions, fn func(events.Event) error) error {
	if !opts.FromTime.IsZero() && opts.FromSeq == 0 {
		return fmt.Errorf("read session %s/%s: reading from a time is not supported through the engine", tenant, session)
	}
	req := ReadRequest{FromSeq: opts.FromSeq, UntilSeq: opts.UntilSeq}
	first := true
	for {
		rep, err := c.read(ctx, tenant, session, req)
		if err != nil {
			return err
		}
		if first {
			first = false
			if req.UntilSeq == 0 || req.UntilSeq > rep.LastSeq {
				req.UntilSeq = rep.LastSeq // the last at the start of the read
			}
		}
		for _, it := range rep.Events {
			if err := fn(events.DecodeStoredAt(it.Subject, it.Seq, it.Stored, it.Event)); err != nil {
				return err
			}
		}
		if rep.NextSeq == 0 || len(rep.Events) == 0 {
			return nil
		}
		req.FromSeq = rep.NextSeq
	}
}
