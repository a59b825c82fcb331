package telemetry

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/turnstone-dev/turnstone/events"
)

// Forgetting sessions: ObserveEvent keeps, per session, the last stream
// sequence it observed and the turns it saw start and not end. A session
// with no open turn and no event for ForgetAfter is dropped from memory by
// a sweep that runs, inside ObserveEvent, at most every sweepEvery (so
// within ForgetAfter plus a minute).
const (
	// ForgetAfter is how long a session with no turn in flight stays in
	// memory after its last event. A redelivery of one of its events that
	// comes later (JetStream redelivers an unacknowledged event after the
	// consumer's AckWait: one minute for the projector) counts again.
	ForgetAfter = 15 * time.Minute
	sweepEvery  = time.Minute
)

// ObserveEvent updates the metrics fed from the event stream with ev, an
// event as read from the log (events.DecodeStored, events.Log.Follow):
// events_total, and by type the turn, distillation, recovery and breaker
// metrics (see the package documentation).
//
// Redeliveries: ObserveEvent drops an event whose Seq is not above the last
// Seq it observed in the same tenant/session (events_redelivered_total),
// the rule Session.Apply follows. It keeps that sequence itself rather than
// take the projector's word that the fold applied the event: the
// projector restores a session it has not seen from its snapshot and log
// up to the log's end, so the event that brought the session in, and the
// ones folded ahead with it, are never "applied" although each is
// delivered once. The consumer delivers each session's events in stream
// order, so only repeats are dropped. Events with Seq 0 (not read from the
// log) are always counted.
//
// Invalid events (Err set, data that does not decode, a turn event without
// a turn) count in events_total and invalid_events_total and nothing else,
// as the fold does not apply them either. ObserveEvent trusts the
// validation that events.DecodeStored did (Err); it does not validate
// again.
//
// Turns: ObserveEvent remembers the turns of each session it saw start and
// not end. turn.started of a turn not open opens it (turns_started_total,
// turns_in_flight up); turn.completed, turn.failed or turn.abandoned of an
// open turn closes it (its counter, turns_in_flight down). A start of a
// turn already open, and an end of a turn not open (never seen start, or
// already ended), count in turn_events_unmatched_total{type} and nothing
// else, so the turn equation of the package documentation always holds. A
// session.rewound closes the open turns that started after its to_seq (the
// rewind undid them; no end will come): they count as abandoned, and in
// turns_rewound_total.
func (m *Metrics) ObserveEvent(ev events.Event) {
	if m == nil {
		return
	}
	t := m.turns
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	t.sweep(now)
	s := t.session(ev.Tenant, ev.Session)
	s.seen = now
	if ev.Seq != 0 {
		if ev.Seq <= s.lastSeq {
			m.redelivered.Inc()
			return
		}
		s.lastSeq = ev.Seq
	}
	m.events.WithLabelValues(typeLabel(ev.Type)).Inc()
	if ev.Err != nil {
		m.invalid.Inc()
		return
	}
	switch ev.Type {
	case events.TypeTurnStarted, events.TypeTurnCompleted, events.TypeTurnAbandoned:
		if ev.Turn == "" {
			m.invalid.Inc()
			return
		}
		if ev.Type == events.TypeTurnStarted {
			t.start(s, ev)
		} else {
			t.end(s, ev, "")
		}
	case events.TypeTurnFailed:
		p, ok := payload[*events.TurnFailed](m, ev)
		if !ok {
			return
		}
		if ev.Turn == "" {
			m.invalid.Inc()
			return
		}
		t.end(s, ev, label(string(p.Stage)))
	case events.TypeSessionRewound:
		if p, ok := payload[*events.SessionRewound](m, ev); ok {
			t.rewind(s, p.ToSeq)
		}
	case events.TypeDistillationCompleted:
		if p, ok := payload[*events.DistillationCompleted](m, ev); ok {
			m.distillations.WithLabelValues("run", label(p.Trigger)).Inc()
		}
	case events.TypeDistillationSkipped:
		if p, ok := payload[*events.DistillationSkipped](m, ev); ok {
			m.distillations.WithLabelValues("skipped", label(p.Reason)).Inc()
		}
	case events.TypeRecoveryAttempted:
		if p, ok := payload[*events.RecoveryAttempted](m, ev); ok {
			m.attempts.WithLabelValues(label(p.Kind), label(string(p.Result)), label(p.Class)).Inc()
		}
	case events.TypeRecoveryCompleted:
		if p, ok := payload[*events.RecoveryCompleted](m, ev); ok {
			m.outcomes.WithLabelValues(label(p.Kind), label(p.Strategy), label(string(p.Outcome))).Inc()
			if p.Kind == "repair_orphans" && (p.Outcome == events.OutcomeRecovered || p.Outcome == events.OutcomeDegraded) {
				m.orphanRepairs.Inc()
			}
		}
	case events.TypeRecoveryParked:
		if p, ok := payload[*events.RecoveryParked](m, ev); ok {
			m.parked.WithLabelValues(label(p.Kind)).Inc()
		}
	case events.TypeBreakerChanged:
		if p, ok := payload[*events.BreakerChanged](m, ev); ok {
			if v, known := breakerValue(p.To); known {
				m.breakers.WithLabelValues(label(ev.Tenant), label(p.Provider)).Set(v)
			}
		}
	}
}

