package refruntime

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/rs/zerolog"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/recovery"
)

// Sentinel errors of the runtime. Match them with errors.Is.
var (
	// ErrClosed: the runtime was closed; it runs no more turns and
	// answers no more requests.
	ErrClosed = errors.New("refruntime: runtime closed")
	// ErrAlreadyOpen: Open was called twice.
	ErrAlreadyOpen = errors.New("refruntime: runtime already open")
	// ErrInvalidTurn: a TurnSpec or session id breaks a rule (see
	// TurnSpec).
	ErrInvalidTurn = errors.New("refruntime: invalid turn")
)

// Runtime is a reference agent runtime for one tenant: it records turns
// into the event log (RunTurn, StartTurnAsync) and, once open, answers
// control requests for its sessions (Open). It is safe for concurrent use.
// New starts nothing; Close stops everything it started.
type Runtime struct {
	nc     *nats.Conn
	log    events.SessionLog
	cfg    Config
	l      zerolog.Logger
	source string

	ctx    context.Context // the runtime's lifetime: cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // owned goroutines: async turns, request queues

	subMu sync.Mutex // serializes subscription changes (Open, SetMode, Close)

	mu       sync.Mutex
	closed   bool
	opened   bool
	sub      *nats.Subscription
	svc      micro.Service // the presence announcement, while subscribed
	mode     Mode
	sessions map[string]*session
	working  map[recovery.TurnRef]int // turns being run now: claimed in the presence reply
	outages  map[string]outage
	prompts  int // default prompts generated, for their numbers
}

// New returns a runtime that records into log and, once opened, answers
// control requests over nc. cfg is validated after its defaults are
// applied; logger may be nil (no logging). The errors are Config's
// (see Config.Validate) and a nil nc or log.
func New(nc *nats.Conn, log events.SessionLog, cfg Config, logger *zerolog.Logger) (*Runtime, error) {
	cfg.setDefaults()
	var errs []error
	if nc == nil {
		errs = append(errs, errors.New("nats connection: required"))
	}
	if log == nil {
		errs = append(errs, errors.New("event log: required"))
	}
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("new refruntime: %w", err)
	}
	r := &Runtime{
		nc:       nc,
		log:      log,
		cfg:      cfg,
		l:        zerolog.Nop(),
		source:   "urn:refruntime:" + cfg.Name,
		mode:     ModeServe,
		sessions: map[string]*session{},
		working:  map[recovery.TurnRef]int{},
		outages:  map[string]outage{},
	}
	if logger != nil {
		r.l = logger.With().Str("component", "refruntime").Str("tenant", cfg.Tenant).Logger()
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	return r, nil
}

// Config returns the runtime's configuration, defaults applied.
func (r *Runtime) Config() Config { return r.cfg }

// Open starts answering control requests: it subscribes to
// agent.ctl.<tenant>.* in the queue group Config.QueueGroup (unless the
// mode is ModeDown) and returns once the server has the subscription.
// Requests of one session are served one at a time, in order; sessions
// are served in parallel.
//
// Unscripted (see ScriptReplies), each action does this:
//
//   - retry_turn: runs the session's last turn again, without its fault,
//     with trigger "retry" (on Params.ToProvider when set): ok once it
//     completed, failed with its error when it failed (a provider outage).
//   - switch_provider: moves the session to Params.ToProvider, or to the
//     provider after the current one in Config.Providers: ok with
//     Provider; failed (kind logic) when there is no other provider.
//   - resume_session, pivot_strategy (records Params.Strategy, see
//     Strategy): ok.
//   - distill: reads the session back and folds it (projections.Fold); if
//     no turn is in flight, no tool_use awaits its result and no history
//     rule broke since the last distillation (the judgement the projection
//     makes of a distillation), appends distillation.requested, started
//     and completed and the summary as a meta user message, conditionally
//     on the sequence it read, and replies ok; otherwise appends
//     distillation.requested and distillation.skipped{reason} and replies
//     failed (kind logic, code the reason).
//   - degrade: ok with Degraded set.
//   - notice: ok; the request is kept (see Notices).
//   - any other action: rejected.
//
// A request for a session the runtime never ran (nor adopted, see
// Config.AdoptUnknown) is rejected, as is a body that is not JSON or names
// another tenant or session than its subject. A repeat of a request
// already answered (same command_id, attempt and action: a redelivered
// command) is recorded and gets the first reply again, without a second
// effect (rejections are not remembered).
//
// Errors: ErrAlreadyOpen, ErrClosed, the subscription's errors.
func (r *Runtime) Open(ctx context.Context) error {
	r.subMu.Lock()
	defer r.subMu.Unlock()
	r.mu.Lock()
	switch {
	case r.closed:
		r.mu.Unlock()
		return ErrClosed
	case r.opened:
		r.mu.Unlock()
		return ErrAlreadyOpen
	}
	r.opened = true
	down := r.mode == ModeDown
	r.mu.Unlock()
	if down {
		return nil
	}
	if err := r.subscribe(ctx); err != nil {
		r.mu.Lock()
		r.opened = false
		r.mu.Unlock()
		return fmt.Errorf("open refruntime: %w", err)
	}
	r.l.Info().Str("subject", recovery.ControlSubject(r.cfg.Tenant, "*")).Str("queue", r.cfg.QueueGroup).Msg("answering control requests")
	return nil
}

