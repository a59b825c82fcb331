// Package sessionlogtest is the behaviour every events.SessionLog shares,
// as one test body that each implementation runs: the direct log
// (events.Log, in package events' tests) and the engine's ingest
// (ingest.Client through a real ingest server, in package ingest's
// tests). It is the pattern of watermill's pubsub/tests and hallgren's
// eventsourcing core/testsuite: a second implementation of the contract,
// or a change to one, answers to the same checks.
//
// Each check is a parallel subtest on sessions of its own (names derived
// from the subtest's), so one log serves the whole suite.
package sessionlogtest

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
)

// Features are what an implementation offers beyond the behaviour every
// SessionLog shares; the checks of a feature it lacks check that it
// refuses it instead.
type Features struct {
	// Tenant is the tenant the suite writes (default "suite"): under
	// auth, the one the implementation's credentials may write.
	Tenant string
	// ReadFromTime: ReadSession honours ReadOptions.FromTime (store
	// time). ingest.Client does not (the engine reads by sequence) and
	// must refuse a read from a time, never read from the start instead.
	ReadFromTime bool
}

// Run runs every check of the suite against log.
func Run(t *testing.T, log events.SessionLog, f Features) {
	t.Helper()
	if f.Tenant == "" {
		f.Tenant = "suite"
	}
	s := &suite{log: log, f: f}
	for _, c := range []struct {
		name string
		run  func(*testing.T, *suite)
	}{
		{"AppendThenRead", testAppendThenRead},
		{"ResendIsStoredOnce", testResendIsStoredOnce},
		{"ConditionalAppend", testConditionalAppend},
		{"AtomicAppend", testAtomicAppend},
		{"InvalidIsRefusedWhole", testInvalidIsRefusedWhole},
		{"TooLargeIsRefused", testTooLargeIsRefused},
		{"SecretsAreMasked", testSecretsAreMasked},
		{"ReadRange", testReadRange},
		{"ReadStopsOnCallbackError", testReadStopsOnCallbackError},
		{"UnknownSessionIsNotFound", testUnknownSessionIsNotFound},
		{"SessionsAreSeparate", testSessionsAreSeparate},
		{"ConcurrentAppends", testConcurrentAppends},
		{"CancelledContext", testCancelledContext},
		{"ReadFromTime", testReadFromTime},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, s)
		})
	}
}

type suite struct {
	log events.SessionLog
	f   Features
}

// session names a session unique to the subtest (and to n).
func session(t *testing.T, n int) string {
	h := fnv.New32a()
	h.Write([]byte(t.Name()))
	return fmt.Sprintf("s%08x-%d-%d", h.Sum32(), time.Now().UnixNano()%1e9, n)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// ev builds an event of the suite's tenant.
func (s *suite) ev(t *testing.T, session, turn string, p events.Payload) events.Event {
	t.Helper()
	e, err := events.New(s.f.Tenant, session, turn, p)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// text is a user message holding text.
func text(s string) *events.MessageAppended {
	return &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: events.BlockText, Text: s}}}
}

// turn is a session start and one turn of n user messages.
func (s *suite) turn(t *testing.T, session string, n int) []events.Event {
	evs := []events.Event{s.ev(t, session, "", &events.SessionStarted{Provider: "anthropic"}), s.ev(t, session, "t1", &events.TurnStarted{Prompt: "hello"})}
	for i := range n {
		evs = append(evs, s.ev(t, session, "t1", text(fmt.Sprintf("message %d", i))))
	}
	return evs
}

// read returns every event of the session.
func (s *suite) read(t *testing.T, session string, opts events.ReadOptions) []events.Event {
	t.Helper()
	var out []events.Event
	if err := s.log.ReadSession(ctx(t), s.f.Tenant, session, opts, func(e events.Event) error {
		out = append(out, e)
		return nil
	}); err != nil {
		t.Fatalf("read %s: %v", session, err)
	}
	return out
}

