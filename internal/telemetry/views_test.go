package telemetry

import (
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
)

// TestObserveViewSumsTheLatestViews checks the view gauges: each session
// counts once, with its latest view; a session that becomes clean and
// idle leaves them.
func TestObserveViewSumsTheLatestViews(t *testing.T) {
	m := NewMetrics(Namespace)
	reg := m.Registry()
	broken := projections.View{Tenant: "a", Session: "s1", Status: projections.StatusBroken,
		Counts: projections.Counts{OrphansOpen: 1, OrphansTotal: 1, ViolationsOpen: 2, ViolationsTotal: 2}}
	repaired := projections.View{Tenant: "a", Session: "s1", Status: projections.StatusIdle,
		Counts: projections.Counts{OrphansRepaired: 1, OrphansTotal: 1, ViolationsOpen: 1, ViolationsResolved: 1, ViolationsTotal: 2}}
	paused := projections.View{Tenant: "a", Session: "s2", Status: projections.StatusPaused}
	want := func(step string, sessions map[string]float64, orphans, violations map[string]float64) {
		t.Helper()
		for st, n := range sessions {
			if got, _ := value(t, reg, "turnstone_sessions", map[string]string{"status": st}); got != n {
				t.Errorf("%s: sessions{status=%s} = %v, want %v", step, st, got, n)
			}
		}
		for st, n := range orphans {
			if got, _ := value(t, reg, "turnstone_orphans", map[string]string{"state": st}); got != n {
				t.Errorf("%s: orphans{state=%s} = %v, want %v", step, st, got, n)
			}
		}
		for st, n := range violations {
			if got, _ := value(t, reg, "turnstone_violations", map[string]string{"state": st}); got != n {
				t.Errorf("%s: violations{state=%s} = %v, want %v", step, st, got, n)
			}
		}
	}
	m.ObserveView(broken)
	m.ObserveView(paused)
	want("broken and paused", map[string]float64{"broken": 1, "paused": 1, "in_turn": 0},
		map[string]float64{"open": 1, "repaired": 0, "reset": 0}, map[string]float64{"open": 2, "resolved": 0, "reset": 0})
	m.ObserveView(repaired)
	want("repaired", map[string]float64{"broken": 0, "paused": 1},
		map[string]float64{"open": 0, "repaired": 1}, map[string]float64{"open": 1, "resolved": 1})
	m.ObserveView(projections.View{Tenant: "a", Session: "s2", Status: projections.StatusIdle})
	m.ObserveView(projections.InvalidSubjectView("agent.evt.a.*", "a", "*", 1, "bad"))
	want("resumed", map[string]float64{"paused": 0}, nil, map[string]float64{"open": 1})
	if n := len(m.views.sessions); n != 1 {
		t.Errorf("%d sessions remembered, want 1 (the clean idle one is forgotten)", n)
	}
	var nilMetrics *Metrics
	nilMetrics.ObserveView(broken)
	nilMetrics.ObserveSession(&projections.Session{})
}

// TestInterruptedIsComputedWhenRead: a history session in turn counts as
// interrupted once its last event is older than the live horizon, as of
// the scrape; a live one, or a recent one, stays in_turn.
func TestInterruptedIsComputedWhenRead(t *testing.T) {
	m := NewMetrics(Namespace)
	reg := m.Registry()
	fold := func(session string, history bool, at time.Time) {
		s := &projections.Session{}
		evs := []events.Payload{&events.SessionStarted{History: history}, &events.TurnStarted{}}
		for i, p := range evs {
			turn := ""
			if i == 1 {
				turn = "t1"
			}
			ev, err := events.NewAt(at, events.NewID(), "a", session, turn, p)
			if err != nil {
				t.Fatal(err)
			}
			ev.Seq = uint64(i + 1)
			s.Apply(ev)
		}
		m.ObserveSession(s)
	}
	fold("old-history", true, time.Now().Add(-365*24*time.Hour))
	fold("new-history", true, time.Now())
	fold("old-live", false, time.Now().Add(-365*24*time.Hour))
	for st, n := range map[string]float64{"interrupted": 1, "in_turn": 2} {
		if got, _ := value(t, reg, "turnstone_sessions", map[string]string{"status": st}); got != n {
			t.Errorf("sessions{status=%s} = %v, want %v", st, got, n)
		}
	}
}
