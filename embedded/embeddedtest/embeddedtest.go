// Package embeddedtest starts real embedded NATS servers with JetStream for
// tests: any free loopback port, a temporary store directory, shut down and
// removed when the test ends.
package embeddedtest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/embedded"
)

// Start starts a server on 127.0.0.1 with a free port and a store directory
// under tb.TempDir(), and stops it in tb.Cleanup. mod, when given, changes
// the configuration before the start (for example to bound MaxStore).
func Start(tb testing.TB, mod ...func(*embedded.Config)) *embedded.Server {
	tb.Helper()
	cfg := embedded.Config{DataDir: tb.TempDir(), Port: -1}
	for _, m := range mod {
		m(&cfg)
	}
	s, err := embedded.Start(cfg, nil)
	if err != nil {
		tb.Fatalf("start embedded server: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

// Connect opens a TCP client connection to s (as another process would),
// closed in tb.Cleanup, and returns it with its JetStream context.
func Connect(tb testing.TB, s *embedded.Server) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		tb.Fatalf("connect to %s: %v", s.ClientURL(), err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatalf("jetstream: %v", err)
	}
	return nc, js
}
