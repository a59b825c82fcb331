package telemetry

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/turnstone-dev/turnstone/events"
)

func TestNilMetricsIsNoOp(t *testing.T) {
	var m *Metrics
	ev, err := events.New("a", "b", "t", &events.TurnStarted{})
	if err != nil {
		t.Fatal(err)
	}
	m.ObserveEvent(ev)
	m.ObserveViolation("turn_unknown")
	m.CommandIssued("repair_orphans")
	m.SetFailClosed(true, "x")
	m.WorkerCommand("repair_orphans", "recovered", time.Second)
	if closed, reason := m.FailClosed(); closed || reason != "" {
		t.Errorf("FailClosed() = %v, %q on nil metrics", closed, reason)
	}
	if err := m.FailClosedCheck()(context.Background()); err != nil {
		t.Errorf("FailClosedCheck on nil metrics: %v", err)
	}
	if m.Registry() != nil {
		t.Error("Registry() of nil metrics is not nil")
	}
	if m.Handler() == nil {
		t.Error("Handler() of nil metrics is nil")
	}
}

// TestManyMetrics checks that each Metrics has its own registry: two do
// not collide and do not share values.
func TestManyMetrics(t *testing.T) {
	a, b := NewMetrics(Namespace), NewMetrics(Namespace)
	a.CommandIssued("distill")
	if got := testutil.ToFloat64(a.issued.WithLabelValues("distill")); got != 1 {
		t.Errorf("a: commands_issued_total = %v, want 1", got)
	}
	if n := testutil.CollectAndCount(b.issued); n != 0 {
		t.Errorf("b has %d commands_issued_total series, want 0", n)
	}
	c := NewMetrics("")
	c.CommandIssued("distill")
	if v, ok := value(t, c.Registry(), "commands_issued_total", map[string]string{"kind": "distill"}); !ok || v != 1 {
		t.Errorf("no namespace: commands_issued_total = %v (found %v), want 1", v, ok)
	}
}

func TestReconcilerMetrics(t *testing.T) {
	m := NewMetrics(Namespace)
	m.CommandIssued("repair_orphans")
	m.CommandIssued("repair_orphans")
	m.CommandIssued("abandon_turn")
	m.CommandIssued("Kind with spaces") // free text: "other"
	m.CommandIssued("abandon_turn")
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(`
# HELP turnstone_commands_issued_total Recovery commands the reconciler issued, by kind.
# TYPE turnstone_commands_issued_total counter
turnstone_commands_issued_total{kind="abandon_turn"} 2
turnstone_commands_issued_total{kind="other"} 1
turnstone_commands_issued_total{kind="repair_orphans"} 2
`), "turnstone_commands_issued_total"); err != nil {
		t.Error(err)
	}

	check := m.FailClosedCheck()
	if got := testutil.ToFloat64(m.failClosed); got != 0 {
		t.Errorf("reconciler_fail_closed = %v at start, want 0", got)
	}
	m.SetFailClosed(true, "projector lag 5m")
	if got := testutil.ToFloat64(m.failClosed); got != 1 {
		t.Errorf("reconciler_fail_closed = %v, want 1", got)
	}
	if closed, reason := m.FailClosed(); !closed || reason != "projector lag 5m" {
		t.Errorf("FailClosed() = %v, %q", closed, reason)
	}
	if err := check(context.Background()); !errors.Is(err, ErrFailClosed) || !strings.Contains(err.Error(), "projector lag 5m") {
		t.Errorf("FailClosedCheck() = %v, want ErrFailClosed with the reason", err)
	}
	m.SetFailClosed(false, "ignored")
	if got := testutil.ToFloat64(m.failClosed); got != 0 {
		t.Errorf("reconciler_fail_closed = %v, want 0", got)
	}
	if err := check(context.Background()); err != nil {
		t.Errorf("FailClosedCheck() = %v after fail-open", err)
	}
}

