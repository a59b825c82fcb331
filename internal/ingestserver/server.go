// Package ingestserver is the engine's side of the ingest (package ingest
// is the contract and the publisher's client): it answers the publish
// subject agent.evt.<tenant>.<session>, validates, masks and appends each
// event to its stored subject, quarantines what it refuses, and answers
// reads of a session. Only the engine that owns a session's partition
// appends it, so one publisher's events of a session are stored in the
// order it sent them.
package ingestserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/internal/erasure"
)

// Config configures a Server. The zero value takes the defaults.
type Config struct {
	// Owns reports whether this engine owns partition p now; nil owns
	// every partition (a lone engine).
	Owns func(p int) bool
	// QueueLen bounds the requests waiting per partition. Default 4096.
	QueueLen int
	// PageEvents and PageBytes bound a read reply (under the server's
	// max payload). Defaults 256 events, 768 KiB.
	PageEvents int
	PageBytes  int
	// QuarantineBytes bounds the quarantine stream (old records go
	// first). Default 1 GiB. QuarantineAge is how long a record is kept.
	// Default 30 days.
	QuarantineBytes int64
	QuarantineAge   time.Duration
	// QuarantineReplicas is the stream's replicas when the server creates
	// it (0: the event log's).
	QuarantineReplicas int
	// UseExisting: do not create the quarantine stream (an operator did).
	UseExisting bool
	// OnAppend, when set, is called with each request's outcome
	// ("stored", "duplicate", "invalid", "forbidden", "conflict",
	// "unavailable", "busy", "erasing") (metrics).
	OnAppend func(outcome string)
	// Gate, when set, is the engine's erasure gate: an append (or a
	// quarantine record) of a session being erased is refused with
	// CodeUnavailable (the publisher tries again after the erase), and
	// each append holds the gate until JetStream acknowledged it.
	Gate *erasure.Gate
}

func (c *Config) setDefaults() {
	if c.QueueLen == 0 {
		c.QueueLen = 4096
	}
	if c.PageEvents == 0 {
		c.PageEvents = 256
	}
	if c.PageBytes == 0 {
		c.PageBytes = 768 << 10
	}
	if c.QuarantineBytes == 0 {
		c.QuarantineBytes = 1 << 30
	}
	if c.QuarantineAge == 0 {
		c.QuarantineAge = 30 * 24 * time.Hour
	}
}

// Validate reports every out-of-range field, joined.
func (c *Config) Validate() error {
	var errs []error
	if c.QueueLen < 0 || c.PageEvents < 0 || c.PageBytes < 0 || c.QuarantineBytes < 0 || c.QuarantineAge < 0 || c.QuarantineReplicas < 0 {
		errs = append(errs, errors.New("queue len, page events, page bytes, quarantine bytes, age, replicas: must not be negative"))
	}
	return errors.Join(errs...)
}

// QuarantineStreamConfig is the AGENT_QUARANTINE stream: subjects
// agent.rejected.<tenant>.<session> (and agent.rejected.<tenant>, where
// earlier versions kept them), file storage, old records discarded past
// maxBytes or maxAge, delete denied (an erase purges by subject).
func QuarantineStreamConfig(replicas int, maxBytes int64, maxAge time.Duration) jetstream.StreamConfig {
	if replicas < 1 {
		replicas = 1
	}
	return jetstream.StreamConfig{
		Name:        ingest.QuarantineStream,
		Description: "Turnstone: events the ingest refused, with the reason, the subject and the publisher",
		Subjects:    []string{ingest.QuarantineSubjectPrefix + ".*.*", ingest.QuarantineSubjectPrefix + ".*"},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxBytes:    maxBytes,
		MaxAge:      maxAge,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		AllowDirect: true,
		DenyDelete:  true,
	}
}

