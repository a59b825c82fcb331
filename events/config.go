package events

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Defaults of Config.
const (
	DefaultPartitions          = 8
	DefaultDuplicateWindow     = 5 * time.Minute
	DefaultMaxEventBytes       = 1 << 20
	DefaultSnapshotsPerSession = 3
	DefaultTimeout             = 5 * time.Second
)

// Config configures a Log. The zero value is usable: every unset field takes
// its default (see setDefaults).
type Config struct {
	// Partitions is the number of partitions of the subject transform
	// agent.evt.*.* -> agent.evt.{{partition(P,1,2)}}.{{wildcard(1)}}.{{wildcard(2)}}.
	// It is fixed when the stream is created: 0 adopts the existing
	// stream's count (DefaultPartitions for a new stream); another value
	// that differs from the existing stream's is an error, since moving a
	// session to another partition would split its subject in two.
	Partitions int
	// Replicas is the stream replica count (1, or 3 on a cluster).
	// Default 1.
	Replicas int
	// Storage is file (the default) or memory storage.
	Storage jetstream.StorageType
	// DuplicateWindow is how long JetStream remembers a Nats-Msg-Id to drop a
	// repeated publish. Default 5 minutes.
	DuplicateWindow time.Duration
	// MaxEventBytes bounds one encoded event, in bytes; larger events are
	// refused with ErrTooLarge before they are sent. Default 1 MiB (the NATS
	// server's default max_payload).
	MaxEventBytes int
	// MaxBytes bounds the events stream, in bytes; 0 is unlimited. When the
	// stream is full new appends fail (discard new): the log never drops
	// old events to make room.
	MaxBytes int64
	// SnapshotsPerSession is how many snapshots AGENT_SNAPSHOTS keeps per
	// session. Default 3.
	SnapshotsPerSession int64
	// Timeout bounds each call that does I/O when the caller's context has
	// no deadline. Default 5 seconds.
	Timeout time.Duration
	// UpdateStreams lets Open change the settings of existing streams
	// that this config sets and that differ from theirs (Replicas,
	// MaxBytes, MaxEventBytes, DuplicateWindow, SnapshotsPerSession).
	// Without it such a difference is an error (ErrSettingsDiffer): a
	// setting is never changed by a flag's default, or by accident.
	// Settings the config leaves unset always keep the stream's.
	UpdateStreams bool
	// UseExisting makes Open create and update nothing: the streams must
	// exist (an operator made them: engine setup). For processes whose
	// NATS permissions do not allow stream changes.
	UseExisting bool
}

func (c *Config) setDefaults() {
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = DefaultDuplicateWindow
	}
	if c.MaxEventBytes == 0 {
		c.MaxEventBytes = DefaultMaxEventBytes
	}
	if c.SnapshotsPerSession == 0 {
		c.SnapshotsPerSession = DefaultSnapshotsPerSession
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
}

// Validate reports every field that is out of range, joined.
func (c *Config) Validate() error {
	var errs []error
	if c.Partitions < 0 || c.Partitions > 1024 {
		errs = append(errs, fmt.Errorf("partitions: must be 0 (default) to 1024, got %d", c.Partitions))
	}
	if c.Replicas < 0 || c.Replicas > 5 {
		errs = append(errs, fmt.Errorf("replicas: must be 1 to 5, got %d", c.Replicas))
	}
	if c.DuplicateWindow < 0 {
		errs = append(errs, fmt.Errorf("duplicate window: must not be negative, got %s", c.DuplicateWindow))
	}
	if c.MaxEventBytes < 0 {
		errs = append(errs, fmt.Errorf("max event bytes: must not be negative, got %d", c.MaxEventBytes))
	}
	if c.MaxBytes < 0 {
		errs = append(errs, fmt.Errorf("max bytes: must not be negative, got %d", c.MaxBytes))
	}
	if c.SnapshotsPerSession < 0 {
		errs = append(errs, fmt.Errorf("snapshots per session: must not be negative, got %d", c.SnapshotsPerSession))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("timeout: must not be negative, got %s", c.Timeout))
	}
	return errors.Join(errs...)
}

