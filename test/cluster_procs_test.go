package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The nats-server binary, built once per test binary from the module
// go.mod requires (the exact version the embedded server runs, nothing new
// to download), so that `go test ./...` needs nothing installed.
var (
	natsServerOnce sync.Once
	natsServerPath string
	natsServerErr  error
)

// natsServerBinary returns the path of the nats-server binary, building it
// into binDir on first use.
func natsServerBinary(t testing.TB) string {
	t.Helper()
	natsServerOnce.Do(func() {
		path := filepath.Join(binDir, "nats-server")
		build := exec.Command("go", "build", "-o", path, "github.com/nats-io/nats-server/v2")
		build.Dir = ".." // the repository root: its go.mod pins the version
		if out, err := build.CombinedOutput(); err != nil {
			natsServerErr = fmt.Errorf("build nats-server: %v\n%s", err, out)
			return
		}
		natsServerPath = path
	})
	if natsServerErr != nil {
		t.Fatal(natsServerErr)
	}
	return natsServerPath
}

// natsNode is one nats-server process of a cluster started by
// startNATSCluster.
type natsNode struct {
	name string
	url  string // nats://127.0.0.1:<client port>
	conf string // its configuration file
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

// kill stops the node with SIGKILL and waits for it to be gone.
func (n *natsNode) kill(t testing.TB) {
	t.Helper()
	if err := n.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-n.done
}

// start runs the node's nats-server with its configuration; it is stopped
// at test end if it still runs.
func (n *natsNode) start(t testing.TB) {
	t.Helper()
	cmd := exec.Command(natsServerBinary(t), "-c", n.conf)
	n.cmd, n.done = cmd, make(chan struct{})
	cmd.Stdout, cmd.Stderr = n.out, n.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := n.done
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		select {
		case <-done:
			return
		default:
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
}

// startNATSCluster starts n nats-server processes on loopback joined in
// one JetStream cluster (each with its store in a temporary directory)
// and waits until JetStream answers on every node. The nodes are stopped
// at test end.
func startNATSCluster(t *testing.T, n int) []*natsNode {
	t.Helper()
	return startNATSClusterWith(t, n, "")
}

// startNATSClusterWith is startNATSCluster with extra lines in every
// node's configuration (an include of accounts, a no_auth_user).
func startNATSClusterWith(t *testing.T, n int, extra string) []*natsNode {
	t.Helper()
	natsServerBinary(t)
	clientPorts, routePorts := make([]int, n), make([]int, n)
	for i := range n {
		clientPorts[i], routePorts[i] = freePort(t), freePort(t)
	}
	var routes []string
	for _, p := range routePorts {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
	}
	nodes := make([]*natsNode, n)
	for i := range n {
		dir := t.TempDir()
		name := fmt.Sprintf("n%d", i)
		conf := fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
jetstream {
  store_dir: %q
  max_memory_store: 256MB
  max_file_store: 2GB
}
cluster {
  name: turnstone-procs
  listen: 127.0.0.1:%d
  routes: [%s]
}
%s
`, name, clientPorts[i], filepath.Join(dir, "js"), routePorts[i], strings.Join(routes, ", "), extra)
		path := filepath.Join(dir, "nats.conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		node := &natsNode{name: name, url: fmt.Sprintf("nats://127.0.0.1:%d", clientPorts[i]), conf: path, out: &syncBuffer{}}
		node.start(t)
		nodes[i] = node
	}
	// Ready: every node answers a JetStream request (a meta leader is
	// elected and the node is current with it).
	deadline := time.Now().Add(60 * time.Second)
	for _, node := range nodes {
		for {
			err := jetStreamAnswers(node.url)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("nats node %s: JetStream not ready within 60s: %v\n%s", node.name, err, node.out)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nodes
}

// jetStreamAnswers connects to url alone and asks JetStream for the
// account's info.
func jetStreamAnswers(url string) error {
	nc, err := nats.Connect(url, nats.NoReconnect(), nats.Timeout(time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}

// clusterURL joins the client URLs of nodes, first to last.
func clusterURL(nodes ...*natsNode) string {
	urls := make([]string, len(nodes))
	for i, n := range nodes {
		urls[i] = n.url
	}
	return strings.Join(urls, ",")
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