// EnsureQuarantineStream creates or updates AGENT_QUARANTINE.
func EnsureQuarantineStream(ctx context.Context, js jetstream.JetStream, replicas int) error {
	var c Config
	c.setDefaults()
	if _, err := js.CreateOrUpdateStream(ctx, QuarantineStreamConfig(replicas, c.QuarantineBytes, c.QuarantineAge)); err != nil {
		return fmt.Errorf("stream %s: %w", ingest.QuarantineStream, err)
	}
	return nil
}

// Reject is one record of the quarantine: when and on which subject an
// event was refused, the publisher's identity (the Nats-Request-Info of
// its account and user when the request came through a service import,
// else "unknown"), why, the request's headers and its body (both masked;
// the body cut at 64 KiB).
type Reject struct {
	At        time.Time           `json:"at"`
	Subject   string              `json:"subject"`
	Tenant    string              `json:"tenant"`
	Session   string              `json:"session"`
	Publisher string              `json:"publisher"`
	Reason    string              `json:"reason"`
	Code      int                 `json:"err_code"`
	Headers   map[string][]string `json:"headers,omitempty"`
	Body      string              `json:"body"`
	// Seq is the record's sequence in the quarantine stream (set when
	// read back).
	Seq uint64 `json:"seq,omitempty"`
}

// maxRejectBody is how much of a refused body the quarantine keeps.
const maxRejectBody = 64 << 10

// Server answers agent.evt.<tenant>.<session> (appends, for the
// partitions its engine owns) and agent.read.<tenant>.<session> (reads,
// in a queue group with the other engines).
type Server struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	log *events.Log
	cfg Config
	l   zerolog.Logger

	mu     sync.Mutex
	parts  map[int]*lane
	subs   []*nats.Subscription
	closed bool
	wg     sync.WaitGroup
	epochs sync.Map // *nats.Msg -> the connection's reconnects when it was received (see answerable)
}

// lane serialises one partition's appends, so a publisher's events of a
// session are published in the order they came.
type lane struct {
	in      chan *nats.Msg
	replies chan pendingReply
}

type pendingReply struct {
	msg             *nats.Msg
	fut             jetstream.PubAckFuture
	tenant, session string // the append holds the erasure gate until it is answered
}

// NewServer returns a server appending to log, talking on nc. logger may
// be nil.
func NewServer(nc *nats.Conn, log *events.Log, cfg Config, logger *zerolog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("new ingest server: %w", err)
	}
	cfg.setDefaults()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(8192))
	if err != nil {
		return nil, fmt.Errorf("new ingest server: %w", err)
	}
	s := &Server{nc: nc, js: js, log: log, cfg: cfg, l: zerolog.Nop(), parts: map[int]*lane{}}
	if logger != nil {
		s.l = logger.With().Str("component", "ingest").Logger()
	}
	return s, nil
}

// Open creates the quarantine stream (unless UseExisting) and subscribes.
func (s *Server) Open(ctx context.Context) error {
	if !s.cfg.UseExisting {
		replicas := s.cfg.QuarantineReplicas
		if replicas == 0 {
			replicas = s.log.Config().Replicas
		}
		if _, err := s.js.CreateOrUpdateStream(ctx, QuarantineStreamConfig(replicas, s.cfg.QuarantineBytes, s.cfg.QuarantineAge)); err != nil {
			return fmt.Errorf("open ingest: stream %s: %w", ingest.QuarantineStream, err)
		}
	}
	appendSub, err := s.nc.Subscribe(events.EventSubjectPrefix+".*.*", s.receive)
	if err != nil {
		return fmt.Errorf("open ingest: %w", err)
	}
	_ = appendSub.SetPendingLimits(-1, 256<<20)
	readSub, err := s.nc.QueueSubscribe(ingest.ReadSubjectPrefix+".*.*", ingest.ReadQueue, s.read)
	if err != nil {
		_ = appendSub.Unsubscribe()
		return fmt.Errorf("open ingest: %w", err)
	}
	s.mu.Lock()
	s.subs = []*nats.Subscription{appendSub, readSub}
	s.mu.Unlock()
	if err := s.nc.FlushTimeout(s.log.Config().Timeout); err != nil {
		return fmt.Errorf("open ingest: %w", err)
	}
	return nil
}

