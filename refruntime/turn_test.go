package refruntime_test

import (
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/refruntime"
)

var twoTools = []refruntime.ToolSpec{
	{Name: "Read", Input: json.RawMessage(`{"path":"README.md"}`), Result: "# Turnstone"},
	{Name: "Bash", Input: json.RawMessage(`{"command":"go test ./..."}`), Result: "FAIL", IsError: true},
}

func TestNormalTurn(t *testing.T) {
	t.Parallel()
	e := setup(t)
	res := e.run(t, "s1", refruntime.TurnSpec{Prompt: "fix the tests", Tools: twoTools, Reply: "Fixed."})
	if res.Outcome != refruntime.OutcomeCompleted || len(res.ToolUseIDs) != 2 || res.Provider != "anthropic" {
		t.Fatalf("result %+v", res)
	}
	evs := e.read(t, "s1")
	want := []events.Type{
		events.TypeSessionStarted, events.TypeTurnStarted,
		events.TypeTurnStageCompleted, // context
		events.TypeMessageAppended,    // the prompt
		events.TypeTurnStageCompleted, // history
		events.TypeMessageAppended,    // tool_use
		events.TypeToolCallStarted, events.TypeToolCallCompleted,
		events.TypeToolCallStarted, events.TypeToolCallCompleted,
		events.TypeMessageAppended, // tool_result
		events.TypeMessageAppended, // final text
		events.TypeTurnStageCompleted, events.TypeTurnStageCompleted,
		events.TypeTurnCompleted,
	}
	if got := types(evs); !slices.Equal(got, want) {
		t.Fatalf("types\n got %v\nwant %v", got, want)
	}
	if res.FirstSeq != evs[0].Seq || res.LastSeq != evs[len(evs)-1].Seq || res.Events != len(evs) {
		t.Errorf("result seqs %d..%d (%d events), log %d..%d (%d)", res.FirstSeq, res.LastSeq, res.Events, evs[0].Seq, evs[len(evs)-1].Seq, len(evs))
	}
	for _, ev := range evs[1:] {
		if ev.Turn != res.Turn {
			t.Errorf("%s: turn %q, want %q", ev.Type, ev.Turn, res.Turn)
		}
		if ev.Source != "urn:refruntime:refruntime" {
			t.Errorf("%s: source %q", ev.Type, ev.Source)
		}
	}
	if ss := decode[*events.SessionStarted](t, evs[0]); ss.Provider != "anthropic" || ss.Model != refruntime.DefaultModel {
		t.Errorf("session.started %+v", ss)
	}
	var stages []events.Stage
	for _, ev := range ofType(evs, events.TypeTurnStageCompleted) {
		stages = append(stages, decode[*events.TurnStageCompleted](t, ev).Stage)
	}
	if want := []events.Stage{events.StageContext, events.StageHistory, events.StageExecute, events.StageFinalize}; !slices.Equal(stages, want) {
		t.Errorf("stages %v, want %v", stages, want)
	}

	msgs := ofType(evs, events.TypeMessageAppended)
	prompt := decode[*events.MessageAppended](t, msgs[0])
	use := decode[*events.MessageAppended](t, msgs[1])
	results := decode[*events.MessageAppended](t, msgs[2])
	final := decode[*events.MessageAppended](t, msgs[3])
	if prompt.Role != events.RoleUser || prompt.Content[0].Text != "fix the tests" {
		t.Errorf("prompt %+v", prompt)
	}
	if use.Role != events.RoleAssistant || use.StopReason != "tool_use" || len(use.Content) != 3 || use.Content[0].Type != events.BlockText {
		t.Fatalf("tool_use message %+v", use)
	}
	for i, id := range res.ToolUseIDs {
		b := use.Content[i+1]
		if b.Type != events.BlockToolUse || b.ID != id || b.Name != twoTools[i].Name || string(b.Input) != string(twoTools[i].Input) {
			t.Errorf("tool_use %d: %+v", i, b)
		}
		r := results.Content[i]
		if r.Type != events.BlockToolResult || r.ToolUseID != id || r.IsError != twoTools[i].IsError {
			t.Errorf("tool_result %d: %+v", i, r)
		}
		var text string
		if err := json.Unmarshal(r.Content, &text); err != nil || text != twoTools[i].Result {
			t.Errorf("tool_result %d content %s (%v)", i, r.Content, err)
		}
	}
	if results.Role != events.RoleUser || len(results.Content) != 2 {
		t.Errorf("results message %+v", results)
	}
	if final.Role != events.RoleAssistant || final.StopReason != "end_turn" || final.Content[0].Text != "Fixed." || final.Model != refruntime.DefaultModel {
		t.Errorf("final message %+v", final)
	}
	if done := decode[*events.ToolCallCompleted](t, ofType(evs, events.TypeToolCallCompleted)[1]); !done.IsError {
		t.Errorf("second tool call not an error: %+v", done)
	}

	// A second turn of the session starts without session.started.
	res2 := e.run(t, "s1", refruntime.TurnSpec{})
	evs = e.read(t, "s1")
	if n := len(ofType(evs, events.TypeSessionStarted)); n != 1 {
		t.Errorf("%d session.started events, want 1", n)
	}
	if res2.Turn == res.Turn || res2.FirstSeq != res.LastSeq+1 || evs[len(evs)-1].Type != events.TypeTurnCompleted {
		t.Errorf("second turn %+v after %+v", res2, res)
	}

	s := projections.Fold(evs)
	if len(s.Violations) != 0 || s.Status() != projections.StatusIdle || len(s.Turns) != 2 {
		t.Fatalf("projection: status %s, %d turns, violations %+v", s.Status(), len(s.Turns), s.Violations)
	}
	for _, tc := range s.ToolCalls {
		if tc.Status != projections.ToolAnswered {
			t.Errorf("tool call %+v", tc)
		}
	}
}

