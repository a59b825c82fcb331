package claudecode

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"sync"
	"testing"

	"github.com/turnstone-dev/turnstone/events"
)

// memStore is an in-memory Store: events per tenant/session, in append
// order. failAfter, when positive, makes Append fail once that many events
// are stored (a crash midway).
type memStore struct {
	mu        sync.Mutex
	sessions  map[string][]events.Event
	appends   int
	maxBatch  int
	failAfter int
}

var _ Store = (*memStore)(nil)

func newMemStore() *memStore { return &memStore{sessions: map[string][]events.Event{}} }

var errStoreDown = errors.New("store down")

func (m *memStore) Append(ctx context.Context, evs []events.Event) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	m.appends++
	m.maxBatch = max(m.maxBatch, len(evs))
	for i := range evs {
		if m.failAfter > 0 && m.total() >= m.failAfter {
			return fmt.Errorf("append event %d: %w", i, errStoreDown)
		}
		ev := evs[i]
		if err := events.Validate(&ev); err != nil {
			return err
		}
		k := ev.Tenant + "/" + ev.Session
		m.sessions[k] = append(m.sessions[k], ev)
	}
	return nil
}

func (m *memStore) EventIDs(ctx context.Context, tenant, session string) (map[string]struct{}, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ids := map[string]struct{}{}
	for _, ev := range m.sessions[tenant+"/"+session] {
		ids[ev.ID] = struct{}{}
	}
	return ids, nil
}

func (m *memStore) total() int {
	n := 0
	for _, evs := range m.sessions {
		n += len(evs)
	}
	return n
}

func (m *memStore) snapshot() map[string][]events.Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string][]events.Event{}
	for k, v := range m.sessions {
		out[k] = append([]events.Event(nil), v...)
	}
	return out
}

