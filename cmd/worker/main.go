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

	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/internal/cli"
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
	err = worker.Serve(ctx, worker.ServeConfig{
		Worker: worker.Config{
			Name:           f.name,
			ControlTimeout: f.controlTimeout,
			Delivery:       recovery.DeliveryConfig{AckWait: f.ackWait, MaxDeliver: f.maxDeliver, PinnedTTL: f.pinnedTTL},
		},
		Connection: f.conn,
		Telemetry:  f.telemetry,
	}, logger)
	if serr := (*recovery.SettingsError)(nil); errors.As(err, &serr) {
		return settingsRefused(serr)
	}
	return err
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
