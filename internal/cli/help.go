package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// NoConnection is the annotation (key, value "true") of a command that
// connects to nothing (engine context, engine auth certs): its help leaves
// the connection flags out.
const NoConnection = "turnstone/no-connection"

// SetUsage gives cmd and every command under it Turnstone's help layout:
// cobra's, except that the connection flags (FlagGroup GroupConnection)
// are listed once, under their own heading, after the command's own flags,
// and that a command annotated NoConnection does not list them. Call it on
// the root after adding the subcommands; ones added later inherit it.
func SetUsage(cmd *cobra.Command) {
	cmd.SetUsageFunc(usage)
}

// usage writes cmd's usage to its error stream, as cobra's default
// template does, with the flags split by group.
func usage(cmd *cobra.Command) error {
	w := cmd.OutOrStderr()
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("Usage:")
	if cmd.Runnable() {
		p("\n  %s", cmd.UseLine())
	}
	if cmd.HasAvailableSubCommands() {
		p("\n  %s [command]", cmd.CommandPath())
	}
	if len(cmd.Aliases) > 0 {
		p("\n\nAliases:\n  %s", cmd.NameAndAliases())
	}
	if cmd.HasExample() {
		p("\n\nExamples:\n%s", cmd.Example)
	}
	if cmd.HasAvailableSubCommands() {
		p("\n\nAvailable Commands:")
		for _, c := range cmd.Commands() {
			if c.IsAvailableCommand() || c.Name() == "help" {
				p("\n  %-*s %s", c.NamePadding(), c.Name(), c.Short)
			}
		}
	}
	own, conn := pflag.NewFlagSet("own", pflag.ContinueOnError), pflag.NewFlagSet("connection", pflag.ContinueOnError)
	add := func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		if g := f.Annotations[FlagGroup]; len(g) > 0 && g[0] == GroupConnection {
			if cmd.Annotations[NoConnection] != "true" {
				conn.AddFlag(f)
			}
			return
		}
		if own.Lookup(f.Name) == nil {
			own.AddFlag(f)
		}
	}
	cmd.LocalFlags().VisitAll(add)
	cmd.InheritedFlags().VisitAll(add)
	if own.HasAvailableFlags() {
		p("\n\nFlags:\n%s", strings.TrimRight(own.FlagUsages(), " \n"))
	}
	if conn.HasAvailableFlags() {
		p("\n\nConnection Flags (each also from its environment variable, or a saved context: engine context --help):\n%s",
			strings.TrimRight(conn.FlagUsages(), " \n"))
	}
	if cmd.HasAvailableSubCommands() {
		p("\n\nUse \"%s [command] --help\" for more information about a command.", cmd.CommandPath())
	}
	p("\n")
	return nil
}

// Examples formats a command's examples for cobra.Command.Example: each
// pair is a comment and a command line, indented as cobra's help indents
// them.
func Examples(pairs ...string) string {
	var b strings.Builder
	for i := 0; i+1 < len(pairs); i += 2 {
		if i > 0 {
			b.WriteString("\n\n")
		}
		fmt.Fprintf(&b, "  # %s\n  %s", pairs[i], pairs[i+1])
	}
	return b.String()
}

// ArgsNamed returns a cobra.PositionalArgs that takes exactly the
// arguments names (one word each, as the Use line names them) and, when
// some are missing or extra, says which, with an example: "inspect: name
// the SESSION (a session token, a prefix, or TENANT/SESSION): engine
// inspect 258c7280".
func ArgsNamed(what string, names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		switch {
		case len(args) < len(names):
			missing := names[len(args):]
			msg := fmt.Sprintf("missing %s", strings.Join(missing, " "))
			if what != "" {
				msg += " (" + what + ")"
			}
			if ex := firstExample(cmd); ex != "" {
				msg += "; for example: " + ex
			}
			return fmt.Errorf("%s: %s", cmd.Name(), msg)
		case len(args) > len(names):
			return fmt.Errorf("%s: takes %s, got %d arguments (%s)", cmd.Name(), strings.Join(names, " "), len(args), strings.Join(args, " "))
		}
		return nil
	}
}

// firstExample is the first command line of cmd's examples ("" for none).
func firstExample(cmd *cobra.Command) string {
	for _, l := range strings.Split(cmd.Example, "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "#") {
			return l
		}
	}
	return ""
}

// WriteVersion is a cobra version template function: it writes the
// BuildInfo of binary to w.
func WriteVersion(w io.Writer, binary string) error {
	_, err := io.WriteString(w, ReadBuildInfo(binary).String())
	return err
}
