package events_test

import (
	"testing"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/events/sessionlogtest"
)

// TestLogIsASessionLog runs the SessionLog suite against the direct log.
// ingest.Client runs the same suite through an engine's ingest.
func TestLogIsASessionLog(t *testing.T) {
	t.Parallel()
	l, _ := openLog(t, events.Config{})
	sessionlogtest.Run(t, l, sessionlogtest.Features{ReadFromTime: true})
}
