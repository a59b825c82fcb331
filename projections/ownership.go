package projections

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/turnstone-dev/turnstone/events"
)

// What a projector does so that the states it holds are those of a fresh
// fold of the log whenever it acts on them, whoever held its partitions
// before (issue 21): it drops a partition's states when it acquires the
// partition, when it releases it, and the moment the partition's pin moves
// away from it; and it checks a session's snapshot, and a state before it
// saves it, against the log's count of the session's events.

// pinHeader is the header that carries the pin id of a pinned_client
// priority group on each delivery (ADR-42).
const pinHeader = "Nats-Pin-Id"

// The subjects of the server's pin advisories for a consumer of
// AGENT_EVENTS: $JS.EVENT.ADVISORY.CONSUMER.PINNED.<stream>.<consumer>
// and .UNPINNED.<stream>.<consumer> (nats-server, ADR-42).
const (
	pinnedAdvisoryPrefix   = "$JS.EVENT.ADVISORY.CONSUMER.PINNED." + events.EventsStream + "."
	unpinnedAdvisoryPrefix = "$JS.EVENT.ADVISORY.CONSUMER.UNPINNED." + events.EventsStream + "."
)

// PinAdvisorySubjects are the subjects a projector sharing its partitions
// subscribes to, to hear at once that the pin of one of its consumers
// moved: the PINNED and UNPINNED advisories of AGENT_EVENTS' consumers.
func PinAdvisorySubjects() []string {
	return []string{pinnedAdvisoryPrefix + "*", unpinnedAdvisoryPrefix + "*"}
}

// pinMoved records the pin id of a delivery of partition part and reports
// whether the pin moved since the partition's last delivery (another id,
// or a move heard of meanwhile). The first delivery after Acquire moves
// nothing: nothing of the partition is held then.
func (p *Projector) pinMoved(ps *partition, part int, pin string) bool {
	ps.mu.Lock()
	moved := ps.lost || (ps.pin != "" && pin != "" && pin != ps.pin)
	if pin != "" {
		ps.pin = pin
	}
	ps.lost = false
	ps.mu.Unlock()
	if moved {
		p.l.Warn().Int("partition", part).Msg("the partition's pin moved: its states are dropped and restored from the log")
		p.reconcileAfterMove(part)
		if p.cfg.OnPinMoved != nil {
			p.cfg.OnPinMoved(part)
		}
	}
	return moved
}

// pinLost drops the states of partition part at once: its pin moved away
// (heard from the server). The next delivery, whatever its pin id, finds
// the partition's states dropped again before it is folded.
func (p *Projector) pinLost(part int, why string) {
	p.mu.Lock()
	ps, held := p.parts[part]
	p.mu.Unlock()
	if !held {
		return
	}
	ps.mu.Lock()
	had := ps.pin != ""
	if had {
		ps.lost, ps.pin = true, ""
	}
	ps.mu.Unlock()
	if !had {
		return // never pinned to this projector in this holding: nothing folded to lose
	}
	p.l.Warn().Int("partition", part).Str("why", why).Msg("the partition's pin moved away: its states are dropped")
	p.dropPartition(part)
	p.reconcileAfterMove(part)
	if p.cfg.OnPinMoved != nil {
		p.cfg.OnPinMoved(part)
	}
}

// reconcileAfterMove reconciles partition part's index with the log
// indexSettle after its pin moved, if the projector still holds it
// (whatever IndexEvery). A row written around a move may land after a
// newer row of its session, whether or not a state dropped was dirty
// (dropPartition reconciles those at once): a write whose ack did not
// come in time (the server the pin left was lost) may still be stored,
// after the newer row written in its place. (Rows are published without
// nats.go's retry, which sent a refused write again on a timer of its
// own and so could store two rows of one key in the other order:
// putSummary.)
func (p *Projector) reconcileAfterMove(part int) {
	time.AfterFunc(indexSettle, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if ps, held := p.parts[part]; held && ps.lease.Err() == nil {
			p.suspectIndex(part)
		}
	})
}

// dropPartition forgets every session state of partition part. A state
// whose index row was not stored yet (dirty: its events are acknowledged,
// and nothing would write the row again until the session's next event)
// marks the partition's index suspect: the index loop reconciles it with
// the log (ReconcileIndex) while the partition is held. Its row is not
// written from the dropped state, which another holder may have passed.
func (p *Projector) dropPartition(part int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	unstored := false
	for _, t := range p.sessions {
		if int(t.partition) == part {
			unstored = unstored || t.dirty
			p.drop(t)
		}
	}
	if unstored {
		p.suspectIndex(part)
	}
}

// redeliver resets partition part's consumer to its acknowledgement floor
// after its pin moved back to this projector, so that what was delivered
// to another client (or lost with a server) and not acknowledged comes
// again now, not after AckWait; what comes again and is folded already is
// skipped by the fold.
func (p *Projector) redeliver(part int, consumer string) {
	defer p.wg.Done()
	p.mu.Lock()
	ps, held := p.parts[part]
	p.mu.Unlock()
	lease := p.runCtx
	if held {
		lease = ps.lease
	}
	ctx, cancel := context.WithTimeout(lease, p.log.Config().Timeout)
	defer cancel()
	if _, err := p.log.JetStream().ResetConsumer(ctx, events.EventsStream, consumer); err != nil && ctx.Err() == nil {
		p.l.Debug().Err(err).Int("partition", part).Msg("reset to the acknowledgement floor")
	}
}

// watchPins subscribes to the pin advisories of AGENT_EVENTS' consumers.
func (p *Projector) watchPins() error {
	nc := p.log.JetStream().Conn()
	for _, subject := range PinAdvisorySubjects() {
		sub, err := nc.Subscribe(subject, p.pinAdvisory)
		if err != nil {
			return err
		}
		p.pinSubs = append(p.pinSubs, sub)
	}
	return nil
}

