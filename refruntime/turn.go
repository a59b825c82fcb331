package refruntime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/recovery"
)

// TurnSpec describes one turn. The zero value is a turn without tools and
// without fault, with a generated prompt.
type TurnSpec struct {
	// TurnID is the turn's id (a subject token); default a new ULID.
	TurnID string
	// Prompt is the user's message that starts the turn; default
	// "Task <n>: ..." with n the turn's number in this runtime.
	Prompt string
	// Trigger is turn.started's trigger; default "user" ("retry" for the
	// turns retry_turn runs).
	Trigger string
	// Tools are the tool_use blocks of the assistant message, run in
	// order; none: the assistant answers with text alone.
	Tools []ToolSpec
	// Reply is the text of the final assistant message; default "Done:
	// <turn id>." (a real model's answers differ from turn to turn; the
	// same output three times in a row is a loop the reconciler breaks).
	Reply string
	// Fault injects a failure (see Fault); nil runs the turn normally.
	Fault Fault
}

// ToolSpec is one tool call of a turn: a tool_use block named Name with
// Input (a JSON object; default {}), answered by a tool_result whose
// content is Result (default "ok: <Name>") and whose is_error is IsError.
type ToolSpec struct {
	Name    string
	Input   json.RawMessage
	Result  string
	IsError bool
}

// Outcome is how a turn ended, as RunTurn saw it.
type Outcome string

// The turn outcomes.
const (
	// OutcomeCompleted: turn.completed was recorded.
	OutcomeCompleted Outcome = "completed"
	// OutcomeFailed: turn.failed was recorded (FaultStageThrows,
	// FaultProvider, a provider outage).
	OutcomeFailed Outcome = "failed"
	// OutcomeCrashed: the turn stopped mid-tool (FaultCrashMidTool); it has
	// no end in the log.
	OutcomeCrashed Outcome = "crashed"
	// OutcomeHung: the turn started and will never end (FaultHang).
	OutcomeHung Outcome = "hung"
)

// TurnResult is what a turn recorded. FirstSeq and LastSeq are the stream
// sequences of its first event (session.started for a session's first
// turn, else turn.started) and its last; Events counts its events.
// ToolUseIDs are the ids of its tool_use blocks, in order. Stage and Error
// are set for OutcomeFailed: the stage that failed and the error stored.
// Provider is the provider the turn ran on.
type TurnResult struct {
	Session    string
	Turn       string
	Outcome    Outcome
	Provider   string
	ToolUseIDs []string
	Stage      events.Stage
	Error      *events.ErrorInfo
	FirstSeq   uint64
	LastSeq    uint64
	Events     int
}

// defaultCrashTool is the tool a FaultCrashMidTool turn without tools
// calls.
var defaultCrashTool = ToolSpec{Name: "Bash", Input: json.RawMessage(`{"command":"ls"}`)}

// checkTurn validates session and spec and applies the spec's defaults
// that do not depend on the runtime's state.
func checkTurn(session string, spec *TurnSpec) error {
	var errs []error
	if !events.ValidToken(session) {
		errs = append(errs, fmt.Errorf("session: %q is not a subject token", session))
	}
	if spec.TurnID == "" {
		spec.TurnID = events.NewID()
	} else if !events.ValidToken(spec.TurnID) {
		errs = append(errs, fmt.Errorf("turn id: %q is not a subject token", spec.TurnID))
	}
	if spec.Trigger == "" {
		spec.Trigger = "user"
	}
	if spec.Reply == "" {
		spec.Reply = "Done: " + spec.TurnID + "."
	}
	if spec.Fault != nil {
		if err := spec.Fault.check(); err != nil {
			errs = append(errs, err)
		}
	}
	tools := append([]ToolSpec(nil), spec.Tools...)
	if _, crash := spec.Fault.(FaultCrashMidTool); crash && len(tools) == 0 {
		tools = append(tools, defaultCrashTool)
	}
	for i := range tools {
		tool := &tools[i]
		if tool.Name == "" {
			errs = append(errs, fmt.Errorf("tools[%d].name: required", i))
		}
		in := bytes.TrimSpace(tool.Input)
		switch {
		case len(in) == 0:
			tool.Input = json.RawMessage(`{}`)
		case in[0] != '{' || !json.Valid(in):
			errs = append(errs, fmt.Errorf("tools[%d].input: must be a JSON object", i))
		}
		if tool.Result == "" {
			tool.Result = "ok: " + tool.Name
		}
	}
	spec.Tools = tools
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidTurn, err)
	}
	return nil
}

