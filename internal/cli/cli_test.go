package cli

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/turnstone-dev/turnstone/internal/auth"
)

// clearEnv unsets the connection's environment variables for the test.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, k := range []string{EnvURL, EnvContext, EnvCreds, EnvNkey, EnvTLSCert, EnvTLSKey, EnvTLSCA} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
}

func TestContextStoreKeepsContextsPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "turnstone")
	s := ContextStore{Dir: dir}
	t.Chdir(t.TempDir())
	saved, err := s.Save(Context{Name: "prod", URL: "tls://h:4222", Nkey: "credentials/operator.nk", TLSCA: "certs/ca.pem", Description: "the cluster"})
	if err != nil {
		t.Fatal(err)
	}
	if !filepath.IsAbs(saved.Nkey) || !filepath.IsAbs(saved.TLSCA) || !strings.HasSuffix(saved.Nkey, "credentials/operator.nk") {
		t.Errorf("saved paths are not absolute: %+v", saved)
	}
	for path, want := range map[string]os.FileMode{dir: 0o700, filepath.Join(dir, "context"): 0o700, filepath.Join(dir, "context", "prod.json"): 0o600} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%s has mode %o, want %o", path, got, want)
		}
	}
	got, err := s.Load("prod")
	if err != nil || got != saved {
		t.Errorf("Load = %+v, %v; want %+v", got, err, saved)
	}
	if _, err := s.Save(Context{Name: "dev", URL: "nats://127.0.0.1:4222"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Select("prod"); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, "context.txt"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("context.txt: %v, %v", fi, err)
	}
	if sel, _ := s.Selected(); sel != "prod" {
		t.Errorf("selected %q", sel)
	}
	list, err := s.List()
	if err != nil || len(list) != 2 || list[0].Name != "dev" || list[1].Name != "prod" {
		t.Errorf("List = %+v, %v", list, err)
	}
	if err := s.Remove("prod"); err != nil {
		t.Fatal(err)
	}
	if sel, _ := s.Selected(); sel != "" {
		t.Errorf("removing the selected context left %q selected", sel)
	}
	// Errors say what is wrong.
	if _, err := s.Load("prod"); !errors.Is(err, ErrNoContext) {
		t.Errorf("Load of a removed context: %v", err)
	}
	if err := s.Select("nope"); !errors.Is(err, ErrNoContext) {
		t.Errorf("Select of an unknown context: %v", err)
	}
	for _, bad := range []string{"", "../x", "a/b", ".hidden", "-x", strings.Repeat("a", 65)} {
		if _, err := s.Save(Context{Name: bad, URL: "nats://x"}); !errors.Is(err, ErrContextName) {
			t.Errorf("Save(%q) = %v, want ErrContextName", bad, err)
		}
	}
	if _, err := s.Save(Context{Name: "both", Creds: "a.creds", Nkey: "a.nk"}); err == nil {
		t.Error("a context with both --creds and --nkey was saved")
	}
}

// resolve parses args as a command line of a command with the connection
// flags, and resolves the context from store.
func resolve(t *testing.T, store *ContextStore, useSelected bool, args ...string) (Connection, error) {
	t.Helper()
	c := Connection{Store: store}
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	c.AddFlags(fs, "", "")
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	err := c.Resolve(fs, useSelected)
	return c, err
}