func TestTurnSpecDefaultsAndErrors(t *testing.T) {
	t.Parallel()
	e := setup(t)
	res := e.run(t, "s1", refruntime.TurnSpec{TurnID: "turn-1"})
	if res.Turn != "turn-1" || res.Outcome != refruntime.OutcomeCompleted || len(res.ToolUseIDs) != 0 {
		t.Errorf("result %+v", res)
	}
	started := decode[*events.TurnStarted](t, ofType(e.read(t, "s1"), events.TypeTurnStarted)[0])
	if started.Prompt == "" || started.Trigger != "user" {
		t.Errorf("turn.started %+v", started)
	}

	for name, tc := range map[string]struct {
		session string
		spec    refruntime.TurnSpec
		want    error
	}{
		"bad session":  {"a.b", refruntime.TurnSpec{}, refruntime.ErrInvalidTurn},
		"bad turn":     {"s1", refruntime.TurnSpec{TurnID: "x y"}, refruntime.ErrInvalidTurn},
		"tool no name": {"s1", refruntime.TurnSpec{Tools: []refruntime.ToolSpec{{}}}, refruntime.ErrInvalidTurn},
		"bad input":    {"s1", refruntime.TurnSpec{Tools: []refruntime.ToolSpec{{Name: "x", Input: json.RawMessage(`[1]`)}}}, refruntime.ErrInvalidTurn},
		"bad stage":    {"s1", refruntime.TurnSpec{Fault: refruntime.FaultStageThrows{Stage: "deploy"}}, refruntime.ErrInvalidFault},
		"bad status":   {"s1", refruntime.TurnSpec{Fault: refruntime.FaultProvider{Status: 200}}, refruntime.ErrInvalidFault},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := e.rt.RunTurn(ctx(t), tc.session, tc.spec); !errors.Is(err, tc.want) {
				t.Errorf("error %v, want %v", err, tc.want)
			}
		})
	}
	if got := len(ofType(e.read(t, "s1"), events.TypeTurnStarted)); got != 1 {
		t.Errorf("%d turns stored, want 1: invalid turns must store nothing", got)
	}
}

