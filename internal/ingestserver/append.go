package ingestserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/internal/resend"
)

// turnstoneOnly are the types only Turnstone's own processes write.
var turnstoneOnly = map[events.Type]bool{
	events.TypeRecoveryAttempted: true, events.TypeRecoveryCompleted: true, events.TypeRecoveryParked: true,
	events.TypeSnapshotTaken: true, events.TypeBreakerChanged: true, events.TypeSessionRewound: true, events.TypeSessionForked: true,
}

// needsSync reports whether a request must be appended on its own: a
// batch (a JSON array), or one that carries a JetStream header to check
// or refuse (headers.go).
func needsSync(m *nats.Msg) bool {
	if hasExpectations(m.Header) {
		return true
	}
	for _, c := range m.Data {
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		case '[':
			return true
		}
		return false
	}
	return false
}

// decoded is a request's events, each with the bytes it was sent as.
type decoded struct {
	evs    []events.Event
	bodies [][]byte
	batch  bool
}

// refusal is why a request is refused: its reply's status and code, the
// reason, and whether the request is kept in the quarantine (it broke
// the contract) or only answered (a condition that did not hold, a
// header the ingest does not support).
type refusal struct {
	status, code int
	reason       string
	quarantine   bool
	outcome      string
}

// decode reads a request's body (one event, or a JSON array of events of
// the subject's session) and checks what the ingest adds to the
// contract: the events name the subject's session, are not Turnstone's
// own, and a Nats-Msg-Id is the event's id.
func (s *Server) decode(m *nats.Msg, tenant, session string) (decoded, *refusal) {
	body := bytes.TrimSpace(m.Data)
	invalid := func(reason string) (decoded, *refusal) {
		return decoded{}, &refusal{status: 400, code: ingest.CodeInvalid, reason: reason, quarantine: true, outcome: "invalid"}
	}
	var d decoded
	if len(body) > 0 && body[0] == '[' {
		d.batch = true
		var raws []jsontext.Value
		if err := json.Unmarshal(body, &raws); err != nil || len(raws) == 0 {
			return invalid("body: want one JSON object (an event) or a non-empty JSON array of events")
		}
		if len(raws) > events.MaxAtomicEvents {
			return invalid(fmt.Sprintf("a batch takes at most %d events, got %d", events.MaxAtomicEvents, len(raws)))
		}
		for i, raw := range raws {
			ev, err := events.Decode(raw)
			if err != nil {
				return invalid(fmt.Sprintf("event %d: %v", i, err))
			}
			d.evs, d.bodies = append(d.evs, ev), append(d.bodies, raw)
		}
	} else {
		ev, err := events.Decode(body)
		if err != nil {
			return invalid(err.Error())
		}
		d.evs, d.bodies = []events.Event{ev}, [][]byte{body}
	}
	for i := range d.evs {
		ev := &d.evs[i]
		switch {
		case ev.Tenant != tenant || ev.Session != session:
			return invalid(fmt.Sprintf("event %s names session %s/%s but was published for %s/%s: publish each event on its own session's subject", ev.ID, ev.Tenant, ev.Session, tenant, session))
		case turnstoneOnly[ev.Type]:
			return decoded{}, &refusal{status: 403, code: ingest.CodeForbidden, reason: fmt.Sprintf("event %s: %s events are written by Turnstone's own processes only", ev.ID, ev.Type), quarantine: true, outcome: "forbidden"}
		case strings.HasPrefix(ev.Source, events.DefaultSource+":"):
			return decoded{}, &refusal{status: 403, code: ingest.CodeForbidden, reason: fmt.Sprintf("event %s: source %q is reserved for Turnstone's own processes", ev.ID, ev.Source), quarantine: true, outcome: "forbidden"}
		}
	}
	if id := m.Header.Get(jetstream.MsgIDHeader); id != "" && len(d.evs) == 1 && id != d.evs[0].ID {
		return invalid(fmt.Sprintf("header Nats-Msg-Id %q differs from the event's id %q", id, d.evs[0].ID))
	}
	return d, nil
}

