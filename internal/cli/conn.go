// Package cli is the client side every Turnstone binary shares: the
// connection flags (--context, --nats-url, --log-level, and the credentials
// and TLS flags of ClientConfig), their environment defaults, the saved
// contexts that give them values (ContextStore), the logger, the NATS
// connection with errors that say what to do, the help layout that groups
// the connection flags under one heading (SetUsage), and --version
// (Version).
package cli

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"
	"github.com/turnstone-dev/turnstone/internal/console"
)

// EnvURL is the environment variable that gives --nats-url's default.
const EnvURL = "TURNSTONE_NATS_URL"

// DefaultURL is the NATS URL a client uses when nothing names a server
// (no --nats-url, EnvURL, context or EnvListen): the embedded server of
// `engine serve`, which listens on nats.DefaultURL (nats://127.0.0.1:4222).
const DefaultURL = nats.DefaultURL

// EnvListen is the environment variable that says where the local
// engine's embedded server listens (HOST:PORT): the default of `engine
// serve --listen`, and of the clients' --nats-url when nothing else names
// a server (LocalURL). EnvTelemetryListen gives the default of `engine
// serve --telemetry-listen` (not the worker's: two processes on one host
// need two ports).
const (
	EnvListen          = "TURNSTONE_LISTEN"
	EnvTelemetryListen = "TURNSTONE_TELEMETRY_LISTEN"
)

// LocalURL is the URL of the local engine's embedded server: nats:// and
// EnvListen when it is set, else DefaultURL.
func LocalURL() string {
	if l := os.Getenv(EnvListen); l != "" {
		return "nats://" + l
	}
	return DefaultURL
}

// Connection is how a binary reaches NATS and logs: the server URL (a
// comma-separated list for a cluster), the log level (debug, info, warn,
// error), the client's credentials and TLS, and the context (a saved set
// of them; see ContextStore) that gave the values no flag or environment
// variable gave.
type Connection struct {
	URL      string
	LogLevel string
	Client   ClientConfig
	// OnDenied, when set, is called with the first permission violation
	// the server reports on a connection Dial opened (a command's
	// request the credentials may not make: it would otherwise only time
	// out), so the command can stop at once.
	OnDenied func(error)

	// denied holds the first violation, once Dial made it (a pointer, so
	// that a Connection can be copied).
	denied *atomic.Pointer[error]

	// Context is --context: the name of the context to use.
	Context string
	// Applied is the name of the context Resolve applied ("" for none),
	// and AppliedURL whether that context gave the URL.
	Applied    string
	AppliedURL bool
	// Store is where contexts are read (zero: DefaultContextStore).
	Store *ContextStore
}

// Denied returns the first permission violation the server reported on
// a connection Dial opened (wrapping nats.ErrPermissionViolation), or
// nil.
func (c *Connection) Denied() error {
	if c.denied == nil {
		return nil
	}
	if p := c.denied.Load(); p != nil {
		return *p
	}
	return nil
}

// DeniedError is the error of a command that failed after the server
// refused one of its requests for the credentials' permissions: it says
// so first, naming the subject, and keeps both errors in its chain.
func DeniedError(denied, err error) error {
	if errors.Is(err, nats.ErrPermissionViolation) {
		return fmt.Errorf("permission denied: %w", err)
	}
	return fmt.Errorf("permission denied: %w: these credentials may not do this (the admin and read-everything commands need the operator's: --nkey <credentials>/operator.nk; a tenant's may only append and read its own sessions; docs/security.md) (%w)", denied, err)
}

// FlagGroup is the annotation key SetUsage groups flags by; GroupConnection
// is the value of the connection flags (help lists them under one
// heading).
const (
	FlagGroup       = "turnstone/group"
	GroupConnection = "connection"
)

// AddFlags adds --log-level and the connection flags (AddConnectionFlags)
// to fs.
func (c *Connection) AddFlags(fs *pflag.FlagSet, certUsage, caUsage string) {
	c.AddConnectionFlags(fs, certUsage, caUsage)
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn, error")
}

// AddConnectionFlags adds --context, --nats-url and the ClientConfig flags
// to fs, their defaults from the environment, each marked as a connection
// flag (FlagGroup). certUsage and caUsage are passed to
// ClientConfig.AddFlags.
func (c *Connection) AddConnectionFlags(fs *pflag.FlagSet, certUsage, caUsage string) {
	url := os.Getenv(EnvURL)
	if url == "" {
		url = LocalURL()
	}
	fs.StringVar(&c.Context, "context", os.Getenv(EnvContext), "the saved context to connect with (engine context ls; env "+EnvContext+"; default: the selected one)")
	fs.StringVar(&c.URL, "nats-url", url, "NATS server or cluster to use (env "+EnvURL+")")
	c.Client.AddFlags(fs, certUsage, caUsage)
	for _, name := range ConnectionFlags {
		_ = fs.SetAnnotation(name, FlagGroup, []string{GroupConnection})
	}
}

