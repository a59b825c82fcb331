package projections

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
)

// Errors of the snapshot store. Match them with errors.Is.
var (
	// ErrNoSnapshot: the session has no snapshot; replay it from its first
	// event.
	ErrNoSnapshot = errors.New("no snapshot")
	// ErrSnapshotVersion: the latest snapshot holds a state of another
	// Version than this build folds; ignore it and replay from the first
	// event.
	ErrSnapshotVersion = errors.New("snapshot of another state version")
	// ErrSnapshotCorrupt: the latest snapshot's body does not decode;
	// ignore it and replay from the first event.
	ErrSnapshotCorrupt = errors.New("corrupt snapshot")
	// ErrSnapshotsUnavailable: JetStream did not answer (no JetStream,
	// stream offline, timeout) or refused the snapshot.
	ErrSnapshotsUnavailable = errors.New("snapshot store unavailable")
	// ErrSnapshotTooLarge: the snapshot's JSON would be over
	// MaxSnapshotBytes; it is not sent. The state's bounds make this
	// impossible for a state the fold made (docs/limits.md); it is the
	// store's own guard.
	ErrSnapshotTooLarge = errors.New("snapshot too large")
)

// MaxSnapshotBytes bounds the JSON of one snapshot, in bytes, and so its
// stored body (the JSON compressed: EncodeSnapshot), and the memory a
// restore decodes: half the NATS server's default max_payload (1 MiB), so
// that a snapshot is stored on any server Turnstone runs on. The state's bounds (the Keep and Max
// constants, IDKey, the clipped previews) keep every state under it
// whatever the session's length, its ids' sizes or its texts:
// docs/limits.md has the arithmetic, and TestWorstStateFitsMaxSnapshotBytes
// checks it.
const MaxSnapshotBytes = 512 << 10

// Snapshot is what one message of the AGENT_SNAPSHOTS stream holds (as
// JSON compressed with S2: EncodeSnapshot, DecodeSnapshot): the state of
// one session after the event at stream sequence CoversSeq, so that
// restoring the session is "this state + the events after CoversSeq". Version is the state's schema Version; TakenAt is when it
// was saved (the saver's clock).
type Snapshot struct {
	// Version is the state's schema Version.
	Version int `json:"version"`
	// CoversSeq is the stream sequence of the last event folded into
	// State (its LastSeq).
	CoversSeq uint64 `json:"covers_seq"`
	// TakenAt is when the snapshot was saved, by the saver's clock.
	TakenAt time.Time `json:"taken_at"`
	// State is the session's state.
	State *Session `json:"state"`
}

// SnapshotConfig configures a SnapshotStore. The zero value is usable.
type SnapshotConfig struct {
	// PerSession is how many snapshots the stream keeps per session
	// (MaxMsgsPerSubject) when EnsureStream creates it. Default
	// events.DefaultSnapshotsPerSession (3).
	PerSession int64
	// Replicas and Storage are the stream's when EnsureStream creates it.
	// Default 1 replica, file storage.
	Replicas int
	Storage  jetstream.StorageType
	// Timeout bounds each call when the caller's context has no deadline.
	// Default events.DefaultTimeout (5 seconds).
	Timeout time.Duration
}

func (c *SnapshotConfig) setDefaults() {
	if c.PerSession == 0 {
		c.PerSession = events.DefaultSnapshotsPerSession
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.Timeout == 0 {
		c.Timeout = events.DefaultTimeout
	}
}

// Validate reports every field that is out of range, joined.
func (c *SnapshotConfig) Validate() error {
	var errs []error
	if c.PerSession < 0 {
		errs = append(errs, fmt.Errorf("per session: must not be negative, got %d", c.PerSession))
	}
	if c.Replicas < 0 || c.Replicas > 5 {
		errs = append(errs, fmt.Errorf("replicas: must be 1 to 5, got %d", c.Replicas))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("timeout: must not be negative, got %s", c.Timeout))
	}
	return errors.Join(errs...)
}

// SnapshotStore saves and loads session snapshots in the AGENT_SNAPSHOTS
// stream, subject agent.snap.<tenant>.<session> (events.SnapshotSubject),
// the last few kept per session. It is safe for concurrent use.
type SnapshotStore struct {
	js  jetstream.JetStream
	cfg SnapshotConfig

	mu     sync.Mutex
	stream jetstream.Stream // looked up on first use
}

