// Package ingestserver is the engine's side of the ingest (package ingest
// is the contract and the publisher's client): it answers the appends
// publishers send to agent.evt.<tenant>.<session>, validates, masks and
// appends each event to its stored subject, quarantines what it refuses,
// and answers reads of a session.
//
// Each engine receives only the appends of the partitions it owns: the
// NATS server maps the publish subject to agent.in.<partition>.<tenant>.
// <session> (ingest.IngestMapping) and the engine subscribes to its own
// partitions' subjects, moving the subscriptions with the partitions
// (Acquire, Release). On a server without that mapping the engine also
// hears the unmapped subject, as every engine then does, and keeps only
// its partitions' appends.
//
// Within a partition, appends go through a lane that is fair across
// tenants (lane.go): each tenant has its own bounded queue and a bounded
// number of appends in flight to JetStream, and the tenants with work are
// served in turn, so a tenant that floods a partition fills only its own
// queue (and hears ingest.CodeBusy) while the others keep their latency.
// One session's events are appended in the order they came.
package ingestserver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
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
	// Shared: the partitions the server answers come from its engine's
	// group (Acquire, Release). Otherwise Open acquires every partition
	// (a lone engine).
	Shared bool
	// TenantQueue bounds the requests of one tenant waiting in one
	// partition's lane; past it the tenant's requests are refused with
	// ingest.CodeBusy. Default 256.
	TenantQueue int
	// TenantInFlight bounds one tenant's appends of one partition sent to
	// JetStream and not yet acknowledged. Default 64.
	TenantInFlight int
	// QueueLen bounds the appends of one partition awaiting their
	// acknowledgement, all tenants together. Default 4096.
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
	// QuarantineQueue bounds the refused requests waiting to be written
	// to the quarantine; past it a record is dropped (and counted:
	// OnQuarantineDrop), never waited for. Default 1024.
	QuarantineQueue int
	// UseExisting: do not create the quarantine stream (an operator did).
	UseExisting bool
	// OnAppend, when set, is called with each request's outcome
	// ("stored", "duplicate", "invalid", "forbidden", "conflict",
	// "unsupported", "unavailable", "busy", "erasing") (metrics).
	OnAppend func(outcome string)
	// OnReceive, when set, is called with each append request this
	// server takes (its partition, its size in bytes: body and headers,
	// and whether it came mapped to its partition or on the unmapped
	// publish subject) (metrics).
	OnReceive func(partition, bytes int, mapped bool)
	// OnQuarantineDrop, when set, is called for each refused request
	// whose quarantine record was not written (the queue was full, or
	// the write failed) (metrics).
	OnQuarantineDrop func()
	// Gate, when set, is the engine's erasure gate: an append (or a
	// quarantine record) of a session being erased is refused with
	// CodeUnavailable (the publisher tries again after the erase), and
	// each append holds the gate until JetStream acknowledged it.
	Gate *erasure.Gate
}

func (c *Config) setDefaults() {
	if c.TenantQueue == 0 {
		c.TenantQueue = 256
	}
	if c.TenantInFlight == 0 {
		c.TenantInFlight = 64
	}
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
	if c.QuarantineQueue == 0 {
		c.QuarantineQueue = 1024
	}
}

// Validate reports every out-of-range field, joined.
func (c *Config) Validate() error {
	var errs []error
	if c.TenantQueue < 0 || c.TenantInFlight < 0 || c.QueueLen < 0 || c.PageEvents < 0 || c.PageBytes < 0 ||
		c.QuarantineBytes < 0 || c.QuarantineAge < 0 || c.QuarantineReplicas < 0 || c.QuarantineQueue < 0 {
		errs = append(errs, errors.New("tenant queue, tenant in flight, queue len, page events, page bytes, quarantine bytes, age, replicas, queue: must not be negative"))
	}
	return errors.Join(errs...)
}

