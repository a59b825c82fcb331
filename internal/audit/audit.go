// Package audit is Turnstone's record of who erased or changed what, and
// why: the AGENT_AUDIT stream, which denies delete and purge to everyone
// (JetStream cannot undo either setting, so not even the operator can
// rewrite it; it shrinks only by its MaxAge, none by default).
//
// Erasures (engine erase, the retention sweep) and the stream settings
// engine setup changes write one Record each; `engine audit` lists them.
package audit

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
)

// Names of the audit stream.
const (
	// Stream is the audit stream.
	Stream = "AGENT_AUDIT"
	// SubjectPrefix starts its subjects: agent.audit.<action>.
	SubjectPrefix = "agent.audit"
)

// Action is what a record records.
type Action string

// The actions recorded.
const (
	// ActionEraseSession: engine erase TENANT/SESSION.
	ActionEraseSession Action = "erase_session"
	// ActionEraseTenant: engine erase --tenant T.
	ActionEraseTenant Action = "erase_tenant"
	// ActionRetention: sessions past their tenant's retention, erased by
	// the engine that owns their partition.
	ActionRetention Action = "retention"
	// ActionStreamsUpdated: engine setup (or serve, on its embedded
	// server) changed the settings of existing streams or consumers
	// (--update-streams, --ack-wait and the other consumer settings, or
	// this version's contract).
	ActionStreamsUpdated Action = "streams_updated"
	// ActionPolicyLoaded: an engine started with a reconciler policy
	// other than the one last recorded; Policy holds it (YAML), so that
	// `engine whatif --baseline recorded` knows the policy in force.
	ActionPolicyLoaded Action = "policy_loaded"
)

// Outcomes of a record.
const (
	OutcomeCompleted = "completed"
	// OutcomeFailed: the action stopped part way; Counts say what was
	// removed before, Error why.
	OutcomeFailed = "failed"
	// OutcomeRefused: the action was refused before it changed anything
	// (an erase whose scope matches nothing); Error says why.
	OutcomeRefused = "refused"
)

// Scope is the tenant and sessions an erase covered (Sessions empty: the
// whole tenant).
type Scope struct {
	Tenant   string   `json:"tenant"`
	Sessions []string `json:"sessions,omitempty"`
}

// Counts are what an erase removed: the sessions that had events, and
// the messages purged from each store (both passes).
type Counts struct {
	Sessions     int    `json:"sessions"`
	Events       uint64 `json:"events"`
	Snapshots    uint64 `json:"snapshots"`
	Commands     uint64 `json:"commands"`
	Statuses     uint64 `json:"statuses"`
	IndexEntries uint64 `json:"index_entries"`
	Rejects      uint64 `json:"rejects"`
}

// Record is one entry of the audit stream (JSON): its ID (also its
// Nats-Msg-Id), when (At, the writer's clock; Stored is the stream's),
// the Action, Who did it (see Who), the Scope of an erase, the Reason
// given, what an erase removed (Counts) or which settings changed
// (Changes, "AGENT_EVENTS replicas: 1 -> 3"), the reconciler policy an
// engine loaded (Policy, YAML: ActionPolicyLoaded), the Outcome and, when it
// failed, Error. Seq and Stored are set when read back.
type Record struct {
	ID      string    `json:"id"`
	At      time.Time `json:"at"`
	Action  Action    `json:"action"`
	Who     string    `json:"who"`
	Scope   *Scope    `json:"scope,omitempty"`
	Reason  string    `json:"reason,omitempty"`
	Counts  *Counts   `json:"counts,omitempty"`
	Changes []string  `json:"changes,omitempty"`
	Policy  string    `json:"policy,omitempty"`
	Outcome string    `json:"outcome"`
	Error   string    `json:"error,omitempty"`
	Seq     uint64    `json:"seq,omitzero"`
	Stored  time.Time `json:"stored,omitzero"`
}

// StreamConfig is AGENT_AUDIT: subjects agent.audit.*, file storage,
// replicas replicas, kept forever, delete and purge denied.
func StreamConfig(replicas int) jetstream.StreamConfig {
	if replicas < 1 {
		replicas = 1
	}
	return jetstream.StreamConfig{
		Name:        Stream,
		Description: "Turnstone audit: who erased or changed what, and why",
		Subjects:    []string{SubjectPrefix + ".*"},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardNew,
		MaxMsgs:     -1,
		MaxBytes:    -1,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		Duplicates:  2 * time.Minute,
		DenyDelete:  true,
		DenyPurge:   true,
		AllowDirect: true,
	}
}

// Ensure creates AGENT_AUDIT when it is missing. An existing stream is
// left as it is (its replicas are the operator's; delete and purge stay
// denied whatever is asked).
func Ensure(ctx context.Context, js jetstream.JetStream, replicas int) error {
	_, err := js.Stream(ctx, Stream)
	if err == nil {
		return nil
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("stream %s: %w", Stream, err)
	}
	if _, err := js.CreateStream(ctx, StreamConfig(replicas)); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return fmt.Errorf("stream %s: %w", Stream, err)
	}
	return nil
}

// NewID returns a record id: the time and 8 random bytes, in hex.
func NewID(at time.Time) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%x-%s", at.UnixNano(), hex.EncodeToString(b[:]))
}

