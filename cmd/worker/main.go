// Command worker joins the recovery worker group: it pulls recovery commands
// from every partition of AGENT_RECOVERY (NATS pins each partition to one
// worker of the group and moves it when that worker dies), executes them in
// per-session order, and records every attempt and outcome in the session's
// log. Run as many as you like; stop one with SIGINT or SIGTERM.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/cli"
	"github.com/turnstone-dev/turnstone/internal/telemetry"
	"github.com/turnstone-dev/turnstone/internal/worker"
	"github.com/turnstone-dev/turnstone/recovery"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newCommand(os.Stderr).ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

type flags struct {
	conn           cli.Connection
	name           string
	ackWait        time.Duration
	maxDeliver     int
	pinnedTTL      time.Duration
	controlTimeout time.Duration
	telemetry      string
	useExisting    bool
}

func newCommand(stderr io.Writer) *cobra.Command {
	var f flags
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Join the Turnstone recovery worker group",
		Long: `Join the recovery worker group of the engine at --nats-url and execute
recovery commands until interrupted. Commands of one session run one at a
time and in publish order; if this worker dies, NATS moves its partitions
to another worker.

It connects as every Turnstone command does: --nats-url and the
credentials and TLS flags, their environment variables, or a saved
context (engine context --help), and waits for the server when it is not
up yet.`,
		Example: cli.Examples(
			"join the group of the local engine",
			"worker",
			"join under auth, with the context saved for the worker's credentials",
			"worker --context prod-worker --name worker-1"),
		Version:       cli.ReadBuildInfo("worker").Version,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			return f.conn.Resolve(cmd.Flags(), true)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return run(cmd.Context(), f, stderr)
		},
	}
	cmd.SetErr(stderr)
	cmd.SetOut(os.Stdout)
	cmd.SetVersionTemplate(cli.ReadBuildInfo("worker").String())
	cmd.Flags().StringVar(&f.name, "name", "", "worker name in events and statuses (default host-pid)")
	cmd.Flags().DurationVar(&f.ackWait, "ack-wait", 10*time.Second, "how long a dead worker's command waits before redelivery")
	cmd.Flags().IntVar(&f.maxDeliver, "max-deliver", 5, "deliveries before a failing command is parked")
	cmd.Flags().DurationVar(&f.pinnedTTL, "pinned-ttl", 10*time.Second, "how long a partition stays pinned to a silent worker")
	cmd.Flags().StringVar(&f.telemetry, "telemetry-listen", "", "address of /metrics and /healthz, such as 127.0.0.1:9465 (default: off)")
	cmd.Flags().DurationVar(&f.controlTimeout, "control-timeout", 10*time.Second, "timeout of each control request to the agent runtime")
	cmd.Flags().BoolVar(&f.useExisting, "use-existing", false, "create and change no stream, consumer or bucket (an operator set them up); implied by --creds or --nkey, since the worker role may not (docs/security.md)")
	f.conn.AddFlags(cmd.Flags(), "", "")
	cli.SetUsage(cmd)
	return cmd
}

func run(ctx context.Context, f flags, stderr io.Writer) error {
	logger, err := f.conn.Logger(stderr)
	if err != nil {
		return err
	}
	opts, err := f.conn.Options("turnstone-worker")
	if err != nil {
		return err
	}
	if f.conn.Client.Authenticated() {
		f.useExisting = true
	}
	nc, log, err := connect(ctx, f.conn, opts, f.useExisting, logger)
	if err != nil {
		return err
	}
	defer nc.Close()
	metrics := telemetry.NewMetrics(telemetry.Namespace)
	if f.telemetry != "" {
		health := telemetry.NewHealth()
		health.Register("nats", func(context.Context) error {
			if !nc.IsConnected() {
				return fmt.Errorf("nats connection %s", nc.Status())
			}
			return nil
		})
		ts := telemetry.NewServer(f.telemetry, metrics, health, &logger)
		if err := ts.Start(); err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				return fmt.Errorf("--telemetry-listen %s: address in use (another process listens there); choose another with --telemetry-listen HOST:PORT (or \"\" for none)", f.telemetry)
			}
			return fmt.Errorf("--telemetry-listen %s: %w", f.telemetry, err)
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = ts.Close(cctx)
		}()
	}
	// Open sets up the recovery stream's partition consumers and joins
	// the group. Right after a nats-server node is lost, a consumer whose
	// leader was there answers nothing until it elects another (seconds):
	// try again with back-off, with a fresh worker each time, for up to
	// two minutes, rather than exit.
	var w *worker.Worker
	open := func() error {
		var err error
		w, err = worker.New(nc, log, worker.Config{
			OnCommand:      metrics.WorkerCommand,
			Name:           f.name,
			ControlTimeout: f.controlTimeout,
			UseExisting:    f.useExisting,
			Delivery:       recovery.DeliveryConfig{AckWait: f.ackWait, MaxDeliver: f.maxDeliver, PinnedTTL: f.pinnedTTL},
		}, &logger)
		if err != nil {
			return backoff.Permanent(err)
		}
		if err := w.Open(ctx); err != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = w.Close(cctx)
			cancel()
			return err
		}
		return nil
	}
	ob := backoff.NewExponentialBackOff()
	ob.MaxInterval = 5 * time.Second
	ob.MaxElapsedTime = 2 * time.Minute
	if err := backoff.RetryNotify(open, backoff.WithContext(ob, ctx), func(err error, next time.Duration) {
		logger.Warn().Err(err).Dur("retry_in", next).Msg("worker could not open; trying again")
	}); err != nil {
		return err
	}
	go func() {
		tick := time.NewTicker(5 * time.Second)
		defer tick.Stop()
		for {
			metrics.SetPartitions(recovery.WorkerGroup, len(w.Partitions()), w.Rebalances())
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	<-ctx.Done()
	logger.Info().Msg("worker stopping")
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.Close(cctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// connect connects to NATS and opens the event log, retrying with
// exponential back-off until it works or ctx ends, so a worker started
// beside the engine (or before it) waits for it instead of exiting.
func connect(ctx context.Context, conn cli.Connection, opts []nats.Option, useExisting bool, logger zerolog.Logger) (*nats.Conn, *events.Log, error) {
	url := conn.URL
	var (
		nc  *nats.Conn
		log *events.Log
	)
	op := func() error {
		c, err := nats.Connect(url, append(opts, nats.MaxReconnects(-1))...)
		if err != nil {
			return cli.ExplainConnectError(err, conn.Client)
		}
		js, err := jetstream.New(c)
		if err == nil {
			log, err = events.Open(ctx, js, events.Config{UseExisting: useExisting}, &logger)
		}
		if err != nil {
			c.Close()
			return err
		}
		nc = c
		return nil
	}
	b := backoff.NewExponentialBackOff()
	b.MaxInterval = 5 * time.Second
	b.MaxElapsedTime = 0 // until ctx ends
	err := backoff.RetryNotify(op, backoff.WithContext(b, ctx), func(err error, next time.Duration) {
		logger.Warn().Err(err).Str("url", url).Str("context", conn.Applied).Dur("retry_in", next).Msg("waiting for the engine's NATS server")
	})
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s: %w", url, err)
	}
	return nc, log, nil
}
