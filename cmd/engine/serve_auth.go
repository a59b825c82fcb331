package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/auth"
	"github.com/turnstone-dev/turnstone/internal/embedded"
	"github.com/turnstone-dev/turnstone/internal/engine"
)

// errExposed is the refusal of an embedded server listening beyond
// loopback with no authentication.
var errExposed = fmt.Errorf("refusing to serve without auth beyond loopback")

// exposures say, for each listener, what anyone who reaches it can do
// without auth: the refusal's and the warning's words.
var exposures = map[string]string{
	"--listen":           "read and write every tenant's sessions, forge events, issue recovery commands and delete the streams",
	"--ui-listen":        "read every tenant's sessions, prompts and tool output in the web view",
	"--telemetry-listen": "read the engine's metrics and health",
}

// checkExposure refuses a listener (flag, one of exposures' keys) on a
// non-loopback address without auth (anyone who reaches the port could
// do what exposures says), unless insecure, which it announces loudly on
// stderr and in the log. The same rule holds for every listener.
func checkExposure(flag, listen string, authOn, insecure bool, stderr io.Writer, logger zerolog.Logger) error {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("%s %q: want HOST:PORT: %w", flag, listen, err)
	}
	if authOn || isLoopback(host) {
		return nil
	}
	what := exposures[flag]
	if !insecure {
		return fmt.Errorf("%w: %s %s is reachable from other machines and --auth is not set, so anyone who reaches it could %s; give --auth FILE (docs/security.md), listen on 127.0.0.1, or pass --insecure to serve without auth anyway", errExposed, flag, listen, what)
	}
	fmt.Fprintf(stderr, "\n!!! INSECURE: %s %s listens WITHOUT AUTHENTICATION.\n!!! Anyone who reaches this port can %s. Use --auth FILE.\n\n", flag, listen, what)
	logger.Warn().Str("flag", flag).Str("listen", listen).Msg("INSECURE: serving without auth beyond loopback (--insecure)")
	return nil
}

// isLoopback reports whether host (an IP or a name) is only reachable
// from this machine: localhost or a loopback IP. "" and 0.0.0.0 (every
// interface) are not.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// writeAuth makes sure every user of spec has its seed, writes the
// server configuration beside them and returns its path. It logs where
// each user's credentials are, and which were created now.
func writeAuth(spec *auth.Spec, logger zerolog.Logger) (string, error) {
	keys, created, err := auth.EnsureKeys(spec)
	if err != nil {
		return "", err
	}
	conf, err := auth.WriteServerConfig(spec, keys)
	if err != nil {
		return "", err
	}
	logger.Info().Str("config", conf).Strs("tenants", spec.Tenants).Strs("new_credentials", created).
		Msg("auth on: nkey users with per-role permissions (docs/security.md)")
	for _, u := range spec.AllUsers() {
		rel := spec.SeedFile(u.Name)
		if r, err := filepath.Rel(".", rel); err == nil && !strings.HasPrefix(r, "..") {
			rel = r
		}
		logger.Info().Str("user", u.Name).Str("role", string(u.Role)).Str("tenant", u.Tenant).Str("connect_with", "--nkey "+rel).Msg("credentials")
	}
	return conf, nil
}

// seedOption is the connect option of the spec's user named as role.
func seedOption(spec *auth.Spec, role auth.Role) nats.Option {
	return func(o *nats.Options) error {
		opt, err := nats.NkeyOptionFromSeed(spec.SeedFile(string(role)))
		if err != nil {
			return err
		}
		return opt(o)
	}
}

// setupAsOperator creates or checks the streams, consumers and buckets
// on the embedded server as the operator, as `engine setup --nkey
// credentials/operator.nk` does on an external one.
func setupAsOperator(ctx context.Context, srv *embedded.Server, spec *auth.Spec, f serveFlags, logger zerolog.Logger) error {
	nc, err := srv.Connect(seedOption(spec, auth.RoleOperator), nats.Name("turnstone-operator"))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstreamOf(nc)
	if err != nil {
		return err
	}
	if f.partitions != 0 && f.partitions != spec.Partitions {
		return fmt.Errorf("--partitions %d: with --auth the partition count is the spec's (partitions: %d in %s), which the permissions name", f.partitions, spec.Partitions, f.auth)
	}
	log, err := engine.Setup(ctx, js, engine.SetupConfig{Log: events.Config{Partitions: spec.Partitions, Replicas: f.replicas, UpdateStreams: f.updateStreams}}, &logger)
	if err != nil {
		return fmt.Errorf("set up as operator: %w", err)
	}
	if log.Partitions() != spec.Partitions {
		return fmt.Errorf("auth spec %s: partitions %d, but the event stream has %d: set partitions: %d in the spec", f.auth, spec.Partitions, log.Partitions(), log.Partitions())
	}
	return nil
}
