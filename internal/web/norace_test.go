//go:build !race

package web_test

// raceEnabled: see race_test.go.
const raceEnabled = false
