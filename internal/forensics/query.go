package forensics

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/correlate"
	"github.com/turnstone-dev/turnstone/projections"
)

// The queries of `engine incidents`: the fleet's anomalous sessions and
// its correlated incidents, from the fleet index (projections.ReadIndex),
// restoring only the sessions it marks anomalous. A log without an index
// (older than the index, and no engine has run since) is read whole
// instead: RestoreAll.

// RestoreAll rebuilds every session of the log (of one tenant when tenant
// is set) from its last snapshot (store may be nil) plus its tail, in the
// log's order, and returns beside them the subjects that hold events but
// name no valid session. A session holding only invalid events is named
// from its subject.
func RestoreAll(ctx context.Context, log *events.Log, store *projections.SnapshotStore, tenant string) ([]*projections.Session, []events.BadSubject, error) {
	refs, bad, err := log.SessionsChecked(ctx, tenant)
	if err != nil {
		return nil, nil, fmt.Errorf("restore all: %w", err)
	}
	out := make([]*projections.Session, 0, len(refs))
	for _, r := range refs {
		s, err := projections.Restore(ctx, log, store, r.Tenant, r.Session)
		if err != nil {
			return nil, nil, fmt.Errorf("restore all: %w", err)
		}
		if s.Tenant == "" { // only invalid events: name it from the subject
			s.Tenant, s.Session = r.Tenant, r.Session
		}
		out = append(out, s)
	}
	return out, bad, nil
}

// AllViews is RestoreAll's sessions as Views, sorted by tenant then
// session, followed by one invalid View per subject that names no valid
// session (sorted by subject), so that no stored event is invisible.
func AllViews(ctx context.Context, log *events.Log, store *projections.SnapshotStore, tenant string) ([]projections.View, error) {
	states, bad, err := RestoreAll(ctx, log, store, tenant)
	if err != nil {
		return nil, err
	}
	out := make([]projections.View, 0, len(states)+len(bad))
	for _, s := range states {
		out = append(out, s.View())
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Tenant != out[j].Tenant {
			return out[i].Tenant < out[j].Tenant
		}
		return out[i].Session < out[j].Session
	})
	for _, b := range bad {
		out = append(out, projections.InvalidSubjectView(b.Subject, b.Tenant, b.Session, int(b.Events), b.Reason))
	}
	return out, nil
}

// AnomalousViews returns the Views of the sessions the fleet index marks
// anomalous (of one tenant when tenant is set), each restored from its
// snapshot and tail, and one invalid View per subject that names no valid
// session, in the index's order. Without an index it reads the whole log
// (AllViews); the caller keeps the anomalous ones (Recent).
func AnomalousViews(ctx context.Context, log *events.Log, store *projections.SnapshotStore, tenant string) ([]projections.View, error) {
	sums, err := projections.ReadIndex(ctx, log.JetStream(), projections.IndexFilter{Tenant: tenant})
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return AllViews(ctx, log, store, tenant)
	}
	if err != nil {
		return nil, fmt.Errorf("anomalous sessions: %w", err)
	}
	var out []projections.View
	for _, m := range sums {
		if !m.Anomalous {
			continue
		}
		if m.Status == projections.StatusInvalid {
			out = append(out, projections.InvalidSubjectView(m.Subject, m.Tenant, m.Session, m.Events, m.StatusDetail))
			continue
		}
		s, err := projections.Restore(ctx, log, store, m.Tenant, m.Session)
		if errors.Is(err, events.ErrSessionNotFound) {
			continue // erased since the index was read
		}
		if err != nil {
			return nil, fmt.Errorf("anomalous sessions: %w", err)
		}
		out = append(out, s.View())
	}
	return out, nil
}

// Recent keeps the anomalous views (View.Anomalous) with an event at or
// after cutoff (any when zero; an invalid subject has no time and is
// always kept), newest first.
func Recent(views []projections.View, cutoff time.Time) []projections.View {
	var out []projections.View
	for _, v := range views {
		if !v.Anomalous || (!cutoff.IsZero() && v.Status != projections.StatusInvalid && v.LastTime.Before(cutoff)) {
			continue
		}
		out = append(out, v)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].LastTime.After(out[j].LastTime) })
	return out
}

// FleetIncidents correlates the fleet's incidents (Incidents) from the
// fleet index; without an index it summarises every session of the log
// (RestoreAll) instead.
func FleetIncidents(ctx context.Context, log *events.Log, store *projections.SnapshotStore, cfg IncidentsConfig) ([]correlate.Incident, error) {
	sums, err := projections.ReadIndex(ctx, log.JetStream(), projections.IndexFilter{Tenant: cfg.Tenant})
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		states, _, err := RestoreAll(ctx, log, store, cfg.Tenant)
		if err != nil {
			return nil, err
		}
		sums = make([]projections.Summary, 0, len(states))
		for _, s := range states {
			sums = append(sums, s.Summary(0))
		}
	} else if err != nil {
		return nil, fmt.Errorf("fleet incidents: %w", err)
	}
	return Incidents(ctx, log, store, sums, cfg)
}
