// Package embedded runs a NATS server with JetStream inside the process: the
// default that lets `engine serve` run with nothing installed. It listens on
// a loopback address so that other processes (workers, the CLI, services
// publishing events) can connect, keeps its data in a directory, and shuts
// down cleanly. It installs no signal handlers: the caller owns the process.
package embedded

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// Defaults of Config.
const (
	DefaultHost       = "127.0.0.1"
	DefaultPort       = 4222
	DefaultMaxPayload = 8 << 20
	DefaultReadyWait  = 10 * time.Second
)

// DefaultURL is the client URL of a server on DefaultHost and DefaultPort:
// where `engine serve` listens unless told otherwise, and so where the
// CLI, the workers and the reference runtime connect when no URL is given.
const DefaultURL = "nats://127.0.0.1:4222"

// Config configures an embedded server. DataDir is required; the rest has
// defaults.
type Config struct {
	// DataDir is where JetStream keeps its files; it is created if missing.
	DataDir string
	// Host and Port are the client listen address. Default 127.0.0.1:4222.
	// Port -1 picks a free port (tests); read it back with ClientURL.
	Host string
	Port int
	// ServerName names the server (and the JetStream node); default
	// "turnstone-<port>".
	ServerName string
	// MaxPayload is the largest message the server accepts, in bytes.
	// Default 8 MiB (NATS's own default is 1 MiB).
	MaxPayload int32
	// MaxStore bounds JetStream file storage, in bytes; 0 is unlimited.
	MaxStore int64
	// SyncAlways makes JetStream fsync every write before it acknowledges
	// it; otherwise SyncInterval applies (0: the server's default, 2
	// minutes), and an acknowledged write can be lost on an OS crash or
	// power failure until the next sync.
	SyncAlways   bool
	SyncInterval time.Duration
	// Cluster, when Cluster.Name is set, joins a JetStream cluster.
	Cluster ClusterConfig
	// Token, when set, is required from every client (NATS token auth).
	Token string
	// ConfigFile, when set, is a nats-server configuration file read
	// first (server.ProcessConfigFile): its accounts, users and
	// permissions apply (auth.ServerConfig writes one; docs/security.md).
	// The fields of this Config override its listen address, store
	// directory, sync, payload and cluster settings; its tls block is
	// replaced by TLS when TLS.Cert is set.
	ConfigFile string
	// TLS, when TLS.Cert is set, serves the client port over TLS only.
	TLS TLSConfig
	// ReadyWait bounds how long Start waits for the server and JetStream to
	// be ready. Default 10 seconds.
	ReadyWait time.Duration
}

// ClusterConfig joins the server to a cluster: Name is the cluster's name,
// Host and Port the route listen address, Routes the URLs of the other
// nodes ("nats-route://127.0.0.1:6223").
type ClusterConfig struct {
	Name   string
	Host   string
	Port   int
	Routes []string
}

// TLSConfig is the server side of TLS on the client port: Cert and Key
// are PEM files of the server's certificate and private key; CA, when
// set, is a PEM file of the certificate authorities a client's
// certificate must be signed by (mutual TLS: a client without such a
// certificate is refused).
type TLSConfig struct {
	Cert string
	Key  string
	CA   string
}

func (c *Config) setDefaults() {
	if c.Host == "" {
		c.Host = DefaultHost
	}
	if c.Port == 0 {
		c.Port = DefaultPort
	}
	if c.MaxPayload == 0 {
		c.MaxPayload = DefaultMaxPayload
	}
	if c.ReadyWait == 0 {
		c.ReadyWait = DefaultReadyWait
	}
}

// Validate reports every problem of the configuration, joined.
func (c *Config) Validate() error {
	var errs []error
	if c.DataDir == "" {
		errs = append(errs, errors.New("data dir: required"))
	}
	if c.Port < -1 || c.Port > 65535 {
		errs = append(errs, fmt.Errorf("port: must be -1 (any) to 65535, got %d", c.Port))
	}
	if c.MaxPayload < 0 {
		errs = append(errs, fmt.Errorf("max payload: must not be negative, got %d", c.MaxPayload))
	}
	if c.SyncInterval < 0 {
		errs = append(errs, fmt.Errorf("sync interval: must not be negative, got %s", c.SyncInterval))
	}
	if c.Cluster.Name != "" && c.Cluster.Port == 0 {
		errs = append(errs, errors.New("cluster port: required with a cluster name"))
	}
	if (c.TLS.Cert == "") != (c.TLS.Key == "") {
		errs = append(errs, errors.New("tls: a certificate needs its key, and a key its certificate"))
	}
	if c.TLS.CA != "" && c.TLS.Cert == "" {
		errs = append(errs, errors.New("tls: a CA (mutual TLS) needs the server's certificate and key"))
	}
	return errors.Join(errs...)
}

// Server is a running embedded NATS server with JetStream.
type Server struct {
	ns  *server.Server
	cfg Config
}

