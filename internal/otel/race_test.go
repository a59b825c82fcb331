//go:build race

package otel

// raceEnabled is set when the tests run with the race detector, which
// makes decoding JSON some twenty times slower: the tests over the shipped
// transcripts import a sample of them then (see transcriptFiles).
const raceEnabled = true
