package projections

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
)

// startJetStream starts a real embedded NATS server with JetStream (any
// free port, a store directory under tb.TempDir(), both gone when the test
// ends) and returns a JetStream context on a client connection to it.
func startJetStream(tb testing.TB) jetstream.JetStream {
	tb.Helper()
	_, js := embeddedtest.Connect(tb, embeddedtest.Start(tb))
	return js
}

func newStore(tb testing.TB, js jetstream.JetStream) *SnapshotStore {
	tb.Helper()
	store, err := NewSnapshotStore(js, SnapshotConfig{})
	if err != nil {
		tb.Fatalf("new snapshot store: %v", err)
	}
	return store
}

func testContext(tb testing.TB) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

func TestSnapshotStoreSaveLoad(t *testing.T) {
	ctx := testContext(t)
	js := startJetStream(t)
	store := newStore(t, js)

	if _, err := store.Load(ctx, testTenant, testSession); !errors.Is(err, ErrNoSnapshot) {
		t.Fatalf("Load before the stream exists: %v, want ErrNoSnapshot", err)
	}
	for range 2 {
		if err := store.EnsureStream(ctx); err != nil {
			t.Fatalf("EnsureStream: %v", err)
		}
	}
	if _, err := store.Load(ctx, testTenant, testSession); !errors.Is(err, ErrNoSnapshot) {
		t.Fatalf("Load of a session without snapshot: %v, want ErrNoSnapshot", err)
	}

	evs := synth(t, 9, 60, true)
	var last *Session
	for i, cut := range []int{len(evs) / 5, 2 * len(evs) / 5, 3 * len(evs) / 5, 4 * len(evs) / 5, len(evs)} {
		last = Fold(evs[:cut])
		if err := store.Save(ctx, last); err != nil {
			t.Fatalf("Save %d: %v", i, err)
		}
	}
	snap, err := store.Latest(ctx, testTenant, testSession)
	if err != nil {
		t.Fatalf("Latest: %v", err)
	}
	if snap.Version != Version || snap.CoversSeq != last.LastSeq || snap.TakenAt.IsZero() {
		t.Errorf("snapshot header = %d %d %s", snap.Version, snap.CoversSeq, snap.TakenAt)
	}
	if got, want := fingerprint(t, snap.State), fingerprint(t, last); string(got) != string(want) {
		t.Errorf("loaded state differs from the saved one:\n got %.300s\nwant %.300s", diffAt(got, want), diffAt(want, got))
	}

	// A retried Save of the same state is stored once; only the last
	// PerSession snapshots are kept.
	st, err := js.Stream(ctx, events.SnapshotsStream)
	if err != nil {
		t.Fatal(err)
	}
	before, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Save(ctx, last); err != nil {
		t.Fatalf("Save again: %v", err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(events.SnapshotSubject(testTenant, testSession)))
	if err != nil {
		t.Fatal(err)
	}
	if info.State.LastSeq != before.State.LastSeq {
		t.Errorf("a retried Save stored a second message (last sequence %d -> %d)", before.State.LastSeq, info.State.LastSeq)
	}
	if n := info.State.Subjects[events.SnapshotSubject(testTenant, testSession)]; n != events.DefaultSnapshotsPerSession {
		t.Errorf("snapshots kept for the session: %d, want %d", n, events.DefaultSnapshotsPerSession)
	}

	if _, err := store.Load(ctx, testTenant, "other"); !errors.Is(err, ErrNoSnapshot) {
		t.Errorf("Load of another session: %v, want ErrNoSnapshot", err)
	}
	if err := store.Save(ctx, &Session{Tenant: testTenant, Session: testSession}); err == nil {
		t.Error("Save of a state that covers no sequence must fail")
	}
	if err := store.Save(ctx, &Session{}); err == nil {
		t.Error("Save of a state without session must fail")
	}
}

func TestSnapshotStoreIgnoresUnusableSnapshots(t *testing.T) {
	ctx := testContext(t)
	js := startJetStream(t)
	store := newStore(t, js)
	if err := store.EnsureStream(ctx); err != nil {
		t.Fatal(err)
	}
	subject := events.SnapshotSubject(testTenant, testSession)
	tests := []struct {
		name string
		body string
		want error
	}{
		{"other version", fmt.Sprintf(`{"version": %d, "covers_seq": 5, "state": {"turns": "a new shape"}}`, Version+1), ErrSnapshotVersion},
		{"not JSON", `{"version":`, ErrSnapshotCorrupt},
		{"state does not decode", fmt.Sprintf(`{"version": %d, "covers_seq": 5, "state": {"turns": 3}}`, Version), ErrSnapshotCorrupt},
		{"covers_seq disagrees", fmt.Sprintf(`{"version": %d, "covers_seq": 5, "state": {"tenant": %q, "session": %q, "last_seq": 4}}`, Version, testTenant, testSession), ErrSnapshotCorrupt},
		{"other session", fmt.Sprintf(`{"version": %d, "covers_seq": 5, "state": {"tenant": "x", "session": "y", "last_seq": 5}}`, Version), ErrSnapshotCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := js.Publish(ctx, subject, []byte(tt.body)); err != nil {
				t.Fatal(err)
			}
			if _, err := store.Load(ctx, testTenant, testSession); !errors.Is(err, tt.want) {
				t.Errorf("Load: %v, want %v", err, tt.want)
			}
		})
	}
}

