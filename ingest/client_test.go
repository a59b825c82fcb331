package ingest_test

import (
	"testing"

	"github.com/turnstone-dev/turnstone/events/sessionlogtest"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/internal/ingestserver/ingesttest"
)

// TestClientIsASessionLog runs the SessionLog suite against ingest.Client
// through a real ingest server (as an engine that owns every partition
// runs it): the same checks the direct log passes.
func TestClientIsASessionLog(t *testing.T) {
	t.Parallel()
	srv := embeddedtest.Start(t)
	nc, _ := embeddedtest.Connect(t, srv)
	ingesttest.Serve(t, nc)
	c, err := ingest.NewClient(nc, ingest.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	sessionlogtest.Run(t, c, sessionlogtest.Features{})
}
