package events

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"
	"github.com/turnstone-dev/turnstone/internal/resend"
)

// Log is the append-only event log on JetStream: the AGENT_EVENTS stream
// (and AGENT_SNAPSHOTS, which it creates for the projections). It is safe
// for concurrent use.
type Log struct {
	js         jetstream.JetStream
	events     jetstream.Stream
	cfg        Config
	partitions int
	log        zerolog.Logger
	changes    []string // the stream settings Open changed
	// infoAt is when the events stream's info (its replica count,
	// replicated) was last read, in Unix nanoseconds; 0 for a Log that
	// Open did not make, which never reads it again. infoBusy: a read
	// is under way.
	infoAt   atomic.Int64
	infoBusy atomic.Bool
}

// Open creates the streams when they are missing and returns a Log that
// appends to and reads from them. An existing AGENT_EVENTS keeps its
// partition count (see Config.Partitions), and every setting the config
// leaves unset (zero) keeps the stream's: a client (the CLI, a worker)
// never downgrades what the engine set up, and a restart without a flag
// changes nothing. A setting the config does set and that differs from
// the stream's is an error (ErrSettingsDiffer, naming each) unless
// Config.UpdateStreams; the settings of this version's wire contract
// (deny delete, direct get, atomic publish, discard new) are brought up to
// date. With Config.UseExisting nothing is created or updated. Open logs
// the streams' effective durability (storage, replicas). logger may be
// nil (no logging).
//
// Errors: a Config that fails Validate; a partition count that conflicts
// with the existing stream's; ErrSettingsDiffer; ErrNoStream;
// ErrLogUnavailable when JetStream does not answer.
func Open(ctx context.Context, js jetstream.JetStream, cfg Config, logger *zerolog.Logger) (*Log, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("open event log: %w", err)
	}
	requested := cfg
	cfg.setDefaults()
	l := &Log{js: js, cfg: cfg, log: zerolog.Nop()}
	if logger != nil {
		l.log = *logger
	}
	ctx, cancel := l.withTimeout(ctx)
	defer cancel()

	partitions := cfg.Partitions
	existing, err := js.Stream(ctx, EventsStream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound) && requested.UseExisting:
		return nil, fmt.Errorf("open event log: %w: %s (an operator creates it: engine setup)", ErrNoStream, EventsStream)
	case errors.Is(err, jetstream.ErrStreamNotFound):
		if partitions == 0 {
			partitions = DefaultPartitions
		}
		l.events, err = js.CreateStream(ctx, EventsStreamConfig(cfg, partitions))
		if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil, fmt.Errorf("open event log: create %s: %w", EventsStream, unavailable(err))
		}
		if err != nil { // created concurrently by another process: adopt it
			return Open(ctx, js, requested, logger)
		}
		l.log.Info().Int("partitions", partitions).Int("replicas", cfg.Replicas).Str("storage", cfg.Storage.String()).Msg("created stream " + EventsStream)
	case err != nil:
		return nil, fmt.Errorf("open event log: %w", unavailable(err))
	default:
		have := existing.CachedInfo().Config
		hp, perr := partitionsOf(have)
		if perr != nil {
			return nil, fmt.Errorf("open event log: %w", perr)
		}
		if partitions != 0 && partitions != hp {
			return nil, fmt.Errorf("open event log: stream %s has %d partitions, config asks for %d: the partition count is fixed when the stream is created", EventsStream, hp, partitions)
		}
		partitions = hp
		if !requested.UpdateStreams || requested.UseExisting {
			if diffs := explicitDiffs(requested, have); len(diffs) > 0 {
				return nil, fmt.Errorf("open event log: %w: stream %s has %s; only a setup with Config.UpdateStreams changes it (engine setup --update-streams)",
					ErrSettingsDiffer, EventsStream, strings.Join(diffs, ", "))
			}
		}
		cfg = adopt(requested, have)
		l.cfg = cfg
		want := EventsStreamConfig(cfg, partitions)
		if have.DenyPurge {
			// deny_purge cannot be undone (JetStream error 10052): a
			// stream created by an earlier version keeps it, and its
			// sessions cannot be erased.
			want.DenyPurge = true
			l.log.Warn().Msg("stream " + EventsStream + " denies purge (created by an earlier version): engine erase cannot remove its sessions")
		}
		if differs(have, want) && !requested.UseExisting {
			if l.events, err = js.UpdateStream(ctx, want); err != nil {
				return nil, fmt.Errorf("open event log: update %s: %w", EventsStream, unavailable(err))
			}
			l.changes = append(l.changes, Changes(have, want)...)
			l.log.Info().Int("replicas", want.Replicas).Msg("updated stream " + EventsStream)
		} else {
			l.events = existing
		}
		l.log.Info().Int("partitions", partitions).Int("replicas", have.Replicas).Str("storage", have.Storage.String()).
			Msg("stream " + EventsStream + ": effective durability")
	}
	l.partitions = partitions
	l.infoAt.Store(time.Now().UnixNano())

	if err := l.openSnapshots(ctx, requested); err != nil {
		return nil, fmt.Errorf("open event log: %w", err)
	}
	return l, nil
}

// openSnapshots creates AGENT_SNAPSHOTS when it is missing, or checks and
// (when allowed) updates it like AGENT_EVENTS.
func (l *Log) openSnapshots(ctx context.Context, requested Config) error {
	want := SnapshotsStreamConfig(l.cfg)
	st, err := l.js.Stream(ctx, SnapshotsStream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound) && requested.UseExisting:
		return fmt.Errorf("%w: %s (an operator creates it: engine setup)", ErrNoStream, SnapshotsStream)
	case errors.Is(err, jetstream.ErrStreamNotFound):
		if _, err := l.js.CreateStream(ctx, want); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("%s: %w", SnapshotsStream, unavailable(err))
		}
		return nil
	case err != nil:
		return fmt.Errorf("%s: %w", SnapshotsStream, unavailable(err))
	}
	have := st.CachedInfo().Config
	if requested.UseExisting {
		return nil
	}
	if have.Replicas == want.Replicas && have.MaxMsgsPerSubject == want.MaxMsgsPerSubject && have.AllowDirect == want.AllowDirect {
		return nil
	}
	if !requested.UpdateStreams && (requested.SnapshotsPerSession != 0 && have.MaxMsgsPerSubject != want.MaxMsgsPerSubject) {
		return fmt.Errorf("%w: stream %s keeps %d snapshots per session, config asks for %d; only a setup with Config.UpdateStreams changes it (engine setup --update-streams)",
			ErrSettingsDiffer, SnapshotsStream, have.MaxMsgsPerSubject, want.MaxMsgsPerSubject)
	}
	if requested.SnapshotsPerSession == 0 {
		want.MaxMsgsPerSubject = have.MaxMsgsPerSubject
	}
	if _, err := l.js.UpdateStream(ctx, want); err != nil {
		return fmt.Errorf("update %s: %w", SnapshotsStream, unavailable(err))
	}
	l.changes = append(l.changes, Changes(have, want)...)
	return nil
}