// Close stops answering, finishes the requests received and waits for
// them, or for ctx.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	subs := s.subs
	s.mu.Unlock()
	for _, sub := range subs {
		_ = sub.Drain()
	}
	for _, sub := range subs {
		for sub.IsValid() && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
	}
	s.mu.Lock()
	for _, ln := range s.parts {
		close(ln.in)
	}
	s.parts = map[int]*lane{}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close ingest: %w", ctx.Err())
	}
}

// receive takes an append request off the subscription: it is this
// engine's when it owns the session's partition.
func (s *Server) receive(m *nats.Msg) {
	tenant, session := tokens(m.Subject, 2)
	if !events.ValidToken(tenant) || !events.ValidToken(session) {
		// Any engine may answer a subject no partition can hold; the
		// lowest-numbered partition's owner does.
		if s.owns(0) {
			s.received(m)
			s.quarantine(m, tenant, session, ingest.CodeInvalid, fmt.Sprintf("subject %q: tenant and session must be tokens of 1-%d characters of [A-Za-z0-9_-]", m.Subject, events.MaxTokenLen))
		}
		return
	}
	p := events.Partition(tenant, session, s.log.Partitions())
	if !s.owns(p) {
		return
	}
	s.received(m)
	ln := s.lane(p)
	if ln == nil {
		return
	}
	select {
	case ln.in <- m:
	default:
		s.count("busy")
		s.reply(m, ingest.PubAck{Error: &ingest.APIError{Code: 503, ErrCode: ingest.CodeBusy, Description: "the engine's queue for this partition is full; try again"}})
	}
}

func (s *Server) owns(p int) bool { return s.cfg.Owns == nil || s.cfg.Owns(p) }

func (s *Server) count(outcome string) {
	if s.cfg.OnAppend != nil {
		s.cfg.OnAppend(outcome)
	}
}

// lane returns partition p's lane, starting it on first use.
func (s *Server) lane(p int) *lane {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	if ln, ok := s.parts[p]; ok {
		return ln
	}
	ln := &lane{in: make(chan *nats.Msg, s.cfg.QueueLen), replies: make(chan pendingReply, s.cfg.QueueLen)}
	s.parts[p] = ln
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		defer close(ln.replies)
		for m := range ln.in {
			s.handle(ln, m)
		}
	}()
	go func() {
		defer s.wg.Done()
		timer := time.NewTimer(time.Hour) // one timer for the lane, reset per reply
		defer timer.Stop()
		for pr := range ln.replies {
			s.awaitReply(pr, timer)
		}
	}()
	return ln
}

// turnstoneOnly are the types only Turnstone's own processes write.
var turnstoneOnly = map[events.Type]bool{
	events.TypeRecoveryAttempted: true, events.TypeRecoveryCompleted: true, events.TypeRecoveryParked: true,
	events.TypeSnapshotTaken: true, events.TypeBreakerChanged: true, events.TypeSessionRewound: true, events.TypeSessionForked: true,
}

