package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/clock"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/internal/engine"
	"github.com/turnstone-dev/turnstone/internal/worker"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

type fixture struct {
	t   *testing.T
	nc  *nats.Conn
	js  jetstream.JetStream
	log *events.Log
	kv  jetstream.KeyValue
}

// shortDelivery are the fixture's delivery timings, which its setup
// writes and its workers expect.
var shortDelivery = recovery.DeliveryConfig{AckWait: 3 * time.Second, MaxDeliver: 3, PinnedTTL: 2 * time.Second}

// newFixture starts an embedded server, sets it up as `engine setup
// --partitions 4` with short delivery timings would, and starts n workers
// that expect those timings.
func newFixture(t *testing.T, n int, mod ...func(*worker.Config)) *fixture {
	t.Helper()
	srv := embeddedtest.Start(t)
	nc, js := embeddedtest.Connect(t, srv)
	log, err := engine.Setup(context.Background(), js, engine.SetupConfig{Log: events.Config{Partitions: 4}, Delivery: shortDelivery}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, nc: nc, js: js, log: log}
	for i := 0; i < n; i++ {
		cfg := worker.Config{
			Name:           fmt.Sprintf("w%d", i),
			ControlTimeout: 2 * time.Second,
			Delivery:       shortDelivery,
		}
		for _, m := range mod {
			m(&cfg)
		}
		w, err := worker.New(nc, log, cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Open(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = w.Close(ctx)
		})
	}
	kv, err := js.KeyValue(context.Background(), recovery.StatusBucket)
	if err != nil {
		t.Fatal(err)
	}
	f.kv = kv
	return f
}

func (f *fixture) append(session, turn string, p events.Payload) uint64 {
	f.t.Helper()
	ev, err := events.New("acme", session, turn, p)
	if err != nil {
		f.t.Fatal(err)
	}
	acks, err := f.log.Append(context.Background(), []events.Event{ev})
	if err != nil {
		f.t.Fatal(err)
	}
	return acks[0].Seq
}

// orphanSession writes a session whose turn failed between a tool_use and
// its result, and returns the tool_use id.
func (f *fixture) orphanSession(session string) string {
	f.append(session, "", &events.SessionStarted{Provider: "anthropic"})
	f.append(session, "t1", &events.TurnStarted{Prompt: "list files"})
	f.append(session, "t1", &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: "text", Text: "list files"}}})
	id := "toolu_" + session
	f.append(session, "t1", &events.MessageAppended{Role: events.RoleAssistant, Content: []events.ContentBlock{
		{Type: "tool_use", ID: id, Name: "Bash", Input: json.RawMessage(`{"command":"ls"}`)}}})
	f.append(session, "t1", &events.TurnFailed{Stage: events.StageExecute, Error: events.ErrorInfo{Message: "process died", Kind: events.KindUnknown}})
	return id
}

func (f *fixture) issue(c recovery.Command) {
	f.t.Helper()
	if _, _, err := recovery.Issue(context.Background(), f.js, c); err != nil {
		f.t.Fatal(err)
	}
}

