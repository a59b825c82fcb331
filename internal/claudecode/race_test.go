//go:build race

package claudecode

// raceEnabled is set when the tests run with the race detector, which
// makes decoding JSON about twenty times slower: tests that convert the
// same transcripts many times convert fewer prefixes then.
const raceEnabled = true
