package worker

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/cli"
	"github.com/turnstone-dev/turnstone/internal/telemetry"
	"github.com/turnstone-dev/turnstone/recovery"
)

// ServeConfig is what Serve needs beyond the worker's own Config.
type ServeConfig struct {
	// Worker configures the worker; Serve sets its OnCommand and OnLease
	// to feed the metrics (a hook given here is called too).
	Worker Config
	// Connection is how to reach NATS: URL, credentials, TLS
	// (cli.Connection, resolved from flags, environment and context).
	Connection cli.Connection
	// Telemetry is the address of /metrics and /healthz, such as
	// 127.0.0.1:9465; "" serves neither.
	Telemetry string
	// OpenFor bounds how long Serve tries to open the worker again when it
	// cannot (a consumer without a leader, right after a node is lost;
	// consumers not created yet, right after engine serve starts).
	// Default 2 minutes.
	OpenFor time.Duration
}

// Serve runs one worker process's life (cmd/worker): it connects to NATS
// and opens the event log, waiting with back-off for the server and the
// streams until ctx ends; serves telemetry when asked; opens the worker,
// trying again with back-off for up to cfg.OpenFor; and runs it until ctx
// ends, then closes it (30 s at most). Errors: a *recovery.SettingsError
// (the consumers' settings differ from cfg.Worker.Delivery; nothing is
// changed) or events.ErrSettingsDiffer, at once; the last error of the
// open when OpenFor ran out; a telemetry address that cannot be listened
// on; an invalid cfg.Worker.
func Serve(ctx context.Context, cfg ServeConfig, logger zerolog.Logger) error {
	if err := cfg.Worker.Validate(); err != nil {
		return err
	}
	if cfg.OpenFor <= 0 {
		cfg.OpenFor = 2 * time.Minute
	}
	opts, err := cfg.Connection.Options("turnstone-worker")
	if err != nil {
		return err
	}
	nc, log, err := connect(ctx, cfg.Connection, opts, logger)
	if err != nil {
		return err
	}
	defer nc.Close()
	metrics := telemetry.NewMetrics(telemetry.Namespace)
	if cfg.Telemetry != "" {
		stop, err := serveTelemetry(cfg.Telemetry, nc, metrics, logger)
		if err != nil {
			return err
		}
		defer stop()
	}
	wcfg := cfg.Worker
	onCommand, onLease := wcfg.OnCommand, wcfg.OnLease
	wcfg.OnCommand = func(kind string, result string, d time.Duration) {
		metrics.WorkerCommand(kind, result, d)
		if onCommand != nil {
			onCommand(kind, result, d)
		}
	}
	wcfg.OnLease = func(p int, token uint64, held bool) {
		if held {
			metrics.SetPartitionLease(recovery.WorkerGroup, p, token)
		} else {
			metrics.EndPartitionLease(recovery.WorkerGroup, p, token)
		}
		if onLease != nil {
			onLease(p, token, held)
		}
	}
	// Open checks the recovery consumers' settings and joins the group.
	// Right after a nats-server node is lost, a consumer whose leader was
	// there answers nothing until it elects another (seconds), and right
	// after engine serve starts the consumers may not exist yet: a fresh
	// worker tries again, with back-off. Settings that differ are refused
	// at once.
	var w *Worker
	open := func() error {
		var err error
		if w, err = New(nc, log, wcfg, &logger); err != nil {
			return backoff.Permanent(err)
		}
		if err := w.Open(ctx); err != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = w.Close(cctx)
			cancel()
			if serr := (*recovery.SettingsError)(nil); errors.As(err, &serr) || errors.Is(err, events.ErrSettingsDiffer) {
				return backoff.Permanent(err)
			}
			return err
		}
		return nil
	}
	ob := backoff.NewExponentialBackOff()
	ob.MaxInterval = 5 * time.Second
	ob.MaxElapsedTime = cfg.OpenFor
	if err := backoff.RetryNotify(open, backoff.WithContext(ob, ctx), func(err error, next time.Duration) {
		logger.Warn().Err(err).Dur("retry_in", next).Msg("worker could not open; trying again")
	}); err != nil {
		return err
	}
	go func() {
		tick := time.NewTicker(5 * time.Second)
		defer tick.Stop()
		for {
			metrics.SetPartitions(recovery.WorkerGroup, len(w.Partitions()), w.Rebalances())
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	<-ctx.Done()
	logger.Info().Msg("worker stopping")
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.Close(cctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// serveTelemetry starts /metrics and /healthz (healthy while the NATS
// connection is up) at addr, and returns the function that stops them.
func serveTelemetry(addr string, nc *nats.Conn, metrics *telemetry.Metrics, logger zerolog.Logger) (func(), error) {
	health := telemetry.NewHealth()
	health.Register("nats", func(context.Context) error {
		if !nc.IsConnected() {
			return fmt.Errorf("nats connection %s", nc.Status())
		}
		return nil
	})
	ts := telemetry.NewServer(addr, metrics, health, &logger)
	if err := ts.Start(); err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("--telemetry-listen %s: address in use (another process listens there); choose another with --telemetry-listen HOST:PORT (or \"\" for none)", addr)
		}
		return nil, fmt.Errorf("--telemetry-listen %s: %w", addr, err)
	}
	return func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = ts.Close(cctx)
	}, nil
}

// connect connects to NATS and opens the event log (creating nothing),
// trying again with exponential back-off until it works or ctx ends, so
// that a worker started beside the engine (or before it, or before engine
// setup) waits for it instead of exiting.
func connect(ctx context.Context, conn cli.Connection, opts []nats.Option, logger zerolog.Logger) (*nats.Conn, *events.Log, error) {
	url := conn.URL
	var (
		nc  *nats.Conn
		log *events.Log
	)
	op := func() error {
		c, err := nats.Connect(url, append(opts, nats.MaxReconnects(-1))...)
		if err != nil {
			return cli.ExplainConnectError(err, conn.Client)
		}
		js, err := jetstream.New(c)
		if err == nil {
			log, err = events.Open(ctx, js, events.Config{UseExisting: true}, &logger)
		}
		if err != nil {
			c.Close()
			return err
		}
		nc = c
		return nil
	}
	b := backoff.NewExponentialBackOff()
	b.MaxInterval = 5 * time.Second
	b.MaxElapsedTime = 0 // until ctx ends
	err := backoff.RetryNotify(op, backoff.WithContext(b, ctx), func(err error, next time.Duration) {
		msg := "waiting for the engine's NATS server"
		if errors.Is(err, events.ErrNoStream) {
			msg = "waiting for the streams (engine setup, or engine serve on its embedded server, creates them)"
		}
		logger.Warn().Err(err).Str("url", url).Str("context", conn.Applied).Dur("retry_in", next).Msg(msg)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s: %w", url, err)
	}
	return nc, log, nil
}
