package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
)

// appendFigure is figure 1: events appended per second through Log.Append
// against raw JetStream async publish of the same bytes.
func (r *runner) appendFigure(ctx context.Context) error {
	srv, err := startServer(false)
	if err != nil {
		return err
	}
	defer srv.close()
	res, err := r.appendPair(ctx, srv.url, r.sizes.AppendEvents, "a")
	if err != nil {
		return err
	}
	r.add(res.row("append", fmt.Sprintf("events appended/s through Log.Append, 500-byte events (mean %.0f B) over %s sessions, %s",
		res.meanBytes, commas(int64(r.sizes.AppendSessions)), res.window), 0.9))
	return nil
}

// syncFigure is figure 7: figure 1 with fsync before every ack.
func (r *runner) syncFigure(ctx context.Context) error {
	srv, err := startServer(true)
	if err != nil {
		return err
	}
	defer srv.close()
	res, err := r.appendPair(ctx, srv.url, r.sizes.SyncEvents, "y")
	if err != nil {
		return err
	}
	r.add(res.row("sync", fmt.Sprintf("figure 1 with fsync before every ack (SyncAlways), %s events per run", commas(int64(res.n))), 0.9))
	return nil
}

// pairResult holds the runs of both sides of an append comparison.
type pairResult struct {
	turnstone, raw       []float64 // events/s per run
	turnstoneCPU, rawCPU []float64 // CPU µs per event per run (this process: client and server)
	n                    int
	meanBytes            float64
	window               string
}

func (p pairResult) row(bench, figure string, target float64) Row {
	t, raw := median(p.turnstone), median(p.raw)
	ratio := t / raw
	var pairs []float64 // each run's two sides ran back to back
	for i := range min(len(p.turnstone), len(p.raw)) {
		pairs = append(pairs, p.turnstone[i]/p.raw[i])
	}
	return Row{
		Bench:    bench,
		Figure:   figure,
		Value:    perSec(t),
		Baseline: perSec(raw) + " raw PublishMsgAsync",
		Ratio:    ratio,
		Target:   fmt.Sprintf(">= %.1f", target),
		Status:   status(ratio >= target),
		Metrics: map[string]float64{
			"turnstone_events_per_s": t, "raw_events_per_s": raw, "ratio": ratio,
			"events_per_run": float64(p.n), "mean_event_bytes": p.meanBytes,
			"turnstone_min": minf(p.turnstone), "turnstone_max": maxf(p.turnstone),
			"raw_min": minf(p.raw), "raw_max": maxf(p.raw),
			"pair_ratio_median": median(pairs), "pair_ratio_min": minf(pairs), "pair_ratio_max": maxf(pairs),
			"turnstone_cpu_us_per_event": median(p.turnstoneCPU), "raw_cpu_us_per_event": median(p.rawCPU),
		},
	}
}

// appendPair runs Log.Append and raw async publish of the same events, the
// same number of writers and events per call, Runs times each, alternating
// (after a warm-up of each), and returns the rates of every run. Each run
// appends fresh ids: the same ids would be dropped as duplicates.
func (r *runner) appendPair(ctx context.Context, url string, n int, prefix string) (pairResult, error) {
	return r.appendPairVia(ctx, url, n, prefix, nil)
}

// appendPairVia is appendPair with the Turnstone side appending through
// what via returns for the log (nil: the log itself).
func (r *runner) appendPairVia(ctx context.Context, url string, n int, prefix string, via func(*events.Log) (appender, error)) (pairResult, error) {
	tc, l, err := openLog(ctx, url, "bench-turnstone")
	if err != nil {
		return pairResult{}, err
	}
	defer tc.nc.Close()
	rc, err := connect(url, "bench-raw")
	if err != nil {
		return pairResult{}, err
	}
	defer rc.nc.Close()
	var app appender = l
	if via != nil {
		if app, err = via(l); err != nil {
			return pairResult{}, err
		}
	}

	sz := r.sizes
	template := spreadEvents(prefix, n, sz.AppendSessions)
	if via != nil {
		for i := range template {
			template[i].Source = "urn:service:bench" // a publisher's own, as the ingest requires
		}
	}
	res := pairResult{n: n, window: fmt.Sprintf("%d writers x %d events per call", sz.AppendWriters, sz.AppendBatch)}
	turnstone := func(evs []events.Event) (float64, error) {
		d, err := appendConcurrently(ctx, app, evs, sz.AppendBatch, sz.AppendWriters)
		return rate(len(evs), d), err
	}
	raw := func(evs []events.Event) (float64, time.Duration, error) {
		msgs, err := rawMessages(evs, l.Partitions()) // not timed: the same bytes as Log.Append's
		if err != nil {
			return 0, 0, err
		}
		res.meanBytes = meanSize(msgBodies(msgs))
		settle(sz.Settle)
		cpu := cpuTime()
		d, err := publishConcurrently(ctx, rc.js, msgs, sz.AppendBatch, sz.AppendWriters)
		return rate(len(evs), d), cpuTime() - cpu, err
	}
	if w := min(sz.AppendWarmup, n); w > 0 {
		if _, err := turnstone(freshCopy(template[:w])); err != nil {
			return res, fmt.Errorf("warm-up: %w", err)
		}
		if _, _, err := raw(freshCopy(template[:w])); err != nil {
			return res, fmt.Errorf("warm-up: %w", err)
		}
	}
	for run := 0; run < sz.Runs; run++ {
		sides := []string{"turnstone", "raw"} // T R, R T, T R, ...: drift cancels
		if run%2 == 1 {
			sides = []string{"raw", "turnstone"}
		}
		for _, side := range sides {
			evs := freshCopy(template)
			settle(sz.Settle)
			if side == "turnstone" {
				cpu := cpuTime()
				v, err := turnstone(evs)
				if err != nil {
					return res, err
				}
				us := float64(cpuTime()-cpu) / float64(time.Microsecond) / float64(len(evs))
				res.turnstone = append(res.turnstone, v)
				res.turnstoneCPU = append(res.turnstoneCPU, us)
				r.logf("   run %d turnstone %s, %.1f µs CPU per event", run+1, perSec(v), us)
			} else {
				v, cpu, err := raw(evs)
				if err != nil {
					return res, err
				}
				us := float64(cpu) / float64(time.Microsecond) / float64(len(evs))
				res.raw = append(res.raw, v)
				res.rawCPU = append(res.rawCPU, us)
				r.logf("   run %d raw       %s, %.1f µs CPU per event", run+1, perSec(v), us)
			}
		}
	}
	return res, nil
}

