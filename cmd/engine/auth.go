package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/internal/auth"
	"github.com/turnstone-dev/turnstone/internal/cli"
)

func newAuthCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "auth",
		Short: "Credentials and the nats-server configuration of an auth spec (docs/security.md)",
		Example: cli.Examples(
			"a CA and a server certificate for the engine's TLS",
			"engine auth certs certs --hosts 127.0.0.1,localhost",
			"the seeds and the accounts block of an external nats-server",
			"engine auth config auth.yaml -o accounts.conf"),
		Args:        cobra.NoArgs,
		Annotations: map[string]string{cli.NoConnection: "true"},
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
		Example: cli.Examples(
			"write the seeds beside auth.yaml and the configuration to accounts.conf",
			"engine auth config auth.yaml -o accounts.conf"),
		Annotations: map[string]string{cli.NoConnection: "true"},
		Args:        cli.ArgsNamed("the auth spec, a YAML file; docs/security.md", "SPEC"),
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
	cmd.AddCommand(config, newAuthCertsCommand(g))
	return cmd
}

// newAuthCertsCommand is `engine auth certs DIR --hosts ...`: a
// self-signed CA and a server certificate for nats-server's client port,
// for setups with no CA of their own (docker-compose.yml's init-tls).
func newAuthCertsCommand(g *globals) *cobra.Command {
	var (
		hosts    []string
		validFor time.Duration
	)
	cmd := &cobra.Command{
		Use:   "certs DIR",
		Short: "Write a self-signed CA and a server certificate for nats-server's TLS",
		Long: `Make sure DIR holds ` + auth.CAFile + ` (a self-signed CA: give it to every client
with --tls-ca), ` + auth.ServerCertFile + ` and ` + auth.ServerKeyFile + ` (the server's certificate, signed
by that CA, naming every --hosts, and its key: nats-server --tlscert and
--tlskey). Certificates that already name every host and stay valid for 30
more days are kept, so it can run at every start; otherwise a new CA and
server certificate replace them. The CA's private key is never written.
Use your own CA instead when you have one (docs/security.md).`,
		Example: cli.Examples(
			"a CA and a certificate for a server reached as 127.0.0.1 or localhost, in certs/",
			"engine auth certs certs --hosts 127.0.0.1,localhost"),
		Annotations: map[string]string{cli.NoConnection: "true"},
		Args:        cli.ArgsNamed("the directory to write the certificates in", "DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			created, err := auth.WriteCerts(auth.CertConfig{Dir: args[0], Hosts: hosts, ValidFor: validFor})
			if err != nil {
				return err
			}
			if created {
				fmt.Fprintf(g.stderr, "wrote %s, %s and %s for %v\n", filepath.Join(args[0], auth.CAFile),
					filepath.Join(args[0], auth.ServerCertFile), filepath.Join(args[0], auth.ServerKeyFile), hosts)
			} else {
				fmt.Fprintf(g.stderr, "kept the certificates in %s: they name %v and stay valid for at least 30 more days\n", args[0], hosts)
			}
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&hosts, "hosts", nil, "DNS names and IP addresses clients reach the server by, comma-separated (required)")
	cmd.Flags().DurationVar(&validFor, "valid-for", auth.DefaultCertValidity, "how long the certificates are valid")
	_ = cmd.MarkFlagRequired("hosts")
	return cmd
}
