package importer

import (
	"context"
	"fmt"
	"os"
	"time"
)

// ImportChunk is how many events Import and the Follower append in one
// Store.Append call.
const ImportChunk = 256

// Progress is called by Import as it goes: done of total bytes of
// transcript input are converted and appended (total is the size of all
// files, known up front). It is called from Import's goroutine.
type Progress func(done, total int)

// Report is what an Import did. Files is the number of transcript files
// read; Sessions the sessions converted; Records the transcript records
// read; Events the events converted; Appended those stored by this Import;
// Existing those the store already held (not appended again); Skipped the
// records that produce no event, by what they are; Unknown the records of
// types the format does not know, by type; Diagnostics the lines (or
// files) skipped as malformed or unreadable; Elapsed the wall time.
type Report struct {
	Files       int
	Sessions    int
	Records     int
	Events      int
	Appended    int
	Existing    int
	Skipped     map[string]int
	Unknown     map[string]int
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

// RecordsPerSecond is the import rate in transcript records (lines that
// parsed) per second of Elapsed; 0 when nothing was timed.
func (r *Report) RecordsPerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Records) / r.Elapsed.Seconds()
}

// Import converts the transcript files of format f in order (as f.Expand
// lists them) and appends their events to store idempotently: for each
// session it reads the ids already stored, lets the conversion continue
// the pieces of a response stored by an import of the file before it grew
// (Input.Stored), and appends, in order and in chunks of ImportChunk, only
// the events not stored. Importing the same files twice appends nothing
// the second time, whatever the store's duplicate window; an import
// stopped midway appends the missing events when run again.
//
// A file that cannot be read, and each malformed line, is a Diagnostic in
// the Report and does not stop the import. Import stops at the first Store
// error, or when ctx is done, and returns the Report so far with an error
// wrapping it ("import <file>: append events of <tenant>/<session>:
// ..."). It returns an error wrapping ErrInvalidOptions, and no Report,
// when opts are invalid. progress may be nil.
func Import(ctx context.Context, store Store, f Format, files []string, opts Options, progress Progress) (*Report, error) {
	start := time.Now()
	conv, err := f.NewConverter(opts)
	if err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	rep := &Report{Skipped: map[string]int{}, Unknown: map[string]int{}}
	defer func() { rep.Elapsed = time.Since(start) }()
	stored := newStoredIDs(store)

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

	for i, file := range files {
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("import %s: %w", file, err)
		}
		res, err := convertFile(conv, file, Input{Stored: stored.lookup(ctx)})
		if err != nil {
			if ctx.Err() != nil || isStoreError(err) {
				return rep, fmt.Errorf("import %s: %w", file, err)
			}
			rep.Diagnostics = append(rep.Diagnostics, Diagnostic{File: file, Err: err})
			done += sizes[i]
			report(done)
			continue
		}
		rep.Files++
		if len(res.Sessions) == 0 {
			rep.NoSession = append(rep.NoSession, file)
		}
		rep.Records += res.Records
		rep.Diagnostics = append(rep.Diagnostics, res.Diagnostics...)
		for k, v := range res.Skipped {
			rep.Skipped[k] += v
		}
		for k, v := range res.Unknown {
			rep.Unknown[k] += v
		}
		n := res.EventCount()
		rep.Events += n
		handled := 0
		for si := range res.Sessions {
			s := &res.Sessions[si]
			rep.Sessions++
			_, err := stored.appendNew(ctx, s, func(appended, existing int) {
				rep.Appended += appended
				rep.Existing += existing
				handled += appended + existing
				if n > 0 {
					report(done + sizes[i]*handled/n)
				}
			})
			if err != nil {
				return rep, fmt.Errorf("import %s: %w", file, err)
			}
		}
		done += sizes[i]
		report(done)
	}
	return rep, nil
}

// storeError marks an error of Input.Stored, which stops an import like
// an append error does (the file is fine; the store is not).
type storeError struct{ err error }

func (e storeError) Error() string { return e.err.Error() }
func (e storeError) Unwrap() error { return e.err }

func isStoreError(err error) bool {
	_, ok := err.(storeError)
	return ok
}

// convertFile opens path and converts it with conv. A failure of
// in.Stored comes back as a storeError.
func convertFile(conv Converter, path string, in Input) (*Result, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("convert transcript: %w", err)
	}
	defer fh.Close()
	if in.Stored != nil {
		stored := in.Stored
		var serr error
		in.Stored = func(tenant, session string) (map[string]struct{}, error) {
			ids, err := stored(tenant, session)
			if err != nil && serr == nil {
				serr = err
			}
			return ids, err
		}
		res, err := conv.Convert(fh, path, in)
		if serr != nil {
			return nil, storeError{fmt.Errorf("read stored ids: %w", serr)}
		}
		return res, err
	}
	return conv.Convert(fh, path, in)
}
