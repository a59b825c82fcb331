package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
)

// engineSource is the prefix of the source of every event the engine
// writes itself (snapshot.taken, the reconciler's distillation.skipped).
const engineSource = events.DefaultSource

// logProcessOutput, for a failed test, keeps a process's whole output in
// $TURNSTONE_TEST_ARTIFACTS/<test>/<name>.log (scripts/test sets it, and
// CI keeps the folder) and logs only its last lines, and any line of a
// panic or a fatal error before them, so that the failure's own message
// stays in the part of a long run's output that a reader sees first.
// Without the folder (a go test of one's own) it logs everything.
func logProcessOutput(t *testing.T, name, out string) {
	t.Helper()
	base := os.Getenv("TURNSTONE_TEST_ARTIFACTS")
	if base == "" {
		t.Logf("%s:\n%s", name, out)
		return
	}
	dir := filepath.Join(base, strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))
	file := filepath.Join(dir, name+".log")
	where := " (all of it in " + file + ")"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		where = fmt.Sprintf(" (not kept: %v)", err)
	} else if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
		where = fmt.Sprintf(" (not kept: %v)", err)
	}
	const last = 12
	all := strings.Split(strings.TrimRight(out, "\n"), "\n")
	var shown []string
	if len(all) > last {
		for _, l := range all[:len(all)-last] {
			if strings.HasPrefix(l, "panic:") || strings.HasPrefix(l, "fatal error:") {
				shown = append(shown, l)
			}
		}
		shown = append(shown, fmt.Sprintf("[%d lines before]", len(all)-last))
		all = all[len(all)-last:]
	}
	t.Logf("%s, its last lines%s:\n%s", name, where, strings.Join(append(shown, all...), "\n"))
}

// proc is a command of binDir running as a process.
type proc struct {
	cmd         *exec.Cmd
	out, errOut *syncBuffer
	done        chan struct{} // closed when the process has exited
}

// startProc starts a command from binDir with TURNSTONE_NATS_URL set to
// url, its stdout and stderr kept; it is killed at test end if it still
// runs.
func startProc(t testing.TB, url, name string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, name), args...)
	cmd.Env = append(withoutNATSURL(), "TURNSTONE_NATS_URL="+url)
	p := &proc{cmd: cmd, out: &syncBuffer{}, errOut: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		if !p.exited() {
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// wait waits up to d for the process and returns its exit code (-1 when a
// signal ended it); it fails the test when the process still runs after d.
func (p *proc) wait(t testing.TB, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(d):
		t.Fatalf("%s still running after %s\nstderr: %s", strings.Join(p.cmd.Args, " "), d, p.errOut)
		return 0
	}
}

// exited reports whether the process has exited.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// killEngine kills the engine process with SIGKILL (no shutdown, no
// flush) and waits for it to be gone.
func killEngine(t testing.TB, eng *engineProc) {
	t.Helper()
	if err := eng.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = eng.cmd.Wait()
}

// streamMsgs is how many messages AGENT_EVENTS holds, or 0 when the
// stream does not answer.
func streamMsgs(js jetstream.JetStream) uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, events.EventsStream)
	if err != nil {
		return 0
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0
	}
	return info.State.Msgs
}