// RunTurn runs one turn of session and returns what it recorded. The
// turn's events are appended as it goes (see the package comment for the
// sequence), each stage taking Config.StageDelay. A fault in spec is not
// an error: RunTurn reports it in the result's Outcome (OutcomeFailed,
// OutcomeCrashed, OutcomeHung) once its events are stored.
//
// The turn start is conditional on the session's last sequence
// (events.ExpectLastSeq; 0 with session.started when the log holds no
// event of the session): on events.ErrConflict RunTurn re-reads the
// session and tries again, up to Config.ConflictRetries times.
//
// Errors: ErrInvalidTurn (a session or turn id that is not a token, a
// tool without name, an input that is not a JSON object) or
// ErrInvalidFault, wrapped; ErrClosed; the log's errors
// (events.ErrConflict after the retries, events.ErrLogUnavailable); the
// context's error when ctx ends or the runtime is closed mid-turn. A turn
// cut short by an error after its start is left in flight in the log.
func (r *Runtime) RunTurn(ctx context.Context, session string, spec TurnSpec) (TurnResult, error) {
	ctx, cancel := r.turnContext(ctx)
	defer cancel()
	t, err := r.begin(ctx, session, spec)
	if err != nil {
		return TurnResult{}, err
	}
	return t.run(ctx)
}

// AsyncTurn is a turn StartTurnAsync started; its goroutine belongs to
// the runtime (Close waits for it).
type AsyncTurn struct {
	turn string
	done chan struct{}
	res  TurnResult
	err  error
}

// Turn returns the turn's id.
func (a *AsyncTurn) Turn() string { return a.turn }

// Done is closed when the turn has returned (as RunTurn would).
func (a *AsyncTurn) Done() <-chan struct{} { return a.done }

// Wait waits for the turn and returns what RunTurn would have, or ctx's
// error when ctx ends first (the turn goes on).
func (a *AsyncTurn) Wait(ctx context.Context) (TurnResult, error) {
	select {
	case <-a.done:
		return a.res, a.err
	case <-ctx.Done():
		return TurnResult{}, ctx.Err()
	}
}

// StartTurnAsync starts a turn as RunTurn does and returns once its
// turn.started is stored, so the turn is in flight; the rest of the turn
// runs on a goroutine of the runtime. Use it to start a second turn of a
// session mid-turn (with a Config.StageDelay long enough for the first to
// be still running). ctx bounds the whole turn, not only its start; Close
// cancels it too. The errors are RunTurn's errors before the start.
func (r *Runtime) StartTurnAsync(ctx context.Context, session string, spec TurnSpec) (*AsyncTurn, error) {
	ctx, cancel := r.turnContext(ctx)
	t, err := r.begin(ctx, session, spec)
	if err != nil {
		cancel()
		return nil, err
	}
	a := &AsyncTurn{turn: t.id, done: make(chan struct{})}
	if !r.goOwned(func() {
		defer cancel()
		defer close(a.done)
		a.res, a.err = t.run(ctx)
	}) {
		cancel()
		return nil, ErrClosed
	}
	return a, nil
}

// turnRun is one turn in progress.
type turnRun struct {
	r        *Runtime
	session  string
	spec     TurnSpec
	id       string
	provider string
	started  time.Time
	stageAt  time.Time
	res      TurnResult
}

// begin validates the turn, updates the session's memory and records the
// turn's start.
func (r *Runtime) begin(ctx context.Context, session string, spec TurnSpec) (*turnRun, error) {
	if err := checkTurn(session, &spec); err != nil {
		return nil, fmt.Errorf("run turn: %w", err)
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, ErrClosed
	}
	s := r.sessionLocked(session)
	s.known = true
	if spec.Prompt == "" {
		r.prompts++
		spec.Prompt = fmt.Sprintf("Task %d: list the files in the working directory and summarize them.", r.prompts)
	}
	last := spec
	last.TurnID, last.Fault, last.Trigger = "", nil, ""
	s.last = &last
	provider := s.provider
	r.mu.Unlock()

	now := time.Now()
	t := &turnRun{r: r, session: session, spec: spec, id: spec.TurnID, provider: provider, started: now, stageAt: now}
	t.res = TurnResult{Session: session, Turn: t.id, Provider: provider}
	if err := t.start(ctx); err != nil {
		return nil, fmt.Errorf("run turn %s/%s %s: start: %w", r.cfg.Tenant, session, t.id, err)
	}
	r.l.Debug().Str("session", session).Str("turn", t.id).Stringer("fault", faultName{spec.Fault}).Msg("turn started")
	return t, nil
}

