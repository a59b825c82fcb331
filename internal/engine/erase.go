package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/internal/audit"
	"github.com/turnstone-dev/turnstone/internal/erasure"
	"github.com/turnstone-dev/turnstone/internal/pgroup"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// Errors of Erase. Match them with errors.Is.
var (
	// ErrNotConfirmed: a live engine or worker did not confirm that it
	// blocked the scope and forgot it; nothing was erased. Try again
	// (a member that just died leaves the group within its TTL).
	ErrNotConfirmed = errors.New("erase not confirmed by every engine and worker")
	// ErrPurgeDenied: AGENT_EVENTS denies purge (a stream created by an
	// earlier version: deny_purge cannot be undone), or the connection's
	// permissions do not allow purging; nothing was erased.
	ErrPurgeDenied = errors.New("purge denied")
	// ErrNoAudit: AGENT_AUDIT does not exist (engine setup creates it);
	// nothing is erased without its record.
	ErrNoAudit = errors.New("no audit stream")
	// ErrNothingToErase: the scope matches no event, snapshot, command,
	// index entry or quarantine record (a mistyped session or tenant);
	// the refusal is recorded in the audit stream, outcome refused.
	ErrNothingToErase = errors.New("nothing to erase")
)

// EraseRequest is one erase: its scope, why (required), who asks (empty:
// audit.Who of the connection) and the action recorded (empty:
// erase_session or erase_tenant by the scope).
type EraseRequest struct {
	Scope  erasure.Scope
	Reason string
	Who    string
	Action audit.Action
	// ConfirmWait bounds how long the members have to confirm each
	// notice. Default 10 seconds.
	ConfirmWait time.Duration
}

// liveWithin is how recent a member's heartbeat must be for an erase to
// wait for its confirmation: two of pgroup's default TTLs.
const liveWithin = 2 * pgroup.DefaultTTL