// Changed lists the settings of existing streams Open changed, one
// "<stream> <setting>: <old> -> <new>" each (see Changes); empty when it
// changed none. engine setup records them in the audit stream.
func (l *Log) Changed() []string { return slices.Clone(l.changes) }

// Changes describes the settings of a stream that differ between have
// and want, one "<stream> <setting>: <old> -> <new>" each, in a fixed
// order.
func Changes(have, want jetstream.StreamConfig) []string {
	var out []string
	add := func(name string, a, b any) {
		if fmt.Sprint(a) != fmt.Sprint(b) {
			out = append(out, fmt.Sprintf("%s %s: %v -> %v", want.Name, name, a, b))
		}
	}
	add("subjects", have.Subjects, want.Subjects)
	if have.SubjectTransform != nil || want.SubjectTransform != nil {
		add("subject transform", transformOf(have.SubjectTransform), transformOf(want.SubjectTransform))
	}
	add("replicas", have.Replicas, want.Replicas)
	add("max bytes", have.MaxBytes, want.MaxBytes)
	add("max age", have.MaxAge, want.MaxAge)
	add("max messages", have.MaxMsgs, want.MaxMsgs)
	add("max message size", have.MaxMsgSize, want.MaxMsgSize)
	add("max messages per subject", have.MaxMsgsPerSubject, want.MaxMsgsPerSubject)
	add("duplicate window", have.Duplicates, want.Duplicates)
	add("discard", have.Discard, want.Discard)
	add("deny delete", have.DenyDelete, want.DenyDelete)
	add("deny purge", have.DenyPurge, want.DenyPurge)
	add("allow direct", have.AllowDirect, want.AllowDirect)
	add("allow atomic publish", have.AllowAtomicPublish, want.AllowAtomicPublish)
	add("partitions", have.Metadata[PartitionsMetadata], want.Metadata[PartitionsMetadata])
	add("max event bytes", have.Metadata[MaxEventBytesMetadata], want.Metadata[MaxEventBytesMetadata])
	return out
}

// ConsumerChanges describes the settings of a consumer that differ
// between have and want, one "<setting>: <old> -> <new>" each, in a fixed
// order. The settings compared are those of a pull consumer that
// JetStream lets an update change (nats-server's checkNewConsumerConfig
// refuses the others, max waiting among them), but metadata, to which the
// server adds keys of its own; those a worker's flag sets are named as
// the flag is (ack-wait, max-deliver, pinned-ttl).
func ConsumerChanges(have, want jetstream.ConsumerConfig) []string {
	var out []string
	add := func(name string, a, b any) {
		if fmt.Sprint(a) != fmt.Sprint(b) {
			out = append(out, fmt.Sprintf("%s: %v -> %v", name, a, b))
		}
	}
	add("description", have.Description, want.Description)
	add("filter subject", have.FilterSubject, want.FilterSubject)
	add("filter subjects", have.FilterSubjects, want.FilterSubjects)
	add("ack-wait", have.AckWait, want.AckWait)
	add("max-deliver", have.MaxDeliver, want.MaxDeliver)
	add("backoff", have.BackOff, want.BackOff)
	add("max ack pending", have.MaxAckPending, want.MaxAckPending)
	add("max request batch", have.MaxRequestBatch, want.MaxRequestBatch)
	add("max request expires", have.MaxRequestExpires, want.MaxRequestExpires)
	add("max request max bytes", have.MaxRequestMaxBytes, want.MaxRequestMaxBytes)
	add("inactive threshold", have.InactiveThreshold, want.InactiveThreshold)
	add("headers only", have.HeadersOnly, want.HeadersOnly)
	add("replicas", have.Replicas, want.Replicas)
	add("priority groups", have.PriorityGroups, want.PriorityGroups)
	add("pinned-ttl", have.PinnedTTL, want.PinnedTTL)
	return out
}

func transformOf(t *jetstream.SubjectTransformConfig) string {
	if t == nil {
		return "none"
	}
	return t.Source + " > " + t.Destination
}

// explicitDiffs lists the settings req sets (non-zero) that differ from the
// stream's, as "replicas 3 (config asks for 1)".
func explicitDiffs(req Config, have jetstream.StreamConfig) []string {
	var out []string
	diff := func(name string, has, asks any) {
		out = append(out, fmt.Sprintf("%s %v (config asks for %v)", name, has, asks))
	}
	if req.Replicas != 0 && req.Replicas != have.Replicas {
		diff("replicas", have.Replicas, req.Replicas)
	}
	if req.DuplicateWindow != 0 && req.DuplicateWindow != have.Duplicates {
		diff("duplicate window", have.Duplicates, req.DuplicateWindow)
	}
	if has := maxEventBytesOf(have); req.MaxEventBytes != 0 && req.MaxEventBytes != has {
		diff("max event bytes", has, req.MaxEventBytes)
	}
	if req.MaxBytes != 0 && req.MaxBytes != have.MaxBytes {
		diff("max bytes", have.MaxBytes, req.MaxBytes)
	}
	return out
}

// adopt fills the settings req leaves unset from the existing stream's
// configuration, then the defaults.
func adopt(req Config, have jetstream.StreamConfig) Config {
	if req.Replicas == 0 {
		req.Replicas = have.Replicas
	}
	if req.DuplicateWindow == 0 {
		req.DuplicateWindow = have.Duplicates
	}
	if req.MaxEventBytes == 0 {
		req.MaxEventBytes = maxEventBytesOf(have)
	}
	if req.MaxBytes == 0 && have.MaxBytes > 0 {
		req.MaxBytes = have.MaxBytes
	}
	if req.Storage == 0 {
		req.Storage = have.Storage
	}
	req.setDefaults()
	return req
}

// maxEventBytesOf is the body limit of an existing AGENT_EVENTS: its
// metadata's, or, for a stream of an earlier version (whose max_msg_size
// was the body limit, headers included), its max_msg_size; 0 when it
// sets none.
func maxEventBytesOf(c jetstream.StreamConfig) int {
	if v, ok := c.Metadata[MaxEventBytesMetadata]; ok {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			return n
		}
	}
	if c.MaxMsgSize > 0 {
		return int(c.MaxMsgSize)
	}
	return 0
}

var partitionRE = regexp.MustCompile(`\{\{\s*partition\((\d+)`)

