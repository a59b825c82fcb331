//go:build race

package engine_test

// raceEnabled: the race detector runs, and every fold and encoding is
// some ten times slower; the lag test scales its load down to match
// (TestNoDecisionOnStaleState).
const raceEnabled = true
