package projections

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
)

// IndexBucket is the key-value bucket of the fleet index: one Summary per
// session, key <partition>.<tenant>.<session>, kept by the engine that
// owns the partition. `engine sessions`, the start-up scan and the web
// view read it instead of the whole log.
const IndexBucket = "turnstone_sessions"

// Summary is one session's row in the fleet index: what a listing shows
// (`engine sessions`, the web view's fleet page) and what the engine's
// scan needs to know, without restoring the session. It is derived from
// the session's state (Session.Summary: the same status and Counts as its
// View) and written by the partition's owner: at once when something the
// reconciler acts on changes, within about a second otherwise. A subject
// that names no valid session has a row too, with Status StatusInvalid
// and its Subject.
type Summary struct {
	Tenant    string `json:"tenant"`
	Session   string `json:"session"`
	Partition int    `json:"partition"`
	// Subject is set on a row of a subject that names no valid session.
	Subject string `json:"subject,omitempty"`
	// Kind, ParentSession and ForkedFrom say what kind of session it is
	// and link a sidechain or a fork; Runtime, Model and Provider are the
	// state's.
	Kind          string `json:"kind,omitempty"`
	ParentSession string `json:"parent_session,omitempty"`
	ForkedFrom    string `json:"forked_from,omitempty"`
	Runtime       string `json:"runtime,omitempty"`
	Model         string `json:"model,omitempty"`
	Provider      string `json:"provider,omitempty"`
	// History marks an imported session (the reconciler never acts on it).
	History bool `json:"history,omitzero"`
	// Status and StatusDetail are the View's; Paused, PauseReason and
	// PauseCause the pause's, when paused.
	Status       SessionStatus     `json:"status"`
	StatusDetail string            `json:"status_detail,omitempty"`
	Paused       bool              `json:"paused,omitzero"`
	PauseReason  string            `json:"pause_reason,omitempty"`
	PauseCause   events.PauseCause `json:"pause_cause,omitempty"`
	// Events is how many events were folded; FirstSeq and LastSeq their
	// first and last stream sequences.
	Events   int    `json:"events"`
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
	// FirstTime and LastTime are the publishers' times; LastStored and
	// LastLiveStored the log's (see Session).
	FirstTime      time.Time `json:"first_time,omitzero"`
	LastTime       time.Time `json:"last_time,omitzero"`
	LastStored     time.Time `json:"last_stored,omitzero"`
	LastLiveStored time.Time `json:"last_live_stored,omitzero"`
	// Counts are the View's: turns, orphans and violations by state.
	Counts Counts `json:"counts"`
	// PendingDistillation is set while a distillation request waits.
	PendingDistillation bool `json:"pending_distillation,omitzero"`
	// Anomalous is Session.Anomalous (what `engine incidents` lists).
	Anomalous bool `json:"anomalous,omitzero"`
	// Triage is the session's latest anomaly and latest recovery, in a
	// few words (Session.Triage): what a fleet list shows beside the
	// status.
	Triage Triage `json:"triage,omitzero"`
}

// Triage says what went wrong in a session last and what recovery did
// about it, in a few words: the fleet list's "turn abandoned by hand ·
// repair_orphans recovered". The zero value is a session with neither.
type Triage struct {
	// Anomaly is the What of the session's latest anomaly (a ViewAnomaly
	// kind: a violation's rule, turn_failed, turn_abandoned, ...), empty
	// when none; AnomalySeq its sequence; AnomalyState a violation's
	// state (open, resolved, reset); Cause an abandoned turn's cause
	// (events.AbandonDeadline, ...) or a failed turn's stage.
	Anomaly      string `json:"anomaly,omitempty"`
	AnomalySeq   uint64 `json:"anomaly_seq,omitzero"`
	AnomalyState string `json:"anomaly_state,omitempty"`
	Cause        string `json:"cause,omitempty"`
	// Recovery is the kind of the latest recovery command run on the
	// session, Outcome how it ended: recovered, degraded, failed, parked,
	// or running while it has no outcome.
	Recovery string `json:"recovery,omitempty"`
	Outcome  string `json:"outcome,omitempty"`
}

// rank orders anomalies of one sequence (Session.Triage): a turn's end
// before the violations it declared.
func (t Triage) rank() int {
	if t.Anomaly == AnomalyTurnAbandoned || t.Anomaly == AnomalyTurnFailed {
		return 0
	}
	return 1
}

