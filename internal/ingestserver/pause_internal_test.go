package ingestserver

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestPauseEndsWhenThePartitionIsNoLongerOwned: a lane's pause before it
// sends a refused event again (pauseWhileOwned) lasts its whole time
// while the partition stays this engine's, and ends within one 20 ms check
// once it is released or its lease ends, so that neither Release (which
// waits for the lane to go idle) nor the next owner waits out the pause.
// In a synctest bubble: the times are the fake clock's, exact.
func TestPauseEndsWhenThePartitionIsNoLongerOwned(t *testing.T) {
	const pause = 5 * time.Second
	newServer := func() *Server {
		s := &Server{partitions: 2}
		s.owned = make([]atomic.Bool, s.partitions)
		s.leases = make([]atomic.Pointer[<-chan struct{}], s.partitions)
		s.owned[1].Store(true)
		return s
	}
	cases := []struct {
		name string
		end  func(s *Server, cancelLease context.CancelFunc) // what happens 100 ms in, or nil
		want time.Duration
	}{
		{"owned throughout", nil, pause},
		{"released", func(s *Server, _ context.CancelFunc) { s.owned[1].Store(false) }, 100 * time.Millisecond},
		{"lease ended", func(_ *Server, cancel context.CancelFunc) { cancel() }, 100 * time.Millisecond},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newServer()
				lease, cancel := context.WithCancel(context.Background())
				defer cancel()
				done := lease.Done()
				s.leases[1].Store(&done)
				if c.end != nil {
					go func() {
						time.Sleep(100 * time.Millisecond)
						c.end(s, cancel)
					}()
				}
				start := time.Now()
				s.pauseWhileOwned(1, pause)
				took := time.Since(start)
				if took < c.want || took > c.want+20*time.Millisecond {
					t.Fatalf("pauseWhileOwned took %s, want %s (within one 20 ms check)", took, c.want)
				}
			})
		})
	}
	// A partition never owned, or out of range: no pause at all.
	synctest.Test(t, func(t *testing.T) {
		s := newServer()
		for _, p := range []int{0, -1, 2} {
			start := time.Now()
			s.pauseWhileOwned(p, pause)
			if took := time.Since(start); took != 0 {
				t.Fatalf("partition %d, not owned: paused %s", p, took)
			}
		}
	})
}
