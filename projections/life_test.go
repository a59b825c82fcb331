package projections

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
)

func TestDeclaredTimeoutMS(t *testing.T) {
	for _, c := range []struct {
		name, input string
		want        int64
	}{
		{"Bash", `{"command":"make","timeout":120000}`, 120000},
		{"Bash", `{"command":"make"}`, 0},
		{"Bash", `{"command":"make","timeout":"120000"}`, 0},
		{"Bash", `{"command":"make","timeout":-5}`, 0},
		{"Bash", `{"command":"make","timeout":1e300}`, MaxDeclaredTimeoutMS},
		{"TaskOutput", `{"task_id":"x","timeout":300000}`, 300000},
		{"Read", `{"file_path":"x","timeout":300000}`, 0},
		{"shell", `{"command":["ls"],"timeout_ms":30000}`, 30000},
		{"exec_command", `{"cmd":"ls","timeout_ms":2500.7}`, 2500},
		{"Bash", `[1,2]`, 0},
		{"Bash", `not json`, 0},
		{"Bash", ``, 0},
		// The quick "no timeout here" answer must agree with the decoder,
		// which matches names in any case and reads escapes.
		{"Bash", `{"command":"make","TimeOut":4000}`, 4000},
		{"shell", `{"command":["ls"],"TIMEOUT_MS":30000}`, 30000},
		{"Bash", `{"command":"make","time\u006fut":7000}`, 7000},
		{"Bash", `{"command":"echo timeout"}`, 0},
	} {
		if got := DeclaredTimeoutMS(c.name, json.RawMessage(c.input)); got != c.want {
			t.Errorf("%s %s: %d, want %d", c.name, c.input, got, c.want)
		}
	}
}

// TestActiveAt: a turn's sign of life is the store time of its latest
// runtime event (or of one of no turn); Turnstone's own events, and
// events of another turn, are not.
func TestActiveAt(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	s := &Session{}
	apply := func(after time.Duration, turn, source string, p events.Payload) {
		ev, err := events.NewAt(t0.Add(after), events.NewID(), testTenant, testSession, turn, p)
		if err != nil {
			t.Fatal(err)
		}
		ev.Seq, ev.Stored, ev.Source = s.LastSeq+1, t0.Add(after), source
		s.Apply(ev)
	}
	apply(0, "t1", "urn:rt", started("a"))
	apply(time.Second, "t2", "urn:rt", started("b"))
	apply(2*time.Second, "t1", "urn:rt", user(text("a")))
	apply(3*time.Second, "", "urn:rt", &events.ErrorRecorded{ErrorInfo: errInfo("x")})
	apply(9*time.Second, "t1", "urn:turnstone:reconciler", &events.DistillationSkipped{Reason: "turn_in_flight"})
	apply(10*time.Second, "", "urn:rt", &events.SnapshotTaken{CoversSeq: 1})
	if a := s.Turn("t1").ActiveAt; !a.Equal(t0.Add(3 * time.Second)) {
		t.Errorf("t1 active at %s, want +3s", a.Sub(t0))
	}
	if a := s.Turn("t2").ActiveAt; !a.Equal(t0.Add(3 * time.Second)) {
		t.Errorf("t2 active at %s, want +3s (the event of no turn)", a.Sub(t0))
	}
	if s.LastRuntimeSeq != 4 {
		t.Errorf("last runtime seq %d, want 4", s.LastRuntimeSeq)
	}
}

// TestSnapshotOfAnotherVersionDoesNotCount: a snapshot.taken of another
// state version names a snapshot Restore refuses, so the state counts as
// never snapshotted (the projector then writes one of its own version at
// once instead of replaying the log at every restore).
func TestSnapshotOfAnotherVersionDoesNotCount(t *testing.T) {
	s := FoldLog(synth(t, 7, 3, false))
	at := s.LastSeq
	for _, c := range []struct {
		version int
		want    uint64
	}{{Version - 1, 0}, {0, 0}, {Version, at}} {
		st := s.Clone()
		ev, err := events.NewAt(s.LastTime, events.NewID(), st.Tenant, st.Session, "", &events.SnapshotTaken{CoversSeq: at, Version: c.version})
		if err != nil {
			t.Fatal(err)
		}
		ev.Seq = at + 1
		st.Apply(ev)
		if st.LastSnapshotSeq != c.want {
			t.Errorf("after a snapshot.taken of version %d: LastSnapshotSeq %d, want %d", c.version, st.LastSnapshotSeq, c.want)
		}
	}
}

// FuzzDeclaredTimeoutMS: the quick answer for an input that cannot name a
// timeout equals what decoding it gives.
func FuzzDeclaredTimeoutMS(f *testing.F) {
	for _, in := range []string{`{"command":"make","timeout":120000}`, `{"TimeOut":4000}`, `{"time\u006fut":7}`,
		`{"timeout_ms":2500.7}`, `{"command":"echo timeout"}`, `{"TIMEOUT_MS":1e300}`, `{"timeout":-1}`, ` {"timeout":5}`, `[]`, ``} {
		f.Add("Bash", in)
		f.Add("shell", in)
	}
	f.Fuzz(func(t *testing.T, name, input string) {
		in := json.RawMessage(input)
		want := int64(0)
		if len(in) > 0 && (in[0] == '{' || isSpace(in[0])) {
			want = declaredTimeoutDecoded(name, in)
		}
		if got := DeclaredTimeoutMS(name, in); got != want {
			t.Fatalf("DeclaredTimeoutMS(%q, %q) = %d, decoding gives %d", name, input, got, want)
		}
	})
}
