package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/internal/cli"
	"github.com/turnstone-dev/turnstone/internal/engine"
	"github.com/turnstone-dev/turnstone/internal/pgroup"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// membersReport is the JSON of `engine members`.
type membersReport struct {
	Members    []memberLine    `json:"members"`
	Partitions []partitionLine `json:"partitions"`
}

// memberLine is one engine or worker of `engine members`.
type memberLine struct {
	Group      string            `json:"group"`
	Member     string            `json:"member"`
	Partitions []int             `json:"partitions"`
	Started    time.Time         `json:"started"`
	Beat       time.Time         `json:"beat"`
	Info       map[string]string `json:"info,omitempty"`
}

// partitionLine is one partition of `engine members`: who owns it and how
// far behind its consumers are.
type partitionLine struct {
	Partition int    `json:"partition"`
	Engine    string `json:"engine"`
	Lag       uint64 `json:"lag"`
	Worker    string `json:"worker"`
	Commands  uint64 `json:"commands_pending"`
}

func newMembersCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "members",
		Short: "The engines and workers sharing the partitions, and each partition's owner and lag",
		Long: `List the engines and workers of the partition groups (their heartbeats
in the turnstone_members bucket), the partitions each owns, and for every
partition its engine, the events not yet folded (lag), its worker and the
recovery commands waiting. --json prints {members, partitions}
(docs/cli.md).`,
		Example: cli.Examples(
			"who owns which partition, and how far behind each is",
			"engine members",
			"as JSON",
			"engine members --json"),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			nc, log, err := g.connect(ctx)
			if err != nil {
				return err
			}
			defer nc.Close()
			js := log.JetStream()
			own, err := pgroup.ReadOwnership(ctx, js, "", time.Now(), 0)
			if err != nil {
				return err
			}
			all := make([]int, log.Partitions())
			for i := range all {
				all[i] = i
			}
			states, err := projections.PartitionStates(ctx, js, "", all)
			if err != nil {
				return err
			}
			pending, err := recovery.PendingCommands(ctx, js, all)
			if err != nil {
				return err
			}
			rep := membersReport{Members: []memberLine{}, Partitions: []partitionLine{}}
			for _, r := range own.Members {
				rep.Members = append(rep.Members, memberLine{Group: r.Group, Member: r.Member, Partitions: r.Partitions, Started: r.Started, Beat: r.Beat, Info: r.Info})
			}
			for _, st := range states {
				rep.Partitions = append(rep.Partitions, partitionLine{Partition: st.Partition, Engine: own.Owner(engine.Group, st.Partition),
					Lag: st.Pending, Worker: own.Owner(recovery.WorkerGroup, st.Partition), Commands: pending[st.Partition]})
			}
			return renderMembers(cmd.OutOrStdout(), rep, asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (fields as in docs/cli.md)")
	return cmd
}

// renderMembers prints the report as two tables, or as JSON.
func renderMembers(w io.Writer, rep membersReport, asJSON bool) error {
	if asJSON {
		return writeJSON(w, rep)
	}
	sort.Slice(rep.Members, func(i, j int) bool {
		if rep.Members[i].Group != rep.Members[j].Group {
			return rep.Members[i].Group < rep.Members[j].Group
		}
		return rep.Members[i].Member < rep.Members[j].Member
	})
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tMEMBER\tPARTITIONS\tLAST HEARTBEAT (UTC)")
	for _, m := range rep.Members {
		ps := make([]string, len(m.Partitions))
		for i, p := range m.Partitions {
			ps[i] = fmt.Sprint(p)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", m.Group, m.Member, strings.Join(ps, ","), tableTime(m.Beat))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tENGINE\tLAG\tWORKER\tCOMMANDS PENDING")
	for _, p := range rep.Partitions {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%d\n", p.Partition, orDash(p.Engine), p.Lag, orDash(p.Worker), p.Commands)
	}
	return tw.Flush()
}
