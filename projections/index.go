package projections

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/nats-io/nats.go"
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
	// PendingToolUseIDs are the first SummaryPending of the session's
	// pending tool_use ids (Session.Pending), and PendingToolUses how
	// many there are: what an interrupted session left unanswered.
	PendingToolUseIDs []string `json:"pending_tool_use_ids,omitempty"`
	PendingToolUses   int      `json:"pending_tool_uses,omitzero"`
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

// SummaryPending is how many pending tool_use ids a Summary names.
const SummaryPending = 8

// Summary returns the session's row in the fleet index, for partition.
// Its Status is Session.Status, without a reader's time: a reader shows
// StatusAt.
func (s *Session) Summary(partition int) Summary {
	var pending []string
	if len(s.Pending) > 0 {
		pending = append([]string(nil), s.Pending[:min(len(s.Pending), SummaryPending)]...)
	}
	return Summary{
		PendingToolUseIDs: pending, PendingToolUses: len(s.Pending),
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

// StatusAt is the row's status as a reader at now sees it with the live
// horizon horizon (0 or less: DefaultLiveHorizon): Status, or
// StatusInterrupted for a history session in turn whose last event is
// older than the horizon (Interrupted), as Session.StatusAt says.
func (m Summary) StatusAt(now time.Time, horizon time.Duration) SessionStatus {
	if m.Status == StatusInTurn && Interrupted(m.History, m.Counts.TurnsInFlight, lastEvent(m.LastTime, m.LastStored), now, horizon) {
		return StatusInterrupted
	}
	return m.Status
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

// EnsureIndexBucket creates or updates the fleet index bucket
// (IndexBucket) with replicas replicas; engine setup runs it. The error is
// the server's refusal, wrapped.
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
// selects, sorted by tenant then session: ReadIndexRows, each row
// decoded (on every CPU). Errors: jetstream.ErrBucketNotFound (wrapped)
// when there is no index yet; JetStream's.
func ReadIndex(ctx context.Context, js jetstream.JetStream, f IndexFilter) ([]Summary, error) {
	rows, err := ReadIndexRows(ctx, js, f)
	if err != nil {
		return nil, err
	}
	sums := make([]Summary, len(rows))
	ok := make([]bool, len(rows))
	parallel(len(rows), func(i int) {
		ok[i] = json.Unmarshal(rows[i].Value, &sums[i]) == nil
	})
	out := sums[:0]
	for i := range sums {
		if ok[i] {
			out = append(out, sums[i])
		}
	}
	return out, nil
}

// DecodeIndexRows decodes rows (ReadIndexRows, GetIndexRows) into their
// summaries, in order, on every CPU. Errors: a row that does not decode,
// naming its session.
func DecodeIndexRows(rows []IndexRow) ([]Summary, error) {
	sums := make([]Summary, len(rows))
	errs := make([]error, len(rows))
	parallel(len(rows), func(i int) { errs[i] = json.Unmarshal(rows[i].Value, &sums[i]) })
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("index row of %s/%s: %w", rows[i].Tenant, rows[i].Session, err)
		}
	}
	return sums, nil
}

// parallel calls fn(i) for i in [0, n) on every CPU, and returns when
// all have returned.
func parallel(n int, fn func(i int)) {
	workers := min(max(1, runtime.GOMAXPROCS(0)), max(1, n/256))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				fn(i)
			}
		}()
	}
	wg.Wait()
}

// IndexRow is one row of the fleet index as it is stored: the session
// its key names (the partition, tenant and session tokens; for a subject
// that names no valid session, the tokens its Summary gives) and its
// value, the Summary's JSON (encoded as `engine sessions --json` prints
// it).
type IndexRow struct {
	Partition int
	Tenant    string
	Session   string
	Value     []byte
}