// Close stops answering control requests (once it returns, the server
// routes no more requests to the runtime), cancels the turns in progress
// (RunTurn, StartTurnAsync, the ones control requests run) and waits for
// the runtime's goroutines. It returns ctx's error when ctx ends first.
// Closing twice is a no-op. Close does not close the NATS connection or
// the log.
func (r *Runtime) Close(ctx context.Context) error {
	r.subMu.Lock()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		r.subMu.Unlock()
		return nil
	}
	r.closed = true
	sub, svc := r.sub, r.svc
	r.sub, r.svc = nil, nil
	r.mu.Unlock()
	var err error
	if sub != nil {
		if err = unsubscribe(sub, svc); err == nil {
			err = r.flush(ctx)
		}
	}
	r.subMu.Unlock()
	r.cancel()

	done := make(chan struct{})
	go func() {
		r.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("close refruntime: %w", ctx.Err())
	}
	if err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		return fmt.Errorf("close refruntime: unsubscribe: %w", err)
	}
	return nil
}

// Mode is how the runtime treats control requests as a whole.
type Mode string

// The runtime modes.
const (
	// ModeServe answers each request (the default).
	ModeServe Mode = "serve"
	// ModeHang receives and records each request and never replies: the
	// requester times out (nats.ErrTimeout or its context's error).
	ModeHang Mode = "hang"
	// ModeDown unsubscribes: a request meets no subscriber and the
	// requester gets nats.ErrNoResponders (or, in a queue group with
	// other instances, one of them answers).
	ModeDown Mode = "down"
)

// Mode returns the runtime's mode.
func (r *Runtime) Mode() Mode {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mode
}

// SetMode changes how the runtime treats control requests (see Mode).
// Going to ModeDown unsubscribes and coming back from it subscribes
// again, each time waiting until the server has the change; before Open
// the mode only takes effect when Open runs. Errors: an unknown mode,
// ErrClosed, the subscription's errors.
func (r *Runtime) SetMode(ctx context.Context, mode Mode) error {
	switch mode {
	case ModeServe, ModeHang, ModeDown:
	default:
		return fmt.Errorf("set mode: %q is not one of serve, hang, down", mode)
	}
	r.subMu.Lock()
	defer r.subMu.Unlock()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return ErrClosed
	}
	r.mode = mode
	opened, sub, svc := r.opened, r.sub, r.svc
	if mode == ModeDown {
		r.sub, r.svc = nil, nil
	}
	r.mu.Unlock()
	r.l.Info().Str("mode", string(mode)).Msg("control mode changed")
	switch {
	case !opened:
		return nil
	case mode == ModeDown && sub != nil:
		if err := unsubscribe(sub, svc); err != nil {
			return fmt.Errorf("set mode %s: unsubscribe: %w", mode, err)
		}
		if err := r.flush(ctx); err != nil {
			return fmt.Errorf("set mode %s: %w", mode, err)
		}
	case mode != ModeDown && sub == nil:
		if err := r.subscribe(ctx); err != nil {
			return fmt.Errorf("set mode %s: %w", mode, err)
		}
	}
	return nil
}

// subscribe subscribes to the tenant's control subjects and waits until
// the server has the subscription. r.subMu must be held.
func (r *Runtime) subscribe(ctx context.Context) error {
	sub, err := r.nc.QueueSubscribe(recovery.ControlSubject(r.cfg.Tenant, "*"), r.cfg.QueueGroup, r.receive)
	if err != nil {
		return fmt.Errorf("subscribe to control requests: %w", err)
	}
	// Announce the runtime the way NATS services do (docs/control.md,
	// "Presence"): the engine resumes sessions that waited for it.
	svc, err := micro.AddService(r.nc, micro.Config{
		Name:        recovery.PresenceService,
		Version:     "1.0.0",
		Description: "Turnstone reference agent runtime " + r.cfg.Name,
		Metadata:    map[string]string{recovery.PresenceMetaTenant: r.cfg.Tenant, recovery.PresenceMetaSessions: "*", "runtime": r.cfg.Name},
	})
	if err != nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("announce the runtime: %w", err)
	}
	if err := r.flush(ctx); err != nil {
		_ = sub.Unsubscribe()
		_ = svc.Stop()
		return err
	}
	r.mu.Lock()
	r.sub, r.svc = sub, svc
	r.mu.Unlock()
	return nil
}

// unsubscribe stops answering and announcing; sub and svc are what
// subscribe set (either may be nil).
func unsubscribe(sub *nats.Subscription, svc micro.Service) error {
	var errs []error
	if svc != nil {
		errs = append(errs, svc.Stop())
	}
	if sub != nil {
		errs = append(errs, sub.Unsubscribe())
	}
	return errors.Join(errs...)
}

// flush waits until the server has processed what the connection sent.
func (r *Runtime) flush(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, events.DefaultTimeout)
		defer cancel()
	}
	if err := r.nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	return nil
}

// goOwned runs fn on a goroutine Close waits for, unless the runtime is
// closed (then it returns false and runs nothing).
func (r *Runtime) goOwned(fn func()) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		fn()
	}()
	return true
}

// turnContext returns ctx cancelled also when the runtime closes.
func (r *Runtime) turnContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(r.ctx, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

// work counts a turn as being run (delta 1) or no longer (-1).
func (r *Runtime) work(ref recovery.TurnRef, delta int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.working[ref] += delta; r.working[ref] <= 0 {
		delete(r.working, ref)
	}
}

// Working returns the turns the runtime is running now, sorted by
// session then turn: what its answer to a presence ping claims
// (recovery.ControlReply.Turns, docs/control.md). A turn that hangs
// (FaultHang) returned already and is not among them.
func (r *Runtime) Working() []recovery.TurnRef {
	r.mu.Lock()
	out := make([]recovery.TurnRef, 0, len(r.working))
	for ref := range r.working {
		out = append(out, ref)
	}
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Session != out[j].Session {
			return out[i].Session < out[j].Session
		}
		return out[i].Turn < out[j].Turn
	})
	return out[:min(len(out), recovery.MaxClaimedTurns)]
}
