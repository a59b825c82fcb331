package embedded_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/internal/embedded"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
)

func TestStartServesJetStreamOverTCPAndInProcess(t *testing.T) {
	s := embeddedtest.Start(t)
	ctx := context.Background()

	_, js := embeddedtest.Connect(t, s)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatalf("create stream over TCP: %v", err)
	}
	nc, err := s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ijs, _ := jetstream.New(nc)
	ack, err := ijs.Publish(ctx, "t.x", []byte("hello"))
	if err != nil {
		t.Fatalf("publish in process: %v", err)
	}
	if ack.Stream != "T" || ack.Sequence != 1 {
		t.Fatalf("ack = %+v, want stream T seq 1", ack)
	}
}

func TestDataSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	start := func() *embedded.Server {
		s, err := embedded.Start(embedded.Config{DataDir: dir, Port: -1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	ctx := context.Background()
	s := start()
	nc, _ := s.Connect()
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t.x", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "jetstream")); err != nil {
		t.Fatalf("store dir not written: %v", err)
	}

	s = start()
	defer s.Close(ctx)
	nc, _ = s.Connect()
	defer nc.Close()
	js, _ = jetstream.New(nc)
	st, err := js.Stream(ctx, "T")
	if err != nil {
		t.Fatal(err)
	}
	msg, err := st.GetMsg(ctx, 1)
	if err != nil || string(msg.Data) != "kept" {
		t.Fatalf("after restart: msg %v, err %v", msg, err)
	}
}

func TestStartRejectsBadConfig(t *testing.T) {
	_, err := embedded.Start(embedded.Config{Port: 70000}, nil)
	if err == nil {
		t.Fatal("want an error for no data dir and port 70000")
	}
	for _, want := range []string{"data dir", "port"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

func TestStartFailsWhenPortTaken(t *testing.T) {
	s := embeddedtest.Start(t)
	_, port, _ := net.SplitHostPort(s.NATS().Addr().String())
	p, _ := strconv.Atoi(port)
	_, err := embedded.Start(embedded.Config{DataDir: t.TempDir(), Port: p, ReadyWait: 2 * time.Second}, nil)
	if err == nil {
		t.Fatal("second server on the same port started")
	}
}

func TestTokenAuth(t *testing.T) {
	s := embeddedtest.Start(t, func(c *embedded.Config) { c.Token = "s3cret" })
	if nc, err := nats.Connect(s.ClientURL()); err == nil {
		nc.Close()
		t.Fatal("connected without the token")
	}
	nc, err := nats.Connect(s.ClientURL(), nats.Token("s3cret"))
	if err != nil {
		t.Fatalf("connect with token: %v", err)
	}
	nc.Close()
	inproc, err := s.Connect()
	if err != nil {
		t.Fatalf("in-process connect carries the token: %v", err)
	}
	inproc.Close()
}

// DefaultURL is a literal (a constant cannot format DefaultPort): keep it
// on DefaultHost and DefaultPort.
func TestDefaultURLMatchesDefaultAddress(t *testing.T) {
	want := "nats://" + net.JoinHostPort(embedded.DefaultHost, strconv.Itoa(embedded.DefaultPort))
	if embedded.DefaultURL != want {
		t.Fatalf("DefaultURL = %q, want %q", embedded.DefaultURL, want)
	}
}