func TestResolveOrder(t *testing.T) {
	clearEnv(t)
	store := &ContextStore{Dir: t.TempDir()}
	for _, c := range []Context{
		{Name: "a", URL: "nats://a:4222", Nkey: "/a.nk", TLSCA: "/a-ca.pem"},
		{Name: "b", URL: "nats://b:4222", Creds: "/b.creds"},
	} {
		if _, err := store.Save(c); err != nil {
			t.Fatal(err)
		}
	}
	// Nothing selected: the defaults.
	c, err := resolve(t, store, true)
	if err != nil || c.URL != DefaultURL || c.Applied != "" {
		t.Errorf("no context: %+v, %v", c, err)
	}
	if err := store.Select("a"); err != nil {
		t.Fatal(err)
	}
	// The selected context gives what no flag gave; a flag wins.
	c, _ = resolve(t, store, true, "--nats-url", "nats://flag:4222")
	if c.URL != "nats://flag:4222" || c.Client.Nkey != "/a.nk" || c.Client.TLSCA != "/a-ca.pem" || c.Applied != "a" || c.AppliedURL {
		t.Errorf("selected context under a flag: %+v", c)
	}
	// The environment wins over the context.
	t.Setenv(EnvTLSCA, "/env-ca.pem")
	c, _ = resolve(t, store, true)
	if c.Client.TLSCA != "/env-ca.pem" || c.URL != "nats://a:4222" || !c.AppliedURL {
		t.Errorf("environment under a context: %+v", c)
	}
	// A context named for the run wins over the environment.
	c, _ = resolve(t, store, true, "--context", "a")
	if c.Client.TLSCA != "/a-ca.pem" {
		t.Errorf("--context a under %s: tls-ca %q", EnvTLSCA, c.Client.TLSCA)
	}
	t.Setenv(EnvCreds, "/env.creds")
	c, err = resolve(t, store, true, "--context", "a")
	if err != nil || c.Client.Creds != "" || c.Client.Nkey != "/a.nk" || c.Client.Validate() != nil {
		t.Errorf("--context a (an nkey) under %s: %+v, %v", EnvCreds, c.Client, err)
	}
	os.Unsetenv(EnvCreds)
	os.Unsetenv(EnvTLSCA)
	// --context and TURNSTONE_CONTEXT name another; --context wins.
	c, _ = resolve(t, store, true, "--context", "b")
	if c.URL != "nats://b:4222" || c.Client.Creds != "/b.creds" || c.Client.Nkey != "" || c.Applied != "b" {
		t.Errorf("--context b: %+v", c)
	}
	t.Setenv(EnvContext, "b")
	c, _ = resolve(t, store, true)
	if c.Applied != "b" {
		t.Errorf("%s=b: applied %q", EnvContext, c.Applied)
	}
	c, _ = resolve(t, store, true, "--context", "a")
	if c.Applied != "a" {
		t.Errorf("--context a under %s=b: applied %q", EnvContext, c.Applied)
	}
	os.Unsetenv(EnvContext)
	// A flag of the other kind of credentials replaces the context's.
	c, err = resolve(t, store, true, "--creds", "/flag.creds")
	if err != nil || c.Client.Creds != "/flag.creds" || c.Client.Nkey != "" {
		t.Errorf("--creds under a context with an nkey: %+v, %v", c, err)
	}
	if err := c.Client.Validate(); err != nil {
		t.Errorf("--creds under a context with an nkey: %v", err)
	}
	// engine serve: the selected context does not apply, a named one does.
	c, _ = resolve(t, store, false)
	if c.Applied != "" || c.URL != DefaultURL {
		t.Errorf("useSelected false applied the selected context: %+v", c)
	}
	c, _ = resolve(t, store, false, "--context", "b")
	if c.Applied != "b" {
		t.Errorf("useSelected false ignored --context: %+v", c)
	}
	// With nothing named, the local engine: TURNSTONE_LISTEN, where engine
	// serve listens.
	if err := store.Select(""); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvListen, "127.0.0.1:5999")
	c, _ = resolve(t, store, true)
	if c.URL != "nats://127.0.0.1:5999" || LocalURL() != c.URL {
		t.Errorf("%s: URL %q", EnvListen, c.URL)
	}
	os.Unsetenv(EnvListen)
	if err := store.Select("a"); err != nil {
		t.Fatal(err)
	}
	// --context "" names none; an unknown one is an error naming it.
	c, _ = resolve(t, store, true, "--context", "")
	if c.Applied != "" {
		t.Errorf("--context \"\" applied %q", c.Applied)
	}
	if _, err := resolve(t, store, true, "--context", "nope"); !errors.Is(err, ErrNoContext) || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("--context nope: %v", err)
	}
}

func TestDurationFlagTakesDays(t *testing.T) {
	var d time.Duration
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	DurationVar(fs, &d, "since", 0, "")
	for in, want := range map[string]time.Duration{"1d": 24 * time.Hour, "7d": 7 * 24 * time.Hour, "90m": 90 * time.Minute} {
		if err := fs.Parse([]string{"--since", in}); err != nil || d != want {
			t.Errorf("--since %s = %s, %v; want %s", in, d, err, want)
		}
	}
	_ = fs.Parse([]string{"--since", "90m"})
	if fs.Lookup("since").Value.String() != "1h30m0s" {
		t.Errorf("String = %q", fs.Lookup("since").Value.String())
	}
	if err := fs.Parse([]string{"--since", "1w"}); err == nil || !strings.Contains(err.Error(), `"7d"`) {
		t.Errorf("--since 1w: %v", err)
	}
}

