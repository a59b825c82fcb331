package telemetry

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/turnstone-dev/turnstone/projections"
)

// viewStatuses are the statuses sessions{status} exports. Idle sessions
// are not counted (the tracker forgets a clean idle session; see
// ObserveView), and no Session is ever StatusInvalid.
var viewStatuses = []projections.SessionStatus{projections.StatusPaused, projections.StatusInTurn, projections.StatusInterrupted, projections.StatusBroken}

// viewEntry is what the view tracker keeps of one session: its latest
// View's status and counts, and, for a history session in turn, when its
// last event was (it is interrupted once that is older than the live
// horizon: projections.Interrupted, computed when the gauges are read).
type viewEntry struct {
	status  projections.SessionStatus
	c       projections.Counts
	history bool
	last    time.Time
}

// mayInterrupt reports whether the entry is counted in_turn now and may
// read interrupted later.
func (e viewEntry) mayInterrupt() bool { return e.status == projections.StatusInTurn && e.history }

// clean reports whether the entry contributes nothing to any gauge.
func (e viewEntry) clean() bool {
	c := e.c
	return e.status == projections.StatusIdle && c.OrphansOpen == 0 && c.OrphansRepaired == 0 && c.OrphansReset == 0 &&
		c.ViolationsOpen == 0 && c.ViolationsResolved == 0 && c.ViolationsReset == 0
}

// viewTracker holds the latest View of every session that has one worth
// counting, and the gauges summed from them. It is a prometheus.Collector.
type viewTracker struct {
	mu       sync.Mutex
	sessions map[sessionKey]viewEntry
	inTurn   map[sessionKey]time.Time // history sessions in turn: their last event

	status                           map[projections.SessionStatus]float64
	oOpen, oRepaired, oReset         float64
	vOpen, vResolved, vReset         float64
	dSessions, dOrphans, dViolations *prometheus.Desc
}

func newViewTracker(namespace string) *viewTracker {
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "", name), help, labels, nil)
	}
	return &viewTracker{
		sessions:    map[sessionKey]viewEntry{},
		inTurn:      map[sessionKey]time.Time{},
		status:      map[projections.SessionStatus]float64{},
		dSessions:   desc("sessions", "Sessions by status (paused, in_turn, interrupted, broken) as of the latest event folded of each (projections.View; interrupted: a history session whose turn is in flight and whose last event is older than the default live horizon).", "status"),
		dOrphans:    desc("orphans", "Orphaned tool_use blocks by state (open, repaired, reset) over the sessions folded (projections.View counts).", "state"),
		dViolations: desc("violations", "Invariant violations by state (open, resolved, reset) over the sessions folded (projections.View counts).", "state"),
	}
}

// add adds (sign 1) or takes away (sign -1) e's contribution.
func (t *viewTracker) add(e viewEntry, sign float64) {
	t.status[e.status] += sign
	t.oOpen += sign * float64(e.c.OrphansOpen)
	t.oRepaired += sign * float64(e.c.OrphansRepaired)
	t.oReset += sign * float64(e.c.OrphansReset)
	t.vOpen += sign * float64(e.c.ViolationsOpen)
	t.vResolved += sign * float64(e.c.ViolationsResolved)
	t.vReset += sign * float64(e.c.ViolationsReset)
}

// ObserveView records v, the latest View of its session, replacing the
// one before: the gauges sessions{status}, orphans{state} and
// violations{state} are the sums over the latest View of every session
// observed, so /metrics tells what `engine sessions` tells, with the same
// names. Only v's Tenant, Session, Status and Counts are read. A session
// whose View is idle and has no orphan or violation in any state is
// forgotten (it adds nothing to any gauge); idle sessions are therefore
// not counted in sessions{status}. Views of invalid subjects
// (StatusInvalid) are ignored.
func (m *Metrics) ObserveView(v projections.View) {
	if m == nil || v.Status == projections.StatusInvalid {
		return
	}
	m.observeView(v.Tenant, v.Session, viewEntry{status: v.Status, c: v.Counts})
}

// ObserveSession is ObserveView of s.View() without building the whole
// View: it reads s.Status() and s.Counts(), which is what View's Status
// and Counts are. The engine calls it after each event it folds.
func (m *Metrics) ObserveSession(s *projections.Session) {
	if m == nil || s == nil {
		return
	}
	last := s.LastTime
	if last.IsZero() {
		last = s.LastStored
	}
	m.observeView(s.Tenant, s.Session, viewEntry{status: s.Status(), c: s.Counts(), history: s.History, last: last})
}

func (m *Metrics) observeView(tenant, session string, e viewEntry) {
	t := m.views
	k := sessionKey{tenant, session}
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.sessions[k]; ok {
		t.add(old, -1)
		delete(t.sessions, k)
		delete(t.inTurn, k)
	}
	if e.clean() {
		return
	}
	t.sessions[k] = e
	t.add(e, 1)
	if e.mayInterrupt() {
		t.inTurn[k] = e.last
	}
}

// Describe implements prometheus.Collector.
func (t *viewTracker) Describe(ch chan<- *prometheus.Desc) {
	ch <- t.dSessions
	ch <- t.dOrphans
	ch <- t.dViolations
}

// Collect implements prometheus.Collector: every gauge under one lock.
func (t *viewTracker) Collect(ch chan<- prometheus.Metric) {
	t.mu.Lock()
	defer t.mu.Unlock()
	// History sessions in turn whose last event is older than the
	// horizon are interrupted as of now, as every reader computes it.
	now := time.Now()
	interrupted := 0.0
	for _, last := range t.inTurn {
		if projections.Interrupted(true, 1, last, now, projections.DefaultLiveHorizon) {
			interrupted++
		}
	}
	for _, st := range viewStatuses {
		v := t.status[st]
		switch st {
		case projections.StatusInTurn:
			v -= interrupted
		case projections.StatusInterrupted:
			v += interrupted
		}
		ch <- prometheus.MustNewConstMetric(t.dSessions, prometheus.GaugeValue, v, string(st))
	}
	for _, x := range []struct {
		state string
		v     float64
	}{{projections.StateOpen, t.oOpen}, {projections.StateRepaired, t.oRepaired}, {projections.StateReset, t.oReset}} {
		ch <- prometheus.MustNewConstMetric(t.dOrphans, prometheus.GaugeValue, x.v, x.state)
	}
	for _, x := range []struct {
		state string
		v     float64
	}{{projections.StateOpen, t.vOpen}, {projections.StateResolved, t.vResolved}, {projections.StateReset, t.vReset}} {
		ch <- prometheus.MustNewConstMetric(t.dViolations, prometheus.GaugeValue, x.v, x.state)
	}
}
