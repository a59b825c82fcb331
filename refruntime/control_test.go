package refruntime_test

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
	"github.com/turnstone-dev/turnstone/refruntime"
)

// opened is setup with the runtime answering control requests.
func opened(t *testing.T, mod ...func(*refruntime.Config)) *env {
	t.Helper()
	e := setup(t, mod...)
	if err := e.rt.Open(ctx(t)); err != nil {
		t.Fatal(err)
	}
	return e
}

func TestControlDefaults(t *testing.T) {
	t.Parallel()
	e := opened(t)
	first := e.run(t, "s1", refruntime.TurnSpec{Prompt: "build it", Tools: twoTools[:1], Fault: refruntime.FaultProvider{Status: 529}})

	t.Run("retry_turn", func(t *testing.T) {
		reply := e.ask(t, "s1", recovery.ActionRetryTurn, recovery.Params{})
		if reply.Outcome != recovery.ReplyOK || reply.Provider != "anthropic" {
			t.Fatalf("reply %+v", reply)
		}
		evs := e.read(t, "s1")
		end := evs[len(evs)-1]
		if end.Type != events.TypeTurnCompleted || end.Turn == first.Turn {
			t.Fatalf("last event %s of turn %s", end.Type, end.Turn)
		}
		var retried *events.TurnStarted
		for _, ev := range ofType(evs, events.TypeTurnStarted) {
			if ev.Turn == end.Turn {
				retried = decode[*events.TurnStarted](t, ev)
			}
		}
		if retried == nil || retried.Trigger != "retry" || retried.Prompt != "build it" {
			t.Errorf("retried turn.started %+v", retried)
		}
	})

	t.Run("switch_provider", func(t *testing.T) {
		var got []string
		for range 3 {
			reply := e.ask(t, "s1", recovery.ActionSwitchProvider, recovery.Params{})
			if reply.Outcome != recovery.ReplyOK {
				t.Fatalf("reply %+v", reply)
			}
			got = append(got, reply.Provider)
		}
		if want := []string{"bedrock", "vertex", "anthropic"}; !slices.Equal(got, want) {
			t.Errorf("providers %v, want %v", got, want)
		}
		reply := e.ask(t, "s1", recovery.ActionSwitchProvider, recovery.Params{ToProvider: "vertex"})
		if reply.Outcome != recovery.ReplyOK || reply.Provider != "vertex" || e.rt.Provider("s1") != "vertex" {
			t.Errorf("reply %+v, provider %s", reply, e.rt.Provider("s1"))
		}
		// The next turn runs on the new provider.
		res := e.run(t, "s1", refruntime.TurnSpec{Fault: refruntime.FaultProvider{Status: 429}})
		if res.Error.Provider != "vertex" {
			t.Errorf("turn on provider %q, want vertex", res.Error.Provider)
		}
	})

	t.Run("distill", func(t *testing.T) {
		before := e.read(t, "s1")
		reply := e.ask(t, "s1", recovery.ActionDistill, recovery.Params{})
		if reply.Outcome != recovery.ReplyOK {
			t.Fatalf("reply %+v", reply)
		}
		evs := e.read(t, "s1")
		added := types(evs[len(before):])
		want := []events.Type{events.TypeDistillationRequested, events.TypeDistillationStarted, events.TypeDistillationCompleted, events.TypeMessageAppended}
		if !slices.Equal(added, want) {
			t.Fatalf("added %v, want %v", added, want)
		}
		done := decode[*events.DistillationCompleted](t, evs[len(evs)-2])
		if done.FromSeq != before[0].Seq || done.ToSeq != before[len(before)-1].Seq || done.Summary == "" || done.TokensBefore <= 0 {
			t.Errorf("distillation.completed %+v", done)
		}
		summary := decode[*events.MessageAppended](t, evs[len(evs)-1])
		if summary.Role != events.RoleUser || !summary.Meta || summary.Content[0].Text != done.Summary {
			t.Errorf("summary message %+v", summary)
		}
		s := projections.Fold(evs)
		if len(s.Distillations) != 1 || !s.Distillations[0].Clean || len(s.Messages) != 1 {
			t.Errorf("distillations %+v, %d messages", s.Distillations, len(s.Messages))
		}
		for _, v := range s.Violations {
			t.Errorf("violation %+v", v)
		}
	})

	t.Run("others", func(t *testing.T) {
		for _, tc := range []struct {
			action   string
			params   recovery.Params
			outcome  string
			degraded bool
		}{
			{recovery.ActionResumeSession, recovery.Params{}, recovery.ReplyOK, false},
			{recovery.ActionPivotStrategy, recovery.Params{Strategy: "smaller steps"}, recovery.ReplyOK, false},
			{recovery.ActionDegrade, recovery.Params{}, recovery.ReplyOK, true},
			{"reboot_universe", recovery.Params{}, recovery.ReplyRejected, false},
			{string(recovery.KindRepairOrphans), recovery.Params{}, recovery.ReplyRejected, false},
		} {
			reply := e.ask(t, "s1", tc.action, tc.params)
			if reply.Outcome != tc.outcome || reply.Degraded != tc.degraded || reply.Detail == "" {
				t.Errorf("%s: reply %+v", tc.action, reply)
			}
		}
		if got := e.rt.Strategy("s1"); got != "smaller steps" {
			t.Errorf("strategy %q", got)
		}
	})

	t.Run("notice", func(t *testing.T) {
		req := recovery.ControlRequest{Action: recovery.ActionNotice, Notice: "turn abandoned after 5m", Turn: first.Turn}
		reply, err := e.request(t, "s1", req, 10*time.Second)
		if err != nil || reply.Outcome != recovery.ReplyOK {
			t.Fatalf("reply %+v, %v", reply, err)
		}
		notices := e.rt.Notices("s1")
		if len(notices) != 1 || notices[0].Notice != req.Notice || notices[0].Turn != first.Turn {
			t.Errorf("notices %+v", notices)
		}
	})

	t.Run("unknown session", func(t *testing.T) {
		for _, action := range []string{recovery.ActionRetryTurn, recovery.ActionNotice} {
			reply := e.ask(t, "never-ran", action, recovery.Params{})
			if reply.Outcome != recovery.ReplyRejected {
				t.Errorf("%s: reply %+v", action, reply)
			}
		}
		if n := len(e.rt.Requests("never-ran")); n != 2 {
			t.Errorf("%d requests recorded for the unknown session, want 2", n)
		}
		if _, err := e.log.LastSeq(ctx(t), tenant, "never-ran"); !errors.Is(err, events.ErrSessionNotFound) {
			t.Errorf("the unknown session has events: %v", err)
		}
	})

	var actions []string
	for _, r := range e.rt.Requests("s1") {
		actions = append(actions, r.Action)
	}
	want := []string{
		"retry_turn", "switch_provider", "switch_provider", "switch_provider", "switch_provider", "distill",
		"resume_session", "pivot_strategy", "degrade", "reboot_universe", "repair_orphans", "notice",
	}
	if !slices.Equal(actions, want) {
		t.Errorf("requests\n got %v\nwant %v", actions, want)
	}
}

