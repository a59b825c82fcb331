package main

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/internal/audit"
	"github.com/turnstone-dev/turnstone/internal/cli"
)

func newAuditCommand(g *globals) *cobra.Command {
	var (
		tenant, action string
		limit          int
		asJSON         bool
	)
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "List the audit stream: who erased or changed what, when and why",
		Long: `List the records of the audit stream (AGENT_AUDIT, which denies delete and
purge), oldest first: erasures (erase_session, erase_tenant), retention
sweeps (retention) and stream settings changed by engine setup
(streams_updated), each with who, when, the scope, the reason, what it
removed or changed, and its outcome. --json prints a JSON array of
records (docs/erasure.md, docs/cli.md).`,
		Example: cli.Examples(
			"every erasure of tenant acme",
			"engine audit --tenant acme --action erase_session",
			"the latest 10 records, as JSON",
			"engine audit --limit 10 --json"),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			nc, err := g.dial()
			if err != nil {
				return err
			}
			defer nc.Close()
			js, err := jetstreamOf(nc)
			if err != nil {
				return err
			}
			recs, err := audit.List(ctx, js, audit.Filter{Tenant: tenant, Action: audit.Action(action), Limit: limit})
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				recs, err = nil, nil
			}
			if err != nil {
				return err
			}
			if recs == nil {
				recs = []audit.Record{}
			}
			if asJSON {
				return writeJSON(g.stdout, recs)
			}
			if len(recs) == 0 {
				fmt.Fprintln(g.stdout, "no audit record")
				return nil
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SEQ\tAT\tACTION\tWHO\tSCOPE\tREASON\tOUTCOME\tREMOVED / CHANGED")
			for _, r := range recs {
				scope := "-"
				if r.Scope != nil {
					switch len(r.Scope.Sessions) {
					case 0:
						scope = r.Scope.Tenant + "/*"
					case 1:
						scope = r.Scope.Tenant + "/" + r.Scope.Sessions[0]
					default:
						scope = fmt.Sprintf("%s/{%d sessions}", r.Scope.Tenant, len(r.Scope.Sessions))
					}
				}
				what := strings.Join(r.Changes, "; ")
				if r.Policy != "" {
					what = "policy: " + strings.Join(strings.Fields(r.Policy), " ")
				}
				if c := r.Counts; c != nil {
					what = fmt.Sprintf("%d sessions, %d events, %d snapshots, %d commands, %d statuses, %d index, %d rejects",
						c.Sessions, c.Events, c.Snapshots, c.Commands, c.Statuses, c.IndexEntries, c.Rejects)
				}
				outcome := r.Outcome
				if r.Error != "" {
					outcome += ": " + r.Error
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Seq, tableTime(r.At), r.Action,
					printable(r.Who, 60), printable(scope, 80), printable(r.Reason, 80), printable(outcome, 80), printable(what, 160))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "only the records of this tenant (and those of no tenant: stream changes)")
	cmd.Flags().StringVar(&action, "action", "", "only this action: erase_session, erase_tenant, retention, streams_updated, policy_loaded")
	cmd.Flags().IntVar(&limit, "limit", 0, "the latest N records (0: all)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}
