// Package embeddedtest starts real embedded NATS servers with JetStream for
// tests: any free loopback port, a temporary store directory, shut down and
// removed when the test ends.
package embeddedtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/internal/embedded"
)

// Start starts a server on 127.0.0.1 with a free port and a store directory
// under tb.TempDir(), and stops it in tb.Cleanup. mod, when given, changes
// the configuration before the start (for example to bound MaxStore).
func Start(tb testing.TB, mod ...func(*embedded.Config)) *embedded.Server {
	tb.Helper()
	cfg := embedded.Config{DataDir: tb.TempDir(), Port: -1}
	for _, m := range mod {
		m(&cfg)
	}
	s, err := embedded.Start(cfg, nil)
	if err != nil {
		tb.Fatalf("start embedded server: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

// Connect opens a TCP client connection to s (as another process would),
// closed in tb.Cleanup, and returns it with its JetStream context.
func Connect(tb testing.TB, s *embedded.Server) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		tb.Fatalf("connect to %s: %v", s.ClientURL(), err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatalf("jetstream: %v", err)
	}
	return nc, js
}

// StartCluster starts n servers on 127.0.0.1 joined in one JetStream
// cluster (routes on free loopback ports, each store under tb.TempDir()),
// waits until each is ready (up to 30 s), and stops them all in
// tb.Cleanup. Streams created on it can have up to n replicas.
func StartCluster(tb testing.TB, n int) []*embedded.Server {
	tb.Helper()
	ports := make([]int, n)
	for i := range ports {
		ports[i] = FreePort(tb)
	}
	servers := make([]*embedded.Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		var routes []string
		for j, p := range ports {
			if j != i {
				routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
			}
		}
		cfg := embedded.Config{
			DataDir: tb.TempDir(), Port: -1, ServerName: fmt.Sprintf("n%d", i), ReadyWait: 30 * time.Second,
			Cluster: embedded.ClusterConfig{Name: "turnstone-test", Port: ports[i], Routes: routes},
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			servers[i], errs[i] = embedded.Start(cfg, nil)
		}()
	}
	wg.Wait()
	tb.Cleanup(func() {
		for _, s := range servers {
			if s == nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_ = s.Close(ctx)
			cancel()
		}
	})
	for i, err := range errs {
		if err != nil {
			tb.Fatalf("start cluster node %d: %v", i, err)
		}
	}
	return servers
}

// ConnectDenied starts a server with JetStream whose only user may
// publish anything but the subjects deny (nats-server publish
// permissions), and returns a connection as that user with its JetStream
// context, both closed in tb.Cleanup. A request to a denied subject is
// never answered: it waits out its timeout, as a request to a node that
// is gone does. The connection's asynchronous errors (the violations) are
// dropped.
func ConnectDenied(tb testing.TB, deny ...string) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	opts := &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: tb.TempDir(), NoSigs: true, NoLog: true,
		Users: []*server.User{{Username: "denied", Password: "denied", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: deny},
		}}}}
	ns, err := server.NewServer(opts)
	if err != nil {
		tb.Fatalf("new server: %v", err)
	}
	ns.Start()
	tb.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		tb.Fatal("server not ready for connections within 10s")
	}
	nc, err := nats.Connect(ns.ClientURL(), nats.UserInfo("denied", "denied"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		tb.Fatalf("connect to %s: %v", ns.ClientURL(), err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatalf("jetstream: %v", err)
	}
	return nc, js
}

// FreePort returns a TCP port of 127.0.0.1 that nothing listens on, for a
// server or process a test is about to start, and never the same one
// twice in this test binary. A port the kernel picks for ":0" is in its
// ephemeral range (/proc/sys/net/ipv4/ip_local_port_range, 32768-60999
// by default), which every outgoing connection of every process draws
// from too: with the tests' processes connecting all the time, one could
// take the port between this check and the server's bind. So the ports come
// from below that range (where no connection is given one), unless the
// range leaves no room there. Nor does another test process get it: each
// port is locked for this process's life (claimPort).
func FreePort(tb testing.TB) int {
	tb.Helper()
	portPool.Lock()
	defer portPool.Unlock()
	if portPool.given == nil {
		portPool.given = map[int]bool{}
		portPool.lo, portPool.hi = 20000, ephemeralLow()
		if portPool.hi-portPool.lo < 2000 {
			portPool.lo, portPool.hi = 0, 0 // no room below the range: ask for ":0"
		}
		if portPool.hi > 0 {
			// Processes started together have pids a few apart: a
			// prime spreads their starting points over the range.
			portPool.next = portPool.lo + os.Getpid()*7919%(portPool.hi-portPool.lo)
		}
	}
	for tries := 0; portPool.hi > 0 && tries < portPool.hi-portPool.lo; tries++ {
		p := portPool.next
		portPool.next++
		if portPool.next >= portPool.hi {
			portPool.next = portPool.lo
		}
		if portPool.given[p] {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue // in use
		}
		l.Close()
		portPool.given[p] = true
		if !claimPort(p) {
			continue // another test process gave it
		}
		return p
	}
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !portPool.given[p] {
			portPool.given[p] = true
			if claimPort(p) {
				return p
			}
		}
	}
}

// portPool is what FreePort has handed out, and where it looks next.
var portPool struct {
	sync.Mutex
	given        map[int]bool
	lo, hi, next int
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768
// when it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return n
}
