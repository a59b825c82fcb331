package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
)

// TestServeRefusesExposedWithoutAuth: --listen beyond loopback without
// --auth is refused before anything starts, with an error that names the
// way out; --insecure allows it with a loud warning; loopback needs
// neither.
func TestServeRefusesExposedWithoutAuth(t *testing.T) {
	var stdout, stderr bytes.Buffer
	root := newRootCommand(&stdout, &stderr)
	root.SetArgs([]string{"serve", "--listen", "0.0.0.0:0", "--data", t.TempDir(), "--telemetry-listen", ""})
	err := root.ExecuteContext(context.Background())
	if !errors.Is(err, errExposed) || !bytes.Contains([]byte(err.Error()), []byte("--auth")) || !bytes.Contains([]byte(err.Error()), []byte("--insecure")) {
		t.Fatalf("want the refusal naming --auth and --insecure, got %v", err)
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
		err := checkExposure(net.JoinHostPort(tc.host, "4222"), tc.auth, tc.insecure, &out, logger)
		if (err != nil) != tc.wantErr || bytes.Contains(out.Bytes(), []byte("INSECURE")) != tc.wantWarn {
			t.Errorf("host %q auth %v insecure %v: err %v, output %q", tc.host, tc.auth, tc.insecure, err, out.String())
		}
	}
}
