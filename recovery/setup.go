package recovery

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
)

// The names of the delivery settings, as `engine setup` and `worker` spell
// their flags; SettingDiff.Setting is one of them.
const (
	SettingAckWait    = "ack-wait"
	SettingMaxDeliver = "max-deliver"
	SettingPinnedTTL  = "pinned-ttl"
)

// DeliveryOf returns the delivery settings a partition consumer's
// configuration holds.
func DeliveryOf(c jetstream.ConsumerConfig) DeliveryConfig {
	return DeliveryConfig{AckWait: c.AckWait, MaxDeliver: c.MaxDeliver, PinnedTTL: c.PinnedTTL}
}

// Over returns c with the fields it leaves zero taken from base.
func (c DeliveryConfig) Over(base DeliveryConfig) DeliveryConfig {
	if c.AckWait == 0 {
		c.AckWait = base.AckWait
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = base.MaxDeliver
	}
	if c.PinnedTTL == 0 {
		c.PinnedTTL = base.PinnedTTL
	}
	return c
}

// String is the settings as flags would give them: "ack-wait 10s,
// max-deliver 5, pinned-ttl 10s" (a zero field is left out).
func (c DeliveryConfig) String() string {
	var parts []string
	for _, s := range c.settings() {
		if s.set {
			parts = append(parts, s.name+" "+s.value)
		}
	}
	return strings.Join(parts, ", ")
}

type setting struct {
	name, value string
	set         bool
}

// settings lists c's fields by their setting names, in a fixed order.
func (c DeliveryConfig) settings() []setting {
	return []setting{
		{SettingAckWait, c.AckWait.String(), c.AckWait != 0},
		{SettingMaxDeliver, strconv.Itoa(c.MaxDeliver), c.MaxDeliver != 0},
		{SettingPinnedTTL, c.PinnedTTL.String(), c.PinnedTTL != 0},
	}
}

// SettingDiff is one delivery setting that differs: Setting is its name
// (SettingAckWait, ...), Asked the value the caller gave, Stored the
// value the consumers hold (several, comma-separated, when the partitions'
// consumers disagree).
type SettingDiff struct {
	Setting string
	Asked   string
	Stored  string
}

// SettingsError is Check's refusal: the delivery settings the caller
// asked for are not the ones the partition consumers hold. Only Setup
// (`engine setup`) changes them; Check changes nothing. It wraps
// events.ErrSettingsDiffer.
type SettingsError struct {
	// Consumers names the consumers checked: "AGENT_RECOVERY
	// recovery-p0..recovery-p7".
	Consumers string
	// Diffs lists each setting that differs, in a fixed order.
	Diffs []SettingDiff
}

// Error implements error: "recovery consumers AGENT_RECOVERY
// recovery-p0..recovery-p7 hold ack-wait 10s, asked 30s; ... (engine setup
// is their only writer)".
func (e *SettingsError) Error() string {
	parts := make([]string, len(e.Diffs))
	for i, d := range e.Diffs {
		parts[i] = fmt.Sprintf("%s %s, asked %s", d.Setting, d.Stored, d.Asked)
	}
	return fmt.Sprintf("%s: recovery consumers %s hold %s (engine setup is their only writer)",
		events.ErrSettingsDiffer, e.Consumers, strings.Join(parts, "; "))
}

// Unwrap makes errors.Is(err, events.ErrSettingsDiffer) hold.
func (e *SettingsError) Unwrap() error { return events.ErrSettingsDiffer }

// Asked is the setup that would make the consumers hold what was asked,
// as flags: "--ack-wait 30s --max-deliver 2".
func (e *SettingsError) Asked() string {
	parts := make([]string, len(e.Diffs))
	for i, d := range e.Diffs {
		parts[i] = "--" + d.Setting + " " + d.Asked
	}
	return strings.Join(parts, " ")
}

// consumerRange names the partition consumers 0..partitions-1.
func consumerRange(partitions int) string {
	if partitions == 1 {
		return Stream + " " + ConsumerName(0)
	}
	return fmt.Sprintf("%s %s..%s", Stream, ConsumerName(0), ConsumerName(partitions-1))
}