// prepare validates and masks the events; each is stored byte for byte
// as it was sent when masking changes nothing in it (events.Log.
// PrepareBody), whatever headers came with it.
func (s *Server) prepare(d decoded) ([]*nats.Msg, *refusal) {
	msgs := make([]*nats.Msg, len(d.evs))
	for i := range d.evs {
		msg, err := s.log.PrepareBody(d.evs[i], d.bodies[i])
		if err != nil {
			code, status := ingest.CodeInvalid, 400
			if errors.Is(err, events.ErrTooLarge) {
				code = ingest.CodeMessageTooLarge
			}
			reason := err.Error()
			if d.batch {
				reason = fmt.Sprintf("event %d: %s", i, reason)
			}
			return nil, &refusal{status: status, code: code, reason: reason, quarantine: true, outcome: "invalid"}
		}
		msgs[i] = msg
	}
	return msgs, nil
}

// appendAsync handles a request of one event without a condition: it is
// published at once and answered when JetStream acknowledges it (the
// lane's replier). ok is false when it was answered already.
func (s *Server) appendAsync(it item) (pendingReply, bool) {
	m := it.m
	d, ref := s.decode(m, it.tenant, it.session)
	if ref == nil && d.batch {
		// A body that only looked like one event; take it on its own.
		s.appendSync(it)
		return pendingReply{}, false
	}
	var msgs []*nats.Msg
	if ref == nil {
		msgs, ref = s.prepare(d)
	}
	if ref != nil {
		s.answerRefusal(m, it.tenant, it.session, ref)
		return pendingReply{}, false
	}
	gate := s.cfg.Gate
	if !gate.Enter(it.tenant, it.session, gate.Epoch()) {
		s.count("erasing")
		s.reply(m, ingest.PubAck{Error: &ingest.APIError{Code: 503, ErrCode: ingest.CodeUnavailable, Description: "the session is being erased; try again in a moment"}})
		return pendingReply{}, false
	}
	fut, err := s.publish(msgs[0])
	if err != nil {
		gate.Leave(it.tenant, it.session)
		s.count("unavailable")
		s.reply(m, ingest.PubAck{Error: &ingest.APIError{Code: 503, ErrCode: ingest.CodeUnavailable, Description: "event log unavailable: " + err.Error()}})
		return pendingReply{}, false
	}
	return pendingReply{msg: m, out: msgs[0], fut: fut, tenant: it.tenant, session: it.session}, true
}

// appendSync handles a request that is appended on its own: a batch, or
// an event with JetStream expectations. The events are stored as one
// atomic batch: on the session's last sequence as the expectations
// demand, or without a condition (events.Atomic) for a batch without
// one.
func (s *Server) appendSync(it item) {
	m, tenant, session := it.m, it.tenant, it.session
	x, ref := readExpectations(m.Header)
	var d decoded
	if ref == nil {
		d, ref = s.decode(m, tenant, session)
	}
	var msgs []*nats.Msg
	if ref == nil {
		msgs, ref = s.prepare(d)
	}
	if ref != nil {
		s.answerRefusal(m, tenant, session, ref)
		return
	}
	gate := s.cfg.Gate
	if !gate.Enter(tenant, session, gate.Epoch()) {
		s.count("erasing")
		s.reply(m, ingest.PubAck{Error: &ingest.APIError{Code: 503, ErrCode: ingest.CodeUnavailable, Description: "the session is being erased; try again in a moment"}})
		return
	}
	defer gate.Leave(tenant, session)
	ctx, cancel := context.WithTimeout(context.Background(), s.log.Config().Timeout)
	defer cancel()
	var opts []events.AppendOption
	switch {
	case x.conditional():
		expect, ref, err := s.checkExpectations(ctx, x, tenant, session)
		if err != nil {
			s.unavailable(m, err)
			return
		}
		if ref != nil {
			s.answerRefusal(m, tenant, session, ref)
			return
		}
		opts = append(opts, events.ExpectLastSeq(expect))
	case len(msgs) > 1:
		opts = append(opts, events.Atomic())
	}
	// Else only Nats-Expected-Stream, which held: a plain append.
	acks, err := s.log.AppendMsgs(ctx, d.evs, msgs, opts...)
	if err != nil {
		s.appendFailed(m, x, err)
		return
	}
	s.stored(m, acks)
}