// wait polls the status bucket until the command reaches a final state.
func (f *fixture) wait(id string) recovery.Status {
	f.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		e, err := f.kv.Get(context.Background(), id)
		if err == nil {
			var st recovery.Status
			_ = json.Unmarshal(e.Value(), &st)
			if st.State == recovery.StateCompleted || st.State == recovery.StateParked {
				return st
			}
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			f.t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	f.t.Fatalf("command %s did not finish", id)
	return recovery.Status{}
}

func (f *fixture) state(session string) *projections.Session {
	f.t.Helper()
	s, err := projections.Restore(context.Background(), f.log, nil, "acme", session)
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

func (f *fixture) events(session string) []events.Event {
	f.t.Helper()
	var out []events.Event
	if err := f.log.ReadSession(context.Background(), "acme", session, events.ReadOptions{}, func(e events.Event) error {
		out = append(out, e)
		return nil
	}); err != nil {
		f.t.Fatal(err)
	}
	return out
}

func count(evs []events.Event, t events.Type) int {
	n := 0
	for _, e := range evs {
		if e.Type == t {
			n++
		}
	}
	return n
}

func TestRepairOrphansMakesTheHistoryValid(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	id := f.orphanSession("s1")
	before := f.state("s1")
	if got := before.OrphanedToolUseIDs(); len(got) != 1 || got[0] != id || before.Status() != projections.StatusBroken {
		t.Fatalf("setup: orphans %v status %s", got, before.Status())
	}
	c := recovery.NewCommand(recovery.KindRepairOrphans, "acme", "s1", "", "orphan detected", []uint64{before.LastSeq})
	f.issue(c)
	st := f.wait(c.ID)
	if st.Outcome != events.OutcomeRecovered {
		t.Fatalf("status %+v", st)
	}
	after := f.state("s1")
	if ids := after.OrphanedToolUseIDs(); len(ids) != 0 {
		t.Fatalf("orphans after repair: %v", ids)
	}
	if after.Status() == projections.StatusBroken {
		t.Fatalf("history still broken after repair: %+v", after.Violations)
	}
	evs := f.events("s1")
	var repair *events.MessageAppended
	for _, e := range evs {
		if e.Type == events.TypeMessageAppended {
			p, _ := e.Payload()
			if m := p.(*events.MessageAppended); m.Synthetic {
				repair = m
			}
		}
	}
	if repair == nil || repair.Content[0].ToolUseID != id || !repair.Content[0].IsError || !strings.Contains(string(repair.Content[0].Content), "lost") {
		t.Fatalf("synthesized tool_result: %+v", repair)
	}
	// Issued again (a second reconciler): stored once, no second repair.
	f.issue(c)
	c2 := c
	c2.Issue, c2.ID = 2, recovery.CommandID(c.Kind, c.Tenant, c.Session, "", c.Evidence, 2)
	f.issue(c2)
	f.wait(c2.ID)
	evs = f.events("s1")
	synthetic := 0
	for _, e := range evs {
		if e.Type == events.TypeMessageAppended && strings.Contains(string(e.Data), `"synthetic":true`) {
			synthetic++
		}
	}
	if synthetic != 1 || count(evs, events.TypeRecoveryCompleted) != 2 {
		t.Fatalf("%d synthetic messages, %d completions; want 1 repair and one outcome per command", synthetic, count(evs, events.TypeRecoveryCompleted))
	}
}

func TestPauseResumeAbandonRewindAbort(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	f.append("s1", "", &events.SessionStarted{})
	f.append("s1", "t1", &events.TurnStarted{Prompt: "hi"})
	f.append("s1", "t1", &events.TurnStageCompleted{Stage: events.StageContext})
	mid := f.append("s1", "t1", &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: "text", Text: "hi"}}})

	run := func(kind recovery.Kind, turn string, p recovery.Params, d *recovery.Diagnostics) recovery.Status {
		t.Helper()
		last, _ := f.log.LastSeq(context.Background(), "acme", "s1")
		c := recovery.NewCommand(kind, "acme", "s1", turn, "test "+string(kind), []uint64{last})
		c.Params, c.Diagnostics = p, d
		f.issue(c)
		return f.wait(c.ID)
	}

	if st := run(recovery.KindAbandonTurn, "t1", recovery.Params{}, nil); st.Outcome != events.OutcomeDegraded {
		// The turn is abandoned in the log; no runtime listens, so it was not told.
		t.Fatalf("abandon: %+v", st)
	}
	s := f.state("s1")
	if tn := s.Turn("t1"); tn.Status != projections.TurnAbandoned || tn.LastStage != events.StageContext || tn.Stage != events.StageHistory {
		t.Fatalf("turn after abandon: %+v", tn)
	}
	for _, e := range f.events("s1") {
		p, _ := e.Payload()
		switch p := p.(type) {
		case *events.TurnAbandoned:
			if p.LastStageCompleted != events.StageContext || p.Stage != events.StageHistory || p.LastStage != "" {
				t.Errorf("turn.abandoned %+v: want last_stage_completed context, stage history, no last_stage", p)
			}
		case *events.RecoveryCompleted:
			if !strings.Contains(p.Detail, "the runtime was not told (runtime_unavailable)") {
				t.Errorf("a degraded abandon does not say why: %q", p.Detail)
			}
		}
	}
	if st := run(recovery.KindPauseSession, "", recovery.Params{}, nil); st.Outcome != events.OutcomeRecovered || !f.state("s1").Paused {
		t.Fatalf("pause: %+v", st)
	}
	// A command that needs the runtime waits while the session is paused.
	if st := run(recovery.KindRetryTurn, "t1", recovery.Params{}, nil); st.State != recovery.StateParked || !strings.Contains(st.Reason, "paused") {
		t.Fatalf("retry on a paused session: %+v, want parked", st)
	}
	if st := run(recovery.KindResumeSession, "", recovery.Params{}, nil); st.State != recovery.StateCompleted || f.state("s1").Paused {
		t.Fatalf("resume: %+v", st)
	}
	if st := run(recovery.KindRewindSession, "", recovery.Params{ToSeq: mid}, nil); st.Outcome != events.OutcomeRecovered {
		t.Fatalf("rewind: %+v", st)
	}
	s = f.state("s1")
	if tn := s.Turn("t1"); tn == nil || tn.Status != projections.TurnInFlight {
		t.Fatalf("after rewinding to seq %d the turn should be in flight again: %+v", mid, tn)
	}
	if st := run(recovery.KindAbortSession, "", recovery.Params{}, &recovery.Diagnostics{Failed: "provider down", Tried: []string{"retry", "switch_provider"},
		Config: map[string]string{"url": "https://bot:hunter2@api.example.com"}}); st.Outcome != events.OutcomeFailed {
		t.Fatalf("abort: %+v", st)
	}
	s = f.state("s1")
	if !s.Paused || !strings.Contains(s.PauseReason, "aborted") {
		t.Fatalf("after abort: paused %v (%s)", s.Paused, s.PauseReason)
	}
	for _, e := range f.events("s1") {
		if strings.Contains(string(e.Data), "hunter2") {
			t.Fatalf("a secret of the diagnostics reached the log: %s", e.Data)
		}
	}
}