// checkStored fails unless the session holds exactly want, in order, at
// the acks' sequences.
func (s *suite) checkStored(t *testing.T, session string, want []events.Event, acks []events.Ack) {
	t.Helper()
	got := s.read(t, session, events.ReadOptions{})
	if len(got) != len(want) {
		t.Fatalf("%s holds %d events, want %d", session, len(got), len(want))
	}
	for i, e := range got {
		if e.Err != nil || e.ID != want[i].ID || e.Type != want[i].Type || e.Tenant != s.f.Tenant || e.Session != session || e.Seq != acks[i].Seq {
			t.Fatalf("event %d: %s %s seq %d (err %v), want %s %s seq %d", i, e.ID, e.Type, e.Seq, e.Err, want[i].ID, want[i].Type, acks[i].Seq)
		}
	}
	last, err := s.log.LastSeq(ctx(t), s.f.Tenant, session)
	if err != nil || last != acks[len(acks)-1].Seq {
		t.Fatalf("last seq %d, %v; want %d", last, err, acks[len(acks)-1].Seq)
	}
}

// testAppendThenRead: one ack per event, in order, with its id and an
// increasing sequence; the session reads back the same events at them.
func testAppendThenRead(t *testing.T, s *suite) {
	sess := session(t, 0)
	evs := s.turn(t, sess, 3)
	acks, err := s.log.Append(ctx(t), evs)
	if err != nil {
		t.Fatal(err)
	}
	if len(acks) != len(evs) {
		t.Fatalf("%d acks for %d events", len(acks), len(evs))
	}
	for i, a := range acks {
		if a.ID != evs[i].ID || a.Duplicate || (i > 0 && a.Seq <= acks[i-1].Seq) {
			t.Fatalf("ack %d: %+v", i, a)
		}
	}
	s.checkStored(t, sess, evs, acks)
}

// testResendIsStoredOnce: the same events sent again (a publisher after a
// lost reply) are stored once, and acknowledged at their first sequences
// as duplicates.
func testResendIsStoredOnce(t *testing.T, s *suite) {
	sess := session(t, 0)
	evs := s.turn(t, sess, 1)
	first, err := s.log.Append(ctx(t), evs)
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.log.Append(ctx(t), evs)
	if err != nil {
		t.Fatal(err)
	}
	for i := range again {
		if again[i].Seq != first[i].Seq || !again[i].Duplicate {
			t.Fatalf("resent event %d: %+v, want the first sequence %d as a duplicate", i, again[i], first[i].Seq)
		}
	}
	s.checkStored(t, sess, evs, first)
}

// testConditionalAppend: ExpectLastSeq(0) starts a session; an
// expectation that is not the session's last stores nothing and says
// events.ErrConflict; the right one stores the events at consecutive
// sequences.
func testConditionalAppend(t *testing.T, s *suite) {
	sess := session(t, 0)
	start := s.turn(t, sess, 0)
	acks, err := s.log.Append(ctx(t), start, events.ExpectLastSeq(0))
	if err != nil {
		t.Fatal(err)
	}
	if acks[1].Seq != acks[0].Seq+1 {
		t.Fatalf("a conditional append's events are not consecutive: %+v", acks)
	}
	late := []events.Event{s.ev(t, sess, "t1", text("late"))}
	if _, err := s.log.Append(ctx(t), late, events.ExpectLastSeq(0)); !errors.Is(err, events.ErrConflict) {
		t.Fatalf("stale expectation: %v, want ErrConflict", err)
	}
	if _, err := s.log.Append(ctx(t), late, events.ExpectLastSeq(acks[0].Seq)); !errors.Is(err, events.ErrConflict) {
		t.Fatalf("expectation of a sequence that is not the last: %v, want ErrConflict", err)
	}
	s.checkStored(t, sess, start, acks)
	more := []events.Event{s.ev(t, sess, "t1", text("one")), s.ev(t, sess, "t1", text("two"))}
	macks, err := s.log.Append(ctx(t), more, events.ExpectLastSeq(acks[1].Seq))
	if err != nil {
		t.Fatal(err)
	}
	if macks[1].Seq != macks[0].Seq+1 {
		t.Fatalf("not consecutive: %+v", macks)
	}
	s.checkStored(t, sess, append(start, more...), append(acks, macks...))
}