// Append stores r (ID and At filled in when empty) on
// agent.audit.<action>, with its id as Nats-Msg-Id, and returns its
// stream sequence. jetstream.ErrNoStreamResponse (wrapped) when
// AGENT_AUDIT does not exist.
func Append(ctx context.Context, js jetstream.JetStream, r Record) (uint64, error) {
	if r.At.IsZero() {
		r.At = time.Now().UTC()
	}
	if r.ID == "" {
		r.ID = NewID(r.At)
	}
	if r.Outcome == "" {
		r.Outcome = OutcomeCompleted
	}
	b, err := json.Marshal(r)
	if err != nil {
		return 0, fmt.Errorf("audit %s: %w", r.Action, err)
	}
	ack, err := js.Publish(ctx, SubjectPrefix+"."+string(r.Action), b, jetstream.WithMsgID(r.ID), jetstream.WithExpectStream(Stream))
	if err != nil {
		return 0, fmt.Errorf("audit %s: %w", r.Action, err)
	}
	return ack.Sequence, nil
}

// Filter selects records: of one action (empty: all), of one tenant
// (empty: all; records without a scope, stream changes, are kept), at
// most Limit of the latest (0: all).
type Filter struct {
	Action Action
	Tenant string
	Limit  int
}

// List returns the records the filter selects, oldest first, with Seq
// and Stored set. It reads the stream in batches (events.ReadStream,
// which works on replicated streams).
// jetstream.ErrStreamNotFound (wrapped) when there is no audit stream.
func List(ctx context.Context, js jetstream.JetStream, f Filter) ([]Record, error) {
	st, err := js.Stream(ctx, Stream)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	subject := SubjectPrefix + ".*"
	if f.Action != "" {
		subject = SubjectPrefix + "." + string(f.Action)
	}
	var out []Record
	err = events.ReadStream(ctx, st, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}}, 500, func(msg jetstream.Msg) error {
		var r Record
		if err := json.Unmarshal(msg.Data(), &r); err != nil {
			// Kept, with why: the audit trail hides nothing it holds.
			r = Record{Action: "unreadable", Outcome: OutcomeFailed, Error: fmt.Sprintf("record not readable: %v", err)}
		}
		if meta, err := msg.Metadata(); err == nil {
			r.Seq, r.Stored = meta.Sequence.Stream, meta.Timestamp.UTC()
		}
		if f.Tenant != "" && r.Scope != nil && r.Scope.Tenant != f.Tenant {
			return nil
		}
		out = append(out, r)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[len(out)-f.Limit:]
	}
	return out, nil
}

// Who names the identity behind nc, as well as the client can tell: the
// NATS user the connection authenticates as ("nats:<name> (<public
// key>)" from a JWT credential, "nats:<nkey>" for an nkey, "nats:<user>"
// for a user and password), else the OS user and host of this process
// ("os:<user>@<host>"). Under auth the server has checked the NATS
// identity; the OS one is the process's own claim.
func Who(nc *nats.Conn) string {
	if nc != nil {
		o := nc.Opts
		if o.UserJWT != nil {
			if tok, err := o.UserJWT(); err == nil {
				if who := jwtSubject(tok); who != "" {
					return "nats:" + who
				}
			}
		}
		if o.Nkey != "" {
			return "nats:" + o.Nkey
		}
		if o.User != "" {
			return "nats:" + o.User
		}
	}
	name := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, _ := os.Hostname()
	return "os:" + name + "@" + host
}

// jwtSubject reads the name and subject (the user's public key) of a
// NATS user JWT's claims, without checking its signature (the server
// did).
func jwtSubject(tok string) string {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return ""
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return ""
	}
	var c struct {
		Subject string `json:"sub"`
		Name    string `json:"name"`
	}
	if json.Unmarshal(b, &c) != nil || c.Subject == "" {
		return ""
	}
	if c.Name != "" && c.Name != c.Subject {
		return c.Name + " (" + c.Subject + ")"
	}
	return c.Subject
}

// LatestPolicy returns the latest ActionPolicyLoaded record (one direct
// get of the last message on agent.audit.policy_loaded), with Seq and
// Stored set. jetstream.ErrMsgNotFound (wrapped) when none was recorded;
// jetstream.ErrStreamNotFound (wrapped) when there is no audit stream.
func LatestPolicy(ctx context.Context, js jetstream.JetStream) (Record, error) {
	st, err := js.Stream(ctx, Stream)
	if err != nil {
		return Record{}, fmt.Errorf("audit: %w", err)
	}
	msg, err := st.GetLastMsgForSubject(ctx, SubjectPrefix+"."+string(ActionPolicyLoaded))
	if err != nil {
		return Record{}, fmt.Errorf("audit: latest policy: %w", err)
	}
	var r Record
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		return Record{}, fmt.Errorf("audit: latest policy at seq %d: %w", msg.Sequence, err)
	}
	r.Seq, r.Stored = msg.Sequence, msg.Time.UTC()
	return r, nil
}

// RecordPolicy appends an ActionPolicyLoaded record of policy (its YAML)
// by who, unless the latest one recorded holds the same text; it returns
// whether it appended.
func RecordPolicy(ctx context.Context, js jetstream.JetStream, who, reason string, policy []byte) (bool, error) {
	if last, err := LatestPolicy(ctx, js); err == nil && last.Policy == string(policy) {
		return false, nil
	} else if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, err
	}
	if _, err := Append(ctx, js, Record{Action: ActionPolicyLoaded, Who: who, Reason: reason, Policy: string(policy)}); err != nil {
		return false, err
	}
	return true, nil
}