// handle appends one request's events, in the lane's order.
func (s *Server) handle(ln *lane, m *nats.Msg) {
	tenant, session := tokens(m.Subject, 2)
	body := bytes.TrimSpace(m.Data)
	var evs []events.Event
	if len(body) > 0 && body[0] == '[' {
		var raws []jsontext.Value
		if err := json.Unmarshal(body, &raws); err != nil || len(raws) == 0 {
			s.quarantine(m, tenant, session, ingest.CodeInvalid, "body: want one JSON object (an event) or a non-empty JSON array of events")
			return
		}
		for i, raw := range raws {
			ev, err := events.Decode(raw)
			if err != nil {
				s.quarantine(m, tenant, session, ingest.CodeInvalid, fmt.Sprintf("event %d: %v", i, err))
				return
			}
			evs = append(evs, ev)
		}
	} else {
		ev, err := events.Decode(body)
		if err != nil {
			s.quarantine(m, tenant, session, ingest.CodeInvalid, err.Error())
			return
		}
		evs = []events.Event{ev}
	}
	if len(evs) > events.MaxAtomicEvents {
		s.quarantine(m, tenant, session, ingest.CodeInvalid, fmt.Sprintf("a batch takes at most %d events, got %d", events.MaxAtomicEvents, len(evs)))
		return
	}
	for i := range evs {
		ev := &evs[i]
		switch {
		case ev.Tenant != tenant || ev.Session != session:
			s.quarantine(m, tenant, session, ingest.CodeInvalid, fmt.Sprintf("event %s names session %s/%s but was published on %s: publish each event on its own session's subject", ev.ID, ev.Tenant, ev.Session, m.Subject))
			return
		case turnstoneOnly[ev.Type]:
			s.quarantine(m, tenant, session, ingest.CodeForbidden, fmt.Sprintf("event %s: %s events are written by Turnstone's own processes only", ev.ID, ev.Type))
			return
		case strings.HasPrefix(ev.Source, events.DefaultSource+":"):
			s.quarantine(m, tenant, session, ingest.CodeForbidden, fmt.Sprintf("event %s: source %q is reserved for Turnstone's own processes", ev.ID, ev.Source))
			return
		}
	}
	if id := m.Header.Get(jetstream.MsgIDHeader); id != "" && len(evs) == 1 && id != evs[0].ID {
		s.quarantine(m, tenant, session, ingest.CodeInvalid, fmt.Sprintf("header Nats-Msg-Id %q differs from the event's id %q", id, evs[0].ID))
		return
	}
	expectHdr := m.Header.Get(jetstream.ExpectedLastSubjSeqHeader)
	var msgs []*nats.Msg
	var err error
	if len(evs) == 1 && expectHdr == "" {
		// One event: stored as sent when it holds nothing to mask.
		var msg *nats.Msg
		if msg, err = s.log.PrepareBody(evs[0], body); err == nil {
			msgs = []*nats.Msg{msg}
		}
	} else {
		msgs, err = s.log.Prepare(evs, expectHdr != "" || len(evs) > 1)
	}
	if err != nil {
		code := ingest.CodeInvalid
		if errors.Is(err, events.ErrTooLarge) {
			code = int(jetstream.JSErrCodeStreamMessageExceedsMaximum)
		}
		s.quarantine(m, tenant, session, code, err.Error())
		return
	}
	gate := s.cfg.Gate
	if !gate.Enter(tenant, session, gate.Epoch()) {
		s.count("erasing")
		s.reply(m, ingest.PubAck{Error: &ingest.APIError{Code: 503, ErrCode: ingest.CodeUnavailable, Description: "the session is being erased; try again in a moment"}})
		return
	}
	if expectHdr == "" && len(msgs) == 1 {
		fut, err := s.js.PublishMsgAsync(msgs[0], jetstream.WithExpectStream(events.EventsStream))
		if err != nil {
			gate.Leave(tenant, session)
			s.count("unavailable")
			s.reply(m, ingest.PubAck{Error: &ingest.APIError{Code: 503, ErrCode: ingest.CodeUnavailable, Description: "event log unavailable: " + err.Error()}})
			return
		}
		ln.replies <- pendingReply{msg: m, fut: fut, tenant: tenant, session: session}
		return
	}
	defer gate.Leave(tenant, session)
	// A conditional append or a batch: one atomic batch, in the lane.
	var opts []events.AppendOption
	ownCondition := expectHdr == "" // the condition is the ingest's, not the publisher's
	if expectHdr != "" {
		n, err := strconv.ParseUint(expectHdr, 10, 64)
		if err != nil {
			s.quarantine(m, tenant, session, ingest.CodeInvalid, fmt.Sprintf("header %s: %q is not a sequence", jetstream.ExpectedLastSubjSeqHeader, expectHdr))
			return
		}
		opts = append(opts, events.ExpectLastSeq(n))
	} else {
		// A batch without a condition is atomic too: on the session's
		// last sequence as it is now.
		last, err := s.log.LastSeq(context.Background(), tenant, session)
		if err != nil && !errors.Is(err, events.ErrSessionNotFound) {
			s.count("unavailable")
			s.reply(m, ingest.PubAck{Error: &ingest.APIError{Code: 503, ErrCode: ingest.CodeUnavailable, Description: err.Error()}})
			return
		}
		opts = append(opts, events.ExpectLastSeq(last))
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.log.Config().Timeout)
	defer cancel()
	acks, err := s.log.Append(ctx, evs, opts...)
	if ownCondition {
		acks, err = s.resentBatch(ctx, evs, acks, err)
	}
	outcome, ack := batchReply(acks, err)
	s.count(outcome)
	s.reply(m, ack)
}

