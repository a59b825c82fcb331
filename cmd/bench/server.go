package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/internal/embedded"
)

// server is one embedded NATS server with JetStream for a benchmark: file
// storage in a temporary directory, any free loopback port. It runs in
// this process, or in a child process (childServer) when the benchmark
// measures this process's memory.
type server struct {
	url   string
	close func()
}

// startServer starts an embedded server in this process; syncAlways makes
// it fsync every write before its ack (embedded.Config.SyncAlways), else
// JetStream's default sync interval (2 minutes) applies.
func startServer(syncAlways bool) (*server, error) { return startServerSync(syncAlways, 0) }

// startServerSync is startServer with a sync interval (0: the default).
func startServerSync(syncAlways bool, interval time.Duration) (*server, error) {
	dir, err := os.MkdirTemp("", "turnstone-bench-")
	if err != nil {
		return nil, err
	}
	srv, err := embedded.Start(embedded.Config{DataDir: dir, Port: -1, SyncAlways: syncAlways, SyncInterval: interval}, nil)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	// As engine serve's embedded server: each append reaches the engine
	// owning its partition (the streams here have the default count).
	closeServer := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
		_ = os.RemoveAll(dir)
	}
	if err := srv.AddMapping(ingest.IngestMapping(events.DefaultPartitions)); err != nil {
		closeServer()
		return nil, err
	}
	return &server{url: srv.ClientURL(), close: closeServer}, nil
}

// childEnv, set in a child process's environment, makes it a child (see
// RunChild) instead of running benchmarks: "default" or "always" for a
// server, "memory" for the memory figure.
const childEnv = "TURNSTONE_BENCH_CHILD"

// IsChild reports whether this process was started as a child.
func IsChild() bool { return os.Getenv(childEnv) != "" }

// RunChild is the child process's main. As a server ("default",
// "always": SyncAlways), it starts an embedded server, writes its client
// URL and a newline to stdout, and serves until stdin closes (the parent
// exited or closed it). For "memory" it runs the memory figure (see
// memoryChild) and writes its result as JSON to stdout.
func RunChild() error {
	switch kind := os.Getenv(childEnv); kind {
	case "memory":
		return memoryChild()
	case "engine", "worker":
		return memberChild(kind)
	}
	srv, err := startServer(os.Getenv(childEnv) == "always")
	if err != nil {
		return err
	}
	defer srv.close()
	fmt.Println(srv.url)
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

// childServer starts an embedded server in a child process (this program,
// re-executed with childEnv set), so that its memory is not counted in
// this process's heap.
func childServer(syncAlways bool) (*server, int, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, 0, err
	}
	mode := "default"
	if syncAlways {
		mode = "always"
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childEnv+"="+mode)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, 0, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, 0, err
	}
	if err := cmd.Start(); err != nil {
		return nil, 0, err
	}
	stop := func() {
		_ = stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- strings.TrimSpace(s)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case url := <-line:
		if !strings.HasPrefix(url, "nats://") {
			stop()
			return nil, 0, fmt.Errorf("child server: got %q instead of its URL", url)
		}
		return &server{url: url, close: stop}, cmd.Process.Pid, nil
	case <-time.After(30 * time.Second):
		stop()
		return nil, 0, errors.New("child server: no URL within 30s")
	}
}

// client is one TCP connection to a server, as another process would
// connect, with its JetStream context.
type client struct {
	nc *nats.Conn
	js jetstream.JetStream
}

func connect(url, name string) (*client, error) {
	nc, err := nats.Connect(url, nats.Name(name))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &client{nc: nc, js: js}, nil
}

// openLog connects and opens the event log (creating the streams).
func openLog(ctx context.Context, url, name string) (*client, *events.Log, error) {
	c, err := connect(url, name)
	if err != nil {
		return nil, nil, err
	}
	l, err := events.Open(ctx, c.js, events.Config{}, nil)
	if err != nil {
		c.nc.Close()
		return nil, nil, err
	}
	return c, l, nil
}

// rssBytes is the resident set size of process pid (0: this process), from
// /proc; 0 when it cannot be read.
func rssBytes(pid int) int64 {
	p := "/proc/self/status"
	if pid != 0 {
		p = "/proc/" + strconv.Itoa(pid) + "/status"
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}
