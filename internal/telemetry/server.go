package telemetry

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/rs/zerolog"
	"github.com/turnstone-dev/turnstone/internal/httpserve"
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
	srv  *http.Server
	run  *httpserve.Server
}

// NewServer returns a server that will listen on addr (HOST:PORT; port 0
// picks a free one, see Addr) and serve m and h. m and h may be nil (no
// metrics; no checks, always healthy); logger may be nil (no logging).
func NewServer(addr string, m *Metrics, h *Health, logger *zerolog.Logger) *Server {
	s := &Server{addr: addr}
	l := zerolog.Nop()
	if logger != nil {
		l = logger.With().Str("component", "telemetry").Logger()
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
	s.run = httpserve.New("telemetry server", s.srv, l, ErrServerStarted, ErrServerClosed)
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
		body, err := json.Marshal(rep)
		if err != nil {
			http.Error(w, "health report not encodable: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		_, _ = w.Write(append(body, '\n')) // a client that went away: nothing to tell it
	})
}

// Start listens on the server's address and serves until Close. It returns
// an error wrapping ErrServerStarted or ErrServerClosed when called twice
// or after Close, and the listener's error when addr cannot be bound.
func (s *Server) Start() error {
	if err := s.run.Start(s.addr); err != nil {
		return err
	}
	s.run.Log().Info().Str("addr", s.run.Addr()).Msg("serving /metrics and /healthz")
	return nil
}

// Addr returns the address the server listens on (HOST:PORT, with the
// port picked when the address asked for port 0), or "" before Start.
func (s *Server) Addr() string { return s.run.Addr() }

// Close stops accepting connections, waits for the requests in progress
// to finish and for the serving goroutine to return, or for ctx to end:
// then it closes the remaining connections and returns an error wrapping
// ctx's. Close on a server never started, or already closed, returns nil.
func (s *Server) Close(ctx context.Context) error { return s.run.Close(ctx) }
