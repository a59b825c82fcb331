package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/internal/auth"
	"github.com/turnstone-dev/turnstone/internal/cli"
	"github.com/turnstone-dev/turnstone/internal/embedded"
	"github.com/turnstone-dev/turnstone/internal/engine"
	"github.com/turnstone-dev/turnstone/internal/otel"
	"github.com/turnstone-dev/turnstone/internal/presence"
	"github.com/turnstone-dev/turnstone/internal/reconciler"
	"github.com/turnstone-dev/turnstone/internal/telemetry"
	"github.com/turnstone-dev/turnstone/recovery"
)

type serveFlags struct {
	name          string
	updateStreams bool
	useExisting   bool
	policy        string
	telemetry     string
	ui            string
	incidentsTick time.Duration
	data          string
	listen        string
	partitions    int
	replicas      int
	snapshotEvery int
	sync          string
	syncSet       bool
	dataSet       bool
	auth          string
	insecure      bool
	// tenants are the auth spec's tenants, pinged by the presence tracker
	// (under auth a $SRV.PING does not reach the tenants' accounts).
	tenants []string
	// otel is the OpenTelemetry export the environment asks for
	// (OTEL_EXPORTER_OTLP_*; docs/otel.md).
	otel otel.ExportConfig
}

func newServeCommand(g *globals) *cobra.Command {
	var f serveFlags
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the engine (on an embedded NATS server unless --nats-url is given)",
		Long: `Run the engine until interrupted.

Without --nats-url (or TURNSTONE_NATS_URL) the engine starts an embedded NATS
server with JetStream that keeps its data in --data and listens on --listen,
so other processes (workers, this CLI, services publishing events) can
connect. With --nats-url it uses that server or cluster instead.

On the embedded server, which it owns, the engine first runs engine setup
(creating whatever is missing, changing nothing that exists), so a first
run needs nothing else. With --nats-url it creates and changes nothing:
engine setup is the one writer of the streams', consumers' and buckets'
settings, run once by an operator; --partitions and --replicas are then
checked against the existing streams, and a difference is refused. The
engine follows the event log, keeps each session's projection, and writes
a snapshot of a session every --snapshot-every events.

With --auth FILE (a YAML list of tenants; docs/security.md) the embedded
server runs NATS's own accounts, users and permissions: the engine writes
an nkey seed per user (operator, engine, worker, one per tenant) into the
credentials directory (the spec's credentials:, else DATA/credentials
when --data is given, else $XDG_STATE_HOME/turnstone/credentials: never
the working tree), and each tenant's service connects with
--nkey <credentials>/<tenant>.nk. --tls-cert and --tls-key serve the client
port over TLS, --tls-ca makes it mutual TLS. --listen, --ui-listen and
--telemetry-listen on an address other than loopback need --auth (or
--insecure, which lets anyone who reaches the port read every tenant's
sessions). Under --auth the web view answers only the operator's web token
(engine auth token).

With OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) set,
the engine exports what it folds to that OpenTelemetry backend as GenAI
spans (docs/otel.md): OTEL_EXPORTER_OTLP_HEADERS, _PROTOCOL (http/protobuf
or grpc), OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES and the OTEL_BSP_*
variables apply; OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true
adds the messages' masked text.`,
		Example: cli.Examples(
			"the engine on its embedded NATS server, with the web view on http://127.0.0.1:9465/ui/",
			"engine serve --ui-listen 127.0.0.1:9465",
			"a second engine sharing the partitions of the first one's server",
			"engine serve --nats-url nats://127.0.0.1:4222 --name engine-2 --telemetry-listen 127.0.0.1:9466"),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			external := g.conn.URLGiven(cmd.Flags())
			f.syncSet = cmd.Flags().Changed("sync")
			f.dataSet = cmd.Flags().Changed("data") || os.Getenv("TURNSTONE_DATA") != ""
			return runServe(cmd.Context(), g, f, external)
		},
	}
	data := os.Getenv("TURNSTONE_DATA")
	if data == "" {
		data = "turnstone-data"
	}
	cmd.Flags().StringVar(&f.policy, "policy", "", "reconciler policy file (YAML; docs/policy.md); default: the built-in defaults")
	cmd.Flags().StringVar(&f.telemetry, "telemetry-listen", cli.TelemetryDefault("127.0.0.1:9464"), "address of /metrics and /healthz (empty: off; env "+cli.EnvTelemetryListen+")")
	cmd.Flags().StringVar(&f.ui, "ui-listen", "", "address of the read-only web view, HOST:PORT, served under /ui/ (empty: off); bind it where only the people who may read every tenant's sessions reach it")
	cmd.Flags().DurationVar(&f.incidentsTick, "incidents-every", 30*time.Second, "how often the fleet's incidents are correlated for /metrics (incidents_open)")
	cmd.Flags().StringVar(&f.data, "data", data, "directory of the embedded server's JetStream store (env TURNSTONE_DATA)")
	listen := os.Getenv(cli.EnvListen)
	if listen == "" {
		listen = net.JoinHostPort(embedded.DefaultHost, strconv.Itoa(embedded.DefaultPort))
	}
	cmd.Flags().StringVar(&f.listen, "listen", listen, "client address of the embedded server, HOST:PORT (env "+cli.EnvListen+", which the clients connect to by default too)")
	cmd.Flags().IntVar(&f.replicas, "replicas", 0, "stream replicas of new streams (3 on a 3-node JetStream cluster); existing streams keep theirs unless --update-streams")
	cmd.Flags().BoolVar(&f.updateStreams, "update-streams", false, "embedded server: change existing streams whose settings differ from the flags given (without it such a difference is an error); with --nats-url only engine setup changes streams")
	cmd.Flags().BoolVar(&f.useExisting, "use-existing", false, "embedded server: do not run engine setup first (the streams, consumers and buckets must exist); always so with --nats-url")
	cmd.Flags().StringVar(&f.name, "name", "", "the engine's name in its group (default: host-pid-random)")
	cmd.Flags().IntVar(&f.partitions, "partitions", 0, "partitions of a new event stream (default 8; an existing stream keeps its count)")
	cmd.Flags().IntVar(&f.snapshotEvery, "snapshot-every", 100, "snapshot a session's projection every N events")
	cmd.Flags().StringVar(&f.auth, "auth", os.Getenv("TURNSTONE_AUTH"), "auth spec (YAML: tenants, credentials dir; docs/security.md): accounts, users and permissions on the embedded server, the credentials written beside the file; with --nats-url, the tenants the engine pings and its default --nkey (env TURNSTONE_AUTH)")
	cmd.Flags().BoolVar(&f.insecure, "insecure", false, "allow --listen on a non-loopback address without --auth: anyone who reaches the port can read and write every tenant's sessions")
	cmd.Flags().StringVar(&f.sync, "sync", "always", `embedded server: fsync every write before its ack ("always"), or every DURATION such as "2m" (faster; an OS crash can lose acknowledged events)`)
	return cmd
}