// Setup creates what the recovery side needs on JetStream, or brings it to
// the settings asked: AGENT_RECOVERY (with the event log's partition count
// and replicas), one consumer per partition (ConsumerConfig) and the
// status bucket. It is `engine setup`'s, the one writer of these settings;
// every other process checks them (Check).
//
// A delivery setting c leaves zero keeps the consumer's value (the default
// for a consumer it creates), so running it again changes nothing unless
// asked; a setting c sets is written. The contract's own settings of the
// consumers (filter, explicit ack, one command pending, the pinned group)
// are always restored. It returns the status bucket and what it changed in
// existing streams and consumers, one "<what> <setting>: <old> -> <new>"
// each (for the audit stream). Errors: an invalid DeliveryConfig; the
// server's refusal of a stream, consumer or bucket (under auth, a role
// without the permission), wrapped with what was being set up.
func Setup(ctx context.Context, log *events.Log, c DeliveryConfig) (jetstream.KeyValue, []string, error) {
	if err := c.Validate(); err != nil {
		return nil, nil, fmt.Errorf("set up recovery: %w", err)
	}
	js := log.JetStream()
	replicas := log.Config().Replicas
	partitions := log.Partitions()
	var changes []string
	want := StreamConfig(partitions, replicas)
	st, err := js.Stream(ctx, Stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		if _, err := js.CreateStream(ctx, want); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil, nil, fmt.Errorf("set up recovery: create stream %s: %w", Stream, err)
		}
	case err != nil:
		return nil, nil, fmt.Errorf("set up recovery: stream %s: %w", Stream, err)
	default:
		have := st.CachedInfo().Config
		diff := events.Changes(have, want)
		if have.MaxAge != want.MaxAge {
			diff = append(diff, fmt.Sprintf("%s max age: %s -> %s", Stream, have.MaxAge, want.MaxAge))
		}
		if len(diff) > 0 {
			if _, err := js.UpdateStream(ctx, want); err != nil {
				return nil, nil, fmt.Errorf("set up recovery: update stream %s: %w", Stream, err)
			}
			changes = append(changes, diff...)
		}
	}
	changed := map[string][]int{} // "ack wait: 10s -> 30s" -> partitions
	var order []string
	for p := 0; p < partitions; p++ {
		cons, err := js.Consumer(ctx, Stream, ConsumerName(p))
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			if _, err := js.CreateConsumer(ctx, Stream, ConsumerConfig(p, c)); err != nil {
				return nil, nil, fmt.Errorf("set up recovery: create consumer %s: %w", ConsumerName(p), err)
			}
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("set up recovery: consumer %s: %w", ConsumerName(p), err)
		}
		have := cons.CachedInfo().Config
		want := ConsumerConfig(p, c.Over(DeliveryOf(have)))
		diff := events.ConsumerChanges(have, want)
		if len(diff) == 0 {
			continue
		}
		if _, err := js.UpdateConsumer(ctx, Stream, want); err != nil {
			return nil, nil, fmt.Errorf("set up recovery: update consumer %s: %w", ConsumerName(p), err)
		}
		for _, d := range diff {
			if changed[d] == nil {
				order = append(order, d)
			}
			changed[d] = append(changed[d], p)
		}
	}
	for _, d := range order {
		ps := changed[d]
		who := consumerRange(partitions)
		if len(ps) < partitions {
			names := make([]string, len(ps))
			for i, p := range ps {
				names[i] = ConsumerName(p)
			}
			who = Stream + " " + strings.Join(names, ",")
		}
		changes = append(changes, "consumers "+who+" "+d)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, StatusBucketConfig(replicas))
	if err != nil {
		return nil, nil, fmt.Errorf("set up recovery: bucket %s: %w", StatusBucket, err)
	}
	return kv, changes, nil
}

// StatusBucketConfig is the status bucket (StatusBucket) with replicas
// replicas: file storage, the latest status of each command, kept
// CommandMaxAge.
func StatusBucketConfig(replicas int) jetstream.KeyValueConfig {
	if replicas < 1 {
		replicas = 1
	}
	return jetstream.KeyValueConfig{
		Bucket:      StatusBucket,
		Description: "Turnstone recovery command statuses",
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		History:     1,
		TTL:         CommandMaxAge,
	}
}