// ConnectionFlags are the names of the flags AddConnectionFlags adds.
var ConnectionFlags = []string{"context", "nats-url", "creds", "nkey", "tls-cert", "tls-key", "tls-ca"}

// Resolve applies the context to the settings that no flag on the command
// line (fs) gave. A context named for this run (--context, else
// EnvContext) wins over the settings' environment variables; the selected
// one (ContextStore.Select, used when useSelected and none is named) gives
// only what neither a flag nor an environment variable gave. So a
// setting's value is its flag's, else a named context's, else its
// environment variable's, else the selected context's, else the default.
// `engine serve`, which runs the server rather than reaching one, passes
// useSelected false. Errors: a named context that is not saved; the
// store's.
func (c *Connection) Resolve(fs *pflag.FlagSet, useSelected bool) error {
	name := c.Context
	named := name != ""
	if name == "" && (!useSelected || fs.Changed("context")) {
		return nil // none named; --context "" names none
	}
	store := c.Store
	if store == nil {
		s, err := DefaultContextStore()
		if err != nil {
			if name == "" {
				return nil // no configuration directory: nothing selected
			}
			return fmt.Errorf("--context %s: %w", name, err)
		}
		store = &s
	}
	if name == "" {
		sel, err := store.Selected()
		if err != nil {
			return err
		}
		name = sel
	}
	if name == "" {
		return nil
	}
	ctx, err := store.Load(name)
	if err != nil {
		return fmt.Errorf("--context: %w", err)
	}
	given := func(flag, env string) bool {
		return (!named && os.Getenv(env) != "") || (fs.Lookup(flag) != nil && fs.Changed(flag))
	}
	for _, s := range []struct {
		flag, env string
		dst       *string
		val       string
		// other is the flag of the setting this one excludes: a context's
		// --nkey does not apply beside a --creds given, nor the reverse.
		other, otherEnv string
	}{
		{"nats-url", EnvURL, &c.URL, ctx.URL, "", ""},
		{"creds", EnvCreds, &c.Client.Creds, ctx.Creds, "nkey", EnvNkey},
		{"nkey", EnvNkey, &c.Client.Nkey, ctx.Nkey, "creds", EnvCreds},
		{"tls-cert", EnvTLSCert, &c.Client.TLSCert, ctx.TLSCert, "", ""},
		{"tls-key", EnvTLSKey, &c.Client.TLSKey, ctx.TLSKey, "", ""},
		{"tls-ca", EnvTLSCA, &c.Client.TLSCA, ctx.TLSCA, "", ""},
	} {
		if s.val == "" || given(s.flag, s.env) || (s.other != "" && given(s.other, s.otherEnv)) {
			continue
		}
		*s.dst = s.val
		if s.flag == "nats-url" {
			c.AppliedURL = true
		}
	}
	// A named context that names credentials replaces the other kind the
	// environment gave (--creds and --nkey exclude each other).
	if named && ctx.Nkey != "" && !fs.Changed("creds") {
		c.Client.Creds = ""
	}
	if named && ctx.Creds != "" && !fs.Changed("nkey") {
		c.Client.Nkey = ""
	}
	c.Applied = name
	return nil
}

// URLGiven reports whether the URL was given (a --nats-url flag on the
// command line fs, EnvURL, or the context Resolve applied) rather than
// DefaultURL: `engine serve` then uses that server instead of its own.
func (c *Connection) URLGiven(fs *pflag.FlagSet) bool {
	return fs.Changed("nats-url") || os.Getenv(EnvURL) != "" || c.AppliedURL
}

// TelemetryDefault is the default of `engine serve --telemetry-listen`:
// EnvTelemetryListen when it is set (also when empty: off), else def.
func TelemetryDefault(def string) string {
	if l, ok := os.LookupEnv(EnvTelemetryListen); ok {
		return l
	}
	return def
}

// where names the server and, when a context gave settings, the context:
// "nats://h:4222 (context prod)".
func (c *Connection) where() string {
	if c.Applied != "" {
		return c.URL + " (context " + c.Applied + ")"
	}
	return c.URL
}