// testAtomicAppend: events.Atomic stores a call's events at consecutive
// sequences, whatever other calls send the session at the same time; the
// same call sent again comes back as duplicates at the first sequences;
// a call over two sessions, or reusing an id another call stored, stores
// nothing.
func testAtomicAppend(t *testing.T, s *suite) {
	sess := session(t, 0)
	start := s.turn(t, sess, 0)
	acks, err := s.log.Append(ctx(t), start, events.Atomic())
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.log.Append(ctx(t), start, events.Atomic())
	if err != nil {
		t.Fatalf("the same atomic call sent again: %v", err)
	}
	for i := range again {
		if again[i].Seq != acks[i].Seq || !again[i].Duplicate {
			t.Fatalf("resent event %d: %+v, want the first sequence %d as a duplicate", i, again[i], acks[i].Seq)
		}
	}
	// Writers racing on one session: each call's three events stay
	// together.
	const writers = 6
	calls := make([][]events.Event, writers)
	for w := range calls {
		for k := range 3 {
			calls[w] = append(calls[w], s.ev(t, sess, "t1", text(fmt.Sprintf("writer %d event %d", w, k))))
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for w := range calls {
		wg.Go(func() { _, errs[w] = s.log.Append(ctx(t), calls[w], events.Atomic()) })
	}
	wg.Wait()
	for w, err := range errs {
		if err != nil {
			t.Fatalf("writer %d: %v", w, err)
		}
	}
	got := s.read(t, sess, events.ReadOptions{})
	if len(got) != len(start)+writers*3 {
		t.Fatalf("%s holds %d events, want %d", sess, len(got), len(start)+writers*3)
	}
	for i := len(start); i < len(got); i += 3 {
		w := -1
		for j, c := range calls {
			if c[0].ID == got[i].ID {
				w = j
			}
		}
		if w < 0 || got[i+1].ID != calls[w][1].ID || got[i+2].ID != calls[w][2].ID {
			t.Fatalf("events %d to %d are not one atomic call's, in order: %s %s %s", i, i+2, got[i].ID, got[i+1].ID, got[i+2].ID)
		}
	}
	other := s.ev(t, session(t, 1), "", &events.SessionStarted{})
	if _, err := s.log.Append(ctx(t), []events.Event{s.ev(t, sess, "t1", text("x")), other}, events.Atomic()); !errors.Is(err, events.ErrInvalid) {
		t.Fatalf("an atomic call over two sessions: %v, want ErrInvalid", err)
	}
	reused := []events.Event{s.ev(t, sess, "t1", text("new")), calls[0][1]}
	if _, err := s.log.Append(ctx(t), reused, events.Atomic()); !errors.Is(err, events.ErrDuplicateID) {
		t.Fatalf("an atomic call reusing a stored id among new events: %v, want ErrDuplicateID", err)
	}
	if n := len(s.read(t, sess, events.ReadOptions{})); n != len(got) {
		t.Fatalf("refused atomic calls stored events: %d, want %d", n, len(got))
	}
	// One event: stored, and sent again a duplicate.
	one := []events.Event{s.ev(t, sess, "t1", text("one"))}
	first, err := s.log.Append(ctx(t), one, events.Atomic())
	if err != nil || len(first) != 1 || first[0].Duplicate {
		t.Fatalf("an atomic call of one event: %+v, %v", first, err)
	}
	again, err = s.log.Append(ctx(t), one, events.Atomic())
	if err != nil || len(again) != 1 || !again[0].Duplicate || again[0].Seq != first[0].Seq {
		t.Fatalf("an atomic call of one event sent again: %+v, %v; want seq %d as a duplicate", again, err, first[0].Seq)
	}
}

// testInvalidIsRefusedWhole: a call with an event that breaks the
// contract stores none of its events and says events.ErrInvalid.
func testInvalidIsRefusedWhole(t *testing.T, s *suite) {
	sess := session(t, 0)
	bad := s.ev(t, sess, "t1", &events.MessageAppended{Role: "narrator", Content: []events.ContentBlock{{Type: events.BlockText, Text: "x"}}})
	evs := append(s.turn(t, sess, 1), bad)
	if _, err := s.log.Append(ctx(t), evs); !errors.Is(err, events.ErrInvalid) {
		t.Fatalf("append with an invalid event: %v, want ErrInvalid", err)
	}
	if _, err := s.log.Append(ctx(t), evs, events.ExpectLastSeq(0)); !errors.Is(err, events.ErrInvalid) {
		t.Fatalf("conditional append with an invalid event: %v, want ErrInvalid", err)
	}
	if _, err := s.log.LastSeq(ctx(t), s.f.Tenant, sess); !errors.Is(err, events.ErrSessionNotFound) {
		t.Fatalf("after refused appends the session exists: %v", err)
	}
	other := s.ev(t, sess, "", &events.SessionStarted{})
	other.Tenant = "bad.tenant"
	if _, err := s.log.Append(ctx(t), []events.Event{other}); !errors.Is(err, events.ErrInvalid) {
		t.Fatalf("a tenant that is not a token: %v, want ErrInvalid", err)
	}
}

// testTooLargeIsRefused: an event over the log's bound (1 MiB by default)
// is refused with events.ErrTooLarge, and nothing is stored.
func testTooLargeIsRefused(t *testing.T, s *suite) {
	sess := session(t, 0)
	big := s.ev(t, sess, "t1", text(strings.Repeat("x", events.DefaultMaxEventBytes+1)))
	if _, err := s.log.Append(ctx(t), []events.Event{big}); !errors.Is(err, events.ErrTooLarge) {
		t.Fatalf("append of %d bytes: %v, want ErrTooLarge", events.DefaultMaxEventBytes, err)
	}
	if _, err := s.log.LastSeq(ctx(t), s.f.Tenant, sess); !errors.Is(err, events.ErrSessionNotFound) {
		t.Fatalf("after a refused append the session exists: %v", err)
	}
}

// testSecretsAreMasked: a secret in free text is stored masked
// (docs/masking.md), whichever side masks.
func testSecretsAreMasked(t *testing.T, s *suite) {
	sess := session(t, 0)
	const key = "sk-ant-api03-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	evs := append(s.turn(t, sess, 0), s.ev(t, sess, "t1", text("my key is "+key)))
	if _, err := s.log.Append(ctx(t), evs); err != nil {
		t.Fatal(err)
	}
	got := s.read(t, sess, events.ReadOptions{})
	last := got[len(got)-1]
	if strings.Contains(string(last.Raw), key) || strings.Contains(string(last.Data), key) {
		t.Fatalf("the secret is stored as it was sent: %s", last.Raw)
	}
	if !strings.Contains(string(last.Data), "my key is ") {
		t.Fatalf("the text around the secret is gone: %s", last.Data)
	}
}

// testReadRange: FromSeq and UntilSeq bound a read, inclusive.
func testReadRange(t *testing.T, s *suite) {
	sess := session(t, 0)
	evs := s.turn(t, sess, 4)
	acks, err := s.log.Append(ctx(t), evs)
	if err != nil {
		t.Fatal(err)
	}
	got := s.read(t, sess, events.ReadOptions{FromSeq: acks[1].Seq, UntilSeq: acks[3].Seq})
	if len(got) != 3 || got[0].ID != evs[1].ID || got[2].ID != evs[3].ID {
		t.Fatalf("read %d..%d: %d events", acks[1].Seq, acks[3].Seq, len(got))
	}
	tail := s.read(t, sess, events.ReadOptions{FromSeq: acks[4].Seq})
	if len(tail) != len(evs)-4 || tail[0].ID != evs[4].ID {
		t.Fatalf("read from %d: %d events", acks[4].Seq, len(tail))
	}
	past := s.read(t, sess, events.ReadOptions{FromSeq: acks[len(acks)-1].Seq + 1000})
	if len(past) != 0 {
		t.Fatalf("read past the end: %d events", len(past))
	}
}

// testReadStopsOnCallbackError: the callback's error ends the read and is
// returned as it is.
func testReadStopsOnCallbackError(t *testing.T, s *suite) {
	sess := session(t, 0)
	if _, err := s.log.Append(ctx(t), s.turn(t, sess, 3)); err != nil {
		t.Fatal(err)
	}
	stop := errors.New("seen enough")
	n := 0
	err := s.log.ReadSession(ctx(t), s.f.Tenant, sess, events.ReadOptions{}, func(events.Event) error {
		n++
		if n == 2 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || n != 2 {
		t.Fatalf("read returned %v after %d events, want the callback's error after 2", err, n)
	}
}

// testUnknownSessionIsNotFound: a session with no event is
// events.ErrSessionNotFound, to ReadSession and LastSeq.
func testUnknownSessionIsNotFound(t *testing.T, s *suite) {
	sess := session(t, 0)
	err := s.log.ReadSession(ctx(t), s.f.Tenant, sess, events.ReadOptions{}, func(events.Event) error {
		t.Fatal("an event of a session that has none")
		return nil
	})
	if !errors.Is(err, events.ErrSessionNotFound) {
		t.Fatalf("read: %v, want ErrSessionNotFound", err)
	}
	if last, err := s.log.LastSeq(ctx(t), s.f.Tenant, sess); !errors.Is(err, events.ErrSessionNotFound) || last != 0 {
		t.Fatalf("last seq: %d, %v; want 0, ErrSessionNotFound", last, err)
	}
}

// testSessionsAreSeparate: sessions appended in one call, interleaved,
// each read back alone and in order.
func testSessionsAreSeparate(t *testing.T, s *suite) {
	a, b := session(t, 0), session(t, 1)
	var evs []events.Event
	ta, tb := s.turn(t, a, 2), s.turn(t, b, 2)
	for i := range ta {
		evs = append(evs, ta[i], tb[i])
	}
	acks, err := s.log.Append(ctx(t), evs)
	if err != nil {
		t.Fatal(err)
	}
	var aa, ab []events.Ack
	for i, k := range acks {
		if i%2 == 0 {
			aa = append(aa, k)
		} else {
			ab = append(ab, k)
		}
	}
	s.checkStored(t, a, ta, aa)
	s.checkStored(t, b, tb, ab)
}

// testConcurrentAppends: appends from many goroutines are all stored,
// each session's in its own order.
func testConcurrentAppends(t *testing.T, s *suite) {
	const writers, each = 8, 10
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	sessions := make([]string, writers)
	for w := range writers {
		sessions[w] = session(t, w)
		wg.Go(func() {
			for i := range each {
				if _, err := s.log.Append(ctx(t), []events.Event{s.ev(t, sessions[w], "", text(fmt.Sprintf("%d", i)))}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, sess := range sessions {
		got := s.read(t, sess, events.ReadOptions{})
		if len(got) != each {
			t.Fatalf("%s: %d events, want %d", sess, len(got), each)
		}
		for i, e := range got {
			if !strings.Contains(string(e.Data), fmt.Sprintf(`"text":"%d"`, i)) {
				t.Fatalf("%s: event %d out of order: %s", sess, i, e.Data)
			}
		}
	}
}

// testCancelledContext: a call with a context already cancelled fails
// and stores nothing.
func testCancelledContext(t *testing.T, s *suite) {
	sess := session(t, 0)
	c, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.log.Append(c, s.turn(t, sess, 1)); err == nil {
		t.Fatal("append with a cancelled context succeeded")
	}
	if err := s.log.ReadSession(c, s.f.Tenant, sess, events.ReadOptions{}, func(events.Event) error { return nil }); err == nil {
		t.Fatal("read with a cancelled context succeeded")
	}
	if _, err := s.log.LastSeq(ctx(t), s.f.Tenant, sess); !errors.Is(err, events.ErrSessionNotFound) {
		t.Fatalf("after an append with a cancelled context the session exists: %v", err)
	}
}

// testReadFromTime: with the feature, a read from a store time starts at
// the first event stored at or after it; without, it is refused (never
// read from the start instead).
func testReadFromTime(t *testing.T, s *suite) {
	sess := session(t, 0)
	first := s.turn(t, sess, 1)
	if _, err := s.log.Append(ctx(t), first); err != nil {
		t.Fatal(err)
	}
	// Just after the store time of the first events (the server's clock).
	stored := s.read(t, sess, events.ReadOptions{})
	from := stored[len(stored)-1].Stored.Add(time.Nanosecond)
	if stored[len(stored)-1].Stored.IsZero() {
		t.Fatal("a read event has no store time")
	}
	later := []events.Event{s.ev(t, sess, "t1", text("later"))}
	if _, err := s.log.Append(ctx(t), later); err != nil {
		t.Fatal(err)
	}
	var got []events.Event
	err := s.log.ReadSession(ctx(t), s.f.Tenant, sess, events.ReadOptions{FromTime: from}, func(e events.Event) error {
		got = append(got, e)
		return nil
	})
	if !s.f.ReadFromTime {
		if err == nil {
			t.Fatalf("a read from a time was not refused (%d events)", len(got))
		}
		return
	}
	if err != nil || len(got) != 1 || got[0].ID != later[0].ID {
		t.Fatalf("read from %s: %d events, %v; want the one stored after it", from, len(got), err)
	}
}