func TestScriptedReplies(t *testing.T) {
	t.Parallel()
	e := opened(t)
	e.run(t, "s1", refruntime.TurnSpec{})
	err := e.rt.ScriptReplies("s1", recovery.ActionRetryTurn, []refruntime.ScriptedReply{
		{Outcome: recovery.ReplyFailed, Status: 529},
		{Status: 401},
		{Outcome: recovery.ReplyOK, Detail: "pretend"},
		{Mode: refruntime.ReplyDefault},
	})
	if err != nil {
		t.Fatal(err)
	}
	seqBefore, _ := e.log.LastSeq(ctx(t), tenant, "s1")

	r1 := e.ask(t, "s1", recovery.ActionRetryTurn, recovery.Params{})
	if r1.Outcome != recovery.ReplyFailed || r1.Error == nil || r1.Error.HTTPStatus != 529 || r1.Error.Code != "overloaded_error" ||
		r1.Error.Kind != events.KindTransient || r1.Error.Provider != "anthropic" {
		t.Errorf("reply 1 %+v (error %+v)", r1, r1.Error)
	}
	r2 := e.ask(t, "s1", recovery.ActionRetryTurn, recovery.Params{})
	if r2.Outcome != recovery.ReplyFailed || r2.Error == nil || r2.Error.Code != "authentication_error" || r2.Error.Kind != events.KindLogic {
		t.Errorf("reply 2 %+v (error %+v)", r2, r2.Error)
	}
	r3 := e.ask(t, "s1", recovery.ActionRetryTurn, recovery.Params{})
	if r3.Outcome != recovery.ReplyOK || r3.Detail != "pretend" || r3.Error != nil {
		t.Errorf("reply 3 %+v", r3)
	}
	if seq, _ := e.log.LastSeq(ctx(t), tenant, "s1"); seq != seqBefore {
		t.Errorf("scripted replies appended events: last seq %d, was %d", seq, seqBefore)
	}
	r4 := e.ask(t, "s1", recovery.ActionRetryTurn, recovery.Params{})
	r5 := e.ask(t, "s1", recovery.ActionRetryTurn, recovery.Params{}) // script spent: default
	if r4.Outcome != recovery.ReplyOK || r5.Outcome != recovery.ReplyOK {
		t.Errorf("replies 4, 5: %+v, %+v", r4, r5)
	}
	if n := len(ofType(e.read(t, "s1"), events.TypeTurnCompleted)); n != 3 {
		t.Errorf("%d turns completed, want 3 (the first, and two real retries)", n)
	}

	// A script for another action does not touch retry_turn's.
	if err := e.rt.ScriptReplies("s1", recovery.ActionSwitchProvider, []refruntime.ScriptedReply{{Outcome: recovery.ReplyRejected}}); err != nil {
		t.Fatal(err)
	}
	if r := e.ask(t, "s1", recovery.ActionSwitchProvider, recovery.Params{}); r.Outcome != recovery.ReplyRejected {
		t.Errorf("scripted rejection: %+v", r)
	}
	if err := e.rt.ScriptReplies("s1", "x", []refruntime.ScriptedReply{{Outcome: "maybe"}, {Status: 200}}); err == nil {
		t.Error("an invalid script was accepted")
	}
}