func TestForkSession(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	f.orphanSession("src")
	evs := f.events("src")
	at := evs[2].Seq // session.started, turn.started, user message
	c := recovery.NewCommand(recovery.KindForkSession, "acme", "src", "", "try again from before the tool call", []uint64{at})
	c.Params = recovery.Params{AtSeq: at, ForkSession: "src-fork"}
	f.issue(c)
	if st := f.wait(c.ID); st.Outcome != events.OutcomeRecovered {
		t.Fatalf("fork: %+v", st)
	}
	fork := f.state("src-fork")
	if fork.ForkedFrom != "src" || fork.ForkSeq != at {
		t.Fatalf("fork lineage: from %q at %d", fork.ForkedFrom, fork.ForkSeq)
	}
	if len(fork.Messages) != 1 || fork.Totals.Turns != 1 || fork.Status() == projections.StatusBroken {
		t.Fatalf("fork state: %d messages, %d turns, %s", len(fork.Messages), fork.Totals.Turns, fork.Status())
	}
	src := f.state("src")
	if len(src.Forks) != 1 || src.Forks[0].Session != "src-fork" {
		t.Fatalf("source forks: %+v", src.Forks)
	}
}

// fakeRuntime answers control requests with scripted replies per action.
type fakeRuntime struct {
	mu       sync.Mutex
	script   map[string][]recovery.ControlReply
	requests []recovery.ControlRequest
}