func partitionsOf(c jetstream.StreamConfig) (int, error) {
	if v, ok := c.Metadata[PartitionsMetadata]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return 0, fmt.Errorf("stream %s metadata %s=%q is not a partition count", c.Name, PartitionsMetadata, v)
		}
		return n, nil
	}
	// Streams of earlier versions kept the count in their transform.
	if c.SubjectTransform == nil {
		return 0, fmt.Errorf("stream %s has no partition transform: it was not created by Turnstone", c.Name)
	}
	m := partitionRE.FindStringSubmatch(c.SubjectTransform.Destination)
	if m == nil {
		return 0, fmt.Errorf("stream %s transform %q has no partition()", c.Name, c.SubjectTransform.Destination)
	}
	return strconv.Atoi(m[1])
}

// differs reports whether the settings Turnstone manages differ.
func differs(have, want jetstream.StreamConfig) bool {
	return have.Duplicates != want.Duplicates || have.MaxMsgSize != want.MaxMsgSize ||
		!slices.Equal(have.Subjects, want.Subjects) || have.SubjectTransform != nil ||
		have.Metadata[PartitionsMetadata] != want.Metadata[PartitionsMetadata] ||
		have.Metadata[MaxEventBytesMetadata] != want.Metadata[MaxEventBytesMetadata] ||
		have.MaxBytes != want.MaxBytes || have.DenyDelete != want.DenyDelete ||
		have.AllowDirect != want.AllowDirect ||
		have.Discard != want.Discard || have.Replicas != want.Replicas ||
		have.AllowAtomicPublish != want.AllowAtomicPublish
}

// Partitions is the stream's partition count.
func (l *Log) Partitions() int { return l.partitions }

// JetStream is the JetStream context the log uses.
func (l *Log) JetStream() jetstream.JetStream { return l.js }

// Config is the log's configuration, defaults applied.
func (l *Log) Config() Config { return l.cfg }

// Partition is the partition the stream's transform puts a session in:
// FNV-1a (32 bit) of tenant followed by session, modulo partitions. It is
// the hash nats-server's partition() subject-mapping function computes over
// the concatenated tokens.
func Partition(tenant, session string, partitions int) int {
	if partitions <= 0 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(tenant))
	_, _ = h.Write([]byte(session))
	return int(h.Sum32() % uint32(partitions))
}

// SessionSubject is the stored subject of a session's events in this log.
func (l *Log) SessionSubject(tenant, session string) string {
	return StoredEventSubject(Partition(tenant, session, l.partitions), tenant, session)
}

func (l *Log) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, l.cfg.Timeout)
}

// Ack is the log's receipt for one appended event: the stream sequence it is
// stored at, and whether JetStream dropped it as a duplicate of an event
// with the same id stored within the duplicate window (Seq is then the
// original's).
type Ack struct {
	ID        string
	Seq       uint64
	Duplicate bool
}

type appendOpts struct {
	expect    bool
	expectSeq uint64
	atomic    bool
}

// AppendOption sets an optional behaviour of Append.
type AppendOption func(*appendOpts)

// ExpectLastSeq makes Append conditional and atomic: the session's last
// stored event must be at stream sequence seq (0: the session must have no
// event yet), or Append stores nothing and returns ErrConflict. The same
// call sent again after it was stored (its reply lost) is answered with
// the original acks, Duplicate set, not with a conflict (docs/events.md,
// "Sending again"). The events of the call (one session's, at most
// MaxAtomicEvents) are stored as one JetStream atomic batch: all of them
// at consecutive sequences, or none, so no other writer interleaves and a
// crash never leaves half of them. It is JetStream's
// Nats-Expected-Last-Subject-Sequence header on the first message of an
// atomic batch (ADR-50; nats-server 2.12+).
func ExpectLastSeq(seq uint64) AppendOption {
	return func(o *appendOpts) { o.expect, o.expectSeq = true, seq }
}

// Atomic makes Append store the events of the call (one session's, at
// most MaxAtomicEvents) as one JetStream atomic batch, without a
// condition: all of them at consecutive sequences, or none, whatever else
// the session is sent meanwhile. Events that must never be stored one
// without the other (a recovery attempt and its completion) are appended
// so: a writer that dies between two separate publishes leaves the first
// alone in the log. The same call sent again after it was stored (its
// reply lost) is answered with the original acks, Duplicate set, while
// its ids are within the stream's duplicate window (Config's
// DuplicateWindow); after it, the call is stored again, as an
// unconditional Append is. ExpectLastSeq implies it. It is ADR-50's
// atomic batch publish (nats-server 2.12+) with no expectation header;
// one event is atomic as it is, and is published as an unconditional
// Append publishes it.
func Atomic() AppendOption {
	return func(o *appendOpts) { o.atomic = true }
}

// ExpectedLastSeq reads opts: whether they make an Append conditional
// (ExpectLastSeq) and on which sequence. For other implementations of
// SessionLog.
func ExpectedLastSeq(opts ...AppendOption) (seq uint64, conditional bool) {
	o := readAppendOpts(opts)
	return o.expectSeq, o.expect
}

// IsAtomic reads opts: whether they make an Append one atomic batch
// (Atomic, or ExpectLastSeq). For other implementations of SessionLog.
func IsAtomic(opts ...AppendOption) bool {
	o := readAppendOpts(opts)
	return o.atomic || o.expect
}