func TestFaultCrashMidTool(t *testing.T) {
	t.Parallel()
	var crashed []string
	var mu sync.Mutex
	e := setup(t, func(c *refruntime.Config) {
		c.OnCrash = func(session, turn string) {
			mu.Lock()
			defer mu.Unlock()
			crashed = append(crashed, session+"/"+turn)
		}
	})
	e.run(t, "s1", refruntime.TurnSpec{Tools: twoTools[:1]})
	res := e.run(t, "s1", refruntime.TurnSpec{Tools: twoTools, Fault: refruntime.FaultCrashMidTool{}})
	if res.Outcome != refruntime.OutcomeCrashed || len(res.ToolUseIDs) != 2 {
		t.Fatalf("result %+v", res)
	}
	mu.Lock()
	if !slices.Equal(crashed, []string{"s1/" + res.Turn}) {
		t.Errorf("OnCrash calls %v", crashed)
	}
	mu.Unlock()

	evs := e.read(t, "s1")
	var turn []events.Event
	for _, ev := range evs {
		if ev.Turn == res.Turn {
			turn = append(turn, ev)
		}
	}
	want := []events.Type{
		events.TypeTurnStarted, events.TypeTurnStageCompleted, events.TypeMessageAppended,
		events.TypeTurnStageCompleted, events.TypeMessageAppended, events.TypeToolCallStarted,
	}
	if got := types(turn); !slices.Equal(got, want) {
		t.Fatalf("crashed turn's types\n got %v\nwant %v", got, want)
	}
	last := decode[*events.MessageAppended](t, turn[4])
	if last.Role != events.RoleAssistant || last.Content[1].Type != events.BlockToolUse || last.Content[1].ID != res.ToolUseIDs[0] {
		t.Errorf("last message %+v", last)
	}

	s := projections.Fold(evs)
	if !slices.Equal(s.Pending, res.ToolUseIDs) {
		t.Errorf("pending %v, want %v", s.Pending, res.ToolUseIDs)
	}
	if !slices.Equal(s.InFlight, []string{res.Turn}) {
		t.Errorf("in flight %v, want [%s]", s.InFlight, res.Turn)
	}
	if ids := s.OrphanedToolUseIDs(); len(ids) != 0 {
		t.Errorf("orphans %v while the turn is in flight", ids)
	}

	// A crash turn without tools gets the default tool.
	res = e.run(t, "s2", refruntime.TurnSpec{Fault: refruntime.FaultCrashMidTool{}})
	s = projections.Fold(e.read(t, "s2"))
	if len(res.ToolUseIDs) != 1 || !slices.Equal(s.Pending, res.ToolUseIDs) {
		t.Errorf("default crash tool: result %+v, pending %v", res, s.Pending)
	}
}

func TestFaultStageThrows(t *testing.T) {
	t.Parallel()
	e := setup(t)
	stages := []events.Stage{events.StageContext, events.StageHistory, events.StageExecute, events.StageFinalize}
	for i, stage := range stages {
		t.Run(string(stage), func(t *testing.T) {
			session := "throws-" + string(stage)
			res := e.run(t, session, refruntime.TurnSpec{Tools: twoTools[:1], Fault: refruntime.FaultStageThrows{Stage: stage}})
			if res.Outcome != refruntime.OutcomeFailed || res.Stage != stage || res.Error == nil || res.Error.Kind != events.KindLogic {
				t.Fatalf("result %+v", res)
			}
			evs := e.read(t, session)
			end := evs[len(evs)-1]
			failed := decode[*events.TurnFailed](t, end)
			if failed.Stage != stage || failed.Error.Kind != events.KindLogic || failed.Error.Message == "" {
				t.Errorf("turn.failed %+v", failed)
			}
			var done []events.Stage
			for _, ev := range ofType(evs, events.TypeTurnStageCompleted) {
				done = append(done, decode[*events.TurnStageCompleted](t, ev).Stage)
			}
			if !slices.Equal(done, stages[:i]) {
				t.Errorf("stages completed %v, want %v", done, stages[:i])
			}
			s := projections.Fold(evs)
			if tr := s.Turn(res.Turn); tr == nil || tr.Status != projections.TurnFailed || tr.FailedStage != stage {
				t.Errorf("projected turn %+v", tr)
			}
			if len(s.Pending) != 0 || len(s.Orphans) != 0 {
				t.Errorf("pending %v, orphans %v", s.Pending, s.Orphans)
			}
		})
	}
}

func TestFaultProvider(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, tc := range []struct {
		status int
		code   string
		kind   events.ErrorKind
	}{
		{529, "overloaded_error", events.KindTransient},
		{429, "rate_limit_error", events.KindTransient},
		{401, "authentication_error", events.KindLogic},
		{503, "api_error", events.KindTransient},
	} {
		t.Run(tc.code, func(t *testing.T) {
			session := "provider-" + tc.code
			fault := refruntime.FaultProvider{Status: tc.status, RetryAfter: 30 * time.Second}
			for n := 1; n <= 2; n++ {
				res := e.run(t, session, refruntime.TurnSpec{Tools: twoTools, Fault: fault})
				if res.Outcome != refruntime.OutcomeFailed || res.Stage != events.StageExecute || res.Error.HTTPStatus != tc.status {
					t.Fatalf("result %+v", res)
				}
				evs := e.read(t, session)
				rec := decode[*events.ErrorRecorded](t, evs[len(evs)-2])
				if rec.HTTPStatus != tc.status || rec.Code != tc.code || rec.Kind != tc.kind || rec.Provider != "anthropic" ||
					rec.Consecutive != n || rec.Stage != events.StageExecute {
					t.Errorf("error.recorded %+v, want consecutive %d", rec, n)
				}
				failed := decode[*events.TurnFailed](t, evs[len(evs)-1])
				if failed.Stage != events.StageExecute || failed.Error != rec.ErrorInfo {
					t.Errorf("turn.failed %+v, error.recorded %+v", failed, rec.ErrorInfo)
				}
				if len(ofType(evs, events.TypeToolCallStarted)) != 0 {
					t.Errorf("tools ran although the model call failed")
				}
			}
			// A completed turn ends the streak.
			e.run(t, session, refruntime.TurnSpec{})
			e.run(t, session, refruntime.TurnSpec{Fault: fault})
			evs := e.read(t, session)
			if rec := decode[*events.ErrorRecorded](t, evs[len(evs)-2]); rec.Consecutive != 1 {
				t.Errorf("consecutive %d after a completed turn, want 1", rec.Consecutive)
			}
		})
	}
}