func (r *fakeRuntime) serve(t *testing.T, nc *nats.Conn) {
	sub, err := nc.Subscribe(recovery.ControlSubjectPrefix+".acme.*", func(m *nats.Msg) {
		var req recovery.ControlRequest
		_ = json.Unmarshal(m.Data, &req)
		r.mu.Lock()
		r.requests = append(r.requests, req)
		reply := recovery.ControlReply{Outcome: recovery.ReplyOK}
		if q := r.script[req.Action]; len(q) > 0 {
			reply, r.script[req.Action] = q[0], q[1:]
		}
		r.mu.Unlock()
		b, _ := json.Marshal(reply)
		_ = m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
}

func (r *fakeRuntime) actions() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, q := range r.requests {
		out = append(out, q.Action)
	}
	return out
}

func overloaded() recovery.ControlReply {
	return recovery.ControlReply{Outcome: recovery.ReplyFailed, Error: &events.ErrorInfo{
		Message: "overloaded", HTTPStatus: 529, Code: "overloaded_error", Provider: "anthropic", Kind: events.KindTransient}}
}

func TestRetryTurnChainOutcomes(t *testing.T) {
	t.Parallel()
	fast := func(c *worker.Config) {
		clk := clock.NewFakeClock(time.Now())
		clk.SetAutoAdvance(true)
		c.Clock = clk
	}
	cases := []struct {
		name    string
		script  map[string][]recovery.ControlReply
		outcome events.Outcome
		actions string
		paused  bool
	}{
		{"first retry works", nil, events.OutcomeRecovered, "retry_turn", false},
		{"switch provider after retries", map[string][]recovery.ControlReply{
			"retry_turn": {overloaded(), overloaded()},
		}, events.OutcomeRecovered, "retry_turn retry_turn switch_provider", false},
		{"degrade", map[string][]recovery.ControlReply{
			"retry_turn":      {overloaded(), overloaded(), overloaded()},
			"switch_provider": {overloaded()},
			"resume_session":  {overloaded()},
		}, events.OutcomeDegraded, "retry_turn retry_turn switch_provider resume_session degrade", false},
		{"everything fails", map[string][]recovery.ControlReply{
			"retry_turn":      {overloaded(), overloaded()},
			"switch_provider": {overloaded()},
			"resume_session":  {overloaded()},
			"degrade":         {overloaded()},
		}, events.OutcomeFailed, "retry_turn retry_turn switch_provider resume_session degrade", true},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, 1, fast)
			rt := &fakeRuntime{script: tc.script}
			rt.serve(t, f.nc)
			session := fmt.Sprintf("r%d", i)
			f.append(session, "", &events.SessionStarted{Provider: "anthropic"})
			f.append(session, "t1", &events.TurnStarted{})
			last := f.append(session, "t1", &events.TurnFailed{Stage: events.StageExecute, Error: *overloaded().Error})
			c := recovery.NewCommand(recovery.KindRetryTurn, "acme", session, "t1", "turn failed: overloaded", []uint64{last})
			f.issue(c)
			st := f.wait(c.ID)
			if st.Outcome != tc.outcome {
				t.Fatalf("outcome %s, want %s (%+v)", st.Outcome, tc.outcome, st)
			}
			if got := strings.Join(rt.actions(), " "); got != tc.actions {
				t.Fatalf("runtime was asked %q, want %q", got, tc.actions)
			}
			evs := f.events(session)
			if n := count(evs, events.TypeRecoveryAttempted); n != len(strings.Fields(tc.actions))+boolInt(tc.paused) {
				t.Fatalf("%d attempts recorded for %d requests", n, len(strings.Fields(tc.actions)))
			}
			if f.state(session).Paused != tc.paused {
				t.Fatalf("paused = %v, want %v", !tc.paused, tc.paused)
			}
		})
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestRuntimeUnavailableIsNotRetriedBlindly(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	f.append("s1", "", &events.SessionStarted{})
	f.append("s1", "t1", &events.TurnStarted{})
	last := f.append("s1", "t1", &events.TurnFailed{Stage: events.StageExecute, Error: events.ErrorInfo{Message: "boom"}})
	c := recovery.NewCommand(recovery.KindDistill, "acme", "s1", "", "context full", []uint64{last})
	start := time.Now()
	f.issue(c)
	st := f.wait(c.ID)
	if st.Outcome != events.OutcomeFailed || !f.state("s1").Paused {
		t.Fatalf("no runtime: %+v, paused %v; want failed and paused", st, f.state("s1").Paused)
	}
	var classes []string
	for _, e := range f.events("s1") {
		if e.Type == events.TypeRecoveryAttempted {
			p, _ := e.Payload()
			classes = append(classes, p.(*events.RecoveryAttempted).Class)
		}
	}
	if len(classes) != 2 || classes[0] != string(recovery.ClassRuntimeUnavailable) {
		t.Fatalf("attempt classes %v: want one runtime_unavailable distill attempt, then the pause", classes)
	}
	if time.Since(start) > 20*time.Second {
		t.Fatalf("took %s: no-responders must not wait for timeouts", time.Since(start))
	}
}

