//go:build !race

package otel

// raceEnabled is set when the tests run with the race detector (see
// race_test.go).
const raceEnabled = false