// Logger returns a logger writing human-readable lines to w (coloured on a
// terminal, see console.LogWriter) at the connection's level. Error: a
// level that is not debug, info, warn or error.
func (c *Connection) Logger(w io.Writer) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(c.LogLevel)
	if err != nil || c.LogLevel == "" {
		return zerolog.Nop(), fmt.Errorf("--log-level: %q is not one of debug, info, warn, error", c.LogLevel)
	}
	return zerolog.New(console.LogWriter(w)).Level(lvl).With().Timestamp().Logger(), nil
}

// Options returns the nats.go options of the connection: the client's
// credentials and TLS, and name as the connection's name (as the server's
// monitoring shows it). Errors: those of ClientConfig.Options.
func (c *Connection) Options(name string) ([]nats.Option, error) {
	opts, err := c.Client.Options()
	if err != nil {
		return nil, err
	}
	return append(opts, nats.Name(name)), nil
}

// Dial connects once, for a command that does its work and exits: a 5 s
// connect timeout, and connection errors reported to nobody (the command
// reports its own). Errors say what to do (ExplainConnectError).
func (c *Connection) Dial(name string) (*nats.Conn, error) {
	opts, err := c.Options(name)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", c.where(), err)
	}
	if c.denied == nil {
		c.denied = new(atomic.Pointer[error])
	}
	denied, onDenied := c.denied, c.OnDenied
	nc, err := nats.Connect(c.URL, append(opts, nats.Timeout(5*time.Second),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) && denied.CompareAndSwap(nil, &err) && onDenied != nil {
				onDenied(err)
			}
		}))...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", c.where(), ExplainConnectError(err, c.Client))
	}
	return nc, nil
}

// ExplainConnectError returns err with what to do about it, given the
// client settings it was made with: credentials the server requires; a
// server certificate no trusted CA signed (--tls-ca), or that names
// another host; a server that requires TLS, or a client certificate, or
// does not speak TLS; a server that does not answer (is `engine serve`
// running?). The result wraps err.
func ExplainConnectError(err error, client ClientConfig) error {
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		alert     tls.AlertError
	)
	msg := err.Error()
	switch {
	case errors.Is(err, nats.ErrAuthorization):
		if client.Authenticated() {
			return fmt.Errorf("%w: the server refused these credentials (--nkey or --creds): are they its users'? (docs/security.md)", err)
		}
		return fmt.Errorf("%w: the server requires credentials; give --nkey FILE (a seed that engine serve --auth wrote) or --creds FILE, or save them in a context (engine context save --help)", err)
	case errors.As(err, &hostname):
		return fmt.Errorf("%w: the server's certificate does not name the host in --nats-url; connect by a name it has (engine auth certs --hosts lists them)", err)
	case errors.As(err, &unknownCA):
		if client.TLSCA != "" {
			return fmt.Errorf("%w: --tls-ca %s did not sign the server's certificate; give the CA that did", err, client.TLSCA)
		}
		return fmt.Errorf("%w: the server's certificate is not signed by a CA this machine trusts; give --tls-ca FILE, the CA that signed it (ca.pem from engine auth certs)", err)
	case errors.As(err, &invalid):
		return fmt.Errorf("%w: the server's certificate is not valid (expired, or not for a server); renew it (engine auth certs)", err)
	case errors.Is(err, nats.ErrSecureConnWanted):
		return fmt.Errorf("%w: the server does not speak TLS; drop the --tls-* flags, or serve TLS (engine serve --tls-cert)", err)
	case errors.Is(err, nats.ErrSecureConnRequired):
		return fmt.Errorf("%w: the server requires TLS; give --tls-ca FILE (and a tls:// URL)", err)
	case errors.As(err, &alert), strings.Contains(msg, "certificate required"), strings.Contains(msg, "bad certificate"):
		if client.TLSCert == "" {
			return fmt.Errorf("%w: the server requires a client certificate (mutual TLS); give --tls-cert and --tls-key", err)
		}
		return fmt.Errorf("%w: the server refused the client certificate --tls-cert %s", err, client.TLSCert)
	case strings.Contains(msg, "tls:") || strings.Contains(msg, "x509:"):
		return fmt.Errorf("%w: a TLS failure; check --tls-ca (the CA that signed the server's certificate) and the URL's host", err)
	}
	var op *net.OpError
	if errors.Is(err, nats.ErrNoServers) || errors.As(err, &op) || errors.Is(err, nats.ErrTimeout) {
		return fmt.Errorf("%w (is `engine serve` running? set --nats-url, %s, or a context)", err, EnvURL)
	}
	return err
}