// waitProjectorIdle waits until the engine's projector has been handed
// every event of the log and has stopped working: nothing pending, the
// count of unacknowledged deliveries steady, and the log no longer growing
// (the snapshots it writes are events too), so that what a test reads
// next is stable. Deliveries to an engine that was killed stay
// unacknowledged until the consumer's AckWait (a minute) redelivers them;
// the projector has folded their events already (a session's first event
// after a start restores it from the log), so they are not waited for.
func waitProjectorIdle(t testing.TB, js jetstream.JetStream) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(45 * time.Second)
	var last string
	calm := 0
	for {
		state := ""
		st, err := js.Stream(ctx, events.EventsStream)
		if err == nil {
			var info *jetstream.StreamInfo
			var parts []projections.PartitionState
			if info, err = st.Info(ctx); err == nil {
				var log *events.Log
				if log, err = events.Open(ctx, js, events.Config{UseExisting: true}, nil); err == nil {
					parts, err = projections.PartitionStates(ctx, js, "", allPartitions(log.Partitions()))
				}
			}
			if err == nil {
				var pending uint64
				var acks int
				var delivered uint64
				for _, p := range parts {
					pending += p.Pending
					acks += p.AckPending
					delivered = max(delivered, p.Delivered)
				}
				if pending == 0 && delivered == info.State.LastSeq {
					state = fmt.Sprintf("log at seq %d, delivered %d, %d unacknowledged", info.State.LastSeq, delivered, acks)
				} else {
					state = fmt.Sprintf("log at seq %d, delivered %d, %d pending", info.State.LastSeq, delivered, pending)
				}
			}
		}
		if state != "" && state == last && strings.Contains(state, "unacknowledged") {
			if calm++; calm >= 4 {
				return
			}
		} else {
			calm = 0
		}
		last = state
		if time.Now().After(deadline) {
			t.Fatalf("the projector did not catch up with the log within 45s: %s (last error: %v)", state, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// whileUnavailable calls op until it returns anything but
// events.ErrLogUnavailable, for at most 30 s, and returns that (or, after
// 30 s, the last unavailability). Only unavailability is retried: on a
// loaded two-core machine a cluster's stream can take longer than
// Config.Timeout to elect its leader, right after it is created or a node
// is killed, and that says nothing of the log's answers, which the caller
// checks.
func whileUnavailable(t testing.TB, what string, op func() error) error {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := op()
		if !errors.Is(err, events.ErrLogUnavailable) || time.Now().After(deadline) {
			return err
		}
		t.Logf("%s: %v; retrying", what, err)
		time.Sleep(200 * time.Millisecond)
	}
}

// unavailable wraps a JetStream error that means no answer came (a
// timeout, no responders, JetStream not yet available: HTTP-like code
// 503) as events.ErrLogUnavailable, for whileUnavailable to retry it;
// any other error (a stream not found) and nil are returned as they are.
func unavailable(err error) error {
	var apiErr *jetstream.APIError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout), errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, jetstream.ErrJetStreamNotEnabled),
		errors.As(err, &apiErr) && apiErr.Code == 503:
		return fmt.Errorf("%w: %w", events.ErrLogUnavailable, err)
	}
	return err
}

// untilAvailable is whileUnavailable that fails the test on any error.
func untilAvailable(t testing.TB, what string, op func() error) {
	t.Helper()
	if err := whileUnavailable(t, what, op); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// runWhileUnavailable runs `engine args...` (runErr) until it fails for
// anything but JetStream not answering, as its stderr says (the log
// unavailable, events.ErrLogUnavailable's text, or a request that timed
// out or found no responders), for at most 30 s (whileUnavailable).
func runWhileUnavailable(t testing.TB, url string, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut string
	err := whileUnavailable(t, "engine "+strings.Join(args, " "), func() error {
		var err error
		out, errOut, err = runErr(url, args...)
		if err == nil {
			return nil
		}
		for _, unanswered := range []string{events.ErrLogUnavailable.Error(), context.DeadlineExceeded.Error(), nats.ErrNoResponders.Error()} {
			if strings.Contains(errOut, unanswered) {
				return fmt.Errorf("%w: %s", events.ErrLogUnavailable, strings.TrimSpace(errOut))
			}
		}
		return err
	})
	return out, errOut, err
}

// tenantLog reads every event of tenant in stream order, by session.
func tenantLog(t testing.TB, log *events.Log, tenant string) map[string][]events.Event {
	t.Helper()
	var out map[string][]events.Event
	untilAvailable(t, "read the log", func() error {
		out = map[string][]events.Event{}
		return log.ReadAll(context.Background(), events.ReadOptions{}, func(ev events.Event) error {
			if ev.Tenant == tenant {
				out[ev.Session] = append(out[ev.Session], ev)
			}
			return nil
		})
	})
	return out
}

// checkNoDuplicateIDs fails the test for every id stored more than once
// in the sessions' logs.
func checkNoDuplicateIDs(t testing.TB, bySession map[string][]events.Event) {
	t.Helper()
	seen := map[string]uint64{}
	for _, evs := range bySession {
		for _, ev := range evs {
			if first, ok := seen[ev.ID]; ok {
				t.Errorf("id %s stored twice: seq %d and seq %d (%s/%s %s)", ev.ID, first, ev.Seq, ev.Tenant, ev.Session, ev.Type)
				continue
			}
			seen[ev.ID] = ev.Seq
		}
	}
}

// inspectView is what `engine inspect --json` prints for a state: its
// JSON with the promised keys always present.
func inspectView(t testing.TB, s *projections.Session) map[string]any {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"turns", "in_flight", "messages", "violations", "tool_calls", "orphans", "distillations"} {
		if m[k] == nil {
			m[k] = []any{}
		}
	}
	ids := []any{}
	for _, id := range s.OrphanedToolUseIDs() {
		ids = append(ids, id)
	}
	m["orphaned_tool_use_ids"] = ids
	m["status"] = s.Status()
	m["view"] = s.View()
	return m
}