func runServe(ctx context.Context, g *globals, f serveFlags, external bool) error {
	logger, err := g.logger()
	if err != nil {
		return err
	}
	if f.snapshotEvery < 1 {
		return fmt.Errorf("--snapshot-every: must be at least 1, got %d", f.snapshotEvery)
	}
	if f.otel, err = otel.ConfigFromEnv(nil); err != nil {
		return err // names each variable
	}
	policy, err := reconciler.LoadPolicy(f.policy)
	if err != nil {
		return err // names the file and every bad key
	}
	var spec *auth.Spec
	if f.auth != "" {
		if spec, err = auth.LoadSpec(f.auth); err != nil {
			return err // names the file and every rule it breaks
		}
		if f.dataSet {
			spec.UseDataDir(f.data)
		}
		f.tenants = spec.Tenants
		// Retention erases with the engine's permissions, which the spec
		// grants only when asked (auth.RetentionGrants): refuse now rather
		// than fail every sweep.
		if policy.Retains() && !spec.Retention {
			return fmt.Errorf("--policy %s sets retention.max_age, but --auth %s does not give the engines the rights to erase: add `retention: true` to it (docs/security.md)", f.policy, f.auth)
		}
	}
	// A busy port is reported at once, naming the flag, before the
	// embedded server spends its start-up wait on it.
	for _, l := range []struct{ flag, addr string }{{"--ui-listen", f.ui}, {"--telemetry-listen", f.telemetry}} {
		if l.addr == "" {
			continue
		}
		if err := checkExposure(l.flag, l.addr, spec != nil, f.insecure, g.stderr, logger); err != nil {
			return err
		}
	}
	if !external {
		if err := checkExposure("--listen", f.listen, spec != nil, f.insecure, g.stderr, logger); err != nil {
			return err
		}
		if err := checkListen("--listen", f.listen, "HOST:PORT"); err != nil {
			return err
		}
	}
	if f.telemetry != "" {
		if err := checkListen("--telemetry-listen", f.telemetry, `HOST:PORT (or "" for none)`); err != nil {
			return err
		}
	}
	if f.ui != "" {
		if err := checkListen("--ui-listen", f.ui, `HOST:PORT (or "" for none)`); err != nil {
			return err
		}
	}
	var (
		nc  *nats.Conn
		srv *embedded.Server
	)
	if external {
		if f.syncSet {
			logger.Warn().Str("sync", f.sync).Msg("--sync applies to the embedded server only: with --nats-url, the server's own sync_interval decides (see the streams' effective durability below)")
		}
		client := g.conn.Client
		if spec != nil && !client.Authenticated() {
			client.Nkey = spec.SeedFile(string(auth.RoleEngine))
		}
		// engine setup is the one writer of the streams', consumers' and
		// buckets' settings: on a server this process does not own the
		// engine creates and changes nothing (under auth its role may
		// not either), and checks the settings its flags name.
		if f.updateStreams {
			return fmt.Errorf("--update-streams: with --nats-url the engine changes no stream; run engine setup --update-streams (with the settings to change) against %s", g.conn.URL)
		}
		f.useExisting = true
		opts, err := client.Options()
		if err != nil {
			return err
		}
		nc, err = nats.Connect(g.conn.URL, append(opts, nats.Name("turnstone-engine"), nats.MaxReconnects(-1))...)
		if err != nil {
			return fmt.Errorf("connect to %s: %w", g.conn.URL, cli.ExplainConnectError(err, client))
		}
		logger.Info().Str("url", g.conn.URL).Msg("using NATS server")
	} else {
		cfg, err := embeddedConfig(f)
		if err != nil {
			return err
		}
		cfg.TLS = embedded.TLSConfig{Cert: g.conn.Client.TLSCert, Key: g.conn.Client.TLSKey, CA: g.conn.Client.TLSCA}
		if spec != nil {
			if cfg.ConfigFile, err = writeAuth(spec, logger); err != nil {
				return err
			}
		}
		srv, err = embedded.Start(cfg, nil)
		if err != nil {
			return err
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := srv.Close(cctx); err != nil {
				logger.Error().Err(err).Msg("embedded server shutdown")
			}
		}()
		if spec != nil {
			// The operator sets the streams up, then the engine runs with
			// its own role, as it would on an external server.
			if err := setupAsOperator(ctx, srv, spec, f, logger); err != nil {
				return err
			}
			f.useExisting = true
			if nc, err = srv.Connect(seedOption(spec, auth.RoleEngine), nats.Name("turnstone-engine")); err != nil {
				return err
			}
		} else if nc, err = srv.Connect(); err != nil {
			return err
		}
		logger.Info().Str("url", srv.ClientURL()).Str("data", f.data).Str("sync", f.sync).Msg("embedded NATS server with JetStream started")
	}
	defer nc.Close()
	metrics := telemetry.NewMetrics(telemetry.Namespace)
	health := telemetry.NewHealth()
	health.Register("nats", func(context.Context) error {
		if !nc.IsConnected() {
			return fmt.Errorf("nats connection %s", nc.Status())
		}
		return nil
	})
	health.Register("reconciler", metrics.FailClosedCheck())
	if f.telemetry != "" {
		ts := telemetry.NewServer(f.telemetry, metrics, health, &logger)
		if err := ts.Start(); err != nil {
			return listenError("--telemetry-listen", f.telemetry, `HOST:PORT (or "" for none)`, err)
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = ts.Close(cctx)
		}()
	}
	var mapIngest func(int) error
	if srv != nil {
		// Each append reaches only the engine owning its partition: on the
		// embedded server without accounts through its global account's
		// mapping (under auth the TURNSTONE account's carries it too).
		mapIngest = func(partitions int) error { return srv.AddMapping(ingest.IngestMapping(partitions)) }
	}
	eng, stop, err := startEngine(ctx, nc, f, policy, metrics, mapIngest, logger)
	if err != nil {
		if external && (errors.Is(err, events.ErrNoStream) || errors.Is(err, recovery.ErrNotSetUp) || errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrConsumerNotFound)) {
			return fmt.Errorf("%w: with --nats-url the engine creates nothing; run engine setup --nats-url %s first (docs/scaling.md)", err, g.conn.URL)
		}
		return err
	}
	defer stop()
	var tm *telemetry.Metrics
	if f.telemetry != "" {
		tm = metrics
	}
	if f.incidentsTick <= 0 {
		return fmt.Errorf("--incidents-every: must be positive, got %s", f.incidentsTick)
	}
	var webToken string
	if spec != nil && f.ui != "" {
		// Under auth the web view answers the operator only: the token
		// `engine auth token` prints (docs/security.md).
		created := false
		if webToken, created, err = auth.EnsureWebToken(spec, false); err != nil {
			return err
		}
		logger.Info().Str("token_file", spec.WebTokenFile()).Bool("new", created).
			Msg("the web view needs the operator's web token (engine auth token " + f.auth + ")")
	}
	stopForensics, err := startForensics(ctx, eng, f.ui, webToken, tm, f.incidentsTick, logger)
	if err != nil {
		return err
	}
	defer stopForensics()
	// Last: when this is logged, every listener (NATS, telemetry, the web
	// view) is up.
	announceReady(ctx, eng, logger)
	<-ctx.Done()
	logger.Info().Msg("engine stopping")
	return nil
}

