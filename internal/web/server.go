// Package web serves Turnstone's read-only web view: the fleet's sessions,
// one session's timeline (turns as bands, tool calls as spans, anomalies
// at the event where they arose, the history as the model sees it, every
// recovery command), its state as of any event, a diff of two points, a
// raw event, and the fleet's correlated incidents.
//
// Pages are rendered on the server with html/template, which escapes
// every text the events carry (they are untrusted: a prompt or a tool
// output can hold markup); a little script (static/app.js) drives the
// scrubber and the timeline's filters. Every asset is embedded with
// go:embed, and each page is served with a Content-Security-Policy that
// allows only the engine's own origin, so the view makes no request to
// any other host and works on a closed network.
//
// The view reads: the fleet index through a forensics.IndexMirror (an in-memory
// copy kept by a KV watch: listing 100,000 sessions restores none), and
// one session's events from the log when its page is asked for.
package web

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"time"

	"github.com/rs/zerolog"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/correlate"
	"github.com/turnstone-dev/turnstone/internal/forensics"
	"github.com/turnstone-dev/turnstone/internal/httpserve"
	"github.com/turnstone-dev/turnstone/projections"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Prefix is the path every page and asset is served under.
const Prefix = "/ui/"

// Sentinel errors.
var (
	// ErrServerStarted: Start was called twice.
	ErrServerStarted = errors.New("web server already started")
	// ErrServerClosed: Start was called after Close.
	ErrServerClosed = errors.New("web server closed")
)

// Config configures the web view.
type Config struct {
	// Addr is the address to listen on, HOST:PORT (port 0 picks a free
	// one; see Server.Addr). Only Start uses it.
	Addr string
	// Log is the event log the session pages read (required).
	Log *events.Log
	// Store is the snapshot store incidents restore sessions from (nil:
	// replay each from its first event).
	Store *projections.SnapshotStore
	// Index is the mirror of the fleet index the sessions and incidents
	// pages read (required).
	Index *forensics.IndexMirror
	// Timeline bounds a session page (zero: forensics' defaults).
	Timeline forensics.TimelineConfig
	// Correlate sets the incidents' windows and what counts as open.
	Correlate correlate.Config
	// PageSize is how many sessions a page lists (default 50, at most 500).
	PageSize int
	// RequestTimeout bounds the work of one page (default 30 s).
	RequestTimeout time.Duration
	// Token, when set, is the operator's web token: every page and
	// request then needs it (auth.go; under `engine serve --auth`).
	Token string
}

func (c *Config) setDefaults() {
	if c.PageSize <= 0 {
		c.PageSize = 50
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 30 * time.Second
	}
}

// Validate reports every missing or out-of-range field, joined.
func (c *Config) Validate() error {
	var errs []error
	if c.Log == nil {
		errs = append(errs, errors.New("log: required"))
	}
	if c.Index == nil {
		errs = append(errs, errors.New("index: required"))
	}
	if c.PageSize > 500 {
		errs = append(errs, fmt.Errorf("page size: at most 500, got %d", c.PageSize))
	}
	return errors.Join(errs...)
}

// Server is the web view's HTTP server. Handler serves it without a
// listener (to mount under another server, or in tests); Start listens on
// Config.Addr; Close shuts it down.
type Server struct {
	cfg  Config
	l    zerolog.Logger
	tmpl *template.Template
	mux  *http.ServeMux
	srv  *http.Server
	run  *httpserve.Server
}

