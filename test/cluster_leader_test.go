package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/internal/cli"
	"github.com/turnstone-dev/turnstone/internal/pgroup"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// leaderPartitions is the partition count of the leader-kill test: two
// engines and two workers own three each.
const leaderPartitions = 6

// leaderTurnDeadline is the reconciler's turn deadline in the leader-kill
// test (its policy file).
const leaderTurnDeadline = 4 * time.Second

// leaderKillKeepsOneOwnerPerPartition (TestClusterKills/LeaderKillKeepsOneOwnerPerPartition) kills, with SIGKILL, the
// nats-server node that leads a stream Turnstone cannot do without, on a
// real 3-node cluster (nats-server built from go.mod's version), while
// two engines and two workers share six partitions, a ingestPublisher appends
// through the engines (plain and conditional, single events and atomic
// batches: 200 events/s), and the reference runtime records sessions
// whose last turn crashes mid-tool (issue 21). Two runs on one cluster:
// the node leading AGENT_EVENTS, with every process connecting without
// credentials (the cluster's no_auth_user is the operator: one account,
// every permission, as without auth); then, that node back, the node
// leading the members bucket, with every process connecting as its role
// (engine, worker, the tenant acme: docs/security.md).
//
// Every 100 ms it samples the members bucket (the records of live
// members) and each engine's and worker's /metrics (the fencing token of
// each partition it holds), and checks that no two members own one
// partition at any sampled moment. Afterwards: every event the ingestPublisher
// was acknowledged is stored once, at its acknowledged sequence, and no
// id twice; every session's projection (Restore: snapshot + tail) and its
// fleet index row equal a fresh fold of its log; every crashed session
// is repaired (its turn abandoned, its orphaned tool_use answered) within
// the turn deadline plus the documented handover bound; no abandon_turn
// or pivot_strategy names a turn that had ended when it was issued; every
// runtime exits 0 (a resend is never refused); and, with auth, no role
// needed a subject its permissions deny.
func leaderKillKeepsOneOwnerPerPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process cluster test")
	}
	// Run by TestClusterKills, beside the scale-out test and the package's
	// other parallel tests: it bounds each repair by the deadline plus the
	// handover it measured, so a slower machine widens the bound.
	start := time.Now()
	c := startLeaderCluster(t)
	t.Logf("3 nats-server nodes with accounts, and setup, after %s", time.Since(start).Round(time.Millisecond))
	t.Run("AGENT_EVENTS leader, without credentials", func(t *testing.T) {
		c.leaderKill(t, events.EventsStream, "KV_"+pgroup.DefaultBucket, false, "open", "ev")
	})
	c.restartKilled(t)
	t.Run("members bucket leader, with the roles' credentials", func(t *testing.T) {
		c.leaderKill(t, "KV_"+pgroup.DefaultBucket, events.EventsStream, true, "acme", "mb")
	})
	t.Logf("done after %s", time.Since(start).Round(time.Millisecond))
}

// leaderCluster is the cluster of TestLeaderKillKeepsOneOwnerPerPartition.
type leaderCluster struct {
	nodes  []*natsNode
	url    string
	spec   string // the auth spec
	creds  string // its credentials directory
	policy string
	js     jetstream.JetStream // the operator's
	log    *events.Log
	killed *natsNode
}

// startLeaderCluster starts three nodes whose accounts are `engine auth
// config`'s for the tenant acme, with the operator as no_auth_user, and
// runs `engine setup --replicas 3`.
func startLeaderCluster(t *testing.T) *leaderCluster {
	t.Helper()
	dir := t.TempDir()
	c := &leaderCluster{spec: filepath.Join(dir, "auth.yaml"), creds: filepath.Join(dir, "credentials"), policy: filepath.Join(dir, "policy.yaml")}
	if err := os.WriteFile(c.spec, fmt.Appendf(nil, "tenants: [acme]\npartitions: %d\ncredentials: ./credentials\n", leaderPartitions), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.policy, fmt.Appendf(nil, "turn_deadline: %s\ntool_deadline: %s\n", leaderTurnDeadline, leaderTurnDeadline), 0o600); err != nil {
		t.Fatal(err)
	}
	accounts := filepath.Join(dir, "accounts.conf")
	if _, errOut, err := runErr("", "auth", "config", c.spec, "-o", accounts); err != nil {
		t.Fatalf("engine auth config: %v\n%s", err, errOut)
	}
	conf, err := os.ReadFile(accounts)
	if err != nil {
		t.Fatal(err)
	}
	seed, err := os.ReadFile(filepath.Join(c.creds, "operator.nk"))
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.FromSeed(bytes.TrimSpace(seed))
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	c.nodes = startNATSClusterWith(t, 3, fmt.Sprintf("%s\nno_auth_user: %s\n", conf, pub))
	c.url = clusterURL(c.nodes...)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, errOut, err := runErr(c.url, "setup", "--replicas", "3", "--partitions", strconv.Itoa(leaderPartitions))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("engine setup: %v\n%s", err, errOut)
		}
		time.Sleep(300 * time.Millisecond)
	}
	_, c.js, c.log = connectJS(t, c.url)
	return c
}

