package test

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/internal/audit"
	"github.com/turnstone-dev/turnstone/internal/enginetest"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
	"github.com/turnstone-dev/turnstone/refruntime"
)

// held is what the stores hold of one session.
type held struct {
	Events, Snapshots, Commands, Statuses, IndexEntries, Rejects int
	InMemory                                                     bool
}

func (h held) empty() bool {
	return h == held{}
}

// holdings reads what every store holds of tenant/session: events,
// snapshots, commands (by subject), command statuses naming it, index
// entries, quarantine records, and whether the projector holds its state.
func holdings(t *testing.T, eng *enginetest.Engine, tenant, session string) held {
	t.Helper()
	ctx := context.Background()
	js := eng.JS
	var h held
	count := func(stream, filter string) int {
		st, err := js.Stream(ctx, stream)
		if err != nil {
			t.Fatalf("stream %s: %v", stream, err)
		}
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(filter))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, c := range info.State.Subjects {
			n += int(c)
		}
		return n
	}
	h.Events = count(events.EventsStream, events.StoredEventSubject(-1, tenant, session))
	h.Snapshots = count(events.SnapshotsStream, events.SnapshotSubject(tenant, session))
	h.Commands = count(recovery.Stream, recovery.CommandSubjectPrefix+".*."+tenant+"."+session)
	h.Rejects = count(ingest.QuarantineStream, ingest.QuarantineSubject(tenant, session))
	sums, err := projections.ReadIndex(ctx, js, projections.IndexFilter{Tenant: tenant})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range sums {
		if m.Session == session {
			h.IndexEntries++
		}
	}
	h.Statuses = len(statusIDs(t, js, tenant, session))
	_, h.InMemory = eng.Projector.Session(tenant, session)
	return h
}

// statusIDs lists the command ids whose status names tenant/session.
func statusIDs(t *testing.T, js jetstream.JetStream, tenant, session string) []string {
	t.Helper()
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, recovery.StatusBucket)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if err != nil {
			continue
		}
		var st recovery.Status
		if json.Unmarshal(e.Value(), &st) == nil && st.Tenant == tenant && st.Session == session {
			ids = append(ids, k)
		}
	}
	return ids
}

// brokenSession runs turns on a session of rt (enough for snapshots), a
// turn whose runtime dies mid-tool, has it abandoned (by hand: the
// reconciler's clock does not move, so turns started later keep their
// deadline) and its orphan repaired by the reconciler and the worker (so
// commands and statuses exist), and has one refused event quarantined
// for it.
func brokenSession(t *testing.T, eng *enginetest.Engine, rt *refruntime.Runtime, nc *nats.Conn, session string) {
	t.Helper()
	ctx := context.Background()
	tenant := rt.Config().Tenant
	for i := 0; i < 3; i++ {
		if r, err := rt.RunTurn(ctx, session, refruntime.TurnSpec{Prompt: "step", Tools: []refruntime.ToolSpec{{Name: "Read"}}}); err != nil || r.Outcome != refruntime.OutcomeCompleted {
			t.Fatalf("%s/%s turn %d: %+v %v", tenant, session, i, r, err)
		}
	}
	r, err := rt.RunTurn(ctx, session, refruntime.TurnSpec{Tools: []refruntime.ToolSpec{{Name: "Bash"}}, Fault: refruntime.FaultCrashMidTool{}})
	if err != nil || r.Outcome != refruntime.OutcomeCrashed {
		t.Fatalf("crash: %+v %v", r, err)
	}
	if _, _, err := recovery.Issue(ctx, eng.JS, recovery.NewCommand(recovery.KindAbandonTurn, tenant, session, r.Turn, "runtime crashed", nil)); err != nil {
		t.Fatal(err)
	}
	eng.Eventually(t, tenant+"/"+session+" repaired", tenant, session, 0, func(s *projections.Session) bool {
		repaired := 0
		for _, o := range s.Orphans {
			if o.Repaired {
				repaired++
			}
		}
		return len(s.InFlight) == 0 && len(s.OrphanedToolUseIDs()) == 0 && repaired > 0
	})
	resp, err := nc.Request(events.EventSubject(tenant, session), []byte(`{"not":"an event"}`), 5*time.Second)
	if err != nil || !strings.Contains(string(resp.Data), `"error"`) {
		t.Fatalf("refused event: %s %v", resp.Data, err)
	}
}

