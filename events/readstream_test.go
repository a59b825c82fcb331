package events_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
)

// TestReadStreamOnAReplicatedStream reads a whole R3 stream on a 3-node
// cluster in many small batches (every batch a new ephemeral consumer,
// which is where an ordered consumer's Next fails on R3, issue 9), from a
// client of each node: every message once, in order. A callback's error
// stops the read and comes back as it is.
func TestReadStreamOnAReplicatedStream(t *testing.T) {
	t.Parallel()
	servers := embeddedtest.StartCluster(t, 3)
	// Generous: under a loaded CI machine (the race detector, other
	// packages' clusters) the three servers' elections and consumer
	// creations slow down by an order of magnitude.
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	_, js := embeddedtest.Connect(t, servers[0])
	var st jetstream.Stream
	var err error
	for {
		// Each try on a deadline of its own: a request the cluster does
		// not answer (its meta leader still being elected) would
		// otherwise wait out the whole test's (CI, once: 150 s).
		tctx, tcancel := context.WithTimeout(ctx, 5*time.Second)
		st, err = js.CreateStream(tctx, jetstream.StreamConfig{Name: "RS", Subjects: []string{"rs.>"}, Replicas: 3})
		tcancel()
		if err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond) // the meta leader may still be elected
	}
	if err != nil {
		t.Fatal(err)
	}
	const n = 300
	for i := range n {
		// A stream just created may answer no one for a while (its
		// leader's interest reaching this server; CI under load, once:
		// "no response from stream" after nats.go's default two
		// retries): up to 40 tries, 250 ms apart.
		if _, err := js.Publish(ctx, fmt.Sprintf("rs.%d", i%7), []byte(strconv.Itoa(i)), jetstream.WithRetryAttempts(40)); err != nil {
			t.Fatal(err)
		}
	}
	for node, s := range servers {
		_, js := embeddedtest.Connect(t, s)
		st, err := js.Stream(ctx, "RS")
		if err != nil {
			t.Fatal(err)
		}
		next := 0
		err = events.ReadStream(ctx, st, jetstream.OrderedConsumerConfig{}, 25, func(msg jetstream.Msg) error {
			if got := string(msg.Data()); got != strconv.Itoa(next) {
				return fmt.Errorf("message %d is %q", next, got)
			}
			next++
			return nil
		})
		if err != nil {
			t.Fatalf("node %d: %v (read %d of %d)", node, err, next, n)
		}
		if next != n {
			t.Fatalf("node %d: read %d of %d messages", node, next, n)
		}
	}
	stop := errors.New("stop")
	calls := 0
	err = events.ReadStream(ctx, st, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"rs.3"}}, 10, func(jetstream.Msg) error {
		calls++
		if calls == 15 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || calls != 15 {
		t.Fatalf("callback error: got %v after %d calls", err, calls)
	}
}
