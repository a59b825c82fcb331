package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/internal/cli"
	"github.com/turnstone-dev/turnstone/internal/engine"
	"github.com/turnstone-dev/turnstone/internal/erasure"
	"github.com/turnstone-dev/turnstone/projections"
)

func newEraseCommand(g *globals) *cobra.Command {
	var (
		tenant, reason string
		asJSON         bool
		wait           time.Duration
	)
	cmd := &cobra.Command{
		Use:   "erase TENANT/SESSION --reason R | erase --tenant T --reason R",
		Short: "Erase a session or a whole tenant: events, snapshots, commands, index, quarantine (operator only)",
		Long: `Remove everything Turnstone keeps of one session (TENANT/SESSION) or of every
session of a tenant (--tenant T): its events (AGENT_EVENTS), snapshots
(AGENT_SNAPSHOTS), recovery commands (AGENT_RECOVERY) and their statuses
(turnstone_commands), its fleet index entries (turnstone_sessions) and its
quarantine records (AGENT_QUARANTINE). It needs purge permission on those
streams: under auth, the operator's.

Every live engine and worker first confirms that it stopped writing the
scope and dropped it from memory; nothing is purged otherwise (the command
fails, naming who did not answer: try again). Appends to the scope are
refused for the moment of the erase (publishers retry them after it). The
erase is recorded in the audit stream (engine audit) with who ran it, the
reason, and how many messages each store lost.

Sessions forked from the erased one, or its sidechains, are sessions of
their own: erase them too (the command names those the index knows).`,
		Example: cli.Examples(
			"erase one session, saying why",
			"engine erase acme/chat-42 --reason \"GDPR request 2026-118\"",
			"erase every session of a tenant",
			"engine erase --tenant globex --reason \"contract ended\""),
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var scope erasure.Scope
			switch {
			case len(args) == 1 && tenant != "":
				return errors.New("give TENANT/SESSION or --tenant T, not both")
			case len(args) == 1:
				t, s, ok := strings.Cut(args[0], "/")
				if !ok || t == "" || s == "" {
					return fmt.Errorf("%q: name the session as TENANT/SESSION (a prefix is not enough to erase)", args[0])
				}
				scope = erasure.Scope{Tenant: t, Sessions: []string{s}}
			case tenant != "":
				scope = erasure.Scope{Tenant: tenant}
			default:
				return errors.New("name what to erase: TENANT/SESSION, or --tenant T")
			}
			if err := scope.Validate(); err != nil {
				return err
			}
			if strings.TrimSpace(reason) == "" {
				return errors.New("--reason: say why (it is kept in the audit stream)")
			}
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
			related, _ := relatedSessions(ctx, js, scope)
			rec, err := engine.Erase(ctx, nc, engine.EraseRequest{Scope: scope, Reason: reason, ConfirmWait: wait})
			if err != nil && rec.Counts == nil {
				return err
			}
			if asJSON {
				if eerr := writeJSON(g.stdout, rec); eerr != nil {
					return eerr
				}
				return err
			}
			c := rec.Counts
			verb := "erased"
			if err != nil {
				verb = "erase failed part way; removed of"
			}
			fmt.Fprintf(g.stdout, "%s %s: %d sessions; %d events, %d snapshots, %d commands, %d command statuses, %d index entries, %d quarantine records\n",
				verb, scope, c.Sessions, c.Events, c.Snapshots, c.Commands, c.Statuses, c.IndexEntries, c.Rejects)
			if rec.Seq != 0 {
				fmt.Fprintf(g.stdout, "recorded in the audit stream at seq %d (engine audit)\n", rec.Seq)
			}
			for _, r := range related {
				fmt.Fprintf(g.stdout, "note: %s/%s %s; it is not erased\n", r.Tenant, r.Session, relation(r, scope))
			}
			return err
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "erase every session of this tenant")
	cmd.Flags().StringVar(&reason, "reason", "", "why (required; kept in the audit stream)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the audit record as JSON")
	cmd.Flags().DurationVar(&wait, "wait", 10*time.Second, "how long the engines and workers have to confirm")
	return cmd
}

// relatedSessions lists the sessions outside scope the index says were
// forked from, or are sidechains of, a session of scope.
func relatedSessions(ctx context.Context, js jetstream.JetStream, scope erasure.Scope) ([]projections.Summary, error) {
	if scope.Whole() {
		return nil, nil
	}
	sums, err := projections.ReadIndex(ctx, js, projections.IndexFilter{Tenant: scope.Tenant})
	if err != nil {
		return nil, err
	}
	var out []projections.Summary
	for _, m := range sums {
		if scope.Covers(m.Tenant, m.Session) {
			continue
		}
		if scope.Covers(m.Tenant, m.ForkedFrom) || scope.Covers(m.Tenant, m.ParentSession) {
			out = append(out, m)
		}
	}
	return out, nil
}

func relation(m projections.Summary, scope erasure.Scope) string {
	if scope.Covers(m.Tenant, m.ForkedFrom) {
		return "was forked from " + m.ForkedFrom
	}
	return "is a sidechain of " + m.ParentSession
}