// faultName prints a Fault or "none".
type faultName struct{ f Fault }

func (f faultName) String() string {
	if f.f == nil {
		return "none"
	}
	return f.f.String()
}

// start appends turn.started (after session.started for a session the log
// does not hold yet), conditionally on the session's last sequence, and
// re-reads the session on a conflict.
func (t *turnRun) start(ctx context.Context) error {
	r := t.r
	opened, err := r.event(t.session, "", &events.SessionStarted{
		Runtime:  r.cfg.Name + " (turnstone refruntime)",
		Model:    r.cfg.Model,
		Provider: t.provider,
		Kind:     "main",
	})
	if err != nil {
		return err
	}
	started, err := r.event(t.session, t.id, &events.TurnStarted{
		Prompt:     t.spec.Prompt,
		Trigger:    t.spec.Trigger,
		DeadlineMS: r.cfg.TurnDeadline.Milliseconds(),
	})
	if err != nil {
		return err
	}
	var acks []events.Ack
	err = retryConflicts(ctx, r.cfg.ConflictRetries, func() error {
		last, err := r.log.LastSeq(ctx, r.cfg.Tenant, t.session)
		fresh := errors.Is(err, events.ErrSessionNotFound)
		if err != nil && !fresh {
			return backoff.Permanent(err)
		}
		evs := []events.Event{started}
		if fresh {
			evs = []events.Event{opened, started}
		}
		acks, err = r.log.Append(ctx, evs, events.ExpectLastSeq(last))
		return err
	}, func(attempt int) {
		r.l.Debug().Str("session", t.session).Str("turn", t.id).Int("attempt", attempt).Msg("turn start conflicted: re-reading the session")
	})
	if err != nil {
		return err
	}
	t.note(acks)
	return nil
}

// run records the rest of the turn after its start.
func (t *turnRun) run(ctx context.Context) (TurnResult, error) {
	ref := recovery.TurnRef{Session: t.session, Turn: t.id}
	t.r.work(ref, 1)
	defer t.r.work(ref, -1)
	if err := t.steps(ctx); err != nil {
		return t.res, fmt.Errorf("run turn %s/%s %s: %w", t.r.cfg.Tenant, t.session, t.id, err)
	}
	return t.res, nil
}

func (t *turnRun) steps(ctx context.Context) error {
	throws, _ := t.spec.Fault.(FaultStageThrows)
	if throws.Stage == events.StageContext {
		return t.throw(ctx, throws)
	}
	if err := t.stage(ctx, events.StageContext); err != nil {
		return err
	}
	if _, hang := t.spec.Fault.(FaultHang); hang {
		t.res.Outcome = OutcomeHung
		return nil
	}

	if err := t.emit(ctx, t.message(events.RoleUser, "", textBlock(t.spec.Prompt))); err != nil {
		return err
	}
	if throws.Stage == events.StageHistory {
		return t.throw(ctx, throws)
	}
	if err := t.stage(ctx, events.StageHistory); err != nil {
		return err
	}

	if throws.Stage == events.StageExecute {
		return t.throw(ctx, throws)
	}
	if f, ok := t.providerFault(); ok {
		return t.providerFail(ctx, f)
	}
	if len(t.spec.Tools) > 0 {
		if crashed, err := t.tools(ctx); crashed || err != nil {
			return err
		}
	}
	if err := t.emit(ctx, t.message(events.RoleAssistant, "end_turn", textBlock(t.spec.Reply))); err != nil {
		return err
	}
	if err := t.stage(ctx, events.StageExecute); err != nil {
		return err
	}

	if throws.Stage == events.StageFinalize {
		return t.throw(ctx, throws)
	}
	if err := t.stage(ctx, events.StageFinalize); err != nil {
		return err
	}
	if err := t.emit(ctx, &events.TurnCompleted{Reason: "end_turn", DurationMS: time.Since(t.started).Milliseconds()}); err != nil {
		return err
	}
	t.r.endStreak(t.session)
	t.res.Outcome = OutcomeCompleted
	return nil
}

