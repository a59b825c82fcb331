package reconciler_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/clock"
	"github.com/turnstone-dev/turnstone/internal/enginetest"
	"github.com/turnstone-dev/turnstone/internal/reconciler"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
	"github.com/turnstone-dev/turnstone/refruntime"
)

// env is an engine in a test (enginetest) with helpers for the tenant
// "acme".
type env struct {
	*enginetest.Engine
	t     *testing.T
	js    jetstream.JetStream
	log   *events.Log
	rec   *reconciler.Reconciler
	clock *clock.FakeClock
	rt    *refruntime.Runtime
}

func newEnv(t *testing.T, policyYAML string, logCfg events.Config) *env {
	t.Helper()
	e := enginetest.Start(t, enginetest.Options{Policy: policyYAML, Log: logCfg,
		Runtime: refruntime.Config{Providers: []string{"anthropic", "bedrock"}, AdoptUnknown: true}})
	return &env{Engine: e, t: t, js: e.JS, log: e.Log, rec: e.Reconciler, clock: e.Clock, rt: e.Runtime}
}

func (e *env) state(session string) *projections.Session { return e.State(e.t, "acme", session) }

// waitHealthy advances the reconciler's clock a second at a time (its
// ticks: probes and retries) until Healthy reports it failed closed
// (closed) or open (!closed), for up to 10 s; the caller checks Healthy.
func (e *env) waitHealthy(closed bool) {
	deadline := time.Now().Add(10 * time.Second)
	for (e.rec.Healthy() != nil) != closed && time.Now().Before(deadline) {
		e.clock.Advance(time.Second)
		time.Sleep(30 * time.Millisecond)
	}
}

func (e *env) eventually(what string, step time.Duration, cond func(*projections.Session) bool, session string) *projections.Session {
	e.t.Helper()
	return e.Eventually(e.t, what, "acme", session, step, cond)
}

func (e *env) append(session, turn string, p events.Payload) uint64 {
	e.t.Helper()
	ev, err := events.New("acme", session, turn, p)
	if err != nil {
		e.t.Fatal(err)
	}
	acks, err := e.log.Append(context.Background(), []events.Event{ev})
	if err != nil {
		e.t.Fatal(err)
	}
	return acks[0].Seq
}

// commands returns the kinds of the commands issued for a session, in
// order.
func (e *env) commands(session string) []string {
	e.t.Helper()
	ctx := context.Background()
	st, err := e.js.Stream(ctx, recovery.Stream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	var kinds []string
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		var c recovery.Command
		if json.Unmarshal(m.Data, &c) == nil && c.Session == session {
			kinds = append(kinds, string(c.Kind))
		}
	}
	return kinds
}

func commandOutcome(s *projections.Session, kind string) events.Outcome {
	for _, c := range s.Commands {
		if c.Kind == kind {
			if c.Parked {
				return "parked"
			}
			return c.Outcome
		}
	}
	return ""
}

func TestDeadlineAbandonsASilentTurn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "turn_deadline: 120s", events.Config{})
	res, err := e.rt.RunTurn(context.Background(), "hang", refruntime.TurnSpec{Fault: refruntime.FaultHang{}})
	if err != nil {
		t.Fatal(err)
	}
	// Not before the deadline.
	e.clock.Advance(60 * time.Second)
	time.Sleep(200 * time.Millisecond)
	if tn := e.state("hang").Turn(res.Turn); tn.Status != projections.TurnInFlight {
		t.Fatalf("abandoned before its deadline: %+v", tn)
	}
	s := e.eventually("abandoned after the deadline", 30*time.Second, func(s *projections.Session) bool {
		return s.Turn(res.Turn).Status == projections.TurnAbandoned
	}, "hang")
	tn := s.Turn(res.Turn)
	if tn.LastStage != events.StageContext || !strings.Contains(tn.Reason, "last stage completed: context") {
		t.Fatalf("abandoned turn: %+v", tn)
	}
	// The worker records the abandon, then tells the runtime.
	deadline := time.Now().Add(10 * time.Second)
	for len(e.rt.Notices("hang")) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := e.rt.Notices("hang"); len(n) == 0 || !strings.Contains(n[0].Notice, "abandoned") {
		t.Fatalf("the runtime was not told: %+v", n)
	}
}

func TestOrphanIsRepairedOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", events.Config{})
	ctx := context.Background()
	res, err := e.rt.RunTurn(ctx, "crash", refruntime.TurnSpec{Fault: refruntime.FaultCrashMidTool{}})
	if err != nil {
		t.Fatal(err)
	}
	// The runtime, restarted, ends the crashed turn as failed.
	e.append("crash", res.Turn, &events.TurnFailed{Stage: events.StageExecute, Error: events.ErrorInfo{Message: "process restarted", Kind: events.KindUnknown}})
	e.eventually("repaired", time.Second, func(s *projections.Session) bool {
		return len(s.OrphanedToolUseIDs()) == 0 && commandOutcome(s, "repair_orphans") == events.OutcomeRecovered
	}, "crash")
	// More judgements (ticks, events) issue nothing new.
	e.append("crash", "", &events.SessionResumed{Reason: "nudge"})
	e.clock.Advance(5 * time.Second)
	time.Sleep(300 * time.Millisecond)
	if got := e.commands("crash"); strings.Count(strings.Join(got, " "), "repair_orphans") != 1 {
		t.Fatalf("commands %v: want one repair", got)
	}
}

func TestDistillationIsGuardedThenRunsWhenClean(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "turn_deadline: 30s", events.Config{})
	ctx := context.Background()
	if _, err := e.rt.RunTurn(ctx, "d", refruntime.TurnSpec{}); err != nil {
		t.Fatal(err)
	}
	res, err := e.rt.RunTurn(ctx, "d", refruntime.TurnSpec{Fault: refruntime.FaultHang{}})
	if err != nil {
		t.Fatal(err)
	}
	e.append("d", "", &events.DistillationRequested{Reason: "context 90% full"})
	s := e.eventually("skipped while the turn is in flight", 500*time.Millisecond, func(s *projections.Session) bool {
		return len(s.Distillations) > 0 && s.Distillations[len(s.Distillations)-1].Skipped != ""
	}, "d")
	if got := s.Distillations[len(s.Distillations)-1].Skipped; got != projections.DirtyTurnInFlight {
		t.Fatalf("skipped with %q, want %q", got, projections.DirtyTurnInFlight)
	}
	// The hung turn passes its deadline and is abandoned; then the
	// deferred distillation runs as a command, and the runtime distils.
	e.eventually("distilled after the turn ended", 5*time.Second, func(s *projections.Session) bool {
		d := s.Distillations[len(s.Distillations)-1]
		return s.Turn(res.Turn).Status == projections.TurnAbandoned && d.CompletedSeq != 0 && d.Clean
	}, "d")
}

func TestTransientErrorRetriesThenPausesRecommendingASwitch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", events.Config{})
	if err := e.rt.SetProviderOutage("anthropic", 529, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.RunTurn(context.Background(), "t529", refruntime.TurnSpec{}); err != nil {
		t.Fatal(err)
	}
	s := e.eventually("paused after two retries", time.Second, func(s *projections.Session) bool {
		return s.Paused && commandOutcome(s, "retry_turn") == events.OutcomeFailed
	}, "t529")
	if !strings.Contains(s.PauseReason, "switch provider") {
		t.Fatalf("pause reason %q does not recommend a provider switch", s.PauseReason)
	}
	retries := 0
	for _, q := range e.rt.Requests("t529") {
		if q.Action == recovery.ActionRetryTurn {
			retries++
		}
	}
	if retries != 2 {
		t.Fatalf("%d retries, want 2", retries)
	}
}

