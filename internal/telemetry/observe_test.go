package telemetry

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/turnstone-dev/turnstone/events"
)

// TestObserveEventSequence feeds a realistic stream: three sessions of one
// tenant and the breaker pseudo-sessions of two, with turns that complete,
// fail in different stages, are abandoned, are undone by a rewind or stay
// in flight; a redelivery, a second end, an end without a start and a
// second start; recovery attempts, outcomes and a park; distillations run
// and skipped; an invalid event and one of a newer type.
func TestObserveEventSequence(t *testing.T) {
	m := NewMetrics(Namespace)
	s := newStream(t)
	boom := events.ErrorInfo{Message: "boom", Kind: events.KindTransient}
	var evs []events.Event
	add := func(ev events.Event) events.Event { evs = append(evs, ev); return ev }

	// acme/s1: t1 completes, t2 fails in execute, t3 fails in history,
	// t4 is abandoned, t5 stays in flight.
	add(s.ev("acme", "s1", "", &events.SessionStarted{Runtime: "ref 1.0"}))
	t1start := add(s.ev("acme", "s1", "t1", &events.TurnStarted{Prompt: "hi", Trigger: "user"}))
	add(s.ev("acme", "s1", "t1", &events.TurnStageCompleted{Stage: events.StageContext, DurationMS: 3}))
	add(s.ev("acme", "s1", "t1", &events.TurnCompleted{DurationMS: 120}))
	add(s.ev("acme", "s1", "t2", &events.TurnStarted{}))
	add(s.ev("acme", "s1", "t2", &events.TurnFailed{Stage: events.StageExecute, Error: boom}))
	add(s.ev("acme", "s1", "t3", &events.TurnStarted{}))
	add(s.ev("acme", "s1", "t3", &events.TurnFailed{Stage: events.StageHistory, Error: boom}))
	add(s.ev("acme", "s1", "t4", &events.TurnStarted{}))
	add(s.ev("acme", "s1", "t4", &events.TurnAbandoned{Reason: "deadline", LastStage: events.StageContext}))
	add(s.ev("acme", "s1", "t5", &events.TurnStarted{}))
	// Anomalies: a second end of t1, an end of a turn never started, a
	// second start of the open t5.
	add(s.ev("acme", "s1", "t1", &events.TurnCompleted{}))
	add(s.ev("acme", "s1", "t9", &events.TurnFailed{Stage: events.StageFinalize, Error: boom}))
	add(s.ev("acme", "s1", "t5", &events.TurnStarted{}))
	// A redelivery of t1's start (same stream sequence): dropped.
	add(t1start)

	// acme/s2: the same turn id as s1's, its own turn; t2 in flight;
	// recovery and distillations.
	add(s.ev("acme", "s2", "t1", &events.TurnStarted{}))
	add(s.ev("acme", "s2", "t1", &events.TurnCompleted{}))
	add(s.ev("acme", "s2", "t2", &events.TurnStarted{}))
	add(s.ev("acme", "s2", "", &events.RecoveryAttempted{CommandID: "c1", Kind: "repair_orphans", Attempt: 1, Strategy: "repair_orphans", Result: "ok"}))
	add(s.ev("acme", "s2", "", &events.RecoveryCompleted{CommandID: "c1", Kind: "repair_orphans", Outcome: events.OutcomeRecovered, Strategy: "repair_orphans", Attempts: 1}))
	add(s.ev("acme", "s2", "", &events.RecoveryAttempted{CommandID: "c2", Kind: "retry_turn", Attempt: 1, Strategy: "retry", Result: "failed", Class: "rate_limit", Error: &boom}))
	add(s.ev("acme", "s2", "", &events.RecoveryAttempted{CommandID: "c2", Kind: "retry_turn", Attempt: 2, Strategy: "switch_provider", Result: "ok"}))
	add(s.ev("acme", "s2", "", &events.RecoveryCompleted{CommandID: "c2", Kind: "retry_turn", Outcome: events.OutcomeDegraded, Strategy: "switch_provider", Attempts: 2}))
	add(s.ev("acme", "s2", "", &events.RecoveryCompleted{CommandID: "c3", Kind: "repair_orphans", Outcome: events.OutcomeFailed, Strategy: "repair_orphans"}))
	add(s.ev("acme", "s2", "", &events.RecoveryParked{CommandID: "c4", Kind: "retry_turn", Reason: "failed on all 5 deliveries", Deliveries: 5}))
	add(s.ev("acme", "s2", "", &events.DistillationRequested{Reason: "auto"}))
	add(s.ev("acme", "s2", "", &events.DistillationStarted{FromSeq: 1, ToSeq: 5}))
	add(s.ev("acme", "s2", "", &events.DistillationCompleted{FromSeq: 1, ToSeq: 5, Trigger: "auto"}))
	add(s.ev("acme", "s2", "", &events.DistillationSkipped{Reason: "turn_in_flight"}))
	add(s.ev("acme", "s2", "", &events.DistillationSkipped{Reason: "unanswered_tool_use"}))
	add(s.ev("acme", "s2", "", &events.DistillationSkipped{Reason: "turn_in_flight"}))
	add(s.ev("acme", "s2", "", &events.DistillationSkipped{Reason: "context 92% full"})) // free text: "other"

	// acme/s3: t1 in flight; t2 starts after the rewind's to_seq and is
	// undone by it.
	s3t1 := add(s.ev("acme", "s3", "t1", &events.TurnStarted{}))
	add(s.ev("acme", "s3", "t2", &events.TurnStarted{}))
	add(s.ev("acme", "s3", "", &events.SessionRewound{ToSeq: s3t1.Seq, Reason: "bad turn", CommandID: "c5"}))

	// Breakers.
	add(s.ev("acme", events.BreakersSession, "", &events.BreakerChanged{Provider: "anthropic", From: "closed", To: "open", Failures: 5}))
	add(s.ev("acme", events.BreakersSession, "", &events.BreakerChanged{Provider: "openai", From: "closed", To: "open"}))
	add(s.ev("acme", events.BreakersSession, "", &events.BreakerChanged{Provider: "openai", From: "open", To: "half_open"}))
	add(s.ev("acme", events.BreakersSession, "", &events.BreakerChanged{Provider: "anthropic", From: "open", To: "half_open"}))
	add(s.ev("acme", events.BreakersSession, "", &events.BreakerChanged{Provider: "anthropic", From: "half_open", To: "closed"}))
	add(s.ev("beta", events.BreakersSession, "", &events.BreakerChanged{Provider: "anthropic", From: "closed", To: "open"}))

	// An event a publisher wrote straight to the subject, broken, and one
	// of a type this version does not know.
	s.seq++
	add(events.DecodeStored("agent.evt.3.acme.s4", s.seq, []byte(`{"type":"turn.started","oops`)))
	future := s.ev("acme", "s4", "", &events.SessionResumed{})
	future.Type, future.Data = "future.thing", json.RawMessage(`{"x":1}`)
	add(future)

	for _, ev := range evs {
		m.ObserveEvent(ev)
	}
	m.ObserveViolation("tool_use_without_result")
	m.ObserveViolation("tool_use_without_result")
	m.ObserveViolation("turn_unknown")

	reg := m.Registry()
	expected := `
# HELP turnstone_turns_started_total Turns seen start (turn.started of a turn not already open).
# TYPE turnstone_turns_started_total counter
turnstone_turns_started_total 9
# HELP turnstone_turns_completed_total Open turns ended by turn.completed.
# TYPE turnstone_turns_completed_total counter
turnstone_turns_completed_total 2
# HELP turnstone_turns_failed_total Open turns ended by turn.failed, by the stage that threw.
# TYPE turnstone_turns_failed_total counter
turnstone_turns_failed_total{stage="context"} 0
turnstone_turns_failed_total{stage="execute"} 1
turnstone_turns_failed_total{stage="finalize"} 0
turnstone_turns_failed_total{stage="history"} 1
# HELP turnstone_turns_abandoned_total Open turns ended by turn.abandoned, or undone by a session.rewound.
# TYPE turnstone_turns_abandoned_total counter
turnstone_turns_abandoned_total 2
# HELP turnstone_turns_rewound_total Open turns a session.rewound undid (also counted in turns_abandoned_total).
# TYPE turnstone_turns_rewound_total counter
turnstone_turns_rewound_total 1
# HELP turnstone_turns_in_flight Turns seen start and not yet end.
# TYPE turnstone_turns_in_flight gauge
turnstone_turns_in_flight 3
# HELP turnstone_turn_events_unmatched_total turn.started of a turn already open, or an end of a turn not open (never seen start, or already ended).
# TYPE turnstone_turn_events_unmatched_total counter
turnstone_turn_events_unmatched_total{type="turn.abandoned"} 0
turnstone_turn_events_unmatched_total{type="turn.completed"} 1
turnstone_turn_events_unmatched_total{type="turn.failed"} 1
turnstone_turn_events_unmatched_total{type="turn.started"} 1
# HELP turnstone_orphan_repairs_total repair_orphans recovery commands that ended recovered or degraded.
# TYPE turnstone_orphan_repairs_total counter
turnstone_orphan_repairs_total 1
# HELP turnstone_distillations_total Distillations: result "run" (reason is the trigger) or "skipped" (reason is why).
# TYPE turnstone_distillations_total counter
turnstone_distillations_total{reason="auto",result="run"} 1
turnstone_distillations_total{reason="other",result="skipped"} 1
turnstone_distillations_total{reason="turn_in_flight",result="skipped"} 2
turnstone_distillations_total{reason="unanswered_tool_use",result="skipped"} 1
# HELP turnstone_recovery_outcomes_total Recovery commands ended (recovery.completed), by kind, strategy and outcome.
# TYPE turnstone_recovery_outcomes_total counter
turnstone_recovery_outcomes_total{kind="repair_orphans",outcome="failed",strategy="repair_orphans"} 1
turnstone_recovery_outcomes_total{kind="repair_orphans",outcome="recovered",strategy="repair_orphans"} 1
turnstone_recovery_outcomes_total{kind="retry_turn",outcome="degraded",strategy="switch_provider"} 1
# HELP turnstone_recovery_attempts_total Recovery attempts (recovery.attempted), by kind, result and error class.
# TYPE turnstone_recovery_attempts_total counter
turnstone_recovery_attempts_total{class="none",kind="repair_orphans",result="ok"} 1
turnstone_recovery_attempts_total{class="none",kind="retry_turn",result="ok"} 1
turnstone_recovery_attempts_total{class="rate_limit",kind="retry_turn",result="failed"} 1
# HELP turnstone_commands_parked_total Recovery commands parked after their last delivery failed (recovery.parked), by kind.
# TYPE turnstone_commands_parked_total counter
turnstone_commands_parked_total{kind="retry_turn"} 1
# HELP turnstone_breaker_state Circuit breaker state per tenant and provider: 0 closed, 1 half_open, 2 open.
# TYPE turnstone_breaker_state gauge
turnstone_breaker_state{provider="anthropic",tenant="acme"} 0
turnstone_breaker_state{provider="anthropic",tenant="beta"} 2
turnstone_breaker_state{provider="openai",tenant="acme"} 1
# HELP turnstone_violations_total Invariant violations the projector saw arise, by rule.
# TYPE turnstone_violations_total counter
turnstone_violations_total{rule="tool_use_without_result"} 2
turnstone_violations_total{rule="turn_unknown"} 1
# HELP turnstone_events_redelivered_total Events dropped because their session's stream sequence was already observed (redeliveries).
# TYPE turnstone_events_redelivered_total counter
turnstone_events_redelivered_total 1
# HELP turnstone_invalid_events_total Events that break the wire contract or whose data does not decode.
# TYPE turnstone_invalid_events_total counter
turnstone_invalid_events_total 1
# HELP turnstone_sessions_tracked Sessions whose last stream sequence and open turns are held in memory.
# TYPE turnstone_sessions_tracked gauge
turnstone_sessions_tracked 6
`
	names := []string{
		"turnstone_turns_started_total", "turnstone_turns_completed_total", "turnstone_turns_failed_total",
		"turnstone_turns_abandoned_total", "turnstone_turns_rewound_total", "turnstone_turns_in_flight",
		"turnstone_turn_events_unmatched_total", "turnstone_orphan_repairs_total", "turnstone_distillations_total",
		"turnstone_recovery_outcomes_total", "turnstone_recovery_attempts_total", "turnstone_commands_parked_total",
		"turnstone_breaker_state", "turnstone_violations_total", "turnstone_events_redelivered_total",
		"turnstone_invalid_events_total", "turnstone_sessions_tracked",
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(expected), names...); err != nil {
		t.Error(err)
	}

	// events_total: every event once, by type.
	wantTypes := map[string]float64{
		"session.started": 1, "turn.started": 10, "turn.stage_completed": 1, "turn.completed": 3,
		"turn.failed": 3, "turn.abandoned": 1, "recovery.attempted": 3, "recovery.completed": 3,
		"recovery.parked": 1, "distillation.requested": 1, "distillation.started": 1,
		"distillation.completed": 1, "distillation.skipped": 4, "session.rewound": 1,
		"breaker.changed": 6, "unknown": 2, // the broken body and future.thing
	}
	var total float64
	for typ, want := range wantTypes {
		total += want
		if got := testutil.ToFloat64(m.events.WithLabelValues(typ)); got != want {
			t.Errorf("events_total{type=%q} = %v, want %v", typ, got, want)
		}
	}
	if got := sum(t, reg, "turnstone_events_total"); got != total || total != float64(len(evs)-1) {
		t.Errorf("events_total sums to %v, want %v (the %d events observed, less the redelivery)", got, total, len(evs))
	}
	if got := testutil.ToFloat64(m.orphanRepairs); got != 1 {
		t.Errorf("orphan_repairs_total = %v, want 1", got)
	}

	started, ended := turnEquation(t, reg)
	if started != ended {
		t.Errorf("turns_started_total = %v, but completed + failed + abandoned + in_flight = %v", started, ended)
	}
}