// tools records the assistant's tool_use message, runs each tool and
// records the user message with the results. It reports whether the turn
// crashed mid-tool (FaultCrashMidTool).
func (t *turnRun) tools(ctx context.Context) (crashed bool, err error) {
	blocks := []events.ContentBlock{textBlock(fmt.Sprintf("I will use %d tool(s).", len(t.spec.Tools)))}
	for _, tool := range t.spec.Tools {
		id := "toolu_" + events.NewID()
		t.res.ToolUseIDs = append(t.res.ToolUseIDs, id)
		blocks = append(blocks, events.ContentBlock{Type: events.BlockToolUse, ID: id, Name: tool.Name, Input: tool.Input})
	}
	if err := t.emit(ctx, t.message(events.RoleAssistant, "tool_use", blocks...)); err != nil {
		return false, err
	}
	_, crash := t.spec.Fault.(FaultCrashMidTool)
	results := make([]events.ContentBlock, 0, len(t.spec.Tools))
	for i, tool := range t.spec.Tools {
		id := t.res.ToolUseIDs[i]
		if err := t.emit(ctx, &events.ToolCallStarted{ToolUseID: id, Name: tool.Name}); err != nil {
			return false, err
		}
		if crash {
			t.res.Outcome = OutcomeCrashed
			t.r.l.Warn().Str("session", t.session).Str("turn", t.id).Str("tool_use_id", id).Msg("injected crash between tool_use and tool_result")
			if t.r.cfg.OnCrash != nil {
				t.r.cfg.OnCrash(t.session, t.id)
			}
			return true, nil
		}
		began := time.Now()
		if err := sleep(ctx, t.r.cfg.StageDelay); err != nil {
			return false, err
		}
		if err := t.emit(ctx, &events.ToolCallCompleted{ToolUseID: id, Name: tool.Name, DurationMS: time.Since(began).Milliseconds(), IsError: tool.IsError}); err != nil {
			return false, err
		}
		content, err := json.Marshal(tool.Result)
		if err != nil {
			return false, fmt.Errorf("encode tool result: %w", err)
		}
		results = append(results, events.ContentBlock{Type: events.BlockToolResult, ToolUseID: id, IsError: tool.IsError, Content: content})
	}
	return false, t.emit(ctx, t.message(events.RoleUser, "", results...))
}

// providerFault returns the provider failure the execute stage meets: the
// spec's FaultProvider, else an outage of the turn's provider.
func (t *turnRun) providerFault() (FaultProvider, bool) {
	if f, ok := t.spec.Fault.(FaultProvider); ok {
		if f.Provider == "" {
			f.Provider = t.provider
		}
		return f, true
	}
	t.r.mu.Lock()
	defer t.r.mu.Unlock()
	if o, ok := t.r.outages[t.provider]; ok {
		return FaultProvider{Status: o.status, RetryAfter: o.retryAfter, Provider: t.provider}, true
	}
	return FaultProvider{}, false
}

// providerFail records the provider's error and the turn's failure.
func (t *turnRun) providerFail(ctx context.Context, f FaultProvider) error {
	info := ProviderError(f.Provider, f.Status, f.RetryAfter)
	n := t.r.streak(t.session, fmt.Sprintf("%s/%d/%s", info.Provider, info.HTTPStatus, info.Code))
	err := t.emit(ctx,
		&events.ErrorRecorded{ErrorInfo: info, Consecutive: n, Stage: events.StageExecute},
		&events.TurnFailed{Stage: events.StageExecute, Error: info})
	if err != nil {
		return err
	}
	t.res.Outcome, t.res.Stage, t.res.Error = OutcomeFailed, events.StageExecute, &info
	return nil
}