// Erase removes the scope's data from every store, as package erasure
// describes: it announces the erase to every live engine and worker and
// waits until each has blocked the scope and forgotten its state, purges
// the scope's events (AGENT_EVENTS), snapshots (AGENT_SNAPSHOTS),
// recovery commands (AGENT_RECOVERY) and their statuses
// (turnstone_commands: the ids of the commands of the scope, and every
// status that names a session of it), fleet index entries
// (turnstone_sessions) and quarantine records (AGENT_QUARANTINE), twice,
// announces the end with the streams' watermarks, and records it in
// AGENT_AUDIT. It needs purge permission on those streams (the operator's,
// or an engine's for its retention). It returns the audit record.
//
// Errors: erasure.ErrInvalidScope, a missing reason; ErrPurgeDenied and
// ErrNoAudit (nothing erased); ErrNotConfirmed (nothing erased); a
// JetStream error part way (the record, written with outcome failed, says
// what was removed before).
func Erase(ctx context.Context, nc *nats.Conn, req EraseRequest) (audit.Record, error) {
	rec := audit.Record{Action: req.Action, Who: req.Who, Reason: req.Reason,
		Scope: &audit.Scope{Tenant: req.Scope.Tenant, Sessions: req.Scope.Sessions}}
	if err := req.Scope.Validate(); err != nil {
		return rec, fmt.Errorf("erase: %w", err)
	}
	if strings.TrimSpace(req.Reason) == "" {
		return rec, errors.New("erase: a reason is required")
	}
	if rec.Action == "" {
		rec.Action = audit.ActionEraseSession
		if req.Scope.Whole() {
			rec.Action = audit.ActionEraseTenant
		}
	}
	if rec.Who == "" {
		rec.Who = audit.Who(nc)
	}
	if req.ConfirmWait <= 0 {
		req.ConfirmWait = 10 * time.Second
	}
	rec.At = time.Now().UTC()
	rec.ID = audit.NewID(rec.At)
	js, err := jetstream.New(nc)
	if err != nil {
		return rec, fmt.Errorf("erase: %w", err)
	}
	st, err := js.Stream(ctx, events.EventsStream)
	if err != nil {
		return rec, fmt.Errorf("erase: %w", err)
	}
	if st.CachedInfo().Config.DenyPurge {
		return rec, fmt.Errorf("erase: %w: stream %s was created with deny_purge, which JetStream cannot undo; copy its sessions to a new stream to be able to erase", ErrPurgeDenied, events.EventsStream)
	}
	if _, err := js.Stream(ctx, audit.Stream); errors.Is(err, jetstream.ErrStreamNotFound) {
		return rec, fmt.Errorf("erase: %w: %s (engine setup creates it)", ErrNoAudit, audit.Stream)
	} else if err != nil {
		return rec, fmt.Errorf("erase: %w", err)
	}

	// 0. A scope that matches nothing is a mistake (a mistyped or cut
	// session name): refused, and recorded as such.
	if held, near, err := scopeHolds(ctx, js, req.Scope); err != nil {
		return rec, fmt.Errorf("erase %s: %w", req.Scope, err)
	} else if !held {
		why := fmt.Sprintf("%s: no event, snapshot, command, index entry or quarantine record of %s", ErrNothingToErase, req.Scope)
		if len(near) > 0 {
			why += "; sessions of " + req.Scope.Tenant + " whose names start so: " + strings.Join(near, ", ")
		}
		rec.Outcome, rec.Error = audit.OutcomeRefused, why
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if seq, aerr := audit.Append(actx, js, rec); aerr == nil {
			rec.Seq = seq
		} else {
			return rec, fmt.Errorf("erase %s: %w (and the refusal was not recorded: %w)", req.Scope, ErrNothingToErase, aerr)
		}
		return rec, fmt.Errorf("erase %s: %s (nothing erased)", req.Scope, strings.TrimPrefix(why, ErrNothingToErase.Error()+": "))
	}

	// 1. Every live engine and worker blocks the scope and forgets it.
	notice := erasure.Notice{ID: rec.ID, Phase: erasure.PhaseBegin, Scope: req.Scope}
	expect, err := liveMembers(ctx, js)
	if err != nil {
		return rec, fmt.Errorf("erase: %w", err)
	}
	if err := announce(ctx, nc, notice, expect, req.ConfirmWait); err != nil {
		abort := notice
		abort.Phase = erasure.PhaseAbort
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_, _, _ = erasure.Announce(actx, nc, abort, expect)
		cancel()
		return rec, fmt.Errorf("erase %s: %w", req.Scope, err)
	}

	// 2. Purge, twice: the second pass removes what a member had sent
	// before it confirmed and the server stored after the first.
	p := purger{nc: nc, js: js, prefix: apiPrefix(js)}
	counts := &audit.Counts{}
	rec.Counts = counts
	var perr error
	if counts.Sessions, perr = countSessions(ctx, js, req.Scope); perr == nil {
		for pass := 0; pass < 2 && perr == nil; pass++ {
			perr = p.all(ctx, req.Scope, counts)
		}
	}

	// 3. The end, with the watermarks, to the members live now.
	end := notice
	end.Phase = erasure.PhaseEnd
	end.EventsSeq = lastSeq(ctx, js, events.EventsStream)
	end.CommandsSeq = lastSeq(ctx, js, recovery.Stream)
	if expect, err := liveMembers(ctx, js); err == nil {
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), req.ConfirmWait)
		_, _, _ = erasure.Announce(ectx, nc, end, expect)
		cancel()
	}

	// 4. The record.
	if perr != nil {
		rec.Outcome, rec.Error = audit.OutcomeFailed, perr.Error()
	} else {
		rec.Outcome = audit.OutcomeCompleted
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	// Three tries, 200 ms apart, within actx (which outlives ctx: what
	// was erased is recorded even when the caller gave up).
	aerr := backoff.Retry(func() error {
		var err error
		rec.Seq, err = audit.Append(actx, js, rec)
		return err
	}, backoff.WithContext(backoff.WithMaxRetries(backoff.NewConstantBackOff(200*time.Millisecond), 2), actx))
	switch {
	case perr != nil:
		return rec, fmt.Errorf("erase %s: %w", req.Scope, perr)
	case aerr != nil:
		return rec, fmt.Errorf("erase %s: erased, but the audit record was not stored: %w", req.Scope, aerr)
	}
	return rec, nil
}

