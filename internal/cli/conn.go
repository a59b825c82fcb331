// Package cli is the client side every Turnstone binary shares: the
// connection flags (--nats-url, --log-level, and the credentials and TLS
// flags of ClientConfig), their environment defaults, the logger, and the
// NATS connection with errors that say what to do.
package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"
	"github.com/turnstone-dev/turnstone/internal/console"
)

// EnvURL is the environment variable that gives --nats-url's default.
const EnvURL = "TURNSTONE_NATS_URL"

// DefaultURL is the NATS URL a client uses when neither --nats-url nor
// EnvURL is given: the embedded server of `engine serve`, which listens on
// nats.DefaultURL (nats://127.0.0.1:4222).
const DefaultURL = nats.DefaultURL

// Connection is how a binary reaches NATS and logs: the server URL (a
// comma-separated list for a cluster), the log level (debug, info, warn,
// error) and the client's credentials and TLS.
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

// AddFlags adds --nats-url, --log-level and the ClientConfig flags to fs,
// their defaults from the environment. certUsage and caUsage are passed to
// ClientConfig.AddFlags.
func (c *Connection) AddFlags(fs *pflag.FlagSet, certUsage, caUsage string) {
	url := os.Getenv(EnvURL)
	if url == "" {
		url = DefaultURL
	}
	fs.StringVar(&c.URL, "nats-url", url, "NATS server or cluster to use (env "+EnvURL+")")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn, error")
	c.Client.AddFlags(fs, certUsage, caUsage)
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
// reports its own). Errors say what to do: credentials the server requires,
// a certificate it does not trust, a server that does not answer.
func (c *Connection) Dial(name string) (*nats.Conn, error) {
	opts, err := c.Options(name)
	if err != nil {
		return nil, err
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
	switch {
	case err == nil:
		return nc, nil
	case errors.Is(err, nats.ErrAuthorization):
		return nil, fmt.Errorf("connect to %s: %w: the server requires credentials; give --nkey FILE (a seed that engine serve --auth wrote) or --creds FILE (docs/security.md)", c.URL, err)
	}
	return nil, fmt.Errorf("connect to %s: %w (is `engine serve` running? set --nats-url or %s)", c.URL, err, EnvURL)
}
