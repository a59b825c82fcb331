package projections

import (
	"context"
	"fmt"
	"slices"
	"sort"

	"github.com/turnstone-dev/turnstone/events"
)

// Rewinds (session.rewound).
//
// A session.rewound at stream sequence S with to_seq T rewinds the session
// to T: every event of the session with T < seq < S is marked rewound. It
// stays in the log, and a mark is never lifted, but it no longer counts.
// The session's state is then the fold of its live events (the ones not
// marked), in stream order: right after the rewind, the fold of the live
// events up to T, then the rewind itself. A later rewind to a point inside
// a range already rewound does not bring those events back; a rewind to
// before an earlier rewind (nested) undoes that rewind too, and its range
// merges with the earlier one.
//
// The fold is pure and keeps no events, so Apply cannot take back the
// events a rewind undoes. Apply of a session.rewound records the rewind
// (Rewinds), marks its range (Rewound) and, when the state holds events
// after T, sets NeedsRefold; the caller then rebuilds the state from the
// session's events with Refold (any source) or RefoldLog (the log).
// FoldLog, Restore and the Projector do this themselves.
//
// A refold keeps, from the state before it: the identity, the position
// (Events, FirstSeq, LastSeq, FirstTime, LastTime), LastSnapshotSeq, and
// the rewind record (Rewinds, Rewound, Totals.Rewinds); RewoundEvents is
// counted afresh. Everything else (turns, messages, tool calls, orphans,
// violations, distillations, errors, the pause, the recovery commands,
// forks and breakers) is the fold of the live events: what the rewound
// events recorded no longer counts, a pause they recorded included.

// Rewind is one session.rewound.
type Rewind struct {
	// AtSeq is the sequence of the session.rewound event; ToSeq the
	// sequence it rewinds to. The events in between are rewound.
	AtSeq uint64 `json:"at_seq"`
	ToSeq uint64 `json:"to_seq"`
	// Reason says why, for people.
	Reason string `json:"reason,omitempty"`
	// CommandID names the rewind_session command that rewound it, if any.
	CommandID string `json:"command_id,omitempty"`
}

// SeqRange is the inclusive range From..To of stream sequences.
type SeqRange struct {
	From uint64 `json:"from"`
	To   uint64 `json:"to"`
}

// Contains reports whether seq lies in the range.
func (r SeqRange) Contains(seq uint64) bool { return r.From <= seq && seq <= r.To }

// EventSource calls fn with a session's events in stream order, from its
// first event, and returns the first error fn returns (or its own, for a
// log that fails). *events.Log's ReadSession, bound to a session, is one.
type EventSource func(fn func(events.Event) error) error

// FoldLog folds a session's log (its events in stream order, as ReadSession
// yields them) into a new Session, honouring rewinds: at each
// session.rewound that undoes events, it refolds the live events (see
// Refold), so the result never has NeedsRefold set. Without rewinds it is
// the plain fold: Apply of each event in turn. To refold, it keeps a copy
// of the state every 256 events (while a rewind lies ahead) and refolds
// from the latest copy that the rewind leaves intact, so a rewind costs a
// fold of the events since that copy.
func FoldLog(evs []events.Event) *Session {
	s := &Session{}
	if !slices.ContainsFunc(evs, func(ev events.Event) bool { return ev.Type == events.TypeSessionRewound }) {
		for _, ev := range evs {
			s.Apply(ev)
		}
		return s
	}
	f := newFolder(s, evs)
	for _, ev := range evs {
		f.apply(ev)
	}
	return s
}

// checkpointEvery is how many events a folder folds between two copies of
// the state it keeps.
const checkpointEvery = 256

// folder folds the events of log onto s as FoldLog does, keeping copies
// of the state to refold from while rewinds lie ahead.
type folder struct {
	s     *Session
	log   []events.Event
	marks []*kept // copies of s, oldest first
	ahead int     // session.rewound events of log after s.LastSeq
	n     int
}

// newFolder returns a folder that folds the rest of log onto s (a state
// of a prefix of log: empty, or restored from a snapshot).
func newFolder(s *Session, log []events.Event) *folder {
	f := &folder{s: s, log: log}
	for _, ev := range log {
		if ev.Type == events.TypeSessionRewound && ev.Seq > s.LastSeq {
			f.ahead++
		}
	}
	if f.ahead > 0 && s.LastSeq > 0 && !s.NeedsRefold {
		f.marks = append(f.marks, keep(s))
	}
	return f
}