// TestObserveEventTurnTable checks the turn rules one case at a time: each
// case feeds its events into fresh metrics and checks the counters.
func TestObserveEventTurnTable(t *testing.T) {
	type counts struct{ started, completed, failed, abandoned, inFlight, unmatched, invalid, redelivered float64 }
	tests := []struct {
		name string
		feed func(s *stream) []events.Event
		want counts
	}{{
		name: "start then complete",
		feed: func(s *stream) []events.Event {
			return []events.Event{s.ev("a", "b", "t", &events.TurnStarted{}), s.ev("a", "b", "t", &events.TurnCompleted{})}
		},
		want: counts{started: 1, completed: 1},
	}, {
		name: "end without start",
		feed: func(s *stream) []events.Event {
			return []events.Event{s.ev("a", "b", "t", &events.TurnAbandoned{Reason: "x"})}
		},
		want: counts{unmatched: 1},
	}, {
		name: "two ends",
		feed: func(s *stream) []events.Event {
			return []events.Event{
				s.ev("a", "b", "t", &events.TurnStarted{}),
				s.ev("a", "b", "t", &events.TurnFailed{Stage: events.StageContext, Error: events.ErrorInfo{Message: "x"}}),
				s.ev("a", "b", "t", &events.TurnAbandoned{Reason: "x"}),
			}
		},
		want: counts{started: 1, failed: 1, unmatched: 1},
	}, {
		name: "redelivered end counts once",
		feed: func(s *stream) []events.Event {
			st, end := s.ev("a", "b", "t", &events.TurnStarted{}), s.ev("a", "b", "t", &events.TurnCompleted{})
			return []events.Event{st, end, end, st}
		},
		want: counts{started: 1, completed: 1, redelivered: 2},
	}, {
		name: "same turn id in two sessions",
		feed: func(s *stream) []events.Event {
			return []events.Event{s.ev("a", "b", "t", &events.TurnStarted{}), s.ev("a", "c", "t", &events.TurnStarted{}), s.ev("a", "c", "t", &events.TurnCompleted{})}
		},
		want: counts{started: 2, completed: 1, inFlight: 1},
	}, {
		name: "turn id reused after its end is a new turn",
		feed: func(s *stream) []events.Event {
			return []events.Event{s.ev("a", "b", "t", &events.TurnStarted{}), s.ev("a", "b", "t", &events.TurnCompleted{}), s.ev("a", "b", "t", &events.TurnStarted{})}
		},
		want: counts{started: 2, completed: 1, inFlight: 1},
	}, {
		name: "events without a sequence are always counted",
		feed: func(s *stream) []events.Event {
			st := s.ev("a", "b", "t", &events.TurnStarted{})
			st.Seq = 0
			return []events.Event{st, st}
		},
		want: counts{started: 1, inFlight: 1, unmatched: 1},
	}, {
		name: "invalid turn event moves no turn",
		feed: func(s *stream) []events.Event {
			st := s.ev("a", "b", "t", &events.TurnStarted{})
			bad := s.ev("a", "b", "t", &events.TurnCompleted{})
			bad.Err = events.ErrInvalid
			noTurn := s.ev("a", "b", "t", &events.TurnCompleted{})
			noTurn.Turn = ""
			badData := s.ev("a", "b", "t", &events.TurnCompleted{})
			badData.Type, badData.Data = events.TypeTurnFailed, json.RawMessage(`{"stage":7}`)
			return []events.Event{st, bad, noTurn, badData}
		},
		want: counts{started: 1, inFlight: 1, invalid: 3},
	}, {
		name: "rewind keeps the turns started up to to_seq",
		feed: func(s *stream) []events.Event {
			t1 := s.ev("a", "b", "t1", &events.TurnStarted{})
			t2 := s.ev("a", "b", "t2", &events.TurnStarted{})
			t3 := s.ev("a", "b", "t3", &events.TurnStarted{})
			rw := s.ev("a", "b", "", &events.SessionRewound{ToSeq: t2.Seq, Reason: "r"})
			late := s.ev("a", "b", "t3", &events.TurnCompleted{}) // the undone turn's end: unmatched
			return []events.Event{t1, t2, t3, rw, late}
		},
		want: counts{started: 3, abandoned: 1, inFlight: 2, unmatched: 1},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := NewMetrics(Namespace)
			for _, ev := range tt.feed(newStream(t)) {
				m.ObserveEvent(ev)
			}
			reg := m.Registry()
			get := func(name string) float64 { return sum(t, reg, "turnstone_"+name) }
			got := counts{
				started: get("turns_started_total"), completed: get("turns_completed_total"),
				failed: get("turns_failed_total"), abandoned: get("turns_abandoned_total"),
				inFlight: get("turns_in_flight"), unmatched: get("turn_events_unmatched_total"),
				invalid: get("invalid_events_total"), redelivered: get("events_redelivered_total"),
			}
			if got != tt.want {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
			if got.started != got.completed+got.failed+got.abandoned+got.inFlight {
				t.Errorf("turn equation broken: %+v", got)
			}
		})
	}
}