func readAppendOpts(opts []AppendOption) appendOpts {
	var o appendOpts
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// SessionLog is what a publisher of one tenant's sessions needs of the log:
// append events and read its sessions back. *Log implements it on
// JetStream directly (Turnstone's own processes); ingest.Client implements
// it through the engine (any publisher, under auth), with the same
// semantics: validation, masking, Nats-Msg-Id deduplication, and atomic
// and conditional appends.
type SessionLog interface {
	Append(ctx context.Context, evs []Event, opts ...AppendOption) ([]Ack, error)
	ReadSession(ctx context.Context, tenant, session string, opts ReadOptions, fn func(Event) error) error
	LastSeq(ctx context.Context, tenant, session string) (uint64, error)
}

var _ SessionLog = (*Log)(nil)

// Prepare validates and masks evs as Append does, and returns the messages
// Append would publish (stored subject, Nats-Msg-Id, body), without
// sending anything; atomic asks for events of one session only. For the
// engine's ingest, which publishes them itself. Errors as Append's.
func (l *Log) Prepare(evs []Event, atomic bool) ([]*nats.Msg, error) { return l.prepare(evs, atomic) }

// PrepareBody is Prepare for one event ev decoded (Decode) from body, the
// bytes a publisher sent: ev is validated as Prepare does; when masking
// the whole body would change nothing (MaskJSON finds no secret in any
// of its strings, the envelope's and unknown members' included) the body
// is stored byte for byte as it was sent, saving a re-encode; otherwise
// the event is masked and re-encoded as Prepare does. The message is for
// the event's stored subject, with its id as Nats-Msg-Id. Errors as
// Prepare's.
func (l *Log) PrepareBody(ev Event, body []byte) (*nats.Msg, error) {
	if err := Validate(&ev); err != nil {
		return nil, fmt.Errorf("append events: %w", &EventError{Tenant: ev.Tenant, Session: ev.Session, ID: ev.ID, Err: fmt.Errorf("event 0: %w", err)})
	}
	if len(body) <= l.cfg.MaxEventBytes && bytes.Equal(MaskJSON(body), body) {
		m := nats.NewMsg(l.SessionSubject(ev.Tenant, ev.Session))
		m.Data = body
		m.Header.Set(jetstream.MsgIDHeader, ev.ID)
		return m, nil
	}
	msgs, err := l.prepare([]Event{ev}, false)
	if err != nil {
		return nil, err
	}
	return msgs[0], nil
}

// Append validates, masks and stores evs in order, and returns one Ack per
// event. Each event is published to its stored subject,
// agent.evt.<partition>.<tenant>.<session>, with its id as Nats-Msg-Id, so
// retrying an Append stores nothing twice within the duplicate window.
//
// Nothing is sent when any event is invalid: the error joins one
// *EventError per bad event, wrapping ErrInvalid (with *FieldError values)
// or ErrTooLarge. Other errors: ErrConflict (see ExpectLastSeq; the acks of
// events stored before the conflict are returned), ErrDuplicateID (a
// conditional or atomic append reusing ids another call stored),
// ErrLogUnavailable. Every form is idempotent: the identical call sent
// again returns the original acks, Duplicate set. With Atomic or
// ExpectLastSeq the events are one session's, at most MaxAtomicEvents,
// stored as one atomic batch.
//
// A publish that finds no stream listening ("no responders": a replicated
// stream just created, or whose leader just moved) is sent again before
// ErrLogUnavailable, up to 10 tries over about 3.5 s: for an atomic or
// conditional append, the whole batch; for an unconditional one, the
// events that met it, in the call's order. A round of an unconditional
// append that holds two events of one session sends its first alone, and
// the rest once it is stored, so that one session's events keep their
// order: a later event stored before an earlier one is possible only when
// the stream stopped answering and began again while the round was sent
// (its leader moved twice in a moment).
func (l *Log) Append(ctx context.Context, evs []Event, opts ...AppendOption) ([]Ack, error) {
	o := readAppendOpts(opts)
	msgs, err := l.prepare(evs, o.expect || o.atomic)
	if err != nil {
		return nil, err
	}
	if o.expect || o.atomic && len(evs) > 1 {
		return l.appendAtomic(ctx, evs, msgs, o.expect, o.expectSeq)
	}
	// One event is atomic as it is: a plain publish, deduplicated by
	// JetStream itself.
	return l.appendAsync(ctx, evs, msgs)
}

// AppendMsgs stores evs as Append does, from the messages Prepare or
// PrepareBody returned for them (one per event, in order), so that what
// was prepared (a body stored byte for byte as its publisher sent it) is
// what is stored. With Atomic or ExpectLastSeq the events are one atomic
// batch, as for Append; its headers are added to the messages. Errors as
// Append's.
func (l *Log) AppendMsgs(ctx context.Context, evs []Event, msgs []*nats.Msg, opts ...AppendOption) ([]Ack, error) {
	if len(evs) != len(msgs) {
		return nil, fmt.Errorf("append events: %w: %d events, %d messages", ErrInvalid, len(evs), len(msgs))
	}
	o := readAppendOpts(opts)
	if o.expect || o.atomic {
		for i := range evs {
			if evs[i].Tenant != evs[0].Tenant || evs[i].Session != evs[0].Session {
				return nil, fmt.Errorf("append events: %w: an atomic append takes events of one session", ErrInvalid)
			}
		}
		if o.expect || len(evs) > 1 {
			return l.appendAtomic(ctx, evs, msgs, o.expect, o.expectSeq)
		}
	}
	return l.appendAsync(ctx, evs, msgs)
}

func (l *Log) prepare(evs []Event, oneSession bool) ([]*nats.Msg, error) {
	var errs []error
	msgs := make([]*nats.Msg, len(evs))
	for i := range evs {
		ev := &evs[i]
		bad := func(err error) {
			errs = append(errs, &EventError{Tenant: ev.Tenant, Session: ev.Session, ID: ev.ID, Err: fmt.Errorf("event %d: %w", i, err)})
		}
		if err := Validate(ev); err != nil {
			bad(err)
			continue
		}
		if oneSession && (ev.Tenant != evs[0].Tenant || ev.Session != evs[0].Session) {
			bad(fmt.Errorf("%w: an atomic or conditional append takes events of one session", ErrInvalid))
			continue
		}
		masked := Mask(ev)
		if masked {
			// A secret-shaped value in a field that must be a token
			// (parent_session, fork_session) would be stored invalid.
			if err := Validate(ev); err != nil {
				bad(fmt.Errorf("after masking a secret: %w", err))
				continue
			}
		}
		body, err := ev.Encode()
		if err != nil {
			bad(err)
			continue
		}
		if len(body) > l.cfg.MaxEventBytes {
			bad(fmt.Errorf("%w: %d bytes encoded, the limit is %d bytes", ErrTooLarge, len(body), l.cfg.MaxEventBytes))
			continue
		}
		m := nats.NewMsg(l.SessionSubject(ev.Tenant, ev.Session))
		m.Data = body
		m.Header.Set(jetstream.MsgIDHeader, ev.ID)
		msgs[i] = m
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("append events: %w", errors.Join(errs...))
	}
	return msgs, nil
}

func (l *Log) appendAsync(ctx context.Context, evs []Event, msgs []*nats.Msg) ([]Ack, error) {
	// A context that has already ended stores nothing (the publishes
	// below do not look at it; only the wait for their acks does).
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("append events: %w: %w", ErrLogUnavailable, err)
	}
	acks := make([]Ack, len(msgs))
	errs := make([]error, len(msgs))
	send := make([]int, len(msgs)) // the events of this round, in call order
	for i := range send {
		send[i] = i
	}
	// Events that met "no responders" (no stream listening yet: a
	// replicated stream just created, or whose leader just moved) are sent
	// again, by this goroutine, in call order, on retryTransient's
	// schedule. nats.go's own retry (jetstream.WithRetryAttempts) sends
	// each message again from a timer of its own, so that two events of
	// one session could be stored in the other order: it is turned off.
	b := resend.BackOff()
	for try := 1; ; try++ {
		if err := l.publishRound(ctx, evs, msgs, send, acks, errs); err != nil {
			return nil, err
		}
		again := send[:0]
		for _, i := range send {
			if errors.Is(errs[i], jetstream.ErrNoStreamResponse) {
				again = append(again, i)
			}
		}
		if len(again) == 0 || try == resend.Tries {
			break
		}
		select {
		case <-time.After(b.NextBackOff()):
		case <-ctx.Done():
			return nil, fmt.Errorf("append events: %w: %w", ErrLogUnavailable, ctx.Err())
		}
		send = again
	}
	var joined []error
	for i, err := range errs {
		if err != nil {
			joined = append(joined, fmt.Errorf("append event %s: %w", evs[i].ID, classify(err)))
		}
	}
	if len(joined) > 0 {
		return acks, errors.Join(joined...)
	}
	return acks, nil
}

