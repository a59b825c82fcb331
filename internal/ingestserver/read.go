package ingestserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
)

// read answers a read request: a page of the session's stored events.
func (s *Server) read(m *nats.Msg) {
	tenant, session := tokens(m.Subject, 2)
	rep := ingest.ReadReply{Tenant: tenant, Session: session, Events: []ingest.StoredItem{}}
	send := func() {
		b, _ := json.Marshal(rep)
		if m.Reply != "" {
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
		if !json.Valid(raw) {
			raw, _ = json.Marshal(events.MaskString(string(raw)))
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