// apply applies ev and refolds when it asks for it, from the latest copy
// of the state that is still a base for it.
func (f *folder) apply(ev events.Event) []Violation {
	vs := f.s.Apply(ev)
	if ev.Type == events.TypeSessionRewound {
		f.ahead--
	}
	if f.s.NeedsRefold {
		for len(f.marks) > 0 && !f.s.isBase(f.marks[len(f.marks)-1].s) {
			f.marks = f.marks[:len(f.marks)-1] // a base no more, ever
		}
		var base *kept
		if len(f.marks) > 0 {
			base = f.marks[len(f.marks)-1]
		}
		_ = f.s.refold(base.state(), sliceSource(f.log)) // a slice never fails
	}
	if f.n++; f.n%checkpointEvery == 0 && f.ahead > 0 {
		f.marks = append(f.marks, keep(f.s))
	}
	return vs
}

// sliceSource is an EventSource over evs.
func sliceSource(evs []events.Event) EventSource {
	return func(fn func(events.Event) error) error {
		for _, ev := range evs {
			if err := fn(ev); err != nil {
				return err
			}
		}
		return nil
	}
}

// Refold rebuilds a state whose NeedsRefold is set from the session's
// events, which src must yield in stream order from the session's first
// event, at least up to LastSeq (later ones are ignored): the live events
// (those in no Rewound range) are folded again, the rewound ones are only
// counted (RewoundEvents), and the fields the package comment on rewinds
// names are kept. Events after a pending rewind that Apply folded before
// Refold ran are folded again too, so a late Refold is still right.
//
// Refold does nothing when NeedsRefold is not set. On an error of src it
// returns that error (wrapped) and leaves the state as it was.
func (s *Session) Refold(src EventSource) error { return s.refold(nil, src) }

// RefoldLog is Refold with the session's events read from log, up to
// LastSeq. Errors: the log's (events.ErrLogUnavailable,
// events.ErrSessionNotFound), wrapped; the state is then unchanged.
func (s *Session) RefoldLog(ctx context.Context, log SessionReader) error {
	return s.refoldLog(ctx, log, nil)
}

// refoldLog is RefoldLog from base (a state of the session restored from
// a snapshot or a copy, which it takes over) when isBase holds for it,
// reading only the events after it; else from the first event.
func (s *Session) refoldLog(ctx context.Context, log SessionReader, base *Session) error {
	fresh, err := s.refoldedLog(ctx, log, base)
	if err == nil && fresh != nil {
		*s = *fresh
	}
	return err
}

// refoldedLog is refoldLog, returning the refolded state (nil when no
// refold is pending) and leaving s as it is.
func (s *Session) refoldedLog(ctx context.Context, log SessionReader, base *Session) (*Session, error) {
	if !s.NeedsRefold {
		return nil, nil
	}
	opts := events.ReadOptions{UntilSeq: s.LastSeq}
	if s.isBase(base) {
		opts.FromSeq = base.LastSeq + 1
	} else {
		base = nil
	}
	tenant, session := s.Tenant, s.Session
	return s.refolded(base, func(fn func(events.Event) error) error {
		return log.ReadSession(ctx, tenant, session, opts, fn)
	})
}

// kept is a copy of a state kept to refold from.
type kept struct {
	s *Session // never folded: refolds start from copies of it
}

// keep returns a copy of s to refold from.
func keep(s *Session) *kept { return &kept{s: s.Clone()} }

// state returns a new copy of the kept state, or nil.
func (k *kept) state() *Session {
	if k == nil {
		return nil
	}
	return k.s.Clone()
}

// isBase reports whether b, an earlier state of the session (or a kept
// copy's head), is still a state to refold s from: the fold of the live
// events up to b.LastSeq, as s's Rewound ranges now tell which are live.
// It is while no rewind since b reached back to b.LastSeq or before
// (ranges only grow, so a state that is not a base never becomes one
// again).
func (s *Session) isBase(b *Session) bool {
	if b == nil || b.NeedsRefold || b.LastSeq == 0 || b.LastSeq > s.LastSeq || b.Tenant != s.Tenant || b.Session != s.Session {
		return false
	}
	var clipped []SeqRange
	for _, r := range s.Rewound {
		if r.From > b.LastSeq {
			break
		}
		clipped = append(clipped, SeqRange{From: r.From, To: min(r.To, b.LastSeq)})
	}
	return slices.Equal(clipped, b.Rewound)
}

// refold is Refold from base, a state for which s.isBase holds, which it
// takes over (nil: from the first event); src must then yield the events
// after base.LastSeq at least (earlier ones are skipped).
func (s *Session) refold(base *Session, src EventSource) error {
	fresh, err := s.refolded(base, src)
	if err == nil && fresh != nil {
		*s = *fresh
	}
	return err
}

