package main

import (
	"context"
	"sort"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
)

// loadViews rebuilds every session of the log (of one tenant when tenant
// is set) from its last snapshot plus its tail and returns their Views,
// sorted by tenant and session, followed by one invalid View per subject
// of the stream that names no valid session (sorted by subject), so that
// no stored event is invisible to the readers.
func loadViews(ctx context.Context, log *events.Log, tenant string) ([]projections.View, error) {
	states, bad, err := restoreAll(ctx, log, tenant)
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

// restoreAll rebuilds every session of the log (of one tenant when tenant
// is set) from its last snapshot plus its tail, in the log's order, and
// returns the subjects that name no valid session beside them.
func restoreAll(ctx context.Context, log *events.Log, tenant string) ([]*projections.Session, []events.BadSubject, error) {
	refs, bad, err := log.SessionsChecked(ctx, tenant)
	if err != nil {
		return nil, nil, err
	}
	store, err := projections.NewSnapshotStore(log.JetStream(), projections.SnapshotConfig{})
	if err != nil {
		return nil, nil, err
	}
	out := make([]*projections.Session, 0, len(refs))
	for _, r := range refs {
		s, err := projections.Restore(ctx, log, store, r.Tenant, r.Session)
		if err != nil {
			return nil, nil, err
		}
		if s.Tenant == "" { // only invalid events: name it from the subject
			s.Tenant, s.Session = r.Tenant, r.Session
		}
		out = append(out, s)
	}
	return out, bad, nil
}