// nkeyArgs are the flags of user's seed, under auth.
func (c *leaderCluster) nkeyArgs(auth bool, user string) []string {
	if !auth {
		return nil
	}
	return []string{"--nkey", filepath.Join(c.creds, user+".nk")}
}

// leaderOf returns the node that leads stream.
func (c *leaderCluster) leaderOf(t *testing.T, stream string) *natsNode {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := c.js.Stream(ctx, stream)
		var leader string
		if err == nil {
			var info *jetstream.StreamInfo
			if info, err = st.Info(ctx); err == nil && info.Cluster != nil {
				leader = info.Cluster.Leader
			}
		}
		cancel()
		for _, n := range c.nodes {
			if n.name == leader && n != c.killed {
				return n
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no leader of %s within 20s (last error %v)", stream, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// apart makes the leaders of target and other two different nodes (so the
// kill of target's leader is that of one stream only), stepping other's
// leader down a few times if they share one.
func (c *leaderCluster) apart(t *testing.T, target, other string) {
	t.Helper()
	for range 4 {
		if c.leaderOf(t, target) != c.leaderOf(t, other) {
			return
		}
		_, _ = c.js.Conn().Request("$JS.API.STREAM.LEADER.STEPDOWN."+other, nil, 5*time.Second)
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("the leaders of %s and %s stay on one node: its kill is both", target, other)
}

// restartKilled starts the killed node again and waits until it is
// current in every stream again.
func (c *leaderCluster) restartKilled(t *testing.T) {
	t.Helper()
	n := c.killed
	if n == nil {
		return
	}
	n.start(t)
	deadline := time.Now().Add(45 * time.Second)
	for {
		behind := c.behind(n.name)
		if behind == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not current within 45s after its restart: %s\n%s", n.name, behind, n.out)
		}
		time.Sleep(250 * time.Millisecond)
	}
	c.killed = nil
}

// behind names a stream whose replica on node is not current, or "".
func (c *leaderCluster) behind(node string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	names := c.js.StreamNames(ctx)
	var all []string
	for name := range names.Name() {
		all = append(all, name)
	}
	if names.Err() != nil {
		return names.Err().Error()
	}
	for _, name := range all {
		st, err := c.js.Stream(ctx, name)
		if err != nil {
			return name + ": " + err.Error()
		}
		info, err := st.Info(ctx)
		if err != nil {
			return name + ": " + err.Error()
		}
		if info.Cluster == nil {
			continue
		}
		if info.Cluster.Leader == node {
			continue
		}
		found := false
		for _, r := range info.Cluster.Replicas {
			if r.Name == node {
				found = true
				if !r.Current {
					return name
				}
			}
		}
		if !found {
			return name + " (no replica there yet)"
		}
	}
	return ""
}

// leaderKill is one run: engines, workers, ingestPublisher and runtimes of
// tenant, then the SIGKILL of the node that leads target, then the
// checks.
func (c *leaderCluster) leaderKill(t *testing.T, target, other string, auth bool, tenant, prefix string) {
	runStart := time.Now()
	c.apart(t, target, other)
	type member struct {
		name, group, metrics string
		p                    *proc
	}
	var members []*member
	for i := 1; i <= 2; i++ {
		name := fmt.Sprintf("%s-e%d", prefix, i)
		port := freePort(t)
		args := []string{"serve", "--nats-url", c.url, "--use-existing", "--name", name, "--telemetry-listen", fmt.Sprintf("127.0.0.1:%d", port),
			"--policy", c.policy, "--snapshot-every", "10", "--log-level", "info"}
		if auth {
			args = append(args, "--auth", c.spec)
		}
		members = append(members, &member{name: name, group: projections.EngineGroup, metrics: fmt.Sprintf("http://127.0.0.1:%d/metrics", port),
			p: startProc(t, c.url, "engine", args...)})
	}
	for i := 1; i <= 2; i++ {
		name := fmt.Sprintf("%s-w%d", prefix, i)
		port := freePort(t)
		args := append([]string{"--nats-url", c.url, "--use-existing", "--name", name, "--telemetry-listen", fmt.Sprintf("127.0.0.1:%d", port),
			"--control-timeout", "2s", "--log-level", "info"}, c.nkeyArgs(auth, "worker")...)
		members = append(members, &member{name: name, group: recovery.WorkerGroup, metrics: fmt.Sprintf("http://127.0.0.1:%d/metrics", port),
			p: startProc(t, c.url, "worker", args...)})
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, m := range members {
				logProcessOutput(t, m.name, m.p.errOut.String())
			}
		}
		for _, m := range members {
			_ = m.p.cmd.Process.Signal(syscall.SIGTERM)
		}
		for _, m := range members {
			select {
			case <-m.p.done:
			case <-time.After(15 * time.Second):
			}
		}
	})
	// Every partition held by the live members of each group.
	covered := func() bool {
		held := map[string]map[int]bool{}
		for _, m := range members {
			if m.p.exited() {
				continue
			}
			leases, err := fetchLeases(m.metrics, m.group)
			if err != nil {
				return false
			}
			if held[m.group] == nil {
				held[m.group] = map[int]bool{}
			}
			for p := range leases {
				held[m.group][p] = true
			}
		}
		return len(held[projections.EngineGroup]) == leaderPartitions && len(held[recovery.WorkerGroup]) == leaderPartitions
	}
	waitUntil(t, "engines and workers hold every partition", 30*time.Second, covered)
	t.Logf("engines and workers hold every partition after %s", time.Since(runStart).Round(time.Millisecond))

	// The sampler: every 100 ms, the bucket and every /metrics.
	s := &sampler{js: c.js, tokens: map[string]map[int]uint64{}}
	for _, m := range members {
		s.members = append(s.members, sampled{name: m.name, group: m.group, url: m.metrics})
	}
	s.start()
	defer s.stop()

	// The ingestPublisher, through the engines, with the tenant's credentials.
	pubOpts, err := cli.ClientConfig{Nkey: c.nkeyPath(auth, "acme")}.Options()
	if err != nil {
		t.Fatal(err)
	}
	pnc, err := nats.Connect(c.url, pubOpts...)
	if err != nil {
		t.Fatal(err)
	}
	defer pnc.Close()
	pub := startIngestPublisher(t, pnc, tenant, prefix+"-pub", 10)
	defer pub.stop()

	runtime := func(p string) *proc {
		return startProc(t, c.url, "refruntime", append([]string{"--nats-url", c.url, "--tenant", tenant, "--sessions", "8", "--turns", "2",
			"--tools", "1", "--fault", "crash-mid-tool", "--session-prefix", prefix + p}, c.nkeyArgs(auth, "acme")...)...)
	}
	rt1 := runtime("a")
	if code := rt1.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("runtime before the kill: exit %d\n%s", code, rt1.errOut)
	}

	// The kill, and a runtime recording through the window.
	victim := c.leaderOf(t, target)
	alsoLeads := c.leaderOf(t, other) == victim
	victim.kill(t)
	killed := time.Now()
	c.killed = victim
	s.mark(killed)
	elected := make(chan time.Duration, 1)
	go func() { elected <- c.electedAgain(victim.name, killed) }()
	t.Logf("SIGKILLed %s, the leader of %s (also of %s: %v), %s into the run, at %d events",
		victim.name, target, other, alsoLeads, killed.Sub(runStart).Round(time.Millisecond), pub.acked())
	rt2 := runtime("b")
	waitUntil(t, "every partition held again after the kill", 30*time.Second, func() bool {
		for _, m := range members {
			if _, err := fetchLeases(m.metrics, m.group); err != nil {
				return false
			}
		}
		return covered()
	})
	t.Logf("every partition held again %s after the kill", time.Since(killed).Round(time.Millisecond))
	if code := rt2.wait(t, 90*time.Second); code != 0 {
		t.Fatalf("runtime through the kill: exit %d (a resend must never be refused)\n%s", code, rt2.errOut)
	}
	// The ingestPublisher goes on a moment after the window, then stops.
	at := pub.acked()
	waitUntil(t, "the ingestPublisher stored events after the window", 30*time.Second, func() bool { return pub.acked() >= at+200 })
	pub.stop()
	if err := pub.err(); err != nil {
		t.Fatalf("ingestPublisher: %v", err)
	}
	t.Logf("ingestPublisher: %d events acknowledged, %d resends answered as duplicates", pub.acked(), pub.dups())

	sessions := append(strings.Fields(rt1.out.String()), strings.Fields(rt2.out.String())...)
	if len(sessions) != 16 {
		t.Fatalf("runtimes printed %d sessions, want 16", len(sessions))
	}
	// A session that crashed at c is repaired once its deadline passed
	// and its partition's engine and worker, and the streams, work again:
	// within the deadline plus the handover (the member handover bound,
	// or longer when the node's death made JetStream elect leaders for
	// longer) plus the two commands' run.
	var worst time.Duration
	var slowest, waiting string
	deadline := time.Now().Add(60 * time.Second)
	for {
		worst, waiting = 0, ""
		for _, session := range sessions {
			took, ok := repairTime(t, c.log, tenant, session)
			if !ok {
				waiting = session
				break
			}
			if took > worst {
				worst, slowest = took, session
			}
		}
		if waiting == "" {
			break
		}
		if time.Now().After(deadline) {
			_ = c.log.ReadSession(context.Background(), tenant, waiting, events.ReadOptions{}, func(ev events.Event) error {
				t.Logf("  not repaired: %s seq %d %s turn %s source %s", ev.Stored.Format("15:04:05.000"), ev.Seq, ev.Type, ev.Turn, ev.Source)
				return nil
			})
			if states, err := projections.PartitionStates(context.Background(), c.js, "", allPartitions(leaderPartitions)); err == nil {
				t.Logf("projector consumers: %+v (the session's partition: %d)", states, events.Partition(tenant, waiting, leaderPartitions))
			}
			if sums, err := projections.ReadIndex(context.Background(), c.js, projections.IndexFilter{Tenant: tenant}); err == nil {
				for _, sum := range sums {
					if sum.Session == waiting {
						t.Logf("index row: %+v", sum)
					}
				}
			}
			for _, m := range members {
				for _, line := range strings.Split(m.p.errOut.String(), "\n") {
					if strings.Contains(line, waiting) || strings.Contains(line, "partition=") || strings.Contains(line, "scan") || strings.Contains(line, "failed closed") || strings.Contains(line, "writable again") {
						t.Logf("%s: %s", m.name, line)
					}
				}
			}
			t.Fatalf("%s/%s not repaired within 60s; its commands: %s", tenant, waiting, commandsOf(t, c.js, tenant, waiting))
		}
		time.Sleep(250 * time.Millisecond)
	}
	election := <-elected
	_, _, _, memberHandover, _ := s.report()
	handover := max(pgroup.DefaultTTL+2*pgroup.DefaultHeartbeat, election, memberHandover)
	repairBound := leaderTurnDeadline + handover + 5*time.Second
	t.Logf("after the kill: every stream and partition consumer led again in %s; every partition held again in %s",
		election.Round(time.Millisecond), memberHandover.Round(time.Millisecond))
	if testing.Verbose() {
		_ = c.log.ReadSession(context.Background(), tenant, slowest, events.ReadOptions{}, func(ev events.Event) error {
			t.Logf("  slowest: %s seq %d %s turn %s source %s", ev.Stored.Format("15:04:05.000"), ev.Seq, ev.Type, ev.Turn, ev.Source)
			return nil
		})
	}
	t.Logf("every crashed session repaired; the slowest %s after its crash (bound: deadline %s + handover %s + commands %s)",
		worst.Round(time.Millisecond), leaderTurnDeadline, handover.Round(time.Millisecond), 5*time.Second)
	if worst > repairBound {
		t.Errorf("a crashed session took %s to be repaired, over %s", worst, repairBound)
	}
	s.stop()

	// The checks, once the log has settled: a repair is seen at the
	// turn's end, but the worker and engine go on to record the
	// command's remaining events (a snapshot.taken, an orphan's result)
	// a moment later, and a fold of a log read before them would differ
	// from a Restore read after them.
	waitLogSettled(t, c.js, 2*time.Second, 30*time.Second)
	got := tenantLog(t, c.log, tenant)
	checkNoDuplicateIDs(t, got)
	pub.check(t, got)
	checkFreshFold(t, c.log, c.js, tenant, got)
	checkNoCommandNamesAnEndedTurn(t, c.js, tenant, got)
	samples, misses, overlaps, _, held := s.report()
	t.Logf("%d samples (%d with the bucket unreadable); %s", samples, misses, held)
	for _, o := range overlaps {
		t.Errorf("two owners: %s", o)
	}
	for _, m := range members {
		if m.p.exited() {
			t.Errorf("%s exited during the run:\n%s", m.name, tail(m.p.errOut.String(), 2000))
		}
		body, err := httpGetBody(m.metrics)
		if err == nil {
			t.Logf("%s: pin moves %s, snapshot disagreements %s", m.name,
				metricValue(body, "turnstone_partition_pin_moves_total"), metricValue(body, "turnstone_snapshot_disagreements_total"))
		}
		for _, line := range strings.Split(m.p.errOut.String(), "\n") {
			if strings.Contains(line, "disagrees with the log") {
				t.Logf("%s: %s", m.name, line)
			}
		}
	}
	if auth {
		for _, n := range c.nodes {
			for _, line := range strings.Split(n.out.String(), "\n") {
				if strings.Contains(line, "Violation") {
					t.Errorf("%s: a role was refused a subject: %s", n.name, line)
				}
			}
		}
	}
}