// Server answers the appends of the partitions it owns
// (agent.in.<partition>.<tenant>.<session>, or agent.evt.<tenant>.
// <session> on a server without the mapping) and agent.read.<tenant>.
// <session> (reads, in a queue group with the other engines).
type Server struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	log *events.Log
	cfg Config
	l   zerolog.Logger
	q   *quarantiner

	partitions int
	owned      []atomic.Bool // by partition: its appends are taken
	// leases holds, by partition, the Done channel of the lease it was
	// acquired under (Acquire's ctx): past it, the appends are no longer
	// taken, even before Release.
	leases []atomic.Pointer[<-chan struct{}]

	mu     sync.Mutex
	lanes  map[int]*lane
	psubs  map[int]*nats.Subscription // each owned partition's mapped subscription
	subs   []*nats.Subscription       // the unmapped publish subject, reads
	closed bool
	wg     sync.WaitGroup
	epochs sync.Map // *nats.Msg -> the connection's reconnects when it was received (see answerable)

	unmapped  atomic.Bool  // an append came on the unmapped subject (warned once)
	misrouted atomic.Int64 // unix nanos of the last warning about a wrong mapping
	busyReply []byte
}

// NewServer returns a server appending to log, talking on nc. logger may
// be nil.
func NewServer(nc *nats.Conn, log *events.Log, cfg Config, logger *zerolog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("new ingest server: %w", err)
	}
	cfg.setDefaults()
	// Every publish has a deadline, so that an unacknowledged one frees
	// its place among the context's pending publishes.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(65536), jetstream.WithPublishAsyncTimeout(log.Config().Timeout))
	if err != nil {
		return nil, fmt.Errorf("new ingest server: %w", err)
	}
	s := &Server{nc: nc, js: js, log: log, cfg: cfg, l: zerolog.Nop(), partitions: log.Partitions(),
		lanes: map[int]*lane{}, psubs: map[int]*nats.Subscription{}}
	s.owned = make([]atomic.Bool, s.partitions)
	s.leases = make([]atomic.Pointer[<-chan struct{}], s.partitions)
	if logger != nil {
		s.l = logger.With().Str("component", "ingest").Logger()
	}
	busy, err := json.Marshal(ingest.PubAck{Error: &ingest.APIError{Code: 503, ErrCode: ingest.CodeBusy,
		Description: fmt.Sprintf("busy: your tenant has %d requests queued in this session's partition; try again with the same id (docs/limits.md)", cfg.TenantQueue)}})
	if err != nil {
		return nil, fmt.Errorf("new ingest server: %w", err)
	}
	s.busyReply = busy
	return s, nil
}

// Open creates the quarantine stream (unless UseExisting), subscribes
// and, unless the server is Shared, acquires every partition.
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
	q, err := newQuarantiner(s)
	if err != nil {
		return fmt.Errorf("open ingest: %w", err)
	}
	s.q = q
	// The unmapped publish subject: only a server without the mapping
	// delivers here (a mapped publish reaches agent.in.… instead).
	appendSub, err := s.nc.Subscribe(events.EventSubjectPrefix+".*.*", s.receiveUnmapped)
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
	if !s.cfg.Shared {
		for p := range s.partitions {
			if err := s.subscribe(p); err != nil {
				return fmt.Errorf("open ingest: %w", err)
			}
		}
	}
	if err := s.nc.FlushTimeout(s.log.Config().Timeout); err != nil {
		return fmt.Errorf("open ingest: %w", err)
	}
	return nil
}

// Acquire starts answering partition p's appends: it subscribes to
// agent.in.<p>.*.* and returns once the server has the subscription, so
// the partition's publishes reach this engine from then on. ctx is the
// lease p is held under: once it ends, no append of p is taken any more,
// even before Release (a fenced owner must not act). Acquiring a
// partition held is a no-op.
func (s *Server) Acquire(ctx context.Context, p int) error {
	if p >= 0 && p < s.partitions {
		done := ctx.Done()
		s.leases[p].Store(&done)
	}
	if err := s.subscribe(p); err != nil {
		return fmt.Errorf("acquire ingest partition %d: %w", p, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.log.Config().Timeout)
		defer cancel()
	}
	if err := s.nc.FlushWithContext(ctx); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		return fmt.Errorf("acquire ingest partition %d: %w", p, err)
	}
	return nil
}

