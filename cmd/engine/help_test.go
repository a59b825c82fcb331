package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// envAssign is an environment assignment leading a command line.
var envAssign = regexp.MustCompile(`^[A-Z][A-Z0-9_]*=\S*\s+`)

// TestEveryCommandHasExamples walks the command tree: each command's help
// has one or two examples, lists the connection flags once under their
// heading (or not at all for a command that connects to nothing), and a
// command's Use line names its arguments.
func TestEveryCommandHasExamples(t *testing.T) {
	root := newRootCommand(io.Discard, io.Discard)
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		path := c.CommandPath()
		n := strings.Count(c.Example, "\n  # ") + 1
		if !strings.HasPrefix(c.Example, "  # ") {
			n = 0
		}
		if n < 1 || n > 2 {
			t.Errorf("%s: %d examples, want one or two:\n%s", path, n, c.Example)
		}
		for _, line := range strings.Split(c.Example, "\n") {
			line = strings.TrimSpace(line)
			for line != "" && envAssign.MatchString(line) { // VAR=value engine ...
				line = strings.TrimSpace(envAssign.ReplaceAllString(line, ""))
			}
			if line != "" && !strings.HasPrefix(line, "#") && !strings.HasPrefix(line, "engine") {
				t.Errorf("%s: example %q does not run engine", path, line)
			}
		}
		var out bytes.Buffer
		c.SetOut(&out)
		if err := c.Help(); err != nil {
			t.Fatal(err)
		}
		h := out.String()
		conn := strings.Count(h, "Connection Flags")
		switch {
		case c.Annotations["turnstone/no-connection"] == "true":
			if conn != 0 || strings.Contains(h, "--nats-url") {
				t.Errorf("%s connects to nothing but lists the connection flags", path)
			}
		case conn != 1 || strings.Count(h, "      --nats-url") != 1 || strings.Count(h, "      --tls-ca") != 1:
			t.Errorf("%s: the connection flags are not listed once under one heading:\n%s", path, h)
		}
	}
	walk(root)
}

// TestEveryJSONOutputHasASchema: each command with --json has its schema
// in docs/schema (named by its path: "recovery list" is
// recovery-list.json), docs/cli.md links it, and the schema test
// (test/cli_schema_test.go) validates an output against it.
func TestEveryJSONOutputHasASchema(t *testing.T) {
	cliDoc, err := os.ReadFile("../../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	schemaTest, err := os.ReadFile("../../test/cli_schema_test.go")
	if err != nil {
		t.Fatal(err)
	}
	root := newRootCommand(io.Discard, io.Discard)
	var walk func(c *cobra.Command)
	seen := 0
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		if c.Flags().Lookup("json") == nil {
			return
		}
		names := []string{strings.ReplaceAll(strings.TrimPrefix(c.CommandPath(), "engine "), " ", "-") + ".json"}
		if c.Name() == "incidents" {
			names = append(names, "incidents-by-session.json")
		}
		for _, name := range names {
			seen++
			if _, err := os.Stat(filepath.Join("../../docs/schema", name)); err != nil {
				t.Errorf("%s --json has no schema docs/schema/%s", c.CommandPath(), name)
			}
			if !strings.Contains(string(cliDoc), "(schema/"+name+")") {
				t.Errorf("docs/cli.md does not link schema/%s", name)
			}
			if !strings.Contains(string(schemaTest), `"`+name+`"`) {
				t.Errorf("test/cli_schema_test.go never validates %s", name)
			}
		}
	}
	walk(root)
	if seen < 10 {
		t.Errorf("only %d --json outputs found", seen)
	}
}