// settle collects garbage and pauses for d, so that neither the client's
// GC nor the server's work on the previous run (flushing blocks, the
// duplicate window's bookkeeping) falls into the next run.
func settle(d time.Duration) {
	runtime.GC()
	time.Sleep(d)
}

// cpuTime is the CPU time (user and system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// appender appends events: *events.Log, or ingest.Client.
type appender interface {
	Append(ctx context.Context, evs []events.Event, opts ...events.AppendOption) ([]events.Ack, error)
}

// appendConcurrently appends evs through l, batch events per call, from
// writers goroutines taking the next batch as they finish one, and returns
// the wall time.
func appendConcurrently(ctx context.Context, l appender, evs []events.Event, batch, writers int) (time.Duration, error) {
	chunks := (len(evs) + batch - 1) / batch
	var next atomic.Int64
	var dups atomic.Int64
	start := time.Now()
	err := parallel(writers, func(int) error {
		for {
			c := int(next.Add(1) - 1)
			if c >= chunks {
				return nil
			}
			acks, err := l.Append(ctx, evs[c*batch:min((c+1)*batch, len(evs))])
			if err != nil {
				return err
			}
			for _, a := range acks {
				if a.Duplicate {
					dups.Add(1)
				}
			}
		}
	})
	d := time.Since(start)
	if err == nil && dups.Load() > 0 {
		err = fmt.Errorf("%d events stored as duplicates", dups.Load())
	}
	return d, err
}

// rawMsg is what the raw baseline publishes: the encoded event, its
// subject and its id.
type rawMsg struct {
	subject, id string
	body        []byte
}

// rawMessages encodes evs as Log.Append would (validate, mask, encode),
// for their stored subjects in a log of partitions partitions.
func rawMessages(evs []events.Event, partitions int) ([]rawMsg, error) {
	bodies, err := encodeAll(evs)
	if err != nil {
		return nil, err
	}
	msgs := make([]rawMsg, len(evs))
	for i := range evs {
		p := events.Partition(evs[i].Tenant, evs[i].Session, partitions)
		msgs[i] = rawMsg{subject: events.StoredEventSubject(p, evs[i].Tenant, evs[i].Session), id: evs[i].ID, body: bodies[i]}
	}
	return msgs, nil
}

func msgBodies(msgs []rawMsg) [][]byte {
	b := make([][]byte, len(msgs))
	for i := range msgs {
		b[i] = msgs[i].body
	}
	return b
}

// publishConcurrently is the raw baseline of appendConcurrently: the same
// batches and writers, each batch published with PublishMsgAsync and a
// Nats-Msg-Id header, then every ack awaited.
func publishConcurrently(ctx context.Context, js jetstream.JetStream, msgs []rawMsg, batch, writers int) (time.Duration, error) {
	chunks := (len(msgs) + batch - 1) / batch
	var next atomic.Int64
	start := time.Now()
	err := parallel(writers, func(int) error {
		futures := make([]jetstream.PubAckFuture, 0, batch)
		for {
			c := int(next.Add(1) - 1)
			if c >= chunks {
				return nil
			}
			futures = futures[:0]
			for _, rm := range msgs[c*batch : min((c+1)*batch, len(msgs))] {
				m := nats.NewMsg(rm.subject)
				m.Data = rm.body
				m.Header.Set(jetstream.MsgIDHeader, rm.id)
				f, err := js.PublishMsgAsync(m)
				if err != nil {
					return err
				}
				futures = append(futures, f)
			}
			if err := awaitAcks(ctx, futures); err != nil {
				return err
			}
		}
	})
	return time.Since(start), err
}

func awaitAcks(ctx context.Context, futures []jetstream.PubAckFuture) error {
	for _, f := range futures {
		select {
		case pa := <-f.Ok():
			if pa.Duplicate {
				return errors.New("raw publish stored as a duplicate")
			}
		case err := <-f.Err():
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(30 * time.Second):
			return fmt.Errorf("raw publish: no ack: %w", errTimeout)
		}
	}
	return nil
}

// parallel runs fn(0..n-1) on n goroutines and returns the first error.
func parallel(n int, fn func(w int) error) error {
	var wg sync.WaitGroup
	errs := make([]error, n)
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[w] = fn(w)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func minf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	m := xs[0]
	for _, x := range xs {
		m = min(m, x)
	}
	return m
}

func maxf(xs []float64) float64 {
	m := 0.0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}
