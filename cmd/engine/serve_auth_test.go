package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestServeRefusesExposedWithoutAuth: --listen, --ui-listen or
// --telemetry-listen beyond loopback without --auth is refused before
// anything starts, with an error that names the flag and the way out;
// --insecure allows it with a loud warning; loopback needs neither.
func TestServeRefusesExposedWithoutAuth(t *testing.T) {
	for _, args := range [][]string{
		{"--listen", "0.0.0.0:0", "--telemetry-listen", ""},
		{"--listen", "127.0.0.1:0", "--ui-listen", "0.0.0.0:0", "--telemetry-listen", ""},
		{"--listen", "127.0.0.1:0", "--telemetry-listen", "0.0.0.0:0"},
		{"--listen", "127.0.0.1:0", "--telemetry-listen", ":9464"},
	} {
		var stdout, stderr bytes.Buffer
		root := newRootCommand(&stdout, &stderr)
		root.SetArgs(append([]string{"serve", "--data", t.TempDir()}, args...))
		err := root.ExecuteContext(context.Background())
		flag := args[0]
		if args[1] == "127.0.0.1:0" {
			flag = args[2]
		}
		if !errors.Is(err, errExposed) || !strings.Contains(err.Error(), flag+" ") || !strings.Contains(err.Error(), "--auth") || !strings.Contains(err.Error(), "--insecure") {
			t.Fatalf("%v: want the refusal naming %s, --auth and --insecure, got %v", args, flag, err)
		}
	}

	for _, tc := range []struct {
		host              string
		auth, insecure    bool
		wantErr, wantWarn bool
	}{
		{"127.0.0.1", false, false, false, false},
		{"localhost", false, false, false, false},
		{"::1", false, false, false, false},
		{"0.0.0.0", false, false, true, false},
		{"", false, false, true, false},
		{"10.1.2.3", false, false, true, false},
		{"0.0.0.0", true, false, false, false},
		{"0.0.0.0", false, true, false, true},
	} {
		var out bytes.Buffer
		g := &globals{stderr: &out}
		logger, _ := g.logger()
		err := checkExposure("--ui-listen", net.JoinHostPort(tc.host, "4222"), tc.auth, tc.insecure, &out, logger)
		if (err != nil) != tc.wantErr || bytes.Contains(out.Bytes(), []byte("INSECURE")) != tc.wantWarn {
			t.Errorf("host %q auth %v insecure %v: err %v, output %q", tc.host, tc.auth, tc.insecure, err, out.String())
		}
	}
}

// TestServeRefusesRetentionWithoutTheRights: a policy with a retention and
// an auth spec that does not grant the engines the rights to erase is
// refused at start, naming the line to add, instead of failing every
// sweep.
func TestServeRefusesRetentionWithoutTheRights(t *testing.T) {
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	spec := filepath.Join(dir, "auth.yaml")
	if err := os.WriteFile(policy, []byte("retention:\n  max_age: 720h\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(spec, []byte("tenants: [acme]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	root := newRootCommand(&stdout, &stderr)
	root.SetArgs([]string{"serve", "--auth", spec, "--policy", policy, "--data", filepath.Join(dir, "data"), "--telemetry-listen", ""})
	err := root.ExecuteContext(context.Background())
	if err == nil || !strings.Contains(err.Error(), "retention: true") {
		t.Fatalf("want the refusal naming `retention: true`, got %v", err)
	}
}
