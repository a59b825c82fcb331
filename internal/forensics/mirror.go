package forensics

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/turnstone-dev/turnstone/internal/correlate"
	"github.com/turnstone-dev/turnstone/projections"
)

// ErrMirrorClosed is returned by IndexMirror.Ready after Close.
var ErrMirrorClosed = errors.New("fleet index mirror closed")

// IndexMirror is an in-memory copy of the fleet index (one projections.Summary
// per session, KV bucket projections.IndexBucket), loaded once and kept
// fresh by a watch of the bucket: the engines write a session's summary
// within about a second of a change, and the copy follows within
// milliseconds of the write. Listing, filtering and paging the fleet reads
// the copy only: no session's state is restored, so a page of 100,000
// sessions costs a scan of 100,000 small structs.
//
// Incidents restores the anomalous sessions only, and caches their
// signals by the summary's LastSeq, so a fleet whose sessions do not
// change costs nothing after the first call.
//
// All methods are safe for concurrent use.
type IndexMirror struct {
	js    jetstream.JetStream
	log   projections.SessionReader
	store *projections.SnapshotStore
	l     zerolog.Logger

	w      jetstream.KeyWatcher
	cancel context.CancelFunc
	done   chan struct{}
	ready  chan struct{}

	mu       sync.RWMutex
	byRef    map[ref]*projections.Summary
	version  uint64 // bumped on every change
	order    []*projections.Summary
	orderVer uint64
	tenants  []string
	err      error

	sigMu   sync.Mutex
	signals map[ref]cachedSignals
}

type ref struct{ tenant, session string }

type cachedSignals struct {
	lastSeq uint64
	sigs    []correlate.Signal
	outs    []correlate.Outcome
}

