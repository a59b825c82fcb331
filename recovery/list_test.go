package recovery_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/recovery"
)

// TestListJoinsCommandsAndStatuses: every stored command in stream order
// with its status (pending when none); a body that is not a command and a
// status that cannot be read are listed with why, hiding nothing else;
// PendingCommands counts what each partition's consumer holds.
func TestListJoinsCommandsAndStatuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := embeddedtest.Connect(t, embeddedtest.Start(t))
	if _, err := recovery.List(ctx, js); !errors.Is(err, recovery.ErrNotSetUp) {
		t.Fatalf("list before setup: %v", err)
	}
	log, err := events.Open(ctx, js, events.Config{Partitions: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kv, _, err := recovery.Setup(ctx, log, recovery.DeliveryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	a := recovery.NewCommand(recovery.KindPauseSession, "acme", "s1", "", "first", []uint64{1})
	b := recovery.NewCommand(recovery.KindResumeSession, "acme", "s2", "", "second", []uint64{2})
	c := recovery.NewCommand(recovery.KindPauseSession, "acme", "s3", "", "third", []uint64{3})
	for _, cmd := range []recovery.Command{a, b} {
		if _, _, err := recovery.Issue(ctx, js, cmd); err != nil {
			t.Fatal(err)
		}
	}
	// A body that is no command (a duplicate member name, which the
	// strict decoder refuses), then a third command.
	if _, err := js.Publish(ctx, recovery.CommandSubject("acme", "bad"), []byte(`{"id":"x","id":"y"}`)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := recovery.Issue(ctx, js, c); err != nil {
		t.Fatal(err)
	}
	done := recovery.Status{ID: a.ID, Kind: a.Kind, Tenant: "acme", Session: "s1", State: recovery.StateCompleted, Outcome: events.OutcomeRecovered, Attempts: 1, UpdatedAt: time.Now().UTC()}
	body, err := json.Marshal(done)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, a.ID, body); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, c.ID, []byte("not json")); err != nil {
		t.Fatal(err)
	}

	got, err := recovery.List(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 {
		t.Fatalf("%d entries, want 4: %+v", len(got), got)
	}
	if got[0].Command.ID != a.ID || got[0].Status.State != recovery.StateCompleted || got[0].Status.Outcome != events.OutcomeRecovered || got[0].Seq != 1 {
		t.Fatalf("first: %+v", got[0])
	}
	if got[1].Command.ID != b.ID || got[1].Status.State != recovery.StatePending || got[1].Invalid != "" {
		t.Fatalf("second: %+v", got[1])
	}
	if got[2].Invalid == "" || !strings.Contains(got[2].Invalid, "duplicate") || got[2].Command.Tenant != "acme" || got[2].Command.Session != "bad" || got[2].Seq != 3 {
		t.Fatalf("the bad body: %+v", got[2])
	}
	if got[3].Command.ID != c.ID || !strings.Contains(got[3].Invalid, "status unreadable") || got[3].Status.State != recovery.StatePending {
		t.Fatalf("the unreadable status: %+v", got[3])
	}

	pending, err := recovery.PendingCommands(ctx, js, []int{0, 1, 7})
	if err != nil {
		t.Fatal(err)
	}
	if pending[0]+pending[1] != 4 {
		t.Fatalf("pending %v, want 4 in all", pending)
	}
	if _, ok := pending[7]; ok {
		t.Fatalf("a partition without a consumer is counted: %v", pending)
	}
}
