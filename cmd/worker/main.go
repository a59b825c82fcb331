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
	"strings"
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

The worker creates and changes nothing on JetStream: engine setup (which
engine serve runs on its embedded server) creates the streams, consumers
and buckets, and is the one writer of the recovery consumers' settings
(engine setup --ack-wait, --max-deliver, --pinned-ttl). Until they exist
the worker waits. --ack-wait, --max-deliver and --pinned-ttl here are
expectations: a worker given one that differs from what the consumers
hold refuses to start, names the difference, and changes nothing.`,

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
	cmd.Flags().DurationVar(&f.ackWait, "ack-wait", 0, "expect the recovery consumers' ack wait to be this (how long a dead worker's command waits before redelivery; default: whatever engine setup set, 10s unless changed)")
	cmd.Flags().IntVar(&f.maxDeliver, "max-deliver", 0, "expect the recovery consumers' max deliver to be this (deliveries before a failing command is parked; default: whatever engine setup set, 5 unless changed)")
	cmd.Flags().DurationVar(&f.pinnedTTL, "pinned-ttl", 0, "expect the recovery consumers' pinned TTL to be this (how long a partition stays pinned to a silent worker; default: whatever engine setup set, 10s unless changed)")
	cmd.Flags().StringVar(&f.telemetry, "telemetry-listen", "", "address of /metrics and /healthz, such as 127.0.0.1:9465 (default: off)")
	cmd.Flags().DurationVar(&f.controlTimeout, "control-timeout", 10*time.Second, "timeout of each control request to the agent runtime")
	// The worker never creates or changes a stream, consumer or bucket
	// (engine setup is their one writer): --use-existing, which once asked
	// for that, is accepted and means nothing.
	cmd.Flags().BoolVar(&f.useExisting, "use-existing", true, "no effect: the worker never creates or changes a stream, consumer or bucket")
	_ = cmd.Flags().MarkHidden("use-existing")
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
	nc, log, err := connect(ctx, f.conn, opts, logger)
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
	// Open checks the recovery consumers' settings against the flags and
	// joins the group. Right after a nats-server node is lost, a consumer
	// whose leader was there answers nothing until it elects another
	// (seconds), and right after engine serve starts the consumers may
	// not exist yet: try again with back-off, with a fresh worker each
	// time, for up to two minutes, rather than exit. Settings that differ
	// from the flags are refused at once.
	var w *worker.Worker
	open := func() error {
		var err error
		w, err = worker.New(nc, log, worker.Config{
			OnCommand: metrics.WorkerCommand,
			OnLease: func(p int, token uint64, held bool) {
				if held {
					metrics.SetPartitionLease(recovery.WorkerGroup, p, token)
				} else {
					metrics.EndPartitionLease(recovery.WorkerGroup, p, token)
				}
			},
			Name:           f.name,
			ControlTimeout: f.controlTimeout,
			Delivery:       recovery.DeliveryConfig{AckWait: f.ackWait, MaxDeliver: f.maxDeliver, PinnedTTL: f.pinnedTTL},
		}, &logger)
		if err != nil {
			return backoff.Permanent(err)
		}
		if err := w.Open(ctx); err != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = w.Close(cctx)
			cancel()
			if serr := (*recovery.SettingsError)(nil); errors.As(err, &serr) {
				return backoff.Permanent(settingsRefused(serr))
			}
			if errors.Is(err, events.ErrSettingsDiffer) {
				return backoff.Permanent(err)
			}
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

// settingsRefused is the worker's refusal of consumer settings that
// differ from its flags: each flag with the value stored, and what to run.
func settingsRefused(e *recovery.SettingsError) error {
	var b strings.Builder
	b.WriteString("refused: the recovery consumers' settings differ from the flags (nothing was changed):")
	for _, d := range e.Diffs {
		fmt.Fprintf(&b, "\n  --%s %s, but %s holds %s", d.Setting, d.Asked, e.Consumers, d.Stored)
	}
	fmt.Fprintf(&b, "\nengine setup is the only writer of these settings: run `engine setup %s` to change them, or start the worker without these flags to use the stored ones", e.Asked())
	return errors.New(b.String())
}

// connect connects to NATS and opens the event log (creating nothing),
// retrying with exponential back-off until it works or ctx ends, so a
// worker started beside the engine (or before it, or before engine setup)
// waits for it instead of exiting.
func connect(ctx context.Context, conn cli.Connection, opts []nats.Option, logger zerolog.Logger) (*nats.Conn, *events.Log, error) {
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
			log, err = events.Open(ctx, js, events.Config{UseExisting: true}, &logger)
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
		msg := "waiting for the engine's NATS server"
		if errors.Is(err, events.ErrNoStream) {
			msg = "waiting for the streams (engine setup, or engine serve on its embedded server, creates them)"
		}
		logger.Warn().Err(err).Str("url", url).Str("context", conn.Applied).Dur("retry_in", next).Msg(msg)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s: %w", url, err)
	}
	return nc, log, nil
}