// checkListen reports whether addr, the value of flag, can be listened on
// now: an address in use is an error that says so and names the flag to
// change (hint is the form of its value).
func checkListen(flag, addr, hint string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return listenError(flag, addr, hint, err)
	}
	return ln.Close()
}

// listenError is the error of a failed listen on addr, the value of flag.
func listenError(flag, addr, hint string, err error) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%s %s: address in use (another engine or server listens there); choose another with %s %s", flag, addr, flag, hint)
	}
	return fmt.Errorf("%s %s: %w", flag, addr, err)
}

func embeddedConfig(f serveFlags) (embedded.Config, error) {
	host, portStr, err := net.SplitHostPort(f.listen)
	if err != nil {
		return embedded.Config{}, fmt.Errorf("--listen %q: want HOST:PORT: %w", f.listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return embedded.Config{}, fmt.Errorf("--listen %q: port %q is not a number", f.listen, portStr)
	}
	cfg := embedded.Config{DataDir: f.data, Host: host, Port: port}
	switch f.sync {
	case "always":
		cfg.SyncAlways = true
	default:
		d, err := time.ParseDuration(f.sync)
		if err != nil || d <= 0 {
			return embedded.Config{}, fmt.Errorf(`--sync %q: want "always" or a positive duration such as "2m"`, f.sync)
		}
		cfg.SyncInterval = d
	}
	return cfg, nil
}

// startEngine runs an engine (package engine) on nc until the returned
// stop is called.
func startEngine(ctx context.Context, nc *nats.Conn, f serveFlags, policy *reconciler.Policy, m *telemetry.Metrics, mapIngest func(int) error, logger zerolog.Logger) (*engine.Engine, func(), error) {
	var oc *engine.OTelConfig
	if f.otel.Enabled {
		exp, err := otel.NewSpanExporter(ctx, f.otel)
		if err != nil {
			return nil, nil, err
		}
		res, err := otel.ResourceFromEnv(ctx)
		if err != nil {
			return nil, nil, err
		}
		oc = &engine.OTelConfig{Exporter: exp, Export: otel.ExporterConfig{Map: f.otel.Map, Batch: f.otel.Batch, Resource: res}}
		logger.Info().Str("endpoint", f.otel.Endpoint).Str("protocol", f.otel.Protocol).Bool("capture_content", f.otel.Map.CaptureContent).
			Msg("exporting to OpenTelemetry (GenAI spans; docs/otel.md)")
	}
	e, err := engine.Open(ctx, nc, engine.Config{
		OTel:          oc,
		Name:          f.name,
		Log:           events.Config{Partitions: f.partitions, Replicas: f.replicas, UpdateStreams: f.updateStreams},
		Policy:        policy,
		SnapshotEvery: f.snapshotEvery,
		Metrics:       m,
		UseExisting:   f.useExisting,
		Presence:      presence.Config{Tenants: f.tenants},
		MapIngest:     mapIngest,
	}, &logger)
	if err != nil {
		return nil, nil, err
	}
	return e, func() {
		cctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := e.Close(cctx); err != nil {
			logger.Warn().Err(err).Msg("engine close")
		}
	}, nil
}

// announceReady says "engine ready" once every partition has a live
// owner (this engine or another): right away, or, when some have none
// (a killed run's claims not yet expired, 5 s at most by default), first
// how many, whose, and then "ready" when they are taken.
func announceReady(ctx context.Context, eng *engine.Engine, logger zerolog.Logger) {
	ready := func(c engine.Coverage) {
		logger.Info().Str("name", eng.Name()).Ints("partitions", c.Owned).Int("of", c.Partitions).
			Msgf("engine ready: every partition has a live owner; this engine owns %d of %d; Ctrl-C to stop", len(c.Owned), c.Partitions)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	c, err := eng.WaitCovered(wctx)
	cancel()
	if err == nil && c.Covered() {
		ready(c)
		return
	}
	ev := logger.Warn().Str("name", eng.Name()).Ints("partitions", c.Owned).Ints("uncovered", c.Uncovered)
	for m, d := range c.Silent {
		ev = ev.Dur("silent_"+m, d)
	}
	ev.Msgf("engine up, not ready yet: it owns %d of %d partitions; %d have no live owner (claims of engines unheard for a while, taken over when they expire); publishers of their sessions retry meanwhile", len(c.Owned), c.Partitions, len(c.Uncovered))
	go func() {
		if c, err := eng.WaitCovered(ctx); err == nil && c.Covered() {
			ready(c)
		}
	}()
}