// announce sends n and fails unless every member of expect confirmed
// without error.
func announce(ctx context.Context, nc *nats.Conn, n erasure.Notice, expect []string, wait time.Duration) error {
	actx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	got, missing, err := erasure.Announce(actx, nc, n, expect)
	if err != nil {
		return err
	}
	var problems []string
	for _, c := range got {
		if c.Error != "" {
			problems = append(problems, fmt.Sprintf("%s %s: %s", c.Group, c.Member, c.Error))
		}
	}
	for _, m := range missing {
		problems = append(problems, m+": no answer")
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w; nothing was erased: %s", ErrNotConfirmed, strings.Join(problems, "; "))
	}
	return nil
}

// liveMembers lists "<group>.<member>" of the engines and workers whose
// heartbeat is recent.
func liveMembers(ctx context.Context, js jetstream.JetStream) ([]string, error) {
	recs, err := pgroup.List(ctx, js, "", "")
	if errors.Is(err, pgroup.ErrNoBucket) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("members: %w", err)
	}
	now := time.Now()
	var out []string
	for _, r := range recs {
		if (r.Group == Group || r.Group == recovery.WorkerGroup) && now.Sub(r.Beat) < liveWithin {
			out = append(out, r.Group+"."+r.Member)
		}
	}
	return out, nil
}

// lastSeq is a stream's last sequence (0 when it cannot be read).
func lastSeq(ctx context.Context, js jetstream.JetStream, stream string) uint64 {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return 0
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0
	}
	return info.State.LastSeq
}

// scopeHolds reports whether any store holds something of scope: an
// event, a snapshot, a recovery command, an index entry or a quarantine
// record. When none does and the scope names sessions, near lists up to
// five sessions of its tenant whose names start with one of them (the
// likely meant ones).
func scopeHolds(ctx context.Context, js jetstream.JetStream, scope erasure.Scope) (bool, []string, error) {
	sessions := scope.Sessions
	if scope.Whole() {
		sessions = []string{"*"}
	}
	type probe struct{ stream, filter string }
	var probes []probe
	for _, s := range sessions {
		probes = append(probes,
			probe{events.EventsStream, events.StoredEventSubject(-1, scope.Tenant, s)},
			probe{events.SnapshotsStream, events.SnapshotSubject(scope.Tenant, s)},
			probe{recovery.Stream, recovery.CommandSubjectPrefix + ".*." + scope.Tenant + "." + s},
			probe{"KV_" + projections.IndexBucket, "$KV." + projections.IndexBucket + ".*." + scope.Tenant + "." + s},
			probe{ingest.QuarantineStream, ingest.QuarantineSubjectPrefix + "." + scope.Tenant + "." + s},
		)
	}
	if scope.Whole() {
		probes = append(probes, probe{ingest.QuarantineStream, ingest.QuarantineSubjectPrefix + "." + scope.Tenant})
	}
	for _, p := range probes {
		st, err := js.Stream(ctx, p.stream)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return false, nil, err
		}
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(p.filter))
		if err != nil {
			return false, nil, err
		}
		if len(info.State.Subjects) > 0 {
			return true, nil, nil
		}
	}
	var near []string
	if !scope.Whole() {
		if st, err := js.Stream(ctx, events.EventsStream); err == nil {
			if info, err := st.Info(ctx, jetstream.WithSubjectFilter(events.StoredEventSubject(-1, scope.Tenant, "*"))); err == nil {
				for subj := range info.State.Subjects {
					parts := strings.Split(subj, ".")
					for _, s := range scope.Sessions {
						if len(parts) == 5 && strings.HasPrefix(parts[4], s) {
							near = append(near, scope.Tenant+"/"+parts[4])
						}
					}
				}
			}
		}
		sort.Strings(near)
		if len(near) > 5 {
			near = append(near[:5], "…")
		}
	}
	return false, near, nil
}

