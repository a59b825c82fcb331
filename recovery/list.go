package recovery

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
)

// Entry is a stored command with its status, as `engine recovery list
// --json` prints it (docs/cli.md): Seq is its AGENT_RECOVERY sequence;
// Status.State is StatePending while no worker has reported on it. A
// stored body that is not a valid command keeps its tenant and session
// (from its subject) and says why in Invalid, as does a command whose
// stored status cannot be read.
type Entry struct {
	Command Command `json:"command"`
	Seq     uint64  `json:"seq"`
	Status  Status  `json:"status"`
	Invalid string  `json:"invalid,omitempty"`
}

// DecodeCommand decodes a stored or published command body strictly (the
// go-json-experiment defaults of the wire contract: no duplicate names,
// names matched case-sensitively, valid UTF-8, one value) and checks it
// (Command.Validate). Errors wrap ErrInvalidCommand.
func DecodeCommand(body []byte) (Command, error) {
	var c Command
	if err := json.Unmarshal(body, &c); err != nil {
		return c, fmt.Errorf("%w: %v", ErrInvalidCommand, err)
	}
	if err := c.Validate(); err != nil {
		return c, err
	}
	return c, nil
}

// List reads every command stored in AGENT_RECOVERY, in stream order, and
// joins each with its status in the status bucket. It writes nothing.
// Errors: ErrNotSetUp (wrapped) when the stream or the bucket does not
// exist; JetStream's as they are.
func List(ctx context.Context, js jetstream.JetStream) ([]Entry, error) {
	st, err := js.Stream(ctx, Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("list commands: %w: stream %s does not exist (engine setup creates it)", ErrNotSetUp, Stream)
	}
	if err != nil {
		return nil, fmt.Errorf("list commands: %w", err)
	}
	kv, err := js.KeyValue(ctx, StatusBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("list commands: %w: bucket %s does not exist (engine setup creates it)", ErrNotSetUp, StatusBucket)
	}
	if err != nil {
		return nil, fmt.Errorf("list commands: %w", err)
	}
	var out []Entry
	if st.CachedInfo().State.Msgs > 0 {
		// events.ReadStream fetches in batches: an ordered consumer's Next
		// fails on an R3 stream after a few messages (issue 9).
		err := events.ReadStream(ctx, st, jetstream.OrderedConsumerConfig{}, 1000, func(msg jetstream.Msg) error {
			meta, err := msg.Metadata()
			if err != nil {
				return err
			}
			e := Entry{Seq: meta.Sequence.Stream, Status: Status{State: StatePending}}
			if e.Command, err = DecodeCommand(msg.Data()); err == nil {
				// Pending until a worker reports: the command's identity,
				// as of its issue.
				c := e.Command
				e.Status = Status{ID: c.ID, Kind: c.Kind, Tenant: c.Tenant, Session: c.Session, Seq: e.Seq, State: StatePending, UpdatedAt: c.IssuedAt}
			} else {
				e.Invalid = err.Error()
				// agent.cmd.<partition>.<tenant>.<session>
				if toks := strings.Split(msg.Subject(), "."); len(toks) == 5 {
					e.Command.Tenant, e.Command.Session = toks[3], toks[4]
				}
			}
			out = append(out, e)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("list commands: %w", err)
		}
	}
	for i := range out {
		if out[i].Command.ID == "" {
			continue
		}
		kve, err := kv.Get(ctx, out[i].Command.ID)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list commands: status of %s: %w", out[i].Command.ID, err)
		}
		var s Status
		if err := json.Unmarshal(kve.Value(), &s); err != nil {
			// Kept, with the reason: one bad value hides no other command.
			out[i].Invalid = fmt.Sprintf("status unreadable (bucket %s, revision %d): %v", StatusBucket, kve.Revision(), err)
			continue
		}
		out[i].Status = s
	}
	return out, nil
}

// CheckSetUp reports whether AGENT_RECOVERY and the status bucket exist
// (ErrNotSetUp, wrapped, when not), writing nothing: what a process that
// issues or reads commands checks instead of creating them.
func CheckSetUp(ctx context.Context, js jetstream.JetStream) error {
	if _, err := js.Stream(ctx, Stream); errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("%w: stream %s does not exist (engine setup creates it)", ErrNotSetUp, Stream)
	} else if err != nil {
		return fmt.Errorf("check recovery stream: %w", err)
	}
	if _, err := js.KeyValue(ctx, StatusBucket); errors.Is(err, jetstream.ErrBucketNotFound) {
		return fmt.Errorf("%w: bucket %s does not exist (engine setup creates it)", ErrNotSetUp, StatusBucket)
	} else if err != nil {
		return fmt.Errorf("check status bucket: %w", err)
	}
	return nil
}

// PendingCommands returns, for each of the partitions, how many commands
// its consumer holds that are not done: not yet delivered, or delivered
// and not yet acknowledged. A partition whose consumer (or stream) does
// not exist is left out. It writes nothing. Any other error of the
// server's is returned, naming the partition.
func PendingCommands(ctx context.Context, js jetstream.JetStream, partitions []int) (map[int]uint64, error) {
	out := make(map[int]uint64, len(partitions))
	for _, p := range partitions {
		c, err := js.Consumer(ctx, Stream, ConsumerName(p))
		if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("pending commands of partition %d: %w", p, err)
		}
		ci := c.CachedInfo()
		out[p] = ci.NumPending + uint64(ci.NumAckPending)
	}
	return out, nil
}