// pinAdvisory handles a PINNED or UNPINNED advisory of a consumer of a
// partition this projector holds: UNPINNED, or PINNED to another id than
// the one its deliveries carry, means another client may receive the
// partition now.
func (p *Projector) pinAdvisory(m *nats.Msg) {
	unpinned := strings.HasPrefix(m.Subject, unpinnedAdvisoryPrefix)
	consumer := strings.TrimPrefix(strings.TrimPrefix(m.Subject, unpinnedAdvisoryPrefix), pinnedAdvisoryPrefix)
	var adv struct {
		PinnedClientID string `json:"pinned_id"`
		Group          string `json:"group"`
	}
	// nats-server's own advisory (ADR-42). One that does not decode is
	// read as its subject says, for any group and with no pin id: an
	// unpin still drops the partition's states, a pin drops nothing.
	derr := json.Unmarshal(m.Data, &adv)
	if adv.Group != "" && adv.Group != p.cfg.Group {
		return
	}
	p.mu.Lock()
	part := -1
	var ps *partition
	for n, x := range p.parts {
		if x.consumer == consumer {
			part, ps = n, x
		}
	}
	p.mu.Unlock()
	if ps == nil {
		return
	}
	if derr != nil {
		p.l.Warn().Err(derr).Str("subject", m.Subject).Msg("a pin advisory that does not decode: read by its subject alone")
	}
	if !unpinned {
		ps.mu.Lock()
		same := adv.PinnedClientID == "" || adv.PinnedClientID == ps.pin
		ps.mu.Unlock()
		if same {
			return
		}
	}
	why := "advisory: unpinned"
	if !unpinned {
		why = "advisory: pinned to another client"
	}
	p.pinLost(part, why)
}

// current returns the state of ev's session as the log holds it now, at
// least up to ev (which the log holds: it was delivered): empty when its
// subject names no valid session (nothing to read back), or when ev is
// the session's first and only event (one direct get tells; nothing to
// restore), else its last snapshot and the events after it (Restore),
// checked against the log. A read served by a replica a moment behind
// the stream's leader can end before ev: it is read again, a few times,
// before current gives up (ErrLogUnavailable), so that no state is ever
// folded on from a point short of the session's events before ev.
func (p *Projector) current(ctx context.Context, ev events.Event) (*Session, error) {
	if !events.ValidToken(ev.Tenant) || !events.ValidToken(ev.Session) {
		// A subject that names no session: nothing can be read back by
		// it; its events are folded as they come (an invalid index row).
		return &Session{}, nil
	}
	if first, n, err := p.log.Head(ctx, ev.Tenant, ev.Session); err == nil && first == ev.Seq && n == 1 && ev.Seq != 0 {
		p.mu.Lock()
		p.newFast++
		p.mu.Unlock()
		return &Session{}, nil
	}
	var state *Session
	b := backoff.NewExponentialBackOff(backoff.WithInitialInterval(20*time.Millisecond), backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(0), backoff.WithMaxElapsedTime(0))
	err := backoff.Retry(func() error {
		s, err := Restore(ctx, p.log, p.store, ev.Tenant, ev.Session)
		if err == nil && s.LastSeq < ev.Seq {
			err = fmt.Errorf("%w: the log read ends at seq %d, before the event at %d (a replica behind its leader)", events.ErrLogUnavailable, s.LastSeq, ev.Seq)
		}
		state = s
		return err
	}, backoff.WithContext(backoff.WithMaxRetries(b, restoreTries-1), ctx))
	if err != nil {
		return nil, err
	}
	return p.checked(ctx, state), nil
}

// restoreTries is how many times current reads a session before it gives
// up (the pauses between double from 20 ms: 300 ms in all).
const restoreTries = 5

// checked returns s when the log holds, up to s.LastSeq, no more events of
// its session than s folded; otherwise the session folded afresh from the
// log (the log wins: a snapshot written from a state that missed events,
// or a held state that did), after OnSnapshotMismatch. The count is
// looked at first (events.Log.CountThrough, two direct gets); only when it
// says the log holds more is the session read, up to s.LastSeq, to
// confirm it: a read that a replica behind its leader serves can only
// hold fewer events, never more. When the log cannot be read, s.
func (p *Projector) checked(ctx context.Context, s *Session) *Session {
	if s == nil || s.LastSeq == 0 || s.Session == "" {
		return s
	}
	logged, err := p.log.CountThrough(ctx, s.Tenant, s.Session, s.LastSeq)
	if err != nil || logged <= s.Events {
		return s
	}
	var evs []events.Event
	err = p.log.ReadSession(ctx, s.Tenant, s.Session, events.ReadOptions{UntilSeq: s.LastSeq}, func(ev events.Event) error {
		evs = append(evs, ev)
		return nil
	})
	if err != nil || len(evs) == 0 {
		return s
	}
	through := FoldLog(evs)
	if through.Events <= s.Events {
		return s // the count was a replica's, a moment behind
	}
	p.l.Warn().Str("session", s.Tenant+"/"+s.Session).Uint64("last_seq", s.LastSeq).Int("folded", s.Events).Int("logged", through.Events).
		Msg("a state disagrees with the log (it missed events): the log wins, the session is folded again from it")
	if p.cfg.OnSnapshotMismatch != nil {
		p.cfg.OnSnapshotMismatch(s.Tenant, s.Session, s.Events, through.Events)
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	fresh, err := Restore(rctx, p.log, nil, s.Tenant, s.Session)
	if err != nil || fresh.LastSeq < s.LastSeq {
		// The fold up to s.LastSeq is right; what follows comes as it is
		// delivered, or is read at the next restore.
		return through
	}
	return fresh
}
