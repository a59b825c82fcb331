package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/auth"
)

func newAuthCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "auth",
		Short: "Credentials and the nats-server configuration of an auth spec (docs/security.md)",
		Args:  cobra.NoArgs,
	}
	var out string
	config := &cobra.Command{
		Use:   "config SPEC",
		Short: "Write every user's nkey seed and print the nats-server accounts block",
		Long: `Make sure every user of the auth spec (operator, engine, worker, one per
tenant, and the spec's users) has an nkey seed in the spec's credentials
directory (new ones are created, existing ones kept; delete a seed file to
rotate that user's key), then print the nats-server configuration of the
accounts, users and permissions (or write it to --out). An external
nats-server or cluster includes it in its configuration (include
"accounts.conf"); engine serve --auth does the same on the embedded server.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			spec, err := auth.LoadSpec(args[0])
			if err != nil {
				return err
			}
			keys, created, err := auth.EnsureKeys(spec)
			if err != nil {
				return err
			}
			conf, err := auth.ServerConfig(spec, keys)
			if err != nil {
				return err
			}
			for _, u := range created {
				fmt.Fprintf(g.stderr, "created %s\n", spec.SeedFile(u))
			}
			if out == "" {
				_, err = fmt.Fprint(cmd.OutOrStdout(), conf)
				return err
			}
			if err := os.WriteFile(out, []byte(conf), 0o600); err != nil {
				return fmt.Errorf("--out: %w", err)
			}
			fmt.Fprintf(g.stderr, "wrote %s\n", out)
			return nil
		},
	}
	config.Flags().StringVarP(&out, "out", "o", "", "file to write the configuration to (default: standard output)")
	cmd.AddCommand(config)
	return cmd
}
