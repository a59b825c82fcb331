package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/turnstone-dev/turnstone/internal/engine"
	"github.com/turnstone-dev/turnstone/internal/forensics"
	"github.com/turnstone-dev/turnstone/internal/telemetry"
	"github.com/turnstone-dev/turnstone/internal/web"
)

// startForensics starts what serve adds for people: the in-memory fleet
// index (when the web view or the metrics need it), the web view on
// uiAddr (empty: off; with token, answering only requests that carry
// it), and the loop that counts open incidents in m (nil:
// off) every `every`. The returned stop ends them.
func startForensics(ctx context.Context, eng *engine.Engine, uiAddr, token string, m *telemetry.Metrics, every time.Duration, logger zerolog.Logger) (func(), error) {
	if uiAddr == "" && m == nil {
		return func() {}, nil
	}
	fleet, err := forensics.OpenIndexMirror(ctx, eng.Log.JetStream(), eng.Log, eng.Store, &logger)
	if err != nil {
		return nil, err
	}
	var srv *web.Server
	if uiAddr != "" {
		srv, err = web.New(web.Config{Addr: uiAddr, Log: eng.Log, Store: eng.Store, Index: fleet, Token: token}, &logger)
		if err == nil {
			err = srv.Start()
		}
		if err != nil {
			fleet.Close()
			return nil, fmt.Errorf("--ui-listen %s: %w", uiAddr, err)
		}
		logger.Info().Str("addr", srv.Addr()).Str("url", "http://"+srv.Addr()+web.Prefix).Msg("serving the web view")
	}
	lctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	if m != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			countIncidents(lctx, fleet, m, every, logger)
		}()
	}
	return func() {
		cancel()
		wg.Wait()
		if srv != nil {
			cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = srv.Close(cctx)
			ccancel()
		}
		fleet.Close()
	}, nil
}

// countIncidents sets incidents_open every `every` until ctx ends.
func countIncidents(ctx context.Context, fleet *forensics.IndexMirror, m *telemetry.Metrics, every time.Duration, logger zerolog.Logger) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, max(every, 30*time.Second))
		incs, err := fleet.Incidents(cctx, forensics.IncidentsConfig{})
		cancel()
		if err == nil {
			m.SetOpenIncidents(forensics.OpenByClass(incs))
		} else if ctx.Err() == nil {
			logger.Warn().Err(err).Msg("incidents for /metrics")
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
