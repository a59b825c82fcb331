// Package ingesttest answers the publishers' subjects in a test: an
// ingestserver.Server that owns every partition, on a real server, as a lone
// engine would, without the rest of an engine.
package ingesttest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/ingestserver"
)

// Serve opens the event log on nc (creating the streams) and an ingest
// server that owns every partition, and stops the server at test end. It
// returns the log.
func Serve(tb testing.TB, nc *nats.Conn) *events.Log {
	tb.Helper()
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	log, err := events.Open(ctx, js, events.Config{}, nil)
	if err != nil {
		tb.Fatal(err)
	}
	s, err := ingestserver.NewServer(nc, log, ingestserver.Config{}, nil)
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.Open(ctx); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(cctx)
	})
	return log
}