func TestUsageGroupsTheConnectionFlags(t *testing.T) {
	root := &cobra.Command{Use: "engine"}
	var c Connection
	c.AddFlags(root.PersistentFlags(), "", "")
	sub := &cobra.Command{Use: "sessions", Example: Examples("every session", "engine sessions"), Run: func(*cobra.Command, []string) {}}
	sub.Flags().Bool("json", false, "print JSON")
	quiet := &cobra.Command{Use: "certs DIR", Annotations: map[string]string{NoConnection: "true"}, Run: func(*cobra.Command, []string) {}}
	root.AddCommand(sub, quiet)
	SetUsage(root)
	var out bytes.Buffer
	sub.SetOut(&out)
	if err := sub.Usage(); err != nil {
		t.Fatal(err)
	}
	u := out.String()
	head := strings.Index(u, "Connection Flags")
	if head < 0 || strings.Count(u, "Connection Flags") != 1 {
		t.Fatalf("no single connection heading:\n%s", u)
	}
	for _, f := range ConnectionFlags {
		re := regexp.MustCompile(`\n\s+--` + f + ` `)
		i := re.FindStringIndex(u)
		if i == nil || i[0] < head || len(re.FindAllString(u, -1)) != 1 {
			t.Errorf("--%s is not listed once under the connection heading:\n%s", f, u)
		}
	}
	if i := strings.Index(u, "--json"); i < 0 || i > head || !strings.Contains(u, "# every session\n  engine sessions") {
		t.Errorf("the command's own flags or its example are not above the connection flags:\n%s", u)
	}
	out.Reset()
	quiet.SetOut(&out)
	_ = quiet.Usage()
	if strings.Contains(out.String(), "--nats-url") {
		t.Errorf("a command that connects to nothing lists the connection flags:\n%s", out.String())
	}
	// A missing argument says which, with the example.
	insp := &cobra.Command{Use: "inspect SESSION", Example: Examples("a session", "engine inspect 258c7280"),
		Args: ArgsNamed("a session token", "SESSION"), RunE: func(*cobra.Command, []string) error { return nil }}
	root.AddCommand(insp)
	root.SetArgs([]string{"inspect"})
	root.SilenceErrors, root.SilenceUsage = true, true
	err := root.Execute()
	if err == nil || !strings.Contains(err.Error(), "missing SESSION (a session token); for example: engine inspect 258c7280") {
		t.Errorf("inspect with no argument: %v", err)
	}
}

// TestNATSServerVersionIsGoMods keeps NATSServerVersion, which the worker
// reports without linking the server, equal to the version go.mod pins.
func TestNATSServerVersionIsGoMods(t *testing.T) {
	b, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(NATSServerModule) + `\s+(\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("go.mod does not require " + NATSServerModule)
	}
	if string(m[1]) != NATSServerVersion {
		t.Errorf("NATSServerVersion is %s, go.mod pins %s: update internal/cli/version.go", NATSServerVersion, m[1])
	}
	// (test/cli_version_test.go checks what the built binaries print.)
}

// TestConnectErrorsSayWhatToDo connects to a real nats-server over TLS
// without the CA, with the wrong CA, by a host its certificate does not
// name, and to nothing: each error names the flag to fix.
func TestConnectErrorsSayWhatToDo(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	if _, err := auth.WriteCerts(auth.CertConfig{Dir: dir, Hosts: []string{"127.0.0.1"}}); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	if _, err := auth.WriteCerts(auth.CertConfig{Dir: other, Hosts: []string{"127.0.0.1"}}); err != nil {
		t.Fatal(err)
	}
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: filepath.Join(dir, auth.ServerCertFile), KeyFile: filepath.Join(dir, auth.ServerKeyFile)})
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, TLSConfig: tc, TLS: true, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	port := s.Addr().String()[strings.LastIndex(s.Addr().String(), ":")+1:]
	for _, tc := range []struct {
		name, url, ca string
		says          string
	}{
		{"no CA", "tls://127.0.0.1:" + port, "", "give --tls-ca FILE"},
		{"the wrong CA", "tls://127.0.0.1:" + port, filepath.Join(other, auth.CAFile), "did not sign the server's certificate"},
		{"a host it does not name", "tls://localhost:" + port, filepath.Join(dir, auth.CAFile), "does not name the host"},
		{"no server", "nats://127.0.0.1:1", "", "is `engine serve` running?"},
	} {
		c := Connection{URL: tc.url, Client: ClientConfig{TLSCA: tc.ca}}
		nc, err := c.Dial("test")
		if err == nil {
			nc.Close()
			t.Errorf("%s: connected", tc.name)
			continue
		}
		if !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v; want it to say %q", tc.name, err, tc.says)
		}
		if tc.ca != "" || tc.name == "no CA" {
			if strings.Contains(err.Error(), "engine serve` running") {
				t.Errorf("%s: a TLS failure asks whether the engine runs: %v", tc.name, err)
			}
		}
	}
	// The right CA connects.
	c := Connection{URL: "tls://127.0.0.1:" + port, Client: ClientConfig{TLSCA: filepath.Join(dir, auth.CAFile)}}
	nc, err := c.Dial("test")
	if err != nil {
		t.Fatalf("with the CA: %v", err)
	}
	nc.Close()
}