// payload decodes ev's data as P, counting the event invalid when it does
// not decode.
func payload[P events.Payload](m *Metrics, ev events.Event) (P, bool) {
	var zero P
	p, err := ev.Payload()
	if err != nil {
		m.invalid.Inc()
		return zero, false
	}
	typed, ok := p.(P)
	if !ok {
		m.invalid.Inc()
		return zero, false
	}
	return typed, true
}

// Turn end kinds, as the unmatched metric labels them.
var turnTypes = []events.Type{events.TypeTurnStarted, events.TypeTurnCompleted, events.TypeTurnFailed, events.TypeTurnAbandoned}

// turnStages are the stages turns_failed_total always exports, zero or not.
var turnStages = []events.Stage{events.StageContext, events.StageHistory, events.StageExecute, events.StageFinalize}

type sessionKey struct{ tenant, session string }

// sessionSeen is what ObserveEvent remembers of one session.
type sessionSeen struct {
	lastSeq uint64
	// open maps the turns seen start and not end to the stream sequence
	// of their turn.started (0 when it carried none).
	open map[string]uint64
	seen time.Time
}

// turnTracker holds the per-session memory and the turn metrics. It is a
// prometheus.Collector that reads the turn counters under the same lock
// ObserveEvent holds, so every scrape sees the turn equation hold.
type turnTracker struct {
	mu        sync.Mutex
	now       func() time.Time
	lastSweep time.Time
	sessions  map[sessionKey]*sessionSeen

	started, completed, abandoned, rewound, inFlight float64
	failed                                           map[string]float64 // by stage label
	unmatched                                        map[events.Type]float64

	dStarted, dCompleted, dFailed, dAbandoned, dRewound, dInFlight, dUnmatched, dSessions *prometheus.Desc
}

func newTurnTracker(namespace string) *turnTracker {
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "", name), help, labels, nil)
	}
	return &turnTracker{
		now:       time.Now,
		sessions:  map[sessionKey]*sessionSeen{},
		failed:    map[string]float64{},
		unmatched: map[events.Type]float64{},

		dStarted:   desc("turns_started_total", "Turns seen start (turn.started of a turn not already open)."),
		dCompleted: desc("turns_completed_total", "Open turns ended by turn.completed."),
		dFailed:    desc("turns_failed_total", "Open turns ended by turn.failed, by the stage that threw.", "stage"),
		dAbandoned: desc("turns_abandoned_total", "Open turns ended by turn.abandoned, or undone by a session.rewound."),
		dRewound:   desc("turns_rewound_total", "Open turns a session.rewound undid (also counted in turns_abandoned_total)."),
		dInFlight:  desc("turns_in_flight", "Turns seen start and not yet end."),
		dUnmatched: desc("turn_events_unmatched_total", "turn.started of a turn already open, or an end of a turn not open (never seen start, or already ended).", "type"),
		dSessions:  desc("sessions_tracked", "Sessions whose last stream sequence and open turns are held in memory."),
	}
}

