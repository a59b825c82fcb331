package test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/internal/auth"
	"github.com/turnstone-dev/turnstone/internal/cli"
	"github.com/turnstone-dev/turnstone/internal/engine"
	"github.com/turnstone-dev/turnstone/recovery"
	"gopkg.in/yaml.v3"
)

// composeService is a service of docker-compose.yml as the tests read it
// (YAML merge keys resolved by the parser).
type composeService struct {
	Image       string            `yaml:"image"`
	Build       string            `yaml:"build"`
	Restart     string            `yaml:"restart"`
	Entrypoint  []string          `yaml:"entrypoint"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	DependsOn   yaml.Node         `yaml:"depends_on"`
}

// bin is the command the service runs: nats-server for a nats image,
// else the base name of its entrypoint (the image's default: engine).
func (s composeService) bin() string {
	switch {
	case s.isNATS():
		return "nats-server"
	case len(s.Entrypoint) > 0:
		return filepath.Base(s.Entrypoint[0])
	}
	return "engine"
}

func (s composeService) isNATS() bool { return strings.HasPrefix(s.Image, "nats:") }

// composeFile is the part of docker-compose.yml the tests read.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

// loadCompose parses docker-compose.yml.
func loadCompose(t *testing.T) composeFile {
	t.Helper()
	b, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f composeFile
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return f
}

// flagArg is the value after flag in cmd, or "".
func flagArg(cmd []string, flag string) string {
	if i := slices.Index(cmd, flag); i >= 0 && i+1 < len(cmd) {
		return cmd[i+1]
	}
	return ""
}

// TestDockerCompose checks docker-compose.yml, which no machine of the
// suite can run: it parses, it has the topology docs/scaling.md promises
// (3 JetStream nodes routed to each other, TLS on their client port and
// the generated accounts loaded, setup with 3 replicas as the operator, 2
// engines and 2 workers with distinct names and their own seeds, all on
// the cluster over TLS), and every Turnstone command in it is accepted by
// the binary it runs (--help rejects an unknown flag; nats-server's
// flags are checked with -t in TestDockerComposeRunsWithAuthAndTLS, once
// its configuration exists).
func TestDockerCompose(t *testing.T) {
	parallel(t)
	f := loadCompose(t)
	var engines, workers, nats []string
	natsURL := ""
	for name, s := range f.Services {
		switch {
		case s.isNATS():
			nats = append(nats, name)
			if flagArg(s.Command, "--cluster_name") != "turnstone" || !slices.Contains(s.Command, "--jetstream") {
				t.Errorf("%s: not a JetStream node of cluster turnstone: %v", name, s.Command)
			}
			routes := flagArg(s.Command, "--routes")
			for i := 1; i <= 3; i++ {
				other := fmt.Sprintf("nats-%d", i)
				if other != name && !strings.Contains(routes, "nats://"+other+":6222") {
					t.Errorf("%s: no route to %s: %q", name, other, routes)
				}
			}
			if !slices.Contains(s.Command, "--tls") || flagArg(s.Command, "--tlscert") == "" || flagArg(s.Command, "--tlskey") == "" {
				t.Errorf("%s: no TLS on the client port: %v", name, s.Command)
			}
			if !strings.HasSuffix(flagArg(s.Command, "-c"), "/accounts.conf") {
				t.Errorf("%s: does not load the accounts of engine auth config: %v", name, s.Command)
			}
		case s.Build != "":
			if natsURL == "" {
				natsURL = s.Environment["TURNSTONE_NATS_URL"]
			}
			if u := s.Environment["TURNSTONE_NATS_URL"]; u != natsURL || strings.Count(u, "tls://") != 3 {
				t.Errorf("%s: TURNSTONE_NATS_URL %q, want the three nodes over TLS", name, u)
			}
			bin := s.bin()
			wantKey := ""
			switch {
			case bin == "worker":
				workers = append(workers, flagArg(s.Command, "--name"))
				wantKey = "worker.nk"
			case bin == "refruntime":
				wantKey = flagArg(s.Command, "--tenant") + ".nk"
			case s.Command[0] == "serve":
				engines = append(engines, flagArg(s.Command, "--name"))
				wantKey = "engine.nk"
				if !slices.Contains(s.Command, "--use-existing") {
					t.Errorf("%s: an engine that may change the streams setup made: %v", name, s.Command)
				}
			case s.Command[0] == "setup":
				wantKey = "operator.nk"
				if flagArg(s.Command, "--replicas") != "3" {
					t.Errorf("%s: setup without --replicas 3: %v", name, s.Command)
				}
				if s.Environment["TURNSTONE_NKEY"] != flagArg(s.Command, "--nkey") || s.Environment["TURNSTONE_TLS_CA"] != flagArg(s.Command, "--tls-ca") {
					t.Errorf("%s: `docker compose run --rm setup CMD` would not run as the operator: environment %v", name, s.Environment)
				}
			case s.Command[0] == "auth":
				if s.Restart != "no" {
					t.Errorf("%s: a one-shot init service with restart %q", name, s.Restart)
				}
			default:
				t.Errorf("%s: a service the test does not know: %v", name, s.Command)
			}
			if wantKey != "" {
				if k := flagArg(s.Command, "--nkey"); filepath.Base(k) != wantKey || flagArg(s.Command, "--tls-ca") == "" {
					t.Errorf("%s: --nkey %q and --tls-ca %q; want its own seed %s and the CA", name, k, flagArg(s.Command, "--tls-ca"), wantKey)
				}
			}
			cmd := exec.Command(filepath.Join(binDir, bin), append(slices.Clone(s.Command), "--help")...)
			cmd.Env = withoutNATSURL()
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("%s: %s %v: %v\n%s", name, bin, s.Command, err, out)
			}
		}
	}
	slices.Sort(engines)
	slices.Sort(workers)
	if len(nats) != 3 || len(engines) != 2 || len(workers) != 2 ||
		slices.Contains(engines, "") || slices.Contains(workers, "") || engines[0] == engines[1] || workers[0] == workers[1] {
		t.Fatalf("want 3 nats nodes, 2 named engines and 2 named workers; got %v, %v, %v", nats, engines, workers)
	}
}

// composeLocal runs docker-compose.yml's services as processes on
// loopback: each service gets its own root directory in which its
// volumes are mounted at their container paths (a named volume is a
// directory shared by the services that mount it, a bind mount a copy of
// the repository's file), and its commands and environment are those of
// the file with container paths moved under its root, the nodes' names
// and ports moved to loopback ports, and 0.0.0.0 listeners to free
// loopback ports.
type composeLocal struct {
	t      *testing.T
	f      composeFile
	dir    string
	client map[string]int // nats service -> client port
	route  map[string]int // nats service -> route port
}

func newComposeLocal(t *testing.T, f composeFile) *composeLocal {
	c := &composeLocal{t: t, f: f, dir: t.TempDir(), client: map[string]int{}, route: map[string]int{}}
	for name, s := range f.Services {
		if s.isNATS() {
			c.client[name], c.route[name] = freePort(t), freePort(t)
		}
	}
	return c
}

// volume is the directory of the named volume.
func (c *composeLocal) volume(name string) string { return filepath.Join(c.dir, "volumes", name) }

// mounts creates the service's root with its volumes and returns the
// root and the container paths mounted, longest first.
func (c *composeLocal) mounts(svc string) (string, []string) {
	t := c.t
	root := filepath.Join(c.dir, "services", svc)
	var targets []string
	for _, v := range c.f.Services[svc].Volumes {
		parts := strings.Split(v, ":")
		src, target := parts[0], parts[1]
		at := filepath.Join(root, target)
		targets = append(targets, target)
		if _, err := os.Lstat(at); err == nil {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(at), 0o755); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(src, ".") || strings.HasPrefix(src, "/") {
			b, err := os.ReadFile(filepath.Join("..", src))
			if err != nil {
				t.Fatalf("%s: bind mount %s: %v", svc, v, err)
			}
			if err := os.WriteFile(at, b, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(c.volume(src), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(c.volume(src), at); err != nil {
			t.Fatal(err)
		}
	}
	sort.Slice(targets, func(i, j int) bool { return len(targets[i]) > len(targets[j]) })
	return root, targets
}

var anyHostPort = regexp.MustCompile(`0\.0\.0\.0:\d+`)

// translate moves one argument or environment value of svc to loopback.
func (c *composeLocal) translate(svc, root string, targets []string, s string) string {
	for _, tg := range targets {
		if s == tg || strings.HasPrefix(s, tg+"/") {
			return filepath.Join(root, s)
		}
	}
	for name := range c.client {
		s = strings.ReplaceAll(s, name+":4222", fmt.Sprintf("127.0.0.1:%d", c.client[name]))
		s = strings.ReplaceAll(s, name+":6222", fmt.Sprintf("127.0.0.1:%d", c.route[name]))
	}
	if p, ok := c.route[svc]; ok {
		s = strings.ReplaceAll(s, "0.0.0.0:6222", fmt.Sprintf("127.0.0.1:%d", p))
	}
	return anyHostPort.ReplaceAllStringFunc(s, func(string) string { return fmt.Sprintf("127.0.0.1:%d", freePort(c.t)) })
}

// command is the service's process: its binary, arguments and
// environment, moved to loopback. extra replaces the service's command
// when given (docker compose run SERVICE ARGS...).
func (c *composeLocal) command(svc string, extra ...string) *exec.Cmd {
	s := c.f.Services[svc]
	root, targets := c.mounts(svc)
	args := s.Command
	if len(extra) > 0 {
		args = extra
	}
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--http_port" && i+1 < len(args) {
			out = append(out, a, fmt.Sprint(freePort(c.t)))
			i++
			continue
		}
		out = append(out, c.translate(svc, root, targets, a))
	}
	env := withoutNATSURL()
	for k, v := range s.Environment {
		env = append(env, k+"="+c.translate(svc, root, targets, v))
	}
	path := filepath.Join(binDir, s.bin())
	if s.isNATS() {
		path = natsServerBinary(c.t)
		out = append(out, "-a", "127.0.0.1", "-p", fmt.Sprint(c.client[svc]))
	}
	cmd := exec.Command(path, out...)
	cmd.Env = env
	return cmd
}

// run runs the service to completion and returns its output.
func (c *composeLocal) run(svc string, extra ...string) (string, error) {
	cmd := c.command(svc, extra...)
	var out, errOut syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		return "", err
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return out.String(), fmt.Errorf("%s %v: %w\n%s", svc, cmd.Args, err, errOut.String())
		}
		return out.String(), nil
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		return out.String(), fmt.Errorf("%s: still running after 30 s\n%s", svc, errOut.String())
	}
}

// start starts a long-running service; it is stopped at test end.
func (c *composeLocal) start(svc string) *proc {
	t := c.t
	cmd := c.command(svc)
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
		if p.exited() {
			return
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// clusterURL is the nodes' client URLs over TLS.
func (c *composeLocal) clusterURL() string {
	var urls []string
	for _, p := range c.client {
		urls = append(urls, fmt.Sprintf("tls://127.0.0.1:%d", p))
	}
	sort.Strings(urls)
	return strings.Join(urls, ",")
}

// TestDockerComposeRunsWithAuthAndTLS runs docker-compose.yml as compose
// would, every service a real process on loopback with the file's own
// commands, volumes and order (composeLocal): the one-shot services
// (restart "no") make the CA and the nodes' certificate (engine auth
// certs) and the seeds and accounts (engine auth config deploy/auth.yaml);
// the three nats-server nodes start with that accounts file and TLS on
// their client port; setup (restart on-failure) runs as the operator
// until it succeeds; then the engines, the workers and the demo runtime,
// each with its own seed and the CA. It checks that the engines and
// workers share every partition, that the demo tenant's runtime and a
// tenant's own append are stored through the engines, that `docker
// compose run --rm setup members` works as the operator, and that a
// client without a seed, without the CA, or without TLS is refused
// (issue 8: docker-compose runs with auth and TLS).
func TestDockerComposeRunsWithAuthAndTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process compose test")
	}
	parallel(t)
	start := time.Now()
	f := loadCompose(t)
	c := newComposeLocal(t, f)
	var oneShot, nodes, retried, long []string
	for name, s := range f.Services {
		switch {
		case s.Restart == "no":
			oneShot = append(oneShot, name)
		case s.isNATS():
			nodes = append(nodes, name)
		case s.Restart == "on-failure":
			retried = append(retried, name)
		default:
			long = append(long, name)
		}
	}
	for _, l := range [][]string{oneShot, nodes, retried, long} {
		slices.Sort(l)
	}
	if len(oneShot) == 0 || len(nodes) != 3 || len(retried) != 1 {
		t.Fatalf("want init services, 3 nodes and setup; got %v, %v, %v", oneShot, nodes, retried)
	}

	// 1. The secrets, as init-tls and init-auth make them.
	for _, svc := range oneShot {
		if _, err := c.run(svc); err != nil {
			t.Fatal(err)
		}
	}
	conf := c.volume("nats-conf")
	creds := c.volume("credentials")
	for _, p := range []string{filepath.Join(conf, auth.CAFile), filepath.Join(conf, auth.ServerCertFile), filepath.Join(conf, auth.ServerKeyFile),
		filepath.Join(conf, "accounts.conf"), filepath.Join(creds, "operator.nk"), filepath.Join(creds, "engine.nk"),
		filepath.Join(creds, "worker.nk"), filepath.Join(creds, "demo.nk")} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("after %v: %v", oneShot, err)
		}
	}
	// A second start keeps them (compose runs the init services every time).
	ca, _ := os.ReadFile(filepath.Join(conf, auth.CAFile))
	seed, _ := os.ReadFile(filepath.Join(creds, "demo.nk"))
	for _, svc := range oneShot {
		if _, err := c.run(svc); err != nil {
			t.Fatal(err)
		}
	}
	ca2, _ := os.ReadFile(filepath.Join(conf, auth.CAFile))
	seed2, _ := os.ReadFile(filepath.Join(creds, "demo.nk"))
	if string(ca) != string(ca2) || string(seed) != string(seed2) {
		t.Fatal("a second run of the init services replaced the CA or a seed")
	}

	// 2. The nodes: nats-server accepts each command (-t), then runs it.
	nodeProcs := map[string]*proc{}
	for _, n := range nodes {
		cmd := c.command(n)
		cmd.Args = append(cmd.Args, "-t")
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "is valid") {
			t.Fatalf("%s: nats-server -t: %v\n%s", n, err, out)
		}
		nodeProcs[n] = c.start(n)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for n, p := range nodeProcs {
				logProcessOutput(t, n, p.errOut.String())
			}
		}
	})
	operator := func() []nats.Option {
		o, err := cli.ClientConfig{Nkey: filepath.Join(creds, "operator.nk"), TLSCA: filepath.Join(conf, auth.CAFile)}.Options()
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	url := c.clusterURL()

	// 3. setup, again until it succeeds (restart: on-failure).
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := c.run(retried[0])
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("setup: %v", err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	t.Logf("secrets, 3 nodes and setup after %s", time.Since(start).Round(time.Millisecond))

	// 4. The engines, the workers, the demo runtime.
	procs := map[string]*proc{}
	for _, svc := range long {
		procs[svc] = c.start(svc)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for n, p := range procs {
				logProcessOutput(t, n, "stdout:\n"+p.out.String()+"\nstderr:\n"+p.errOut.String())
			}
		}
	})

	nc, err := nats.Connect(url, append(operator(), nats.Timeout(5*time.Second))...)
	if err != nil {
		t.Fatalf("operator: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// The partition count setup gives the streams.
	partitions := 0
	for _, svc := range f.Services {
		if len(svc.Command) > 0 && svc.Command[0] == "setup" {
			partitions, _ = strconv.Atoi(flagArg(svc.Command, "--partitions"))
		}
	}
	if partitions == 0 {
		t.Fatal("the setup service names no --partitions")
	}
	var engines, workers []string
	for _, svc := range long {
		switch s := f.Services[svc]; {
		case s.bin() == "worker":
			workers = append(workers, flagArg(s.Command, "--name"))
		case s.bin() == "engine":
			engines = append(engines, flagArg(s.Command, "--name"))
		}
	}
	owners := waitOwners(t, js, 30*time.Second, func(o map[string]map[string][]int) bool {
		for _, e := range engines {
			if len(o[engine.Group][e]) == 0 {
				return false
			}
		}
		for _, w := range workers {
			if len(o[recovery.WorkerGroup][w]) == 0 {
				return false
			}
		}
		return covers(o[engine.Group], partitions) && covers(o[recovery.WorkerGroup], partitions)
	})
	t.Logf("members after %s: %v", time.Since(start).Round(time.Millisecond), owners)

	// `docker compose run --rm setup members`: the setup service's
	// environment runs admin commands as the operator.
	out, err := c.run(retried[0], "members", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var rep membersReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("members --json: %v\n%s", err, out)
	}
	for _, p := range rep.Partitions {
		if p.Engine == "" || p.Worker == "" {
			t.Fatalf("engine members: partition %d has engine %q, worker %q", p.Partition, p.Engine, p.Worker)
		}
	}

	// The demo runtime recorded its sessions through the engines, then
	// serves its control requests.
	var rt *proc
	for svc, p := range procs {
		if f.Services[svc].bin() == "refruntime" {
			rt = p
		}
	}
	if rt == nil {
		t.Fatal("no demo runtime in docker-compose.yml")
	}
	deadline = time.Now().Add(30 * time.Second)
	for !strings.Contains(rt.errOut.String(), "serving control requests") {
		if rt.exited() || time.Now().After(deadline) {
			t.Fatalf("the demo runtime did not record its sessions:\n%s", rt.errOut)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var log *events.Log
	untilAvailable(t, "open the log", func() (err error) {
		log, err = events.Open(context.Background(), js, events.Config{UseExisting: true}, nil)
		return err
	})
	stored := tenantLog(t, log, "demo")
	for _, s := range strings.Fields(rt.out.String()) {
		if len(stored[s]) == 0 {
			t.Fatalf("session %s of the demo runtime is not stored; stored: %d sessions", s, len(stored))
		}
	}
	if len(strings.Fields(rt.out.String())) == 0 {
		t.Fatal("the demo runtime printed no session")
	}

	// The demo tenant appends with its own seed and the CA.
	demo := cli.ClientConfig{Nkey: filepath.Join(creds, "demo.nk"), TLSCA: filepath.Join(conf, auth.CAFile)}
	dopts, err := demo.Options()
	if err != nil {
		t.Fatal(err)
	}
	tnc, err := nats.Connect(url, append(dopts, nats.Timeout(5*time.Second))...)
	if err != nil {
		t.Fatalf("tenant demo: %v", err)
	}
	defer tnc.Close()
	ic, err := ingest.NewClient(tnc, ingest.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := events.New("demo", "compose-check", "", &events.SessionStarted{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	acks, err := ic.Append(ctx, []events.Event{ev})
	if err != nil || len(acks) != 1 || acks[0].Seq == 0 {
		t.Fatalf("tenant demo appends through the engine: %v, %v", acks, err)
	}

	// Refused: no seed; the seed without the CA; no TLS at all.
	connect := func(cfg cli.ClientConfig) error {
		opts, err := cfg.Options()
		if err != nil {
			return err
		}
		nc, err := nats.Connect(url, append(opts, nats.Timeout(2*time.Second), nats.NoReconnect())...)
		if err == nil {
			nc.Close()
		}
		return err
	}
	if err := connect(cli.ClientConfig{TLSCA: demo.TLSCA}); !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("the CA but no seed: %v, want an authorization violation", err)
	}
	if err := connect(cli.ClientConfig{Nkey: demo.Nkey}); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a seed but not the CA: %v, want the server's certificate refused", err)
	}
	for _, n := range nodes {
		if err := plainRefused(fmt.Sprintf("127.0.0.1:%d", c.client[n])); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
	t.Logf("done after %s", time.Since(start).Round(time.Millisecond))
}

// plainRefused speaks NATS without TLS to addr: the server's INFO must
// require TLS, and a plain CONNECT and PING must get no PONG (the server
// expects a TLS handshake and closes the connection).
func plainRefused(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(conn)
	info, err := r.ReadString('\n')
	if err != nil {
		return fmt.Errorf("no INFO: %w", err)
	}
	if !strings.Contains(info, `"tls_required":true`) {
		return fmt.Errorf("INFO does not require TLS: %s", info)
	}
	if _, err := io.WriteString(conn, "CONNECT {\"verbose\":false,\"pedantic\":false}\r\nPING\r\n"); err != nil {
		return nil // closed already
	}
	rest, _ := io.ReadAll(r)
	if strings.Contains(string(rest), "PONG") {
		return fmt.Errorf("a plain connection got a PONG: %q", rest)
	}
	return nil
}