// countSessions counts the sessions of the scope that have events.
func countSessions(ctx context.Context, js jetstream.JetStream, scope erasure.Scope) (int, error) {
	st, err := js.Stream(ctx, events.EventsStream)
	if err != nil {
		return 0, err
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(events.StoredEventSubject(-1, scope.Tenant, "*")))
	if err != nil {
		return 0, fmt.Errorf("count sessions: %w", err)
	}
	n := 0
	for subj := range info.State.Subjects {
		parts := strings.Split(subj, ".")
		if len(parts) == 5 && scope.Covers(parts[3], parts[4]) {
			n++
		}
	}
	return n, nil
}

// apiPrefix is the JetStream API prefix of js, with its trailing dot.
func apiPrefix(js jetstream.JetStream) string {
	o := js.Options()
	switch {
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	}
	return jetstream.DefaultAPIPrefix
}

// jsErrPurgeFailed is JetStream's error code of a purge refused (deny
// purge: "stream purge not permitted").
const jsErrPurgeFailed = 10110

// purger purges by subject through the JetStream API, to read how many
// messages each purge removed.
type purger struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	prefix string
}

// all purges every store of the scope once, adding to counts.
func (p purger) all(ctx context.Context, scope erasure.Scope, counts *audit.Counts) error {
	sessions := scope.Sessions
	if scope.Whole() {
		sessions = []string{"*"}
	}
	// The commands' ids first, while their bodies are there.
	ids, err := commandIDs(ctx, p.js, scope)
	if err != nil {
		return err
	}
	type target struct {
		stream  string
		filters []string
		n       *uint64
	}
	var targets []target
	for _, s := range sessions {
		targets = append(targets,
			target{events.EventsStream, []string{events.StoredEventSubject(-1, scope.Tenant, s)}, &counts.Events},
			target{events.SnapshotsStream, []string{events.SnapshotSubject(scope.Tenant, s)}, &counts.Snapshots},
			target{recovery.Stream, []string{recovery.CommandSubjectPrefix + ".*." + scope.Tenant + "." + s}, &counts.Commands},
			target{"KV_" + projections.IndexBucket, []string{"$KV." + projections.IndexBucket + ".*." + scope.Tenant + "." + s}, &counts.IndexEntries},
			target{ingest.QuarantineStream, []string{ingest.QuarantineSubjectPrefix + "." + scope.Tenant + "." + s}, &counts.Rejects},
		)
	}
	if scope.Whole() {
		// Where earlier versions kept a tenant's quarantine records.
		targets = append(targets, target{ingest.QuarantineStream, []string{ingest.QuarantineSubjectPrefix + "." + scope.Tenant}, &counts.Rejects})
	}
	var statusFilters []string
	for _, id := range ids {
		statusFilters = append(statusFilters, "$KV."+recovery.StatusBucket+"."+id)
	}
	targets = append(targets, target{"KV_" + recovery.StatusBucket, statusFilters, &counts.Statuses})
	for _, t := range targets {
		for _, f := range t.filters {
			n, err := p.purge(ctx, t.stream, f)
			if err != nil {
				return err
			}
			*t.n += n
		}
	}
	return nil
}

