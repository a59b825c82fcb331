//go:build !race

package reconciler_test

// raceEnabled: see race_test.go.
const raceEnabled = false
