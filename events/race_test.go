//go:build race

package events_test

// raceEnabled is set when the tests run with the race detector, which
// makes the single-threaded tests over every byte pair some ten times
// slower and finds nothing in them: they read a documented sample then,
// and run whole in the full-size pass (scripts/fullsize).
const raceEnabled = true
