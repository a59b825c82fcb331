package test

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/engine"
	"github.com/turnstone-dev/turnstone/internal/pgroup"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// clusterPartitions is the partition count of TestScaleOutOnAThreeNodeCluster:
// 12, so that three workers own four each.
const clusterPartitions = 12

// scaleOutOnAThreeNodeCluster (TestClusterKills/ScaleOutOnAThreeNodeCluster) runs Turnstone as it runs scaled out,
// every part a real process: three nats-server processes in one JetStream
// cluster, `engine setup --replicas 3`, three `engine serve` and three
// `worker` processes sharing the partitions, and the reference runtime
// publishing 200 sessions through the engines (issue 9). It checks that
// every engine and worker owns partitions (`engine members`); that while
// the three workers live each runs between 20% and 47% of the recovery
// commands; that an engine and a worker killed together with SIGKILL
// mid-run hand their partitions to the survivors within the documented
// bound (pgroup: 7 s; the issue's 10 s), the runtime riding through;
// that killing one nats-server keeps everything working; that a fourth
// worker joining takes partitions; that every command ran exactly once and
// in per-session order throughout; that `engine recovery list` reads the
// R3 recovery stream from every live node; and that every session's
// projection equals a fresh fold of its log.
func scaleOutOnAThreeNodeCluster(t *testing.T) {
	skipShort(t, "a 3-node cluster and process kills")
	// Run by TestClusterKills, beside the leader-kill test and the
	// package's other parallel tests: it bounds the handover at 10 s (the
	// group's documented 7 s; 5.4-6.2 s measured there under the race
	// detector, with every other package's tests running too).
	start := time.Now()
	nodes := startNATSCluster(t, 3)
	url := clusterURL(nodes...)
	t.Logf("3 nats-server nodes ready after %s", time.Since(start).Round(time.Millisecond))

	// Setup, as an operator would (the meta leader may still be settling).
	var setup string
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, errOut, err := runErr(url, "setup", "--replicas", "3", "--partitions", fmt.Sprint(clusterPartitions))
		if err == nil {
			setup = out
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("engine setup: %v\n%s", err, errOut)
		}
		time.Sleep(300 * time.Millisecond)
	}
	if !strings.Contains(setup, "3 replicas") {
		t.Fatalf("engine setup: %s", setup)
	}
	_, js, log := connectJS(t, url)
	ctx := context.Background()
	for _, name := range []string{events.EventsStream, recovery.Stream} {
		var st jetstream.Stream
		untilAvailable(t, "stream "+name, func() (err error) {
			st, err = js.Stream(ctx, name)
			return unavailable(err)
		})
		if r := st.CachedInfo().Config.Replicas; r != 3 {
			t.Fatalf("%s: %d replicas, want 3", name, r)
		}
	}

	serve := func(name string) *proc {
		return startProc(t, url, "engine", "serve", "--nats-url", url, "--use-existing", "--name", name,
			"--telemetry-listen", "", "--snapshot-every", "20", "--log-level", "warn")
	}
	engines := map[string]*proc{"e1": serve("e1"), "e2": serve("e2"), "e3": serve("e3")}
	workers := map[string]*exec.Cmd{}
	workerOut := map[string]*syncBuffer{}
	for _, w := range []string{"w1", "w2", "w3"} {
		workers[w], workerOut[w] = startWorker(t, url, w)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name, e := range engines {
				logProcessOutput(t, "engine-"+name, e.errOut.String())
			}
			for name, out := range workerOut {
				logProcessOutput(t, "worker-"+name, out.String())
			}
		}
	})

	// Every engine and every worker owns a share of the partitions.
	owners := waitOwners(t, js, 30*time.Second, func(o map[string]map[string][]int) bool {
		return owns(o[engine.Group], "e1", "e2", "e3") && owns(o[recovery.WorkerGroup], "w1", "w2", "w3") &&
			covers(o[engine.Group], clusterPartitions) && covers(o[recovery.WorkerGroup], clusterPartitions)
	})
	t.Logf("members after %s: %v", time.Since(start).Round(time.Millisecond), owners)
	rep := membersJSON(t, url)
	for _, p := range rep.Partitions {
		if p.Engine == "" || p.Worker == "" {
			t.Fatalf("engine members: partition %d has engine %q, worker %q", p.Partition, p.Engine, p.Worker)
		}
	}

	// Recovery commands while the three workers live: each runs between
	// 20% and 47% of them (issue 9).
	issued := map[string][]string{}
	issueCommands(t, js, log, "ops", "a", 120, 1, issued)
	waitCommandsDone(t, js, issued, 60*time.Second)
	byWorker := commandsByWorker(t, js)
	total := byWorker["w1"] + byWorker["w2"] + byWorker["w3"]
	for _, w := range []string{"w1", "w2", "w3"} {
		if share := float64(byWorker[w]) / float64(total); share < 0.2 || share > 0.47 {
			t.Errorf("worker %s ran %d of %d commands (%.0f%%), want 20-47%%", w, byWorker[w], total, 100*share)
		}
	}
	t.Logf("commands by worker with all three alive: %v", byWorker)

	// The runtime publishes 200 sessions through the engines; commands
	// are being run; one engine and one worker are killed with SIGKILL
	// mid-run.
	rt := startProc(t, url, "refruntime", "--nats-url", url, "--tenant", "cl",
		"--sessions", "200", "--turns", "1", "--tools", "2", "--session-prefix", "a")
	issueCommands(t, js, log, "ops", "b", 24, 3, issued)
	deadline = time.Now().Add(60 * time.Second)
	for streamMsgs(js) < 1200 {
		if rt.exited() {
			t.Fatalf("the runtime ended before the kill; stderr: %s", rt.errOut)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the log holds %d events after 60 s", streamMsgs(js))
		}
		time.Sleep(10 * time.Millisecond)
	}
	victim := engines["e1"]
	if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := workers["w1"].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-victim.done
	killed := time.Now()
	waitOwners(t, js, 10*time.Second, func(o map[string]map[string][]int) bool {
		_, e1 := o[engine.Group]["e1"]
		_, w1 := o[recovery.WorkerGroup]["w1"]
		return !e1 && !w1 && covers(o[engine.Group], clusterPartitions) && covers(o[recovery.WorkerGroup], clusterPartitions)
	})
	handover := time.Since(killed)
	t.Logf("engine e1 and worker w1 killed at %d events; the survivors own all %d partitions %s later", streamMsgs(js), clusterPartitions, handover.Round(time.Millisecond))
	if code := rt.wait(t, 120*time.Second); code != 0 {
		t.Fatalf("runtime: exit %d across the engine's death (its client retries until an engine answers)\n%s", code, rt.errOut)
	}
	waitCommandsDone(t, js, issued, 60*time.Second)

	// One nats-server node killed: the runtime, the engines and the
	// workers go on with the other two.
	nodes[2].kill(t)
	t.Logf("nats-server %s killed after %s", nodes[2].name, time.Since(start).Round(time.Millisecond))
	live := clusterURL(nodes[0], nodes[1])
	// Streams whose leader was on n2 elect another: the log opens again
	// within a few seconds.
	js, log = openLogRetrying(t, live, 20*time.Second)
	rt2 := startProc(t, live, "refruntime", "--nats-url", live, "--tenant", "cl",
		"--sessions", "20", "--turns", "2", "--tools", "1", "--session-prefix", "b")
	issueCommands(t, js, log, "ops", "c", 12, 2, issued)
	if code := rt2.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("runtime with a node down: exit %d\n%s", code, rt2.errOut)
	}
	waitCommandsDone(t, js, issued, 45*time.Second)

	// A fourth worker joins: it takes partitions, and the commands issued
	// after it joined run once each, like every other.
	workers["w4"], workerOut["w4"] = startWorker(t, live, "w4")
	waitOwners(t, js, 20*time.Second, func(o map[string]map[string][]int) bool {
		return owns(o[recovery.WorkerGroup], "w2", "w3", "w4") && covers(o[recovery.WorkerGroup], clusterPartitions)
	})
	issueCommands(t, js, log, "ops", "d", 24, 2, issued)
	waitCommandsDone(t, js, issued, 45*time.Second)
	checkCommandsRanOnce(t, log, issued)

	// recovery list reads the R3 stream from each live node (Fetch, not
	// Next: issue 9).
	want := 0
	for _, ids := range issued {
		want += len(ids)
	}
	for _, n := range nodes[:2] {
		out, errOut, err := runWhileUnavailable(t, n.url, "recovery", "list", "--json")
		if err != nil {
			t.Fatalf("engine recovery list --json on %s: %v\n%s", n.name, err, errOut)
		}
		var rows []commandRow
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatal(err)
		}
		completed := 0
		for _, r := range rows {
			if r.Status.State == recovery.StateCompleted {
				completed++
			}
		}
		if len(rows) != want || completed != want {
			t.Fatalf("recovery list on %s: %d commands, %d completed; want %d, all completed", n.name, len(rows), completed, want)
		}
	}

	// Nothing lost: every session is projected to its last event by the
	// partitions' owner (the fleet index), and each projection equals a
	// fresh fold of its log.
	waitProjectorIdle(t, js)
	got := tenantLog(t, log, "cl")
	checkNoDuplicateIDs(t, got)
	printed := strings.Fields(rt.out.String() + " " + rt2.out.String())
	if len(printed) != 220 || len(got) != 220 {
		t.Fatalf("runtimes printed %d sessions, the log has %d; want 220", len(printed), len(got))
	}
	waitIndexCurrent(t, js, "cl", got, 90*time.Second)
	checkProjectionsEqualReplay(t, live, log, "cl", got)
	t.Logf("done after %s", time.Since(start).Round(time.Millisecond))
}