// electedAgain waits until every stream, and every partition's projector
// and recovery consumer, has a leader other than the killed node, and
// returns how long after the kill that was (at most 60 s).
func (c *leaderCluster) electedAgain(killed string, at time.Time) time.Duration {
	led := func(cl *jetstream.ClusterInfo) bool { return cl != nil && cl.Leader != "" && cl.Leader != killed }
	for time.Since(at) < time.Minute {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		names := c.js.StreamNames(ctx)
		var all []string
		for n := range names.Name() {
			all = append(all, n)
		}
		ok := names.Err() == nil && len(all) > 0
		for _, n := range all {
			if !ok {
				break
			}
			st, err := c.js.Stream(ctx, n)
			if err != nil {
				ok = false
				break
			}
			info, err := st.Info(ctx)
			ok = err == nil && led(info.Cluster)
		}
		for p := 0; ok && p < leaderPartitions; p++ {
			for _, sc := range [][2]string{{events.EventsStream, projections.ProjectorConsumerName("", p)}, {recovery.Stream, recovery.ConsumerName(p)}} {
				cons, err := c.js.Consumer(ctx, sc[0], sc[1])
				if err != nil {
					ok = false
					break
				}
				info, err := cons.Info(ctx)
				if ok = err == nil && led(info.Cluster); !ok {
					break
				}
			}
		}
		cancel()
		if ok {
			return time.Since(at)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Minute
}

// nkeyPath is the seed file of user under auth, else "".
func (c *leaderCluster) nkeyPath(auth bool, user string) string {
	if !auth {
		return ""
	}
	return filepath.Join(c.creds, user+".nk")
}

// waitUntil polls cond every 100 ms and fails the test after d.
func waitUntil(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

var httpClient = &http.Client{Timeout: 2 * time.Second}

func httpGetBody(url string) (string, error) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		b.WriteString(sc.Text())
		b.WriteByte('\n')
	}
	return b.String(), sc.Err()
}

// metricValue is the value of an unlabelled metric line, as printed.
func metricValue(body, name string) string {
	return strconv.FormatFloat(metric(body, name), 'f', -1, 64)
}

// fetchLeases reads the partitions a process holds in group, with their
// fencing tokens, from its /metrics (turnstone_partition_lease).
func fetchLeases(url, group string) (map[int]uint64, error) {
	body, err := httpGetBody(url)
	if err != nil {
		return nil, err
	}
	out := map[int]uint64{}
	prefix := `turnstone_partition_lease{group="` + group + `",partition="`
	for _, line := range strings.Split(body, "\n") {
		rest, ok := strings.CutPrefix(line, prefix)
		if !ok {
			continue
		}
		ps, val, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		p, err1 := strconv.Atoi(ps)
		v, err2 := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err1 == nil && err2 == nil {
			out[p] = uint64(v)
		}
	}
	return out, nil
}

// sampled is a member the sampler reads the /metrics of.
type sampled struct {
	name, group, url string
	prev             map[int]uint64 // its leases at the previous sample
}

// sampler samples, every 100 ms, the members bucket (the records of the
// live members: written within TTL) and each member's leases, and records
// every moment two members own one partition: two live records listing
// it, or a member reporting the same lease (same fencing token) before
// and after another member reported the partition held.
type sampler struct {
	js      jetstream.JetStream
	members []sampled

	mu       sync.Mutex
	samples  int
	misses   int
	overlaps []string
	tokens   map[string]map[int]uint64 // group -> partition -> highest token seen
	killed   time.Time
	handover map[string]time.Duration // group -> when every partition was held again, after the kill, after the last gap
	gaps     map[string]time.Time     // group -> the last sample with a partition held by no one
	unheld   map[string]time.Duration // group -> how long some partition was held by no one, about
	done     chan struct{}
	stopped  chan struct{}
	once     sync.Once
}

func (s *sampler) start() {
	s.done, s.stopped, s.handover = make(chan struct{}), make(chan struct{}), map[string]time.Duration{}
	s.gaps, s.unheld = map[string]time.Time{}, map[string]time.Duration{}
	go func() {
		defer close(s.stopped)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			s.sample()
			select {
			case <-s.done:
				return
			case <-tick.C:
			}
		}
	}()
}