// TestCompletionSaysWhatHappened checks recovery.completed's detail in
// the words of docs/control.md: a 401 is not retried, a runtime that does
// not answer is runtime_unavailable.
func TestCompletionSaysWhatHappened(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	detail := func(session string) string {
		for _, e := range f.events(session) {
			if e.Type == events.TypeRecoveryCompleted {
				p, _ := e.Payload()
				return p.(*events.RecoveryCompleted).Detail
			}
		}
		return ""
	}
	f.append("auth", "", &events.SessionStarted{})
	f.append("auth", "t1", &events.TurnStarted{})
	last := f.append("auth", "t1", &events.TurnFailed{Stage: events.StageExecute, Error: events.ErrorInfo{
		Message: "invalid x-api-key", HTTPStatus: 401, Code: "authentication_error", Kind: events.KindLogic}})
	c := recovery.NewCommand(recovery.KindRetryTurn, "acme", "auth", "t1", "turn failed: 401", []uint64{last})
	f.issue(c)
	if st := f.wait(c.ID); st.Outcome != events.OutcomeFailed {
		t.Fatalf("401: %+v", st)
	}
	if got, want := detail("auth"), "retry_turn: not retried (authentication); session paused"; got != want {
		t.Errorf("401: detail %q, want %q", got, want)
	}

	f.append("gone", "", &events.SessionStarted{})
	last = f.append("gone", "", &events.DistillationRequested{Reason: "manual"})
	c = recovery.NewCommand(recovery.KindDistill, "acme", "gone", "", "context full", []uint64{last})
	f.issue(c)
	f.wait(c.ID)
	if got := detail("gone"); !strings.HasPrefix(got, "distill: distill failed (runtime_unavailable): no runtime answers") || !strings.HasSuffix(got, "; session paused") {
		t.Errorf("no runtime: detail %q", got)
	}
}

func TestInvalidCommandIsParked(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	f.append("s1", "", &events.SessionStarted{})
	body := []byte(`{"id":"bogus-1","kind":"explode","tenant":"acme","session":"s1","reason":"x","issue":1}`)
	if _, err := f.js.Publish(context.Background(), recovery.CommandSubject("acme", "s1"), body, jetstream.WithMsgID("bogus-1")); err != nil {
		t.Fatal(err)
	}
	st := f.wait("bogus-1")
	if st.State != recovery.StateParked || !strings.Contains(st.Reason, "invalid command") {
		t.Fatalf("status %+v", st)
	}
	s := f.state("s1")
	if !s.Paused || !s.CommandDone("bogus-1") {
		t.Fatalf("session paused %v, parked recorded %v", s.Paused, s.CommandDone("bogus-1"))
	}
}

// TestParkStoredAloneBeforeStillPausesTheSession: a park is one atomic
// batch (recovery.parked and session.paused) with ids fixed by the
// command. When an earlier delivery stored the park alone (the session
// was paused then, and has been resumed since), the batch is refused for
// that id; the park still pauses the session and records its status.
func TestParkStoredAloneBeforeStillPausesTheSession(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	f.append("s1", "", &events.SessionStarted{})
	// The worker's id for this command's park (worker.event: the
	// command's issue time, zero here, and "<id>/<session>/parked").
	parked, err := events.NewAt(time.Now().UTC(), events.DeterministicID(time.Unix(0, 0), "bogus-2/s1/parked"), "acme", "s1", "",
		&events.RecoveryParked{CommandID: "bogus-2", Kind: "explode", Reason: "an earlier delivery", Deliveries: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.log.Append(context.Background(), []events.Event{parked}); err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"id":"bogus-2","kind":"explode","tenant":"acme","session":"s1","reason":"x"}`)
	if _, err := f.js.Publish(context.Background(), recovery.CommandSubject("acme", "s1"), body, jetstream.WithMsgID("bogus-2")); err != nil {
		t.Fatal(err)
	}
	st := f.wait("bogus-2")
	if st.State != recovery.StateParked {
		t.Fatalf("status %+v", st)
	}
	if s := f.state("s1"); !s.Paused {
		t.Fatal("the session is not paused after its command was parked")
	}
}

// TestOpenRefusesOtherDeliverySettings: a worker that expects other
// delivery settings than the consumers hold is refused with a
// SettingsError and joins nothing; one that expects nothing takes the
// stored settings.
func TestOpenRefusesOtherDeliverySettings(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 0)
	w, err := worker.New(f.nc, f.log, worker.Config{Name: "other", Delivery: recovery.DeliveryConfig{AckWait: 10 * time.Second}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = w.Open(context.Background())
	var serr *recovery.SettingsError
	if !errors.As(err, &serr) || len(serr.Diffs) != 1 || serr.Diffs[0].Stored != "3s" || serr.Diffs[0].Asked != "10s" {
		t.Fatalf("open with another ack wait: %v", err)
	}
	if got := w.Partitions(); len(got) != 0 {
		t.Fatalf("refused worker owns %v", got)
	}
	w, err = worker.New(f.nc, f.log, worker.Config{Name: "plain"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	if len(w.Partitions()) != 4 {
		t.Fatalf("plain worker owns %v, want all 4", w.Partitions())
	}
}
