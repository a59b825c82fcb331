package test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/internal/audit"
	"github.com/turnstone-dev/turnstone/internal/auth/authtest"
	"github.com/turnstone-dev/turnstone/internal/clock"
	"github.com/turnstone-dev/turnstone/internal/engine"
	"github.com/turnstone-dev/turnstone/internal/erasure"
	"github.com/turnstone-dev/turnstone/internal/presence"
	"github.com/turnstone-dev/turnstone/internal/reconciler"
	"github.com/turnstone-dev/turnstone/internal/worker"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
	"github.com/turnstone-dev/turnstone/refruntime"
)

// authEnv is a server with auth on and Turnstone running on it the way
// `engine serve --auth` runs it: set up by the operator, an engine and a
// worker with their own identities and nothing but their permissions,
// and the reference runtime of tenant acme with acme's.
type authEnv struct {
	srv    *authtest.Server
	opJS   jetstream.JetStream
	opLog  *events.Log
	eng    *engine.Engine
	worker *worker.Worker
	clock  *clock.FakeClock
	rt     *refruntime.Runtime
}

func startAuthEnv(t *testing.T) *authEnv {
	t.Helper()
	return startAuthEnvWith(t, "", nil)
}

// startAuthEnvWith is startAuthEnv with more lines of auth spec (extra)
// and the engine's policy (nil: the default).
func startAuthEnvWith(t *testing.T, extra string, policy *reconciler.Policy) *authEnv {
	t.Helper()
	ctx := context.Background()
	srv := authtest.Start(t, []string{"acme", "globex"}, extra)
	op := srv.Connect(t, "operator")
	opJS, _ := jetstream.New(op)
	opLog, err := engine.Setup(ctx, opJS, engine.SetupConfig{Delivery: recovery.DeliveryConfig{AckWait: 5 * time.Second}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFakeClock(time.Now())
	cfg := engine.Config{UseExisting: true, Clock: clk, RetentionEvery: -1,
		Presence: presence.Config{Tenants: srv.Spec.Tenants, Interval: 200 * time.Millisecond, Wait: 200 * time.Millisecond}}
	if policy != nil {
		cfg.Policy = policy
	}
	eng, err := engine.Open(ctx, srv.Connect(t, "engine"), cfg, nil)
	if err != nil {
		t.Fatalf("engine with the engine role: %v\n%s", err, srv)
	}
	wnc := srv.Connect(t, "worker")
	wjs, _ := jetstream.New(wnc)
	wlog, err := events.Open(ctx, wjs, events.Config{UseExisting: true}, nil)
	if err != nil {
		t.Fatalf("worker's log: %v\n%s", err, srv)
	}
	wclock := clock.NewFakeClock(time.Now())
	wclock.SetAutoAdvance(true)
	w, err := worker.New(wnc, wlog, worker.Config{Name: "w", Clock: wclock, ControlTimeout: 2 * time.Second,
		Delivery: recovery.DeliveryConfig{AckWait: 5 * time.Second}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Open(ctx); err != nil {
		t.Fatalf("worker with the worker role: %v\n%s", err, srv)
	}
	tnc := srv.Connect(t, "acme")
	client, err := ingest.NewClient(tnc, ingest.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	rt, err := refruntime.New(tnc, client, refruntime.Config{Tenant: "acme"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Open(ctx); err != nil {
		t.Fatalf("runtime with acme's role: %v\n%s", err, srv)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = rt.Close(c)
		_ = w.Close(c)
		_ = eng.Close(c)
		// Turnstone's own processes needed nothing their roles deny, to
		// their close (the attempts of the denial table connect under
		// other names).
		for _, v := range srv.Violations() {
			if strings.Contains(v, "turnstone-test ") {
				t.Errorf("permission violation of a role doing its work: %s", v)
			}
		}
	})
	return &authEnv{srv: srv, opJS: opJS, opLog: opLog, eng: eng, worker: w, clock: clk, rt: rt}
}

// TestAuthRolesRepairACrashedSession: with auth on, the engine, the
// worker and acme's runtime each with its own identity, a session whose
// runtime crashed mid-tool is abandoned and repaired by the reconciler
// and the worker, and no role needed a subject its permissions deny.
func TestAuthRolesRepairACrashedSession(t *testing.T) {
	skipShort(t, "runs every role as a process under auth")
	parallel(t)
	e := startAuthEnv(t)
	ctx := context.Background()
	session := "crash-1"
	if _, err := e.rt.RunTurn(ctx, session, refruntime.TurnSpec{Tools: []refruntime.ToolSpec{{Name: "Read"}}}); err != nil {
		t.Fatal(err)
	}
	res, err := e.rt.RunTurn(ctx, session, refruntime.TurnSpec{Tools: []refruntime.ToolSpec{{Name: "Bash"}}, Fault: refruntime.FaultCrashMidTool{}})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(40 * time.Second)
	var s *projections.Session
	for time.Now().Before(deadline) {
		s, err = projections.Restore(ctx, e.opLog, nil, "acme", session)
		if err != nil {
			t.Fatal(err)
		}
		if s.InFlightTurn() == nil && len(s.OrphanedToolUseIDs()) == 0 && len(s.Orphans) > 0 && len(s.Commands) >= 2 {
			break
		}
		e.clock.Advance(30 * time.Second)
		time.Sleep(50 * time.Millisecond)
	}
	if s.InFlightTurn() != nil || len(s.OrphanedToolUseIDs()) != 0 || len(s.Orphans) == 0 {
		t.Fatalf("crashed turn %s: in flight %v, orphans %v\n%s", res.Turn, s.InFlight, s.OrphanedToolUseIDs(), e.srv)
	}
	if v := e.srv.Violations(); len(v) > 0 {
		t.Fatalf("permission violations:\n%s", strings.Join(v, "\n"))
	}
}

// TestAuthEraseAndRetention: with auth on (and `retention: true` in the
// spec), the operator erases one of acme's sessions while the engine and
// the worker run with their roles (each must hear the erase notice and
// confirm it), and the engine's retention sweep erases the rest of acme's
// sessions past their max age (purging with the engine's own
// permissions); no role needed a subject its permissions deny, and
// globex's session is kept. Without `retention: true` the engine may not
// purge (TestAuthDenialTable).
func TestAuthEraseAndRetention(t *testing.T) {
	skipShort(t, "runs roles as processes under auth")
	parallel(t)
	policy, err := reconciler.ParsePolicy([]byte("tenants:\n  acme:\n    retention:\n      max_age: 1s\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := startAuthEnvWith(t, "retention: true\n", policy)
	ctx := context.Background()
	for _, s := range []string{"erase-me", "expire-me"} {
		if _, err := e.rt.RunTurn(ctx, s, refruntime.TurnSpec{Tools: []refruntime.ToolSpec{{Name: "Read"}}}); err != nil {
			t.Fatal(err)
		}
	}
	gnc := e.srv.Connect(t, "globex")
	gclient, err := ingest.NewClient(gnc, ingest.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	grt, err := refruntime.New(gnc, gclient, refruntime.Config{Tenant: "globex"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := grt.RunTurn(ctx, "kept", refruntime.TurnSpec{}); err != nil {
		t.Fatal(err)
	}
	count := func(tenant, session string) int {
		n := 0
		_ = e.opLog.ReadSession(ctx, tenant, session, events.ReadOptions{}, func(events.Event) error { n++; return nil })
		return n
	}
	if count("acme", "erase-me") == 0 || count("acme", "expire-me") == 0 {
		t.Fatal("the turns were not stored")
	}
	rec, err := engine.Erase(ctx, e.srv.Connect(t, "operator"), engine.EraseRequest{
		Scope: erasure.Scope{Tenant: "acme", Sessions: []string{"erase-me"}}, Reason: "the auth test", Who: "operator",
		Action: audit.ActionEraseSession})
	if err != nil {
		t.Fatalf("erase as the operator: %v\n%s", err, e.srv)
	}
	if rec.Counts == nil || rec.Counts.Events == 0 || count("acme", "erase-me") != 0 {
		t.Fatalf("erase removed %+v; %d events left", rec.Counts, count("acme", "erase-me"))
	}
	// Retention: once expire-me's latest event is older than 1 s and in
	// the fleet index, the engine's sweep erases it.
	deadline := time.Now().Add(20 * time.Second)
	for count("acme", "expire-me") > 0 && time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
		if _, err := e.eng.SweepRetention(ctx); err != nil {
			t.Fatalf("retention sweep with the engine's role: %v\n%s", err, e.srv)
		}
	}
	if n := count("acme", "expire-me"); n != 0 {
		t.Fatalf("retention left %d events of acme/expire-me", n)
	}
	if count("globex", "kept") == 0 {
		t.Fatal("globex's session was erased with acme's")
	}
	if v := e.srv.Violations(); len(v) > 0 {
		t.Fatalf("permission violations:\n%s", strings.Join(v, "\n"))
	}
}

// TestAuthRolesCleanUpTheirOrderedConsumers: under auth, the engine's
// and the worker's ordered (ephemeral) consumers on AGENT_EVENTS re-create
// themselves when theirs goes away, and nats.go deletes the one left
// behind: each role may delete an ephemeral consumer of that stream (it
// knows only its own: the roles may not list consumers), never a durable
// one, so no role is asked to do what it may not (issue 21).
func TestAuthRolesCleanUpTheirOrderedConsumers(t *testing.T) {
	skipShort(t, "runs every role as a process under auth")
	parallel(t)
	e := startAuthEnv(t)
	ctx := context.Background()
	st, err := e.opJS.Stream(ctx, events.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	// The operator deletes every ephemeral consumer of AGENT_EVENTS (the
	// worker's follow of the breakers, at least): each comes back, and
	// its owner deletes the one it left behind.
	ephemeral := func() []string {
		var out []string
		names := st.ConsumerNames(ctx)
		for n := range names.Name() {
			if !strings.HasPrefix(n, projections.DefaultDurable) {
				out = append(out, n)
			}
		}
		return out
	}
	gone := ephemeral()
	if len(gone) == 0 {
		t.Fatal("no ephemeral consumer: want at least the worker's follow of the breakers")
	}
	for _, n := range gone {
		if err := st.DeleteConsumer(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if now := ephemeral(); len(now) >= len(gone) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ordered consumers did not come back: %v (had %v)", ephemeral(), gone)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// nats.go deletes the old consumer on a goroutine once the new one
	// exists: give it the time of one request.
	time.Sleep(500 * time.Millisecond)
	if v := e.srv.Violations(); len(v) > 0 {
		t.Fatalf("permission violations:\n%s", strings.Join(v, "\n"))
	}
	// A role still may not delete a durable consumer.
	for _, role := range []string{"engine", "worker"} {
		nc := e.srv.Connect(t, role, nats.Name("turnstone-attempt "+role), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		js, _ := jetstream.New(nc)
		if err := js.DeleteConsumer(ctx, events.EventsStream, projections.ProjectorConsumerName("", 0)); err == nil {
			t.Fatalf("%s deleted a projector consumer", role)
		}
	}
}
