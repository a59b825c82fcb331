package test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/embedded"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/projections"
)

// startCluster starts n embedded servers joined in one JetStream cluster on
// loopback, and stops them at test end.
func startCluster(t *testing.T, n int) []*embedded.Server {
	t.Helper()
	return embeddedtest.StartCluster(t, n)
}

// TestLogOnAThreeNodeCluster runs the log on a replicated stream across
// three servers: appends, the conflict on a stale expected sequence
// (JetStream reports 10164 on replicated streams), LastSeq, LastID and a
// read right after each of 200 appends, from a client on a follower's
// node (the leader answers the first two; the read goes on until it has
// the leader's last event), and appends and reads with one node down.
func TestLogOnAThreeNodeCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	parallel(t)
	servers := startCluster(t, 3)
	ctx := context.Background()
	nc, err := nats.Connect(servers[0].ClientURL() + "," + servers[1].ClientURL() + "," + servers[2].ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	var log *events.Log
	// The meta leader may still be elected.
	untilAvailable(t, "open the log", func() (err error) {
		log, err = events.Open(ctx, js, events.Config{Replicas: 3}, nil)
		return err
	})
	var st jetstream.Stream
	untilAvailable(t, "stream "+events.EventsStream, func() (err error) {
		st, err = js.Stream(ctx, events.EventsStream)
		return unavailable(err)
	})
	if r := st.CachedInfo().Config.Replicas; r != 3 {
		t.Fatalf("replicas %d", r)
	}
	ev := func(turn string, p events.Payload) events.Event {
		e, err := events.New("acme", "s1", turn, p)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	// Each call is retried only while the log is unavailable (no answer
	// in Config.Timeout: on a loaded machine a stream's leader can be
	// elected again); an answer is checked as it comes. Appends are
	// resent as they are: a resend of a stored event or batch stores
	// nothing and answers with the first one's sequence.
	var acks []events.Ack
	started := ev("", &events.SessionStarted{})
	untilAvailable(t, "the first append", func() (err error) {
		acks, err = log.Append(ctx, []events.Event{started}, events.ExpectLastSeq(0))
		return err
	})
	turn := ev("t1", &events.TurnStarted{})
	untilAvailable(t, "the second append", func() error {
		_, err := log.Append(ctx, []events.Event{turn})
		return err
	})
	stale := ev("", &events.DistillationRequested{})
	err = whileUnavailable(t, "an append on a stale expected sequence", func() error {
		_, err := log.Append(ctx, []events.Event{stale}, events.ExpectLastSeq(acks[0].Seq))
		return err
	})
	if !errors.Is(err, events.ErrConflict) {
		t.Fatalf("stale expected sequence on a replicated stream: want ErrConflict, got %v", err)
	}

	// LastSeq and LastID answer with the last acknowledged append at once,
	// for a client on a follower's node too: the stream's leader answers
	// them, not the follower (a direct get's queue group prefers the
	// replica on the client's node), which learns of a commit up to a
	// heartbeat later.
	var info *jetstream.StreamInfo
	untilAvailable(t, "stream info", func() (err error) {
		info, err = st.Info(ctx)
		return unavailable(err)
	})
	if info.Cluster == nil {
		t.Fatalf("stream info: %+v", info)
	}
	var follower *events.Log
	for _, srv := range servers {
		if srv.NATS().Name() == info.Cluster.Leader {
			continue
		}
		fnc, err := nats.Connect(srv.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		defer fnc.Close()
		fjs, _ := jetstream.New(fnc)
		untilAvailable(t, "open the log on a follower's node", func() (err error) {
			follower, err = events.Open(ctx, fjs, events.Config{Replicas: 3}, nil)
			return err
		})
		break
	}
	// A session with no event: not found, from the leader too.
	if err := whileUnavailable(t, "LastSeq of nobody", func() error {
		_, err := follower.LastSeq(ctx, "acme", "nobody")
		return err
	}); !errors.Is(err, events.ErrSessionNotFound) {
		t.Fatalf("LastSeq of a session with no event: %v, want ErrSessionNotFound", err)
	}
	if err := whileUnavailable(t, "LastID of nobody", func() error {
		_, _, err := follower.LastID(ctx, "acme", "nobody")
		return err
	}); !errors.Is(err, events.ErrSessionNotFound) {
		t.Fatalf("LastID of a session with no event: %v, want ErrSessionNotFound", err)
	}
	if err := whileUnavailable(t, "ReadSession of nobody", func() error {
		return follower.ReadSession(ctx, "acme", "nobody", events.ReadOptions{}, func(events.Event) error { return nil })
	}); !errors.Is(err, events.ErrSessionNotFound) {
		t.Fatalf("ReadSession of a session with no event: %v, want ErrSessionNotFound", err)
	}
	for i := range 200 {
		e := ev("", &events.SessionResumed{Reason: fmt.Sprint(i)})
		var acks []events.Ack
		untilAvailable(t, fmt.Sprintf("append %d", i), func() (err error) {
			acks, err = log.Append(ctx, []events.Event{e})
			return err
		})
		// A read from it includes it (the follower may answer the direct
		// gets; the read goes on until it has the leader's last event).
		var read []uint64
		untilAvailable(t, fmt.Sprintf("read after append %d", i), func() error {
			read = nil
			return follower.ReadSession(ctx, "acme", "s1", events.ReadOptions{FromSeq: acks[0].Seq}, func(e events.Event) error {
				read = append(read, e.Seq)
				return nil
			})
		})
		if len(read) != 1 || read[0] != acks[0].Seq {
			t.Fatalf("append %d acknowledged at seq %d; a read from it right after: %v", i, acks[0].Seq, read)
		}
		var last uint64
		untilAvailable(t, fmt.Sprintf("LastSeq after append %d", i), func() (err error) {
			last, err = follower.LastSeq(ctx, "acme", "s1")
			return err
		})
		if last != acks[0].Seq {
			t.Fatalf("append %d acknowledged at seq %d; LastSeq right after: %d", i, acks[0].Seq, last)
		}
		var id string
		untilAvailable(t, fmt.Sprintf("LastID after append %d", i), func() (err error) {
			last, id, err = follower.LastID(ctx, "acme", "s1")
			return err
		})
		if last != acks[0].Seq || id != acks[0].ID {
			t.Fatalf("append %d acknowledged at seq %d (%s); LastID right after: %d %s", i, acks[0].Seq, acks[0].ID, last, id)
		}
	}

	// One node down: the other two keep a quorum.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_ = servers[2].Close(cctx)
	cancel()
	// One event, retried as it is: its id (Nats-Msg-Id) makes a retry
	// whose first try was stored but not acknowledged in time store nothing.
	completed := ev("t1", &events.TurnCompleted{})
	untilAvailable(t, "append with a node down", func() error {
		_, err := log.Append(ctx, []events.Event{completed})
		return err
	})
	// The read includes the acknowledged event at once, though a follower
	// that has not yet learned of its commit may answer the direct gets:
	// ReadSession reads on until it has the leader's last event.
	var s *projections.Session
	untilAvailable(t, "restore with a node down", func() (err error) {
		s, err = projections.Restore(ctx, log, nil, "acme", "s1")
		return err
	})
	if s.Events != 203 || s.Turns[0].Status != projections.TurnCompleted {
		t.Fatalf("state after a node went down: %d events, turns %+v", s.Events, s.Turns)
	}
}
