// Package authtest starts a real embedded NATS server with Turnstone's
// accounts, users and permissions on (package auth), for tests: any free
// loopback port, keys and store under tb.TempDir(), stopped at the end of
// the test. The server's permission violations are kept, so a test can
// assert that a role did all it needed without one.
package authtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/turnstone-dev/turnstone/internal/auth"
	"github.com/turnstone-dev/turnstone/internal/embedded"
)

// Server is a running server with auth on.
type Server struct {
	*embedded.Server
	Spec *auth.Spec
	Keys auth.Keys
	log  *lineLog
}

// Start writes a spec of tenants (and extra YAML appended to it, such as
// a users: list) in a temporary directory, generates the keys and the
// server configuration, and starts the server with them. mod, when
// given, changes the embedded configuration before the start.
func Start(tb testing.TB, tenants []string, extra string, mod ...func(*embedded.Config)) *Server {
	tb.Helper()
	dir := tb.TempDir()
	specPath := filepath.Join(dir, "auth.yaml")
	spec := "tenants: [" + strings.Join(tenants, ", ") + "]\ncredentials: ./credentials\n" + extra
	if err := os.WriteFile(specPath, []byte(spec), 0o600); err != nil {
		tb.Fatal(err)
	}
	s, err := auth.LoadSpec(specPath)
	if err != nil {
		tb.Fatal(err)
	}
	keys, _, err := auth.EnsureKeys(s)
	if err != nil {
		tb.Fatal(err)
	}
	conf, err := auth.WriteServerConfig(s, keys)
	if err != nil {
		tb.Fatal(err)
	}
	cfg := embedded.Config{DataDir: filepath.Join(dir, "data"), Port: -1, ConfigFile: conf}
	for _, m := range mod {
		m(&cfg)
	}
	ll := &lineLog{}
	logger := zerolog.New(ll).Level(zerolog.WarnLevel)
	srv, err := embedded.Start(cfg, &logger)
	if err != nil {
		tb.Fatalf("start embedded server with auth: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	return &Server{Server: srv, Spec: s, Keys: keys, log: ll}
}

// Options are the connect options of user: its nkey seed file, and a
// name ("turnstone-test <user>") that the server's log lines show.
func (s *Server) Options(tb testing.TB, user string) []nats.Option {
	tb.Helper()
	opt, err := nats.NkeyOptionFromSeed(s.Spec.SeedFile(user))
	if err != nil {
		tb.Fatalf("seed of %s: %v", user, err)
	}
	return []nats.Option{opt, nats.Name("turnstone-test " + user)}
}

// Connect opens a TCP connection as user, closed in tb.Cleanup. opts
// are added after the user's.
func (s *Server) Connect(tb testing.TB, user string, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	nc, err := nats.Connect(s.ClientURL(), append(s.Options(tb, user), opts...)...)
	if err != nil {
		tb.Fatalf("connect as %s: %v", user, err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// Violations returns the server's permission violation log lines so
// far, each with the connection's name.
func (s *Server) Violations() []string {
	var out []string
	for _, l := range s.log.lines() {
		if strings.Contains(l, "Violation") {
			out = append(out, l)
		}
	}
	return out
}

// ViolationsOf returns the violations of connections named for user.
func (s *Server) ViolationsOf(user string) []string {
	var out []string
	for _, l := range s.Violations() {
		if strings.Contains(l, "turnstone-test "+user+`\"`) || strings.Contains(l, "turnstone-test "+user+`"`) {
			out = append(out, l)
		}
	}
	return out
}

// lineLog keeps the server's log lines.
type lineLog struct {
	mu sync.Mutex
	ls []string
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ls = append(l.ls, strings.TrimSpace(string(p)))
	return len(p), nil
}

func (l *lineLog) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.ls...)
}

// String lists the violations, for failure messages.
func (s *Server) String() string {
	return fmt.Sprintf("server %s, violations:\n%s", s.ClientURL(), strings.Join(s.Violations(), "\n"))
}