// TestEnsureStreamWithLog checks that the store and events.Open agree on
// the AGENT_SNAPSHOTS stream, whichever runs first.
func TestEnsureStreamWithLog(t *testing.T) {
	for _, storeFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("store first %v", storeFirst), func(t *testing.T) {
			ctx := testContext(t)
			js := startJetStream(t)
			store := newStore(t, js)
			if storeFirst {
				if err := store.EnsureStream(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := events.Open(ctx, js, events.Config{}, nil); err != nil {
				t.Fatalf("events.Open: %v", err)
			}
			if err := store.EnsureStream(ctx); err != nil {
				t.Fatal(err)
			}
			st, err := js.Stream(ctx, events.SnapshotsStream)
			if err != nil {
				t.Fatal(err)
			}
			if cfg := st.CachedInfo().Config; cfg.MaxMsgsPerSubject != events.DefaultSnapshotsPerSession || cfg.Subjects[0] != "agent.snap.*.*" {
				t.Errorf("stream config: %+v", cfg)
			}
		})
	}
}

// TestRestore appends a session to a real log (interleaved with another
// session, so that its sequences are not contiguous, and with a broken
// body published straight to its subject) and checks that the latest
// snapshot plus the events after it equals the full replay, for several
// snapshot points, and that an unusable snapshot falls back to the full
// replay. The session has 150 turns (some 3,000 events in 8 appends); 60
// under the race detector and -short (3 appends, still interleaved),
// where decoding the events read back is what takes the time; the
// full-size pass of .ci/run replays the 150.
func TestRestore(t *testing.T) {
	t.Parallel()
	turns := 150
	if sampled() {
		turns = 60
	}
	ctx := testContext(t)
	js := startJetStream(t)
	log, err := events.Open(ctx, js, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	store := newStore(t, js)

	var mine []events.Event
	for _, ev := range synth(t, 4, turns, true) {
		if ev.Err == nil {
			mine = append(mine, ev)
		}
	}
	other := synth(t, 5, 40, false)
	for i := range other {
		other[i].Session = "s2"
		other[i].ID = events.DeterministicID(other[i].Time, fmt.Sprintf("s2-%d", i))
	}
	for i := 0; i < len(mine); i += 400 {
		chunk := mine[i:min(i+400, len(mine))]
		if _, err := log.Append(ctx, chunk); err != nil {
			t.Fatalf("append: %v", err)
		}
		if j := i / 400 * 100; j < len(other) {
			if _, err := log.Append(ctx, other[j:min(j+100, len(other))]); err != nil {
				t.Fatalf("append other: %v", err)
			}
		}
		if i == 0 {
			if _, err := js.Publish(ctx, log.SessionSubject(testTenant, testSession), []byte(`{"specversion": "1.0", "type": `)); err != nil {
				t.Fatal(err)
			}
		}
	}

	full, err := Restore(ctx, log, nil, testTenant, testSession)
	if err != nil {
		t.Fatalf("full replay: %v", err)
	}
	if full.Events != len(mine)+1 || len(full.InvalidEvents) == 0 || full.Turns == nil {
		t.Fatalf("full replay folded %d events (%d invalid), want %d", full.Events, len(full.InvalidEvents), len(mine)+1)
	}
	want := fingerprint(t, full)

	if _, err := Restore(ctx, log, store, testTenant, testSession); err != nil {
		t.Fatalf("restore without a snapshot: %v", err)
	}
	var seqs []uint64
	if err := log.ReadSession(ctx, testTenant, testSession, events.ReadOptions{}, func(ev events.Event) error {
		seqs = append(seqs, ev.Seq)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, cut := range []uint64{seqs[0], seqs[len(seqs)/3], seqs[len(seqs)/2], seqs[len(seqs)-2], seqs[len(seqs)-1]} {
		head := &Session{}
		if err := log.ReadSession(ctx, testTenant, testSession, events.ReadOptions{UntilSeq: cut}, func(ev events.Event) error {
			head.Apply(ev)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := store.Save(ctx, head); err != nil {
			t.Fatalf("save at %d: %v", cut, err)
		}
		got, err := Restore(ctx, log, store, testTenant, testSession)
		if err != nil {
			t.Fatalf("restore from the snapshot at %d: %v", cut, err)
		}
		if g := fingerprint(t, got); string(g) != string(want) {
			t.Fatalf("snapshot at %d + tail differs from the full replay:\n got %.300s\nwant %.300s", cut, diffAt(g, want), diffAt(want, g))
		}
	}

	// A snapshot of another version is ignored.
	body, _ := json.Marshal(map[string]any{"version": Version + 1, "covers_seq": seqs[len(seqs)-1], "state": map[string]any{}})
	if _, err := js.Publish(ctx, events.SnapshotSubject(testTenant, testSession), body); err != nil {
		t.Fatal(err)
	}
	got, err := Restore(ctx, log, store, testTenant, testSession)
	if err != nil {
		t.Fatalf("restore past a snapshot of another version: %v", err)
	}
	if g := fingerprint(t, got); string(g) != string(want) {
		t.Fatalf("restore past a snapshot of another version differs from the full replay")
	}

	if _, err := Restore(ctx, log, store, testTenant, "nobody"); !errors.Is(err, events.ErrSessionNotFound) {
		t.Errorf("restore of an unknown session: %v, want ErrSessionNotFound", err)
	}
}
