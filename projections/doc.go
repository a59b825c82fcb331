// Package projections folds a session's events into its state and checks
// the invariants of docs/design.md ("Invariants the projections check"):
// every turn ends exactly once (1); the message history follows the
// Anthropic Messages API rules for tool_use and tool_result blocks and for
// roles (2); no distillation runs during a foreign turn or over a dirty
// history (3); the same error, or the same assistant output, in a row is
// counted as a streak, and each turn's failed attempts as its budget spent
// (4). It also keeps the recovery side's record of the session: the
// recovery commands run on it (recovery.*), its rewinds and forks, and the
// circuit breakers (breaker.changed).
//
// The fold (Session.Apply) is pure: no I/O, no clock (time only comes from
// the events), no map iteration order in its results. Folding the same
// events always yields the same state and the same JSON, and a state
// restored from its JSON (a snapshot) folds on exactly like the original.
// One event needs more than the state: a session.rewound that undoes
// events the state holds, which Apply cannot take back (rewind.go:
// NeedsRefold, Refold, FoldLog).
//
// SnapshotStore (snapshot.go) keeps a bounded number of snapshots of each
// session on JetStream, so that restoring a session is "last snapshot + the
// events after it".
//
// The state is bounded whatever the session (docs/limits.md): it keeps
// what the invariants need and a window of the rest (the Keep and Max
// constants), ids and names as keys (IDKey) and texts as previews, each
// with the sequence of the event that holds it whole, so that a snapshot
// never exceeds MaxSnapshotBytes.
//
// Each file holds one concept of the fold: session.go the state and
// Apply's dispatch, query.go the state's read-only queries, turns.go
// invariant 1, toolcalls.go the message history and its tool calls
// (invariant 2), distillation.go invariant 3, loops.go and errorstats.go
// invariant 4, violations.go what the fold flags, recovery.go and
// rewind.go the recovery record, text.go the previews and digests, and
// view.go the one read model every reader shows (Session.View).
package projections