// expected is what a complete import of files stores, by session.
func expected(t testing.TB, files []string) (map[string][]events.Event, int) {
	t.Helper()
	c, err := NewConverter(Options{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]events.Event{}
	n := 0
	for _, f := range files {
		res, err := c.ConvertFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range res.Sessions {
			out[s.Tenant+"/"+s.Session] = append(out[s.Tenant+"/"+s.Session], s.Events...)
			n += len(s.Events)
		}
	}
	return out, n
}

// importFiles is a part of the corpus small enough for the race detector:
// the ccviewer sessions (with inline and separate subagents) and the short
// spotter sessions; with long, one long session too, whose sessions exceed
// ImportChunk events.
func importFiles(t testing.TB, long bool) []string {
	t.Helper()
	args := []string{
		filepath.Join(corpusDir(t), "ccviewer"),
		corpusFile(t, "spotter/short.jsonl"),
		corpusFile(t, "spotter/tool_heavy.jsonl"),
		corpusFile(t, "spotter/subagent.jsonl"),
	}
	if long {
		args = append(args, corpusFile(t, "spotter/ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl"))
	}
	files, err := Expand(args)
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestImportTwiceAppendsNothing: an import stores every converted event
// once, in order, in chunks of at most ImportChunk events, with progress
// that never goes back; a second import appends nothing. The full-size
// pass of .ci/run imports the long ae4a77f8 too, whose session exceeds
// ImportChunk, and checks chunks of exactly ImportChunk; under the race
// detector and -short (2.7 MB converted three times) it is left out, and
// no chunk may exceed ImportChunk.
func TestImportTwiceAppendsNothing(t *testing.T) {
	t.Parallel()
	long := !sampled()
	files := importFiles(t, long)
	want, n := expected(t, files)
	store := newMemStore()
	var calls [][2]int
	rep, err := Import(context.Background(), store, files, Options{}, func(done, total int) {
		calls = append(calls, [2]int{done, total})
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Files != len(files) || rep.Events != n || rep.Appended != n || rep.Existing != 0 || len(rep.Diagnostics) != 0 {
		t.Errorf("first import: %+v (want %d events)", rep, n)
	}
	if rep.Records == 0 || rep.Skipped["progress"] == 0 || rep.Sessions != len(want) || rep.Elapsed <= 0 || rep.EventsPerSecond() <= 0 {
		t.Errorf("first import: %+v", rep)
	}
	if got := store.snapshot(); !reflect.DeepEqual(got, want) {
		t.Error("the store does not hold the converted events in order")
	}
	// Progress goes from 0 to total without going back.
	if len(calls) < 2 || calls[0][0] != 0 || calls[len(calls)-1][0] != calls[len(calls)-1][1] {
		t.Errorf("progress calls %v", calls)
	}
	for i := 1; i < len(calls); i++ {
		if calls[i][0] < calls[i-1][0] || calls[i][1] != calls[0][1] {
			t.Fatalf("progress went from %v to %v", calls[i-1], calls[i])
		}
	}
	// Chunks of at most ImportChunk events (ae4a77f8 has more).
	if long && store.maxBatch != ImportChunk || store.maxBatch > ImportChunk || store.appends < n/ImportChunk {
		t.Errorf("%d appends of at most %d events for %d events", store.appends, store.maxBatch, n)
	}

	appends := store.appends
	rep, err = Import(context.Background(), store, files, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Appended != 0 || rep.Existing != n || store.appends != appends {
		t.Errorf("second import: %+v, %d appends", rep, store.appends-appends)
	}
	if got := store.snapshot(); !reflect.DeepEqual(got, want) {
		t.Error("the second import changed the store")
	}
}

func TestImportAppendsTheMissingSuffix(t *testing.T) {
	t.Parallel()
	files := importFiles(t, false)
	want, n := expected(t, files)

	// A store that already holds a prefix of each session, as after an
	// import killed midway.
	store := newMemStore()
	held := 0
	for k, evs := range want {
		cut := len(evs) / 3
		store.sessions[k] = append([]events.Event(nil), evs[:cut]...)
		held += cut
	}
	rep, err := Import(context.Background(), store, files, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Existing != held || rep.Appended != n-held {
		t.Errorf("report %+v; want %d existing, %d appended", rep, held, n-held)
	}
	if got := store.snapshot(); !reflect.DeepEqual(got, want) {
		t.Error("the store does not hold every event once, in order")
	}
}

func TestImportResumesAfterAStoreFailure(t *testing.T) {
	t.Parallel()
	files := importFiles(t, false)
	want, n := expected(t, files)
	store := newMemStore()
	store.failAfter = n / 2
	rep, err := Import(context.Background(), store, files, Options{}, nil)
	if !errors.Is(err, errStoreDown) {
		t.Fatalf("err = %v, want the store's", err)
	}
	if rep == nil || rep.Appended >= n {
		t.Fatalf("report %+v", rep)
	}
	stored := store.total()
	store.failAfter = 0
	rep, err = Import(context.Background(), store, files, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Appended != n-stored || rep.Existing != stored {
		t.Errorf("resumed import %+v; want %d appended, %d existing", rep, n-stored, stored)
	}
	if got := store.snapshot(); !reflect.DeepEqual(got, want) {
		t.Error("the store does not hold every event once, in order")
	}
}

func TestImportCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rep, err := Import(ctx, newMemStore(), importFiles(t, false), Options{}, nil)
	if !errors.Is(err, context.Canceled) || rep == nil || rep.Appended != 0 {
		t.Errorf("Import on a cancelled context: %+v, %v", rep, err)
	}
}

func TestImportReportsUnreadableFiles(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "gone.jsonl")
	rep, err := Import(context.Background(), newMemStore(), []string{missing, corpusFile(t, "spotter/short.jsonl")}, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Diagnostics) != 1 || rep.Diagnostics[0].File != missing || rep.Files != 1 || rep.Appended == 0 {
		t.Errorf("report %+v", rep)
	}
	if _, err := Import(context.Background(), newMemStore(), nil, Options{Tenant: "no spaces"}, nil); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("invalid tenant: %v", err)
	}
}