// Start starts the server and returns once it accepts connections and
// JetStream is ready (on a cluster: once the meta leader is known). logger
// receives the server's own log lines at their levels; nil discards them.
// Errors: an invalid Config, a configuration file that does not parse, a
// TLS file that cannot be read, a listen address in use, JetStream
// failing to start, or not ready within ReadyWait.
func Start(cfg Config, logger *zerolog.Logger) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("start embedded server: %w", err)
	}
	name := cfg.ServerName
	if name == "" {
		name = "turnstone-" + strconv.Itoa(cfg.Port)
	}
	opts := &server.Options{}
	if cfg.ConfigFile != "" {
		var err error
		if opts, err = server.ProcessConfigFile(cfg.ConfigFile); err != nil {
			return nil, fmt.Errorf("start embedded server: config file %s: %w", cfg.ConfigFile, err)
		}
	}
	opts.ServerName = name
	opts.Host, opts.Port = cfg.Host, cfg.Port
	opts.JetStream = true
	opts.StoreDir = cfg.DataDir
	opts.JetStreamMaxStore = cfg.MaxStore
	opts.MaxPayload = cfg.MaxPayload
	opts.SyncAlways, opts.SyncInterval = cfg.SyncAlways, cfg.SyncInterval
	opts.NoSigs = true
	if cfg.Token != "" {
		opts.Authorization = cfg.Token
	}
	if cfg.TLS.Cert != "" {
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cfg.TLS.Cert, KeyFile: cfg.TLS.Key, CaFile: cfg.TLS.CA, Verify: cfg.TLS.CA != ""})
		if err != nil {
			return nil, fmt.Errorf("start embedded server: tls: %w", err)
		}
		opts.TLSConfig, opts.TLS, opts.TLSVerify = tc, true, cfg.TLS.CA != ""
		opts.TLSCert, opts.TLSKey, opts.TLSCaCert = cfg.TLS.Cert, cfg.TLS.Key, cfg.TLS.CA
		opts.TLSTimeout = 2
	}
	if cfg.Cluster.Name != "" {
		opts.Cluster = server.ClusterOpts{Name: cfg.Cluster.Name, Host: cfg.Cluster.Host, Port: cfg.Cluster.Port}
		if opts.Cluster.Host == "" {
			opts.Cluster.Host = cfg.Host
		}
		opts.Routes = server.RoutesFromStr(strings.Join(cfg.Cluster.Routes, ","))
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("start embedded server: %w", err)
	}
	if logger != nil {
		ns.SetLoggerV2(&serverLog{l: logger.With().Str("component", "nats-server").Logger()}, false, false, false)
	}
	go ns.Start()
	if !ns.ReadyForConnections(cfg.ReadyWait) {
		ns.Shutdown()
		return nil, fmt.Errorf("start embedded server: not accepting connections on %s after %s", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)), cfg.ReadyWait)
	}
	s := &Server{ns: ns, cfg: cfg}
	if err := s.waitJetStream(cfg.ReadyWait); err != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, fmt.Errorf("start embedded server: %w", err)
	}
	return s, nil
}

func (s *Server) waitJetStream(wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		if s.ns.JetStreamEnabled() && (s.cfg.Cluster.Name == "" || s.ns.JetStreamIsCurrent()) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("jetstream not ready after %s", wait)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// ClientURL is the URL other processes connect to ("nats://127.0.0.1:4222").
func (s *Server) ClientURL() string { return s.ns.ClientURL() }

// Connect opens a client connection to the server that stays inside the
// process (no socket). opts are added after Turnstone's defaults (the
// server's token, a name).
func (s *Server) Connect(opts ...nats.Option) (*nats.Conn, error) {
	all := []nats.Option{nats.InProcessServer(s.ns), nats.Name("turnstone-embedded")}
	if s.cfg.Token != "" {
		all = append(all, nats.Token(s.cfg.Token))
	}
	nc, err := nats.Connect("", append(all, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("connect to embedded server: %w", err)
	}
	return nc, nil
}

// AddMapping adds the subject mapping source -> destination (nats-server's
// mapping syntax, functions such as {{partition(8,1,2)}} included) to the
// accounts of clients without credentials: the global account, which a
// server without accounts puts every client in. It replaces a mapping of
// the same source, and applies at once to the clients connected. An
// account of a configuration file (ConfigFile) carries its own mappings
// (auth.ServerConfig writes them). Errors: a mapping nats-server refuses.
func (s *Server) AddMapping(source, destination string) error {
	if err := s.ns.GlobalAccount().AddMapping(source, destination); err != nil {
		return fmt.Errorf("map %s to %s: %w", source, destination, err)
	}
	return nil
}

// NATS is the underlying server, for tests and tools that need more than
// this package offers.
func (s *Server) NATS() *server.Server { return s.ns }

// Close shuts the server down (JetStream flushes its stores) and waits for
// it to stop, or for ctx to end. It is safe to call more than once.
func (s *Server) Close(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close embedded server: %w", ctx.Err())
	}
}

// serverLog adapts zerolog to the NATS server's Logger.
type serverLog struct{ l zerolog.Logger }

func (s *serverLog) Noticef(format string, v ...any) { s.l.Info().Msgf(format, v...) }
func (s *serverLog) Warnf(format string, v ...any)   { s.l.Warn().Msgf(format, v...) }
func (s *serverLog) Fatalf(format string, v ...any)  { s.l.Error().Msgf(format, v...) }
func (s *serverLog) Errorf(format string, v ...any)  { s.l.Error().Msgf(format, v...) }
func (s *serverLog) Debugf(format string, v ...any)  { s.l.Debug().Msgf(format, v...) }
func (s *serverLog) Tracef(format string, v ...any)  { s.l.Trace().Msgf(format, v...) }