func TestScriptedHangAndDelay(t *testing.T) {
	t.Parallel()
	e := opened(t)
	e.run(t, "s1", refruntime.TurnSpec{})
	err := e.rt.ScriptReplies("s1", recovery.ActionResumeSession, []refruntime.ScriptedReply{
		{Mode: refruntime.ReplyHang},
		{Delay: 300 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.request(t, "s1", recovery.ControlRequest{Action: recovery.ActionResumeSession}, 200*time.Millisecond); !errors.Is(err, nats.ErrTimeout) {
		t.Errorf("hung reply: %v, want a timeout", err)
	}
	if _, err := e.request(t, "s1", recovery.ControlRequest{Action: recovery.ActionResumeSession}, 100*time.Millisecond); !errors.Is(err, nats.ErrTimeout) {
		t.Errorf("delayed reply within 100ms: %v, want a timeout", err)
	}
	// The delayed reply was still sent; the next request is served after it.
	if r := e.ask(t, "s1", recovery.ActionResumeSession, recovery.Params{}); r.Outcome != recovery.ReplyOK || r.Detail != "resumed" {
		t.Errorf("reply %+v", r)
	}
}

func TestModes(t *testing.T) {
	t.Parallel()
	e := opened(t)
	e.run(t, "s1", refruntime.TurnSpec{})

	if err := e.rt.SetMode(ctx(t), refruntime.ModeHang); err != nil {
		t.Fatal(err)
	}
	if _, err := e.request(t, "s1", recovery.ControlRequest{Action: recovery.ActionResumeSession}, 200*time.Millisecond); !errors.Is(err, nats.ErrTimeout) {
		t.Errorf("hang: %v, want a timeout", err)
	}
	if n := len(e.rt.Requests("s1")); n != 1 {
		t.Errorf("hang: %d requests recorded, want 1", n)
	}

	if err := e.rt.SetMode(ctx(t), refruntime.ModeDown); err != nil {
		t.Fatal(err)
	}
	if _, err := e.request(t, "s1", recovery.ControlRequest{Action: recovery.ActionResumeSession}, 5*time.Second); !isNoResponders(err) {
		t.Errorf("down: %v, want nats.ErrNoResponders", err)
	}

	if err := e.rt.SetMode(ctx(t), refruntime.ModeServe); err != nil {
		t.Fatal(err)
	}
	if r := e.ask(t, "s1", recovery.ActionResumeSession, recovery.Params{}); r.Outcome != recovery.ReplyOK {
		t.Errorf("serve: %+v", r)
	}
	if err := e.rt.SetMode(ctx(t), "sleepy"); err == nil {
		t.Error("an unknown mode was accepted")
	}
	if err := e.rt.Open(ctx(t)); !errors.Is(err, refruntime.ErrAlreadyOpen) {
		t.Errorf("second Open: %v", err)
	}
}

func TestProviderOutageDrivesChain(t *testing.T) {
	t.Parallel()
	// The chain a worker runs for a 529: retry fails while the provider
	// is down, switching provider works, the retry on it completes.
	e := opened(t)
	if err := e.rt.SetProviderOutage("anthropic", 529, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	res := e.run(t, "s1", refruntime.TurnSpec{Tools: twoTools})
	if res.Outcome != refruntime.OutcomeFailed || res.Error.HTTPStatus != 529 {
		t.Fatalf("turn during the outage: %+v", res)
	}
	r := e.ask(t, "s1", recovery.ActionRetryTurn, recovery.Params{Provider: "anthropic", ErrorClass: "overloaded"})
	if r.Outcome != recovery.ReplyFailed || r.Error == nil || r.Error.HTTPStatus != 529 || r.Provider != "anthropic" {
		t.Errorf("retry during the outage: %+v", r)
	}
	evs := e.read(t, "s1")
	recs := ofType(evs, events.TypeErrorRecorded)
	if len(recs) != 2 || decode[*events.ErrorRecorded](t, recs[1]).Consecutive != 2 {
		t.Errorf("error.recorded events %d", len(recs))
	}
	if r := e.ask(t, "s1", recovery.ActionSwitchProvider, recovery.Params{}); r.Outcome != recovery.ReplyOK || r.Provider != "bedrock" {
		t.Errorf("switch: %+v", r)
	}
	if r := e.ask(t, "s1", recovery.ActionRetryTurn, recovery.Params{}); r.Outcome != recovery.ReplyOK || r.Provider != "bedrock" {
		t.Errorf("retry on bedrock: %+v", r)
	}
	e.rt.ClearProviderOutage("anthropic")
	if r := e.ask(t, "s1", recovery.ActionRetryTurn, recovery.Params{ToProvider: "anthropic"}); r.Outcome != recovery.ReplyOK || r.Provider != "anthropic" {
		t.Errorf("retry back on anthropic: %+v", r)
	}
	if err := e.rt.SetProviderOutage("", 529, 0); err == nil {
		t.Error("an outage without provider was accepted")
	}
}

func TestSwitchProviderWithoutAlternative(t *testing.T) {
	t.Parallel()
	e := opened(t, func(c *refruntime.Config) { c.Providers = nil; c.Provider = "anthropic" })
	e.run(t, "s1", refruntime.TurnSpec{})
	r := e.ask(t, "s1", recovery.ActionSwitchProvider, recovery.Params{})
	if r.Outcome != recovery.ReplyFailed || r.Error == nil || r.Error.Kind != events.KindLogic {
		t.Errorf("reply %+v", r)
	}
}

func TestDistillRefusesDirtyHistory(t *testing.T) {
	t.Parallel()
	e := opened(t)
	crash := e.run(t, "s1", refruntime.TurnSpec{Fault: refruntime.FaultCrashMidTool{}})
	before := len(e.read(t, "s1"))
	r := e.ask(t, "s1", recovery.ActionDistill, recovery.Params{})
	if r.Outcome != recovery.ReplyFailed || r.Error == nil || r.Error.Kind != events.KindLogic || r.Error.Code != projections.DirtyTurnInFlight {
		t.Fatalf("reply %+v (error %+v)", r, r.Error)
	}
	evs := e.read(t, "s1")
	if got := types(evs[before:]); !slices.Equal(got, []events.Type{events.TypeDistillationRequested, events.TypeDistillationSkipped}) {
		t.Fatalf("added %v", got)
	}
	if sk := decode[*events.DistillationSkipped](t, evs[len(evs)-1]); sk.Reason != projections.DirtyTurnInFlight {
		t.Errorf("skipped %+v", sk)
	}

	// Once the crashed turn is abandoned, the unanswered tool_use is what
	// keeps the history dirty.
	ab, err := events.New(tenant, "s1", crash.Turn, &events.TurnAbandoned{Reason: "deadline"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.log.Append(ctx(t), []events.Event{ab}); err != nil {
		t.Fatal(err)
	}
	r = e.ask(t, "s1", recovery.ActionDistill, recovery.Params{})
	if r.Outcome != recovery.ReplyFailed || r.Error.Code != projections.DirtyUnansweredToolUse {
		t.Errorf("after abandon: reply %+v (error %+v)", r, r.Error)
	}
	s := projections.Fold(e.read(t, "s1"))
	if len(s.Distillations) != 2 || s.Distillations[0].StartedSeq != 0 || s.Distillations[1].StartedSeq != 0 {
		t.Errorf("distillations %+v", s.Distillations)
	}
	for _, v := range s.Violations {
		if v.Rule == projections.RuleDistillationDirtyHistory || v.Rule == projections.RuleDistillationDuringTurn {
			t.Errorf("the runtime distilled a dirty history: %+v", v)
		}
	}
}

func TestAdoptAndSharedQueueGroup(t *testing.T) {
	t.Parallel()
	// A second instance of the tenant that adopts unknown sessions
	// answers for the first when it goes down (a restart after a crash).
	e := opened(t)
	e.run(t, "s1", refruntime.TurnSpec{Prompt: "remember me"})
	other := e.open(func(c *refruntime.Config) { c.AdoptUnknown = true; c.Provider = "bedrock" })
	if err := other.Open(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.SetMode(ctx(t), refruntime.ModeDown); err != nil {
		t.Fatal(err)
	}
	r := e.ask(t, "s1", recovery.ActionRetryTurn, recovery.Params{})
	if r.Outcome != recovery.ReplyOK || r.Provider != "anthropic" {
		t.Fatalf("adopted retry: %+v", r)
	}
	if n := len(other.Requests("s1")); n != 1 {
		t.Errorf("the other instance got %d requests, want 1", n)
	}
	evs := e.read(t, "s1")
	last := ofType(evs, events.TypeTurnStarted)
	if p := decode[*events.TurnStarted](t, last[len(last)-1]); p.Prompt != "remember me" || p.Trigger != "retry" {
		t.Errorf("retried turn.started %+v", p)
	}
	if r := e.ask(t, "nowhere", recovery.ActionRetryTurn, recovery.Params{}); r.Outcome != recovery.ReplyRejected {
		t.Errorf("a session the log does not hold: %+v", r)
	}
}

func TestRepeatedRequestRunsOnce(t *testing.T) {
	t.Parallel()
	e := opened(t)
	e.run(t, "s1", refruntime.TurnSpec{})
	req := recovery.ControlRequest{CommandID: "retry_turn-0123456789abcdef0123", Attempt: 1, Action: recovery.ActionRetryTurn}
	r1, err1 := e.request(t, "s1", req, 10*time.Second)
	r2, err2 := e.request(t, "s1", req, 10*time.Second)
	if err1 != nil || err2 != nil || r1 != r2 || r1.Outcome != recovery.ReplyOK {
		t.Fatalf("replies %+v %v, %+v %v", r1, err1, r2, err2)
	}
	if n := len(ofType(e.read(t, "s1"), events.TypeTurnCompleted)); n != 2 {
		t.Errorf("%d turns completed, want 2: a repeat must not run the turn again", n)
	}
	req.Attempt = 2
	if r, err := e.request(t, "s1", req, 10*time.Second); err != nil || r.Outcome != recovery.ReplyOK {
		t.Errorf("attempt 2: %+v %v", r, err)
	}
	if n := len(ofType(e.read(t, "s1"), events.TypeTurnCompleted)); n != 3 {
		t.Errorf("%d turns completed, want 3", n)
	}
	if n := len(e.rt.Requests("s1")); n != 3 {
		t.Errorf("%d requests recorded, want 3", n)
	}
}

func TestMalformedRequest(t *testing.T) {
	t.Parallel()
	e := opened(t)
	e.run(t, "s1", refruntime.TurnSpec{})
	for name, body := range map[string]string{
		"not json":      "not json",
		"other session": `{"command_id":"c","attempt":1,"action":"notice","tenant":"acme","session":"s2"}`,
		"other tenant":  `{"command_id":"c","attempt":1,"action":"notice","tenant":"globex","session":"s1"}`,
	} {
		msg, err := e.requester.Request(recovery.ControlSubject(tenant, "s1"), []byte(body), 5*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var reply recovery.ControlReply
		if err := json.Unmarshal(msg.Data, &reply); err != nil || reply.Outcome != recovery.ReplyRejected {
			t.Errorf("%s: reply %s (%v)", name, msg.Data, err)
		}
	}
	if n := len(e.rt.Notices("s1")); n != 0 {
		t.Errorf("%d notices taken from rejected requests", n)
	}
}

// TestPresenceClaimsTheTurnsRunning: the answer to a presence ping names
// the turns the runtime is running (a sign of life of each); a turn that
// hangs has returned and is not named, nor one that ended.
func TestPresenceClaimsTheTurnsRunning(t *testing.T) {
	t.Parallel()
	e := opened(t, func(c *refruntime.Config) { c.StageDelay = 500 * time.Millisecond })
	ping := func() recovery.PresenceReply {
		t.Helper()
		body, _ := json.Marshal(recovery.ControlRequest{Action: recovery.ActionPing, Tenant: tenant, Session: recovery.PresenceSession})
		msg, err := e.requester.Request(recovery.ControlSubject(tenant, recovery.PresenceSession), body, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var r recovery.PresenceReply
		if err := json.Unmarshal(msg.Data, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	a, err := e.rt.StartTurnAsync(ctx(t), "s1", refruntime.TurnSpec{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.RunTurn(ctx(t), "s2", refruntime.TurnSpec{Fault: refruntime.FaultHang{}}); err != nil {
		t.Fatal(err)
	}
	if r := ping(); r.Outcome != recovery.ReplyOK || len(r.Turns) != 1 || r.Turns[0] != (recovery.TurnRef{Session: "s1", Turn: a.Turn()}) {
		t.Fatalf("while s1's turn runs and s2's hangs: %+v", r)
	}
	if _, err := a.Wait(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if r := ping(); len(r.Turns) != 0 {
		t.Fatalf("after the turn: %+v", r)
	}
}
