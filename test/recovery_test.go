package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/clock"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/internal/engine"
	"github.com/turnstone-dev/turnstone/internal/worker"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
	"github.com/turnstone-dev/turnstone/refruntime"
)

type recoveryEnv struct {
	t   *testing.T
	js  jetstream.JetStream
	log *events.Log
	rt  *refruntime.Runtime
	kv  jetstream.KeyValue
}

// newRecoveryEnv starts an embedded server, the reference runtime and two
// workers, all in this process but over real NATS connections.
func newRecoveryEnv(t *testing.T) *recoveryEnv {
	t.Helper()
	srv := embeddedtest.Start(t)
	ctx := context.Background()
	nc, js := embeddedtest.Connect(t, srv)
	// Set up as an operator does (engine setup): the workers create
	// nothing, and expect these delivery settings.
	delivery := recovery.DeliveryConfig{AckWait: 5 * time.Second, PinnedTTL: 2 * time.Second}
	log, err := engine.Setup(ctx, js, engine.SetupConfig{Delivery: delivery}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rtnc, _ := embeddedtest.Connect(t, srv)
	rt, err := refruntime.New(rtnc, log, refruntime.Config{Tenant: "demo", Providers: []string{"anthropic", "bedrock"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close(context.Background()) })
	clk := clock.NewFakeClock(time.Now())
	clk.SetAutoAdvance(true) // back-off waits pass at once
	for i := 0; i < 2; i++ {
		w, err := worker.New(nc, log, worker.Config{
			Name: fmt.Sprintf("w%d", i), Clock: clk, ControlTimeout: 3 * time.Second,
			Delivery: delivery,
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Open(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Close(context.Background()) })
	}
	kv, err := js.KeyValue(ctx, recovery.StatusBucket)
	if err != nil {
		t.Fatal(err)
	}
	return &recoveryEnv{t: t, js: js, log: log, rt: rt, kv: kv}
}

func (e *recoveryEnv) state(session string) *projections.Session {
	e.t.Helper()
	s, err := projections.Restore(context.Background(), e.log, nil, "demo", session)
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// issue publishes a command and waits for its final status.
func (e *recoveryEnv) issue(kind recovery.Kind, session, turn string, p recovery.Params) recovery.Status {
	e.t.Helper()
	ctx := context.Background()
	last, err := e.log.LastSeq(ctx, "demo", session)
	if err != nil {
		e.t.Fatal(err)
	}
	c := recovery.NewCommand(kind, "demo", session, turn, "test: "+string(kind), []uint64{last})
	c.Params = p
	if _, _, err := recovery.Issue(ctx, e.js, c); err != nil {
		e.t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		en, err := e.kv.Get(ctx, c.ID)
		if err == nil {
			var st recovery.Status
			_ = json.Unmarshal(en.Value(), &st)
			if st.State == recovery.StateCompleted || st.State == recovery.StateParked {
				return st
			}
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			e.t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.t.Fatalf("%s on %s did not finish", kind, session)
	return recovery.Status{}
}

// dump logs the session's timeline, for failures.
func (e *recoveryEnv) dump(session string) {
	_ = e.log.ReadSession(context.Background(), "demo", session, events.ReadOptions{}, func(ev events.Event) error {
		e.t.Logf("%6d %-22s %s", ev.Seq, ev.Type, ev.Summary())
		return nil
	})
}

func (e *recoveryEnv) turn(session string, spec refruntime.TurnSpec) refruntime.TurnResult {
	e.t.Helper()
	res, err := e.rt.RunTurn(context.Background(), session, spec)
	if err != nil {
		e.t.Fatal(err)
	}
	return res
}

// TestReferenceRuntimeOrphanIsRepaired: the runtime crashes between a
// tool_use and its result; the turn is abandoned, which declares the
// orphan; a worker repairs it, and the history is valid for the model API
// again (a distillation over it is clean).
func TestReferenceRuntimeOrphanIsRepaired(t *testing.T) {
	parallel(t)
	e := newRecoveryEnv(t)
	e.turn("crash", refruntime.TurnSpec{Tools: []refruntime.ToolSpec{{Name: "Read"}}})
	res := e.turn("crash", refruntime.TurnSpec{
		Tools: []refruntime.ToolSpec{{Name: "Bash"}, {Name: "Grep"}},
		Fault: refruntime.FaultCrashMidTool{},
	})
	s := e.state("crash")
	if len(s.Pending) != 2 || s.InFlightTurn() == nil {
		t.Fatalf("after the crash: pending %v, in flight %v", s.Pending, s.InFlight)
	}
	if st := e.issue(recovery.KindAbandonTurn, "crash", res.Turn, recovery.Params{}); st.Outcome != events.OutcomeRecovered {
		t.Fatalf("abandon: %+v", st)
	}
	if n := e.rt.Notices("crash"); len(n) != 1 || !strings.Contains(n[0].Notice, "abandoned") {
		t.Fatalf("the runtime was not told the turn was abandoned: %+v", n)
	}
	s = e.state("crash")
	orphans := s.OrphanedToolUseIDs()
	if strings.Join(orphans, ",") != strings.Join(res.ToolUseIDs, ",") {
		t.Fatalf("orphans %v, want the crashed turn's %v", orphans, res.ToolUseIDs)
	}
	if st := e.issue(recovery.KindRepairOrphans, "crash", "", recovery.Params{}); st.Outcome != events.OutcomeRecovered {
		t.Fatalf("repair: %+v", st)
	}
	s = e.state("crash")
	if len(s.OrphanedToolUseIDs()) != 0 || s.Status() == projections.StatusBroken {
		t.Fatalf("after repair: orphans %v, status %s, violations %+v", s.OrphanedToolUseIDs(), s.Status(), s.Violations)
	}
	// The history is clean: the runtime agrees to distil it.
	if st := e.issue(recovery.KindDistill, "crash", "", recovery.Params{}); st.Outcome != events.OutcomeRecovered {
		e.dump("crash")
		t.Fatalf("distill after repair: %+v", st)
	}
	s = e.state("crash")
	last := s.Distillations[len(s.Distillations)-1]
	if !last.Clean || last.CompletedSeq == 0 {
		t.Fatalf("distillation after repair: %+v", last)
	}
	// And the session works again.
	if r := e.turn("crash", refruntime.TurnSpec{}); r.Outcome != refruntime.OutcomeCompleted {
		t.Fatalf("next turn: %+v", r)
	}
}

// TestReferenceRuntimeFaultsEndInRecordedOutcomes drives each fault the
// reference runtime knows through the command a reconciler would issue.
func TestReferenceRuntimeFaultsEndInRecordedOutcomes(t *testing.T) {
	parallel(t)
	e := newRecoveryEnv(t)

	// 529 overloaded: retry works once the provider is back.
	res := e.turn("overload", refruntime.TurnSpec{Fault: refruntime.FaultProvider{Status: 529}})
	if st := e.issue(recovery.KindRetryTurn, "overload", res.Turn, recovery.Params{}); st.Outcome != events.OutcomeRecovered {
		t.Fatalf("retry after 529: %+v", st)
	}

	// A provider down for good: retries fail, the chain switches provider.
	if err := e.rt.SetProviderOutage("anthropic", 529, 0); err != nil {
		t.Fatal(err)
	}
	res = e.turn("outage", refruntime.TurnSpec{})
	if res.Outcome != refruntime.OutcomeFailed {
		t.Fatalf("turn during the outage: %+v", res)
	}
	st := e.issue(recovery.KindRetryTurn, "outage", res.Turn, recovery.Params{})
	if st.Outcome != events.OutcomeRecovered || e.rt.Provider("outage") == "anthropic" {
		e.dump("outage")
		t.Fatalf("retry during the outage: %+v, provider %s", st, e.rt.Provider("outage"))
	}
	e.rt.ClearProviderOutage("anthropic")

	// 401: needs a person; the session is paused, the outcome failed.
	res = e.turn("auth", refruntime.TurnSpec{Fault: refruntime.FaultProvider{Status: 401}})
	st = e.issue(recovery.KindRetryTurn, "auth", res.Turn, recovery.Params{})
	if st.Outcome != events.OutcomeFailed || !e.state("auth").Paused {
		t.Fatalf("401: %+v, paused %v", st, e.state("auth").Paused)
	}
	for _, q := range e.rt.Requests("auth") {
		if q.Action == recovery.ActionRetryTurn {
			t.Fatalf("an authentication error was retried: %+v", q)
		}
	}

	// A stage that throws, then the turn is retried.
	res = e.turn("throws", refruntime.TurnSpec{Fault: refruntime.FaultStageThrows{Stage: events.StageHistory}})
	if s := e.state("throws"); s.Turn(res.Turn).FailedStage != events.StageHistory {
		t.Fatalf("failed stage: %+v", s.Turn(res.Turn))
	}
	if st := e.issue(recovery.KindRetryTurn, "throws", res.Turn, recovery.Params{}); st.State != recovery.StateCompleted {
		t.Fatalf("retry after a throw: %+v", st)
	}

	// A hang: the turn is abandoned, naming the last stage it reached.
	res = e.turn("hang", refruntime.TurnSpec{Fault: refruntime.FaultHang{}})
	if st := e.issue(recovery.KindAbandonTurn, "hang", res.Turn, recovery.Params{}); st.Outcome != events.OutcomeRecovered {
		t.Fatalf("abandon a hung turn: %+v", st)
	}
	if tn := e.state("hang").Turn(res.Turn); tn.Status != projections.TurnAbandoned || tn.LastStage != events.StageContext {
		t.Fatalf("hung turn: %+v", tn)
	}

	// The runtime is down: not retried blindly, paused with the reason.
	if err := e.rt.SetMode(context.Background(), refruntime.ModeDown); err != nil {
		t.Fatal(err)
	}
	st = e.issue(recovery.KindSwitchProvider, "overload", "", recovery.Params{})
	if st.Outcome != events.OutcomeFailed || !e.state("overload").Paused {
		t.Fatalf("runtime down: %+v", st)
	}

	// Every attempt is in the log, with its outcome, for replay.
	for _, session := range []string{"overload", "outage", "auth", "throws", "hang"} {
		s := e.state(session)
		if len(s.Commands) == 0 {
			t.Fatalf("%s: no command recorded", session)
		}
		for _, c := range s.Commands {
			if c.Outcome == "" || c.Attempts == 0 {
				t.Errorf("%s: command %s has no recorded outcome or attempt: %+v", session, c.ID, c)
			}
		}
	}
}