// publishRound publishes msgs[i] for each i of send, in that order,
// without waiting between them and without nats.go's retry, and records
// each one's ack in acks[i] or its error in errs[i]. It returns an error
// (nothing more is known of the round) when ctx ends, or when an ack
// takes longer than Config.Timeout after the one before it and ctx has
// no deadline of its own: a large batch is bounded by progress, not by
// one fixed deadline.
//
// When the round holds two events of one session, its first event is sent
// alone, and the rest only once it is stored: where no stream listens yet
// (a stream just created, or whose leader just moved), events sent at once
// could meet the stream's interest arriving midway, so that a session's
// first events meet "no responders" and a later one is stored, ahead of
// them. When the first meets "no responders", the rest are not sent and
// count as having met it too, so that the next round sends them all again
// in call order. (A round of one event per session has no order to keep:
// it is sent at once.)
func (l *Log) publishRound(ctx context.Context, evs []Event, msgs []*nats.Msg, send []int, acks []Ack, errs []error) error {
	if len(send) > 1 && sessionTwice(msgs, send) {
		if err := l.publishRound(ctx, evs, msgs, send[:1], acks, errs); err != nil {
			return err
		}
		if errors.Is(errs[send[0]], jetstream.ErrNoStreamResponse) {
			for _, i := range send[1:] {
				errs[i] = jetstream.ErrNoStreamResponse
			}
			return nil
		}
		send = send[1:]
	}
	futures := make([]jetstream.PubAckFuture, len(send))
	for k, i := range send {
		f, err := l.js.PublishMsgAsync(msgs[i], jetstream.WithExpectStream(EventsStream), jetstream.WithRetryAttempts(0))
		if err != nil {
			return fmt.Errorf("append event %s: %w", evs[i].ID, classify(err))
		}
		futures[k] = f
	}
	timer := time.NewTimer(l.cfg.Timeout)
	defer timer.Stop()
	var expired <-chan time.Time
	if _, ok := ctx.Deadline(); !ok {
		expired = timer.C
	}
	for k, f := range futures {
		i := send[k]
		select {
		case pa := <-f.Ok():
			acks[i], errs[i] = Ack{ID: evs[i].ID, Seq: pa.Sequence, Duplicate: pa.Duplicate}, nil
		case err := <-f.Err():
			errs[i] = err
		case <-ctx.Done():
			return fmt.Errorf("append events: %w: %w", ErrLogUnavailable, ctx.Err())
		case <-expired:
			return fmt.Errorf("append events: %w: no ack within %s", ErrLogUnavailable, l.cfg.Timeout)
		}
		timer.Reset(l.cfg.Timeout)
	}
	return nil
}

// sessionTwice reports whether two of msgs[i], i in send, are on one
// subject (one session's).
func sessionTwice(msgs []*nats.Msg, send []int) bool {
	seen := make(map[string]struct{}, len(send))
	for _, i := range send {
		if _, ok := seen[msgs[i].Subject]; ok {
			return true
		}
		seen[msgs[i].Subject] = struct{}{}
	}
	return false
}

// MaxAtomicEvents is the most events one atomic or conditional Append
// stores as one atomic batch (nats-server's limit on an atomic publish
// batch).
const MaxAtomicEvents = 1000

// appendAtomic stores evs as one JetStream atomic batch (ADR-50,
// nats-server 2.12+): all of them or none, at consecutive sequences; when
// conditional, the first on the session's last sequence being expect (a
// conflict comes back as error 10164 on the commit).
func (l *Log) appendAtomic(ctx context.Context, evs []Event, msgs []*nats.Msg, conditional bool, expect uint64) ([]Ack, error) {
	if len(msgs) > MaxAtomicEvents {
		return nil, fmt.Errorf("append events: %w: an atomic append takes at most %d events, got %d", ErrInvalid, MaxAtomicEvents, len(msgs))
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("append events: %w: %w", ErrLogUnavailable, err)
	}
	// A commit that finds no stream listening ("no responders": a
	// replicated stream just created, or whose leader just moved, before
	// its interest reached the server this client is connected to) stored
	// nothing of the batch, which the stream drops uncommitted: the whole
	// batch is sent again, under a new batch id, as nats.go's own publish
	// sends a message again on "no responders" (jetstream.WithRetryAttempts),
	// for at most 10 tries over about 3.5 s (retryTransient).
	var acks []Ack
	err := retryTransient(ctx, noResponders, func() error {
		var err error
		acks, err = l.sendBatch(ctx, evs, msgs, conditional, expect)
		return err
	})
	if err != nil && !errors.Is(err, ErrLogUnavailable) && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		err = fmt.Errorf("append events: %w: %w", ErrLogUnavailable, err)
	}
	return acks, err
}

// sendBatch sends msgs as one atomic batch, the first conditional on
// expect when conditional, and reads the commit's reply (appendAtomic).
func (l *Log) sendBatch(ctx context.Context, evs []Event, msgs []*nats.Msg, conditional bool, expect uint64) ([]Ack, error) {
	nc := l.js.Conn()
	batch := nuid.Next()
	for i, m := range msgs {
		m.Header.Set(batchIDHeader, batch)
		m.Header.Set(batchSeqHeader, strconv.Itoa(i+1))
		m.Header.Set(jetstream.ExpectedStreamHeader, EventsStream)
		if i == 0 && conditional {
			m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(expect, 10))
		}
		if i < len(msgs)-1 {
			if err := nc.PublishMsg(m); err != nil {
				return nil, fmt.Errorf("append events: %w", classify(err))
			}
			continue
		}
		m.Header.Set(batchCommitHeader, "1")
		rctx, cancel := l.withTimeout(ctx)
		resp, err := nc.RequestMsgWithContext(rctx, m)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("append events: %w", classify(err))
		}
		var ack struct {
			Stream    string              `json:"stream"`
			Seq       uint64              `json:"seq"`
			Duplicate bool                `json:"duplicate"`
			Count     int                 `json:"count"`
			Error     *jetstream.APIError `json:"error"`
		}
		if err := unmarshal(resp.Data, &ack); err != nil {
			return nil, fmt.Errorf("append events: %w: bad ack %q", ErrLogUnavailable, resp.Data)
		}
		if ack.Error != nil {
			// A refusal of a batch that may be this call's own, stored
			// before (a resend after a lost reply): resend.go.
			return l.resendOrRefusal(ctx, evs, conditional, expect, ack.Error)
		}
		acks := make([]Ack, len(evs))
		for j := range evs {
			acks[j] = Ack{ID: evs[j].ID, Seq: ack.Seq - uint64(len(evs)-1-j)}
		}
		return acks, nil
	}
	return nil, nil
}

