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
	var out, data string
	config := &cobra.Command{
		Use:   "config SPEC",
		Short: "Write every user's nkey seed and print the nats-server accounts block",
		Long: `Make sure every user of the auth spec (operator, engine, worker, one per
tenant, and the spec's users) has an nkey seed in the spec's credentials
directory (its credentials:, else DATA/credentials with --data, else
$XDG_STATE_HOME/turnstone/credentials: never the working tree; new ones
are created, existing ones kept; delete a seed file to rotate that user's
key), then print the nats-server configuration of the
accounts, users and permissions (or write it to --out). An external
nats-server or cluster includes it in its configuration (include
"accounts.conf"); engine serve --auth does the same on the embedded server.`,
		Example: cli.Examples(
			"write the seeds beside auth.yaml and the configuration to accounts.conf",
			"engine auth config auth.yaml -o accounts.conf"),
		Annotations: map[string]string{cli.NoConnection: "true"},
		Args:        cli.ArgsNamed("the auth spec, a YAML file; docs/security.md", "SPEC"),
		RunE: func(cmd *cobra.Command, args []string) error {
			spec, err := loadSpec(args[0], data)
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
	config.Flags().StringVar(&data, "data", "", "the engine's --data: its credentials subdirectory holds the seeds when the spec names no credentials directory")
	cmd.AddCommand(config, newAuthTokenCommand(g), newAuthCertsCommand(g))
	return cmd
}

// loadSpec loads an auth spec; data, when set, is the engine's --data
// (auth.Spec.UseDataDir).
func loadSpec(path, data string) (*auth.Spec, error) {
	spec, err := auth.LoadSpec(path)
	if err != nil {
		return nil, err
	}
	if data != "" {
		spec.UseDataDir(data)
	}
	return spec, nil
}

// newAuthTokenCommand is `engine auth token SPEC`: the operator's token
// for the web view under auth.
func newAuthTokenCommand(g *globals) *cobra.Command {
	var (
		data   string
		rotate bool
	)
	cmd := &cobra.Command{
		Use:   "token SPEC",
		Short: "Print the operator's web token: the web view under auth answers only it",
		Long: `Print the token the web view asks for under --auth (creating it when it
does not exist yet): type it into the view's sign-in page (/ui/login), or
send it as "Authorization: Bearer <token>". It lives in the spec's
credentials directory (web.token, mode 0600), readable by whoever may read
the operator's seed. --rotate makes a new one (restart the engines to
use it; every browser signed in must sign in again). docs/security.md.`,
		Example: cli.Examples(
			"the token of the engine started with --auth auth.yaml --data auth-data",
			"engine auth token auth.yaml --data auth-data"),
		Annotations: map[string]string{cli.NoConnection: "true"},
		Args:        cli.ArgsNamed("the auth spec the engine was started with", "SPEC"),
		RunE: func(cmd *cobra.Command, args []string) error {
			spec, err := loadSpec(args[0], data)
			if err != nil {
				return err
			}
			token, created, err := auth.EnsureWebToken(spec, rotate)
			if err != nil {
				return err
			}
			if created {
				fmt.Fprintf(g.stderr, "wrote %s\n", spec.WebTokenFile())
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), token)
			return err
		},
	}
	cmd.Flags().StringVar(&data, "data", "", "the engine's --data (see engine auth config --help)")
	cmd.Flags().BoolVar(&rotate, "rotate", false, "make a new token in place of the old one")
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
		Use:   "certs [DIR]",
		Short: "Write a self-signed CA and a server certificate for nats-server's TLS",
		Long: `Make sure DIR holds ` + auth.CAFile + ` (a self-signed CA: give it to every client
with --tls-ca), ` + auth.ServerCertFile + ` and ` + auth.ServerKeyFile + ` (the server's certificate, signed
by that CA, naming every --hosts, and its key: nats-server --tlscert and
--tlskey). Certificates that already name every host and stay valid for 30
more days are kept, so it can run at every start; otherwise a new CA and
server certificate replace them. The CA's private key is never written.
Use your own CA instead when you have one (docs/security.md). DIR
defaults to $XDG_STATE_HOME/turnstone/certs, outside any working tree
(the repository's .gitignore covers keys written inside it).`,
		Example: cli.Examples(
			"a CA and a certificate for a server reached as 127.0.0.1 or localhost, in certs/",
			"engine auth certs certs --hosts 127.0.0.1,localhost"),
		Annotations: map[string]string{cli.NoConnection: "true"},
		Args:        cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				d, err := auth.StateDir()
				if err != nil {
					return err
				}
				args = []string{filepath.Join(d, "certs")}
			}
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