func (s *sampler) stop() {
	s.once.Do(func() {
		close(s.done)
		<-s.stopped
	})
}

func (s *sampler) mark(killed time.Time) {
	s.mu.Lock()
	s.killed = killed
	s.mu.Unlock()
}

func (s *sampler) report() (int, int, []string, time.Duration, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var handover time.Duration
	for _, d := range s.handover {
		handover = max(handover, d)
	}
	var b strings.Builder
	for _, g := range []string{projections.EngineGroup, recovery.WorkerGroup} {
		if _, ok := s.gaps[g]; !ok {
			fmt.Fprintf(&b, "%s: every partition held throughout; ", g)
			continue
		}
		fmt.Fprintf(&b, "%s: held again %s after the kill (some partition unheld for about %s); ", g, s.handover[g], s.unheld[g])
	}
	return s.samples, s.misses, slices.Clone(s.overlaps), handover, b.String()
}

func (s *sampler) overlap(format string, a ...any) {
	if len(s.overlaps) < 50 {
		s.overlaps = append(s.overlaps, fmt.Sprintf(format, a...))
	}
}

// sample takes one sample.
func (s *sampler) sample() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	recs, err := pgroup.List(ctx, s.js, "", "")
	cancel()
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samples++
	if err != nil {
		s.misses++
	} else {
		owner := map[string]map[int]string{}
		for _, r := range recs {
			if now.Sub(r.Beat) >= pgroup.DefaultTTL {
				continue // a dead member's last record
			}
			if owner[r.Group] == nil {
				owner[r.Group] = map[int]string{}
			}
			for _, p := range r.Partitions {
				if o, ok := owner[r.Group][p]; ok {
					s.overlap("%s: the members bucket names %s and %s owners of partition %d at %s", r.Group, o, r.Member, p, now.Format("15:04:05.000"))
				}
				owner[r.Group][p] = r.Member
			}
		}
	}
	// Each member's leases, in turn; a member reporting the same lease
	// before and after another reported the partition owned them both
	// in between.
	held := map[string]map[int]bool{}
	cur := make([]map[int]uint64, len(s.members))
	for i := range s.members {
		m := &s.members[i]
		leases, err := fetchLeases(m.url, m.group)
		if err != nil {
			leases = map[int]uint64{} // a dead process holds nothing
		}
		cur[i] = leases
		if held[m.group] == nil {
			held[m.group] = map[int]bool{}
		}
		for p, tok := range leases {
			held[m.group][p] = true
			if s.tokens[m.group] == nil {
				s.tokens[m.group] = map[int]uint64{}
			}
			if high := s.tokens[m.group][p]; tok < high {
				s.overlap("%s: %s holds partition %d with token %d after token %d was seen", m.group, m.name, p, tok, high)
			} else {
				s.tokens[m.group][p] = tok
			}
		}
	}
	for i := range s.members {
		a := &s.members[i]
		for j := range s.members {
			b := &s.members[j]
			if i == j || a.group != b.group || a.prev == nil {
				continue
			}
			// b's sample lies between a's previous and current ones when b
			// was sampled after a in the last round (j > i: this round's)
			// or before a in this round (j < i).
			var between map[int]uint64
			if j < i {
				between = cur[j]
			} else {
				between = b.prev
			}
			for p, tok := range cur[i] {
				if a.prev[p] == tok && between[p] != 0 {
					s.overlap("%s: %s held partition %d (token %d) across a sample of %s holding it (token %d)", a.group, a.name, p, tok, b.name, between[p])
				}
			}
		}
	}
	for i := range s.members {
		s.members[i].prev = cur[i]
	}
	if !s.killed.IsZero() {
		// When every partition was last seen held again after a gap.
		for _, group := range []string{projections.EngineGroup, recovery.WorkerGroup} {
			if len(held[group]) < leaderPartitions {
				s.gaps[group] = now
				s.unheld[group] += 100 * time.Millisecond
			} else if last, ok := s.gaps[group]; ok {
				s.handover[group] = now.Sub(s.killed).Round(time.Millisecond)
				_ = last
			}
		}
	}
}

