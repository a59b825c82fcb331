package otel

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// newProvider returns a TracerProvider that gives each span the ids the
// log derives (idGenerator), records every span (export is a copy of the
// log, not a sample), and hands the spans that end to proc. A nil res
// names the service "turnstone" and nothing else.
func newProvider(res *resource.Resource, proc sdktrace.SpanProcessor) *sdktrace.TracerProvider {
	if res == nil {
		res = resource.NewSchemaless(attribute.String("service.name", DefaultServiceName))
	}
	return sdktrace.NewTracerProvider(
		sdktrace.WithIDGenerator(idGenerator{}),
		sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithResource(res),
		sdktrace.WithSpanProcessor(proc),
	)
}

func newMapper(tp *sdktrace.TracerProvider, log projections.SessionReader, cfg MapConfig) *mapper {
	cfg.setDefaults()
	m := &mapper{cfg: cfg}
	if tp != nil {
		m.tracer = tp.Tracer(ScopeName, trace.WithSchemaURL(SchemaURL))
	}
	if log != nil {
		m.res = newResolver(log)
	}
	return m
}

// SessionRef names a session to export.
type SessionRef struct {
	Tenant, Session string
	// Events is how many events it holds, when known (for progress).
	Events uint64
}

// BackfillConfig configures Backfill.
type BackfillConfig struct {
	// Map is how sessions map to spans: the live export's, so that both
	// send the same spans.
	Map MapConfig
	// Resource describes the process in every span (ResourceFromEnv).
	Resource *resource.Resource
	// Batch is the export's batching (OTEL_BSP_*; see BatchFromEnv).
	Batch Batch
	// Since, when set, sends only the spans that ended at or after it (a
	// span running then is sent, with its children that ended after it);
	// every session is still folded from its first event.
	Since time.Time
	// RetryFor is how long an export that fails, or a session's replay
	// the log fails, is tried again before Backfill gives up. Default 1
	// minute.
	RetryFor time.Duration
	// Progress, when set, is called after each session with the counts
	// so far (one call at a time, from the goroutines that replay).
	Progress func(BackfillStats)
	// Workers is how many sessions are replayed at once. Default
	// DefaultBackfillWorkers.
	Workers int
}

// DefaultBackfillWorkers is BackfillConfig.Workers' default.
const DefaultBackfillWorkers = 4

// BackfillStats counts what Backfill did.
type BackfillStats struct {
	Sessions int
	Events   int
	Spans    int
}

// Backfill replays each session of log (projections.Replay: the one fold
// every replay takes) and sends the spans of its history to exp, in
// batches of Batch.MaxExportBatchSize, retrying a failed export for up to
// RetryFor. It sends the spans the live export sends for the same log,
// with the same ids, so a second backfill, or a backfill of what was
// exported live, sends identical spans. A session that does not exist is
// skipped.
//
// Errors: the log's (events.ErrLogUnavailable), an export that failed for
// RetryFor, ctx's; the stats say how far it got.
func Backfill(ctx context.Context, log projections.SessionReader, exp sdktrace.SpanExporter, sessions []SessionRef, cfg BackfillConfig) (BackfillStats, error) {
	cfg.Batch.setDefaults()
	if cfg.RetryFor <= 0 {
		cfg.RetryFor = time.Minute
	}
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultBackfillWorkers
	}
	var (
		mu       sync.Mutex // guards stats and waiting, and serialises the exports
		stats    BackfillStats
		waiting  []sdktrace.ReadOnlySpan
		firstErr error
	)
	// flush exports the spans waiting, in batches (all: down to the last
	// one); mu must be held.
	flush := func(all bool) error {
		for len(waiting) > 0 && (all || len(waiting) >= cfg.Batch.MaxExportBatchSize) {
			n := min(len(waiting), cfg.Batch.MaxExportBatchSize)
			if err := exportRetry(ctx, exp, waiting[:n], cfg.Batch.ExportTimeout, cfg.RetryFor); err != nil {
				return err
			}
			stats.Spans += n
			waiting = waiting[n:]
		}
		return nil
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		cancel()
	}
	// Sessions are replayed by Workers goroutines at once (each read is a
	// round trip to the server); each session on one goroutine, in order,
	// its spans kept until its replay ends: a replay the log fails (a read
	// that timed out) is run again, for up to RetryFor, and sends nothing
	// twice.
	next := make(chan SessionRef)
	var wg sync.WaitGroup
	for range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			col := &collector{}
			tp := newProvider(cfg.Resource, col)
			defer func() { _ = tp.Shutdown(context.Background()) }()
			m := newMapper(tp, log, cfg.Map)
			for ref := range next {
				n, err := replaySession(wctx, m, col, log, ref, cfg.RetryFor)
				if err != nil {
					fail(err)
					continue
				}
				spans := col.take()
				if !cfg.Since.IsZero() {
					kept := spans[:0]
					for _, s := range spans {
						if !s.EndTime().Before(cfg.Since) {
							kept = append(kept, s)
						}
					}
					spans = kept
				}
				mu.Lock()
				stats.Sessions++
				stats.Events += n
				waiting = append(waiting, spans...)
				err = flush(false)
				if err == nil && cfg.Progress != nil {
					cfg.Progress(stats)
				}
				mu.Unlock()
				if err != nil {
					fail(err)
				}
			}
		}()
	}
