package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCredentialsStayOutOfTheWorkingTree: with a spec that names no
// credentials directory, `engine auth config`, `auth token` and `auth
// certs` write nothing beside the spec (the working tree) but into
// $XDG_STATE_HOME/turnstone, or the engine's --data; and the repository's
// .gitignore covers what they write when told to write inside it.
func TestCredentialsStayOutOfTheWorkingTree(t *testing.T) {
	tree, state := t.TempDir(), t.TempDir()
	t.Setenv("XDG_STATE_HOME", state)
	spec := filepath.Join(tree, "auth.yaml")
	if err := os.WriteFile(spec, []byte("tenants: [acme]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		root := newRootCommand(&stdout, &stderr)
		root.SetArgs(args)
		if err := root.ExecuteContext(context.Background()); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, stderr.String())
		}
		return stdout.String()
	}
	run("auth", "config", spec)
	token := strings.TrimSpace(run("auth", "token", spec))
	run("auth", "certs", "--hosts", "localhost")
	if again := strings.TrimSpace(run("auth", "token", spec)); again != token || len(token) < 32 {
		t.Fatalf("token %q, then %q: want one token of 32+ characters, kept", token, again)
	}
	if rotated := strings.TrimSpace(run("auth", "token", spec, "--rotate")); rotated == token {
		t.Fatal("--rotate kept the token")
	}
	entries, _ := os.ReadDir(tree)
	if len(entries) != 1 {
		t.Fatalf("the working tree holds %v, want only the spec", entries)
	}
	for _, f := range []string{"credentials/operator.nk", "credentials/acme.nk", "credentials/web.token", "certs/server-key.pem", "certs/ca.pem"} {
		fi, err := os.Stat(filepath.Join(state, "turnstone", f))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if strings.HasSuffix(f, ".nk") || strings.HasSuffix(f, ".token") || strings.HasSuffix(f, "key.pem") {
			if fi.Mode().Perm()&0o077 != 0 {
				t.Errorf("%s: mode %v, readable by others", f, fi.Mode())
			}
		}
	}
	data := filepath.Join(t.TempDir(), "data")
	run("auth", "config", spec, "--data", data)
	if _, err := os.Stat(filepath.Join(data, "credentials", "engine.nk")); err != nil {
		t.Fatalf("with --data: %v", err)
	}

	// Written inside the repository anyway (a spec's credentials: ./x,
	// auth certs .), git ignores them.
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not installed: the .gitignore check needs it")
	}
	for _, p := range []string{"credentials/acme.nk", "deploy/credentials/operator.nk", "x/acme.nk", "server-key.pem",
		"deploy/certs/server-key.pem", "web.token", "x/credentials/web.token", "turnstone-data/credentials/engine.nk"} {
		if err := exec.Command("git", "-C", "../..", "check-ignore", "-q", "--no-index", p).Run(); err != nil {
			t.Errorf("%s is not ignored by .gitignore (%v)", p, err)
		}
	}
}
