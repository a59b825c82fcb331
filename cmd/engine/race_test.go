//go:build race

package main

// raceEnabled is set when the tests run with the race detector, which
// makes decoding and masking JSON about twenty times slower: the
// calibration replays the smaller transcripts then.
const raceEnabled = true