func (s *Server) subscribe(p int) error {
	if p < 0 || p >= s.partitions {
		return fmt.Errorf("partition %d: the log has %d", p, s.partitions)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	if _, held := s.psubs[p]; held {
		return nil
	}
	ln := s.laneLocked(p)
	sub, err := s.nc.Subscribe(ingest.IngestSubject(p, "*", "*"), func(m *nats.Msg) { s.receiveMapped(ln, m) })
	if err != nil {
		return err
	}
	_ = sub.SetPendingLimits(-1, 256<<20)
	s.psubs[p] = sub
	s.owned[p].Store(true)
	return nil
}

// Release stops answering partition p's appends: it drains the
// partition's subscription (the requests delivered are still answered)
// and waits until the lane has answered every request it took, or ctx
// ends, so that the next owner appends a session's events only after
// this one's. Releasing a partition not held is a no-op.
func (s *Server) Release(ctx context.Context, p int) {
	s.mu.Lock()
	sub, held := s.psubs[p]
	delete(s.psubs, p)
	ln := s.lanes[p]
	s.mu.Unlock()
	if p >= 0 && p < s.partitions {
		s.owned[p].Store(false)
	}
	if !held {
		return
	}
	_ = sub.Drain()
	waitFor(ctx, func() bool { return !sub.IsValid() })
	if ln != nil {
		waitFor(ctx, ln.idle)
	}
}

// Owned reports whether the server answers partition p's appends now:
// it acquired p, has not released it, and p's lease has not ended.
func (s *Server) Owned(p int) bool {
	return p >= 0 && p < s.partitions && s.owned[p].Load() && !s.leaseEnded(p)
}

// leaseEnded reports whether the lease partition p was acquired under
// has ended (false when p was acquired with no lease).
func (s *Server) leaseEnded(p int) bool {
	if p < 0 || p >= s.partitions {
		return false
	}
	if done := s.leases[p].Load(); done != nil {
		select {
		case <-*done:
			return true
		default:
		}
	}
	return false
}

// waitFor polls cond every few milliseconds until it holds or ctx ends.
func waitFor(ctx context.Context, cond func() bool) {
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
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
	subs := append([]*nats.Subscription(nil), s.subs...)
	for p, sub := range s.psubs {
		subs = append(subs, sub)
		s.owned[p].Store(false)
	}
	s.psubs = map[int]*nats.Subscription{}
	s.mu.Unlock()
	for _, sub := range subs {
		_ = sub.Drain()
	}
	for _, sub := range subs {
		waitFor(ctx, func() bool { return !sub.IsValid() })
	}
	s.mu.Lock()
	for _, ln := range s.lanes {
		ln.close()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		if s.q != nil {
			s.q.close()
		}
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close ingest: %w", ctx.Err())
	}
}

// receiveMapped takes an append request of ln's partition off its
// subscription (agent.in.<p>.<tenant>.<session>).
func (s *Server) receiveMapped(ln *lane, m *nats.Msg) {
	s.received(m)
	tenant, session := tokens(m.Subject, 2)
	if s.cfg.OnReceive != nil {
		s.cfg.OnReceive(ln.p, len(m.Data)+headerBytes(m), true)
	}
	if !events.ValidToken(tenant) || !events.ValidToken(session) {
		s.refuseSubject(m, tenant, session)
		return
	}
	if p := events.Partition(tenant, session, s.partitions); p != ln.p {
		// The server's mapping hashes into another partition count than
		// the stream's: this engine may not own the session.
		s.count("unavailable")
		s.reply(m, ingest.PubAck{Error: &ingest.APIError{Code: 503, ErrCode: ingest.CodeUnavailable,
			Description: fmt.Sprintf("misrouted: the NATS server mapped this session to partition %d, the event stream puts it in %d of %d: the server's mapping of agent.evt.*.* must use partition(%d,1,2) (docs/scaling.md)", ln.p, p, s.partitions, s.partitions)}})
		if last := s.misrouted.Load(); time.Since(time.Unix(0, last)) > time.Minute && s.misrouted.CompareAndSwap(last, time.Now().UnixNano()) {
			s.l.Error().Int("mapped", ln.p).Int("partition", p).Int("partitions", s.partitions).
				Msg("the NATS server's ingest mapping has another partition count than the event stream: appends are refused (docs/scaling.md)")
		}
		return
	}
	if s.leaseEnded(ln.p) {
		// The lease ended (a fenced owner): another engine takes the
		// partition's appends within its handover; the publisher sends
		// again. A graceful Release still answers what its drain delivers.
		s.count("unavailable")
		s.reply(m, ingest.PubAck{Error: &ingest.APIError{Code: 503, ErrCode: ingest.CodeUnavailable,
			Description: "the partition is changing engines; send again in a moment"}})
		return
	}
	s.enqueue(ln, m, tenant, session)
}

// receiveUnmapped takes an append off the publish subject itself
// (agent.evt.<tenant>.<session>), which only a server without the
// ingest mapping delivers: every engine hears it, and the owner of its
// partition takes it.
func (s *Server) receiveUnmapped(m *nats.Msg) {
	if s.unmapped.CompareAndSwap(false, true) {
		s.l.Warn().Msg("the NATS server does not map agent.evt.*.* to the engines' partitions: every engine receives every append and drops the others' (add the mapping: docs/scaling.md)")
	}
	tenant, session := tokens(m.Subject, 2)
	if !events.ValidToken(tenant) || !events.ValidToken(session) {
		// Any engine may answer a subject no partition can hold; the
		// lowest-numbered partition's owner does.
		if s.Owned(0) {
			if s.cfg.OnReceive != nil {
				s.cfg.OnReceive(0, len(m.Data)+headerBytes(m), false)
			}
			s.received(m)
			s.refuseSubject(m, tenant, session)
		}
		return
	}
	p := events.Partition(tenant, session, s.partitions)
	if !s.Owned(p) {
		return
	}
	s.received(m)
	s.mu.Lock()
	ln := s.lanes[p]
	s.mu.Unlock()
	if ln == nil {
		return
	}
	if s.cfg.OnReceive != nil {
		s.cfg.OnReceive(p, len(m.Data)+headerBytes(m), false)
	}
	s.enqueue(ln, m, tenant, session)
}

// refuseSubject refuses an append whose subject names no session.
func (s *Server) refuseSubject(m *nats.Msg, tenant, session string) {
	s.refuse(m, tenant, session, ingest.CodeInvalid, fmt.Sprintf("subject %q: tenant and session must be tokens of 1-%d characters of [A-Za-z0-9_-]", m.Subject, events.MaxTokenLen))
}

// enqueue hands a request to its partition's lane, or answers busy.
func (s *Server) enqueue(ln *lane, m *nats.Msg, tenant, session string) {
	if !ln.enqueue(item{m: m, tenant: tenant, session: session, sync: needsSync(m)}) {
		s.count("busy")
		if m.Reply != "" && s.answerable(m) {
			if err := s.nc.Publish(m.Reply, s.busyReply); err != nil {
				s.l.Debug().Err(err).Msg("reply not sent")
			}
		}
	}
}

// headerBytes approximates the size of m's headers on the wire.
func headerBytes(m *nats.Msg) int {
	n := 0
	for k, vs := range m.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

func (s *Server) count(outcome string) {
	if s.cfg.OnAppend != nil {
		s.cfg.OnAppend(outcome)
	}
}

// laneLocked returns partition p's lane, starting it on first use; s.mu
// is held.
func (s *Server) laneLocked(p int) *lane {
	if ln, ok := s.lanes[p]; ok {
		return ln
	}
	ln := newLane(s, p)
	s.lanes[p] = ln
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		ln.run()
	}()
	go func() {
		defer s.wg.Done()
		ln.replier()
	}()
	return ln
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

// tokens returns the last n tokens of subject (n = 2: tenant, session).
func tokens(subject string, n int) (string, string) {
	parts := strings.Split(subject, ".")
	if len(parts) < n {
		return "", ""
	}
	return parts[len(parts)-2], parts[len(parts)-1]
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
// server) since, or is reconnecting now (nats.go keeps what is published
// while reconnecting and sends it to the next server; a connection lost
// between this check and the publish still does so: the check narrows
// that window, it cannot close it). Under auth the
// engine may answer such a request (nats-server's allow_responses) only
// through the server it received it on: on another the reply is refused
// as a permission violation, and it would reach no one anyway. The
// publisher sends the request again (docs/events.md: "When no engine
// answers"), and its ids make that safe.
func (s *Server) answerable(m *nats.Msg) bool {
	v, ok := s.epochs.LoadAndDelete(m)
	if !ok {
		return true
	}
	if v.(uint64) != s.nc.Stats().Reconnects || s.nc.Status() != nats.CONNECTED {
		s.l.Debug().Str("subject", m.Subject).Msg("no reply: the connection moved to another server since the request came")
		return false
	}
	return true
}
