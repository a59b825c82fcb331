package importer

import (
	"context"
	"errors"
	"fmt"

	"github.com/turnstone-dev/turnstone/events"
)

// Store is where Import and the Follower append events: the event log
// (LogStore), or anything that stores events per session and can tell
// which it holds.
type Store interface {
	// Append stores evs, all valid, in order. They may belong to several
	// sessions of one tenant. A failed call may have stored a prefix of
	// evs; the caller re-reads the session's ids before it tries again.
	Append(ctx context.Context, evs []events.Event) error
	// EventIDs returns the ids of the events already stored for the
	// session: an empty set and a nil error when it has none.
	EventIDs(ctx context.Context, tenant, session string) (map[string]struct{}, error)
}

// LogStore returns the Store of the event log l, the one `engine import`
// uses: an *events.Log (Turnstone's own processes) or an ingest.Client
// (through the engine, any publisher). Append appends with l.Append (the
// acks are dropped; the errors are Append's). EventIDs reads the session
// back with l.ReadSession and returns the ids of its events (events
// without an id left out): an empty set and a nil error when the log holds
// no event of the session (events.ErrSessionNotFound), else ReadSession's
// errors.
func LogStore(l events.SessionLog) Store { return logStore{l} }

// logStore is LogStore's Store.
type logStore struct{ log events.SessionLog }

func (s logStore) Append(ctx context.Context, evs []events.Event) error {
	_, err := s.log.Append(ctx, evs)
	return err
}

func (s logStore) EventIDs(ctx context.Context, tenant, session string) (map[string]struct{}, error) {
	ids := map[string]struct{}{}
	err := s.log.ReadSession(ctx, tenant, session, events.ReadOptions{}, func(ev events.Event) error {
		if ev.ID != "" {
			ids[ev.ID] = struct{}{}
		}
		return nil
	})
	if errors.Is(err, events.ErrSessionNotFound) {
		return ids, nil
	}
	return ids, err
}

// storedIDs keeps, per tenant/session, the ids a Store holds: read once,
// then kept up to date with what is appended through it.
type storedIDs struct {
	store Store
	ids   map[string]map[string]struct{}
}

func newStoredIDs(store Store) *storedIDs {
	return &storedIDs{store: store, ids: map[string]map[string]struct{}{}}
}

// get returns the ids stored for a session, reading them on first use.
func (c *storedIDs) get(ctx context.Context, tenant, session string) (map[string]struct{}, error) {
	key := tenant + "/" + session
	if have, ok := c.ids[key]; ok {
		return have, nil
	}
	ids, err := c.store.EventIDs(ctx, tenant, session)
	if err != nil {
		return nil, err
	}
	if ids == nil {
		ids = map[string]struct{}{}
	}
	c.ids[key] = ids
	return ids, nil
}

// forget drops what is known of a session: a failed append may have
// stored a prefix, so its ids are read again.
func (c *storedIDs) forget(tenant, session string) { delete(c.ids, tenant+"/"+session) }

// lookup is the StoredIDs of a conversion under ctx.
func (c *storedIDs) lookup(ctx context.Context) StoredIDs {
	return func(tenant, session string) (map[string]struct{}, error) {
		ids, err := c.get(ctx, tenant, session)
		if err != nil {
			return nil, err
		}
		return ids, nil
	}
}

// appendNew appends the events of s that the store does not hold, in
// order, in chunks of ImportChunk, calling step (may be nil) after the
// stored ones are counted and after each chunk; it returns how many it
// appended.
func (c *storedIDs) appendNew(ctx context.Context, s *Session, step func(appended, existing int)) (int, error) {
	have, err := c.get(ctx, s.Tenant, s.Session)
	if err != nil {
		return 0, fmt.Errorf("read stored ids of %s/%s: %w", s.Tenant, s.Session, err)
	}
	missing := make([]events.Event, 0, len(s.Events))
	for _, ev := range s.Events {
		if _, ok := have[ev.ID]; !ok {
			missing = append(missing, ev)
		}
	}
	if step != nil {
		step(0, len(s.Events)-len(missing))
	}
	appended := 0
	for len(missing) > 0 {
		if err := ctx.Err(); err != nil {
			return appended, fmt.Errorf("append events of %s/%s: %w", s.Tenant, s.Session, err)
		}
		n := min(ImportChunk, len(missing))
		if err := c.store.Append(ctx, missing[:n]); err != nil {
			c.forget(s.Tenant, s.Session)
			return appended, fmt.Errorf("append events of %s/%s: %w", s.Tenant, s.Session, err)
		}
		for _, ev := range missing[:n] {
			have[ev.ID] = struct{}{}
		}
		appended += n
		if step != nil {
			step(n, 0)
		}
		missing = missing[n:]
	}
	return appended, nil
}