// waitHeld polls until the stores hold what cond wants of the session.
func waitHeld(t *testing.T, eng *enginetest.Engine, tenant, session, what string, cond func(held) bool) held {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		h := holdings(t, eng, tenant, session)
		if cond(h) {
			return h
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/%s: %s not reached: %+v", tenant, session, what, h)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestEraseSessionAndTenant: `engine erase TENANT/SESSION` removes the
// session's events, snapshots, commands, command statuses, index entry and
// quarantine records, and records it in the audit stream; the other
// sessions of the tenant and of other tenants are intact; `inspect` and
// `replay` say it is not found. The engine held the session in memory
// (a turn in flight the reconciler watched): after more appends to the
// other sessions, snapshot cycles and the erased turn's deadline, nothing
// of it comes back. Then `engine erase --tenant` removes a whole tenant.
func TestEraseSessionAndTenant(t *testing.T) {
	skipShort(t, "runs engine processes")
	parallel(t)
	ctx := context.Background()
	eng := enginetest.Start(t, enginetest.Options{SnapshotEvery: 5, RetentionEvery: -1})
	acme := eng.Runtime
	beta := eng.NewRuntime(t, refruntime.Config{Tenant: "beta"})
	nc, err := nats.Connect(eng.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	brokenSession(t, eng, acme, nc, "gone")
	brokenSession(t, eng, acme, nc, "kept")
	brokenSession(t, eng, beta, nc, "other")
	// The erased session has a turn in flight, held in the engine's
	// memory and watched by the reconciler, its deadline not passed.
	if r, err := acme.RunTurn(ctx, "gone", refruntime.TurnSpec{Tools: []refruntime.ToolSpec{{Name: "Bash"}}, Fault: refruntime.FaultCrashMidTool{}}); err != nil || r.Outcome != refruntime.OutcomeCrashed {
		t.Fatalf("crash: %+v %v", r, err)
	}
	before := waitHeld(t, eng, "acme", "gone", "everything stored", func(h held) bool {
		return h.Events > 0 && h.Snapshots > 0 && h.Commands > 0 && h.Statuses > 0 && h.IndexEntries == 1 && h.Rejects == 1 && h.InMemory
	})
	keptBefore := waitHeld(t, eng, "acme", "kept", "everything stored", func(h held) bool {
		return h.Events > 0 && h.Snapshots > 0 && h.Commands > 0 && h.Statuses > 0 && h.IndexEntries == 1 && h.Rejects == 1
	})
	otherBefore := waitHeld(t, eng, "beta", "other", "everything stored", func(h held) bool {
		return h.Events > 0 && h.Snapshots > 0 && h.Commands > 0 && h.Statuses > 0 && h.IndexEntries == 1 && h.Rejects == 1
	})
	ids := statusIDs(t, eng.JS, "acme", "gone")

	out := run(t, eng.URL, "erase", "acme/gone", "--reason", "the user asked (ticket 42)")
	if !strings.Contains(out, "erased acme/gone: 1 sessions") {
		t.Fatalf("erase output: %s", out)
	}
	after := holdings(t, eng, "acme", "gone")
	if !after.empty() {
		t.Fatalf("after the erase acme/gone still holds %+v (before %+v)", after, before)
	}
	for _, args := range [][]string{{"inspect", "acme/gone"}, {"inspect", "acme/gone", "--json"}, {"replay", "acme/gone"}, {"replay", "acme/gone", "--json"}} {
		stdout, stderr, err := runErr(eng.URL, args...)
		if err == nil || !strings.Contains(stderr, "not found") {
			t.Fatalf("engine %s after the erase: err %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, stdout, stderr)
		}
	}
	kv, err := eng.JS.KeyValue(ctx, recovery.StatusBucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if _, err := kv.Get(ctx, id); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("status of %s after the erase: %v", id, err)
		}
		if _, err := recovery.FindCommand(ctx, eng.JS, "acme", "gone", id); !errors.Is(err, recovery.ErrCommandNotFound) {
			t.Fatalf("command %s after the erase: %v", id, err)
		}
	}
	store, _ := projections.NewSnapshotStore(eng.JS, projections.SnapshotConfig{})
	if _, err := store.Load(ctx, "acme", "gone"); !errors.Is(err, projections.ErrNoSnapshot) {
		t.Fatalf("snapshot after the erase: %v", err)
	}
	if got := holdings(t, eng, "acme", "kept"); got != keptBefore {
		t.Fatalf("acme/kept changed by the erase: %+v, was %+v", got, keptBefore)
	}
	if got := holdings(t, eng, "beta", "other"); got != otherBefore {
		t.Fatalf("beta/other changed by the erase: %+v, was %+v", got, otherBefore)
	}

	// The audit record: who, what, why, how much.
	var recs []audit.Record
	if err := json.Unmarshal([]byte(run(t, eng.URL, "audit", "--json")), &recs); err != nil {
		t.Fatal(err)
	}
	var rec *audit.Record
	for i := range recs {
		if recs[i].Action == audit.ActionEraseSession {
			rec = &recs[i]
		}
	}
	if rec == nil || rec.Scope == nil || rec.Scope.Tenant != "acme" || strings.Join(rec.Scope.Sessions, ",") != "gone" ||
		rec.Reason != "the user asked (ticket 42)" || rec.Who == "" || rec.Outcome != audit.OutcomeCompleted || rec.Counts == nil {
		t.Fatalf("audit record: %+v in %+v", rec, recs)
	}
	if c := rec.Counts; c.Sessions != 1 || c.Events < uint64(before.Events) || c.Snapshots == 0 || c.Commands != uint64(before.Commands) ||
		c.Statuses != uint64(before.Statuses) || c.IndexEntries != 1 || c.Rejects != 1 {
		t.Fatalf("audit counts %+v, the stores held %+v", *c, before)
	}

	// Nothing brings it back: more appends to the other sessions (each
	// 5 events a snapshot), index writes, and the erased turn's deadline
	// passing on the reconciler's clock.
	for i := 0; i < 3; i++ {
		if _, err := acme.RunTurn(ctx, "kept", refruntime.TurnSpec{Prompt: "more"}); err != nil {
			t.Fatal(err)
		}
		if _, err := beta.RunTurn(ctx, "other", refruntime.TurnSpec{Prompt: "more"}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 30; i++ {
		eng.Clock.Advance(10 * time.Second)
		time.Sleep(50 * time.Millisecond)
	}
	waitHeld(t, eng, "acme", "kept", "more snapshots", func(h held) bool { return h.Events > keptBefore.Events })
	time.Sleep(1500 * time.Millisecond) // past the index's write period
	if got := holdings(t, eng, "acme", "gone"); !got.empty() {
		t.Fatalf("acme/gone came back: %+v", got)
	}

	// A whole tenant.
	out = run(t, eng.URL, "erase", "--tenant", "beta", "--reason", "contract ended")
	if !strings.Contains(out, "erased beta/*: 2 sessions") { // other, and the tenant's _breakers log when a breaker moved
		if !strings.Contains(out, "erased beta/*: 1 sessions") {
			t.Fatalf("erase --tenant output: %s", out)
		}
	}
	refs, err := eng.Log.Sessions(ctx, "beta")
	if err != nil || len(refs) != 0 {
		t.Fatalf("beta after the erase: %+v %v", refs, err)
	}
	if got := holdings(t, eng, "beta", "other"); !got.empty() {
		t.Fatalf("beta/other after erase --tenant: %+v", got)
	}
	if got := holdings(t, eng, "acme", "kept"); got.Events == 0 || got.Snapshots == 0 || got.Commands == 0 || got.IndexEntries != 1 || got.Rejects != 1 {
		t.Fatalf("acme/kept after erase --tenant beta: %+v", got)
	}
	if err := json.Unmarshal([]byte(run(t, eng.URL, "audit", "--json", "--tenant", "beta")), &recs); err != nil {
		t.Fatal(err)
	}
	if len(recs) == 0 || recs[len(recs)-1].Action != audit.ActionEraseTenant || recs[len(recs)-1].Reason != "contract ended" {
		t.Fatalf("audit of the tenant erase: %+v", recs)
	}

	// A scope that matches nothing (a name cut short, a tenant that does
	// not exist) is refused: exit status 1, nothing erased, and the audit
	// records the refusal.
	for _, c := range []struct {
		args []string
		near string
	}{
		{[]string{"erase", "acme/kep", "--reason", "typo"}, "acme/kept"},
		{[]string{"erase", "--tenant", "nosuch", "--reason", "typo"}, ""},
	} {
		stdout, stderr, err := runErr(eng.URL, c.args...)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(stderr, "nothing erased") || !strings.Contains(stderr, c.near) {
			t.Fatalf("engine %v: %v\nstdout: %s\nstderr: %s", c.args, err, stdout, stderr)
		}
	}
	if got := holdings(t, eng, "acme", "kept"); got.Events == 0 {
		t.Fatalf("acme/kept after a refused erase of acme/kep: %+v", got)
	}
	recs = nil
	if err := json.Unmarshal([]byte(run(t, eng.URL, "audit", "--json")), &recs); err != nil {
		t.Fatal(err)
	}
	refused := 0
	for _, r := range recs {
		if r.Outcome == audit.OutcomeRefused && r.Reason == "typo" && strings.Contains(r.Error, "nothing to erase") {
			refused++
		}
	}
	if refused != 2 {
		t.Fatalf("audit: %d refused erases recorded, want 2: %+v", refused, recs)
	}
}

// TestRetentionErasesOldSessions: a tenant whose policy keeps sessions 15
// seconds loses the sessions whose latest event is older, whole, with an
// audit record of reason "retention"; its young sessions and the sessions
// of a tenant without retention stay.
func TestRetentionErasesOldSessions(t *testing.T) {
	skipShort(t, "waits out a retention of 8 s")
	parallelLong(t)
	ctx := context.Background()
	eng := enginetest.Start(t, enginetest.Options{SnapshotEvery: 5, RetentionEvery: -1, Policy: `
tenants:
  shortlived:
    retention:
      max_age: 15s
`})
	acme := eng.Runtime
	short := eng.NewRuntime(t, refruntime.Config{Tenant: "shortlived"})
	for i := 0; i < 3; i++ {
		if _, err := short.RunTurn(ctx, "old", refruntime.TurnSpec{Prompt: "x", Tools: []refruntime.ToolSpec{{Name: "Read"}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := acme.RunTurn(ctx, "old", refruntime.TurnSpec{Prompt: "x"}); err != nil {
			t.Fatal(err)
		}
	}
	waitHeld(t, eng, "shortlived", "old", "indexed and snapshotted", func(h held) bool { return h.IndexEntries == 1 && h.Snapshots > 0 })
	waitHeld(t, eng, "acme", "old", "indexed", func(h held) bool { return h.IndexEntries == 1 })
	// Past old's retention, then young: its 15 s leave room for the waits
	// below and both sweeps on a loaded machine (the sweep compares the
	// servers' store times with the wall clock; 8 s once fell short).
	time.Sleep(15500 * time.Millisecond)
	if _, err := short.RunTurn(ctx, "young", refruntime.TurnSpec{Prompt: "x"}); err != nil {
		t.Fatal(err)
	}
	young := waitHeld(t, eng, "shortlived", "young", "indexed", func(h held) bool { return h.IndexEntries == 1 })
	// Its snapshot (SnapshotEvery 5) recorded in its log too: the
	// projector appends snapshot.taken after it saves the snapshot, and the
	// comparison below counts events. The projector folds snapshot.taken
	// after it is stored, so the holdings read after that count it.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if s, ok := eng.Projector.Session("shortlived", "young"); ok && s.LastSnapshotSeq != 0 {
			break
		}
		if time.Now().After(deadline) {
			_ = eng.Log.ReadSession(ctx, "shortlived", "young", events.ReadOptions{}, func(ev events.Event) error {
				t.Logf("  young: seq %d %s turn %s", ev.Seq, ev.Type, ev.Turn)
				return nil
			})
			if s, ok := eng.Projector.Session("shortlived", "young"); ok {
				t.Logf("young held: %d events, last snapshot.taken covers seq %d", s.Events, s.LastSnapshotSeq)
			}
			t.Fatal("shortlived/young: no snapshot.taken folded")
		}
	}
	young = holdings(t, eng, "shortlived", "young")
	acmeOld := holdings(t, eng, "acme", "old")

	n, err := eng.Engine.SweepRetention(ctx)
	if err != nil || n != 1 {
		t.Fatalf("sweep: %d erased, %v", n, err)
	}
	if got := holdings(t, eng, "shortlived", "old"); !got.empty() {
		t.Fatalf("shortlived/old past its retention still holds %+v", got)
	}
	// Kept: nothing of it erased (a last event of its turn may still have
	// been on its way when young was read).
	if got := holdings(t, eng, "shortlived", "young"); got.Events < young.Events || got.IndexEntries != 1 {
		t.Fatalf("shortlived/young, within its retention: %+v, was %+v", got, young)
	}
	if got := holdings(t, eng, "acme", "old"); got.Events < acmeOld.Events || got.IndexEntries != 1 {
		t.Fatalf("acme/old, no retention: %+v, was %+v", got, acmeOld)
	}
	recs, err := audit.List(ctx, eng.JS, audit.Filter{Action: audit.ActionRetention})
	if err != nil || len(recs) != 1 {
		t.Fatalf("retention records: %+v %v", recs, err)
	}
	r := recs[0]
	if r.Scope == nil || r.Scope.Tenant != "shortlived" || strings.Join(r.Scope.Sessions, ",") != "old" || !strings.HasPrefix(r.Reason, "retention") ||
		!strings.HasPrefix(r.Who, "engine ") || r.Counts == nil || r.Counts.Events == 0 {
		t.Fatalf("retention record: %+v", r)
	}
	// A second sweep finds nothing more to do.
	if n, err := eng.Engine.SweepRetention(ctx); err != nil || n != 0 {
		t.Fatalf("second sweep: %d, %v", n, err)
	}
}
