package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/audit"
	"github.com/turnstone-dev/turnstone/internal/erasure"
	"github.com/turnstone-dev/turnstone/projections"
)

// RetentionReason is the reason retention erases are recorded with.
const RetentionReason = "retention"

// maxPerErase bounds the sessions one retention erase covers (one notice,
// one audit record).
const maxPerErase = 100

// retentionLoop sweeps every RetentionEvery until the engine closes.
func (e *Engine) retentionLoop() {
	defer e.wg.Done()
	tick := time.NewTicker(e.cfg.RetentionEvery)
	defer tick.Stop()
	for {
		select {
		case <-e.runCtx.Done():
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(e.runCtx, e.cfg.RetentionEvery*4)
		if n, err := e.SweepRetention(ctx); err != nil && e.runCtx.Err() == nil {
			e.l.Warn().Err(err).Int("erased", n).Msg("retention sweep incomplete; the next sweep tries again")
		} else if n > 0 {
			e.l.Info().Int("sessions", n).Msg("retention: sessions past their tenant's max age erased")
		}
		cancel()
	}
}

// SweepRetention erases the sessions of the partitions the engine owns
// whose latest event was stored longer ago than their tenant's
// retention.max_age (the policy), whole, through
// Erase with reason "retention" (at most 100 sessions per erase and audit
// record). It reads the fleet index and checks each candidate's latest
// event in the log before it erases it, so a session written since its
// summary is kept. It returns how many sessions it erased. The engine
// runs it every RetentionEvery; tests call it.
func (e *Engine) SweepRetention(ctx context.Context) (int, error) {
	policy := e.cfg.Policy
	if policy == nil || !policy.Retains() || e.member == nil {
		return 0, nil
	}
	owned := e.member.Owned()
	if len(owned) == 0 {
		return 0, nil
	}
	sums, err := projections.ReadIndex(ctx, e.js, projections.IndexFilter{Partitions: owned})
	if err != nil {
		return 0, fmt.Errorf("retention: %w", err)
	}
	now := time.Now()            // the log's clock is the servers' (store times)
	due := map[string][]string{} // tenant -> sessions
	for _, m := range sums {
		maxAge := time.Duration(policy.For(m.Tenant).Retention.MaxAge)
		if maxAge <= 0 || m.LastStored.IsZero() || now.Sub(m.LastStored) <= maxAge {
			continue
		}
		due[m.Tenant] = append(due[m.Tenant], m.Session)
	}
	if len(due) == 0 {
		return 0, nil
	}
	st, err := e.js.Stream(ctx, events.EventsStream)
	if err != nil {
		return 0, fmt.Errorf("retention: %w", err)
	}
	tenants := make([]string, 0, len(due))
	for t := range due {
		tenants = append(tenants, t)
	}
	sort.Strings(tenants)
	erased := 0
	var errs []error
	for _, tenant := range tenants {
		maxAge := time.Duration(policy.For(tenant).Retention.MaxAge)
		var sessions []string
		for _, s := range due[tenant] {
			last, err := st.GetLastMsgForSubject(ctx, e.Log.SessionSubject(tenant, s))
			switch {
			case errors.Is(err, jetstream.ErrMsgNotFound):
				// No events left (erased already): its index entry and
				// the rest still go.
			case err != nil:
				errs = append(errs, err)
				continue
			case now.Sub(last.Time) <= maxAge:
				continue // written since its summary
			}
			sessions = append(sessions, s)
		}
		sort.Strings(sessions)
		for chunk := range slices.Chunk(sessions, maxPerErase) {
			rec, err := Erase(ctx, e.nc, EraseRequest{
				Scope:  erasure.Scope{Tenant: tenant, Sessions: chunk},
				Reason: fmt.Sprintf("%s: no event stored for more than %s (policy retention.max_age)", RetentionReason, maxAge),
				Who:    "engine " + e.Name() + " (" + audit.Who(e.nc) + ")",
				Action: audit.ActionRetention,
			})
			if err != nil {
				errs = append(errs, err)
				continue
			}
			erased += len(chunk)
			e.l.Info().Str("tenant", tenant).Strs("sessions", chunk).Uint64("events", rec.Counts.Events).Msg("retention: sessions erased")
		}
	}
	return erased, errors.Join(errs...)
}