func TestWorkerMetrics(t *testing.T) {
	m := NewMetrics(Namespace)
	m.WorkerCommand("repair_orphans", "recovered", 20*time.Millisecond)
	m.WorkerCommand("repair_orphans", "recovered", 30*time.Millisecond)
	m.WorkerCommand("retry_turn", "parked", 12*time.Second)
	m.WorkerCommand("retry_turn", "failed", -time.Second) // counts as zero
	for _, c := range []struct {
		kind, outcome string
		want          float64
	}{{"repair_orphans", "recovered", 2}, {"retry_turn", "parked", 1}, {"retry_turn", "failed", 1}} {
		if got := testutil.ToFloat64(m.workerCommands.WithLabelValues(c.kind, c.outcome)); got != c.want {
			t.Errorf("worker_commands_total{%s,%s} = %v, want %v", c.kind, c.outcome, got, c.want)
		}
	}
	h := find(t, m.Registry(), "turnstone_worker_command_seconds", map[string]string{"kind": "repair_orphans"}).GetHistogram()
	if h.GetSampleCount() != 2 || h.GetSampleSum() < 0.0499 || h.GetSampleSum() > 0.0501 {
		t.Errorf("worker_command_seconds{repair_orphans}: count %d sum %v, want 2 and 0.05", h.GetSampleCount(), h.GetSampleSum())
	}
	for _, b := range h.GetBucket() {
		want := uint64(0)
		if b.GetUpperBound() >= 0.025 {
			want = 1
		}
		if b.GetUpperBound() >= 0.05 {
			want = 2
		}
		if b.GetCumulativeCount() != want {
			t.Errorf("bucket le=%v holds %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), want)
		}
	}
	h = find(t, m.Registry(), "turnstone_worker_command_seconds", map[string]string{"kind": "retry_turn"}).GetHistogram()
	if h.GetSampleCount() != 2 || h.GetSampleSum() != 12 {
		t.Errorf("worker_command_seconds{retry_turn}: count %d sum %v, want 2 and 12", h.GetSampleCount(), h.GetSampleSum())
	}
}

func TestLabel(t *testing.T) {
	for in, want := range map[string]string{
		"":                        "none",
		"turn_in_flight":          "turn_in_flight",
		"claude-3.5:beta":         "claude-3.5:beta",
		"auto: context 92% full":  "other",
		"\xff\xfe":                "other",
		strings.Repeat("a", 64):   strings.Repeat("a", 64),
		strings.Repeat("a", 65):   "other",
		"sk-ant-REDACTED/../etc?": "other",
	} {
		if got := label(in); got != want {
			t.Errorf("label(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestConcurrentObserve feeds events from many goroutines (each owning
// some sessions, and all sharing one, with redeliveries) while others
// scrape, and checks that every scrape sees the turn equation hold and
// that the totals come out exact. Run it with -race.
func TestConcurrentObserve(t *testing.T) {
	const (
		feeders = 8
		turns   = 200
	)
	m := NewMetrics(Namespace)
	reg := m.Registry()

	// Build each feeder's events first: one stream, so sequences are
	// unique per session as in the log.
	s := newStream(t)
	feeds := make([][]events.Event, feeders)
	for f := range feeders {
		session := fmt.Sprintf("s%d", f)
		for i := range turns {
			turn := fmt.Sprintf("t%d", i)
			st := s.ev("acme", session, turn, &events.TurnStarted{})
			feeds[f] = append(feeds[f], st)
			switch i % 4 {
			case 0:
				feeds[f] = append(feeds[f], s.ev("acme", session, turn, &events.TurnCompleted{}))
			case 1:
				feeds[f] = append(feeds[f], s.ev("acme", session, turn, &events.TurnFailed{Stage: events.StageExecute, Error: events.ErrorInfo{Message: "x"}}))
			case 2:
				end := s.ev("acme", session, turn, &events.TurnAbandoned{Reason: "x"})
				feeds[f] = append(feeds[f], end, end, st) // redeliveries
			case 3: // stays in flight
			}
		}
	}

	stop := make(chan struct{})
	var scrapers sync.WaitGroup
	for range 2 {
		scrapers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if started, ended := turnEquation(t, reg); started != ended {
					t.Errorf("a scrape saw turns_started_total %v but completed + failed + abandoned + in_flight %v", started, ended)
					return
				}
			}
		})
	}
	var feedersWG sync.WaitGroup
	for f := range feeders {
		feedersWG.Go(func() {
			for _, ev := range feeds[f] {
				m.ObserveEvent(ev)
				m.ObserveViolation("turn_unknown")
			}
			m.WorkerCommand("repair_orphans", "recovered", time.Millisecond)
			m.CommandIssued("repair_orphans")
			m.SetFailClosed(f%2 == 0, "x")
		})
	}
	// Every feeder also hammers one shared session with the same events.
	shared := []events.Event{s.ev("acme", "shared", "t", &events.TurnStarted{}), s.ev("acme", "shared", "t", &events.TurnCompleted{})}
	for range feeders {
		feedersWG.Go(func() {
			for _, ev := range shared {
				m.ObserveEvent(ev)
			}
		})
	}
	feedersWG.Wait()
	close(stop)
	scrapers.Wait()

	per := float64(turns / 4)
	want := map[string]float64{
		"turnstone_turns_started_total":         feeders*turns + 1,
		"turnstone_turns_completed_total":       feeders*per + 1,
		"turnstone_turns_failed_total":          feeders * per,
		"turnstone_turns_abandoned_total":       feeders * per,
		"turnstone_turns_in_flight":             feeders * per,
		"turnstone_turn_events_unmatched_total": 0,
		"turnstone_events_redelivered_total":    feeders*per*2 + (feeders-1)*2,
		"turnstone_violations_total":            feeders * float64(len(feeds[0])),
		"turnstone_commands_issued_total":       feeders,
		"turnstone_worker_commands_total":       feeders,
	}
	for name, w := range want {
		if got := sum(t, reg, name); got != w {
			t.Errorf("%s = %v, want %v", name, got, w)
		}
	}
}
