package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/cli"
	"github.com/turnstone-dev/turnstone/internal/clock"
	"github.com/turnstone-dev/turnstone/internal/console"
	"github.com/turnstone-dev/turnstone/internal/otel"
)

func newExportCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "export",
		Short: "Send the log's history to another system",
		Example: cli.Examples(
			"a session's history to an OpenTelemetry backend (docs/otel.md)",
			"OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 engine export otel acme/chat-42"),
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newExportOTelCommand(g))
	return cmd
}

func newExportOTelCommand(g *globals) *cobra.Command {
	var (
		tenant, since string
		quiet         bool
	)
	cmd := &cobra.Command{
		Use:   "otel (TENANT/SESSION... | --tenant TENANT) [--since D]",
		Short: "Send sessions' history to an OpenTelemetry backend as GenAI spans",
		Long: `Replay sessions from the log and send their spans to the OpenTelemetry
backend the standard variables name (OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, _HEADERS, _PROTOCOL, OTEL_SERVICE_NAME,
OTEL_RESOURCE_ATTRIBUTES; docs/otel.md): a trace per turn, a chat span per
model call, an execute_tool span per tool call, recovery commands and
anomalies. They are the spans engine serve exports live, with the same ids:
exporting a session twice, or one exported live, sends identical spans.

Name sessions as TENANT/SESSION (or a unique prefix; a session's
sidechains, <session>_agent-..., go with it), or every session of a tenant
with --tenant. --since (a duration back from now, such as 24h, or an RFC
3339 time; days too: 7d) sends only the spans that ended since then; every session is
still replayed from its first event. A progress bar shows on a terminal.`,
		Example: cli.Examples(
			"one session and its sidechains, to a local Jaeger or any OTLP/HTTP backend",
			"OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 engine export otel acme/chat-42",
			"the spans of every session of tenant acme that ended in the last day",
			"OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 engine export otel --tenant acme --since 1d"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if (len(args) == 0) == (tenant == "") {
				return errors.New("name sessions (TENANT/SESSION...) or --tenant, not both")
			}
			if tenant != "" && !events.ValidToken(tenant) {
				return fmt.Errorf("--tenant %q: must be 1-%d characters of [A-Za-z0-9_-]", tenant, events.MaxTokenLen)
			}
			from, err := parseSince(since, time.Now())
			if err != nil {
				return err
			}
			xc, err := otel.ConfigFromEnv(nil)
			if err != nil {
				return err
			}
			if !xc.Enabled {
				return fmt.Errorf("no OpenTelemetry backend: set %s (or %s), e.g. http://localhost:4318 (docs/otel.md)", otel.EnvEndpoint, otel.EnvTracesEndpoint)
			}
			nc, log, err := g.connect(ctx)
			if err != nil {
				return err
			}
			defer nc.Close()
			refs, err := exportRefs(ctx, log, args, tenant)
			if err != nil {
				return err
			}
			exp, err := otel.NewSpanExporter(ctx, xc)
			if err != nil {
				return err
			}
			res, err := otel.ResourceFromEnv(ctx)
			if err != nil {
				return err
			}
			var total uint64
			for _, r := range refs {
				total += r.Events
			}
			bar := progressbar.NewOptions64(int64(total),
				progressbar.OptionSetWriter(g.stderr),
				progressbar.OptionSetDescription("exporting"),
				progressbar.OptionSetVisibility(!quiet && console.IsTerminal(g.stderr)),
				progressbar.OptionShowCount(),
				progressbar.OptionClearOnFinish(),
				progressbar.OptionThrottle(100*time.Millisecond),
			)
			start := time.Now()
			stats, err := otel.Backfill(ctx, log, exp, refs, otel.BackfillConfig{
				Map: xc.Map, Resource: res, Batch: xc.Batch, Since: from,
				Progress: func(s otel.BackfillStats) { _ = bar.Set64(int64(s.Events)) },
			})
			_ = bar.Finish()
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if serr := exp.Shutdown(sctx); err == nil && serr != nil {
				err = fmt.Errorf("close the exporter: %w", serr)
			}
			fmt.Fprintf(g.stdout, "exported %d spans of %d sessions (%d events) to %s in %s\n",
				stats.Spans, stats.Sessions, stats.Events, xc.Endpoint, time.Since(start).Round(time.Millisecond))
			return err
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "export every session of this tenant")
	cmd.Flags().StringVar(&since, "since", "", "only the spans that ended since: a duration back from now (24h) or an RFC 3339 time")
	cmd.Flags().BoolVar(&quiet, "quiet", false, "no progress bar")
	return cmd
}

// parseSince reads --since: empty (no bound), a duration back from now,
// or an RFC 3339 time.
func parseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := clock.ParseDuration(s); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("--since %q: want a positive duration (24h, 7d) or an RFC 3339 time (2026-02-19T10:00:00Z)", s)
}

// exportRefs lists the sessions to export: each named one with its
// sidechains (<session>_agent-...), or every session of tenant.
func exportRefs(ctx context.Context, log *events.Log, args []string, tenant string) ([]otel.SessionRef, error) {
	var out []otel.SessionRef
	add := func(r events.SessionRef) {
		out = append(out, otel.SessionRef{Tenant: r.Tenant, Session: r.Session, Events: r.Events})
	}
	if tenant != "" {
		all, err := log.Sessions(ctx, tenant)
		if err != nil {
			return nil, err
		}
		if len(all) == 0 {
			return nil, fmt.Errorf("tenant %s: %w", tenant, events.ErrSessionNotFound)
		}
		for _, r := range all {
			add(r)
		}
		return out, nil
	}
	seen := map[string]bool{}
	for _, a := range args {
		r, err := resolveSession(ctx, log, a, "")
		if err != nil {
			return nil, err
		}
		all, err := log.Sessions(ctx, r.Tenant)
		if err != nil {
			return nil, err
		}
		for _, s := range all {
			if (s.Session == r.Session || strings.HasPrefix(s.Session, r.Session+"_agent-")) && !seen[s.Tenant+"/"+s.Session] {
				seen[s.Tenant+"/"+s.Session] = true
				add(s)
			}
		}
	}
	return out, nil
}
