package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/internal/cli"
	"github.com/turnstone-dev/turnstone/internal/console"
	"github.com/turnstone-dev/turnstone/internal/presence"
)

func newRuntimesCommand(g *globals) *cobra.Command {
	var (
		wait   time.Duration
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "runtimes",
		Short: "The agent runtimes present on NATS, with the tenant and sessions each serves",
		Long: `List the agent runtimes that announce themselves as the nats.go/micro
service "turnstone-runtime" (docs/control.md, "Presence"), each with its
tenant and the sessions it serves, and whether it answered a control ping
on its tenant's subjects (verified): only a verified runtime makes its
sessions live and resumes the sessions that waited for it. --json prints
an array of the runtimes (docs/cli.md).`,
		Example: cli.Examples(
			"the runtimes present, and whether each answered a control ping",
			"engine runtimes",
			"as JSON, waiting 3 s for the answers",
			"engine runtimes --wait 3s --json"),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			nc, err := g.dial()
			if err != nil {
				return err
			}
			defer nc.Close()
			found, err := presence.Discover(ctx, nc, wait)
			if err != nil {
				return err
			}
			answered := time.Now().UTC()
			verified := map[string]bool{}
			for i := range found {
				t := found[i].Tenant
				if _, ok := verified[t]; !ok {
					verified[t] = presence.Ping(ctx, nc, t, wait) == nil
				}
				found[i].Verified = verified[t]
			}
			lines := make([]runtimeLine, 0, len(found))
			for _, r := range found {
				lines = append(lines, runtimeLine{ID: r.ID, Version: r.Version, Metadata: r.Metadata, Tenant: r.Tenant,
					Sessions: r.Sessions, Verified: r.Verified, AnsweredAt: answered})
			}
			return renderRuntimes(cmd.OutOrStdout(), lines, asJSON)
		},
	}
	cmd.Flags().DurationVar(&wait, "wait", time.Second, "how long to wait for the runtimes' answers")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array (docs/cli.md)")
	return cmd
}

// runtimeLine is one runtime of `engine runtimes --json` (docs/cli.md,
// docs/schema/runtimes.json): the micro service's identity, its tenant
// and sessions, whether it answered a control ping, and when the
// discovery it answered was made.
type runtimeLine struct {
	ID         string            `json:"id"`
	Version    string            `json:"version"`
	Metadata   map[string]string `json:"metadata"`
	Tenant     string            `json:"tenant"`
	Sessions   string            `json:"sessions"`
	Verified   bool              `json:"verified"`
	AnsweredAt time.Time         `json:"answered_at"`
}

// renderRuntimes prints the runtimes as a table, or as a JSON array.
func renderRuntimes(w io.Writer, rs []runtimeLine, asJSON bool) error {
	if asJSON {
		for i := range rs {
			if rs[i].Metadata == nil {
				rs[i].Metadata = map[string]string{}
			}
		}
		return writeJSON(w, rs)
	}
	w = console.NewWriter(w) // a runtime's metadata is its tenant's text: never raw on the terminal
	if len(rs) == 0 {
		_, err := fmt.Fprintln(w, "no runtime present (a runtime announces itself as the micro service \"turnstone-runtime\"; see docs/control.md)")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tSESSIONS\tVERIFIED\tID\tVERSION\tRUNTIME")
	for _, r := range rs {
		// Each field escaped on its own (tabs and newlines too): a
		// runtime's answer must not add a row or a column to the table.
		fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%s\t%s\n", console.Escape(r.Tenant), console.Escape(r.Sessions), r.Verified,
			console.Escape(r.ID), console.Escape(r.Version), console.Escape(r.Metadata["runtime"]))
	}
	return tw.Flush()
}
