// Package resend is the one schedule on which Turnstone sends a request
// again after JetStream answered "no responders" (nats.ErrNoResponders,
// jetstream.ErrNoStreamResponse: no stream or consumer listening for a
// moment, as when a replicated stream was just created or its leader just
// moved). The log's appends and reads (events) and the engine's ingest
// lanes (internal/ingestserver) follow it, so that a client of either
// waits out the same outage.
package resend

import (
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Tries is how many times a request that meets "no responders" is sent,
// the first send included.
const Tries = 10

// First, Growth and Longest shape the pauses between tries: First, then
// each about Growth times the one before, up to Longest.
const (
	First   = 50 * time.Millisecond
	Growth  = 1.5
	Longest = time.Second
)

// Window is about how long the Tries take, pauses only: the sum of the
// Tries-1 pauses without their randomization (3.46 s) rounded up to a
// tenth of a second. An ingest lane sends refused events again within
// one Window from its first refusal, as long as the log's Tries last.
const Window = 3500 * time.Millisecond

// BackOff returns the pauses between tries: First, then about Growth
// times as long each time, each randomized by half (backoff's default),
// up to Longest, with no end of its own (the caller counts Tries or
// bounds Window).
func BackOff() *backoff.ExponentialBackOff {
	return backoff.NewExponentialBackOff(backoff.WithInitialInterval(First), backoff.WithMultiplier(Growth),
		backoff.WithMaxInterval(Longest), backoff.WithMaxElapsedTime(0))
}