// purge purges stream's messages on filter and returns how many it
// removed; 0 when the stream does not exist.
func (p purger) purge(ctx context.Context, stream, filter string) (uint64, error) {
	body, err := json.Marshal(map[string]string{"filter": filter})
	if err != nil {
		return 0, fmt.Errorf("purge %s %s: %w", stream, filter, err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	msg, err := p.nc.RequestWithContext(rctx, p.prefix+"STREAM.PURGE."+stream, body)
	if err != nil {
		if last := p.nc.LastError(); last != nil && strings.Contains(strings.ToLower(last.Error()), "permissions violation") {
			return 0, fmt.Errorf("purge %s %s: %w: %v", stream, filter, ErrPurgeDenied, last)
		}
		return 0, fmt.Errorf("purge %s %s: %w", stream, filter, err)
	}
	var resp struct {
		Purged uint64 `json:"purged"`
		Error  *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return 0, fmt.Errorf("purge %s %s: %w", stream, filter, err)
	}
	if e := resp.Error; e != nil {
		switch {
		case e.ErrCode == int(jetstream.JSErrCodeStreamNotFound):
			return 0, nil
		case e.ErrCode == jsErrPurgeFailed && strings.Contains(e.Description, "not permitted"):
			return 0, fmt.Errorf("purge %s %s: %w: %s", stream, filter, ErrPurgeDenied, e.Description)
		}
		return 0, fmt.Errorf("purge %s %s: %s (%d)", stream, filter, e.Description, e.ErrCode)
	}
	return resp.Purged, nil
}

// validKey reports whether s can be a KV key, so a subject token list
// of the bucket's stream: [-/_=.a-zA-Z0-9], not starting or ending with
// a dot.
func validKey(s string) bool {
	if s == "" || s[0] == '.' || s[len(s)-1] == '.' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-/_=.", c) >= 0) {
			return false
		}
	}
	return true
}

// commandIDs returns the ids of the scope's commands: those whose bodies
// are in AGENT_RECOVERY, and those whose status names a session of the
// scope.
func commandIDs(ctx context.Context, js jetstream.JetStream, scope erasure.Scope) ([]string, error) {
	ids := map[string]bool{}
	sessions := scope.Sessions
	if scope.Whole() {
		sessions = []string{"*"}
	}
	var filters []string
	for _, s := range sessions {
		filters = append(filters, recovery.CommandSubjectPrefix+".*."+scope.Tenant+"."+s)
	}
	read := func(stream string, filters []string, last bool, fn func(msg jetstream.Msg)) error {
		st, err := js.Stream(ctx, stream)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		cfg := jetstream.OrderedConsumerConfig{FilterSubjects: filters}
		if last {
			cfg.DeliverPolicy = jetstream.DeliverLastPerSubjectPolicy
		}
		cons, err := st.OrderedConsumer(ctx, cfg)
		if err != nil {
			return err
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return err
		}
		remaining := info.NumPending
		for remaining > 0 {
			batch, err := cons.Fetch(int(min(remaining, 1000)), jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				return err
			}
			n := 0
			for msg := range batch.Messages() {
				n++
				remaining--
				if meta, err := msg.Metadata(); err == nil {
					remaining = meta.NumPending
				}
				fn(msg)
			}
			if n == 0 {
				break
			}
		}
		return nil
	}
	// Several filters of one consumer must not overlap; a list of
	// sessions is split in chunks the server accepts.
	for chunk := range slices.Chunk(filters, 100) {
		err := read(recovery.Stream, chunk, false, func(msg jetstream.Msg) {
			var c struct {
				ID string `json:"id"`
			}
			if json.Unmarshal(msg.Data(), &c) == nil && validKey(c.ID) {
				ids[c.ID] = true
			}
		})
		if err != nil {
			return nil, fmt.Errorf("commands of %s: %w", scope, err)
		}
	}
	err := read("KV_"+recovery.StatusBucket, []string{"$KV." + recovery.StatusBucket + ".>"}, true, func(msg jetstream.Msg) {
		var st recovery.Status
		if json.Unmarshal(msg.Data(), &st) == nil && scope.Covers(st.Tenant, st.Session) {
			ids[strings.TrimPrefix(msg.Subject(), "$KV."+recovery.StatusBucket+".")] = true
		}
	})
	if err != nil {
		return nil, fmt.Errorf("command statuses of %s: %w", scope, err)
	}
	out := make([]string, 0, len(ids))
	for id := range ids {
		out = append(out, id)
	}
	sort.Strings(out)
	return out, nil
}
