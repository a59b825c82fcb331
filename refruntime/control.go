package refruntime

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/recovery"
)

// ReplyMode says what a ScriptedReply does.
type ReplyMode string

// The reply modes of a ScriptedReply.
const (
	// ReplyScripted (the zero value) sends the scripted reply and does
	// nothing else.
	ReplyScripted ReplyMode = ""
	// ReplyDefault does what an unscripted request does (the action's
	// effect and its reply), after the reply's Delay.
	ReplyDefault ReplyMode = "default"
	// ReplyHang never replies to this request.
	ReplyHang ReplyMode = "hang"
)

// ScriptedReply is one reply of a script (see Runtime.ScriptReplies).
//
// With Mode ReplyScripted the reply is a recovery.ControlReply with
// Outcome (recovery.ReplyOK, ReplyFailed or ReplyRejected; empty means
// failed when Status or Error is set, else ok), Detail (default "scripted
// <outcome>"), Provider (default the session's current provider) and
// Degraded. A failed reply carries Error when set, else
// ProviderError(<current provider>, Status, 0) when Status is set, else a
// generic error of kind unknown. Delay, in every mode but ReplyHang, is
// how long the runtime waits before it replies.
type ScriptedReply struct {
	Mode     ReplyMode
	Outcome  string
	Status   int
	Error    *events.ErrorInfo
	Detail   string
	Provider string
	Degraded bool
	Delay    time.Duration
}

func (sr *ScriptedReply) check() error {
	var errs []error
	switch sr.Mode {
	case ReplyScripted, ReplyDefault, ReplyHang:
	default:
		errs = append(errs, fmt.Errorf("mode: %q is not one of \"\", default, hang", sr.Mode))
	}
	switch sr.Outcome {
	case "", recovery.ReplyOK, recovery.ReplyFailed, recovery.ReplyRejected:
	default:
		errs = append(errs, fmt.Errorf("outcome: %q is not one of ok, failed, rejected", sr.Outcome))
	}
	if sr.Status != 0 && (sr.Status < 400 || sr.Status > 599) {
		errs = append(errs, fmt.Errorf("status: must be an HTTP error status (400-599), got %d", sr.Status))
	}
	if sr.Delay < 0 {
		errs = append(errs, fmt.Errorf("delay: must not be negative, got %s", sr.Delay))
	}
	return errors.Join(errs...)
}

// reply builds the scripted reply for a session on provider.
func (sr *ScriptedReply) reply(provider string) recovery.ControlReply {
	out := sr.Outcome
	if out == "" {
		out = recovery.ReplyOK
		if sr.Status != 0 || sr.Error != nil {
			out = recovery.ReplyFailed
		}
	}
	rep := recovery.ControlReply{Outcome: out, Detail: sr.Detail, Provider: sr.Provider, Degraded: sr.Degraded}
	if rep.Detail == "" {
		rep.Detail = "scripted " + out
	}
	if rep.Provider == "" {
		rep.Provider = provider
	}
	switch {
	case sr.Error != nil:
		e := *sr.Error
		rep.Error = &e
	case out != recovery.ReplyFailed:
	case sr.Status != 0:
		e := ProviderError(provider, sr.Status, 0)
		rep.Error = &e
	default:
		rep.Error = &events.ErrorInfo{Message: "refruntime: scripted failure", Kind: events.KindUnknown}
	}
	return rep
}