// owns reports whether each of names owns at least one partition.
func owns(members map[string][]int, names ...string) bool {
	for _, n := range names {
		if len(members[n]) == 0 {
			return false
		}
	}
	return true
}

// commandRow is a row of `engine recovery list --json`.
type commandRow struct {
	Command recovery.Command `json:"command"`
	Seq     uint64           `json:"seq"`
	Status  recovery.Status  `json:"status"`
}

// membersReport is `engine members --json`.
type membersReport struct {
	Members []struct {
		Group, Member string
		Partitions    []int
	} `json:"members"`
	Partitions []struct {
		Partition      int
		Engine, Worker string
	} `json:"partitions"`
}

// membersJSON runs `engine members --json`.
func membersJSON(t *testing.T, url string) membersReport {
	t.Helper()
	out, errOut, err := runWhileUnavailable(t, url, "members", "--json")
	if err != nil {
		t.Fatalf("engine members --json: %v\n%s", err, errOut)
	}
	var rep membersReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	return rep
}

// waitOwners polls the members bucket until ok holds for the live
// members' partitions (group -> member -> partitions), and returns them;
// it fails the test after d.
func waitOwners(t *testing.T, js jetstream.JetStream, d time.Duration, ok func(map[string]map[string][]int) bool) map[string]map[string][]int {
	t.Helper()
	deadline := time.Now().Add(d)
	var o map[string]map[string][]int
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		recs, err := pgroup.List(ctx, js, "", "")
		cancel()
		if err == nil {
			o = map[string]map[string][]int{}
			for _, r := range recs {
				if time.Since(r.Beat) > pgroup.DefaultTTL {
					continue
				}
				if o[r.Group] == nil {
					o[r.Group] = map[string][]int{}
				}
				o[r.Group][r.Member] = r.Partitions
			}
			if ok(o) {
				return o
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("members not as wanted within %s: %v (last error %v)", d, o, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// covers reports whether the members own every one of n partitions
// exactly once.
func covers(members map[string][]int, n int) bool {
	seen := map[int]int{}
	for _, ps := range members {
		for _, p := range ps {
			seen[p]++
		}
	}
	for p := range n {
		if seen[p] != 1 {
			return false
		}
	}
	return len(seen) == n
}

// issueCommands starts sessions <prefix>NN of tenant and issues perSession
// commands to each (pause, resume, ...), round robin over the sessions,
// recording their ids in issued by session.
func issueCommands(t *testing.T, js jetstream.JetStream, log *events.Log, tenant, prefix string, sessions, perSession int, issued map[string][]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for s := range sessions {
		ev, _ := events.New(tenant, fmt.Sprintf("%s%02d", prefix, s), "", &events.SessionStarted{})
		if err := retryUnavailable(ctx, func() error { _, err := log.Append(ctx, []events.Event{ev}); return err }); err != nil {
			t.Fatal(err)
		}
	}
	for i := range perSession {
		for s := range sessions {
			session := fmt.Sprintf("%s%02d", prefix, s)
			kind := recovery.KindPauseSession
			if i%2 == 1 {
				kind = recovery.KindResumeSession
			}
			c := recovery.NewCommand(kind, tenant, session, "", fmt.Sprintf("scale step %d", i), []uint64{uint64(i)})
			err := retryUnavailable(ctx, func() error {
				_, _, err := recovery.Issue(ctx, js, c)
				return err
			})
			if err != nil {
				t.Fatalf("issue %s: %v", c.ID, err)
			}
			issued[session] = append(issued[session], c.ID)
		}
	}
}

// retryUnavailable runs op until it succeeds or ctx ends: while a
// nats-server node has just died, a request can meet a stream whose
// leader is being elected again.
func retryUnavailable(ctx context.Context, op func() error) error {
	for {
		err := op()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitCommandsDone waits until every issued command's status is completed.
func waitCommandsDone(t *testing.T, js jetstream.JetStream, issued map[string][]string, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(d)
	for {
		pending := 0
		var last string
		kv, err := js.KeyValue(ctx, recovery.StatusBucket)
		if err == nil {
			for _, ids := range issued {
				for _, id := range ids {
					e, err := kv.Get(ctx, id)
					var st recovery.Status
					if err == nil {
						_ = json.Unmarshal(e.Value(), &st)
					}
					if st.State != recovery.StateCompleted {
						pending++
						last = fmt.Sprintf("%s: %v %+v", id, err, st)
					}
				}
			}
		}
		if err == nil && pending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d commands not completed within %s (one: %s; error %v)", pending, d, last, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// commandsByWorker counts the completed commands by the worker that ran
// them (the status bucket).
func commandsByWorker(t *testing.T, js jetstream.JetStream) map[string]int {
	t.Helper()
	ctx := context.Background()
	var w jetstream.KeyWatcher
	untilAvailable(t, "watch "+recovery.StatusBucket, func() error {
		kv, err := js.KeyValue(ctx, recovery.StatusBucket)
		if err == nil {
			w, err = kv.WatchAll(ctx)
		}
		return unavailable(err)
	})
	defer w.Stop()
	counts := map[string]int{}
	for e := range w.Updates() {
		if e == nil {
			break
		}
		var st recovery.Status
		if json.Unmarshal(e.Value(), &st) == nil && st.State == recovery.StateCompleted {
			counts[st.Worker]++
		}
	}
	return counts
}

// checkCommandsRanOnce reads each session of issued: every command has
// exactly one attempt, and they completed in the order issued.
func checkCommandsRanOnce(t *testing.T, log *events.Log, issued map[string][]string) {
	t.Helper()
	ctx := context.Background()
	sessions := make([]string, 0, len(issued))
	for s := range issued {
		sessions = append(sessions, s)
	}
	sort.Strings(sessions)
	for _, session := range sessions {
		var done []string
		var attempts map[string]int
		untilAvailable(t, "read "+session, func() error {
			done, attempts = nil, map[string]int{}
			return log.ReadSession(ctx, "ops", session, events.ReadOptions{}, func(ev events.Event) error {
				p, err := ev.Payload()
				if err != nil {
					return err
				}
				switch p := p.(type) {
				case *events.RecoveryCompleted:
					done = append(done, p.CommandID)
				case *events.RecoveryAttempted:
					attempts[p.CommandID]++
				}
				return nil
			})
		})
		if strings.Join(done, " ") != strings.Join(issued[session], " ") {
			t.Errorf("%s: completed %v, want the issue order %v", session, done, issued[session])
		}
		for _, id := range issued[session] {
			if attempts[id] != 1 {
				t.Errorf("%s: command %s attempted %d times, want once", session, id, attempts[id])
			}
		}
	}
}

// waitIndexCurrent waits until the fleet index, which the partitions'
// owners keep, has every session of got at its last event.
func waitIndexCurrent(t *testing.T, js jetstream.JetStream, tenant string, got map[string][]events.Event, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		sums, err := projections.ReadIndex(context.Background(), js, projections.IndexFilter{Tenant: tenant})
		behind := []string{}
		if err == nil {
			at := map[string]projections.Summary{}
			for _, s := range sums {
				at[s.Session] = s
			}
			for session, evs := range got {
				last := evs[len(evs)-1]
				if s := at[session]; s.LastSeq != last.Seq || s.Events != len(evs) {
					behind = append(behind, fmt.Sprintf("%s at %d/%d events, seq %d/%d", session, s.Events, len(evs), s.LastSeq, last.Seq))
				}
			}
			if len(behind) == 0 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("fleet index not current within %s: %v (error %v)", d, behind, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// openLogRetrying connects to url and opens the log, trying again for up
// to d while streams elect new leaders.
func openLogRetrying(t *testing.T, url string, d time.Duration) (jetstream.JetStream, *events.Log) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	from := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		log, err := events.Open(ctx, js, events.Config{UseExisting: true}, nil)
		cancel()
		if err == nil {
			t.Logf("log open again after %s", time.Since(from).Round(time.Millisecond))
			return js, log
		}
		if time.Since(from) > d {
			t.Fatalf("open the log within %s: %v", d, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
