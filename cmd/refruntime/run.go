package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/internal/cli"
	"github.com/turnstone-dev/turnstone/internal/console"
	"github.com/turnstone-dev/turnstone/refruntime"
)

// Main is the refruntime command: its command (or ParseFlags), then Run,
// then Close.
type Main struct {
	stdout, stderr io.Writer
	// exit ends the process; tests replace it.
	exit func(code int)

	conn        cli.Connection
	tenant      string
	name        string
	sessions    int
	turns       int
	tools       int
	fault       refruntime.Fault
	exitOnCrash bool
	serve       bool
	adopt       bool
	prefix      string
	providers   []string
	model       string
	stageDelay  time.Duration
	// turnDeadline is --turn-deadline: each turn.started's deadline_ms.
	turnDeadline time.Duration
	verbose      bool

	// faultFlag and providersFlag are --fault and --providers as given,
	// parsed into fault and providers by check.
	faultFlag, providersFlag string

	nc *nats.Conn
	rt *refruntime.Runtime
}

// NewMain returns the command writing session ids to stdout and logs to
// stderr.
func NewMain(stdout, stderr io.Writer) *Main {
	return &Main{stdout: stdout, stderr: stderr, exit: os.Exit}
}

// command returns the refruntime command: its flags set m's fields, and
// running it checks them (check) and runs m (Run). Its errors for bad
// flags, arguments or combinations are usageErrors.
func (m *Main) command() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "refruntime",
		Short: "Run Turnstone's reference agent runtime",
		Long: `Record sessions of turns into the event log of a NATS server, with a fault
injected into the last turn of each session, and print the session ids on
stdout, one per line; with --serve, keep answering control requests until
SIGINT or SIGTERM.

It connects as every Turnstone command does: --nats-url and the
credentials and TLS flags, their environment variables, or a saved
context (engine context --help).`,
		Example: cli.Examples(
			"a session of two turns whose last one crashes between a tool_use and its tool_result",
			"refruntime --tenant demo --turns 2 --fault crash-mid-tool --exit-on-crash",
			"three sessions whose turns hang, each with a 5 s deadline, answering control requests",
			"refruntime --tenant demo --sessions 3 --fault hang --turn-deadline 5s --serve"),
		Version: cli.ReadBuildInfo("refruntime").Version,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{fmt.Errorf("unexpected arguments %q", args)}
			}
			return nil
		},
		SilenceUsage:  true,
		SilenceErrors: true,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := m.check(cmd.Flags()); err != nil {
				return usageError{err}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error { return m.Run(cmd.Context()) },
	}
	cmd.SetOut(m.stdout)
	cmd.SetErr(m.stderr)
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	cmd.SetVersionTemplate(cli.ReadBuildInfo("refruntime").String())
	fs := cmd.Flags()
	m.conn.AddConnectionFlags(fs, "", "")
	fs.StringVar(&m.tenant, "tenant", "demo", "tenant to record under (under auth, the tenant of --nkey's user)")
	fs.StringVar(&m.name, "name", refruntime.DefaultName, "runtime name (session.started, event source)")
	fs.IntVar(&m.sessions, "sessions", 1, "sessions to run")
	fs.IntVar(&m.turns, "turns", 1, "turns per session")
	fs.IntVar(&m.tools, "tools", 1, "tool calls per turn")
	fs.StringVar(&m.faultFlag, "fault", "", "fault of the last turn of each session: crash-mid-tool, stage-throws:<stage>, provider:<status>[:<retry after>], hang")
	fs.BoolVar(&m.exitOnCrash, "exit-on-crash", false, fmt.Sprintf("with --fault crash-mid-tool: exit with status %d right after the tool_use is stored", ExitCrash))
	fs.BoolVar(&m.serve, "serve", false, "answer control requests until SIGINT or SIGTERM")
	fs.BoolVar(&m.adopt, "adopt", false, "answer control requests for sessions another process ran (read back from the log)")
	fs.StringVar(&m.prefix, "session-prefix", "rt", "prefix of the session ids (<prefix>-<ULID>)")
	fs.StringVar(&m.providersFlag, "providers", "anthropic,bedrock,vertex", "providers in switch order, comma-separated; the first is the default")
	fs.StringVar(&m.model, "model", refruntime.DefaultModel, "model the assistant messages name")
	fs.DurationVar(&m.stageDelay, "stage-delay", 0, "how long each stage and tool takes")
	fs.DurationVar(&m.turnDeadline, "turn-deadline", 0, "each turn's own deadline (turn.started deadline_ms): how long it may go without a sign of life before the engine abandons it (0: the engine's policy)")
	fs.BoolVar(&m.verbose, "verbose", false, "debug logs")
	cli.SetUsage(cmd)
	return cmd
}

// usageError is a bad flag, argument or combination of flags: exit
// status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// ParseFlags reads the command line (without the program name) as the
// command does, without running it. It returns pflag.ErrHelp for -h and
// --help and an error for a bad flag or combination.
func (m *Main) ParseFlags(args []string) error {
	cmd := m.command()
	if err := cmd.ParseFlags(args); err != nil {
		return err
	}
	if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
		return err
	}
	return m.check(cmd.Flags())
}

