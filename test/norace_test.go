//go:build !race

package test

// raceEnabled: see race_test.go.
const raceEnabled = false
