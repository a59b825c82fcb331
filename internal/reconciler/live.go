package reconciler

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// This file holds what makes the reconciler right on sessions followed
// live (docs/policy.md, "Every turn ends" and "Never act on stale
// state"): the signs of life a turn's state does not carry, and the check
// that an action still holds against the session's log before it is
// carried out.

// ActivityBucket is the key-value bucket of subagent activity: one entry
// per subagent link, key <tenant>.<parent session>.<tool key> (the parent's
// tool_use id that started the subagent, as ActivityKey writes it), value
// an Activity. The engine that folds a subagent session writes it; the
// engine that folds the parent session reads it when one of the parent's
// turns would be abandoned, so that a turn waiting on its subagent is not
// abandoned while the subagent works. The two sessions may lie in
// different partitions, owned by different engines: the bucket is how the
// parent's engine hears of the child without either engine reading or
// writing the other's partition.
const ActivityBucket = "turnstone_activity"

// ActivityMaxAge is how long an entry of ActivityBucket is kept after it
// was last written (the bucket's MaxAge): a subagent silent that long is
// no sign of life of anything.
const ActivityMaxAge = 24 * time.Hour

// Activity is the value of an ActivityBucket entry: the subagent session,
// and the store time and sequence of its latest runtime event written.
type Activity struct {
	Child  string    `json:"child"`
	Stored time.Time `json:"stored"`
	Seq    uint64    `json:"seq"`
}

// EnsureActivityBucket creates or updates ActivityBucket (file storage,
// one value per key, entries kept ActivityMaxAge, replicas replicas).
// engine setup runs it.
func EnsureActivityBucket(ctx context.Context, js jetstream.JetStream, replicas int) error {
	if replicas < 1 {
		replicas = 1
	}
	_, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: ActivityBucket, Description: "Turnstone: the latest activity of each subagent session, for its parent's turn deadline",
		History: 1, TTL: ActivityMaxAge, Storage: jetstream.FileStorage, Replicas: replicas, MaxBytes: 64 << 20,
	})
	if err != nil {
		return fmt.Errorf("bucket %s: %w", ActivityBucket, err)
	}
	return nil
}

// unlinkedTool is the tool key of a subagent whose session.started names
// no tool_use of its parent: its activity counts for every turn of the
// parent in flight.
const unlinkedTool = "_"

// ActivityKey is the ActivityBucket key of the activity of a subagent of
// tenant/parent started by the parent's tool_use toolUseID (empty: not
// known): <tenant>.<parent>.<tool key>, the tool key being the id itself
// when it is a token of [A-Za-z0-9_-] of at most 64 characters, else "h"
// and 32 hex digits of its SHA-256, and "_" for an unknown one.
func ActivityKey(tenant, parent, toolUseID string) string {
	return tenant + "." + parent + "." + toolKey(toolUseID)
}

