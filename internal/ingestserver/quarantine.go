package ingestserver

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
)

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

// refuse answers a request that broke the contract at once, with the
// error, and hands it to the quarantine, which writes its record on a
// goroutine of its own: a refusal never waits for the quarantine
// stream, so it never holds a lane or a subscription.
func (s *Server) refuse(m *nats.Msg, tenant, session string, code int, reason string) {
	outcome := "invalid"
	status := 400
	if code == ingest.CodeForbidden {
		outcome, status = "forbidden", 403
	}
	s.count(outcome)
	desc := events.MaskString(reason)
	if s.q != nil && s.q.add(qrecord{subject: publishedSubject(m.Subject), header: m.Header, body: m.Data, tenant: tenant, session: session, code: code, reason: desc, at: time.Now().UTC()}) {
		desc += " (quarantined: engine rejects lists it)"
	} else {
		desc += " (not quarantined: the engine's quarantine queue is full; the engine counts it on /metrics)"
	}
	s.reply(m, ingest.PubAck{Error: &ingest.APIError{Code: status, ErrCode: code, Description: desc}})
}

// qrecord is a refused request waiting to be written to the quarantine.
type qrecord struct {
	subject         string
	header          nats.Header
	body            []byte
	tenant, session string
	code            int
	reason          string
	at              time.Time
}

// quarantiner writes the quarantine's records, asynchronously: a bounded
// queue (Config.QuarantineQueue), whose overflow is dropped and counted,
// a writer that masks each record and publishes it, and an acker that
// awaits JetStream's acknowledgements (holding the erasure gate of the
// record's session until then).
type quarantiner struct {
	s       *Server
	js      jetstream.JetStream
	in      chan qrecord
	acks    chan qpending
	dropped atomic.Uint64
	warned  atomic.Int64 // unix nanos of the last warning
	mu      sync.RWMutex // add holds it to read; close to write
	closed  bool
	done    chan struct{}
}

type qpending struct {
	fut             jetstream.PubAckFuture
	tenant, session string
}

func newQuarantiner(s *Server) (*quarantiner, error) {
	js, err := jetstream.New(s.nc, jetstream.WithPublishAsyncMaxPending(1024), jetstream.WithPublishAsyncTimeout(s.log.Config().Timeout))
	if err != nil {
		return nil, err
	}
	q := &quarantiner{s: s, js: js, in: make(chan qrecord, s.cfg.QuarantineQueue), acks: make(chan qpending, 256), done: make(chan struct{})}
	go q.write()
	go q.ack()
	return q, nil
}

// add queues a record; false when the queue is full (the record is
// dropped and counted).
func (q *quarantiner) add(r qrecord) bool {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.closed {
		q.drop("the engine is stopping", nil)
		return false
	}
	select {
	case q.in <- r:
		return true
	default:
		q.drop("the quarantine queue is full", nil)
		return false
	}
}

// drop counts a record not written, and warns at most once a minute.
func (q *quarantiner) drop(why string, err error) {
	q.dropped.Add(1)
	if q.s.cfg.OnQuarantineDrop != nil {
		q.s.cfg.OnQuarantineDrop()
	}
	if last := q.warned.Load(); time.Since(time.Unix(0, last)) > time.Minute && q.warned.CompareAndSwap(last, time.Now().UnixNano()) {
		q.s.l.Warn().Err(err).Uint64("dropped_so_far", q.dropped.Load()).Msg("refused event not quarantined: " + why)
	}
}

// close stops the quarantiner once the records queued are written.
func (q *quarantiner) close() {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		close(q.in)
	}
	q.mu.Unlock()
	<-q.done
}

func (q *quarantiner) write() {
	defer close(q.acks)
	gate := q.s.cfg.Gate
	for r := range q.in {
		msg := nats.NewMsg(ingest.QuarantineSubject(r.tenant, r.session))
		msg.Data = r.encode()
		if !gate.Enter(r.tenant, r.session, gate.Epoch()) {
			continue // being erased: no record of it is kept
		}
		fut, err := q.js.PublishMsgAsync(msg, jetstream.WithExpectStream(ingest.QuarantineStream))
		if err != nil {
			gate.Leave(r.tenant, r.session)
			q.drop("not sent", err)
			continue
		}
		q.acks <- qpending{fut: fut, tenant: r.tenant, session: r.session}
	}
}

func (q *quarantiner) ack() {
	defer close(q.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for p := range q.acks {
		timer.Reset(q.s.log.Config().Timeout)
		select {
		case <-p.fut.Ok():
		case err := <-p.fut.Err():
			q.drop("not stored", err)
		case <-timer.C:
			q.drop("not stored", fmt.Errorf("no acknowledgement in %s", q.s.log.Config().Timeout))
		}
		timer.Stop()
		q.s.cfg.Gate.Leave(p.tenant, p.session)
	}
}

// encode masks a refused request and encodes its record.
func (r qrecord) encode() []byte {
	body := maskBody(r.body)
	if len(body) > maxRejectBody {
		body = body[:maxRejectBody]
	}
	rec := Reject{At: r.at, Subject: r.subject, Tenant: r.tenant, Session: r.session, Publisher: "unknown",
		Reason: r.reason, Code: r.code, Body: body}
	if info := r.header.Get(ingest.RequestInfoHeader); info != "" {
		rec.Publisher = publisherOf(info)
	}
	if len(r.header) > 0 {
		rec.Headers = map[string][]string{}
		for k, vs := range r.header {
			for _, v := range vs {
				rec.Headers[k] = append(rec.Headers[k], events.MaskString(v))
			}
		}
	}
	// A refused body or header may hold bytes that are not UTF-8: kept,
	// each such byte as U+FFFD.
	b, err := json.Marshal(rec, jsontext.AllowInvalidUTF8(true))
	if err != nil {
		b, err = json.Marshal(Reject{At: r.at, Subject: events.MaskString(r.subject), Tenant: r.tenant, Session: r.session, Publisher: "unknown",
			Reason: r.reason + " (the request itself is not kept: " + err.Error() + ")", Code: r.code}, jsontext.AllowInvalidUTF8(true))
		if err != nil {
			b = []byte(`{"publisher":"unknown","reason":"a refused request that could not be encoded"}`)
		}
	}
	return b
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

// publishedSubject is the subject a publisher sent a request on: the
// server's ingest mapping delivers agent.evt.<tenant>.<session> to the
// engines as agent.in.<partition>.<tenant>.<session> (docs/scaling.md),
// and a quarantine record names what the publisher sent.
func publishedSubject(subject string) string {
	rest, ok := strings.CutPrefix(subject, ingest.IngestSubjectPrefix+".")
	if !ok {
		return subject
	}
	if _, after, ok := strings.Cut(rest, "."); ok {
		return events.EventSubjectPrefix + "." + after
	}
	return subject
}
