//go:build race

package projections

// raceEnabled is set when the tests run with the race detector, which
// makes folding and encoding JSON some ten to twenty times slower and
// finds nothing in a fold, which runs on one goroutine: the tests that
// fold the same events many times (every cut of a corpus, a 200,000-event
// session) fold a documented sample then, and run at full size without
// the race detector (the full-size pass of .ci/run).
const raceEnabled = true