// NewSnapshotStore returns a store on js. It does no I/O: the stream is
// looked up on first use (events.Open creates it; so does EnsureStream).
// It returns an error only for a Config that fails Validate.
func NewSnapshotStore(js jetstream.JetStream, cfg SnapshotConfig) (*SnapshotStore, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("new snapshot store: %w", err)
	}
	cfg.setDefaults()
	return &SnapshotStore{js: js, cfg: cfg}, nil
}

// StreamConfig is the AGENT_SNAPSHOTS stream EnsureStream creates: the one
// events.SnapshotsStreamConfig defines, with this store's settings.
func (s *SnapshotStore) StreamConfig() jetstream.StreamConfig {
	return events.SnapshotsStreamConfig(events.Config{
		SnapshotsPerSession: s.cfg.PerSession,
		Replicas:            s.cfg.Replicas,
		Storage:             s.cfg.Storage,
	})
}

// EnsureStream creates the AGENT_SNAPSHOTS stream if it does not exist.
// An existing stream is kept as it is (events.Open owns its settings), so
// EnsureStream and events.Open can run in any order, at the same time.
// Errors wrap ErrSnapshotsUnavailable.
func (s *SnapshotStore) EnsureStream(ctx context.Context) error {
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	st, err := s.js.CreateStream(ctx, s.StreamConfig())
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		st, err = s.js.Stream(ctx, events.SnapshotsStream)
	}
	if err != nil {
		return fmt.Errorf("ensure stream %s: %w: %w", events.SnapshotsStream, ErrSnapshotsUnavailable, err)
	}
	s.mu.Lock()
	s.stream = st
	s.mu.Unlock()
	return nil
}

// Save stores a snapshot of sess covering its LastSeq. A retried Save of
// the same state within the stream's duplicate window is stored once
// (Nats-Msg-Id tenant.session.covers_seq.version). sess must not change
// while Save runs. The caller may then append a snapshot.taken event to
// the log.
//
// Errors: sess has no tenant, session or LastSeq (nothing from the log to
// cover); ErrSnapshotTooLarge (nothing sent) when its JSON would be over
// MaxSnapshotBytes; ErrSnapshotsUnavailable when the stream does not
// exist or JetStream refuses or does not answer.
func (s *SnapshotStore) Save(ctx context.Context, sess *Session) error {
	if sess == nil || !events.ValidToken(sess.Tenant) || !events.ValidToken(sess.Session) {
		return errors.New("save snapshot: the session has no valid tenant and session")
	}
	if sess.LastSeq == 0 {
		return fmt.Errorf("save snapshot %s/%s: the state covers no stream sequence", sess.Tenant, sess.Session)
	}
	body, err := EncodeSnapshot(sess, time.Now().UTC())
	if err != nil {
		return fmt.Errorf("save snapshot %s/%s: encode: %w", sess.Tenant, sess.Session, err)
	}
	m := nats.NewMsg(events.SnapshotSubject(sess.Tenant, sess.Session))
	m.Data = body
	m.Header.Set(jetstream.MsgIDHeader, sess.Tenant+"."+sess.Session+"."+strconv.FormatUint(sess.LastSeq, 10)+".v"+strconv.Itoa(Version))
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	if _, err := s.js.PublishMsg(ctx, m, jetstream.WithExpectStream(events.SnapshotsStream)); err != nil {
		return fmt.Errorf("save snapshot %s/%s: %w: %w", sess.Tenant, sess.Session, ErrSnapshotsUnavailable, err)
	}
	return nil
}

// Latest returns the session's latest snapshot. Errors: ErrNoSnapshot
// when it has none (or the stream does not exist yet);
// ErrSnapshotVersion when the snapshot's Version is not this build's;
// ErrSnapshotCorrupt when its body does not decode; ErrSnapshotsUnavailable
// when JetStream does not answer. The first three mean "replay the session
// from its first event".
func (s *SnapshotStore) Latest(ctx context.Context, tenant, session string) (*Snapshot, error) {
	if !events.ValidToken(tenant) || !events.ValidToken(session) {
		return nil, fmt.Errorf("load snapshot %q/%q: %w", tenant, session, ErrNoSnapshot)
	}
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	st, err := s.snapshots(ctx)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("load snapshot %s/%s: %w (no stream %s)", tenant, session, ErrNoSnapshot, events.SnapshotsStream)
	}
	if err != nil {
		return nil, fmt.Errorf("load snapshot %s/%s: %w: %w", tenant, session, ErrSnapshotsUnavailable, err)
	}
	msg, err := st.GetLastMsgForSubject(ctx, events.SnapshotSubject(tenant, session))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, fmt.Errorf("load snapshot %s/%s: %w", tenant, session, ErrNoSnapshot)
	}
	if err != nil {
		return nil, fmt.Errorf("load snapshot %s/%s: %w: %w", tenant, session, ErrSnapshotsUnavailable, err)
	}
	snap, err := DecodeSnapshot(msg.Data)
	if err != nil {
		return nil, fmt.Errorf("load snapshot %s/%s (stream sequence %d): %w", tenant, session, msg.Sequence, err)
	}
	if snap.State.Tenant != tenant || snap.State.Session != session {
		return nil, fmt.Errorf("load snapshot %s/%s (stream sequence %d): %w: it holds session %s/%s",
			tenant, session, msg.Sequence, ErrSnapshotCorrupt, snap.State.Tenant, snap.State.Session)
	}
	return snap, nil
}