// stored answers an append JetStream acknowledged.
func (s *Server) stored(m *nats.Msg, acks []events.Ack) {
	last := acks[len(acks)-1]
	outcome := "stored"
	if last.Duplicate {
		outcome = "duplicate"
	}
	s.count(outcome)
	ack := ingest.PubAck{Stream: events.EventsStream, Seq: last.Seq, Duplicate: last.Duplicate}
	if len(acks) > 1 {
		ack.Count = len(acks)
	}
	s.reply(m, ack)
}

// appendFailed answers an append the log refused or could not store.
func (s *Server) appendFailed(m *nats.Msg, x expectations, err error) {
	switch {
	case errors.Is(err, events.ErrConflict) && x.lastMsgID != "":
		s.count("conflict")
		s.reply(m, ingest.PubAck{Error: &ingest.APIError{Code: 400, ErrCode: ingest.CodeWrongLastMsgID,
			Description: "wrong last msg ID: the session changed since it was read; read it again and decide again"}})
	case errors.Is(err, events.ErrConflict):
		s.count("conflict")
		s.reply(m, ingest.PubAck{Error: &ingest.APIError{Code: 400, ErrCode: ingest.CodeWrongLastSequence,
			Description: "wrong last sequence: the session changed since it was read; read it again and decide again"}})
	case errors.Is(err, events.ErrDuplicateID):
		s.count("invalid")
		s.reply(m, ingest.PubAck{Error: &ingest.APIError{Code: 400, ErrCode: events.JSErrCodeBatchDuplicateID,
			Description: "an event id of the batch is stored already by another call: a resend must repeat the call as it was; new events need new ids"}})
	case errors.Is(err, events.ErrTooLarge):
		s.count("invalid")
		s.reply(m, ingest.PubAck{Error: &ingest.APIError{Code: 400, ErrCode: ingest.CodeMessageTooLarge, Description: err.Error()}})
	default:
		s.unavailable(m, err)
	}
}

func (s *Server) unavailable(m *nats.Msg, err error) {
	s.count("unavailable")
	s.reply(m, ingest.PubAck{Error: &ingest.APIError{Code: 503, ErrCode: ingest.CodeUnavailable, Description: err.Error()}})
}

// answerRefusal answers a refused request at once and, when it broke the
// contract, hands it to the quarantine (which never makes it wait).
func (s *Server) answerRefusal(m *nats.Msg, tenant, session string, r *refusal) {
	if r.quarantine {
		s.refuse(m, tenant, session, r.code, r.reason)
		return
	}
	s.count(r.outcome)
	s.reply(m, ingest.PubAck{Error: &ingest.APIError{Code: r.status, ErrCode: r.code, Description: r.reason}})
}

