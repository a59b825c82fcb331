// Package telemetry exposes Turnstone's Prometheus metrics and health
// checks over HTTP, for the engine and the recovery workers.
//
// Three pieces, each usable alone:
//
//   - Metrics owns a private *prometheus.Registry (never the global default
//     one, so a test can make as many as it likes) and the metrics below.
//     The engine feeds it every event of the log (ObserveEvent), every
//     violation (ObserveViolation) and the View of the session after each
//     event (ObserveView); the reconciler calls CommandIssued and
//     SetFailClosed; a worker calls WorkerCommand. Every method is safe for
//     concurrent use, and a nil *Metrics is a no-op, so code can take an
//     optional metrics pointer.
//   - Health is a set of named checks, polled (Register) or pushed (Set).
//   - Server serves /metrics (Prometheus text exposition, through promhttp)
//     and /healthz (JSON; 200 when every check passes, 503 otherwise).
//
// # Metrics
//
// Names below are after the namespace given to NewMetrics ("turnstone":
// turnstone_turns_started_total). Label values that come from events are
// kept when they are tokens of 1 to 64 characters of [A-Za-z0-9_.:-];
// an empty value becomes "none" and any other value "other", so that a
// publisher's free text cannot create unbounded series.
//
// Fed from the event stream (ObserveEvent):
//
//	turns_started_total                       counter  turn.started of a turn not already open
//	turns_completed_total                     counter  turn.completed of an open turn
//	turns_failed_total{stage}                 counter  turn.failed of an open turn; stage that threw
//	turns_abandoned_total                     counter  turn.abandoned of an open turn, plus open turns a rewind undid
//	turns_rewound_total                       counter  the open turns a session.rewound undid (a subset of abandoned)
//	turns_in_flight                           gauge    turns seen start and not yet end
//	turn_events_unmatched_total{type}         counter  turn.started of a turn already open; an end of a turn not open
//	sessions_tracked                          gauge    sessions whose last sequence and open turns are held in memory
//	events_total{type}                        counter  every event observed once (type "unknown" for other types)
//	events_redelivered_total                  counter  events dropped as already observed (see ObserveEvent)
//	invalid_events_total                      counter  events whose Err is set or whose data does not decode
//	orphan_repairs_total                      counter  recovery.completed of kind repair_orphans, outcome recovered or degraded
//	distillations_total{result,reason}        counter  result "run" (distillation.completed; reason = its trigger) or "skipped" (distillation.skipped; reason = its reason)
//	recovery_outcomes_total{kind,strategy,outcome} counter recovery.completed
//	recovery_attempts_total{kind,result,class}     counter recovery.attempted
//	commands_parked_total{kind}               counter  recovery.parked
//	breaker_state{tenant,provider}            gauge    latest breaker.changed: 0 closed, 1 half_open, 2 open
//
// Fed by callers:
//
//	violations_total{rule}                    counter  ObserveViolation (the projector's anomalies)
//	sessions{status}                          gauge    ObserveView: sessions paused, in_turn, broken (idle ones are not counted)
//	orphans{state}                            gauge    ObserveView: orphaned tool_use blocks open, repaired, reset (projections.View counts)
//	violations{state}                         gauge    ObserveView: violations open, resolved, reset (projections.View counts)
//	commands_issued_total{kind}               counter  CommandIssued (the reconciler)
//	reconciler_fail_closed                    gauge    SetFailClosed: 1 while the reconciler fails closed, else 0
//	worker_commands_total{kind,outcome}       counter  WorkerCommand (a recovery worker)
//	worker_command_seconds{kind}              histogram WorkerCommand: seconds from delivery to the command's end
//	incidents_open{class}                     gauge    SetOpenIncidents: open fleet incidents by the class of their key
//	otel_export_lag{partition}                gauge    SetOTelLags: events of a partition not yet exported to OpenTelemetry
//	otel_spans_exported_total                 counter  OTelExport: spans the OpenTelemetry export sent
//	otel_export_failures_total                counter  OTelExport: export calls that failed (tried again)
//
// The registry also holds the standard go_* and process_* collectors.
//
// # The turn equation
//
// At every scrape,
//
//	turns_started_total == turns_completed_total + sum(turns_failed_total)
//	                       + turns_abandoned_total + turns_in_flight
//
// holds exactly: ObserveEvent counts an end only for a turn it saw start and
// has not seen end, and the turn metrics are read under the same lock that
// ObserveEvent holds. An end for a turn it never saw start (its start came
// before this process started, or never came), a second end, and a start
// of a turn already open go to turn_events_unmatched_total instead. The
// counters and the gauge are this process's view since it started: after a
// restart the turns in flight before it are not in turns_in_flight, and
// their ends count as unmatched. The projections remain the authority on
// which turns are in flight.
//
// # One truth
//
// sessions, orphans and violations are sums of projections.View, the read
// model `engine sessions`, `inspect`, `replay` and `incidents` print, with
// the same states: an orphan is open, repaired or reset, a violation open,
// resolved or reset (docs/cli.md). They reflect the latest event this
// process folded of each session: after a restart a session counts again
// once its next event is folded.
package telemetry
