package telemetry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Server is the HTTP server of a process's telemetry:
//
//   - GET /metrics: the Metrics registry in the Prometheus exposition
//     formats (promhttp; an empty registry for nil Metrics);
//   - GET /healthz: the Health report as JSON (see Report), 200 when every
//     check passes, 503 when one fails.
//
// Start listens and serves on a goroutine the server owns; Close shuts it
// down gracefully and waits for it.
type Server struct {
	addr string
	l    zerolog.Logger
	srv  *http.Server

	mu      sync.Mutex
	ln      net.Listener
	started bool
	closed  bool
	done    chan struct{}
}

// NewServer returns a server that will listen on addr (HOST:PORT; port 0
// picks a free one, see Addr) and serve m and h. m and h may be nil (no
// metrics; no checks, always healthy); logger may be nil (no logging).
func NewServer(addr string, m *Metrics, h *Health, logger *zerolog.Logger) *Server {
	s := &Server{addr: addr, l: zerolog.Nop(), done: make(chan struct{})}
	if logger != nil {
		s.l = logger.With().Str("component", "telemetry").Logger()
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	mux.Handle("GET /healthz", healthHandler(h))
	s.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       time.Minute,
	}
	return s
}

// Handler returns the server's routes, to mount elsewhere or test without
// a listener.
func (s *Server) Handler() http.Handler { return s.srv.Handler }

// healthHandler serves h's report as JSON, 200 or 503.
func healthHandler(h *Health) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rep := h.Status(r.Context())
		code := http.StatusOK
		if !rep.OK() {
			code = http.StatusServiceUnavailable
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(rep)
	})
}

// Start listens on the server's address and serves until Close. It returns
// an error wrapping ErrServerStarted or ErrServerClosed when called twice
// or after Close, and the listener's error when addr cannot be bound.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return fmt.Errorf("start telemetry server: %w", ErrServerClosed)
	case s.started:
		return fmt.Errorf("start telemetry server: %w", ErrServerStarted)
	}
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("start telemetry server: %w", err)
	}
	s.ln, s.started = ln, true
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.l.Error().Err(err).Msg("telemetry server stopped")
		}
	}()
	s.l.Info().Str("addr", ln.Addr().String()).Msg("serving /metrics and /healthz")
	return nil
}

// Addr returns the address the server listens on (HOST:PORT, with the
// port picked when the address asked for port 0), or "" before Start.
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
		err = fmt.Errorf("close telemetry server: %w", err)
	}
	<-s.done
	return err
}