// ingestPublisher appends to its sessions through the engines, as a runtime
// does: each round, a turn of four events per session, as one atomic
// batch conditional on the session's last sequence every other round,
// else as four plain appends. It keeps every ack.
type ingestPublisher struct {
	t        *testing.T
	cl       *ingest.Client
	tenant   string
	sessions []string

	mu      sync.Mutex
	acks    map[string]uint64
	last    map[string]uint64
	nDup    int
	failure error
	done    chan struct{}
	stopped chan struct{}
	once    sync.Once
}

func startIngestPublisher(t *testing.T, nc *nats.Conn, tenant, prefix string, n int) *ingestPublisher {
	cl, err := ingest.NewClient(nc, ingest.ClientConfig{RetryFor: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	p := &ingestPublisher{t: t, cl: cl, tenant: tenant, acks: map[string]uint64{}, last: map[string]uint64{}, done: make(chan struct{}), stopped: make(chan struct{})}
	for i := range n {
		p.sessions = append(p.sessions, fmt.Sprintf("%s%02d", prefix, i))
	}
	go p.run()
	return p
}

func (p *ingestPublisher) stop() {
	p.once.Do(func() {
		close(p.done)
		<-p.stopped
	})
}

func (p *ingestPublisher) acked() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.acks)
}

func (p *ingestPublisher) dups() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nDup
}

