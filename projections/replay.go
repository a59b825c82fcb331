package projections

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/turnstone-dev/turnstone/events"
)

// Step is one event of a replay, as the fold saw it: the Event, the State
// right after it, the violations it gave rise to (Anomalies, in the order
// they arose, as Apply returns them) and those a repair in it resolved
// (Resolved: violations of earlier events whose ResolvedSeq is this
// event's sequence). Refolded is set when the event (a session.rewound)
// made the state fold the session again from the log.
//
// State is the replay's own state, valid until the callback returns and
// changed by the next step: Clone it to keep it.
type Step struct {
	Event     events.Event
	State     *Session
	Anomalies []Violation
	Resolved  []Violation
	Refolded  bool
}

// Replayer folds one session's events one at a time and describes each
// as a Step: the one path from events to state that every replay takes
// (engine replay, the web timeline, diff, whatif, the OpenTelemetry
// export). It refolds the state from its SessionReader when an event asks
// for it (a rewind, Session.NeedsRefold). The zero value is not usable:
// call NewReplayer. A Replayer is not safe for concurrent use.
type Replayer struct {
	log   SessionReader
	state *Session
}

// NewReplayer returns a Replayer that starts from an empty state and
// reads the session from log when a rewind needs a refold (nil: a rewind
// is folded as Apply alone can, which is exact unless it undoes events).
func NewReplayer(log SessionReader) *Replayer {
	return &Replayer{log: log, state: &Session{}}
}

// NewReplayerFrom is NewReplayer starting from state (a restored snapshot
// or a copy), which the Replayer takes over.
func NewReplayerFrom(log SessionReader, state *Session) *Replayer {
	return &Replayer{log: log, state: state}
}

// State is the state folded so far.
func (r *Replayer) State() *Session { return r.state }

// Apply folds ev and returns its Step. An event at or before the last
// sequence folded (a redelivery, an overlap of two reads) is not folded
// again: ok is false. Errors: only those of a refold's read
// (events.ErrLogUnavailable, events.ErrSessionNotFound), wrapped; the state
// then holds ev folded without the refold.
func (r *Replayer) Apply(ctx context.Context, ev events.Event) (step Step, ok bool, err error) {
	s := r.state
	if ev.Seq != 0 && ev.Seq <= s.LastSeq {
		return Step{}, false, nil
	}
	resolvedBefore := s.Totals.Resolved
	anomalies := s.Apply(ev)
	step = Step{Event: ev, State: s, Anomalies: anomalies}
	if s.NeedsRefold && r.log != nil {
		if err := s.RefoldLog(ctx, r.log); err != nil {
			return step, true, fmt.Errorf("replay seq %d: %w", ev.Seq, err)
		}
		step.Refolded = true
	}
	if s.Totals.Resolved > resolvedBefore && ev.Seq != 0 {
		for _, v := range s.Violations {
			if v.Resolved && v.ResolvedSeq == ev.Seq {
				step.Resolved = append(step.Resolved, v)
			}
		}
	}
	return step, true, nil
}

// errStopReplay ends a Replay early without an error (ErrStopReplay).
var errStopReplay = errors.New("stop replay")

// ErrStopReplay, returned by a Replay callback, ends the replay at once;
// Replay then returns nil.
var ErrStopReplay = errStopReplay

// ReplayRange bounds a Replay. From is the first stream sequence shown
// (0 or 1: every event); the events before it are folded and not shown,
// so the first step's State is the session as it then was. To is the last
// sequence folded (0: the session's last). UntilTime, when set, ends the
// replay before the first event whose time is after it (that event is
// not folded).
type ReplayRange struct {
	From, To  uint64
	UntilTime time.Time
}

// Replay folds a session of log from its first event through the range
// and calls fn with the Step of each event the range shows. It stops at
// the first error of fn (ErrStopReplay stops it quietly) or of the log,
// and returns the state folded so far: the session as of the range's end
// when it ran to the end. fn may be nil (the fold alone).
//
// Errors: the log's (events.ErrSessionNotFound, events.ErrLogUnavailable),
// and fn's, wrapped with the session's name.
func Replay(ctx context.Context, log SessionReader, tenant, session string, rng ReplayRange, fn func(Step) error) (*Session, error) {
	r := NewReplayer(log)
	from := rng.From
	err := log.ReadSession(ctx, tenant, session, events.ReadOptions{UntilSeq: rng.To}, func(ev events.Event) error {
		if !rng.UntilTime.IsZero() && ev.Time.After(rng.UntilTime) {
			return errStopReplay
		}
		step, ok, err := r.Apply(ctx, ev)
		if err != nil || !ok || fn == nil || ev.Seq < from {
			return err
		}
		return fn(step)
	})
	if r.state.Tenant == "" {
		r.state.Tenant, r.state.Session = tenant, session
	}
	if err != nil && !errors.Is(err, errStopReplay) {
		return r.state, fmt.Errorf("replay %s/%s: %w", tenant, session, err)
	}
	return r.state, nil
}
