package main

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
)

func newSessionsCommand(g *globals) *cobra.Command {
	var (
		tenant string
		asJSON bool
		broken bool
	)
	cmd := &cobra.Command{
		Use:   "sessions",
		Short: "List the sessions in the log: tenant, session, turns, status, orphans",
		Long: `List every session in the log, one line each: tenant, session, turns,
status (paused, in_turn, broken or idle), orphaned tool_use blocks,
violations, events and the time of the last event. Each session is rebuilt
from its last snapshot plus the events after it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			nc, log, err := g.connect(ctx)
			if err != nil {
				return err
			}
			defer nc.Close()
			states, err := restoreAll(ctx, log, tenant)
			if err != nil {
				return err
			}
			if broken {
				kept := states[:0]
				for _, s := range states {
					if s.Status() == projections.StatusBroken || len(s.OrphanedToolUseIDs()) > 0 {
						kept = append(kept, s)
					}
				}
				states = kept
			}
			if asJSON {
				return printSessionsJSON(g, states)
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TENANT\tSESSION\tTURNS\tSTATUS\tORPHANS\tVIOLATIONS\tEVENTS\tLAST EVENT")
			for _, s := range states {
				last := "-"
				if !s.LastTime.IsZero() {
					last = s.LastTime.UTC().Format(time.DateTime)
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%d\t%d\t%s\n", s.Tenant, s.Session, s.Totals.Turns, s.Status(),
					len(s.OrphanedToolUseIDs()), s.Totals.Violations, s.Events, last)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "list only this tenant's sessions")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	cmd.Flags().BoolVar(&broken, "broken", false, "list only sessions with orphans or violations")
	return cmd
}

type sessionLine struct {
	Tenant     string    `json:"tenant"`
	Session    string    `json:"session"`
	Kind       string    `json:"kind,omitempty"`
	Parent     string    `json:"parent_session,omitempty"`
	Turns      int       `json:"turns"`
	Status     string    `json:"status"`
	Orphans    int       `json:"orphans"`
	Violations int       `json:"violations"`
	Events     int       `json:"events"`
	LastTime   time.Time `json:"last_time,omitzero"`
}

func printSessionsJSON(g *globals, states []*projections.Session) error {
	out := make([]sessionLine, 0, len(states))
	for _, s := range states {
		out = append(out, sessionLine{Tenant: s.Tenant, Session: s.Session, Kind: s.Kind, Parent: s.ParentSession,
			Turns: s.Totals.Turns, Status: s.Status(), Orphans: len(s.OrphanedToolUseIDs()),
			Violations: s.Totals.Violations, Events: s.Events, LastTime: s.LastTime})
	}
	enc := json.NewEncoder(g.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// restoreAll rebuilds every session of the log (of one tenant when tenant
// is set) from its last snapshot plus its tail, in the log's order.
func restoreAll(ctx context.Context, log *events.Log, tenant string) ([]*projections.Session, error) {
	refs, err := log.Sessions(ctx, tenant)
	if err != nil {
		return nil, err
	}
	store, err := projections.NewSnapshotStore(log.JetStream(), projections.SnapshotConfig{})
	if err != nil {
		return nil, err
	}
	out := make([]*projections.Session, 0, len(refs))
	for _, r := range refs {
		s, err := projections.Restore(ctx, log, store, r.Tenant, r.Session)
		if err != nil {
			return nil, err
		}
		if s.Tenant == "" { // only invalid events: name it from the subject
			s.Tenant, s.Session = r.Tenant, r.Session
		}
		out = append(out, s)
	}
	return out, nil
}