feed:
	for _, ref := range sessions {
		select {
		case next <- ref:
		case <-wctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if firstErr != nil {
		return stats, firstErr
	}
	if err := ctx.Err(); err != nil {
		return stats, err
	}
	if err := flush(true); err != nil {
		return stats, err
	}
	if cfg.Progress != nil {
		cfg.Progress(stats)
	}
	return stats, nil
}

// replaySession maps one session's replay into col, and returns how many
// events it replayed. A replay the log fails (events.ErrLogUnavailable:
// a read that timed out) is run again with back-off for up to retryFor,
// its spans so far dropped. A session that does not exist maps nothing.
func replaySession(ctx context.Context, m *mapper, col *collector, log projections.SessionReader, ref SessionRef, retryFor time.Duration) (int, error) {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 200 * time.Millisecond
	b.MaxElapsedTime = retryFor
	n := 0
	op := func() error {
		n = 0
		_ = col.take()
		sm := m.newSession(ref.Tenant, ref.Session)
		var mapErr error
		_, err := projections.Replay(ctx, log, ref.Tenant, ref.Session, projections.ReplayRange{}, func(st projections.Step) error {
			n++
			if err := sm.step(ctx, st); err != nil {
				mapErr = err
				return err
			}
			return nil
		})
		if mapErr != nil {
			err = mapErr
		}
		switch {
		case err == nil, errors.Is(err, events.ErrSessionNotFound):
			return nil
		case errors.Is(err, events.ErrLogUnavailable) && ctx.Err() == nil:
			return err
		}
		return backoff.Permanent(err)
	}
	if err := backoff.Retry(op, backoff.WithContext(b, ctx)); err != nil {
		_ = col.take()
		return 0, fmt.Errorf("export %s/%s: %w", ref.Tenant, ref.Session, err)
	}
	return n, nil
}

// exportRetry exports spans, trying again with exponential back-off
// while it fails, for up to retryFor (0: until ctx ends). Each try has
// timeout.
func exportRetry(ctx context.Context, exp sdktrace.SpanExporter, spans []sdktrace.ReadOnlySpan, timeout, retryFor time.Duration) error {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 200 * time.Millisecond
	b.MaxInterval = 10 * time.Second
	b.MaxElapsedTime = retryFor
	op := func() error {
		tctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		err := exp.ExportSpans(tctx, spans)
		if err != nil && ctx.Err() != nil {
			return backoff.Permanent(ctx.Err())
		}
		return err
	}
	if err := backoff.Retry(op, backoff.WithContext(b, ctx)); err != nil {
		return fmt.Errorf("export %d spans: %w", len(spans), err)
	}
	return nil
}
