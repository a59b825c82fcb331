package main

import (
	"fmt"

	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/cli"
	"github.com/turnstone-dev/turnstone/internal/engine"
	"github.com/turnstone-dev/turnstone/internal/otel"
)

func newSetupCommand(g *globals) *cobra.Command {
	var (
		partitions, replicas int
		update, withOTel     bool
	)
	cmd := &cobra.Command{
		Use:   "setup",
		Short: "Create or update the streams, consumers and buckets (an operator's job under auth)",
		Long: `Create what the engines and workers need on JetStream, idempotently: the
event, snapshot and recovery streams, the projector's and the workers'
partition consumers, and the buckets (command statuses, members, fleet
index, write probe). engine serve does it itself unless --use-existing;
under auth only the operator may (docs/security.md). Settings not given
keep the existing streams'; a setting given that differs is refused unless
--update-streams. With --otel (the default when OTEL_EXPORTER_OTLP_ENDPOINT
or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set) it also creates the live
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
			var opts []engine.SetupOption
			if !cmd.Flags().Changed("otel") {
				xc, err := otel.ConfigFromEnv(nil)
				if err != nil {
					return err
				}
				withOTel = xc.Enabled
			}
			if withOTel {
				opts = append(opts, engine.WithOTelExport())
			}
			log, err := engine.Setup(ctx, js, events.Config{Partitions: partitions, Replicas: replicas, UpdateStreams: update}, &logger, opts...)
			if err != nil {
				return err
			}
			cfg := log.Config()
			fmt.Fprintf(cmd.OutOrStdout(), "set up: %d partitions, %d replicas, storage %s\n", log.Partitions(), cfg.Replicas, cfg.Storage)
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
	return cmd
}
