package main

import (
	"context"
	"fmt"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/internal/ingestserver"
)

// ingestFigure is the append figure through the path publishers Turnstone
// does not trust use: ingest.Client sends each event as a request to
// agent.evt.<tenant>.<session>; the engine's ingest server (the part of
// the engine that answers them, owning every partition, as a lone engine)
// decodes, validates, masks and appends it to its stored subject, and
// replies once JetStream acknowledged it. The baseline is raw JetStream
// async publish of the same bytes to the stored subjects, in the same run,
// on the same server: once with JetStream's default sync, once with fsync
// before every ack. Client, ingest server and JetStream server share this
// process (each on its own TCP connection), as the raw side's client and
// server do.
func (r *runner) ingestFigure(ctx context.Context) error {
	for _, always := range []bool{false, true} {
		srv, err := startServer(always)
		if err != nil {
			return err
		}
		n, prefix, durability := r.sizes.AppendEvents, "i", "default sync"
		if always {
			n, prefix, durability = r.sizes.SyncEvents, "is", "fsync before every ack"
		}
		var stop func()
		res, err := r.appendPairVia(ctx, srv.url, n, prefix, func(l *events.Log) (appender, error) {
			cl, closeAll, err := startIngest(ctx, srv.url, l)
			stop = closeAll
			return cl, err
		})
		if stop != nil {
			stop()
		}
		srv.close()
		if err != nil {
			return err
		}
		row := res.row("ingest", fmt.Sprintf("events appended/s through ingest.Client -> engine -> JetStream (%s), 500-byte events (mean %.0f B) over %s sessions, %s",
			durability, res.meanBytes, commas(int64(r.sizes.AppendSessions)), res.window), 0.8)
		row.Baseline += " of the same bytes, " + durability
		r.add(row)
	}
	return nil
}

// startIngest starts an ingest server owning every partition on its own
// connection (the engine's), and a client on another (the publisher's).
func startIngest(ctx context.Context, url string, l *events.Log) (*ingest.Client, func(), error) {
	ec, err := connect(url, "bench-engine")
	if err != nil {
		return nil, nil, err
	}
	s, err := ingestserver.NewServer(ec.nc, l, ingestserver.Config{}, nil)
	if err != nil {
		ec.nc.Close()
		return nil, nil, err
	}
	if err := s.Open(ctx); err != nil {
		ec.nc.Close()
		return nil, nil, err
	}
	pc, err := connect(url, "bench-publisher")
	if err != nil {
		ec.nc.Close()
		return nil, nil, err
	}
	cl, err := ingest.NewClient(pc.nc, ingest.ClientConfig{})
	stop := func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Close(cctx)
		pc.nc.Close()
		ec.nc.Close()
	}
	if err != nil {
		stop()
		return nil, nil, err
	}
	return cl, stop, nil
}
