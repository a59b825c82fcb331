package test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/auth/authtest"
	"github.com/turnstone-dev/turnstone/engine"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/presence"
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
	worker *recovery.Worker
	clock  *recovery.FakeClock
	rt     *refruntime.Runtime
}

func startAuthEnv(t *testing.T) *authEnv {
	t.Helper()
	ctx := context.Background()
	srv := authtest.Start(t, []string{"acme", "globex"}, "")
	op := srv.Connect(t, "operator")
	opJS, _ := jetstream.New(op)
	opLog, err := engine.Setup(ctx, opJS, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	clock := recovery.NewFakeClock(time.Now())
	eng, err := engine.Open(ctx, srv.Connect(t, "engine"), engine.Config{UseExisting: true, Clock: clock,
		Presence: presence.Config{Tenants: srv.Spec.Tenants, Interval: 200 * time.Millisecond, Wait: 200 * time.Millisecond}}, nil)
	if err != nil {
		t.Fatalf("engine with the engine role: %v\n%s", err, srv)
	}
	wnc := srv.Connect(t, "worker")
	wjs, _ := jetstream.New(wnc)
	wlog, err := events.Open(ctx, wjs, events.Config{UseExisting: true}, nil)
	if err != nil {
		t.Fatalf("worker's log: %v\n%s", err, srv)
	}
	wclock := recovery.NewFakeClock(time.Now())
	wclock.SetAutoAdvance(true)
	w, err := recovery.NewWorker(wnc, wlog, recovery.WorkerConfig{Name: "w", Clock: wclock, ControlTimeout: 2 * time.Second, UseExisting: true,
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
	return &authEnv{srv: srv, opJS: opJS, opLog: opLog, eng: eng, worker: w, clock: clock, rt: rt}
}

// TestAuthRolesRepairACrashedSession: with auth on, the engine, the
// worker and acme's runtime each with its own identity, a session whose
// runtime crashed mid-tool is abandoned and repaired by the reconciler
// and the worker, and no role needed a subject its permissions deny.
func TestAuthRolesRepairACrashedSession(t *testing.T) {
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