func toolKey(id string) string {
	switch {
	case id == "":
		return unlinkedTool
	case len(id) <= 64 && events.ValidToken(id) && id != unlinkedTool:
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "h" + hex.EncodeToString(sum[:16])
}

// activityWrite is what the reconciler wrote of one subagent's activity,
// and what waits to be written.
type activityWrite struct {
	written time.Time // store time of the activity last written
	pending *Activity // a later activity not yet written
}

// noteActivity writes, for a subagent session s whose event ev was just
// folded, its activity for the parent's engine: at once when the last
// write is ActivityEvery older than ev, else at the next tick, so that
// a busy subagent costs at most one write per ActivityEvery.
func (r *Reconciler) noteActivity(s *projections.Session, ev events.Event) {
	if r.actKV == nil || s == nil || s.ParentSession == "" || s.History || ev.Stored.IsZero() || !projections.RuntimeEvent(ev) {
		return
	}
	k := ActivityKey(s.Tenant, s.ParentSession, s.ParentToolUseID)
	a := &Activity{Child: s.Session, Stored: ev.Stored.UTC(), Seq: ev.Seq}
	r.mu.Lock()
	w := r.written[k]
	now := !a.Stored.Before(w.written.Add(r.cfg.ActivityEvery))
	if now {
		w.written, w.pending = a.Stored, nil
	} else if !a.Stored.Before(w.written) {
		w.pending = a
	}
	if len(r.written) >= maxRemembered {
		clear(r.written) // at worst one more write per subagent
	}
	r.written[k] = w
	r.mu.Unlock()
	if now {
		r.putActivity(k, a)
	}
}

// flushActivity writes the activity that waited for a tick.
func (r *Reconciler) flushActivity() {
	r.mu.Lock()
	due := map[string]*Activity{}
	for k, w := range r.written {
		if w.pending != nil {
			due[k] = w.pending
			w.written, w.pending = w.pending.Stored, nil
			r.written[k] = w
		}
	}
	r.mu.Unlock()
	for k, a := range due {
		r.putActivity(k, a)
	}
}

// putActivity writes one entry without waiting for its acknowledgement:
// a write lost only makes the parent's deadline count from an earlier
// sign of life.
func (r *Reconciler) putActivity(k string, a *Activity) {
	b, err := json.Marshal(a)
	if err != nil {
		return
	}
	if _, err := r.js.PublishAsync("$KV."+ActivityBucket+"."+k, b); err != nil {
		r.l.Debug().Err(err).Str("key", k).Msg("subagent activity not written")
	}
}

// signsOfLife returns, for each of the turns of s (which Decide would
// abandon), the latest sign of life the state does not carry: a present
// runtime's claim that it works on the turn, and the activity of a
// subagent session started by one of the turn's pending tool calls, or
// by none the reconciler can name (ActivityBucket).
func (r *Reconciler) signsOfLife(ctx context.Context, s *projections.Session, turns []string) map[string]time.Time {
	out := map[string]time.Time{}
	later := func(turn string, t time.Time) {
		if t.After(out[turn]) {
			out[turn] = t
		}
	}
	for _, turn := range turns {
		if r.cfg.Presence != nil {
			later(turn, r.cfg.Presence.Claimed(s.Tenant, s.Session, turn))
		}
		if r.actKV == nil {
			continue
		}
		keys := []string{ActivityKey(s.Tenant, s.Session, "")}
		for _, tc := range s.PendingToolCalls(turn) {
			keys = append(keys, ActivityKey(s.Tenant, s.Session, tc.ToolUseID))
		}
		for _, k := range keys {
			gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			e, err := r.actKV.Get(gctx, k)
			cancel()
			if err != nil {
				if !errors.Is(err, jetstream.ErrKeyNotFound) {
					r.l.Debug().Err(err).Str("key", k).Msg("subagent activity not read")
				}
				continue
			}
			// Strictly, as every entry Turnstone reads (go-json-experiment):
			// an entry that does not decode is no sign of life.
			var a Activity
			if err := json.Unmarshal(e.Value(), &a); err != nil {
				r.l.Debug().Err(err).Str("key", k).Msg("subagent activity unreadable")
				continue
			}
			later(turn, a.Stored)
		}
	}
	for turn, t := range out {
		if t.IsZero() {
			delete(out, turn)
		}
	}
	return out
}

// errTooFar ends a recheck's read of a session that is too far ahead.
var errTooFar = errors.New("the log is too far ahead of the state")

// current reports whether action a, decided from a state of its session
// at a.StateSeq, still holds against the session's log: the reconciler's
// last look before it carries a command out, so that no command is
// issued on stale state, and none names a turn the log already ended
// (docs/policy.md, "Never act on stale state"). When the log holds
// events after the state, the state (the projector's copy, or the
// session restored) is brought up to the log through the replay path and
// decided again; a too long way to go (MaxRecheck events: the projector
// lags) drops the action, and the session is judged again once its
// projection has caught up. Answers (events appended on the condition of
// the session's last sequence) need no check. Errors: the log's (the
// caller fails closed and tries again).
func (r *Reconciler) current(ctx context.Context, a Action) (bool, error) {
	if a.Command == nil {
		return true, nil
	}
	tenant, session := a.Command.Tenant, a.Command.Session
	k := key(tenant, session)
	r.mu.Lock()
	b := r.behind[k]
	r.mu.Unlock()
	if a.StateSeq < b {
		r.stale(a, "its state is behind the log")
		return false, nil
	}
	last, err := r.log.LastSeq(ctx, tenant, session)
	if errors.Is(err, events.ErrSessionNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if last <= a.StateSeq {
		return true, nil
	}
	s, err := r.state(ctx, tenant, session)
	if errors.Is(err, events.ErrSessionNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if s.LastSeq < last {
		// To the log's end: ReadSession reads on until it has the
		// stream's last event for the session (on a replicated stream
		// a follower may answer the direct gets a heartbeat behind),
		// so the state is never decided short of last; past its tries
		// it is ErrLogUnavailable, and the action is kept (failed
		// closed) and tried again.
		rp := projections.NewReplayerFrom(r.log, s)
		n := 0
		err := r.log.ReadSession(ctx, tenant, session, events.ReadOptions{FromSeq: s.LastSeq + 1}, func(ev events.Event) error {
			if n++; n > r.cfg.MaxRecheck {
				return errTooFar
			}
			_, _, err := rp.Apply(ctx, ev)
			return err
		})
		if errors.Is(err, errTooFar) {
			r.setBehind(k, last)
			r.stale(a, fmt.Sprintf("the log is more than %d events ahead of the state it was decided from", r.cfg.MaxRecheck))
			return false, nil
		}
		if errors.Is(err, events.ErrSessionNotFound) {
			return false, nil // erased meanwhile
		}
		if err != nil {
			return false, err
		}
		s = rp.State()
	}
	actions, _ := r.decide(ctx, s, r.cfg.Clock.Now())
	for _, x := range actions {
		if x.Key == a.Key {
			return true, nil
		}
	}
	// The state it was decided from was stale: judge the session again
	// only once its projection has folded what the log held now.
	r.setBehind(k, max(last, s.LastSeq))
	r.stale(a, fmt.Sprintf("no longer decided at seq %d", s.LastSeq))
	return false, nil
}

// setBehind records that the session's state must reach the log's
// sequence last before the session is judged again.
func (r *Reconciler) setBehind(k string, last uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.behind) >= maxRemembered {
		clear(r.behind)
	}
	if last > r.behind[k] {
		r.behind[k] = last
	}
}

// stale counts and logs an action dropped by current.
func (r *Reconciler) stale(a Action, why string) {
	r.mu.Lock()
	r.staleN++
	r.mu.Unlock()
	ev := r.l.Debug().Str("session", key(a.Command.Tenant, a.Command.Session)).Str("command", a.Command.ID)
	if a.Command.Kind == recovery.KindAbandonTurn {
		ev = ev.Str("turn", a.Command.Turn)
	}
	ev.Msg("decision dropped before it was carried out: " + why)
}

// Stale is how many actions the reconciler decided and then dropped
// before carrying them out because the session's log had moved on
// (docs/policy.md, "Never act on stale state").
func (r *Reconciler) Stale() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.staleN
}