func TestAuthenticationErrorBlocksTheSession(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", events.Config{})
	if _, err := e.rt.RunTurn(context.Background(), "t401", refruntime.TurnSpec{Fault: refruntime.FaultProvider{Status: 401}}); err != nil {
		t.Fatal(err)
	}
	s := e.eventually("paused for manual input", time.Second, func(s *projections.Session) bool { return s.Paused }, "t401")
	if !strings.Contains(s.PauseReason, "credentials") {
		t.Fatalf("pause reason %q", s.PauseReason)
	}
	for _, q := range e.rt.Requests("t401") {
		if q.Action == recovery.ActionRetryTurn {
			t.Fatal("an authentication error was retried")
		}
	}
}

func TestParseFailureDegradesToRawOutput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", events.Config{})
	if _, err := e.rt.RunTurn(context.Background(), "parse", refruntime.TurnSpec{}); err != nil {
		t.Fatal(err)
	}
	e.append("parse", "t-parse", &events.TurnStarted{Prompt: "give me JSON"})
	e.append("parse", "t-parse", &events.TurnFailed{Stage: events.StageFinalize, Error: events.ErrorInfo{
		Message: "structured output: invalid character 'H' looking for beginning of value", Kind: events.KindLogic, Code: "parse_error"}})
	e.eventually("degraded", time.Second, func(s *projections.Session) bool {
		return commandOutcome(s, "retry_turn") == events.OutcomeDegraded
	}, "parse")
}

func TestLoopsAndBudgets(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", events.Config{})
	text := func(s string) []events.ContentBlock { return []events.ContentBlock{{Type: "text", Text: s}} }

	// The same error three times in a row pivots the strategy.
	e.append("errs", "", &events.SessionStarted{})
	for i := 0; i < 3; i++ {
		e.append("errs", "", &events.ErrorRecorded{ErrorInfo: events.ErrorInfo{Message: "tool crashed: exit 1", Kind: events.KindLogic}, Consecutive: i + 1})
	}
	e.eventually("pivoted on the error streak", time.Second, func(s *projections.Session) bool {
		return commandOutcome(s, "pivot_strategy") == events.OutcomeRecovered
	}, "errs")
	if got := e.rt.Strategy("errs"); got == "" {
		t.Fatal("the runtime was not told to pivot")
	}

	// The same output three times in a row halts the loop: paused, with
	// the evidence.
	e.append("loop", "", &events.SessionStarted{})
	// The same answer to the same input: a loop (the same answer to
	// inputs that differ would not be).
	for range 3 {
		e.append("loop", "", &events.MessageAppended{Role: events.RoleUser, Content: text("try again")})
		e.append("loop", "", &events.MessageAppended{Role: events.RoleAssistant, Content: text("I'll try the same fix again.")})
	}
	// An assistant message counts once it is complete: when the next
	// message arrives.
	e.append("loop", "", &events.MessageAppended{Role: events.RoleUser, Content: text("try again")})
	s := e.eventually("paused on the output loop", time.Second, func(s *projections.Session) bool { return s.Paused }, "loop")
	if !strings.Contains(s.PauseReason, "same assistant output 3 times") {
		t.Fatalf("pause reason %q", s.PauseReason)
	}

	// A turn that spends its implementation budget pivots: the same
	// command failing ten times in a row (another description each time).
	e.append("budget", "", &events.SessionStarted{})
	e.append("budget", "b1", &events.TurnStarted{Prompt: "fix the build"})
	e.append("budget", "b1", &events.MessageAppended{Role: events.RoleUser, Content: text("fix the build")})
	for i := 0; i < 10; i++ {
		id := fmt.Sprintf("toolu_b%d", i)
		e.append("budget", "b1", &events.MessageAppended{Role: events.RoleAssistant, Content: []events.ContentBlock{
			{Type: "tool_use", ID: id, Name: "Bash", Input: json.RawMessage(fmt.Sprintf(`{"command":"make","description":"attempt %d"}`, i))}}})
		content, _ := json.Marshal(fmt.Sprintf("build failed (%d)", i))
		e.append("budget", "b1", &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{
			{Type: "tool_result", ToolUseID: id, IsError: true, Content: content}}})
	}
	e.eventually("pivoted on the spent budget", time.Second, func(s *projections.Session) bool {
		return commandOutcome(s, "pivot_strategy") == events.OutcomeRecovered
	}, "budget")
}