// checkShape reports how partition p's consumer breaks the contract's
// own settings (those no flag sets): its filter, explicit acks, one
// command pending at a time, the pinned_client policy on PriorityGroup.
func checkShape(p int, have jetstream.ConsumerConfig) error {
	want := ConsumerConfig(p, DeliveryOf(have))
	var bad []string
	if have.FilterSubject != want.FilterSubject {
		bad = append(bad, fmt.Sprintf("filter subject %q (want %q)", have.FilterSubject, want.FilterSubject))
	}
	if have.AckPolicy != want.AckPolicy {
		bad = append(bad, fmt.Sprintf("ack policy %s (want %s)", have.AckPolicy, want.AckPolicy))
	}
	if have.MaxAckPending != want.MaxAckPending {
		bad = append(bad, fmt.Sprintf("max ack pending %d (want %d: a session's commands run one at a time)", have.MaxAckPending, want.MaxAckPending))
	}
	if have.PriorityPolicy != want.PriorityPolicy || !slices.Equal(have.PriorityGroups, want.PriorityGroups) {
		bad = append(bad, fmt.Sprintf("priority policy %s on groups %v (want pinned_client on %v)", priorityName(have.PriorityPolicy), have.PriorityGroups, want.PriorityGroups))
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("%w: consumer %s %s has %s; run engine setup to restore it", events.ErrSettingsDiffer, Stream, ConsumerName(p), strings.Join(bad, ", "))
}

// Check reads the partition consumers of AGENT_RECOVERY (partitions of
// them) and returns the delivery settings they hold (partition 0's; the
// others normally hold the same). It writes nothing: it is how a worker,
// which may not change them, learns them.
//
// Each setting asked sets (non-zero) must be the one every consumer holds;
// otherwise the error is a *SettingsError naming each difference. Errors
// also: ErrNotSetUp (wrapped) when the stream or a consumer does not
// exist; events.ErrSettingsDiffer when a consumer breaks the contract's
// own settings (checkShape); JetStream's errors as they are.
func Check(ctx context.Context, js jetstream.JetStream, partitions int, asked DeliveryConfig) (DeliveryConfig, error) {
	if err := asked.Validate(); err != nil {
		return DeliveryConfig{}, fmt.Errorf("check recovery consumers: %w", err)
	}
	st, err := js.Stream(ctx, Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return DeliveryConfig{}, fmt.Errorf("check recovery consumers: %w: stream %s does not exist (an operator creates it: engine setup)", ErrNotSetUp, Stream)
	}
	if err != nil {
		return DeliveryConfig{}, fmt.Errorf("check recovery consumers: stream %s: %w", Stream, err)
	}
	var stored DeliveryConfig
	held := make([][]string, 3) // per setting, the distinct values held
	for p := 0; p < partitions; p++ {
		cons, err := st.Consumer(ctx, ConsumerName(p))
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return DeliveryConfig{}, fmt.Errorf("check recovery consumers: %w: consumer %s %s does not exist (an operator creates it: engine setup)", ErrNotSetUp, Stream, ConsumerName(p))
		}
		if err != nil {
			return DeliveryConfig{}, fmt.Errorf("check recovery consumers: consumer %s: %w", ConsumerName(p), err)
		}
		have := cons.CachedInfo().Config
		if err := checkShape(p, have); err != nil {
			return DeliveryConfig{}, fmt.Errorf("check recovery consumers: %w", err)
		}
		d := DeliveryOf(have)
		if p == 0 {
			stored = d
		}
		for i, s := range d.settings() {
			if !slices.Contains(held[i], s.value) {
				held[i] = append(held[i], s.value)
			}
		}
	}
	serr := &SettingsError{Consumers: consumerRange(partitions)}
	for i, s := range asked.settings() {
		if s.set && (len(held[i]) != 1 || held[i][0] != s.value) {
			serr.Diffs = append(serr.Diffs, SettingDiff{Setting: s.name, Asked: s.value, Stored: strings.Join(held[i], ", ")})
		}
	}
	if len(serr.Diffs) > 0 {
		return stored, serr
	}
	return stored, nil
}

// priorityName is a priority policy as JetStream spells it (ADR-42).
func priorityName(p jetstream.PriorityPolicy) string {
	switch p {
	case jetstream.PriorityPolicyNone:
		return "none"
	case jetstream.PriorityPolicyPinned:
		return "pinned_client"
	case jetstream.PriorityPolicyOverflow:
		return "overflow"
	}
	return fmt.Sprintf("policy %d", int(p))
}