// New returns the web view for cfg. logger may be nil. Errors: cfg's
// (Validate).
func New(cfg Config, logger *zerolog.Logger) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("web: %w", err)
	}
	t, err := template.New("").Funcs(funcs).ParseFS(templateFS, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("web: templates: %w", err)
	}
	s := &Server{cfg: cfg, l: zerolog.Nop(), tmpl: t, mux: http.NewServeMux()}
	if logger != nil {
		s.l = logger.With().Str("component", "web").Logger()
	}
	static, _ := fs.Sub(staticFS, "static")
	s.mux.Handle("GET "+Prefix+"static/", http.StripPrefix(Prefix+"static/", cacheStatic(http.FileServerFS(static))))
	s.mux.HandleFunc("GET "+Prefix+"{$}", s.page(s.sessions))
	s.mux.HandleFunc("GET "+Prefix+"session/{tenant}/{session}", s.page(s.session))
	s.mux.HandleFunc("GET "+Prefix+"session/{tenant}/{session}/event/{seq}", s.page(s.event))
	s.mux.HandleFunc("GET "+Prefix+"session/{tenant}/{session}/diff", s.page(s.diff))
	s.mux.HandleFunc("GET "+Prefix+"incidents", s.page(s.incidents))
	s.mux.HandleFunc("GET "+Prefix+"incidents/{id}", s.page(s.incident))
	s.mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, Prefix, http.StatusFound) })
	s.mux.HandleFunc("GET /favicon.ico", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, Prefix+"static/favicon.svg", http.StatusMovedPermanently)
	})
	s.srv = &http.Server{
		Handler:           secure(s.guard(s.mux)),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      cfg.RequestTimeout + 10*time.Second,
		IdleTimeout:       time.Minute,
	}
	s.run = httpserve.New("web server", s.srv, s.l, ErrServerStarted, ErrServerClosed)
	return s, nil
}

// Handler returns the view's routes (every path under Prefix, and / and
// /favicon.ico redirecting into it), with its security headers.
func (s *Server) Handler() http.Handler { return s.srv.Handler }

// Start listens on Config.Addr and serves until Close. Errors: wrapping
// ErrServerStarted or ErrServerClosed when called twice or after Close;
// the listener's when the address cannot be bound.
func (s *Server) Start() error { return s.run.Start(s.cfg.Addr) }

// Addr is the address the server listens on (with the port picked when
// Config.Addr asked for port 0), or "" before Start.
func (s *Server) Addr() string { return s.run.Addr() }

// Close stops accepting connections and waits for the requests in
// progress, or for ctx to end (then it closes them and returns an error
// wrapping ctx's). Close on a server never started, or closed, returns nil.
func (s *Server) Close(ctx context.Context) error { return s.run.Close(ctx) }

// csp allows the engine's own origin only: no inline script or style, no
// other host for anything.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

// secure sets the headers every response carries.
func secure(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", csp)
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("X-Frame-Options", "DENY")
		h.ServeHTTP(w, r)
	})
}

func cacheStatic(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=3600")
		h.ServeHTTP(w, r)
	})
}

// httpError is an error with the status a page answers it with.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func notFound(format string, a ...any) error {
	return &httpError{http.StatusNotFound, fmt.Sprintf(format, a...)}
}

func badRequest(format string, a ...any) error {
	return &httpError{http.StatusBadRequest, fmt.Sprintf(format, a...)}
}

// page runs a handler that returns a template name and its data, and
// renders it (or the error page) into a buffer first, so a template error
// never sends half a page. A handler that wrote its response itself
// returns the name "".
func (s *Server) page(h func(w http.ResponseWriter, r *http.Request) (string, any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
		defer cancel()
		r = r.WithContext(ctx)
		start := time.Now()
		name, data, err := h(w, r)
		status := http.StatusOK
		if err != nil {
			status = http.StatusInternalServerError
			var he *httpError
			if errors.As(err, &he) {
				status = he.status
			} else if errors.Is(err, events.ErrSessionNotFound) {
				status = http.StatusNotFound
			}
			s.l.Debug().Err(err).Str("path", r.URL.Path).Int("status", status).Msg("page error")
			name, data = "error", errorPage{Status: status, Title: http.StatusText(status), Message: err.Error()}
		}
		if name == "" { // the handler wrote the response itself
			return
		}
		var buf bytes.Buffer
		if err := s.tmpl.ExecuteTemplate(&buf, name, data); err != nil {
			s.l.Error().Err(err).Str("template", name).Msg("render")
			http.Error(w, "render: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Server-Timing", fmt.Sprintf("page;dur=%.1f", float64(time.Since(start).Microseconds())/1000))
		w.WriteHeader(status)
		_, _ = w.Write(buf.Bytes())
	}
}

type errorPage struct {
	Status  int
	Title   string
	Message string
}