// session returns the memory of a session, making it. Callers hold mu.
func (t *turnTracker) session(tenant, session string) *sessionSeen {
	k := sessionKey{tenant, session}
	s, ok := t.sessions[k]
	if !ok {
		s = &sessionSeen{}
		t.sessions[k] = s
	}
	return s
}

func (t *turnTracker) start(s *sessionSeen, ev events.Event) {
	if _, open := s.open[ev.Turn]; open {
		t.unmatched[ev.Type]++
		return
	}
	if s.open == nil {
		s.open = map[string]uint64{}
	}
	s.open[ev.Turn] = ev.Seq
	t.started++
	t.inFlight++
}

// end closes the open turn ev names; stage is the failed stage's label for
// turn.failed.
func (t *turnTracker) end(s *sessionSeen, ev events.Event, stage string) {
	if _, open := s.open[ev.Turn]; !open {
		t.unmatched[ev.Type]++
		return
	}
	delete(s.open, ev.Turn)
	t.inFlight--
	switch ev.Type {
	case events.TypeTurnCompleted:
		t.completed++
	case events.TypeTurnFailed:
		t.failed[stage]++
	case events.TypeTurnAbandoned:
		t.abandoned++
	}
}

// rewind closes the open turns that started after toSeq.
func (t *turnTracker) rewind(s *sessionSeen, toSeq uint64) {
	for turn, seq := range s.open {
		if seq != 0 && seq > toSeq {
			delete(s.open, turn)
			t.inFlight--
			t.abandoned++
			t.rewound++
		}
	}
}

// sweep forgets the sessions with no open turn whose last event is older
// than ForgetAfter, at most once every sweepEvery. Callers hold mu.
func (t *turnTracker) sweep(now time.Time) {
	if now.Sub(t.lastSweep) < sweepEvery {
		return
	}
	t.lastSweep = now
	for k, s := range t.sessions {
		if len(s.open) == 0 && now.Sub(s.seen) >= ForgetAfter {
			delete(t.sessions, k)
		}
	}
}

// Describe implements prometheus.Collector.
func (t *turnTracker) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{t.dStarted, t.dCompleted, t.dFailed, t.dAbandoned, t.dRewound, t.dInFlight, t.dUnmatched, t.dSessions} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: it reads every turn metric
// under one lock.
func (t *turnTracker) Collect(ch chan<- prometheus.Metric) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(t.dStarted, prometheus.CounterValue, t.started)
	ch <- prometheus.MustNewConstMetric(t.dCompleted, prometheus.CounterValue, t.completed)
	ch <- prometheus.MustNewConstMetric(t.dAbandoned, prometheus.CounterValue, t.abandoned)
	ch <- prometheus.MustNewConstMetric(t.dRewound, prometheus.CounterValue, t.rewound)
	ch <- prometheus.MustNewConstMetric(t.dInFlight, prometheus.GaugeValue, t.inFlight)
	ch <- prometheus.MustNewConstMetric(t.dSessions, prometheus.GaugeValue, float64(len(t.sessions)))
	for _, st := range turnStages {
		if _, ok := t.failed[string(st)]; !ok {
			ch <- prometheus.MustNewConstMetric(t.dFailed, prometheus.CounterValue, 0, string(st))
		}
	}
	for st, n := range t.failed {
		ch <- prometheus.MustNewConstMetric(t.dFailed, prometheus.CounterValue, n, st)
	}
	for _, typ := range turnTypes {
		ch <- prometheus.MustNewConstMetric(t.dUnmatched, prometheus.CounterValue, t.unmatched[typ], string(typ))
	}
}