func (p *ingestPublisher) err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failure
}

func (p *ingestPublisher) run() {
	defer close(p.stopped)
	ctx := context.Background()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for round := 0; ; round++ {
		for _, session := range p.sessions {
			if err := p.turn(ctx, session, round); err != nil {
				p.mu.Lock()
				p.failure = err
				p.mu.Unlock()
				return
			}
		}
		select {
		case <-p.done:
			return
		case <-tick.C:
		}
	}
}

// turn appends one round of session.
func (p *ingestPublisher) turn(ctx context.Context, session string, round int) error {
	ev := func(turn string, payload events.Payload) events.Event {
		e, err := events.New(p.tenant, session, turn, payload)
		if err != nil {
			panic(err)
		}
		e.Source = "urn:agent:publisher"
		return e
	}
	var evs []events.Event
	if round == 0 {
		evs = append(evs, ev("", &events.SessionStarted{Runtime: "publisher"}))
	}
	turn := fmt.Sprintf("t%d", round)
	text := func(s string) []events.ContentBlock { return []events.ContentBlock{{Type: "text", Text: s}} }
	evs = append(evs,
		ev(turn, &events.TurnStarted{Prompt: "hello", DeadlineMS: 120000}),
		ev(turn, &events.MessageAppended{Role: events.RoleUser, Content: text("hello")}),
		ev(turn, &events.MessageAppended{Role: events.RoleAssistant, Content: text(fmt.Sprintf("hi, for the %d time", round+1))}),
		ev(turn, &events.TurnCompleted{}))
	pause := 50 * time.Millisecond
	for {
		var opts []events.AppendOption
		p.mu.Lock()
		last := p.last[session]
		p.mu.Unlock()
		if round%2 == 1 {
			opts = append(opts, events.ExpectLastSeq(last))
		}
		acks, err := p.cl.Append(ctx, evs, opts...)
		if errors.Is(err, events.ErrConflict) {
			// The engine appended to the session (a snapshot.taken): read
			// it again and decide again (a read a replica behind its
			// leader serves can still be short: with back-off).
			time.Sleep(pause)
			pause = min(2*pause, time.Second)
			n, err := p.cl.LastSeq(ctx, p.tenant, session)
			if err != nil {
				return fmt.Errorf("%s: last sequence after a conflict: %w", session, err)
			}
			p.mu.Lock()
			p.last[session] = n
			p.mu.Unlock()
			continue
		}
		if err != nil {
			return fmt.Errorf("%s round %d: %w", session, round, err)
		}
		p.mu.Lock()
		for _, a := range acks {
			p.acks[a.ID] = a.Seq
			if a.Duplicate {
				p.nDup++
			}
			p.last[session] = max(p.last[session], a.Seq)
		}
		p.mu.Unlock()
		return nil
	}
}