// resentBatch answers a batch sent without a condition (the ingest set
// one: the session's last sequence as it read it) that JetStream refused
// for a duplicate id or a moved session: when the batch is the call's
// own, stored before (a resend after a lost reply), the original acks,
// Duplicate set (events.Log.Resent, over the duplicate window); else the
// refusal.
func (s *Server) resentBatch(ctx context.Context, evs []events.Event, acks []events.Ack, err error) ([]events.Ack, error) {
	if !errors.Is(err, events.ErrDuplicateID) && !errors.Is(err, events.ErrConflict) {
		return acks, err
	}
	orig, found, ferr := s.log.Resent(ctx, evs, 0, false)
	if ferr != nil || !found {
		return acks, err
	}
	return orig, nil
}

// batchReply is the reply to an atomic batch and its outcome (metrics):
// the last event's sequence and the count, with Duplicate set when the
// call was stored before (a resend); or the refusal, in JetStream's codes
// (10071 conflict, 10201 an id another call stored) or CodeUnavailable.
func batchReply(acks []events.Ack, err error) (string, ingest.PubAck) {
	switch {
	case errors.Is(err, events.ErrConflict):
		return "conflict", ingest.PubAck{Error: &ingest.APIError{Code: 400, ErrCode: int(jetstream.JSErrCodeStreamWrongLastSequence), Description: "wrong last sequence: the session changed since it was read; read it again and decide again"}}
	case errors.Is(err, events.ErrDuplicateID):
		return "invalid", ingest.PubAck{Error: &ingest.APIError{Code: 400, ErrCode: events.JSErrCodeBatchDuplicateID, Description: "an event id of the batch is stored already by another call: a resend must repeat the call as it was; new events need new ids"}}
	case err != nil:
		return "unavailable", ingest.PubAck{Error: &ingest.APIError{Code: 503, ErrCode: ingest.CodeUnavailable, Description: err.Error()}}
	case len(acks) > 0 && acks[0].Duplicate:
		return "duplicate", ingest.PubAck{Stream: events.EventsStream, Seq: acks[len(acks)-1].Seq, Count: len(acks), Duplicate: true}
	}
	return "stored", ingest.PubAck{Stream: events.EventsStream, Seq: acks[len(acks)-1].Seq, Count: len(acks)}
}

// awaitReply replies to an async append once JetStream acknowledged it.
func (s *Server) awaitReply(pr pendingReply, timer *time.Timer) {
	defer s.cfg.Gate.Leave(pr.tenant, pr.session)
	timer.Reset(s.log.Config().Timeout)
	defer timer.Stop()
	select {
	case pa := <-pr.fut.Ok():
		outcome := "stored"
		if pa.Duplicate {
			outcome = "duplicate"
		}
		s.count(outcome)
		s.reply(pr.msg, ingest.PubAck{Stream: pa.Stream, Seq: pa.Sequence, Duplicate: pa.Duplicate})
	case err := <-pr.fut.Err():
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) {
			s.count("unavailable")
			s.reply(pr.msg, ingest.PubAck{Error: &ingest.APIError{Code: apiErr.Code, ErrCode: int(apiErr.ErrorCode), Description: apiErr.Description}})
			return
		}
		s.count("unavailable")
		s.reply(pr.msg, ingest.PubAck{Error: &ingest.APIError{Code: 503, ErrCode: ingest.CodeUnavailable, Description: "event log unavailable: " + err.Error()}})
	case <-timer.C:
		s.count("unavailable")
		s.reply(pr.msg, ingest.PubAck{Error: &ingest.APIError{Code: 503, ErrCode: ingest.CodeUnavailable, Description: "event log unavailable: no acknowledgement in time"}})
	}
}