// PartitionsMetadata is the AGENT_EVENTS metadata key that holds the
// stream's partition count.
const PartitionsMetadata = "turnstone_partitions"

// MaxEventBytesMetadata is the AGENT_EVENTS metadata key that holds the
// largest event body the log accepts (Config.MaxEventBytes): the
// stream's max_msg_size is that plus HeaderAllowance.
const MaxEventBytesMetadata = "turnstone_max_event_bytes"

// HeaderAllowance is what the stream's max_msg_size allows on top of
// Config.MaxEventBytes for the headers of a stored event (Nats-Msg-Id,
// and an atomic batch's id, sequence, commit and expectations):
// JetStream counts headers against max_msg_size, and the documented
// limit is the body's (docs/events.md).
const HeaderAllowance = 4 << 10

// StoredSubjects are the subjects AGENT_EVENTS captures: one per
// partition, agent.evt.<p>.*.* for p in 0..partitions-1, so that nothing
// but a session's stored subject (a partition number, a tenant, a
// session) can be stored.
func StoredSubjects(partitions int) []string {
	out := make([]string, partitions)
	for p := range out {
		out[p] = fmt.Sprintf("%s.%d.*.*", EventSubjectPrefix, p)
	}
	return out
}

// EventsStreamConfig is the AGENT_EVENTS stream as wire contract version 1
// defines it, for partitions partitions: file storage, subjects
// agent.evt.<partition>.<tenant>.<session> for each partition (the stored form, which only
// Turnstone's processes publish: publishers send to
// agent.evt.<tenant>.<session>, which the engine that owns the partition
// answers; see docs/events.md), the partition count in the metadata,
// message delete denied, discard new when full, direct get and atomic
// batch publish allowed. Purge is not denied in the stream (deny_purge can
// never be undone, error 10052), so that an operator can erase a session;
// NATS permissions deny it to everyone else (docs/security.md).
func EventsStreamConfig(c Config, partitions int) jetstream.StreamConfig {
	c.setDefaults()
	return jetstream.StreamConfig{
		Name:        EventsStream,
		Description: "Turnstone agent events (wire contract v1), one subject per session",
		Subjects:    StoredSubjects(partitions),
		Metadata:    map[string]string{PartitionsMetadata: fmt.Sprint(partitions), MaxEventBytesMetadata: fmt.Sprint(c.MaxEventBytes)},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardNew,
		MaxBytes:    orUnlimited(c.MaxBytes),
		MaxMsgs:     -1,
		MaxAge:      0,
		MaxMsgSize:  int32(c.MaxEventBytes + HeaderAllowance),
		Storage:     c.Storage,
		Replicas:    c.Replicas,
		Duplicates:  c.DuplicateWindow,
		DenyDelete:  true,
		AllowDirect: true,
		// Atomic and conditional appends are atomic batches (see Atomic,
		// ExpectLastSeq).
		AllowAtomicPublish: true,
	}
}

// SnapshotsStreamConfig is the AGENT_SNAPSHOTS stream: subjects
// agent.snap.<tenant>.<session>, the last SnapshotsPerSession kept per
// subject, direct get allowed.
func SnapshotsStreamConfig(c Config) jetstream.StreamConfig {
	c.setDefaults()
	return jetstream.StreamConfig{
		Name:              SnapshotsStream,
		Description:       "Turnstone projection snapshots, the last few per session",
		Subjects:          []string{SnapshotSubjectPrefix + ".*.*"},
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardOld,
		MaxMsgsPerSubject: c.SnapshotsPerSession,
		MaxMsgs:           -1,
		MaxBytes:          -1,
		Storage:           c.Storage,
		Replicas:          c.Replicas,
		AllowDirect:       true,
	}
}

func orUnlimited(n int64) int64 {
	if n == 0 {
		return -1
	}
	return n
}

// ProbeBucket is the key-value bucket each engine's reconciler writes to
// once a tick to learn that JetStream can still store (file storage, one
// small value); while it cannot, the engine fails closed and issues no
// command (docs/policy.md).
const ProbeBucket = "turnstone_probe"
