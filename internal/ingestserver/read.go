package ingestserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/nats-io/nats.go"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
)

// read answers a read request: a page of the session's stored events.
func (s *Server) read(m *nats.Msg) {
	tenant, session := tokens(m.Subject, 2)
	rep := ingest.ReadReply{Tenant: tenant, Session: session, Events: []ingest.StoredItem{}}
	s.received(m)
	send := func() {
		b, err := json.Marshal(rep, jsontext.AllowInvalidUTF8(true))
		if err != nil {
			rep = ingest.ReadReply{Tenant: rep.Tenant, Session: rep.Session, Events: []ingest.StoredItem{},
				Error: &ingest.APIError{Code: 500, ErrCode: ingest.CodeUnavailable, Description: "reply not encodable: " + err.Error()}}
			if b, err = json.Marshal(rep, jsontext.AllowInvalidUTF8(true)); err != nil {
				s.l.Warn().Err(err).Msg("read reply not encodable")
				return
			}
		}
		if m.Reply != "" && s.answerable(m) {
			_ = s.nc.Publish(m.Reply, b)
		}
	}
	if !events.ValidToken(tenant) || !events.ValidToken(session) {
		rep.Error = &ingest.APIError{Code: 400, ErrCode: ingest.CodeInvalid, Description: "subject: tenant and session must be tokens"}
		send()
		return
	}
	var req ingest.ReadRequest
	if len(bytes.TrimSpace(m.Data)) > 0 {
		if err := json.Unmarshal(m.Data, &req); err != nil {
			rep.Error = &ingest.APIError{Code: 400, ErrCode: ingest.CodeInvalid, Description: "body: " + err.Error()}
			send()
			return
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*s.log.Config().Timeout)
	defer cancel()
	last, err := s.log.LastSeq(ctx, tenant, session)
	if errors.Is(err, events.ErrSessionNotFound) {
		rep.Error = &ingest.APIError{Code: 404, ErrCode: 10037, Description: "session not found"}
		send()
		return
	}
	if err != nil {
		rep.Error = &ingest.APIError{Code: 503, ErrCode: ingest.CodeUnavailable, Description: err.Error()}
		send()
		return
	}
	rep.LastSeq = last
	if req.MaxEvents < 0 {
		send()
		return
	}
	max := req.MaxEvents
	if max == 0 || max > s.cfg.PageEvents {
		max = s.cfg.PageEvents
	}
	size := 0
	stop := errors.New("page full")
	err = s.log.ReadSession(ctx, tenant, session, events.ReadOptions{FromSeq: req.FromSeq, UntilSeq: req.UntilSeq}, func(ev events.Event) error {
		if len(rep.Events) >= max || (size > 0 && size+len(ev.Data) > s.cfg.PageBytes) {
			rep.NextSeq = ev.Seq
			return stop
		}
		raw := ev.Raw
		if !jsontext.Value(raw).IsValid() {
			// Not strict JSON (the contract's, which a reader decodes
			// with): sent as a string, masked, each byte that is not
			// UTF-8 as U+FFFD; the reader reports the event invalid.
			s, err := json.Marshal(events.MaskString(string(raw)), jsontext.AllowInvalidUTF8(true))
			if err != nil {
				return fmt.Errorf("event at seq %d: %w", ev.Seq, err)
			}
			raw = s
		}
		size += len(raw)
		rep.Events = append(rep.Events, ingest.StoredItem{Seq: ev.Seq, Subject: ev.Subject, Stored: ev.Stored, Event: raw})
		return nil
	})
	if err != nil && !errors.Is(err, stop) {
		rep.Error = &ingest.APIError{Code: 503, ErrCode: ingest.CodeUnavailable, Description: err.Error()}
	}
	send()
}