// ScriptReplies queues replies for the control requests of session asking
// for action: each such request takes the next reply of the queue, in
// order, and once the queue is empty the action's default behaviour
// applies again. Scripts apply only to sessions the runtime answers for (a
// request for an unknown session is rejected without taking a reply). It
// returns an error for an invalid reply (nothing is queued then).
func (r *Runtime) ScriptReplies(session, action string, replies []ScriptedReply) error {
	var errs []error
	for i := range replies {
		if err := replies[i].check(); err != nil {
			errs = append(errs, fmt.Errorf("reply %d: %w", i, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("script replies for %s %s: %w", session, action, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sessionLocked(session)
	if s.scripts == nil {
		s.scripts = map[string][]ScriptedReply{}
	}
	s.scripts[action] = append(s.scripts[action], replies...)
	return nil
}

// queued is one control request waiting to be served.
type queued struct {
	msg *nats.Msg
	req recovery.ControlRequest
}

// receive is the subscription's handler: it records the request and
// queues it on its session, whose goroutine serves it.
func (r *Runtime) receive(m *nats.Msg) {
	session := strings.TrimPrefix(m.Subject, recovery.ControlSubject(r.cfg.Tenant, ""))
	var req recovery.ControlRequest
	if err := json.Unmarshal(m.Data, &req); err != nil {
		r.l.Warn().Err(err).Str("subject", m.Subject).Msg("malformed control request")
		r.respond(m, rejected("malformed control request: "+err.Error()))
		return
	}
	if session == recovery.PresenceSession || req.Action == recovery.ActionPing {
		// The engine's presence check (docs/control.md): answer at once,
		// in every mode but down (then nothing is subscribed).
		r.respondPresence(m, recovery.PresenceReply{ControlReply: recovery.ControlReply{Outcome: recovery.ReplyOK, Detail: "refruntime " + r.cfg.Name + " present"}, Turns: r.Working()})
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	s := r.sessionLocked(session)
	s.requests = append(s.requests, req)
	r.l.Debug().Str("session", session).Str("action", req.Action).Str("command", req.CommandID).Int("attempt", req.Attempt).Msg("control request")
	if r.mode == ModeHang {
		return
	}
	s.queue = append(s.queue, queued{msg: m, req: req})
	if s.serving {
		return
	}
	s.serving = true
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.drain(s)
	}()
}

// drain serves the session's queued requests in order until the queue is
// empty.
func (r *Runtime) drain(s *session) {
	for {
		r.mu.Lock()
		if len(s.queue) == 0 || r.closed {
			s.queue, s.serving = nil, false
			r.mu.Unlock()
			return
		}
		q := s.queue[0]
		s.queue = s.queue[1:]
		r.mu.Unlock()
		r.serve(r.ctx, s, q)
	}
}

// serve decides the reply to one request and sends it.
func (r *Runtime) serve(ctx context.Context, s *session, q queued) {
	reply, send, delay := r.decide(ctx, s, q.req)
	if !send {
		return
	}
	if err := sleep(ctx, delay); err != nil {
		return
	}
	r.l.Debug().Str("session", s.id).Str("action", q.req.Action).Str("outcome", reply.Outcome).Str("detail", reply.Detail).Msg("control reply")
	r.respond(q.msg, reply)
}

func (r *Runtime) respond(m *nats.Msg, reply recovery.ControlReply) {
	r.respondPresence(m, recovery.PresenceReply{ControlReply: reply})
}

// respondPresence sends reply (a PresenceReply claiming no turn is a
// plain ControlReply).
func (r *Runtime) respondPresence(m *nats.Msg, reply recovery.PresenceReply) {
	if m.Reply == "" {
		return
	}
	data, err := json.Marshal(reply)
	if err == nil {
		err = m.Respond(data)
	}
	if err != nil {
		r.l.Warn().Err(err).Str("subject", m.Subject).Msg("control reply not sent")
	}
}

func rejected(detail string) recovery.ControlReply {
	return recovery.ControlReply{Outcome: recovery.ReplyRejected, Detail: detail}
}

func failed(detail string, info events.ErrorInfo) recovery.ControlReply {
	return recovery.ControlReply{Outcome: recovery.ReplyFailed, Detail: detail, Error: &info}
}

// logError describes an error of the log or the runtime in a reply:
// transient when the log was unavailable or the session kept changing.
func logError(err error) events.ErrorInfo {
	kind := events.KindUnknown
	if errors.Is(err, events.ErrLogUnavailable) || errors.Is(err, events.ErrConflict) || errors.Is(err, context.DeadlineExceeded) {
		kind = events.KindTransient
	}
	return events.ErrorInfo{Message: err.Error(), Kind: kind}
}

// decide returns the reply to req, whether to send it, and how long to
// wait first. A repeat of a request already answered (same command id,
// attempt and action) gets the same reply again, without a second effect.
func (r *Runtime) decide(ctx context.Context, s *session, req recovery.ControlRequest) (recovery.ControlReply, bool, time.Duration) {
	key := ""
	if req.CommandID != "" {
		key = fmt.Sprintf("%s#%d#%s", req.CommandID, req.Attempt, req.Action)
		r.mu.Lock()
		prev, seen := s.replies[key]
		r.mu.Unlock()
		if seen {
			return prev, true, 0
		}
	}
	reply, send, delay := r.decideOnce(ctx, s, req)
	if send && key != "" && reply.Outcome != recovery.ReplyRejected {
		r.mu.Lock()
		if s.replies == nil {
			s.replies = map[string]recovery.ControlReply{}
		}
		s.replies[key] = reply
		r.mu.Unlock()
	}
	return reply, send, delay
}

func (r *Runtime) decideOnce(ctx context.Context, s *session, req recovery.ControlRequest) (recovery.ControlReply, bool, time.Duration) {
	if req.Session != "" && req.Session != s.id || req.Tenant != "" && req.Tenant != r.cfg.Tenant {
		return rejected(fmt.Sprintf("request names %s/%s, its subject %s/%s", req.Tenant, req.Session, r.cfg.Tenant, s.id)), true, 0
	}
	r.mu.Lock()
	known := s.known
	r.mu.Unlock()
	if !known && r.cfg.AdoptUnknown {
		err := r.Adopt(ctx, s.id)
		switch {
		case err == nil:
			known = true
		case !errors.Is(err, events.ErrSessionNotFound) && !errors.Is(err, ErrInvalidTurn):
			return failed("adopt session: "+err.Error(), logError(err)), true, 0
		}
	}
	if !known {
		return rejected(fmt.Sprintf("session %s is unknown to this runtime", s.id)), true, 0
	}

	r.mu.Lock()
	var script *ScriptedReply
	if q := s.scripts[req.Action]; len(q) > 0 {
		script = &q[0]
		s.scripts[req.Action] = q[1:]
	}
	provider := s.provider
	r.mu.Unlock()
	var delay time.Duration
	if script != nil {
		delay = script.Delay
		switch script.Mode {
		case ReplyHang:
			return recovery.ControlReply{}, false, 0
		case ReplyScripted:
			return script.reply(provider), true, delay
		}
	}
	return r.perform(ctx, s, req), true, delay
}

// perform does what an unscripted request for the action does (see Open).
func (r *Runtime) perform(ctx context.Context, s *session, req recovery.ControlRequest) recovery.ControlReply {
	switch req.Action {
	case recovery.ActionRetryTurn:
		return r.retryTurn(ctx, s, req)
	case recovery.ActionSwitchProvider:
		return r.switchProvider(s, req)
	case recovery.ActionResumeSession:
		return r.ok(s, "resumed")
	case recovery.ActionDistill:
		return r.distill(ctx, s, req)
	case recovery.ActionPivotStrategy:
		strategy := req.Params.Strategy
		if strategy == "" {
			strategy = "alternative"
		}
		r.mu.Lock()
		s.strategy = strategy
		r.mu.Unlock()
		return r.ok(s, "pivoted to strategy "+strategy)
	case recovery.ActionDegrade:
		rep := r.ok(s, "degraded: answering with raw output")
		rep.Degraded = true
		return rep
	case recovery.ActionNotice:
		r.mu.Lock()
		s.notices = append(s.notices, req)
		r.mu.Unlock()
		return r.ok(s, "noted")
	}
	return rejected(fmt.Sprintf("unknown action %q", req.Action))
}

// ok is an ok reply naming the session's provider.
func (r *Runtime) ok(s *session, detail string) recovery.ControlReply {
	r.mu.Lock()
	defer r.mu.Unlock()
	return recovery.ControlReply{Outcome: recovery.ReplyOK, Detail: detail, Provider: s.provider}
}

// retryTurn runs the session's last turn again, without its fault.
func (r *Runtime) retryTurn(ctx context.Context, s *session, req recovery.ControlRequest) recovery.ControlReply {
	r.mu.Lock()
	var spec TurnSpec
	if s.last != nil {
		spec = *s.last
		spec.Tools = append([]ToolSpec(nil), s.last.Tools...)
	}
	if p := req.Params.ToProvider; p != "" {
		s.provider = p
	}
	r.mu.Unlock()
	spec.Trigger = "retry"
	res, err := r.RunTurn(ctx, s.id, spec)
	if err != nil {
		return failed("retry turn: "+err.Error(), logError(err))
	}
	switch res.Outcome {
	case OutcomeCompleted:
		detail := "turn " + res.Turn + " completed"
		if req.Turn != "" {
			detail += " (retry of turn " + req.Turn + ")"
		}
		return recovery.ControlReply{Outcome: recovery.ReplyOK, Detail: detail, Provider: res.Provider}
	case OutcomeFailed:
		rep := failed(fmt.Sprintf("turn %s failed in the %s stage", res.Turn, res.Stage), *res.Error)
		rep.Provider = res.Provider
		return rep
	}
	return failed("turn "+res.Turn+" did not end", events.ErrorInfo{Message: "retried turn " + string(res.Outcome), Kind: events.KindUnknown})
}

// switchProvider moves the session to the requested or the next provider.
func (r *Runtime) switchProvider(s *session, req recovery.ControlRequest) recovery.ControlReply {
	r.mu.Lock()
	defer r.mu.Unlock()
	from, to := s.provider, req.Params.ToProvider
	if to == "" {
		to = r.nextProvider(from)
	}
	if to == "" {
		return failed("no other provider", events.ErrorInfo{
			Message: fmt.Sprintf("refruntime: no provider to switch to from %s (providers %v)", from, r.cfg.Providers),
			Kind:    events.KindLogic, Code: "no_alternative_provider",
		})
	}
	s.provider = to
	r.l.Info().Str("session", s.id).Str("from", from).Str("to", to).Msg("switched provider")
	return recovery.ControlReply{Outcome: recovery.ReplyOK, Detail: "switched from " + from + " to " + to, Provider: to}
}

// nextProvider returns the provider after from in Config.Providers
// (wrapping; the first when from is not listed), or "" when there is no
// other.
func (r *Runtime) nextProvider(from string) string {
	ps := r.cfg.Providers
	for i, p := range ps {
		if p == from {
			if next := ps[(i+1)%len(ps)]; next != from {
				return next
			}
			return ""
		}
	}
	if len(ps) > 0 {
		return ps[0]
	}
	return ""
}
