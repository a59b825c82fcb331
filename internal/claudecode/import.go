package claudecode

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/turnstone-dev/turnstone/events"
)

// ImportChunk is how many events Import appends in one Store.Append call.
const ImportChunk = 256

// Store is where Import appends events: the event log (LogStore), or
// anything that stores events per session and can tell which it holds.
type Store interface {
	// Append stores evs, all valid, in order. They may belong to several
	// sessions of one tenant. A failed call may have stored a prefix of
	// evs; Import re-reads the session's ids before it tries again.
	Append(ctx context.Context, evs []events.Event) error
	// EventIDs returns the ids of the events already stored for the
	// session: an empty set and a nil error when it has none.
	EventIDs(ctx context.Context, tenant, session string) (map[string]struct{}, error)
}

// Progress is called by Import as it goes: done of total bytes of
// transcript input are converted and appended (total is the size of all
// files, known up front). It is called from Import's goroutine.
type Progress func(done, total int)

// Report is what an Import did. Files is the number of transcript files
// read; Sessions the sessions converted; Records the transcript records
// read; Events the events converted; Appended those stored by this Import;
// Existing those the store already held (not appended again); Skipped the
// records that produce no event, by type; Diagnostics the lines (or files)
// skipped as malformed or unreadable; Elapsed the wall time.
type Report struct {
	Files       int
	Sessions    int
	Records     int
	Events      int
	Appended    int
	Existing    int
	Skipped     map[string]int
	Diagnostics []Diagnostic
	// NoSession lists, in order, the files that were read but yielded no
	// session (no record that makes one: an empty file, or one that is
	// not a transcript).
	NoSession []string
	Elapsed   time.Duration
}

// EventsPerSecond is the conversion rate: events converted (appended or
// found stored) per second of Elapsed; 0 when nothing was timed.
func (r *Report) EventsPerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Events) / r.Elapsed.Seconds()
}

// Import converts the transcript files in order (see Expand, which lists
// parents before their subagents so the subagents are linked to their Task
// tool calls) and appends their events to store idempotently: for each
// session it reads the ids already stored and appends, in order and in
// chunks of ImportChunk, only the events not among them. Importing the same
// files twice appends nothing the second time, whatever the store's
// duplicate window; an import stopped midway appends the missing events
// when run again.
//
// A file that cannot be read, and each malformed line, is a Diagnostic in
// the Report and does not stop the import. Import stops at the first Store
// error, or when ctx is done, and returns the Report so far with an error
// wrapping it ("import <file>: append events of <tenant>/<session>:
// ..."). It returns an error wrapping
// ErrInvalidOptions, and no Report, when opts are invalid. progress may be
// nil.
func Import(ctx context.Context, store Store, files []string, opts Options, progress Progress) (*Report, error) {
	start := time.Now()
	conv, err := NewConverter(opts)
	if err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	rep := &Report{Skipped: map[string]int{}}
	defer func() { rep.Elapsed = time.Since(start) }()

	sizes := make([]int, len(files))
	total := 0
	for i, f := range files {
		if fi, err := os.Stat(f); err == nil {
			sizes[i] = int(fi.Size())
			total += sizes[i]
		}
	}
	done := 0
	report := func(n int) {
		if progress != nil {
			progress(n, total)
		}
	}
	report(0)

	for i, f := range files {
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("import %s: %w", f, err)
		}
		res, err := conv.ConvertFile(f)
		if err != nil {
			rep.Diagnostics = append(rep.Diagnostics, Diagnostic{File: f, Err: err})
			done += sizes[i]
			report(done)
			continue
		}
		rep.Files++
		if len(res.Sessions) == 0 {
			rep.NoSession = append(rep.NoSession, f)
		}
		rep.Records += res.Records
		rep.Diagnostics = append(rep.Diagnostics, res.Diagnostics...)
		for k, v := range res.Skipped {
			rep.Skipped[k] += v
		}
		n := res.EventCount()
		rep.Events += n
		handled := 0
		for si := range res.Sessions {
			s := &res.Sessions[si]
			rep.Sessions++
			err := appendNew(ctx, store, s, func(appended, existing int) {
				rep.Appended += appended
				rep.Existing += existing
				handled += appended + existing
				if n > 0 {
					report(done + sizes[i]*handled/n)
				}
			})
			if err != nil {
				return rep, fmt.Errorf("import %s: %w", f, err)
			}
		}
		done += sizes[i]
		report(done)
	}
	return rep, nil
}

// appendNew appends the events of s that store does not hold yet, in
// order, in chunks of ImportChunk, calling step after the existing ones are
// counted and after each chunk.
func appendNew(ctx context.Context, store Store, s *Session, step func(appended, existing int)) error {
	have, err := store.EventIDs(ctx, s.Tenant, s.Session)
	if err != nil {
		return fmt.Errorf("read stored ids of %s/%s: %w", s.Tenant, s.Session, err)
	}
	missing := make([]events.Event, 0, len(s.Events))
	for _, ev := range s.Events {
		if _, ok := have[ev.ID]; !ok {
			missing = append(missing, ev)
		}
	}
	step(0, len(s.Events)-len(missing))
	for len(missing) > 0 {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("append events of %s/%s: %w", s.Tenant, s.Session, err)
		}
		n := min(ImportChunk, len(missing))
		if err := store.Append(ctx, missing[:n]); err != nil {
			return fmt.Errorf("append events of %s/%s: %w", s.Tenant, s.Session, err)
		}
		step(n, 0)
		missing = missing[n:]
	}
	return nil
}