// awaitReply replies to an async append of lane l once JetStream
// acknowledged it.
func (s *Server) awaitReply(l *lane, pr pendingReply, timer *time.Timer) {
	defer s.cfg.Gate.Leave(pr.tenant, pr.session)
	defer timer.Stop()
	fut := pr.fut
	var pause backoff.BackOff
	for {
		timer.Reset(s.log.Config().Timeout)
		var err error
		select {
		case pa := <-fut.Ok():
			l.outage = time.Time{}
			s.stored1(pr, pa)
			return
		case err = <-fut.Err():
		case <-timer.C:
			s.count("unavailable")
			s.reply(pr.msg, ingest.PubAck{Error: &ingest.APIError{Code: 503, ErrCode: ingest.CodeUnavailable, Description: "event log unavailable: no acknowledgement in time"}})
			return
		}
		// "No responders" (no stream listening yet: a replicated stream
		// just created, or whose leader just moved): the event is sent
		// again here, before the lane's next reply is awaited, so that the
		// events a publisher sent one after another are stored in that
		// order. nats.go's own retry (off: publish) sends each again from a
		// timer of its own, which can store them in another order.
		//
		// The lane's tries share one window, noResponderWindow from the
		// first refusal since its last stored event (or since a window
		// without refusals, which starts a new outage): a lane full of
		// refused events does not wait it once per event, and once it is
		// over every refused event of the lane is answered 503 at once,
		// until one is stored (so an earlier event given up is not
		// followed by a later one sent again and stored). The first try
		// again is at once (the stream may have come back while the
		// lane's earlier events were sent again), the next after growing
		// pauses that end with the window. Nothing is sent again once the
		// partition is released or its lease ended (its next owner
		// appends after this one).
		if !errors.Is(err, jetstream.ErrNoStreamResponse) {
			s.failed1(pr, err)
			return
		}
		if now := time.Now(); l.outage.IsZero() || now.Sub(l.refused) > noResponderWindow {
			l.outage = now // a new outage: none stored since, but none refused for a window either
		}
		l.refused = time.Now()
		left := noResponderWindow - time.Since(l.outage)
		if pause == nil {
			pause = resend.BackOff()
		} else if left > 0 {
			s.pauseWhileOwned(l.p, min(pause.NextBackOff(), left))
			left = noResponderWindow - time.Since(l.outage)
		}
		if left <= 0 || !s.Owned(l.p) {
			s.failed1(pr, err)
			return
		}
		if fut, err = s.publish(pr.out); err != nil {
			s.failed1(pr, err)
			return
		}
	}
}

// pauseWhileOwned waits d, or less when partition p stops being this
// server's meanwhile (released, its lease ended, the server closing): a
// lane's pause before it sends an event again never holds up a handover
// or a close.
func (s *Server) pauseWhileOwned(p int, d time.Duration) {
	for end := time.Now().Add(d); ; {
		left := time.Until(end)
		if left <= 0 || !s.Owned(p) {
			return
		}
		time.Sleep(min(left, 20*time.Millisecond))
	}
}

// noResponderWindow is how long after a lane's first refusal ("no
// responders") since its last stored event the ingest still sends its
// refused events again: as long as the Go log's tries (events.Log.Append),
// on the same schedule (internal/resend).
const noResponderWindow = resend.Window

// publish sends msg, one event, to the event stream without nats.go's
// retry on "no responders" (awaitReply's own keeps the order).
func (s *Server) publish(msg *nats.Msg) (jetstream.PubAckFuture, error) {
	return s.js.PublishMsgAsync(msg, jetstream.WithExpectStream(events.EventsStream), jetstream.WithRetryAttempts(0))
}

// stored1 answers pr, stored (or found stored: Duplicate) at pa.
func (s *Server) stored1(pr pendingReply, pa *jetstream.PubAck) {
	outcome := "stored"
	if pa.Duplicate {
		outcome = "duplicate"
	}
	s.count(outcome)
	s.reply(pr.msg, ingest.PubAck{Stream: pa.Stream, Seq: pa.Sequence, Duplicate: pa.Duplicate})
}

// failed1 answers pr, not stored: JetStream's error as it gave it, or 503
// when the log could not be reached.
func (s *Server) failed1(pr pendingReply, err error) {
	var apiErr *jetstream.APIError
	s.count("unavailable")
	if errors.As(err, &apiErr) {
		s.reply(pr.msg, ingest.PubAck{Error: &ingest.APIError{Code: apiErr.Code, ErrCode: int(apiErr.ErrorCode), Description: apiErr.Description}})
		return
	}
	s.reply(pr.msg, ingest.PubAck{Error: &ingest.APIError{Code: 503, ErrCode: ingest.CodeUnavailable, Description: "event log unavailable: " + err.Error()}})
}