// TestObserveEventForgetsIdleSessions checks that a session with no turn
// in flight leaves memory ForgetAfter (plus at most sweepEvery) after its
// last event, and that one with a turn in flight stays.
func TestObserveEventForgetsIdleSessions(t *testing.T) {
	m := NewMetrics(Namespace)
	now := time.Date(2026, 2, 19, 10, 0, 0, 0, time.UTC)
	m.turns.now = func() time.Time { return now }
	s := newStream(t)
	m.ObserveEvent(s.ev("a", "idle", "t", &events.TurnStarted{}))
	m.ObserveEvent(s.ev("a", "idle", "t", &events.TurnCompleted{}))
	m.ObserveEvent(s.ev("a", "busy", "t", &events.TurnStarted{}))
	tracked := func() float64 { v, _ := value(t, m.Registry(), "turnstone_sessions_tracked", nil); return v }
	if got := tracked(); got != 2 {
		t.Fatalf("sessions_tracked = %v, want 2", got)
	}
	now = now.Add(ForgetAfter - time.Second)
	m.ObserveEvent(s.ev("a", "other", "", &events.SessionStarted{}))
	if got := tracked(); got != 3 {
		t.Fatalf("sessions_tracked before ForgetAfter = %v, want 3", got)
	}
	now = now.Add(sweepEvery) // the sweep runs at most every sweepEvery
	m.ObserveEvent(s.ev("a", "other", "", &events.SessionResumed{}))
	if got := tracked(); got != 2 {
		t.Fatalf("sessions_tracked after ForgetAfter = %v, want 2 (busy and other)", got)
	}
	// The busy turn is still known: its end matches.
	m.ObserveEvent(s.ev("a", "busy", "t", &events.TurnCompleted{}))
	if got := sum(t, m.Registry(), "turnstone_turns_completed_total"); got != 2 {
		t.Errorf("turns_completed_total = %v, want 2", got)
	}
	if started, ended := turnEquation(t, m.Registry()); started != ended {
		t.Errorf("turn equation broken: started %v, ended + in flight %v", started, ended)
	}
}