// quarantine keeps a refused request, masked, with why, and answers its
// publisher with the error.
func (s *Server) quarantine(m *nats.Msg, tenant, session string, code int, reason string) {
	outcome := "invalid"
	if code == ingest.CodeForbidden {
		outcome = "forbidden"
	}
	s.count(outcome)
	reason = events.MaskString(reason)
	body := maskBody(m.Data)
	if len(body) > maxRejectBody {
		body = body[:maxRejectBody]
	}
	rec := Reject{At: time.Now().UTC(), Subject: m.Subject, Tenant: tenant, Session: session, Publisher: "unknown",
		Reason: reason, Code: code, Body: body}
	if info := m.Header.Get(ingest.RequestInfoHeader); info != "" {
		rec.Publisher = publisherOf(info)
	}
	if len(m.Header) > 0 {
		rec.Headers = map[string][]string{}
		for k, vs := range m.Header {
			for _, v := range vs {
				rec.Headers[k] = append(rec.Headers[k], events.MaskString(v))
			}
		}
	}
	// A refused body or header may hold bytes that are not UTF-8: kept,
	// each such byte as U+FFFD.
	b, err := json.Marshal(rec, jsontext.AllowInvalidUTF8(true))
	if err != nil {
		s.l.Warn().Err(err).Str("subject", m.Subject).Msg("refused event not quarantined: record not encodable")
		s.reply(m, ingest.PubAck{Error: &ingest.APIError{Code: 400, ErrCode: code, Description: reason}})
		return
	}
	desc := reason
	ctx, cancel := context.WithTimeout(context.Background(), s.log.Config().Timeout)
	defer cancel()
	gate := s.cfg.Gate
	if !gate.Enter(tenant, session, gate.Epoch()) {
		// Being erased: no record of it is kept.
	} else if ack, perr := s.js.Publish(ctx, ingest.QuarantineSubject(tenant, session), b); perr == nil {
		gate.Leave(tenant, session)
		desc = fmt.Sprintf("%s (quarantined at %s seq %d)", reason, ingest.QuarantineStream, ack.Sequence)
	} else {
		gate.Leave(tenant, session)
		s.l.Warn().Err(perr).Str("subject", m.Subject).Str("reason", reason).Msg("refused event not quarantined")
	}
	status := 400
	if code == ingest.CodeForbidden {
		status = 403
	}
	s.reply(m, ingest.PubAck{Error: &ingest.APIError{Code: status, ErrCode: code, Description: desc}})
}