// Headers of JetStream's atomic batch publish (ADR-50).
const (
	batchIDHeader     = "Nats-Batch-Id"
	batchSeqHeader    = "Nats-Batch-Sequence"
	batchCommitHeader = "Nats-Batch-Commit"
)

// classify turns a publish error into the log's sentinels, keeping the
// original in the chain.
func classify(err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant:
			return fmt.Errorf("%w: %w", ErrConflict, err)
		case jetstream.JSErrCodeStreamMessageExceedsMaximum:
			return fmt.Errorf("%w: %w", ErrTooLarge, err)
		}
	}
	if errors.Is(err, nats.ErrMaxPayload) {
		return fmt.Errorf("%w: %w", ErrTooLarge, err)
	}
	return unavailable(err)
}

func unavailable(err error) error {
	if errors.Is(err, ErrLogUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrLogUnavailable, err)
}

// ReadOptions bound a read. The zero value reads everything stored when the
// read starts.
type ReadOptions struct {
	// FromSeq is the first stream sequence to deliver; 0 starts at the
	// beginning.
	FromSeq uint64
	// FromTime, when set and FromSeq is 0, starts at the first event stored
	// at or after it (JetStream's store time, not the event's own time).
	FromTime time.Time
	// UntilSeq, when set, is the last stream sequence to deliver.
	UntilSeq uint64
}

// LastID returns the stream sequence and the id (its Nats-Msg-Id) of the
// session's last event, or 0, "" and ErrSessionNotFound when it has none.
// Like LastSeq it includes every append acknowledged before the call, and
// fails with ErrLogUnavailable when no answer comes within ctx (or
// Config.Timeout).
func (l *Log) LastID(ctx context.Context, tenant, session string) (uint64, string, error) {
	seq, hdr, err := l.lastMessage(ctx, l.SessionSubject(tenant, session))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, "", fmt.Errorf("last event of %s/%s: %w", tenant, session, ErrSessionNotFound)
	}
	if err != nil {
		return 0, "", fmt.Errorf("last event of %s/%s: %w", tenant, session, unavailable(err))
	}
	return seq, hdr.Get(jetstream.MsgIDHeader), nil
}

// LastSeq returns the stream sequence of the session's last event, or 0 and
// ErrSessionNotFound when it has none. The answer includes every append
// acknowledged before the call (see lastMessage), so a conditional append
// on it fails only if the session moved on meanwhile. ErrLogUnavailable
// when no answer comes within ctx (or Config.Timeout): on a replicated
// stream the leader is asked again through an election, each try waiting
// up to a second, for at most 10 tries.
func (l *Log) LastSeq(ctx context.Context, tenant, session string) (uint64, error) {
	seq, _, err := l.lastMessage(ctx, l.SessionSubject(tenant, session))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, fmt.Errorf("last sequence of %s/%s: %w", tenant, session, ErrSessionNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("last sequence of %s/%s: %w", tenant, session, unavailable(err))
	}
	return seq, nil
}