func TestFailsClosedWhileTheLogIsFullAndCarriesOn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "turn_deadline: 10s", events.Config{MaxBytes: 256 << 10, MaxEventBytes: 64 << 10})
	ctx := context.Background()
	res, err := e.rt.RunTurn(ctx, "full", refruntime.TurnSpec{Fault: refruntime.FaultHang{}})
	if err != nil {
		t.Fatal(err)
	}
	// Fill the stream to within one event of its limit.
	filler := strings.Repeat("x", 16<<10)
	for {
		ev, _ := events.New("acme", "filler", "", &events.SessionPaused{Reason: filler})
		if _, err := e.log.Append(ctx, []events.Event{ev}); err != nil {
			break
		}
	}
	e.clock.Advance(time.Minute)
	e.waitHealthy(true)
	if err := e.rec.Healthy(); err == nil || !strings.Contains(err.Error(), "full") {
		t.Fatalf("Healthy() = %v, want failed closed because the stream is full", err)
	}
	if got := e.commands("full"); len(got) != 0 {
		t.Fatalf("commands issued while failed closed: %v", got)
	}
	// Room again: the reconciler carries on, and the turn is abandoned.
	st, _ := e.js.Stream(ctx, events.EventsStream)
	cfg := st.CachedInfo().Config
	cfg.MaxBytes = 64 << 20
	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	e.eventually("abandoned once the log is writable", time.Second, func(s *projections.Session) bool {
		return s.Turn(res.Turn).Status == projections.TurnAbandoned
	}, "full")
	if err := e.rec.Healthy(); err != nil {
		t.Fatalf("still failed closed: %v", err)
	}
}

// The reconciler fails closed on an action it cannot write, and that
// action then turns moot (the turn it would abandon completes): no write
// is left to retry, so the probe decides again, and the reconciler opens
// (and rescans) without waiting for another session's action. Before, it
// stayed failed closed until some other action happened to be written.
func TestFailedWriteThatTurnsMootOpensAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "turn_deadline: 10s", events.Config{})
	ctx := context.Background()
	res, err := e.rt.RunTurn(ctx, "moot", refruntime.TurnSpec{Fault: refruntime.FaultHang{}})
	if err != nil {
		t.Fatal(err)
	}
	// The recovery stream refuses every command: one byte, discard new.
	st, err := e.js.Stream(ctx, recovery.Stream)
	if err != nil {
		t.Fatal(err)
	}
	saved := st.CachedInfo().Config
	full := saved
	full.MaxBytes, full.Discard = 1, jetstream.DiscardNew
	if _, err := e.js.UpdateStream(ctx, full); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Minute)
	e.waitHealthy(true)
	if e.rec.Healthy() == nil {
		t.Fatal("not failed closed while the recovery stream refuses the abandon")
	}
	// The runtime ends the turn after all: the abandon is moot.
	e.append("moot", res.Turn, &events.TurnCompleted{Reason: "late"})
	if _, err := e.js.UpdateStream(ctx, saved); err != nil {
		t.Fatal(err)
	}
	e.waitHealthy(false)
	if err := e.rec.Healthy(); err != nil {
		t.Fatalf("still failed closed after the failed action turned moot and the log is writable: %v", err)
	}
	if got := e.commands("moot"); len(got) != 0 {
		t.Fatalf("commands issued for a turn that completed: %v", got)
	}
}

