// Package httpserve runs an http.Server with a start-once, close-once
// lifecycle: the engine's telemetry (/metrics, /healthz) and its web view
// share it.
package httpserve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"

	"github.com/rs/zerolog"
)

// Server serves one http.Server on a listener it opens. Its methods are
// safe for concurrent use.
type Server struct {
	name       string
	srv        *http.Server
	l          zerolog.Logger
	errStarted error
	errClosed  error

	mu      sync.Mutex
	ln      net.Listener
	started bool
	closed  bool
	done    chan struct{}
}

// New returns a server for srv, named name in its errors and logs ("web
// server", "telemetry server"). Start returns an error wrapping
// errStarted when called twice and errClosed after Close (each package
// keeps its own sentinel errors).
func New(name string, srv *http.Server, l zerolog.Logger, errStarted, errClosed error) *Server {
	return &Server{name: name, srv: srv, l: l, errStarted: errStarted, errClosed: errClosed, done: make(chan struct{})}
}

// Start listens on addr (HOST:PORT; port 0 picks one) and serves until
// Close. Errors: wrapping errStarted or errClosed (see New); the
// listener's when addr cannot be bound.
func (s *Server) Start(addr string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return fmt.Errorf("start %s: %w", s.name, s.errClosed)
	case s.started:
		return fmt.Errorf("start %s: %w", s.name, s.errStarted)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("start %s: %w", s.name, err)
	}
	s.ln, s.started = ln, true
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.l.Error().Err(err).Msg(s.name + " stopped")
		}
	}()
	return nil
}

// Log is the logger the server was given.
func (s *Server) Log() *zerolog.Logger { return &s.l }

// Addr is the address the server listens on (HOST:PORT, with the port
// picked when Start asked for port 0), or "" before Start.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Close stops accepting connections, waits for the requests in progress
// to finish and for the serving goroutine to return, or for ctx to end:
// then it closes the remaining connections and returns an error wrapping
// ctx's. Close on a server never started, or already closed, returns nil.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	wasClosed, started := s.closed, s.started
	s.closed = true
	s.mu.Unlock()
	if wasClosed || !started {
		return nil
	}
	err := s.srv.Shutdown(ctx)
	if err != nil {
		_ = s.srv.Close()
		err = fmt.Errorf("close %s: %w", s.name, err)
	}
	<-s.done
	return err
}