// throw records turn.failed for a FaultStageThrows.
func (t *turnRun) throw(ctx context.Context, f FaultStageThrows) error {
	msg := f.Message
	if msg == "" {
		msg = fmt.Sprintf("refruntime: injected failure in the %s stage", f.Stage)
	}
	info := events.ErrorInfo{Message: msg, Kind: events.KindLogic}
	if err := t.emit(ctx, &events.TurnFailed{Stage: f.Stage, Error: info}); err != nil {
		return err
	}
	t.res.Outcome, t.res.Stage, t.res.Error = OutcomeFailed, f.Stage, &info
	return nil
}

// stage waits Config.StageDelay and records that the stage completed.
func (t *turnRun) stage(ctx context.Context, s events.Stage) error {
	if err := sleep(ctx, t.r.cfg.StageDelay); err != nil {
		return err
	}
	d := time.Since(t.stageAt)
	t.stageAt = time.Now()
	return t.emit(ctx, &events.TurnStageCompleted{Stage: s, DurationMS: d.Milliseconds()})
}

// emit appends events of the turn carrying ps, in order.
func (t *turnRun) emit(ctx context.Context, ps ...events.Payload) error {
	evs := make([]events.Event, len(ps))
	for i, p := range ps {
		ev, err := t.r.event(t.session, t.id, p)
		if err != nil {
			return err
		}
		evs[i] = ev
	}
	// Stored together or not at all: a runtime that dies mid-call leaves
	// none of them, not the first alone.
	acks, err := t.r.log.Append(ctx, evs, events.Atomic())
	if err != nil {
		return err
	}
	t.note(acks)
	return nil
}

func (t *turnRun) note(acks []events.Ack) {
	for _, a := range acks {
		if t.res.FirstSeq == 0 {
			t.res.FirstSeq = a.Seq
		}
		t.res.LastSeq = a.Seq
		t.res.Events++
	}
}

// message returns a message.appended payload; assistant messages get a
// message id, the model and the stop reason.
func (t *turnRun) message(role events.Role, stop string, blocks ...events.ContentBlock) *events.MessageAppended {
	m := &events.MessageAppended{Role: role, Content: blocks}
	if role == events.RoleAssistant {
		m.MessageID = "msg_" + events.NewID()
		m.Model = t.r.cfg.Model
		m.StopReason = stop
	}
	return m
}

func textBlock(s string) events.ContentBlock {
	return events.ContentBlock{Type: events.BlockText, Text: s}
}

// event returns a new event of the runtime's tenant and source.
func (r *Runtime) event(session, turn string, p events.Payload) (events.Event, error) {
	ev, err := events.New(r.cfg.Tenant, session, turn, p)
	if err != nil {
		return events.Event{}, err
	}
	ev.Source = r.source
	return ev, nil
}

// streak counts a provider error of session: 1 for the first, one more
// for each same error in a row.
func (r *Runtime) streak(session, key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sessionLocked(session)
	if s.errKey != key {
		s.errKey, s.errCount = key, 0
	}
	s.errCount++
	return s.errCount
}

// endStreak resets session's error streak after a completed turn.
func (r *Runtime) endStreak(session string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sessionLocked(session)
	s.errKey, s.errCount = "", 0
}

// sleep waits d, or returns ctx's error when ctx ends first.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// retryConflicts runs op, and again while it fails with
// events.ErrConflict (another writer appended to the session first: op
// re-reads it), at most retries more times, with a short randomised
// exponential back-off (5 ms, growing to at most 50 ms, each pause
// jittered by half) so that writers racing for one session spread out.
// It honours ctx, and returns op's last error (a backoff.Permanent one
// unwrapped). notify, when set, is called before each retry with its
// number (1, 2, ...).
func retryConflicts(ctx context.Context, retries int, op func() error, notify func(attempt int)) error {
	b := backoff.NewExponentialBackOff(backoff.WithInitialInterval(5*time.Millisecond),
		backoff.WithMaxInterval(50*time.Millisecond), backoff.WithRandomizationFactor(0.5), backoff.WithMaxElapsedTime(0))
	attempt := 0
	return backoff.RetryNotify(func() error {
		err := op()
		if err != nil && !errors.Is(err, events.ErrConflict) {
			return backoff.Permanent(err)
		}
		return err
	}, backoff.WithContext(backoff.WithMaxRetries(b, uint64(max(retries, 0))), ctx), func(error, time.Duration) {
		attempt++
		if notify != nil {
			notify(attempt)
		}
	})
}