// Load returns the state of the session's latest snapshot, with the
// errors of Latest: ErrNoSnapshot, ErrSnapshotVersion and
// ErrSnapshotCorrupt mean "replay from the first event".
func (s *SnapshotStore) Load(ctx context.Context, tenant, session string) (*Session, error) {
	snap, err := s.Latest(ctx, tenant, session)
	if err != nil {
		return nil, err
	}
	return snap.State, nil
}

// snapshots returns the stream handle, looking it up once.
func (s *SnapshotStore) snapshots(ctx context.Context) (jetstream.Stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stream != nil {
		return s.stream, nil
	}
	st, err := s.js.Stream(ctx, events.SnapshotsStream)
	if err != nil {
		return nil, err
	}
	s.stream = st
	return st, nil
}

func (s *SnapshotStore) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.cfg.Timeout)
}

// SessionReader reads a session's events in stream order, from
// opts.FromSeq, calling fn with each; an event that failed to decode or
// validate comes with Err set. *events.Log implements it.
type SessionReader interface {
	ReadSession(ctx context.Context, tenant, session string, opts events.ReadOptions, fn func(events.Event) error) error
}

var _ SessionReader = (*events.Log)(nil)

// Restore rebuilds a session's state: its latest snapshot (when store is
// not nil and has a usable one) plus the events after the snapshot's
// CoversSeq, read from log. A snapshot that is missing, of another
// Version or corrupt is ignored: the session is replayed from its first
// event. A session.rewound in the tail that undoes events is carried out by
// a refold: from the snapshot's state when the rewind leaves it intact
// (reading only the events after it), else from the session's first event
// (a rewind that reaches back before the snapshot); the read then goes on
// after the rewind. The result equals FoldLog of every event of the
// session, and never has NeedsRefold set.
//
// Errors: the log's (events.ErrSessionNotFound when the session has
// neither events nor a snapshot, events.ErrLogUnavailable);
// ErrSnapshotsUnavailable when the store does not answer.
func Restore(ctx context.Context, log SessionReader, store *SnapshotStore, tenant, session string) (*Session, error) {
	sess := &Session{}
	fromSnapshot := false
	if store != nil {
		snap, err := store.Load(ctx, tenant, session)
		switch {
		case err == nil:
			sess, fromSnapshot = snap, true
		case errors.Is(err, ErrNoSnapshot), errors.Is(err, ErrSnapshotVersion), errors.Is(err, ErrSnapshotCorrupt):
		default:
			return nil, fmt.Errorf("restore %s/%s: %w", tenant, session, err)
		}
	}
	for {
		if sess.NeedsRefold {
			// Refold from the snapshot, loaded again (sess is past it), when
			// the rewind leaves it intact (refoldLog checks).
			var base *Session
			if fromSnapshot {
				base, _ = store.Load(ctx, tenant, session)
			}
			if err := sess.refoldLog(ctx, log, base); err != nil {
				return nil, fmt.Errorf("restore %s/%s: %w", tenant, session, err)
			}
		}
		err := log.ReadSession(ctx, tenant, session, events.ReadOptions{FromSeq: sess.LastSeq + 1}, func(ev events.Event) error {
			sess.Apply(ev)
			if sess.NeedsRefold {
				return errRefold // refold, then read on after the rewind
			}
			return nil
		})
		if errors.Is(err, errRefold) {
			continue
		}
		if err != nil && !(fromSnapshot && errors.Is(err, events.ErrSessionNotFound)) {
			return nil, fmt.Errorf("restore %s/%s: %w", tenant, session, err)
		}
		return sess, nil
	}
}

// errRefold stops a read of the log at a rewind that needs a refold.
var errRefold = errors.New("refold needed")