func TestFaultHang(t *testing.T) {
	t.Parallel()
	e := setup(t)
	res := e.run(t, "s1", refruntime.TurnSpec{Fault: refruntime.FaultHang{}})
	if res.Outcome != refruntime.OutcomeHung {
		t.Fatalf("result %+v", res)
	}
	evs := e.read(t, "s1")
	want := []events.Type{events.TypeSessionStarted, events.TypeTurnStarted, events.TypeTurnStageCompleted}
	if got := types(evs); !slices.Equal(got, want) {
		t.Fatalf("types %v, want %v", got, want)
	}
	s := projections.Fold(evs)
	if tr := s.InFlightTurn(); tr == nil || tr.ID != res.Turn || tr.LastStage != events.StageContext {
		t.Errorf("in-flight turn %+v", tr)
	}
}

func TestSecondTurnMidTurn(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *refruntime.Config) { c.StageDelay = 40 * time.Millisecond })
	first, err := e.rt.StartTurnAsync(ctx(t), "s1", refruntime.TurnSpec{Prompt: "first", Tools: twoTools})
	if err != nil {
		t.Fatal(err)
	}
	second := e.run(t, "s1", refruntime.TurnSpec{Prompt: "second"})
	res, err := first.Wait(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if res.Turn != first.Turn() || res.Outcome != refruntime.OutcomeCompleted || second.Outcome != refruntime.OutcomeCompleted {
		t.Fatalf("results %+v, %+v", res, second)
	}
	if second.FirstSeq > res.LastSeq {
		t.Fatalf("second turn started at %d after the first ended at %d: not mid-turn", second.FirstSeq, res.LastSeq)
	}
	s := projections.Fold(e.read(t, "s1"))
	if len(s.Turns) != 2 || s.Turns[0].Status != projections.TurnCompleted || s.Turns[1].Status != projections.TurnCompleted {
		t.Errorf("turns %+v", s.Turns)
	}
}

func TestConcurrentFirstTurns(t *testing.T) {
	t.Parallel()
	// Several instances start the first turn of one new session at once:
	// the conditional appends conflict, and exactly one session.started
	// is stored.
	e := setup(t)
	runtimes := []*refruntime.Runtime{e.rt, e.open(), e.open(), e.open()}
	var wg sync.WaitGroup
	errs := make([]error, len(runtimes))
	for i, rt := range runtimes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = rt.RunTurn(ctx(t), "shared", refruntime.TurnSpec{})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	evs := e.read(t, "shared")
	if evs[0].Type != events.TypeSessionStarted || len(ofType(evs, events.TypeSessionStarted)) != 1 {
		t.Errorf("session.started: %d, first %s", len(ofType(evs, events.TypeSessionStarted)), evs[0].Type)
	}
	if n := len(ofType(evs, events.TypeTurnCompleted)); n != len(runtimes) {
		t.Errorf("%d turns completed, want %d", n, len(runtimes))
	}
}

func TestClose(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *refruntime.Config) { c.StageDelay = time.Hour })
	a, err := e.rt.StartTurnAsync(ctx(t), "s1", refruntime.TurnSpec{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.rt.Close(ctx(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Done():
	default:
		t.Fatal("Close returned before the async turn")
	}
	if _, err := a.Wait(ctx(t)); err == nil {
		t.Error("a turn cut short by Close reported no error")
	}
	if _, err := e.rt.RunTurn(ctx(t), "s1", refruntime.TurnSpec{}); !errors.Is(err, refruntime.ErrClosed) {
		t.Errorf("RunTurn after Close: %v", err)
	}
	if err := e.rt.Open(ctx(t)); !errors.Is(err, refruntime.ErrClosed) {
		t.Errorf("Open after Close: %v", err)
	}
}