// lastMessage returns the sequence and headers of the last message on
// subject, including every append acknowledged before the call. On a
// single replica that is a direct get. On a replicated stream it is a
// "get message" request ($JS.API.STREAM.MSG.GET.<stream>), which the
// stream's leader answers: any replica answers a direct get once it is
// nearly current, and a follower learns of a commit up to a raft
// heartbeat (1 s in nats-server) after the append was acknowledged.
// jetstream.ErrMsgNotFound when the subject has no message (JetStream
// error 10037). While the cluster elects a leader the request is retried
// (leaderUnavailable), within ctx: each try waits leaderTry for its answer,
// as the other replicas say nothing until they know the leader is gone.
func (l *Log) lastMessage(ctx context.Context, subject string) (uint64, nats.Header, error) {
	ctx, cancel := l.withTimeout(ctx)
	defer cancel()
	if !l.replicated() {
		msg, err := l.events.GetLastMsgForSubject(ctx, subject)
		if err != nil {
			return 0, nil, err
		}
		return msg.Sequence, msg.Header, nil
	}
	req, err := marshal(struct {
		LastBySubj string `json:"last_by_subj"`
	}{subject})
	if err != nil {
		return 0, nil, err
	}
	type getResponse struct {
		Error *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
		Message *struct {
			Seq  uint64 `json:"seq"`
			Hdrs []byte `json:"hdrs"` // base64 in the JSON
		} `json:"message"`
	}
	var r getResponse
	err = retryTransient(ctx, leaderUnavailable, func() error {
		tctx, cancel := context.WithTimeout(ctx, leaderTry)
		defer cancel()
		resp, err := l.js.Conn().RequestWithContext(tctx, "$JS.API.STREAM.MSG.GET."+EventsStream, req)
		if err != nil && ctx.Err() == nil && tctx.Err() != nil {
			return fmt.Errorf("%w within %s", errNoAnswer, leaderTry)
		}
		if err != nil {
			return err
		}
		r = getResponse{}
		if err := unmarshal(resp.Data, &r); err != nil {
			return fmt.Errorf("get last message: %w", err)
		}
		switch {
		case r.Error != nil && r.Error.ErrCode == int(jetstream.JSErrCodeMessageNotFound):
			return jetstream.ErrMsgNotFound
		case r.Error != nil:
			return &jetstream.APIError{Code: r.Error.Code, ErrorCode: jetstream.ErrorCode(r.Error.ErrCode), Description: r.Error.Description}
		case r.Message == nil:
			return errors.New("get last message: a reply with no message")
		}
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	var hdr nats.Header
	if len(r.Message.Hdrs) > 0 {
		if hdr, err = nats.DecodeHeadersMsg(r.Message.Hdrs); err != nil {
			return 0, nil, fmt.Errorf("get last message: headers: %w", err)
		}
	}
	return r.Message.Seq, hdr, nil
}

// leaderTry bounds each try of a request that only a stream's leader
// answers. A leader that was killed answers nothing, and the other
// replicas say nothing either until their election timer tells them it is
// gone (4 to 9 s in nats-server): the request is sent again after
// leaderTry rather than waiting out the whole read's context.
const leaderTry = time.Second

// FirstSeq returns the stream sequence of the session's first event, or 0
// and ErrSessionNotFound when it has none. It costs one direct get (the
// first message on the session's subject from sequence 1).
func (l *Log) FirstSeq(ctx context.Context, tenant, session string) (uint64, error) {
	ctx, cancel := l.withTimeout(ctx)
	defer cancel()
	msg, err := l.events.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(l.SessionSubject(tenant, session)))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, fmt.Errorf("first sequence of %s/%s: %w", tenant, session, ErrSessionNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("first sequence of %s/%s: %w", tenant, session, unavailable(err))
	}
	return msg.Sequence, nil
}

// ReadSession calls fn with each event of the session, in stream order,
// from opts.FromSeq (or opts.FromTime) to the event that was last when the
// read started (or opts.UntilSeq). An event whose body is malformed or
// breaks the contract is delivered with Err set (see Event), so the reader
// can report it and go on. ReadSession returns fn's first error, or
// ErrSessionNotFound when the session has no event, or ErrLogUnavailable.
// The context bounds the whole read; with no deadline each wait for the
// next batch is bounded by Config.Timeout.
//
// The events come by direct gets, which on a replicated stream any
// replica answers, and a follower learns of a commit up to a raft
// heartbeat (1 s in nats-server) after the append was acknowledged. So
// there, without UntilSeq or FromTime, the stream's leader first says
// which event is last (LastSeq), and the read goes on until it has
// delivered it: again from where it ended, replicaWait apart, up to
// replicaTries times, then ErrLogUnavailable. The read then includes
// every append acknowledged before it started.
func (l *Log) ReadSession(ctx context.Context, tenant, session string, opts ReadOptions, fn func(Event) error) error {
	if !l.replicated() || opts.UntilSeq != 0 || !opts.FromTime.IsZero() {
		return l.readSession(ctx, tenant, session, opts, fn)
	}
	last, err := l.LastSeq(ctx, tenant, session)
	if err != nil {
		return fmt.Errorf("read session: %w", err)
	}
	if opts.FromSeq > last {
		return nil
	}
	opts.UntilSeq = last
	var got uint64
	read := func(ev Event) error {
		got = ev.Seq
		return fn(ev)
	}
	for try := 0; ; try++ {
		err := l.readSession(ctx, tenant, session, opts, read)
		if err != nil && !errors.Is(err, ErrSessionNotFound) {
			return err
		}
		if got >= last {
			return nil
		}
		if try == replicaTries {
			if _, err := l.LastSeq(ctx, tenant, session); errors.Is(err, ErrSessionNotFound) {
				return fmt.Errorf("read session: %w", err) // erased meanwhile
			}
			return fmt.Errorf("read session %s/%s: %w: the replica that answered holds up to seq %d, the leader seq %d", tenant, session, ErrLogUnavailable, got, last)
		}
		if got > 0 {
			opts.FromSeq = got + 1
		}
		t := time.NewTimer(replicaWait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// replicaTries is how many more times ReadSession reads on when a
// replica answered short of the leader's last event, replicaWait apart:
// 6 × 300 ms spans nats-server's raft heartbeat (1 s), after which a
// follower knows every commit before it.
const (
	replicaTries = 6
	replicaWait  = 300 * time.Millisecond
)

// replicated reports whether the events stream has more than one replica,
// as the stream's info said when it was last read (unknown counts as
// replicated). The info is read again in the background once it is
// replicasRecheck old, so that a stream scaled from one replica to three
// under a running process (engine setup --replicas 3) is read the
// replicated way (from its leader) within about that long, not only after
// a restart.
func (l *Log) replicated() bool {
	info := l.events.CachedInfo()
	l.recheckReplicas()
	return info == nil || info.Config.Replicas > 1
}

// replicasRecheck is how old the events stream's info may grow before
// replicated reads it again.
const replicasRecheck = 30 * time.Second

// recheckReplicas reads the events stream's info again, in the background
// and one read at a time, when it is replicasRecheck old. jetstream's
// Stream.Info refreshes the CachedInfo that replicated reads. A read that
// fails is tried again replicasRecheck later.
func (l *Log) recheckReplicas() {
	at := l.infoAt.Load()
	if at == 0 || time.Since(time.Unix(0, at)) < replicasRecheck || !l.infoBusy.CompareAndSwap(false, true) {
		return
	}
	l.infoAt.Store(time.Now().UnixNano())
	go func() {
		defer l.infoBusy.Store(false)
		ctx, cancel := l.withTimeout(context.Background())
		defer cancel()
		_, _ = l.events.Info(ctx)
	}()
}

// readSession is ReadSession from the replica that answers.
func (l *Log) readSession(ctx context.Context, tenant, session string, opts ReadOptions, fn func(Event) error) error {
	err := l.readDirect(ctx, l.SessionSubject(tenant, session), opts, fn)
	if errors.Is(err, errDirectNone) {
		// Nothing from the start point: a session with no event at all is
		// not found; one with events before it is read to its end.
		if opts.FromSeq <= 1 && opts.FromTime.IsZero() {
			return fmt.Errorf("read session: %s/%s: %w", tenant, session, ErrSessionNotFound)
		}
		if _, err := l.LastSeq(ctx, tenant, session); err != nil {
			return fmt.Errorf("read session: %w", err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("read session %s/%s: %w", tenant, session, err)
	}
	return nil
}

// ReadAll calls fn with every event of every session in stream order,
// within opts, up to the last event stored when the read started. Events are
// delivered as by ReadSession. It reads through an ordered consumer (the
// server pushes the events; no request per batch), created for the read
// and gone after it. Errors: fn's error, returned as it is (wrapped) and
// ending the read; ErrLogUnavailable when the stream does not answer
// (within ctx, or Config.Timeout for its first request); ctx's.
func (l *Log) ReadAll(ctx context.Context, opts ReadOptions, fn func(Event) error) error {
	ictx, cancel := l.withTimeout(ctx)
	info, err := l.events.Info(ictx)
	cancel()
	if err != nil {
		return fmt.Errorf("read log: %w", unavailable(err))
	}
	last := info.State.LastSeq
	if opts.UntilSeq != 0 && opts.UntilSeq < last {
		last = opts.UntilSeq
	}
	if info.State.Msgs == 0 || last < max(opts.FromSeq, info.State.FirstSeq) {
		return nil
	}
	if err := l.readOrdered(ctx, orderedConfig(EventSubjectPrefix+".>", opts.FromSeq, opts.FromTime), last, fn); err != nil {
		return fmt.Errorf("read log: %w", err)
	}
	return nil
}

// DecodeStored turns a message stored at stream sequence seq under subject
// into an Event, for consumers of AGENT_EVENTS of their own. It sets Err (an
// *EventError) when the body is malformed, breaks the contract, or names
// another session than its subject. Tenant and Session always come from
// the subject (the stored subject is the truth; a body that names another
// session is an invalid event of the subject's session). Set Stored from
// the message's store time (DecodeStoredAt does).
func DecodeStored(subject string, seq uint64, body []byte) Event {
	return DecodeStoredAt(subject, seq, time.Time{}, body)
}

// DecodeStoredAt is DecodeStored with the message's store time (JetStream
// metadata Timestamp, or the Nats-Time-Stamp header of a direct get).
func DecodeStoredAt(subject string, seq uint64, stored time.Time, body []byte) Event {
	tenant, session := subjectTokens(subject)
	if ev, ok := decodeValid(body, tenant, session); ok && ev.Tenant == tenant && ev.Session == session {
		ev.Seq, ev.Subject, ev.Stored, ev.Raw = seq, subject, stored, body
		return ev
	}
	ev, err := Decode(body)
	if err == nil {
		err = Validate(&ev)
	}
	if err == nil && (ev.Tenant != tenant || ev.Session != session) {
		err = fmt.Errorf("%w: body names %s/%s, stored under subject %s", ErrInvalid, ev.Tenant, ev.Session, subject)
	}
	if err != nil {
		if ev.Data == nil {
			ev.Data = append([]byte(nil), body...)
		}
		ev.Err = &EventError{Tenant: tenant, Session: session, Seq: seq, ID: ev.ID, Err: err}
	}
	if tenant != "" || session != "" {
		ev.Tenant, ev.Session = tenant, session
	}
	ev.Seq, ev.Subject, ev.Stored, ev.Raw = seq, subject, stored, body
	return ev
}

// subjectTokens returns tenant and session of a stored subject
// agent.evt.<partition>.<tenant>.<session>.
func subjectTokens(subject string) (tenant, session string) {
	rest := subject
	var parts [5]string
	for i := range parts {
		tok, after, more := strings.Cut(rest, ".")
		if more == (i == len(parts)-1) {
			return "", ""
		}
		parts[i], rest = tok, after
	}
	return parts[3], parts[4]
}

// SessionRef names one session stored in the log and its event count.
type SessionRef struct {
	Tenant    string
	Session   string
	Partition int
	Events    uint64
}

// BadSubject is a subject of the event stream that names no valid session
// (see ParseStoredSubject): Events events are stored under it, Reason says
// what is wrong, and Tenant and Session are the tokens where a session's
// would be, as far as the subject has them. No reader can fold them as a
// session; the CLI lists them so that they are never invisible.
type BadSubject struct {
	Subject string
	Tenant  string
	Session string
	Events  uint64
	Reason  string
}

// Sessions lists the sessions in the log, optionally of one tenant (empty:
// all), sorted by tenant then session. It asks the stream for its subjects,
// so it costs one request per page of subjects, not a read of the log.
// Subjects that name no valid session are left out (SessionsChecked lists
// them). A tenant that is not a valid token (ValidToken) is an error.
func (l *Log) Sessions(ctx context.Context, tenant string) ([]SessionRef, error) {
	refs, _, err := l.SessionsChecked(ctx, tenant)
	return refs, err
}

// PartitionSessions lists the sessions stored in partition partition, in
// no order, with their event counts (subjects that name no valid session
// left out). Like Sessions it asks the stream for its subjects. A
// partition outside [0, Partitions()) is an error; ErrLogUnavailable when
// the stream does not answer within ctx or Config.Timeout.
func (l *Log) PartitionSessions(ctx context.Context, partition int) ([]SessionRef, error) {
	if partition < 0 || partition >= l.Partitions() {
		return nil, fmt.Errorf("list sessions: partition %d: the stream has %d", partition, l.Partitions())
	}
	ctx, cancel := l.withTimeout(ctx)
	defer cancel()
	info, err := l.events.Info(ctx, jetstream.WithSubjectFilter(StoredEventSubject(partition, "*", "*")))
	if err != nil {
		return nil, fmt.Errorf("list sessions of partition %d: %w", partition, unavailable(err))
	}
	refs := make([]SessionRef, 0, len(info.State.Subjects))
	for subj, n := range info.State.Subjects {
		if p, t, s, ok, _ := ParseStoredSubject(subj); ok && p == partition {
			refs = append(refs, SessionRef{Tenant: t, Session: s, Partition: p, Events: n})
		}
	}
	return refs, nil
}

// SessionsChecked is Sessions that also returns the subjects holding
// events that name no valid session (BadSubject, sorted by subject): with
// tenant set, those that name the tenant where a session's tenant (or
// that of the publish form, agent.evt.<tenant>.<session>) would be.
func (l *Log) SessionsChecked(ctx context.Context, tenant string) ([]SessionRef, []BadSubject, error) {
	if tenant != "" && !ValidToken(tenant) {
		return nil, nil, fmt.Errorf("list sessions: tenant %q is not 1-%d characters of [A-Za-z0-9_-]", tenant, MaxTokenLen)
	}
	ctx, cancel := l.withTimeout(ctx)
	defer cancel()
	filters := []string{EventSubjectPrefix + ".>"}
	if tenant != "" {
		filters = []string{EventSubjectPrefix + ".*." + tenant + ".>", EventSubjectPrefix + "." + tenant + ".>"}
	}
	subjects := map[string]uint64{}
	for _, f := range filters {
		info, err := l.events.Info(ctx, jetstream.WithSubjectFilter(f))
		if err != nil {
			return nil, nil, fmt.Errorf("list sessions: %w", unavailable(err))
		}
		for subj, n := range info.State.Subjects {
			subjects[subj] = n
		}
	}
	refs := make([]SessionRef, 0, len(subjects))
	var bad []BadSubject
	for subj, n := range subjects {
		p, t, s, ok, why := ParseStoredSubject(subj)
		if ok && p >= l.Partitions() {
			ok, why = false, fmt.Sprintf("partition %d is not below the stream's %d partitions", p, l.Partitions())
		}
		switch {
		case ok && (tenant == "" || t == tenant):
			refs = append(refs, SessionRef{Tenant: t, Session: s, Partition: p, Events: n})
		case !ok && (tenant == "" || t == tenant):
			bad = append(bad, BadSubject{Subject: subj, Tenant: t, Session: s, Events: n, Reason: why})
		}
	}
	sort.Slice(refs, func(i, j int) bool {
		if refs[i].Tenant != refs[j].Tenant {
			return refs[i].Tenant < refs[j].Tenant
		}
		return refs[i].Session < refs[j].Session
	})
	sort.Slice(bad, func(i, j int) bool { return bad[i].Subject < bad[j].Subject })
	return refs, bad, nil
}
