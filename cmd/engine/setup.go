package main

import (
	"fmt"

	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/cli"
	"github.com/turnstone-dev/turnstone/internal/engine"
	"github.com/turnstone-dev/turnstone/internal/otel"
	"github.com/turnstone-dev/turnstone/recovery"
)

func newSetupCommand(g *globals) *cobra.Command {
	var (
		partitions, replicas int
		update, withOTel     bool
		delivery             recovery.DeliveryConfig
	)
	cmd := &cobra.Command{
		Use:   "setup",
		Short: "Create or update the streams, consumers and buckets: the one writer of their settings",
		Long: `Create what the engines and workers need on JetStream, idempotently: the
event, snapshot and recovery streams, the projector's and the workers'
partition consumers, and the buckets (command statuses, members, fleet
index, write probe).

setup is the only writer of these settings. engine serve runs it (with no
setting given) on the embedded server it owns, so a first run creates
everything; with --nats-url, and under auth, nothing but setup creates or
changes them (docs/security.md). Every other process checks the settings
it needs and refuses when they differ from its flags: a worker started
with --ack-wait 30s while the consumers hold 10s exits and names both.

Settings not given keep the existing ones: running setup again changes
nothing unless asked. --ack-wait, --max-deliver and --pinned-ttl are
written to the recovery consumers of every partition; a stream setting
given that differs from the existing stream's is refused unless
--update-streams. Every change is recorded in the audit stream (engine
audit).

With --otel (the default when OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set) it also creates the live
OpenTelemetry export's consumers (docs/otel.md), which deliver the events
stored from then on.`,
		Example: cli.Examples(
			"set up a 3-node cluster's streams once, with 8 partitions",
			"engine setup --replicas 3 --partitions 8",
			"under auth, as the operator",
			"engine setup --nkey credentials/operator.nk"),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			nc, err := g.dial()
			if err != nil {
				return err
			}
			defer nc.Close()
			logger, err := g.logger()
			if err != nil {
				return err
			}
			js, err := jetstreamOf(nc)
			if err != nil {
				return err
			}
			if !cmd.Flags().Changed("otel") {
				xc, err := otel.ConfigFromEnv(nil)
				if err != nil {
					return err
				}
				withOTel = xc.Enabled
			}
			log, err := engine.Setup(ctx, js, engine.SetupConfig{
				Log:        events.Config{Partitions: partitions, Replicas: replicas, UpdateStreams: update},
				Delivery:   delivery,
				OTelExport: withOTel,
			}, &logger)
			if err != nil {
				return err
			}
			held, err := recovery.Check(ctx, js, log.Partitions(), recovery.DeliveryConfig{})
			if err != nil {
				return err
			}
			cfg := log.Config()
			fmt.Fprintf(cmd.OutOrStdout(), "set up: %d partitions, %d replicas, storage %s\n", log.Partitions(), cfg.Replicas, cfg.Storage)
			fmt.Fprintf(cmd.OutOrStdout(), "recovery consumers: %s\n", held)
			if withOTel {
				fmt.Fprintf(cmd.OutOrStdout(), "OpenTelemetry export consumers: %s-p0..p%d\n", otel.DefaultDurable, log.Partitions()-1)
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&partitions, "partitions", 0, "partitions of a new event stream (default 8; an existing stream keeps its count)")
	cmd.Flags().IntVar(&replicas, "replicas", 0, "replicas of new streams and buckets (existing ones keep theirs unless --update-streams)")
	cmd.Flags().BoolVar(&update, "update-streams", false, "change existing streams whose settings differ from the flags given")
	cmd.Flags().BoolVar(&withOTel, "otel", false, "create the live OpenTelemetry export's consumers too (default: when OTEL_EXPORTER_OTLP_ENDPOINT or _TRACES_ENDPOINT is set)")
	cmd.Flags().DurationVar(&delivery.AckWait, "ack-wait", 0, "recovery consumers: how long a worker may hold a command without a sign of progress before it is redelivered, e.g. after the worker died (default 10s; existing consumers keep theirs)")
	cmd.Flags().IntVar(&delivery.MaxDeliver, "max-deliver", 0, "recovery consumers: deliveries of a failing command before it is parked (default 5; existing consumers keep theirs)")
	cmd.Flags().DurationVar(&delivery.PinnedTTL, "pinned-ttl", 0, "recovery consumers: how long a partition stays pinned to a worker that stopped pulling (default 10s; existing consumers keep theirs)")
	return cmd
}