// maskBody masks a refused body before it is kept, whole (then cut): as
// JSON when it is JSON (every string decoded, so an escaped secret is
// found: events.MaskJSON), else as text, and, when it holds escapes, as
// the text they stand for (a broken JSON body's strings).
func maskBody(b []byte) string {
	if jsontext.Value(b).IsValid() {
		return string(events.MaskJSON(b))
	}
	s := string(b)
	if strings.Contains(s, `\`) {
		u := unescape(s)
		if m := events.MaskString(u); m != u {
			return m
		}
	}
	return events.MaskString(s)
}

// unescape replaces JSON string escapes with what they stand for, as far
// as they are well formed.
func unescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 == len(s) {
			b.WriteByte(c)
			continue
		}
		i++
		switch s[i] {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case '"', '\\', '/':
			b.WriteByte(s[i])
		default:
			b.WriteByte('\\')
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

// publisherOf summarises a Nats-Request-Info header: "<account>/<user>".
func publisherOf(info string) string {
	var ri struct {
		Account string `json:"acc"`
		User    string `json:"user"`
		Name    string `json:"name"`
	}
	if json.Unmarshal([]byte(info), &ri) != nil {
		return events.MaskString(info)
	}
	who := ri.Account
	if ri.User != "" {
		who += "/" + ri.User
	}
	if ri.Name != "" {
		who += " (" + ri.Name + ")"
	}
	return who
}

func (s *Server) reply(m *nats.Msg, ack ingest.PubAck) {
	if m.Reply == "" || !s.answerable(m) {
		return
	}
	b, err := json.Marshal(ack, jsontext.AllowInvalidUTF8(true))
	if err != nil {
		s.l.Warn().Err(err).Msg("reply not encodable")
		return
	}
	if err := s.nc.Publish(m.Reply, b); err != nil {
		s.l.Debug().Err(err).Msg("reply not sent")
	}
}

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

// tokens returns the last n tokens of subject (n = 2: tenant, session).
func tokens(subject string, n int) (string, string) {
	parts := strings.Split(subject, ".")
	if len(parts) < n {
		return "", ""
	}
	return parts[len(parts)-2], parts[len(parts)-1]
}

// RejectFilter selects quarantine records: of one tenant (empty: all),
// at most Limit of the latest (0: all).
type RejectFilter struct {
	Tenant string
	Limit  int
}

// Rejects returns the quarantine's records, oldest first, with their
// stream sequence. It reads the stream in batches (events.ReadStream,
// which works on replicated streams), keeping only the latest Limit in
// memory. jetstream.ErrStreamNotFound (wrapped) when there is no
// quarantine yet.
func Rejects(ctx context.Context, js jetstream.JetStream, f RejectFilter) ([]Reject, error) {
	st, err := js.Stream(ctx, ingest.QuarantineStream)
	if err != nil {
		return nil, fmt.Errorf("rejects: %w", err)
	}
	subjects := []string{ingest.QuarantineSubjectPrefix + ".>"}
	if f.Tenant != "" {
		subjects = []string{ingest.QuarantineSubjectPrefix + "." + f.Tenant, ingest.QuarantineSubjectPrefix + "." + f.Tenant + ".*"}
	}
	var out []Reject
	err = events.ReadStream(ctx, st, jetstream.OrderedConsumerConfig{FilterSubjects: subjects}, 500, func(msg jetstream.Msg) error {
		var r Reject
		if json.Unmarshal(msg.Data(), &r) != nil {
			return nil
		}
		if meta, err := msg.Metadata(); err == nil {
			r.Seq = meta.Sequence.Stream
		}
		out = append(out, r)
		if f.Limit > 0 && len(out) >= 2*f.Limit {
			out = append(out[:0], out[len(out)-f.Limit:]...)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("rejects: %w", err)
	}
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[len(out)-f.Limit:]
	}
	return out, nil
}

// received notes the connection's reconnect count when a request this
// engine will answer arrived (answerable).
func (s *Server) received(m *nats.Msg) {
	if strings.HasPrefix(m.Reply, serviceReplyPrefix) {
		s.epochs.Store(m, s.nc.Stats().Reconnects)
	}
}

// serviceReplyPrefix starts the reply subject nats-server gives a request
// that came through a service import (a tenant's, under auth): the
// engine may answer it only through the server that delivered it.
const serviceReplyPrefix = "_R_."

// answerable reports whether the reply to m may be sent: not when m came
// through a service import and the connection reconnected (to another
// server) since. Under auth the engine may answer such a request
// (nats-server's allow_responses) only through the server it received it
// on: on another the reply is refused as a permission violation, and it
// would reach no one anyway. The publisher sends the request again
// (docs/events.md: "When no engine answers"), and its ids make that safe.
func (s *Server) answerable(m *nats.Msg) bool {
	v, ok := s.epochs.LoadAndDelete(m)
	if !ok {
		return true
	}
	if v.(uint64) != s.nc.Stats().Reconnects {
		s.l.Debug().Str("subject", m.Subject).Msg("no reply: the connection moved to another server since the request came")
		return false
	}
	return true
}
