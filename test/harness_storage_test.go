package test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/embedded"
)

// startServerAt starts an embedded server on port with its store in dir
// (both kept across restarts), stopped at test end.
func startServerAt(t testing.TB, dir string, port int, maxStore int64) *embedded.Server {
	t.Helper()
	srv, err := embedded.Start(embedded.Config{DataDir: dir, Port: port, MaxStore: maxStore}, nil)
	if err != nil {
		t.Fatalf("start embedded server: %v", err)
	}
	t.Cleanup(func() { closeServer(t, srv) })
	return srv
}

func closeServer(t testing.TB, srv *embedded.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Close(ctx); err != nil {
		t.Error(err)
	}
}

// connectRetrying connects to url as a long-lived client does: it
// reconnects for ever, every 100 ms, when the server goes away.
func connectRetrying(t testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// ackLedger keeps the ids the log acknowledged, with their sequences.
type ackLedger struct {
	mu   sync.Mutex
	seqs map[string]uint64
}

func (a *ackLedger) add(acks []events.Ack) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.seqs == nil {
		a.seqs = map[string]uint64{}
	}
	for _, ack := range acks {
		if ack.Seq != 0 {
			a.seqs[ack.ID] = ack.Seq
		}
	}
}

// check fails the test unless every acknowledged id is stored exactly
// once, at its acknowledged sequence, among the events of tenant.
func (a *ackLedger) check(t testing.TB, log *events.Log, tenant string) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	got := tenantLog(t, log, tenant)
	checkNoDuplicateIDs(t, got)
	stored := map[string]uint64{}
	for _, evs := range got {
		for _, ev := range evs {
			stored[ev.ID] = ev.Seq
		}
	}
	lost := 0
	for id, seq := range a.seqs {
		if s, ok := stored[id]; !ok || s != seq {
			lost++
			if lost <= 5 {
				t.Errorf("acknowledged event %s (seq %d) is not in the log (found at seq %d)", id, seq, s)
			}
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d acknowledged events lost", lost, len(a.seqs))
	}
}