// The runtime is away when a distillation is due: the distill command
// meets no responders and pauses the session for runtime_unavailable. When
// the runtime announces itself again, the engine resumes the session and
// the distillation runs, exactly once.
func TestSessionPausedForAnAbsentRuntimeResumesWhenItReturns(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", events.Config{})
	ctx := context.Background()
	if _, err := e.rt.RunTurn(ctx, "away", refruntime.TurnSpec{}); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.SetMode(ctx, refruntime.ModeDown); err != nil {
		t.Fatal(err)
	}
	e.append("away", "", &events.DistillationRequested{Reason: "context 90% full"})
	s := e.eventually("paused for the absent runtime", 500*time.Millisecond, func(s *projections.Session) bool {
		return s.Paused
	}, "away")
	if s.PauseCause != events.CauseRuntimeUnavailable || s.PauseKind != string(recovery.KindDistill) {
		t.Fatalf("paused with cause %q kind %q (%s), want runtime_unavailable for distill", s.PauseCause, s.PauseKind, s.PauseReason)
	}
	if n := len(e.rt.Requests("away")); n != 0 {
		t.Fatalf("the absent runtime got %d requests", n)
	}
	// Nothing happens while it stays away, however long.
	e.clock.Advance(10 * time.Minute)
	time.Sleep(600 * time.Millisecond)
	if s := e.state("away"); !s.Paused {
		t.Fatal("resumed while the runtime is still away")
	}

	if err := e.rt.SetMode(ctx, refruntime.ModeServe); err != nil {
		t.Fatal(err)
	}
	s = e.eventually("resumed and distilled", 500*time.Millisecond, func(s *projections.Session) bool {
		d := s.Distillations[len(s.Distillations)-1]
		return !s.Paused && d.CompletedSeq != 0
	}, "away")
	// A few more judgements change nothing: one distillation, one re-issue.
	e.clock.Advance(5 * time.Second)
	time.Sleep(600 * time.Millisecond)
	distills := 0
	for _, q := range e.rt.Requests("away") {
		if q.Action == recovery.ActionDistill {
			distills++
		}
	}
	if distills != 1 {
		t.Fatalf("the runtime was asked to distil %d times, want 1", distills)
	}
	if got := strings.Join(e.commands("away"), " "); strings.Count(got, "distill") != 2 || strings.Count(got, "resume_session") != 1 {
		t.Fatalf("commands %q: want distill, resume_session, distill", got)
	}
	if got := e.state("away").Totals.Distillations; got != 1 {
		t.Fatalf("%d distillations, want 1", got)
	}
}

// A session marked history (an import) gets no command, whatever it
// breaks; a person can still issue one by hand.
func TestHistorySessionsGetNoCommand(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "turn_deadline: 1s", events.Config{})
	e.append("old", "", &events.SessionStarted{History: true})
	e.append("old", "t1", &events.TurnStarted{Prompt: "hello"})
	e.append("old", "t1", &events.MessageAppended{Role: events.RoleAssistant, Content: []events.ContentBlock{
		{Type: events.BlockToolUse, ID: "toolu_old", Name: "Bash", Input: json.RawMessage(`{}`)}}})
	e.append("old", "t1", &events.TurnFailed{Stage: events.StageExecute, Error: events.ErrorInfo{Message: "overloaded", HTTPStatus: 529, Kind: events.KindTransient}})
	for i := 0; i < 5; i++ {
		e.clock.Advance(time.Minute)
		time.Sleep(200 * time.Millisecond)
	}
	if got := e.commands("old"); len(got) != 0 {
		t.Fatalf("history session got commands %v", got)
	}
	if s := e.state("old"); len(s.OrphanedToolUseIDs()) != 1 || !s.History {
		t.Fatalf("history session state: history %v, orphans %v", s.History, s.OrphanedToolUseIDs())
	}
}