// checkProjectionsEqualReplay checks, for each session, that the state
// the engine serves (`engine inspect --json`: last snapshot plus tail) and
// projections.Restore both equal a fresh fold of every event of the
// session (projections.FoldLog of ReadSession).
func checkProjectionsEqualReplay(t testing.TB, url string, log *events.Log, tenant string, bySession map[string][]events.Event) {
	t.Helper()
	ctx := context.Background()
	store, err := projections.NewSnapshotStore(log.JetStream(), projections.SnapshotConfig{})
	if err != nil {
		t.Fatal(err)
	}
	sessions := make([]string, 0, len(bySession))
	for s := range bySession {
		sessions = append(sessions, s)
	}
	sort.Strings(sessions)
	snapshots := 0
	for _, session := range sessions {
		full := projections.FoldLog(bySession[session])
		want, _ := json.Marshal(full)
		var restored *projections.Session
		err := whileUnavailable(t, "restore "+tenant+"/"+session, func() (err error) {
			restored, err = projections.Restore(ctx, log, store, tenant, session)
			return err
		})
		if err != nil {
			t.Errorf("restore %s/%s: %v", tenant, session, err)
			continue
		}
		if got, _ := json.Marshal(restored); !bytes.Equal(got, want) {
			t.Errorf("%s/%s: Restore (snapshot + tail) differs from a full replay:\n%s", tenant, session, firstDiff(got, want))
		}
		if _, err := store.Latest(ctx, tenant, session); err == nil {
			snapshots++
		}
		out, errOut, err := runWhileUnavailable(t, url, "inspect", tenant+"/"+session, "--json")
		if err != nil {
			t.Errorf("engine inspect %s/%s: %v\n%s", tenant, session, err, errOut)
			continue
		}
		var got map[string]any
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Errorf("engine inspect %s/%s --json: %v", tenant, session, err)
			continue
		}
		wantView := roundTrip(t, inspectView(t, full))
		if !reflect.DeepEqual(got, wantView) {
			g, _ := json.Marshal(got)
			w, _ := json.Marshal(wantView)
			t.Errorf("%s/%s: engine inspect --json differs from a full replay:\n%s", tenant, session, firstDiff(g, w))
		}
	}
	t.Logf("%d sessions of %s: projections equal a full replay (%d restored from a snapshot)", len(sessions), tenant, snapshots)
}

// roundTrip returns v as encoding/json decodes its encoding.
func roundTrip(t testing.TB, v map[string]any) map[string]any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// firstDiff shows where two encodings start to differ.
func firstDiff(got, want []byte) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	from := max(0, i-120)
	cut := func(b []byte) string {
		return string(b[from:min(len(b), i+200)])
	}
	return fmt.Sprintf("at byte %d\n  got:  ...%s\n  want: ...%s", i, cut(got), cut(want))
}

// runOK is run for any testing.TB.
func runOK(t testing.TB, url string, args ...string) string {
	t.Helper()
	out, errOut, err := runErr(url, args...)
	if err != nil {
		t.Fatalf("engine %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// allPartitions is 0..n-1.
func allPartitions(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}