// ReadIndexRows returns the latest row of every session the filter
// selects, not decoded, sorted by tenant then session as the keys name
// them (a subject that names no valid session by the tokens its row
// gives). It reads the bucket's stream with an ordered consumer, in
// batches (events.ReadStream, which also works on replicated streams):
// the whole index, which keeps one value per key (history 1), as every
// message of the stream, so 100,000 sessions cost one pass over the
// bucket and no per-subject work on the server; a filtered read, the last
// message of each subject of the filter. Errors:
// jetstream.ErrBucketNotFound (wrapped) when there is no index yet;
// JetStream's.
func ReadIndexRows(ctx context.Context, js jetstream.JetStream, f IndexFilter) ([]IndexRow, error) {
	st, err := js.Stream(ctx, "KV_"+IndexBucket)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("read index: %w", jetstream.ErrBucketNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read index: %w", err)
	}
	if f.Partitions != nil && len(f.Partitions) == 0 {
		return nil, nil
	}
	// Each partition once: JetStream refuses a consumer with a filter
	// subject twice (error 10136).
	f.Partitions = uniquePartitions(f.Partitions)
	prefix := "$KV." + IndexBucket + "."
	var filters []string
	if f.Tenant != "" || f.Partitions != nil {
		// A part of the index: its keys (one request), then its rows by
		// batched direct gets when they are few. When they are many, one
		// partition is read through a consumer filtered on it; anything
		// else (a tenant's rows across partitions) through the whole
		// bucket, which costs less than a consumer with several filters.
		keys, err := IndexKeys(ctx, js, f)
		if err != nil {
			return nil, err
		}
		if len(keys) <= 4*maxDirectBatch {
			rows, err := GetIndexRows(ctx, js, keys, f.Tenant)
			if err != nil {
				return nil, fmt.Errorf("read index: %w", err)
			}
			sortRows(rows)
			return rows, nil
		}
		if f.Tenant == "" && len(f.Partitions) == 1 {
			filters = []string{prefix + strconv.Itoa(f.Partitions[0]) + ".*.*"}
		}
	}
	byKey := map[string]int{}
	var rows []IndexRow
	var deleted []bool
	// The bucket keeps one value per key (history 1): every message is a
	// key's latest (a value written again while the read runs comes
	// twice; the later wins below).
	err = events.ReadStream(ctx, st, jetstream.OrderedConsumerConfig{FilterSubjects: filters, DeliverPolicy: jetstream.DeliverAllPolicy}, 4000,
		func(msg jetstream.Msg) error {
			key, ok := strings.CutPrefix(msg.Subject(), prefix)
			if !ok {
				return nil
			}
			op := msg.Headers().Get("KV-Operation")
			del := op == "DEL" || op == "PURGE"
			if i, seen := byKey[key]; seen {
				// Written again while the read ran: the later value.
				rows[i].Value, deleted[i] = msg.Data(), del
				return nil
			}
			ps, rest, _ := strings.Cut(key, ".")
			tenant, session, _ := strings.Cut(rest, ".")
			p, _ := strconv.Atoi(ps)
			byKey[key] = len(rows)
			rows = append(rows, IndexRow{Partition: p, Tenant: tenant, Session: session, Value: msg.Data()})
			deleted = append(deleted, del)
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("read index: %w", err)
	}
	out := rows[:0]
	for i, r := range rows {
		if deleted[i] || (f.Partitions != nil && !slices.Contains(f.Partitions, r.Partition)) ||
			(f.Tenant != "" && r.Tenant != f.Tenant && r.Tenant != invalidToken) {
			continue
		}
		if r.Tenant == invalidToken {
			// A subject that names no valid session: its row says where
			// its tokens would be.
			var who struct {
				Tenant  string `json:"tenant"`
				Session string `json:"session"`
			}
			if json.Unmarshal(r.Value, &who) != nil || (f.Tenant != "" && who.Tenant != f.Tenant) {
				continue
			}
			r.Tenant, r.Session = who.Tenant, who.Session
		}
		out = append(out, r)
	}
	sortRows(out)
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
// how many summaries it wrote. It stops at the first error: the log's
// (listing or restoring a session: events.ErrLogUnavailable, ctx's) or
// the bucket's (it must exist: EnsureIndexBucket), with the count written
// until then.
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

// IndexKeys lists the rows the filter selects without reading them (their
// Value is nil): the index's keys, from the bucket's subjects (one
// request to the stream), sorted by tenant then session. Rows of subjects
// that name no valid session come last, with the tenant "_invalid" (their
// key does not hold their tokens; GetIndexRows reads them), and with a
// tenant filter all of them come, to be filtered once read. A key whose
// value was deleted may be listed; GetIndexRows leaves it out. Errors as
// ReadIndexRows'.
func IndexKeys(ctx context.Context, js jetstream.JetStream, f IndexFilter) ([]IndexRow, error) {
	if _, err := js.Stream(ctx, "KV_"+IndexBucket); errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("list index keys: %w", jetstream.ErrBucketNotFound)
	} else if err != nil {
		return nil, fmt.Errorf("list index keys: %w", err)
	}
	prefix := "$KV." + IndexBucket + "."
	filters := []string{prefix + ">"}
	if f.Tenant != "" {
		filters = []string{prefix + "*." + f.Tenant + ".*", prefix + "*." + invalidToken + ".*"}
	}
	var valid, invalid []IndexRow
	for _, filter := range filters {
		err := streamSubjects(ctx, js, "KV_"+IndexBucket, filter, func(subj string) {
			key := strings.TrimPrefix(subj, prefix)
			ps, rest, _ := strings.Cut(key, ".")
			tenant, session, _ := strings.Cut(rest, ".")
			p, err := strconv.Atoi(ps)
			if err != nil || (f.Partitions != nil && !slices.Contains(f.Partitions, p)) {
				return
			}
			r := IndexRow{Partition: p, Tenant: tenant, Session: session}
			if tenant == invalidToken {
				invalid = append(invalid, r)
			} else {
				valid = append(valid, r)
			}
		})
		if err != nil {
			return nil, fmt.Errorf("list index keys: %w", err)
		}
	}
	sortRows(valid)
	sortRows(invalid)
	return append(valid, invalid...), nil
}

// sortRows sorts rows by tenant then session. Rows listed from the
// stream's subjects come in runs already sorted (the server sorts the
// subjects, and within a partition a key sorts as its tenant and
// session): those runs are merged, any other order sorted.
func sortRows(rows []IndexRow) {
	cmp := func(a, b IndexRow) int {
		if c := strings.Compare(a.Tenant, b.Tenant); c != 0 {
			return c
		}
		return strings.Compare(a.Session, b.Session)
	}
	var runs [][]IndexRow
	start := 0
	for i := 1; i <= len(rows); i++ {
		if i == len(rows) || cmp(rows[i-1], rows[i]) > 0 {
			runs = append(runs, rows[start:i])
			start = i
		}
	}
	if len(runs) <= 1 {
		return
	}
	if len(runs) > 64 {
		slices.SortFunc(rows, cmp)
		return
	}
	buf := make([]IndexRow, 0, len(rows))
	for len(runs) > 1 {
		var next [][]IndexRow
		for i := 0; i < len(runs); i += 2 {
			if i+1 == len(runs) {
				next = append(next, runs[i])
				continue
			}
			a, b := runs[i], runs[i+1]
			from := len(buf)
			for len(a) > 0 && len(b) > 0 {
				if cmp(b[0], a[0]) < 0 {
					buf, b = append(buf, b[0]), b[1:]
				} else {
					buf, a = append(buf, a[0]), a[1:]
				}
			}
			buf = append(append(buf, a...), b...)
			next = append(next, buf[from:])
		}
		// The merged runs live in buf: copy them back for the next round.
		out := rows[:0]
		for _, r := range next {
			out = append(out, r...)
		}
		runs = runs[:0]
		off := 0
		for _, r := range next {
			runs = append(runs, rows[off:off+len(r)])
			off += len(r)
		}
		buf = buf[:0]
	}
}

// streamSubjects calls fn with each subject of stream that matches
// filter, from the stream's info (JetStream's $JS.API.STREAM.INFO with
// subjects_filter, page by page), reading the reply's subjects as tokens
// rather than into a map: 100,000 subjects cost one pass over the reply.
func streamSubjects(ctx context.Context, js jetstream.JetStream, stream, filter string, fn func(subject string)) error {
	api := js.Options().APIPrefix
	if api == "" {
		api = jetstream.DefaultAPIPrefix
	}
	subject := strings.TrimSuffix(api, ".") + ".STREAM.INFO." + stream
	offset := 0
	for {
		req, err := json.Marshal(struct {
			Filter string `json:"subjects_filter"`
			Offset int    `json:"offset,omitempty"`
		}{filter, offset})
		if err != nil {
			return fmt.Errorf("stream info request: %w", err)
		}
		rctx, cancel := ctx, context.CancelFunc(func() {})
		if _, ok := ctx.Deadline(); !ok {
			rctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		}
		resp, err := js.Conn().RequestWithContext(rctx, subject, req)
		cancel()
		if err != nil {
			return err
		}
		var page struct {
			Total int                 `json:"total"`
			Limit int                 `json:"limit"`
			Error *jetstream.APIError `json:"error"`
			State struct {
				Subjects jsontext.Value `json:"subjects"`
			} `json:"state"`
		}
		// The server's JSON has no duplicate names: not checking them
		// halves the cost of 100,000 subjects.
		if err := json.Unmarshal(resp.Data, &page, jsontext.AllowDuplicateNames(true)); err != nil {
			return fmt.Errorf("stream info: %w", err)
		}
		if page.Error != nil {
			return page.Error
		}
		n := 0
		if len(page.State.Subjects) > 0 {
			dec := jsontext.NewDecoder(bytes.NewReader(page.State.Subjects), jsontext.AllowDuplicateNames(true))
			if tok, err := dec.ReadToken(); err != nil || tok.Kind() != '{' {
				return fmt.Errorf("stream info: subjects: not an object")
			}
			for dec.PeekKind() != '}' {
				tok, err := dec.ReadToken()
				if err != nil {
					return fmt.Errorf("stream info: subjects: %w", err)
				}
				name := tok.String() // before the next read, which reuses its bytes
				if _, err := dec.ReadToken(); err != nil {
					return fmt.Errorf("stream info: subjects: %w", err)
				}
				fn(name)
				n++
			}
		}
		offset += n
		if n == 0 || page.Limit == 0 || offset >= page.Total {
			return nil
		}
	}
}

// maxDirectBatch is the most subjects one batched direct get answers
// (nats-server's limit on multi_last).
const maxDirectBatch = 1024

// GetIndexRows reads the values of rows (as IndexKeys lists them), in
// their order, with batched direct gets of each key's last value (ADR-31:
// multi_last, at most 1,024 keys a request), leaving out a key whose value
// is deleted. A row of a subject that names no valid session gets the
// tenant and session its value gives, and is left out when tenant is set
// and is not its. Errors: JetStream's.
func GetIndexRows(ctx context.Context, js jetstream.JetStream, rows []IndexRow, tenant string) ([]IndexRow, error) {
	prefix := "$KV." + IndexBucket + "."
	api := js.Options().APIPrefix
	if api == "" {
		api = jetstream.DefaultAPIPrefix
	}
	subject := strings.TrimSuffix(api, ".") + ".DIRECT.GET.KV_" + IndexBucket
	nc := js.Conn()
	values := map[string][]byte{}
	for start := 0; start < len(rows); start += maxDirectBatch {
		batch := rows[start:min(start+maxDirectBatch, len(rows))]
		req := struct {
			MultiLast []string `json:"multi_last"`
			Batch     int      `json:"batch"`
		}{Batch: len(batch)}
		for _, r := range batch {
			req.MultiLast = append(req.MultiLast, prefix+IndexKey(r.Partition, r.Tenant, r.Session))
		}
		body, err := json.Marshal(req)
		if err != nil {
			return nil, fmt.Errorf("get index rows: %w", err)
		}
		inbox := nats.NewInbox()
		sub, err := nc.SubscribeSync(inbox)
		if err != nil {
			return nil, fmt.Errorf("get index rows: %w", err)
		}
		if err := nc.PublishRequest(subject, inbox, body); err != nil {
			_ = sub.Unsubscribe()
			return nil, fmt.Errorf("get index rows: %w", err)
		}
		err = func() error {
			defer sub.Unsubscribe()
			for {
				m, err := sub.NextMsgWithContext(ctx)
				if err != nil {
					return err
				}
				if status := m.Header.Get("Status"); status != "" {
					if status == "204" || status == "404" {
						return nil // the end of the batch; none found
					}
					return fmt.Errorf("direct get: %s %s", status, m.Header.Get("Description"))
				}
				if op := m.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
					continue
				}
				values[strings.TrimPrefix(m.Header.Get("Nats-Subject"), prefix)] = m.Data
			}
		}()
		if err != nil {
			return nil, fmt.Errorf("get index rows: %w", err)
		}
	}
	out := make([]IndexRow, 0, len(rows))
	for _, r := range rows {
		v, ok := values[IndexKey(r.Partition, r.Tenant, r.Session)]
		if !ok {
			continue
		}
		r.Value = v
		if r.Tenant == invalidToken {
			var who struct {
				Tenant  string `json:"tenant"`
				Session string `json:"session"`
			}
			if json.Unmarshal(v, &who) != nil || (tenant != "" && who.Tenant != tenant) {
				continue
			}
			r.Tenant, r.Session = who.Tenant, who.Session
		}
		out = append(out, r)
	}
	return out, nil
}

