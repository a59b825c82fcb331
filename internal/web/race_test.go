//go:build race

package web_test

// raceEnabled: the race detector runs, and JSON decoding and the fleet
// copy's loads are some ten times slower; TestSessionsPageAt100kSessions
// writes a smaller fleet index.
const raceEnabled = true
