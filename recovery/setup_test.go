package recovery_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/recovery"
)

// consumers reads the partition consumers' configurations.
func consumers(t *testing.T, js jetstream.JetStream, n int) []jetstream.ConsumerConfig {
	t.Helper()
	out := make([]jetstream.ConsumerConfig, n)
	for p := range out {
		c, err := js.Consumer(context.Background(), recovery.Stream, recovery.ConsumerName(p))
		if err != nil {
			t.Fatal(err)
		}
		out[p] = c.CachedInfo().Config
	}
	return out
}

// TestSetupWritesAndCheckOnlyReads: Setup creates with the defaults, keeps
// what it is not asked to change, writes what it is asked, and says what
// it changed; Check returns what is stored, refuses a difference naming
// each setting with both values, and changes nothing.
func TestSetupWritesAndCheckOnlyReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := embeddedtest.Connect(t, embeddedtest.Start(t))

	if _, err := recovery.Check(ctx, js, 2, recovery.DeliveryConfig{}); !errors.Is(err, recovery.ErrNotSetUp) {
		t.Fatalf("check before setup: %v, want ErrNotSetUp", err)
	}
	if err := recovery.CheckSetUp(ctx, js); !errors.Is(err, recovery.ErrNotSetUp) {
		t.Fatalf("CheckSetUp before setup: %v", err)
	}
	log, err := events.Open(ctx, js, events.Config{Partitions: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, changes, err := recovery.Setup(ctx, log, recovery.DeliveryConfig{}); err != nil || len(changes) != 0 {
		t.Fatalf("first setup: changes %v, err %v", changes, err)
	}
	defaults := recovery.DeliveryConfig{}.WithDefaults()
	got, err := recovery.Check(ctx, js, 2, recovery.DeliveryConfig{})
	if err != nil || got != defaults {
		t.Fatalf("check: %s, %v; want %s", got, err, defaults)
	}

	set := recovery.DeliveryConfig{AckWait: 30 * time.Second, MaxDeliver: 2}
	_, changes, err := recovery.Setup(ctx, log, set)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"consumers AGENT_RECOVERY recovery-p0..recovery-p1 ack-wait: 10s -> 30s",
		"consumers AGENT_RECOVERY recovery-p0..recovery-p1 max-deliver: 5 -> 2",
	}
	if strings.Join(changes, "\n") != strings.Join(want, "\n") {
		t.Fatalf("changes:\n%s\nwant:\n%s", strings.Join(changes, "\n"), strings.Join(want, "\n"))
	}
	stored := set.Over(defaults)
	// A setup that is asked nothing keeps them.
	if _, changes, err := recovery.Setup(ctx, log, recovery.DeliveryConfig{}); err != nil || len(changes) != 0 {
		t.Fatalf("setup asked nothing: changes %v, err %v", changes, err)
	}
	before := consumers(t, js, 2)
	for p, c := range before {
		if recovery.DeliveryOf(c) != stored {
			t.Fatalf("consumer %d holds %s, want %s", p, recovery.DeliveryOf(c), stored)
		}
	}

	// Check: agreeing settings pass and return what is stored...
	if got, err := recovery.Check(ctx, js, 2, recovery.DeliveryConfig{MaxDeliver: 2}); err != nil || got != stored {
		t.Fatalf("check agreeing: %s, %v", got, err)
	}
	// ... differing ones are refused, each named with both values.
	_, err = recovery.Check(ctx, js, 2, recovery.DeliveryConfig{AckWait: 10 * time.Second, MaxDeliver: 2, PinnedTTL: time.Second})
	var serr *recovery.SettingsError
	if !errors.As(err, &serr) || !errors.Is(err, events.ErrSettingsDiffer) {
		t.Fatalf("check differing: %v, want a SettingsError", err)
	}
	wantDiffs := []recovery.SettingDiff{
		{Setting: recovery.SettingAckWait, Asked: "10s", Stored: "30s"},
		{Setting: recovery.SettingPinnedTTL, Asked: "1s", Stored: "10s"},
	}
	if fmt.Sprint(serr.Diffs) != fmt.Sprint(wantDiffs) || serr.Asked() != "--ack-wait 10s --pinned-ttl 1s" {
		t.Fatalf("diffs %v (asked %q), want %v", serr.Diffs, serr.Asked(), wantDiffs)
	}
	if !strings.Contains(err.Error(), "ack-wait 30s, asked 10s") {
		t.Fatalf("message: %v", err)
	}
	if after := consumers(t, js, 2); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("check changed the consumers:\n%v\n%v", before, after)
	}

	// A consumer whose contract settings were changed behind setup's back
	// is refused by Check, and setup restores it.
	bent := before[1]
	bent.MaxAckPending = 10
	if _, err := js.UpdateConsumer(ctx, recovery.Stream, bent); err != nil {
		t.Fatal(err)
	}
	if _, err := recovery.Check(ctx, js, 2, recovery.DeliveryConfig{}); !errors.Is(err, events.ErrSettingsDiffer) || !strings.Contains(err.Error(), "max ack pending 10") {
		t.Fatalf("check of a bent consumer: %v", err)
	}
	_, changes, err = recovery.Setup(ctx, log, recovery.DeliveryConfig{})
	if err != nil || len(changes) != 1 || changes[0] != "consumers AGENT_RECOVERY recovery-p1 max ack pending: 10 -> 1" {
		t.Fatalf("setup restoring: %v, %v", changes, err)
	}
	if err := recovery.CheckSetUp(ctx, js); err != nil {
		t.Fatal(err)
	}
}
