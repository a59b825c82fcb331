package projections

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
)

// ReconcileIndex checks the fleet index of partition part against the log
// and sets it right: a session of the log with no row (a row that was
// never stored), or whose row is stale (it counts fewer or more events
// than the log holds of the session, or its status is not one of this
// version's words), gets its row rebuilt: from the state the projector
// holds (written within IndexEvery), or restored from the log (snapshot
// and tail) and written at once. A rebuilt row is written only if the row
// did not change since it was read (the KV revision), so a row the
// projector writes meanwhile, which is newer, is never overwritten (the
// partition is reconciled again, to check the row it found). The
// engine runs it when it takes a partition. It returns how many rows it
// rebuilt. Errors: JetStream's; jetstream.ErrBucketNotFound (wrapped)
// without an index. When it fails, or leaves a row it could not read
// back in full (a replica behind the stream), and the projector holds the
// partition, its index loop runs it again (at once, then every
// IndexEvery) until it succeeds or the partition is let go.
func (p *Projector) ReconcileIndex(ctx context.Context, part int) (n int, err error) {
	left := 0
	defer func() {
		if err == nil && left == 0 {
			return
		}
		p.mu.Lock()
		if ps, held := p.parts[part]; held && ps.lease.Err() == nil {
			p.suspectIndex(part)
		}
		p.mu.Unlock()
	}()
	js := p.log.JetStream()
	kv, err := js.KeyValue(ctx, IndexBucket)
	if err != nil {
		return 0, fmt.Errorf("reconcile index of partition %d: %w", part, err)
	}
	refs, err := p.log.PartitionSessions(ctx, part)
	if err != nil {
		return 0, fmt.Errorf("reconcile index of partition %d: %w", part, err)
	}
	rows, err := readIndexRows(ctx, js, part)
	if err != nil {
		return 0, fmt.Errorf("reconcile index of partition %d: %w", part, err)
	}
	gate := p.cfg.Gate
	for _, ref := range refs {
		if ctx.Err() != nil {
			return n, ctx.Err()
		}
		if !validIndexKey(ref.Tenant, ref.Session) {
			continue
		}
		key := IndexKey(part, ref.Tenant, ref.Session)
		row, ok := rows[key]
		if ok && row.sum.Status.Valid() && uint64(row.sum.Events) == ref.Events {
			continue
		}
		// A state held writes the row within IndexEvery once dirty. One
		// held in compressed form (idle: a finished session) is never
		// dirty, so it is made whole first; one that does not expand is
		// dropped, and restored below.
		p.mu.Lock()
		t, held := p.sessions[ref.Tenant+"/"+ref.Session]
		if held && p.expand(t) {
			t.dirty = true
		} else {
			held = false
		}
		p.mu.Unlock()
		if held {
			n++
			continue
		}
		since := gate.Epoch()
		if !gate.Enter(ref.Tenant, ref.Session, since) {
			continue // being erased
		}
		s, err := p.restoreAtLeast(ctx, ref)
		if errors.Is(err, errReadBehind) {
			// A replica answered from behind the listing: writing what it
			// gave would store a stale row that nothing writes again
			// until the session changes. The session's next event, or the
			// next reconcile, writes it.
			gate.Leave(ref.Tenant, ref.Session)
			left++
			p.l.Warn().Int("partition", part).Str("session", ref.Tenant+"/"+ref.Session).Uint64("events", ref.Events).
				Msg("fleet index: the log read back fewer events than the stream lists; row left for the next reconcile")
			continue
		}
		if err == nil {
			if s.Tenant == "" {
				s.Tenant, s.Session = ref.Tenant, ref.Session
			}
			var b []byte
			if b, err = encodeState(s.Summary(part)); err == nil {
				if ok {
					_, err = kv.Update(ctx, key, b, row.rev)
				} else {
					_, err = kv.Create(ctx, key, b)
				}
			}
		}
		gate.Leave(ref.Tenant, ref.Session)
		var apiErr *jetstream.APIError
		switch {
		case err == nil:
			n++
		case errors.Is(err, jetstream.ErrKeyExists), errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence:
			// Written meanwhile: by the projector (newer than this), or a
			// write the stream stored late (older). The next reconcile
			// reads it back and tells which.
			left++
		case errors.Is(err, events.ErrSessionNotFound):
			// Erased meanwhile.
		default:
			return n, fmt.Errorf("reconcile index of partition %d: %s/%s: %w", part, ref.Tenant, ref.Session, err)
		}
	}
	return n, nil
}

// errReadBehind: a session read back fewer events than the stream lists.
var errReadBehind = errors.New("the session read back fewer events than the stream lists")

// restoreAtLeast restores ref's session, reading again (up to five times,
// 200 ms apart) while it holds fewer events than ref counts: a direct get
// may be answered by a replica that has not yet stored the latest
// messages (JetStream ADR-31: direct gets on replicas may be stale, as
// after a node is lost under load); errReadBehind when it never caught up.
func (p *Projector) restoreAtLeast(ctx context.Context, ref events.SessionRef) (*Session, error) {
	var s *Session
	err := backoff.Retry(func() error {
		var err error
		if s, err = Restore(ctx, p.log, p.store, ref.Tenant, ref.Session); err != nil {
			return backoff.Permanent(err)
		}
		if uint64(s.Events) < ref.Events {
			return errReadBehind
		}
		return nil
	}, backoff.WithContext(backoff.WithMaxRetries(backoff.NewConstantBackOff(200*time.Millisecond), 4), ctx))
	if err != nil {
		return nil, err
	}
	return s, nil
}

// indexEntry is a row read back from the index with its KV revision.
type indexEntry struct {
	sum Summary
	rev uint64
}

// readIndexRows reads partition part's rows of the index, by key: every
// message of its subjects (the bucket keeps one per key; a key written
// again while it reads keeps its later value).
func readIndexRows(ctx context.Context, js jetstream.JetStream, part int) (map[string]indexEntry, error) {
	st, err := js.Stream(ctx, "KV_"+IndexBucket)
	if err != nil {
		return nil, err
	}
	prefix := "$KV." + IndexBucket + "."
	out := map[string]indexEntry{}
	err = events.ReadStream(ctx, st, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{fmt.Sprintf("%s%d.*.*", prefix, part)}, DeliverPolicy: jetstream.DeliverAllPolicy}, 4000,
		func(msg jetstream.Msg) error {
			key := msg.Subject()[len(prefix):]
			if op := msg.Headers().Get("KV-Operation"); op == "DEL" || op == "PURGE" {
				delete(out, key)
				return nil
			}
			var e indexEntry
			if meta, err := msg.Metadata(); err == nil {
				e.rev = meta.Sequence.Stream
			}
			if json.Unmarshal(msg.Data(), &e.sum) != nil {
				e.sum = Summary{} // unreadable: rebuilt
			}
			out[key] = e
			return nil
		})
	return out, err
}
