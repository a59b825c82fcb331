package refruntime

import (
	"context"
	"fmt"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/recovery"
)

// session is what the runtime remembers of one session. Guarded by
// Runtime.mu.
type session struct {
	id       string
	known    bool // the runtime ran (or adopted) it: it answers for it
	provider string
	last     *TurnSpec // the last turn run, for retry_turn
	strategy string    // set by pivot_strategy
	errKey   string    // the provider error of the current streak
	errCount int       // how many in a row

	requests []recovery.ControlRequest
	notices  []recovery.ControlRequest
	scripts  map[string][]ScriptedReply
	queue    []queued                         // control requests waiting to be served, in order
	serving  bool                             // a goroutine drains queue
	replies  map[string]recovery.ControlReply // sent, by command id, attempt and action
}

type outage struct {
	status     int
	retryAfter time.Duration
}

// sessionLocked returns the state of session id, creating it (unknown)
// when there is none. r.mu must be held.
func (r *Runtime) sessionLocked(id string) *session {
	s := r.sessions[id]
	if s == nil {
		s = &session{id: id, provider: r.cfg.Provider}
		r.sessions[id] = s
	}
	return s
}

// Sessions returns the ids of the sessions the runtime ran or adopted, in
// no particular order.
func (r *Runtime) Sessions() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids []string
	for id, s := range r.sessions {
		if s.known {
			ids = append(ids, id)
		}
	}
	return ids
}

// Provider returns the provider session runs on now (Config.Provider until
// a switch_provider moves it).
func (r *Runtime) Provider(session string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.sessions[session]; s != nil {
		return s.provider
	}
	return r.cfg.Provider
}

// Strategy returns the strategy the last pivot_strategy request gave
// session ("" when none did).
func (r *Runtime) Strategy(session string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.sessions[session]; s != nil {
		return s.strategy
	}
	return ""
}

// Requests returns a copy of every control request received for session,
// in the order received, whatever the reply (rejected ones and the ones
// left unanswered by ModeHang included). Bodies that are not JSON are not
// kept.
func (r *Runtime) Requests(session string) []recovery.ControlRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.sessions[session]; s != nil {
		return append([]recovery.ControlRequest(nil), s.requests...)
	}
	return nil
}

// Notices returns a copy of the notice requests (action "notice") the
// runtime acknowledged for session, in order.
func (r *Runtime) Notices(session string) []recovery.ControlRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.sessions[session]; s != nil {
		return append([]recovery.ControlRequest(nil), s.notices...)
	}
	return nil
}

// SetProviderOutage makes every model call to provider fail with the HTTP
// status (400-599; see ProviderError) until ClearProviderOutage: turns on
// that provider fail as with FaultProvider, retry_turn replies failed, and
// switch_provider moves away from it. retryAfter, when positive, is quoted
// in the errors. It returns an error wrapping ErrInvalidFault for a blank
// provider or a status out of range.
func (r *Runtime) SetProviderOutage(provider string, status int, retryAfter time.Duration) error {
	f := FaultProvider{Status: status, RetryAfter: retryAfter, Provider: provider}
	if err := f.check(); err != nil {
		return err
	}
	if provider == "" {
		return fmt.Errorf("%w: outage: provider required", ErrInvalidFault)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.outages[provider] = outage{status: status, retryAfter: retryAfter}
	return nil
}

// ClearProviderOutage ends the outage of provider SetProviderOutage began.
func (r *Runtime) ClearProviderOutage(provider string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.outages, provider)
}

// Adopt makes the runtime answer for a session another process ran: it
// reads the session from the log and takes its provider (session.started)
// and its last turn's prompt (turn.started, for retry_turn). It returns an
// error wrapping events.ErrSessionNotFound when the log holds no event of
// the session, ErrInvalidTurn for a session id that is not a token, and
// the log's errors (events.ErrLogUnavailable).
func (r *Runtime) Adopt(ctx context.Context, session string) error {
	if !events.ValidToken(session) {
		return fmt.Errorf("adopt session: %w: %q is not a subject token", ErrInvalidTurn, session)
	}
	var provider, prompt string
	err := r.log.ReadSession(ctx, r.cfg.Tenant, session, events.ReadOptions{}, func(ev events.Event) error {
		if ev.Err != nil {
			return nil
		}
		p, err := ev.Payload()
		if err != nil {
			return nil
		}
		switch p := p.(type) {
		case *events.SessionStarted:
			if p.Provider != "" {
				provider = p.Provider
			}
		case *events.TurnStarted:
			prompt = p.Prompt
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("adopt session %s: %w", session, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sessionLocked(session)
	if !s.known && provider != "" {
		s.provider = provider
	}
	s.known = true
	if s.last == nil && prompt != "" {
		s.last = &TurnSpec{Prompt: prompt}
	}
	r.l.Info().Str("session", session).Str("provider", s.provider).Msg("adopted session")
	return nil
}
