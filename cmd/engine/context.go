package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/internal/cli"
)

// contextLine is one context of `engine context ls --json` (docs/cli.md).
type contextLine struct {
	Name     string `json:"name"`
	Selected bool   `json:"selected"`
	cli.Context
}

func newContextCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "context",
		Short: "Save, select and list connection contexts (server URL, credentials, TLS), as the nats CLI does",
		Long: `A context is a named set of connection settings: --nats-url, --creds or
--nkey, --tls-cert, --tls-key and --tls-ca. Save one once, select it, and
every command (and the worker and the reference runtime) connects with it
without those flags.

Each setting comes from its flag, else the context named for the command
(--context NAME, else TURNSTONE_CONTEXT), else its environment variable
(TURNSTONE_NATS_URL, TURNSTONE_NKEY, ...), else the selected context,
else the default (the local engine). engine serve uses only a context
named for it (it runs the server the others connect to).

Contexts are kept in the user's configuration directory
(` + contextDirHint() + `), one JSON file each, readable by the
user alone (mode 0600); file paths in them are made absolute when saved.`,
		Example: cli.Examples(
			"save the settings of an engine under auth, and use them from now on",
			"engine context save secure --nats-url tls://127.0.0.1:4223 --nkey credentials/operator.nk --tls-ca certs/ca.pem --select",
			"list the contexts; the selected one is marked",
			"engine context ls"),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newContextSaveCommand(g), newContextSelectCommand(g), newContextLsCommand(g),
		newContextShowCommand(g), newContextRmCommand(g))
	return cmd
}

func contextDirHint() string {
	d, err := cli.DefaultContextDir()
	if err != nil {
		return "os.UserConfigDir()/turnstone"
	}
	return d
}

// contextStore is the store the context commands use.
func (g *globals) contextStore() (cli.ContextStore, error) {
	if g.conn.Store != nil {
		return *g.conn.Store, nil
	}
	return cli.DefaultContextStore()
}

func newContextSaveCommand(g *globals) *cobra.Command {
	var (
		description string
		sel         bool
	)
	cmd := &cobra.Command{
		Use:   "save NAME [--nats-url URL] [--nkey FILE | --creds FILE] [--tls-ca FILE] [--tls-cert FILE --tls-key FILE]",
		Short: "Save the connection flags given on this command line as a context",
		Long: `Save the connection flags given on this command line (--nats-url, --creds,
--nkey, --tls-cert, --tls-key, --tls-ca) as the context NAME, replacing a
context of that name. Only flags given here are saved: environment
variables are not. Relative file paths are made absolute. --select also
selects it.`,
		Example: cli.Examples(
			"the local engine's embedded server",
			"engine context save local --nats-url nats://127.0.0.1:4222 --select",
			"an engine under auth, with TLS",
			"engine context save secure --nats-url tls://127.0.0.1:4223 --nkey credentials/operator.nk --tls-ca certs/ca.pem"),
		Args: cli.ArgsNamed("the context's name", "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			fs := cmd.Flags()
			given := func(name string) string {
				if fs.Changed(name) {
					return fs.Lookup(name).Value.String()
				}
				return ""
			}
			c := cli.Context{Name: args[0], Description: description, URL: given("nats-url"), Creds: given("creds"), Nkey: given("nkey"),
				TLSCert: given("tls-cert"), TLSKey: given("tls-key"), TLSCA: given("tls-ca")}
			if c == (cli.Context{Name: args[0], Description: description}) {
				return errors.New("context save: give the settings to save: --nats-url, --nkey or --creds, --tls-ca, --tls-cert and --tls-key")
			}
			store, err := g.contextStore()
			if err != nil {
				return err
			}
			c, err = store.Save(c)
			if err != nil {
				return err
			}
			for flag, p := range map[string]string{"--creds": c.Creds, "--nkey": c.Nkey, "--tls-cert": c.TLSCert, "--tls-key": c.TLSKey, "--tls-ca": c.TLSCA} {
				if _, err := os.Stat(p); p != "" && err != nil {
					fmt.Fprintf(g.stderr, "note: %s %s: %v (saved all the same)\n", flag, p, err)
				}
			}
			fmt.Fprintf(g.stdout, "saved context %s\n", c.Name)
			if sel {
				if err := store.Select(c.Name); err != nil {
					return err
				}
				fmt.Fprintf(g.stdout, "selected context %s\n", c.Name)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&description, "description", "", "what the context is for")
	cmd.Flags().BoolVar(&sel, "select", false, "select it too")
	return cmd
}

func newContextSelectCommand(g *globals) *cobra.Command {
	var none bool
	cmd := &cobra.Command{
		Use:   "select [NAME | --none]",
		Short: "Select the context every command uses by default (no NAME: print the selected one)",
		Example: cli.Examples(
			"connect with the context secure from now on",
			"engine context select secure",
			"back to the flags, the environment and the defaults",
			"engine context select --none"),
		Annotations: map[string]string{cli.NoConnection: "true"},
		Args:        cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			store, err := g.contextStore()
			if err != nil {
				return err
			}
			switch {
			case none && len(args) > 0:
				return errors.New("context select: give NAME or --none, not both")
			case none:
				if err := store.Select(""); err != nil {
					return err
				}
				fmt.Fprintln(g.stdout, "no context selected")
				return nil
			case len(args) == 0:
				sel, err := store.Selected()
				if err != nil {
					return err
				}
				if sel == "" {
					fmt.Fprintln(g.stdout, "no context selected (engine context ls lists them)")
				} else {
					fmt.Fprintln(g.stdout, sel)
				}
				return nil
			}
			if err := store.Select(args[0]); err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "selected context %s\n", args[0])
			return nil
		},
	}
	cmd.Flags().BoolVar(&none, "none", false, "select no context")
	return cmd
}

func newContextLsCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls [--json]",
		Aliases: []string{"list"},
		Short:   "List the saved contexts; the selected one is marked *",
		Example: cli.Examples(
			"the contexts, the selected one marked *",
			"engine context ls",
			"as JSON (docs/cli.md)",
			"engine context ls --json"),
		Annotations: map[string]string{cli.NoConnection: "true"},
		Args:        cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			store, err := g.contextStore()
			if err != nil {
				return err
			}
			cs, err := store.List()
			if err != nil {
				return err
			}
			sel, err := store.Selected()
			if err != nil {
				return err
			}
			lines := make([]contextLine, 0, len(cs))
			for _, c := range cs {
				lines = append(lines, contextLine{Name: c.Name, Selected: c.Name == sel, Context: c})
			}
			if asJSON {
				return writeJSON(g.stdout, lines)
			}
			return printContexts(g.stdout, lines, store.Dir)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array (docs/cli.md)")
	return cmd
}

// printContexts prints the contexts as a table.
func printContexts(w io.Writer, lines []contextLine, dir string) error {
	if len(lines) == 0 {
		_, err := fmt.Fprintf(w, "no context saved in %s (engine context save --help)\n", dir)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\tNAME\tNATS URL\tCREDENTIALS\tTLS CA\tDESCRIPTION")
	for _, l := range lines {
		mark := ""
		if l.Selected {
			mark = "*"
		}
		creds := orDash(l.Nkey)
		if l.Creds != "" {
			creds = l.Creds
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", mark, l.Name, orDash(l.URL), creds, orDash(l.TLSCA), l.Description)
	}
	return tw.Flush()
}

func newContextShowCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "show [NAME]",
		Short: "Show a context's settings (default: the one that applies now)",
		Example: cli.Examples(
			"what the commands connect with now",
			"engine context show"),
		Annotations: map[string]string{cli.NoConnection: "true"},
		Args:        cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			store, err := g.contextStore()
			if err != nil {
				return err
			}
			name := g.conn.Context
			if len(args) == 1 {
				name = args[0]
			}
			if name == "" {
				if name, err = store.Selected(); err != nil {
					return err
				}
			}
			if name == "" {
				fmt.Fprintln(g.stdout, "no context applies: the flags, the environment and the defaults do (engine context ls)")
				return nil
			}
			c, err := store.Load(name)
			if err != nil {
				return err
			}
			p := func(k, v string) {
				if v != "" {
					fmt.Fprintf(g.stdout, "%-12s %s\n", k, v)
				}
			}
			p("context", c.Name)
			p("description", c.Description)
			p("nats-url", c.URL)
			p("creds", c.Creds)
			p("nkey", c.Nkey)
			p("tls-cert", c.TLSCert)
			p("tls-key", c.TLSKey)
			p("tls-ca", c.TLSCA)
			return nil
		},
	}
	return cmd
}

func newContextRmCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:         "rm NAME",
		Aliases:     []string{"remove"},
		Short:       "Remove a saved context (unselecting it when it was selected)",
		Example:     cli.Examples("forget the context secure", "engine context rm secure"),
		Annotations: map[string]string{cli.NoConnection: "true"},
		Args:        cli.ArgsNamed("the context's name", "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			store, err := g.contextStore()
			if err != nil {
				return err
			}
			if err := store.Remove(args[0]); err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "removed context %s\n", args[0])
			return nil
		},
	}
}