// Text is the triage in a few words: the anomaly, how it happened, and
// the latest recovery with its outcome ("turn abandoned by hand ·
// repair_orphans recovered", "tool_use_without_result (resolved)",
// "turn failed in execute"); "" when there is nothing to say.
func (t Triage) Text() string {
	var parts []string
	if t.Anomaly != "" {
		a := strings.ReplaceAll(t.Anomaly, "_", " ")
		switch t.Anomaly {
		case AnomalyTurnAbandoned:
			if how := AbandonedHow(t.Cause); how != "" {
				a += " " + how
			}
		case AnomalyTurnFailed:
			if t.Cause != "" {
				a += " in " + t.Cause
			}
		}
		if t.AnomalyState != "" && t.AnomalyState != StateOpen {
			a += " (" + t.AnomalyState + ")"
		}
		parts = append(parts, a)
	}
	if t.Recovery != "" {
		parts = append(parts, t.Recovery+" "+t.Outcome)
	}
	return strings.Join(parts, " · ")
}

// AbandonedHow says how a turn was abandoned, from turn.abandoned's cause:
// "by its deadline", "when the engine restarted", "by hand", or "" for a
// cause it does not know (or none).
func AbandonedHow(cause string) string {
	switch cause {
	case events.AbandonDeadline:
		return "by its deadline"
	case events.AbandonEngineRestart:
		return "when the engine restarted"
	case events.AbandonManual:
		return "by hand"
	}
	return ""
}

// NeedsAttention reports whether the summary shows something open: a
// broken, paused or invalid session, an open orphan, or a latest recovery
// that failed or was parked. A fleet list puts these first.
func (m Summary) NeedsAttention() bool {
	switch m.Status {
	case StatusBroken, StatusPaused, StatusInvalid:
		return true
	}
	return m.Counts.OrphansOpen > 0 || m.Triage.Outcome == string(events.OutcomeFailed) || m.Triage.Outcome == OutcomeParked
}

// Summary returns the session's row in the fleet index, for partition.
func (s *Session) Summary(partition int) Summary {
	return Summary{
		Tenant: s.Tenant, Session: s.Session, Partition: partition,
		Kind: s.Kind, ParentSession: s.ParentSession, ForkedFrom: s.ForkedFrom,
		Runtime: s.Runtime, Model: s.Model, Provider: s.Provider, History: s.History,
		Status: s.Status(), Paused: s.Paused, PauseReason: s.PauseReason, PauseCause: s.PauseCause,
		Events: s.Events, FirstSeq: s.FirstSeq, LastSeq: s.LastSeq,
		FirstTime: s.FirstTime, LastTime: s.LastTime, LastStored: s.LastStored, LastLiveStored: s.LastLiveStored,
		Counts:              s.Counts(),
		PendingDistillation: s.PendingDistillation() != nil,
		Anomalous:           s.Anomalous(),
		Triage:              s.Triage(),
	}
}

// InvalidSubjectSummary is the index row of a subject that names no valid
// session (events.ParseStoredSubject's reason), holding n events.
func InvalidSubjectSummary(subject, tenant, session string, partition, n int, reason string) Summary {
	return Summary{Tenant: tenant, Session: session, Partition: partition, Subject: subject,
		Status: StatusInvalid, StatusDetail: reason, Events: n, Anomalous: true}
}

// NeedsReconciler reports whether the summary says something the
// reconciler acts on may be open: turns in flight, a pending
// distillation, open orphans, or a pause waiting for its runtime; never
// for history.
func (m Summary) NeedsReconciler() bool {
	if m.History || m.Status == StatusInvalid {
		return false
	}
	return m.Counts.TurnsInFlight > 0 || m.PendingDistillation || m.Counts.OrphansOpen > 0 ||
		(m.Paused && m.PauseCause == events.CauseRuntimeUnavailable)
}

// IndexKey is the index key of a session: <partition>.<tenant>.<session>.
func IndexKey(partition int, tenant, session string) string {
	return strconv.Itoa(partition) + "." + tenant + "." + session
}

// invalidIndexKey is the index key of the row of a subject that names no
// valid session: <partition>._invalid.<hash of the subject>.
func invalidIndexKey(partition int, subject string) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(subject))
	return strconv.Itoa(partition) + "." + invalidToken + "." + strconv.FormatUint(h.Sum64(), 16)
}

// invalidToken is the tenant token of invalid subjects' index rows
// (tokens starting with "_" are Turnstone's own).
const invalidToken = "_invalid"

