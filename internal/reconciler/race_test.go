//go:build race

package reconciler_test

// raceEnabled: the race detector runs, and encoding and decoding JSON is
// some ten to twenty times slower; TestHeadOfLineSessionDoesNotHoldTheOthers
// divides its sizes (and the log's event limit) by eight.
const raceEnabled = true