// uniquePartitions returns ps without repeats, in their first order (nil
// stays nil).
func uniquePartitions(ps []int) []int {
	if ps == nil {
		return nil
	}
	out := make([]int, 0, len(ps))
	for _, p := range ps {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// RowsStatusAt returns rows with the status of each row that reads
// in_turn as a reader at now sees it (Summary.StatusAt with horizon: a
// turn of imported history with no event for longer than the horizon is
// interrupted, not in flight). Only such rows are decoded and encoded
// again; the others are returned as stored. rows is changed in place.
// Errors: a row that reads in_turn and does not decode, naming its
// session.
func RowsStatusAt(rows []IndexRow, now time.Time, horizon time.Duration) ([]IndexRow, error) {
	inTurn := []byte(string(StatusInTurn))
	for i, r := range rows {
		if !bytes.Contains(r.Value, inTurn) {
			continue
		}
		var m Summary
		if err := json.Unmarshal(r.Value, &m); err != nil {
			return nil, fmt.Errorf("index row of %s/%s: %w", r.Tenant, r.Session, err)
		}
		st := m.StatusAt(now, horizon)
		if st == m.Status {
			continue
		}
		m.Status = st
		b, err := encodeState(m)
		if err != nil {
			return nil, fmt.Errorf("index row of %s/%s: %w", r.Tenant, r.Session, err)
		}
		rows[i].Value = b
	}
	return rows, nil
}
