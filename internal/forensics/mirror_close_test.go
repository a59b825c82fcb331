package forensics

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/projections"
)

// TestMirrorCloseDoesNotWaitForTheConsumerDelete: Close ends the watch
// at once, not after the request that deletes its consumer, which waits
// out its timeout (5 s) when nobody answers it (the consumer sat on a
// node that is gone: an engine stopping after a node loss took 5 s
// more). Here the user may not delete consumers, so that request is
// never answered.
func TestMirrorCloseDoesNotWaitForTheConsumerDelete(t *testing.T) {
	t.Parallel()
	_, js := embeddedtest.ConnectDenied(t, "$JS.API.CONSUMER.DELETE.>")
	ctx := context.Background()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: projections.IndexBucket}); err != nil {
		t.Fatal(err)
	}
	f, err := OpenIndexMirror(ctx, js, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := f.Ready(rctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	f.Close()
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Close took %s: it waited for the watch consumer's delete (a 5 s request timeout)", took)
	}
}
