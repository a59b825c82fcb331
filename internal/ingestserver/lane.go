package ingestserver

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A lane serialises one partition's appends, fairly across tenants:
//
//   - each tenant has its own queue, bounded by Config.TenantQueue: a
//     request that finds its tenant's queue full is refused at once
//     (ingest.CodeBusy), whatever the other tenants do;
//   - the tenants with a request ready are served in turn (round robin),
//     one request each;
//   - a tenant has at most Config.TenantInFlight appends sent to JetStream
//     and not yet acknowledged; past that it waits for its own acks, and
//     the others go on.
//
// So a request of one tenant waits behind at most TenantInFlight appends
// of each other tenant active in the partition (plus those of its own
// tenant queued before it), never behind another tenant's queue.
//
// A tenant's requests are taken in the order they came, and a request
// that must be appended on its own (a batch, or one with a condition:
// item.sync) waits until the tenant's appends in flight are acknowledged
// and holds the tenant's later requests until it is answered, so one
// session's events are stored in the order they were sent.
type lane struct {
	s *Server
	p int

	mu      sync.Mutex
	tenants map[string]*tenantQueue
	ready   []*tenantQueue // tenants with a request that can go now, in turn
	closing bool
	busy    int // requests taken and not yet answered, all tenants

	wake    chan struct{} // something changed: look again
	replies chan pendingReply
	// outage is when the replier's current run of "no responders"
	// began (zero: its last event was stored), refused when it last met
	// one; the replier's own.
	outage, refused time.Time
}

// item is one append request in a lane.
type item struct {
	m               *nats.Msg
	tenant, session string
	// sync: the request is appended on its own, after the tenant's
	// appends in flight (a batch, or a JetStream expectation to check).
	sync bool
}

// tenantQueue is one tenant's requests in a lane.
type tenantQueue struct {
	name     string
	items    []item // queued, oldest first from head
	head     int
	inflight int  // appends sent and not yet acknowledged
	blocked  bool // a sync request is being appended
	isReady  bool // in lane.ready
}

func (t *tenantQueue) queued() int { return len(t.items) - t.head }

// pendingReply is an append sent to JetStream whose acknowledgement the
// replier awaits.
type pendingReply struct {
	msg             *nats.Msg
	out             *nats.Msg // the event's message, sent again on "no responders"
	fut             jetstream.PubAckFuture
	tenant, session string // the append holds the erasure gate until it is answered
	tq              *tenantQueue
}

func newLane(s *Server, p int) *lane {
	return &lane{s: s, p: p, tenants: map[string]*tenantQueue{}, wake: make(chan struct{}, 1),
		replies: make(chan pendingReply, s.cfg.QueueLen)}
}

// runnableLocked reports whether t's next request can go now.
func (l *lane) runnableLocked(t *tenantQueue) bool {
	if t.queued() == 0 || t.blocked {
		return false
	}
	if t.items[t.head].sync {
		return t.inflight == 0
	}
	return t.inflight < l.s.cfg.TenantInFlight
}

// markReadyLocked puts t at the end of the turn when its next request can
// go, and forgets a tenant with nothing queued or in flight. It reports
// whether it put t in the turn: only then has the scheduler something
// new to do (it sleeps only when no tenant is ready).
func (l *lane) markReadyLocked(t *tenantQueue) bool {
	added := false
	if !t.isReady && l.runnableLocked(t) {
		t.isReady = true
		l.ready = append(l.ready, t)
		added = true
	}
	if t.queued() == 0 && t.inflight == 0 && !t.blocked && !t.isReady && l.tenants[t.name] == t {
		delete(l.tenants, t.name)
	}
	return added
}

func (l *lane) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// enqueue adds a request to its tenant's queue; false when the queue is
// full (or the lane closed).
func (l *lane) enqueue(it item) bool {
	l.mu.Lock()
	if l.closing {
		l.mu.Unlock()
		return false
	}
	t := l.tenants[it.tenant]
	if t == nil {
		t = &tenantQueue{name: it.tenant}
		l.tenants[it.tenant] = t
	}
	if t.queued() >= l.s.cfg.TenantQueue {
		l.mu.Unlock()
		return false
	}
	if t.head > 0 && t.head == len(t.items) {
		t.items, t.head = t.items[:0], 0
	}
	t.items = append(t.items, it)
	l.busy++
	wake := l.markReadyLocked(t)
	l.mu.Unlock()
	if wake {
		l.signal()
	}
	return true
}

// next takes the next request to handle, in turn, or reports that the
// lane is closed and idle.
func (l *lane) next() (item, *tenantQueue, bool) {
	for {
		l.mu.Lock()
		for len(l.ready) > 0 {
			t := l.ready[0]
			l.ready[0] = nil
			l.ready = l.ready[1:]
			t.isReady = false
			if !l.runnableLocked(t) {
				continue
			}
			it := t.items[t.head]
			t.items[t.head] = item{}
			t.head++
			if t.head > 64 && t.head*2 > len(t.items) {
				t.items = append(t.items[:0], t.items[t.head:]...)
				t.head = 0
			}
			if it.sync {
				t.blocked = true
			} else {
				t.inflight++
			}
			// Its next request waits for the others' turn.
			l.markReadyLocked(t)
			l.mu.Unlock()
			return it, t, true
		}
		if l.closing && l.busy == 0 {
			l.mu.Unlock()
			return item{}, nil, false
		}
		l.mu.Unlock()
		<-l.wake
	}
}

// done records that a request of t was answered (sync: it was appended
// on its own).
func (l *lane) done(t *tenantQueue, sync bool) {
	l.mu.Lock()
	if sync {
		t.blocked = false
	} else {
		t.inflight--
	}
	l.busy--
	wake := l.markReadyLocked(t) || (l.closing && l.busy == 0)
	l.mu.Unlock()
	if wake {
		l.signal()
	}
}

// idle reports whether the lane has answered every request it took.
func (l *lane) idle() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.busy == 0
}

// close makes the lane finish the requests it holds and stop.
func (l *lane) close() {
	l.mu.Lock()
	l.closing = true
	l.mu.Unlock()
	l.signal()
}

// run handles the lane's requests until it is closed and idle.
func (l *lane) run() {
	defer close(l.replies)
	for {
		it, t, ok := l.next()
		if !ok {
			return
		}
		if it.sync {
			l.s.wg.Add(1)
			go func() {
				defer l.s.wg.Done()
				l.s.appendSync(it)
				l.done(t, true)
			}()
			continue
		}
		if pr, ok := l.s.appendAsync(it); ok {
			pr.tq = t
			l.replies <- pr
		} else {
			l.done(t, false)
		}
	}
}

// replier answers the lane's asynchronous appends once JetStream
// acknowledged them, in the order they were sent.
func (l *lane) replier() {
	timer := time.NewTimer(time.Hour) // one timer for the lane, reset per reply
	defer timer.Stop()
	for pr := range l.replies {
		l.s.awaitReply(l, pr, timer)
		l.done(pr.tq, false)
	}
}
