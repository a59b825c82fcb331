package recovery

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
)

// Names of the recovery side on JetStream.
const (
	// Stream holds every recovery command.
	Stream = "AGENT_RECOVERY"
	// CommandSubjectPrefix starts the subject commands are published to:
	// agent.cmd.<tenant>.<session>; they are stored as
	// agent.cmd.<partition>.<tenant>.<session>.
	CommandSubjectPrefix = "agent.cmd"
	// PriorityGroup is the priority group the workers pull in; the
	// consumers pin each partition to one of its members.
	PriorityGroup = "workers"
	// StatusBucket is the key-value bucket of command statuses (key: the
	// command id), which `engine recovery list` reads.
	StatusBucket = "turnstone_commands"
	// CommandMaxAge is how long the stream keeps a command.
	CommandMaxAge = 30 * 24 * time.Hour
)

// CommandSubject is the subject a command for the session is published to.
func CommandSubject(tenant, session string) string {
	return CommandSubjectPrefix + "." + tenant + "." + session
}

// ConsumerName is the durable consumer of partition p: "recovery-p<p>".
func ConsumerName(p int) string { return "recovery-p" + strconv.Itoa(p) }

// StreamConfig is the AGENT_RECOVERY stream for partitions partitions and
// replicas replicas: agent.cmd.*.* stored as
// agent.cmd.{{partition(P,1,2)}}.<tenant>.<session> (the same hash as the
// events, so a session's commands and events share a partition number),
// file storage, 5-minute duplicate window (command ids are deterministic, so
// a repeated detection is stored once), commands kept CommandMaxAge.
func StreamConfig(partitions, replicas int) jetstream.StreamConfig {
	if replicas < 1 {
		replicas = 1
	}
	return jetstream.StreamConfig{
		Name:        Stream,
		Description: "Turnstone recovery commands, partitioned by session",
		Subjects:    []string{CommandSubjectPrefix + ".*.*"},
		SubjectTransform: &jetstream.SubjectTransformConfig{
			Source:      CommandSubjectPrefix + ".*.*",
			Destination: fmt.Sprintf("%s.{{partition(%d,1,2)}}.{{wildcard(1)}}.{{wildcard(2)}}", CommandSubjectPrefix, partitions),
		},
		Retention: jetstream.LimitsPolicy,
		MaxAge:    CommandMaxAge,
		// -1: unlimited, as the server stores an unset limit.
		MaxBytes:          -1,
		MaxMsgs:           -1,
		MaxMsgSize:        -1,
		MaxMsgsPerSubject: -1,
		Storage:           jetstream.FileStorage,
		Replicas:          replicas,
		Duplicates:        events.DefaultDuplicateWindow,
		AllowDirect:       true,
	}
}

// DeliveryConfig sets how the partition consumers deliver. These are the
// settings an operator chooses (`engine setup --ack-wait --max-deliver
// --pinned-ttl`); Setup is their only writer. A zero field means "not
// given": Setup keeps the consumers' value (the default for a consumer it
// creates), and Check accepts whatever they hold.
type DeliveryConfig struct {
	// AckWait is how long a worker may hold a command without acking or
	// signalling progress before it is redelivered. Workers signal
	// progress while a command runs, so this bounds how long a dead
	// worker's command waits. Default 10 seconds.
	AckWait time.Duration
	// MaxDeliver is how many times a command is delivered before it is
	// parked. Default 5.
	MaxDeliver int
	// PinnedTTL is how long a partition stays pinned to a worker that
	// stopped pulling before NATS pins another. Default 10 seconds.
	PinnedTTL time.Duration
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c DeliveryConfig) WithDefaults() DeliveryConfig {
	c.setDefaults()
	return c
}

func (c *DeliveryConfig) setDefaults() {
	if c.AckWait == 0 {
		c.AckWait = 10 * time.Second
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = 5
	}
	if c.PinnedTTL == 0 {
		c.PinnedTTL = 10 * time.Second
	}
}

// Validate reports every out-of-range field, joined.
func (c *DeliveryConfig) Validate() error {
	var errs []error
	if c.AckWait < 0 {
		errs = append(errs, fmt.Errorf("ack wait: must not be negative, got %s", c.AckWait))
	}
	if c.MaxDeliver < 0 {
		errs = append(errs, fmt.Errorf("max deliver: must not be negative, got %d", c.MaxDeliver))
	}
	if c.PinnedTTL < 0 {
		errs = append(errs, fmt.Errorf("pinned ttl: must not be negative, got %s", c.PinnedTTL))
	}
	return errors.Join(errs...)
}

// ConsumerConfig is the durable pull consumer of partition p: explicit
// ack, MaxAckPending 1 (one command of the partition at a time, so a
// session's commands run one by one and in order), and the pinned_client
// priority policy on PriorityGroup (NATS delivers the partition to one
// worker and moves it when that worker stops pulling; ADR-42).
func ConsumerConfig(p int, c DeliveryConfig) jetstream.ConsumerConfig {
	c.setDefaults()
	return jetstream.ConsumerConfig{
		Durable:        ConsumerName(p),
		Description:    fmt.Sprintf("Turnstone recovery commands of partition %d", p),
		FilterSubject:  fmt.Sprintf("%s.%d.>", CommandSubjectPrefix, p),
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        c.AckWait,
		MaxDeliver:     c.MaxDeliver,
		MaxAckPending:  1,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PriorityGroups: []string{PriorityGroup},
		PinnedTTL:      c.PinnedTTL,
	}
}

