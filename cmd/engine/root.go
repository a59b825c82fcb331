package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/cli"
)

// globals are the flags every subcommand shares.
type globals struct {
	conn   cli.Connection
	stdout io.Writer
	stderr io.Writer
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
(--nats-url, or TURNSTONE_NATS_URL, or a saved context, default
` + cli.DefaultURL + `; engine context --help).`,
		Example: cli.Examples(
			"run the engine on its embedded NATS server, with the web view",
			"engine serve --ui-listen 127.0.0.1:9465",
			"import Claude Code transcripts, then list the sessions",
			"engine import --format claude-code ~/.claude/projects && engine sessions"),
		Version:       cli.ReadBuildInfo("engine").Version,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Annotations[cli.NoConnection] == "true" || (cmd.Parent() != nil && cmd.Parent().Name() == "context") {
				return nil // the context commands manage contexts: a broken one must not stop them
			}
			// engine serve runs the server the others reach: only a
			// context named for it (--context, TURNSTONE_CONTEXT) applies.
			return g.conn.Resolve(cmd.Flags(), cmd.Name() != "serve")
		},
	}
	root.SetVersionTemplate(cli.ReadBuildInfo("engine").String())
	root.SetOut(stdout)
	root.SetErr(stderr)
	g.conn.AddFlags(root.PersistentFlags(),
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
		newWhatifCommand(g),
		newContextCommand(g),
		newExportCommand(g),
	)
	readDenials(g, root)
	cli.SetUsage(root)
	return root
}

// readDenials makes every command that connects with Dial stop at the
// server's first permission violation and fail with an error that says
// it was denied, naming the subject (a request the credentials may not
// make otherwise only times out).
func readDenials(g *globals, c *cobra.Command) {
	for _, sub := range c.Commands() {
		readDenials(g, sub)
	}
	run := c.RunE
	if run == nil {
		return
	}
	c.RunE = func(cmd *cobra.Command, args []string) error {
		ctx, cancel := context.WithCancelCause(cmd.Context())
		defer cancel(nil)
		cmd.SetContext(ctx)
		g.conn.OnDenied = cancel
		err := run(cmd, args)
		if denied := g.conn.Denied(); denied != nil && err != nil {
			return cli.DeniedError(denied, err)
		}
		return err
	}
}

// logger writes human-readable log lines to stderr at the chosen level.
func (g *globals) logger() (zerolog.Logger, error) { return g.conn.Logger(g.stderr) }

// dial opens the NATS connection of a client subcommand. The caller
// closes it.
func (g *globals) dial() (*nats.Conn, error) { return g.conn.Dial("turnstone-cli") }

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
			return nil, nil, fmt.Errorf("%w (does the server at %s have JetStream enabled?)", err, g.conn.URL)
		}
		if errors.Is(err, events.ErrNoStream) {
			return nil, nil, fmt.Errorf("%w: start the engine (engine serve) or set up the streams (engine setup) first", err)
		}
		return nil, nil, err
	}
	return nc, log, nil
}
