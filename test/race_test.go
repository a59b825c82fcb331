//go:build race

package test

// raceEnabled: the test binary runs with the race detector, which makes
// JSON and folds some ten to twenty times slower in this process; tests
// whose load is the point scale it down under it (the binaries they start
// are built without it).
const raceEnabled = true
