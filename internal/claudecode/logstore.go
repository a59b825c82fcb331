package claudecode

import (
	"context"
	"errors"

	"github.com/turnstone-dev/turnstone/events"
)

// LogStore returns the Store of the event log l, the one `engine import`
// uses: an *events.Log (Turnstone's own processes) or an ingest.Client
// (through the engine, any publisher). Append appends with l.Append (the acks are dropped; the errors
// are Append's). EventIDs reads the session back with l.ReadSession and
// returns the ids of its events (events without an id left out): an empty
// set and a nil error when the log holds no event of the session
// (events.ErrSessionNotFound), else ReadSession's errors.
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