// refolded is refold, returning the refolded state (nil when no refold is
// pending) and leaving s as it is.
func (s *Session) refolded(base *Session, src EventSource) (*Session, error) {
	if !s.NeedsRefold {
		return nil, nil
	}
	fresh := &Session{Tenant: s.Tenant, Session: s.Session}
	past := true // past the base's events
	if base != nil {
		fresh, past = base, false
	}
	from := fresh.LastSeq
	skipped, last := 0, from
	err := src(func(ev events.Event) error {
		if !past {
			if ev.Seq == 0 || ev.Seq <= from {
				return nil // in the base already
			}
			past = true
		}
		if ev.Seq > s.LastSeq {
			return nil
		}
		if ev.Seq != 0 {
			if ev.Seq <= last {
				return nil // a redelivery: Apply ignored it too
			}
			last = ev.Seq
		}
		if s.IsRewound(ev.Seq) {
			skipped++
			return nil
		}
		fresh.Apply(ev)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("refold %s/%s: %w", s.Tenant, s.Session, err)
	}
	fresh.Version = Version
	fresh.Events += skipped
	fresh.RewoundEvents += skipped
	fresh.FirstSeq, fresh.LastSeq = s.FirstSeq, s.LastSeq
	fresh.FirstTime, fresh.LastTime = s.FirstTime, s.LastTime
	fresh.LastSnapshotSeq = s.LastSnapshotSeq
	fresh.Rewinds, fresh.Rewound = s.Rewinds, s.Rewound
	fresh.Totals.Rewinds = s.Totals.Rewinds
	// The live rewinds folded again found nothing left to undo (their
	// ranges were skipped), so fresh needs no refold of its own.
	fresh.NeedsRefold = false
	return fresh, nil
}

// IsRewound reports whether a rewind undid the event at stream sequence
// seq (it lies in a Rewound range).
func (s *Session) IsRewound(seq uint64) bool {
	i := sort.Search(len(s.Rewound), func(i int) bool { return s.Rewound[i].To >= seq })
	return i < len(s.Rewound) && s.Rewound[i].Contains(seq)
}

// RewindByCommand returns the latest rewind the command with id made, or
// nil, so that a worker that receives a rewind_session command again after
// a crash does not rewind twice. The pointer is into the state: read it,
// do not keep it across Apply.
func (s *Session) RewindByCommand(id string) *Rewind {
	id = IDKey(id)
	for i := len(s.Rewinds) - 1; i >= 0 && id != ""; i-- {
		if s.Rewinds[i].CommandID == id {
			return &s.Rewinds[i]
		}
	}
	return nil
}

// sessionRewound records a rewind and marks its range. The event must
// carry its stream sequence and a to_seq below it.
func (s *Session) sessionRewound(ev *events.Event, p *events.SessionRewound) {
	switch {
	case ev.Seq == 0:
		s.invalid(ev, "session.rewound without a stream sequence: the events it undoes are unknown")
		return
	case p.ToSeq == 0:
		s.invalid(ev, "session.rewound without to_seq")
		return
	case p.ToSeq >= ev.Seq:
		s.invalid(ev, fmt.Sprintf("session.rewound at seq %d to seq %d, which is not before it", ev.Seq, p.ToSeq))
		return
	}
	// s.LastSeq is still the previous event's: the latest event folded.
	// When it is at or before ToSeq, no event lies in the range.
	var ranges []SeqRange
	if s.LastSeq > p.ToSeq {
		if ranges = addRange(s.Rewound, SeqRange{From: p.ToSeq + 1, To: ev.Seq - 1}); len(ranges) > MaxRewoundRanges {
			s.invalid(ev, fmt.Sprintf("session.rewound to seq %d would make %d rewound ranges; the state keeps at most %d", p.ToSeq, len(ranges), MaxRewoundRanges))
			return
		}
	}
	s.Rewinds = append(s.Rewinds, Rewind{AtSeq: ev.Seq, ToSeq: p.ToSeq, Reason: detail(p.Reason), CommandID: IDKey(p.CommandID)})
	s.Totals.Rewinds++
	if ranges != nil {
		s.Rewound = ranges
		s.NeedsRefold = true
	}
}

// addRange returns rs with r added, merging the ranges it overlaps or
// touches, so that rs stays sorted, disjoint and not adjacent.
func addRange(rs []SeqRange, r SeqRange) []SeqRange {
	out := make([]SeqRange, 0, len(rs)+1)
	for _, x := range rs {
		switch {
		case x.To+1 < r.From:
			out = append(out, x)
		case r.To+1 < x.From:
			out = append(out, r)
			r = x
		default:
			r.From, r.To = min(r.From, x.From), max(r.To, x.To)
		}
	}
	return append(out, r)
}
