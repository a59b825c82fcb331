package main

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/turnstone-dev/turnstone/events"
)

// durabilitySessions is how many sessions the durability cases write to.
const durabilitySessions = 1000

// durabilityFigure measures what fsync before every ack costs, for the
// choice of the embedded server's default: raw async publish and
// Log.Append with 1, 6 (one turn) and 100 events per call, and one turn
// per call as an atomic batch (ExpectLastSeq), each on a server with
// JetStream's default sync interval (2 minutes), one that syncs every
// second, and one with SyncAlways. Every case has AppendWriters writers,
// each writing its own sessions' turns in order; the atomic case writes a
// twentieth of the events (it is slow).
func (r *runner) durabilityFigure(ctx context.Context) error {
	settings := []struct {
		name     string
		always   bool
		interval time.Duration
	}{
		{"default", false, 0}, {"1s", false, time.Second}, {"always", true, 0},
	}
	results := map[string]map[string]float64{} // case -> setting -> events/s
	var names []string
	for _, set := range settings {
		n := r.sizes.SyncEvents
		if !set.always {
			n *= 4 // the same wall time, roughly
		}
		srv, err := startServerSync(set.always, set.interval)
		if err != nil {
			return err
		}
		err = func() error {
			defer srv.close()
			tc, l, err := openLog(ctx, srv.url, "bench-durability")
			if err != nil {
				return err
			}
			defer tc.nc.Close()
			rc, err := connect(srv.url, "bench-raw")
			if err != nil {
				return err
			}
			defer rc.nc.Close()
			w := r.sizes.AppendWriters
			cases := []struct {
				name string
				run  func(prefix string) (time.Duration, int, error)
			}{
				{"raw PublishMsgAsync, 100 in flight per writer", func(prefix string) (time.Duration, int, error) {
					evs := flatten(writerTurns(prefix, n, w))
					msgs, err := rawMessages(evs, l.Partitions())
					if err != nil {
						return 0, 0, err
					}
					d, err := publishConcurrently(ctx, rc.js, msgs, 100, w)
					return d, len(msgs), err
				}},
				{"Log.Append, 1 event per call", appendCase(ctx, l, n, w, 1, false)},
				{"Log.Append, 1 turn (6 events) per call", appendCase(ctx, l, n, w, turnLen, false)},
				{"Log.Append, 100 events per call", appendCase(ctx, l, n, w, 100, false)},
				{"Log.Append, 1 turn per call, atomic batch (ExpectLastSeq)", appendCase(ctx, l, max(n/20, 6*w), w, turnLen, true)},
			}
			for i, c := range cases {
				runtime.GC()
				d, got, err := c.run(fmt.Sprintf("d%d%s", i, set.name))
				if err != nil {
					return fmt.Errorf("%s: %w", c.name, err)
				}
				v := rate(got, d)
				if results[c.name] == nil {
					results[c.name] = map[string]float64{}
					names = append(names, c.name)
				}
				results[c.name][set.name] = v
				r.logf("   sync %-7s %s: %s", set.name, c.name, perSec(v))
			}
			return nil
		}()
		if err != nil {
			return err
		}
	}
	for _, name := range names {
		res := results[name]
		def, sec, alw := res["default"], res["1s"], res["always"]
		r.add(Row{
			Bench:    "durability",
			Figure:   name + fmt.Sprintf(", %d writers", r.sizes.AppendWriters),
			Value:    fmt.Sprintf("%s fsync before every ack; %s sync every 1s", perSec(alw), perSec(sec)),
			Baseline: perSec(def) + " default sync (2 min)",
			Ratio:    alw / def,
			Metrics:  map[string]float64{"sync_always_events_per_s": alw, "sync_1s_events_per_s": sec, "default_events_per_s": def, "ratio": alw / def},
		})
	}
	return nil
}

// writerTurns builds n events of durabilitySessions sessions for w writers:
// writer k gets the sessions i with i%w == k, turn after turn, each turn's
// events together.
func writerTurns(prefix string, n, w int) [][]events.Event {
	out := make([][]events.Event, w)
	at := time.Now().UTC()
	sessions := min(durabilitySessions, max(1, n/turnLen))
	made := 0
	for t := 0; made < n; t++ {
		for i := 0; i < sessions && made < n; i++ {
			for k := 0; k < turnLen; k++ {
				out[i%w] = append(out[i%w], turnEvent(sessionName(prefix, i), t, k, made, at))
				made++
			}
		}
	}
	return out
}

func flatten(xss [][]events.Event) []events.Event {
	var out []events.Event
	for _, xs := range xss {
		out = append(out, xs...)
	}
	return out
}

// appendCase appends n events from w writers, per events per call; atomic
// calls are one turn of one session with ExpectLastSeq.
func appendCase(ctx context.Context, l *events.Log, n, w, per int, atomic bool) func(prefix string) (time.Duration, int, error) {
	return func(prefix string) (time.Duration, int, error) {
		lists := writerTurns(prefix, n, w)
		total := len(flatten(lists))
		start := time.Now()
		err := parallel(w, func(k int) error {
			evs := lists[k]
			last := map[string]uint64{}
			for i := 0; i < len(evs); i += per {
				batch := evs[i:min(i+per, len(evs))]
				if !atomic {
					if _, err := l.Append(ctx, batch); err != nil {
						return err
					}
					continue
				}
				s := batch[0].Session
				acks, err := l.Append(ctx, batch, events.ExpectLastSeq(last[s]))
				if err != nil {
					return err
				}
				last[s] = acks[len(acks)-1].Seq
			}
			return nil
		})
		return time.Since(start), total, err
	}
}