// IndexBucketConfig is the fleet index bucket: history 1 (the latest
// summary of each session), file storage, replicas replicas.
func IndexBucketConfig(replicas int) jetstream.KeyValueConfig {
	if replicas < 1 {
		replicas = 1
	}
	return jetstream.KeyValueConfig{
		Bucket:      IndexBucket,
		Description: "Turnstone fleet index: one summary per session",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	}
}

// EnsureIndexBucket creates or updates the fleet index bucket.
func EnsureIndexBucket(ctx context.Context, js jetstream.JetStream, replicas int) error {
	if _, err := js.CreateOrUpdateKeyValue(ctx, IndexBucketConfig(replicas)); err != nil {
		return fmt.Errorf("bucket %s: %w", IndexBucket, err)
	}
	return nil
}

// IndexFilter selects index entries: of one tenant, of some partitions
// (nil: all).
type IndexFilter struct {
	Tenant     string
	Partitions []int
}

// ReadIndex returns the latest summary of every session the filter
// selects, sorted by tenant then session. It reads the bucket's stream
// with an ordered consumer delivering the last message of each subject,
// in batches (events.ReadStream, which also works on replicated streams),
// so 100,000 sessions cost one pass over the bucket. Errors:
// jetstream.ErrBucketNotFound (wrapped) when there is no index yet;
// JetStream's.
func ReadIndex(ctx context.Context, js jetstream.JetStream, f IndexFilter) ([]Summary, error) {
	st, err := js.Stream(ctx, "KV_"+IndexBucket)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("read index: %w", jetstream.ErrBucketNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read index: %w", err)
	}
	tenants := []string{"*"}
	if f.Tenant != "" {
		tenants = []string{f.Tenant, invalidToken} // and the tenant's invalid subjects
	}
	parts := []string{"*"}
	if f.Partitions != nil {
		parts = nil
		for _, p := range f.Partitions {
			parts = append(parts, strconv.Itoa(p))
		}
		if len(parts) == 0 {
			return nil, nil
		}
	}
	var filters []string
	for _, p := range parts {
		for _, t := range tenants {
			filters = append(filters, "$KV."+IndexBucket+"."+p+"."+t+".*")
		}
	}
	out := []Summary{}
	err = events.ReadStream(ctx, st, jetstream.OrderedConsumerConfig{FilterSubjects: filters, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy}, 2000,
		func(msg jetstream.Msg) error {
			if op := msg.Headers().Get("KV-Operation"); op == "DEL" || op == "PURGE" {
				return nil
			}
			var m Summary
			if json.Unmarshal(msg.Data(), &m) == nil && (f.Tenant == "" || m.Tenant == f.Tenant) {
				out = append(out, m)
			}
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("read index: %w", err)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Tenant != out[j].Tenant {
			return out[i].Tenant < out[j].Tenant
		}
		return out[i].Session < out[j].Session
	})
	return out, nil
}

// validIndexKey reports whether tenant and session can be an index key
// (KV keys allow [-/_=.a-zA-Z0-9]; tokens never hold dots).
func validIndexKey(tenant, session string) bool {
	return events.ValidToken(tenant) && events.ValidToken(session) && !strings.ContainsAny(tenant+session, ".*>")
}

// RebuildIndex writes the summary of every session of the log, each
// restored from its snapshot and tail, to the fleet index: for an index
// created over a log that already holds sessions (an upgrade). It returns
// how many summaries it wrote.
func RebuildIndex(ctx context.Context, log *events.Log, store *SnapshotStore) (int, error) {
	refs, err := log.Sessions(ctx, "")
	if err != nil {
		return 0, fmt.Errorf("rebuild index: %w", err)
	}
	kv, err := log.JetStream().KeyValue(ctx, IndexBucket)
	if err != nil {
		return 0, fmt.Errorf("rebuild index: %w", err)
	}
	n := 0
	for _, ref := range refs {
		if !validIndexKey(ref.Tenant, ref.Session) {
			continue
		}
		s, err := Restore(ctx, log, store, ref.Tenant, ref.Session)
		if err != nil {
			return n, fmt.Errorf("rebuild index: %w", err)
		}
		if s.Tenant == "" {
			s.Tenant, s.Session = ref.Tenant, ref.Session
		}
		b, err := encodeState(s.Summary(ref.Partition))
		if err != nil {
			return n, fmt.Errorf("rebuild index: %w", err)
		}
		if _, err := kv.Put(ctx, IndexKey(ref.Partition, ref.Tenant, ref.Session), b); err != nil {
			return n, fmt.Errorf("rebuild index: %w", err)
		}
		n++
	}
	return n, nil
}