// Issue publishes a command to agent.cmd.<tenant>.<session> with its id as
// Nats-Msg-Id, its free text masked (Command.Masked), and returns the stream sequence it is stored at and whether
// JetStream dropped it as a duplicate of the same command issued within
// the duplicate window. Errors: ErrInvalidCommand (nothing sent);
// events.ErrTooLarge when its body is over MaxCommandBytes (nothing sent)
// or the server refuses its size; events.ErrLogUnavailable when JetStream
// does not answer; a JetStream API error as it is. Refused tells the
// refusals from the rest.
func Issue(ctx context.Context, js jetstream.JetStream, cmd Command) (seq uint64, duplicate bool, err error) {
	if err := cmd.Validate(); err != nil {
		return 0, false, fmt.Errorf("issue command: %w", err)
	}
	cmd = cmd.Masked()
	body, err := json.Marshal(cmd, json.Deterministic(true))
	if err != nil {
		return 0, false, fmt.Errorf("issue command %s: %w", cmd.ID, err)
	}
	if len(body) > MaxCommandBytes {
		return 0, false, fmt.Errorf("issue command %s: %w: %d bytes encoded, the limit is %d", cmd.ID, events.ErrTooLarge, len(body), MaxCommandBytes)
	}
	ack, err := js.Publish(ctx, CommandSubject(cmd.Tenant, cmd.Session), body,
		jetstream.WithMsgID(cmd.ID), jetstream.WithExpectStream(Stream))
	if err != nil {
		return 0, false, fmt.Errorf("issue command %s: %w", cmd.ID, publishError(err))
	}
	return ack.Sequence, ack.Duplicate, nil
}

// FindCommand returns the command with id among the session's commands in
// AGENT_RECOVERY (a few messages: one direct get per command of the
// session). ErrCommandNotFound when it is not there (or its record has
// gone past CommandMaxAge).
func FindCommand(ctx context.Context, js jetstream.JetStream, tenant, session, id string) (Command, error) {
	st, err := js.Stream(ctx, Stream)
	if err != nil {
		return Command{}, fmt.Errorf("find command %s: %w", id, err)
	}
	subject := CommandSubjectPrefix + ".*." + tenant + "." + session
	for seq := uint64(1); ; {
		msg, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return Command{}, fmt.Errorf("find command %s: %w", id, ErrCommandNotFound)
		}
		if err != nil {
			return Command{}, fmt.Errorf("find command %s: %w", id, err)
		}
		var c Command
		if json.Unmarshal(msg.Data, &c) == nil && c.ID == id {
			return c, nil
		}
		seq = msg.Sequence + 1
	}
}

// SessionCommands returns the commands stored for a session in
// AGENT_RECOVERY, in the order they were stored (one direct get per
// command; those gone past CommandMaxAge are not there). It writes
// nothing. A session with no command gives none and no error; the
// server's errors are returned, naming the session.
func SessionCommands(ctx context.Context, js jetstream.JetStream, tenant, session string) ([]Command, error) {
	st, err := js.Stream(ctx, Stream)
	if err != nil {
		return nil, fmt.Errorf("commands of %s/%s: %w", tenant, session, err)
	}
	subject := CommandSubjectPrefix + ".*." + tenant + "." + session
	var out []Command
	for seq := uint64(1); ; {
		msg, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("commands of %s/%s: %w", tenant, session, err)
		}
		var c Command
		if json.Unmarshal(msg.Data, &c) == nil {
			out = append(out, c)
		}
		seq = msg.Sequence + 1
	}
}

// Status is what the status bucket holds for a command: its State (one of
// States; StatePending is never stored), Outcome once completed,
// Attempts so far, the Worker that last ran it, Reason (for parked and
// skipped commands), the stream sequence of the command (Seq) and when the
// status last changed.
type Status struct {
	ID        string         `json:"id"`
	Kind      Kind           `json:"kind"`
	Tenant    string         `json:"tenant"`
	Session   string         `json:"session"`
	Seq       uint64         `json:"seq"`
	State     State          `json:"state"`
	Outcome   events.Outcome `json:"outcome,omitempty"`
	Attempts  int            `json:"attempts,omitzero"`
	Worker    string         `json:"worker,omitempty"`
	Reason    string         `json:"reason,omitempty"`
	UpdatedAt time.Time      `json:"updated_at"`
}

// State is where a recovery command is: one of States.
type State string

// The command states. Workers store all but StatePending in the status
// bucket; a command the bucket holds nothing for is pending.
const (
	// StatePending: issued, and no worker has reported on it yet.
	StatePending State = "pending"
	// StateRunning: a worker is executing it.
	StateRunning State = "running"
	// StateCompleted: it has an outcome (Status.Outcome).
	StateCompleted State = "completed"
	// StateParked: it was set aside after its last delivery failed, or
	// because its session is paused (Status.Reason says why).
	StateParked State = "parked"
	// StateSkipped: it was not run (Status.Reason says why).
	StateSkipped State = "skipped"
)

// States lists every State, in the order a command goes through them.
var States = []State{StatePending, StateRunning, StateCompleted, StateParked, StateSkipped}

// Valid reports whether s is one of States.
func (s State) Valid() bool {
	for _, x := range States {
		if s == x {
			return true
		}
	}
	return false
}

// WorkerGroup is the name of the workers' partition group (the members
// bucket's group, and the prefix of each worker's member name): workers
// share AGENT_RECOVERY's partitions in it.
const WorkerGroup = "workers"