// OpenIndexMirror starts mirroring the fleet index of js. log and store are what
// Incidents restores anomalous sessions from (store may be nil: replay
// from the first event). logger may be nil. The copy loads in the
// background; Ready waits for it. Close stops the watch. Errors:
// jetstream.ErrBucketNotFound (wrapped) when there is no index yet (an
// engine creates it); JetStream's.
func OpenIndexMirror(ctx context.Context, js jetstream.JetStream, log projections.SessionReader, store *projections.SnapshotStore, logger *zerolog.Logger) (*IndexMirror, error) {
	kv, err := js.KeyValue(ctx, projections.IndexBucket)
	if err != nil {
		return nil, fmt.Errorf("open the fleet index mirror: %w", err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	w, err := kv.WatchAll(wctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("open the fleet index mirror: %w", err)
	}
	f := &IndexMirror{js: js, log: log, store: store, l: zerolog.Nop(), w: w, cancel: cancel,
		done: make(chan struct{}), ready: make(chan struct{}), byRef: map[ref]*projections.Summary{}, signals: map[ref]cachedSignals{}}
	if logger != nil {
		f.l = logger.With().Str("component", "index-mirror").Logger()
	}
	go f.run()
	return f, nil
}

func (f *IndexMirror) run() {
	defer close(f.done)
	loaded := false
	for e := range f.w.Updates() {
		if e == nil { // the initial values are all in
			if !loaded {
				loaded = true
				close(f.ready)
				f.l.Debug().Int("sessions", f.Len()).Msg("fleet index mirror loaded")
			}
			continue
		}
		r, ok := refOfKey(e.Key())
		if !ok {
			continue
		}
		f.mu.Lock()
		if e.Operation() != jetstream.KeyValuePut {
			delete(f.byRef, r)
		} else {
			var s projections.Summary
			if json.Unmarshal(e.Value(), &s) == nil {
				f.byRef[r] = &s
			}
		}
		f.version++
		f.mu.Unlock()
	}
	f.mu.Lock()
	if f.err == nil {
		f.err = ErrMirrorClosed
	}
	f.mu.Unlock()
	if !loaded {
		close(f.ready)
	}
}

// refOfKey reads tenant and session from an index key
// <partition>.<tenant>.<session>.
func refOfKey(key string) (ref, bool) {
	parts := strings.Split(key, ".")
	if len(parts) != 3 {
		return ref{}, false
	}
	return ref{parts[1], parts[2]}, true
}

// Ready waits until the copy holds every summary the bucket held when the
// watch started, or ctx ends. It returns ErrMirrorClosed when the watch
// stopped before that.
func (f *IndexMirror) Ready(ctx context.Context) error {
	select {
	case <-f.ready:
		f.mu.RLock()
		defer f.mu.RUnlock()
		select {
		case <-f.done:
			if f.err != nil && len(f.byRef) == 0 {
				return f.err
			}
		default:
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("fleet index mirror: %w", ctx.Err())
	}
}

// Close stops the watch and waits for it. It does not wait for the
// watch's consumer to be deleted: ending the watch's context unsubscribes
// at once and leaves the delete to nats.go in the background (a delete
// whose consumer sat on a lost node waits out the request timeout, 5 s,
// and an ephemeral consumer without interest goes away by itself).
func (f *IndexMirror) Close() {
	f.cancel()
	<-f.done
}

// Len is how many sessions the copy holds.
func (f *IndexMirror) Len() int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return len(f.byRef)
}

// Get returns the summary of a session, if the index has one.
func (f *IndexMirror) Get(tenant, session string) (projections.Summary, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	s, ok := f.byRef[ref{tenant, session}]
	if !ok {
		return projections.Summary{}, false
	}
	return *s, true
}

// Query selects sessions of the fleet. Empty fields select everything.
type Query struct {
	// Tenant selects one tenant (exact).
	Tenant string
	// Status selects one projections status: paused, in_turn, broken or
	// idle.
	Status string
	// Runtime and Model select sessions whose runtime or model contains
	// them (case-insensitive).
	Runtime string
	Model   string
	// Session selects sessions whose token contains it.
	Session string
	// Since and Until select sessions whose last event time lies within.
	Since, Until time.Time
	// Anomalous selects sessions with an anomaly (Summary.Anomalous).
	Anomalous bool
	// Order is the page order: OrderTriage (the default) or OrderRecent.
	Order Order
	// Offset and Limit page the result (Limit 0: 50).
	Offset, Limit int
}

// Order is the order of a Query's result.
type Order string

// The orders of a Query.
const (
	// OrderTriage puts first the sessions that need attention
	// (Summary.NeedsAttention: broken, paused, an open orphan, a
	// recovery that failed or was parked), then those that had an
	// anomaly since fixed (Summary.Anomalous), then the others; each
	// group by last event time, latest first. The default.
	OrderTriage Order = "triage"
	// OrderRecent is by last event time alone, latest first.
	OrderRecent Order = "recent"
)

// Orders lists the orders, the default first.
var Orders = []Order{OrderTriage, OrderRecent}

// triageRank is a summary's group in OrderTriage.
func triageRank(s *projections.Summary) int {
	switch {
	case s.NeedsAttention():
		return 0
	case s.Anomalous:
		return 1
	}
	return 2
}

// Page is one page of a Query's result.
type Page struct {
	// Rows are the page's sessions, in the Query's Order.
	Rows []projections.Summary
	// Total is how many sessions matched; Fleet how many the index holds.
	Total int
	Fleet int
	// ByStatus counts the matches by status (before the status filter).
	ByStatus map[string]int
	// Tenants lists every tenant of the fleet, sorted.
	Tenants []string
	Offset  int
	Limit   int
}

// Query returns a page of the sessions q selects, in q.Order (see Order;
// within a group by last event time, latest first, then tenant and
// session). It reads the copy only.
func (f *IndexMirror) Query(q Query) Page {
	if q.Limit <= 0 {
		q.Limit = 50
	}
	q.Offset = max(q.Offset, 0)
	order, tenants, n := f.sorted()
	if q.Order != OrderRecent {
		// A stable partition of the time order: three passes, no sort.
		byRank := make([]*projections.Summary, 0, len(order))
		for rank := range 3 {
			for _, s := range order {
				if triageRank(s) == rank {
					byRank = append(byRank, s)
				}
			}
		}
		order = byRank
	}
	p := Page{Fleet: n, Tenants: tenants, Offset: q.Offset, Limit: q.Limit, ByStatus: map[string]int{}}
	runtime, model := strings.ToLower(q.Runtime), strings.ToLower(q.Model)
	now := time.Now()
	for _, s := range order {
		switch {
		case q.Tenant != "" && s.Tenant != q.Tenant,
			q.Session != "" && !strings.Contains(s.Session, q.Session),
			runtime != "" && !strings.Contains(strings.ToLower(s.Runtime), runtime),
			model != "" && !strings.Contains(strings.ToLower(s.Model), model),
			!q.Since.IsZero() && s.LastTime.Before(q.Since),
			!q.Until.IsZero() && s.LastTime.After(q.Until),
			q.Anomalous && !s.Anomalous:
			continue
		}
		// The status a reader sees now: an interrupted history session
		// is computed, not stored (projections.StatusInterrupted).
		st := s.StatusAt(now, projections.DefaultLiveHorizon)
		p.ByStatus[string(st)]++
		if q.Status != "" && string(st) != q.Status {
			continue
		}
		if p.Total >= q.Offset && len(p.Rows) < q.Limit {
			row := *s
			row.Status = st
			p.Rows = append(p.Rows, row)
		}
		p.Total++
	}
	return p
}

// sorted returns the summaries in page order, rebuilt when the copy
// changed since the last call, the tenants, and the count.
func (f *IndexMirror) sorted() ([]*projections.Summary, []string, int) {
	f.mu.RLock()
	if f.orderVer == f.version && f.order != nil {
		o, t, n := f.order, f.tenants, len(f.byRef)
		f.mu.RUnlock()
		return o, t, n
	}
	f.mu.RUnlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.orderVer != f.version || f.order == nil {
		order := make([]*projections.Summary, 0, len(f.byRef))
		seen := map[string]bool{}
		var tenants []string
		for _, s := range f.byRef {
			order = append(order, s)
			if !seen[s.Tenant] {
				seen[s.Tenant] = true
				tenants = append(tenants, s.Tenant)
			}
		}
		slices.SortFunc(order, func(a, b *projections.Summary) int {
			return cmp.Or(b.LastTime.Compare(a.LastTime), cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Session, b.Session))
		})
		slices.Sort(tenants)
		f.order, f.tenants, f.orderVer = order, tenants, f.version
	}
	return f.order, f.tenants, len(f.byRef)
}

// Related lists the sessions linked to one: its sidechains (ParentSession
// names it) and its forks (ForkedFrom names it), of the same tenant, in
// page order.
func (f *IndexMirror) Related(tenant, session string) []projections.Summary {
	order, _, _ := f.sorted()
	var out []projections.Summary
	now := time.Now()
	for _, s := range order {
		if s.Tenant == tenant && (s.ParentSession == session || s.ForkedFrom == session) && s.Session != session {
			row := *s
			row.Status = s.StatusAt(now, projections.DefaultLiveHorizon)
			out = append(out, row)
		}
	}
	return out
}

// Summaries returns every summary the copy holds, in page order.
func (f *IndexMirror) Summaries() []projections.Summary {
	order, _, _ := f.sorted()
	out := make([]projections.Summary, len(order))
	for i, s := range order {
		out[i] = *s
	}
	return out
}

// Incidents correlates the fleet's incidents (see package Incidents): it
// restores each anomalous session whose summary changed since the last
// call, and reuses the signals of the others.
func (f *IndexMirror) Incidents(ctx context.Context, cfg IncidentsConfig) ([]correlate.Incident, error) {
	if err := f.Ready(ctx); err != nil {
		return nil, err
	}
	cands := Candidates(f.Summaries(), cfg)
	f.sigMu.Lock()
	defer f.sigMu.Unlock()
	var stale []projections.Summary
	keep := make(map[ref]bool, len(cands))
	for _, s := range cands {
		r := ref{s.Tenant, s.Session}
		keep[r] = true
		if c, ok := f.signals[r]; !ok || c.lastSeq != s.LastSeq {
			stale = append(stale, s)
		}
	}
	fresh, err := collect(ctx, f.log, f.store, stale, cfg.Workers)
	if err != nil {
		return nil, err
	}
	for r, c := range fresh {
		f.signals[r] = c
	}
	var sigs []correlate.Signal
	var outs []correlate.Outcome
	for r, c := range f.signals {
		if !keep[r] {
			continue
		}
		sigs = append(sigs, c.sigs...)
		outs = append(outs, c.outs...)
	}
	// Forget the sessions the candidates no longer hold.
	for r := range f.signals {
		if !keep[r] {
			delete(f.signals, r)
		}
	}
	return correlate.Correlate(since(sigs, cfg.Since), outs, cfg.Correlate), nil
}