// check validates the flags (fs, as parsed) and sets the fields derived
// from them, the context's connection settings among them.
func (m *Main) check(fs *pflag.FlagSet) error {
	var errs []error
	if err := m.conn.Resolve(fs, true); err != nil {
		errs = append(errs, err)
	}
	if m.turnDeadline < 0 {
		errs = append(errs, errors.New("--turn-deadline must not be negative"))
	}
	f, err := refruntime.ParseFault(m.faultFlag)
	if err != nil {
		errs = append(errs, fmt.Errorf("--fault: %w", err))
	}
	m.fault = f
	if _, crash := f.(refruntime.FaultCrashMidTool); m.exitOnCrash && !crash {
		errs = append(errs, errors.New("--exit-on-crash needs --fault crash-mid-tool"))
	}
	if m.sessions < 0 || m.turns < 0 || m.tools < 0 {
		errs = append(errs, errors.New("--sessions, --turns and --tools must not be negative"))
	}
	if !events.ValidToken(m.prefix) || len(m.prefix) > events.MaxTokenLen-27 {
		errs = append(errs, fmt.Errorf("--session-prefix: %q must be 1-%d characters of [A-Za-z0-9_-]", m.prefix, events.MaxTokenLen-27))
	}
	m.providers = nil
	for _, p := range strings.Split(m.providersFlag, ",") {
		if p = strings.TrimSpace(p); p != "" {
			m.providers = append(m.providers, p)
		}
	}
	return errors.Join(errs...)
}

// Run connects, opens the log, answers control requests when --serve is
// set, runs the sessions printing each id as it starts, and with --serve
// waits for ctx to end.
func (m *Main) Run(ctx context.Context) error {
	level := zerolog.InfoLevel
	if m.verbose {
		level = zerolog.DebugLevel
	}
	logger := zerolog.New(console.LogWriter(m.stderr)).Level(level).With().Timestamp().Logger()

	opts, err := m.conn.Options("refruntime " + m.tenant)
	if err != nil {
		return usageError{err}
	}
	nc, err := nats.Connect(m.conn.URL, opts...)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", m.conn.URL, cli.ExplainConnectError(err, m.conn.Client))
	}
	m.nc = nc
	// The runtime is a publisher like any other: it appends and reads
	// through the engine (under auth, with its tenant's credentials).
	log, err := ingest.NewClient(nc, ingest.ClientConfig{})
	if err != nil {
		return err
	}
	cfg := refruntime.Config{
		Tenant:       m.tenant,
		Name:         m.name,
		Providers:    m.providers,
		Model:        m.model,
		StageDelay:   m.stageDelay,
		TurnDeadline: m.turnDeadline,
		AdoptUnknown: m.adopt,
	}
	if m.exitOnCrash {
		cfg.OnCrash = func(session, turn string) {
			logger.Warn().Str("session", session).Str("turn", turn).Msg("crashing on purpose between tool_use and tool_result")
			m.exit(ExitCrash)
		}
	}
	m.rt, err = refruntime.New(nc, log, cfg, &logger)
	if err != nil {
		return err
	}
	if m.serve {
		if err := m.rt.Open(ctx); err != nil {
			return err
		}
	}

	for range m.sessions {
		session := m.prefix + "-" + events.NewID()
		fmt.Fprintln(m.stdout, session)
		for turn := 1; turn <= m.turns; turn++ {
			spec := refruntime.TurnSpec{
				Prompt: fmt.Sprintf("Turn %d of %d: inspect the project and report.", turn, m.turns),
				Tools:  tools(m.tools),
			}
			if turn == m.turns {
				spec.Fault = m.fault
			}
			res, err := m.rt.RunTurn(ctx, session, spec)
			if err != nil {
				return err
			}
			logger.Info().Str("session", session).Str("turn", res.Turn).Str("outcome", string(res.Outcome)).
				Uint64("first_seq", res.FirstSeq).Uint64("last_seq", res.LastSeq).Msg("turn recorded")
		}
	}

	if !m.serve {
		return nil
	}
	logger.Info().Msg("serving control requests until SIGINT or SIGTERM")
	<-ctx.Done()
	return nil
}

// Close stops the runtime and closes the connection.
func (m *Main) Close() error {
	var err error
	if m.rt != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = m.rt.Close(ctx)
		cancel()
	}
	if m.nc != nil {
		m.nc.Close()
	}
	return err
}

// toolKinds are the tool calls a turn makes, in turn.
var toolKinds = []refruntime.ToolSpec{
	{Name: "Read", Input: json.RawMessage(`{"file_path":"README.md"}`), Result: "# Project\n\nA demo project."},
	{Name: "Bash", Input: json.RawMessage(`{"command":"go test ./..."}`), Result: "ok  \tdemo\t0.012s"},
	{Name: "Grep", Input: json.RawMessage(`{"pattern":"TODO"}`), Result: "main.go:12: // TODO: handle errors"},
}

// tools returns n tool calls.
func tools(n int) []refruntime.ToolSpec {
	out := make([]refruntime.ToolSpec, n)
	for i := range out {
		out[i] = toolKinds[i%len(toolKinds)]
	}
	return out
}