// check: every acknowledged event is stored once, at its acknowledged
// sequence.
func (p *ingestPublisher) check(t *testing.T, got map[string][]events.Event) {
	t.Helper()
	stored := map[string][]uint64{}
	for _, evs := range got {
		for _, ev := range evs {
			stored[ev.ID] = append(stored[ev.ID], ev.Seq)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	lost := 0
	for id, seq := range p.acks {
		if s := stored[id]; len(s) != 1 || s[0] != seq {
			lost++
			if lost <= 5 {
				t.Errorf("acknowledged event %s at seq %d is stored at %v", id, seq, s)
			}
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d acknowledged events lost, moved or duplicated", lost, len(p.acks))
	}
}

// repairTime is how long after its crash (its runtime's last event) the
// session was repaired (no turn in flight, no orphaned tool_use), by the
// log's store times; false while it is not.
func repairTime(t *testing.T, log *events.Log, tenant, session string) (time.Duration, bool) {
	t.Helper()
	var evs []events.Event
	err := log.ReadSession(context.Background(), tenant, session, events.ReadOptions{}, func(ev events.Event) error {
		evs = append(evs, ev)
		return nil
	})
	if err != nil {
		return 0, false
	}
	crash := -1
	for i, ev := range evs {
		if !strings.HasPrefix(ev.Source, events.DefaultSource) {
			crash = i
		}
	}
	if crash < 0 {
		return 0, false
	}
	s := projections.FoldLog(evs[:crash+1])
	if s.InFlightTurn() == nil {
		t.Fatalf("%s/%s: no turn in flight at the runtime's last event: not a crash", tenant, session)
	}
	for _, ev := range evs[crash+1:] {
		s.Apply(ev)
		if s.InFlightTurn() == nil && len(s.OrphanedToolUseIDs()) == 0 {
			return ev.Stored.Sub(evs[crash].Stored), true
		}
	}
	return 0, false
}

// waitLogSettled waits until the events stream's last sequence has not
// moved for quiet (at most within), so that checks which read the log
// twice most likely read the same log (checkFreshFold reads again when
// not).
func waitLogSettled(t *testing.T, js jetstream.JetStream, quiet, within time.Duration) {
	t.Helper()
	var last uint64
	since := time.Now()
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var seq uint64
		st, err := js.Stream(ctx, events.EventsStream)
		if err == nil {
			var info *jetstream.StreamInfo
			if info, err = st.Info(ctx); err == nil {
				seq = info.State.LastSeq
			}
		}
		cancel()
		if seq == 0 || seq != last {
			last, since = seq, time.Now()
		} else if time.Since(since) >= quiet {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the events stream did not settle within %s (last seq %d, last error %v)", within, last, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkFreshFold: every session's projection as a reader gets it (Restore:
// its last snapshot and the events after it) and its fleet index row equal
// a fresh fold of its log (the index within 30 s).
func checkFreshFold(t *testing.T, log *events.Log, js jetstream.JetStream, tenant string, got map[string][]events.Event) {
	t.Helper()
	ctx := context.Background()
	store, err := projections.NewSnapshotStore(js, projections.SnapshotConfig{})
	if err != nil {
		t.Fatal(err)
	}
	sessions := make([]string, 0, len(got))
	for s := range got {
		sessions = append(sessions, s)
	}
	sort.Strings(sessions)
	want := map[string][]byte{}
	for _, session := range sessions {
		evs := got[session]
		var restored, full *projections.Session
		var err error
		// Restore reads the log after got was read: when the session grew
		// in between (an engine or worker event recorded late), both read
		// it again, until they read the same log. A pause between tries:
		// a follower answering the direct gets may trail by up to a raft
		// heartbeat, 1 s (docs/events.md, "Reading a session").
		for try := range 5 {
			if try > 0 {
				time.Sleep(300 * time.Millisecond)
			}
			if err = whileUnavailable(t, "restore "+session, func() (err error) {
				restored, err = projections.Restore(ctx, log, store, tenant, session)
				return err
			}); err != nil {
				break
			}
			full = projections.FoldLog(evs)
			if restored.LastSeq == full.LastSeq {
				break
			}
			if err = whileUnavailable(t, "read "+session, func() error {
				evs = evs[:0:0]
				return log.ReadSession(ctx, tenant, session, events.ReadOptions{}, func(ev events.Event) error {
					evs = append(evs, ev)
					return nil
				})
			}); err != nil {
				break
			}
		}
		if err != nil {
			t.Errorf("restore %s/%s: %v", tenant, session, err)
			continue
		}
		w, _ := json.Marshal(full)
		if g, _ := json.Marshal(restored); !bytes.Equal(g, w) {
			t.Errorf("%s/%s: Restore (snapshot + tail) differs from a fresh fold:\n%s", tenant, session, firstDiff(g, w))
		}
		want[session], _ = json.Marshal(full.Summary(events.Partition(tenant, session, log.Partitions())))
	}
	var differ []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		differ = differ[:0]
		sums, err := projections.ReadIndex(ctx, js, projections.IndexFilter{Tenant: tenant})
		if err == nil {
			at := map[string]projections.Summary{}
			for _, s := range sums {
				at[s.Session] = s
			}
			for _, session := range sessions {
				g, _ := json.Marshal(at[session])
				if bytes.Equal(g, want[session]) {
					continue
				}
				// The log may have grown since it was folded (a new
				// owner's snapshot.taken after a redelivery, seconds after
				// the log looked settled): the row is compared with a fold
				// of the log as it is now.
				var evs []events.Event
				if err := log.ReadSession(ctx, tenant, session, events.ReadOptions{}, func(ev events.Event) error {
					evs = append(evs, ev)
					return nil
				}); err == nil {
					want[session], _ = json.Marshal(projections.FoldLog(evs).Summary(events.Partition(tenant, session, log.Partitions())))
				}
				if !bytes.Equal(g, want[session]) {
					differ = append(differ, session+": "+firstDiff(g, want[session]))
				}
			}
			if len(differ) == 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Errorf("%d fleet index rows differ from a fresh fold 30s on (error %v): %v", len(differ), err, differ[:min(3, len(differ))])
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("%d sessions of %s: Restore and the fleet index equal a fresh fold", len(sessions), tenant)
}

// checkNoCommandNamesAnEndedTurn: no abandon_turn or pivot_strategy
// command of tenant names a turn whose end (turn.completed, turn.failed,
// turn.abandoned) was stored before the command.
func checkNoCommandNamesAnEndedTurn(t *testing.T, js jetstream.JetStream, tenant string, got map[string][]events.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ended := map[string]time.Time{} // session/turn -> when its end was stored
	for session, evs := range got {
		for _, ev := range evs {
			switch ev.Type {
			case events.TypeTurnCompleted, events.TypeTurnFailed, events.TypeTurnAbandoned:
				k := session + "/" + ev.Turn
				if _, ok := ended[k]; !ok {
					ended[k] = ev.Stored
				}
			}
		}
	}
	st, err := js.Stream(ctx, recovery.Stream)
	if err != nil {
		t.Fatal(err)
	}
	n, bad := 0, 0
	err = events.ReadStream(ctx, st, jetstream.OrderedConsumerConfig{FilterSubjects: []string{recovery.CommandSubjectPrefix + ".>"}}, 500, func(msg jetstream.Msg) error {
		var cmd recovery.Command
		if json.Unmarshal(msg.Data(), &cmd) != nil || cmd.Tenant != tenant || cmd.Turn == "" {
			return nil
		}
		if cmd.Kind != recovery.KindAbandonTurn && cmd.Kind != recovery.KindPivotStrategy {
			return nil
		}
		n++
		meta, err := msg.Metadata()
		if err != nil {
			return err
		}
		if at, ok := ended[cmd.Session+"/"+cmd.Turn]; ok && at.Before(meta.Timestamp) {
			bad++
			if bad <= 5 {
				t.Errorf("command %s (%s, issue %d, evidence %v, issued at %s by %q) names turn %s of %s, ended %s before it was stored (%s)",
					cmd.ID, cmd.Kind, cmd.Issue, cmd.Evidence, cmd.IssuedAt.Format("15:04:05.000"), cmd.IssuedBy, cmd.Turn, cmd.Session,
					meta.Timestamp.Sub(at).Round(time.Millisecond), meta.Timestamp.Format("15:04:05.000"))
				if bad == 1 {
					for _, ev := range got[cmd.Session] {
						t.Logf("  %s seq %d %s turn %s source %s", ev.Stored.Format("15:04:05.000"), ev.Seq, ev.Type, ev.Turn, ev.Source)
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d commands naming a turn in flight; %d name an ended turn", n, bad)
}

// commandsOf lists the recovery commands of a session with their status,
// for a failure's message.
func commandsOf(t *testing.T, js jetstream.JetStream, tenant, session string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, recovery.Stream)
	if err != nil {
		return err.Error()
	}
	kv, _ := js.KeyValue(ctx, recovery.StatusBucket)
	var out []string
	err = events.ReadStream(ctx, st, jetstream.OrderedConsumerConfig{FilterSubjects: []string{recovery.CommandSubjectPrefix + ".>"}}, 500, func(msg jetstream.Msg) error {
		var cmd recovery.Command
		if json.Unmarshal(msg.Data(), &cmd) != nil || cmd.Tenant != tenant || cmd.Session != session {
			return nil
		}
		meta, _ := msg.Metadata()
		status := "no status"
		if kv != nil {
			if e, err := kv.Get(ctx, cmd.ID); err == nil {
				status = string(e.Value())
			}
		}
		out = append(out, fmt.Sprintf("%s %s (stored %s, seq %d): %s", cmd.ID, cmd.Kind, meta.Timestamp.Format("15:04:05.000"), meta.Sequence.Stream, status))
		return nil
	})
	if err != nil {
		out = append(out, err.Error())
	}
	return strings.Join(out, "; ")
}