// padded returns an event of about size bytes encoded.
func padded(t testing.TB, tenant, session string, i, size int) events.Event {
	t.Helper()
	text := fmt.Sprintf("%06d %s", i, strings.Repeat("x", size))
	ev, err := events.New(tenant, session, "", &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: events.BlockText, Text: text}}})
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// TestStreamFullFailsClosedAndLosesNothing runs the engine on a NATS
// server and bounds the event stream (events.Config.MaxBytes) below what
// a writer appends: the append that does not fit fails with
// ErrLogUnavailable saying the byte limit is reached, the engine fails
// closed (/healthz: 503, the stream is full), and once the limit is raised
// (events.Open updates the stream) the engine is healthy again, appends
// succeed and every acknowledged event is readable.
func TestStreamFullFailsClosedAndLosesNothing(t *testing.T) {
	skipShort(t, "fills a stream")
	parallel(t)
	dir, port := t.TempDir(), freePort(t)
	srv := startServerAt(t, dir, port, 0)
	telemetry := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	runOK(t, srv.ClientURL(), "setup") // with --nats-url the engine creates nothing
	eng := startEngineAt(t, t.TempDir(), port, "--nats-url", srv.ClientURL(), "--telemetry-listen", telemetry)
	waitHealth(t, eng, telemetry, http.StatusOK, "ok")

	_, js := connectRetrying(t, srv.ClientURL())
	ctx := context.Background()
	log, err := events.Open(ctx, js, events.Config{MaxBytes: 256 << 10, UpdateStreams: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var acked ackLedger
	var full error
	for i := 0; i < 1000 && full == nil; i++ {
		acks, err := log.Append(ctx, []events.Event{padded(t, "full", "s1", i, 1000)})
		acked.add(acks)
		full = err
	}
	if full == nil {
		t.Fatal("1000 appends of 1 KB fit in a 256 KiB stream")
	}
	if !errors.Is(full, events.ErrLogUnavailable) || !strings.Contains(full.Error(), "maximum bytes") {
		t.Fatalf("append to a full stream: %v; want ErrLogUnavailable saying the byte limit is reached", full)
	}
	t.Logf("%d events acknowledged; the next append: %v", len(acked.seqs), full)
	// Still full: a retry fails the same way, and at once.
	start := time.Now()
	if _, err := log.Append(ctx, []events.Event{padded(t, "full", "s1", -1, 1000)}); !errors.Is(err, events.ErrLogUnavailable) {
		t.Fatalf("second append to a full stream: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("append to a full stream took %s to fail", d)
	}
	body := waitHealth(t, eng, telemetry, http.StatusServiceUnavailable, "full")
	t.Logf("/healthz while full: %s", strings.TrimSpace(body))

	bigger, err := events.Open(ctx, js, events.Config{MaxBytes: 64 << 20, UpdateStreams: true}, nil)
	if err != nil {
		t.Fatalf("raise the limit: %v", err)
	}
	waitHealth(t, eng, telemetry, http.StatusOK, "ok")
	for i := 0; i < 50; i++ {
		acks, err := bigger.Append(ctx, []events.Event{padded(t, "full", "s1", 1000+i, 1000)})
		if err != nil {
			t.Fatalf("append after raising the limit: %v", err)
		}
		acked.add(acks)
	}
	acked.check(t, bigger, "full")
	eng.stop(t)
}

// waitHealth polls the engine's /healthz on addr until it answers code
// with a body containing says, and returns the body.
func waitHealth(t testing.TB, eng *engineProc, addr string, code int, says string) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, body := 0, ""
		if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			got, body = resp.StatusCode, string(b)
		}
		if got == code && strings.Contains(body, says) {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz: %d %s; want %d saying %q\nengine: %s", got, body, code, says, eng.out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestJetStreamStorageFullFailsClearlyAndRecovers fills a NATS server
// whose JetStream storage (embedded.Config.MaxStore) is small: appends
// fail with ErrLogUnavailable naming the missing resources, quickly; once
// the server restarts on the same data with room, the writer's client
// reconnects, appends succeed and every acknowledged event is still in the
// log.
func TestJetStreamStorageFullFailsClearlyAndRecovers(t *testing.T) {
	parallel(t)
	dir, port := t.TempDir(), freePort(t)
	srv := startServerAt(t, dir, port, 8<<20)
	_, js := connectRetrying(t, srv.ClientURL())
	ctx := context.Background()
	log, err := events.Open(ctx, js, events.Config{Timeout: 2 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var acked ackLedger
	var full error
	for i := 0; i < 400 && full == nil; i++ {
		acks, err := log.Append(ctx, []events.Event{padded(t, "store", fmt.Sprintf("s%d", i%4), i, 100<<10)})
		acked.add(acks)
		full = err
	}
	if full == nil {
		t.Fatal("40 MB of events fit in 8 MiB of JetStream storage")
	}
	if !errors.Is(full, events.ErrLogUnavailable) || !strings.Contains(full.Error(), "insufficient resources") {
		t.Fatalf("append with JetStream storage full: %v; want ErrLogUnavailable naming the storage", full)
	}
	t.Logf("%d events acknowledged; the next append: %v", len(acked.seqs), full)
	start := time.Now()
	if _, err := log.Append(ctx, []events.Event{padded(t, "store", "s0", -1, 100<<10)}); !errors.Is(err, events.ErrLogUnavailable) {
		t.Fatalf("second append with storage full: %v", err)
	}
	if d := time.Since(start); d >= 2*time.Second {
		t.Errorf("append with storage full took %s to fail: it waited out the log's Timeout (2s) instead of failing on JetStream's answer", d)
	}

	// Storage is back: the server restarts with room.
	closeServer(t, srv)
	startServerAt(t, dir, port, 64<<20)
	deadline := time.Now().Add(20 * time.Second)
	for {
		acks, err := log.Append(ctx, []events.Event{padded(t, "store", "after", 0, 10)})
		if err == nil {
			acked.add(acks)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("append 20s after the server came back with room: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	acked.check(t, log, "store")
}

// TestStreamUnavailableMidAppend stops the NATS server while a writer
// appends: each append fails with ErrLogUnavailable within the log's
// Timeout (no hang), and once the server is back on the same port and
// data, the writer's client reconnects, appends succeed (a retried event
// is stored once) and every acknowledged event is in the log.
func TestStreamUnavailableMidAppend(t *testing.T) {
	skipShort(t, "stops and restarts a server")
	parallel(t)
	dir, port := t.TempDir(), freePort(t)
	srv := startServerAt(t, dir, port, 0)
	_, js := connectRetrying(t, srv.ClientURL())
	ctx := context.Background()
	const timeout = time.Second
	log, err := events.Open(ctx, js, events.Config{Timeout: timeout}, nil)
	if err != nil {
		t.Fatal(err)
	}

	var acked ackLedger
	var (
		mu       sync.Mutex
		failures []error
		slowest  time.Duration
	)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		var retry []events.Event
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			batch := retry
			if batch == nil {
				for j := 0; j < 5; j++ {
					batch = append(batch, padded(t, "down", fmt.Sprintf("s%d", j), i, 200))
				}
			}
			start := time.Now()
			acks, err := log.Append(ctx, batch)
			d := time.Since(start)
			acked.add(acks)
			retry = nil
			if err != nil {
				retry = batch // the same ids: a retry must be stored once
				mu.Lock()
				failures = append(failures, err)
				slowest = max(slowest, d)
				mu.Unlock()
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("no %s within 20s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	count := func() int {
		acked.mu.Lock()
		defer acked.mu.Unlock()
		return len(acked.seqs)
	}
	nfail := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(failures)
	}
	waitFor("acknowledged appends", func() bool { return count() >= 200 })
	closeServer(t, srv)
	waitFor("failed appends", func() bool { return nfail() >= 3 })
	down := count()
	srv = startServerAt(t, dir, port, 0)
	waitFor("appends after the restart", func() bool { return count() >= down+200 })
	close(stop)
	<-done

	mu.Lock()
	for _, err := range failures {
		if !errors.Is(err, events.ErrLogUnavailable) {
			t.Errorf("append with the server down: %v; want ErrLogUnavailable", err)
		}
	}
	if slowest > timeout+time.Second {
		t.Errorf("an append with the server down took %s to fail; the log's timeout is %s", slowest, timeout)
	}
	t.Logf("%d appends failed while the server was down (slowest %s): %v", len(failures), slowest, failures[0])
	mu.Unlock()
	acked.check(t, log, "down")
}
