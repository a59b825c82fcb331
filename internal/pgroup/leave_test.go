package pgroup

import (
	"context"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
)

// TestLeaveDoesNotWaitForTheWatchConsumerDelete: stopping the member's KV
// watch deletes its ephemeral consumer with a request that, when nobody
// answers (the consumer sat on a node that is gone), waits out its
// timeout, 5 s. Leave must not wait for it: its partitions would stay
// held by a member that no longer acts on them (seen in the leader-kill
// test: every engine and worker stopped after a node loss took 5 s or
// more). Here the member's user may not delete consumers, so the delete
// request is never answered, as after a node loss.
func TestLeaveDoesNotWaitForTheWatchConsumerDelete(t *testing.T) {
	t.Parallel()
	_, js := embeddedtest.ConnectDenied(t, "$JS.API.CONSUMER.DELETE.>")
	ctx := context.Background()
	a := newActing(t)
	m, err := Join(ctx, js, a.config("a", 4), nil)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the member holds its partitions", 5*time.Second, func() bool { return a.counts()["a"] == 4 })
	lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	start := time.Now()
	if err := m.Leave(lctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Leave took %s: it waited for the watch consumer's delete (a 5 s request timeout)", took)
	}
	if n := a.counts()["a"]; n != 0 {
		t.Errorf("after Leave the member still acts on %d partitions", n)
	}
	// The listing stops its watch the same way.
	start = time.Now()
	if _, err := List(lctx, js, "", "engines"); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("List took %s: it waited for the watch consumer's delete", took)
	}
}
