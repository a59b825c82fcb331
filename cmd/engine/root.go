package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/auth"
	"github.com/turnstone-dev/turnstone/embedded"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/console"
)

// globals are the flags every subcommand shares.
type globals struct {
	natsURL  string
	logLevel string
	client   auth.ClientConfig
	stdout   io.Writer
	stderr   io.Writer
}

func newRootCommand(stdout, stderr io.Writer) *cobra.Command {
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "engine",
		Short: "Turnstone: a flight recorder and recovery engine for AI agent runtimes",
		Long: `Turnstone records every turn, message, tool call, error and distillation of
an agent runtime as an append-only JetStream event, rebuilds each session
from the log, and checks its invariants.

Start the engine with 'engine serve'; the other commands connect to it
(--nats-url, or TURNSTONE_NATS_URL, default ` + embedded.DefaultURL + `).`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	url := os.Getenv("TURNSTONE_NATS_URL")
	if url == "" {
		url = embedded.DefaultURL
	}
	root.PersistentFlags().StringVar(&g.natsURL, "nats-url", url, "NATS server or cluster to use (env TURNSTONE_NATS_URL)")
	root.PersistentFlags().StringVar(&g.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	g.client.AddFlags(root.PersistentFlags(),
		"PEM file of a certificate: this client's (mutual TLS; with --tls-key); for engine serve's embedded server, the server's (TLS on the client port)",
		"PEM file of CAs: those that signed the server's certificate; for engine serve's embedded server, those a client's certificate must be signed by (mutual TLS)")
	root.AddCommand(
		newServeCommand(g),
		newImportCommand(g),
		newSessionsCommand(g),
		newInspectCommand(g),
		newReplayCommand(g),
		newRecoveryCommand(g),
		newIncidentsCommand(g),
		newDiffCommand(g),
		newRuntimesCommand(g),
		newMembersCommand(g),
		newSetupCommand(g),
		newEraseCommand(g),
		newAuditCommand(g),
		newRejectsCommand(g),
		newAuthCommand(g),
	)
	return root
}

// logger writes human-readable log lines to stderr at the chosen level.
func (g *globals) logger() (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(g.logLevel)
	if err != nil || g.logLevel == "" {
		return zerolog.Nop(), fmt.Errorf("--log-level: %q is not one of debug, info, warn, error", g.logLevel)
	}
	return zerolog.New(console.LogWriter(g.stderr)).Level(lvl).With().Timestamp().Logger(), nil
}

// dial opens the NATS connection of a client subcommand. The caller
// closes it.
func (g *globals) dial() (*nats.Conn, error) {
	opts, err := g.client.Options()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(g.natsURL, append(opts, nats.Name("turnstone-cli"), nats.Timeout(5*time.Second),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))...)
	if errors.Is(err, nats.ErrAuthorization) {
		return nil, fmt.Errorf("connect to %s: %w: the server requires credentials; give --nkey FILE (a seed that engine serve --auth wrote) or --creds FILE (docs/security.md)", g.natsURL, err)
	}
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w (is `engine serve` running? set --nats-url or TURNSTONE_NATS_URL)", g.natsURL, err)
	}
	return nc, nil
}

// jetstreamOf is the JetStream context of nc.
func jetstreamOf(nc *nats.Conn) (jetstream.JetStream, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return js, nil
}

// connect opens the NATS connection and the event log for a client
// subcommand; it creates and changes no stream (engine serve or engine
// setup does). The caller closes the connection.
func (g *globals) connect(ctx context.Context) (*nats.Conn, *events.Log, error) {
	nc, err := g.dial()
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstreamOf(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	log, err := events.Open(ctx, js, events.Config{UseExisting: true}, nil)
	if err != nil {
		last := nc.LastError()
		nc.Close()
		if errors.Is(last, nats.ErrPermissionViolation) {
			return nil, nil, fmt.Errorf("%w: %w: these credentials may not read the streams; the admin commands need the operator's (docs/security.md)", err, last)
		}
		if errors.Is(err, events.ErrLogUnavailable) {
			return nil, nil, fmt.Errorf("%w (does the server at %s have JetStream enabled?)", err, g.natsURL)
		}
		if errors.Is(err, events.ErrNoStream) {
			return nil, nil, fmt.Errorf("%w: start the engine (engine serve) or set up the streams (engine setup) first", err)
		}
		return nil, nil, err
	}
	return nc, log, nil
}
