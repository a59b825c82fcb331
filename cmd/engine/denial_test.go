package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/auth/authtest"
	"github.com/turnstone-dev/turnstone/internal/engine"
)

// TestCommandsSayPermissionDenied: a tenant's credentials running the
// operator's commands (erase, sessions, audit, rejects, members, inspect)
// get an error that says the permission was denied and names what, at
// once, not a timeout; the operator's run them.
func TestCommandsSayPermissionDenied(t *testing.T) {
	t.Parallel()
	srv := authtest.Start(t, []string{"acme"}, "")
	ctx := context.Background()
	js, _ := jetstream.New(srv.Connect(t, "operator"))
	if _, err := engine.Setup(ctx, js, engine.SetupConfig{Log: events.Config{}}, nil); err != nil {
		t.Fatal(err)
	}
	run := func(user string, args ...string) (string, error) {
		var stdout, stderr bytes.Buffer
		root := newRootCommand(&stdout, &stderr)
		root.SetArgs(append(args, "--nats-url", srv.ClientURL(), "--nkey", srv.Spec.SeedFile(user)))
		err := root.ExecuteContext(ctx)
		return stdout.String(), err
	}
	for _, args := range [][]string{
		{"erase", "acme/s1", "--reason", "try"},
		{"sessions"},
		{"audit"},
		{"rejects"},
		{"members"},
		{"inspect", "acme/s1"},
	} {
		start := time.Now()
		_, err := run("acme", args...)
		if err == nil || !strings.HasPrefix(err.Error(), "permission denied: ") || !errors.Is(err, nats.ErrPermissionViolation) {
			t.Errorf("engine %v as tenant acme: %v, want a permission denial", args, err)
			continue
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("engine %v as tenant acme: the denial took %s, a timeout's time", args, d)
		}
	}
	if _, err := run("operator", "sessions"); err != nil {
		t.Fatalf("engine sessions as the operator: %v", err)
	}
}
