package ingestserver

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
)

// TestNoReplyThroughAnotherServer: a request that came through a service
// import (reply subject _R_.) is answered only while the connection is
// still on the server that delivered it. While the connection is
// reconnecting, nats.go would keep the reply and send it to the next
// server, which refuses it as a permission violation under auth (seen in
// the leader-kill test: an engine's replies to ingest requests flushed
// to the node it reconnected to).
func TestNoReplyThroughAnotherServer(t *testing.T) {
	srv := embeddedtest.Start(t)
	nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	s := &Server{nc: nc, l: zerolog.Nop()}

	direct := &nats.Msg{Subject: "agent.ingest.t.s", Reply: "_INBOX.abc"}
	imported := &nats.Msg{Subject: "agent.ingest.t.s", Reply: serviceReplyPrefix + "x.y"}
	s.received(imported)
	if !s.answerable(imported) {
		t.Fatal("a service-import request on an unchanged connection: not answerable")
	}

	s.received(imported)
	s.received(direct)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for nc.Status() == nats.CONNECTED {
		if ctx.Err() != nil {
			t.Fatal("the connection never left CONNECTED after its server stopped")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if s.answerable(imported) {
		t.Error("a service-import request answered while the connection is reconnecting (the reply would go to another server)")
	}
	if !s.answerable(direct) {
		t.Error("a request on an ordinary inbox was refused its reply (only service-import replies are bound to their server)")
	}
}
