package claudecode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/turnstone-dev/turnstone/events"
)

// Defaults of FollowConfig.
const (
	// DefaultRecent is FollowConfig.Recent's default: the reconciler's
	// default live horizon (docs/policy.md), so that a session whose file
	// was written that recently is followed as live from the start.
	DefaultRecent = 30 * time.Minute
	// DefaultSettle is FollowConfig.Settle's default.
	DefaultSettle = 100 * time.Millisecond
	// DefaultRetry is FollowConfig.Retry's default.
	DefaultRetry = time.Second
)

// FollowConfig sets how a Follower follows transcripts. The zero value is
// ready to use.
type FollowConfig struct {
	// Options are the conversion options (tenant, source, line limit);
	// the Follower sets Live itself, per file.
	Options Options
	// Recent decides, when Run starts, how each transcript already there
	// is read: one modified within Recent is followed as live (its
	// session may still be running); an older one is imported as history.
	// Any transcript written after Run started is live, and so becomes a
	// history session whose file grows. Default DefaultRecent; a negative
	// value imports every transcript already there as history.
	Recent time.Duration
	// Settle is how long a file must be quiet after a change before it is
	// read again, so that a burst of writes is read once. Default
	// DefaultSettle.
	Settle time.Duration
	// Retry is how long after a failed read or append a file is read
	// again. Default DefaultRetry.
	Retry time.Duration
	// OnRead, when set, is called from Run's goroutine after each read of
	// a transcript, with what it did.
	OnRead func(FollowRead)
}

func (c *FollowConfig) setDefaults() {
	if c.Recent == 0 {
		c.Recent = DefaultRecent
	}
	if c.Settle == 0 {
		c.Settle = DefaultSettle
	}
	if c.Retry == 0 {
		c.Retry = DefaultRetry
	}
}

// Validate reports every problem with the configuration (after defaults),
// each wrapping ErrInvalidOptions, joined; nil when it is usable.
func (c FollowConfig) Validate() error {
	c.setDefaults()
	var errs []error
	if err := c.Options.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Settle < 0 {
		errs = append(errs, fmt.Errorf("%w: settle must not be negative, got %s", ErrInvalidOptions, c.Settle))
	}
	if c.Retry < 0 {
		errs = append(errs, fmt.Errorf("%w: retry must not be negative, got %s", ErrInvalidOptions, c.Retry))
	}
	return errors.Join(errs...)
}

// FollowRead is what one read of one transcript did. File is its path;
// Live whether it was read as live (else as history); Sessions and Events
// what the conversion gave; Appended the events stored by this read (the
// others were stored before); Diagnostics the malformed lines not reported
// by an earlier read of the file; Err a read or store error (the file is
// read again after FollowConfig.Retry).
type FollowRead struct {
	File        string
	Live        bool
	Sessions    int
	Events      int
	Appended    int
	Diagnostics []Diagnostic
	Err         error
}

// Follower records Claude Code transcripts as they are written. Claude
// Code appends each record to ~/.claude/projects/<project>/<session>.jsonl
// as it happens (and a subagent's to <session>/subagents/agent-<id>.jsonl
// since 2.1, or agent-<id>.jsonl beside the session in 2.0); the Follower
// watches the files and directories it is given with fsnotify
// (github.com/fsnotify/fsnotify: inotify, kqueue, ReadDirectoryChangesW),
// picks up new files and appended lines, and appends what they add to a
// Store. A Follower is used by one Run at a time.
type Follower struct {
	store Store
	cfg   FollowConfig
	live  *Converter // Options.Live
	hist  *Converter // the same links, history
	files map[string]*followed
	ids   map[string]map[string]struct{} // tenant/session -> ids stored
}

// followed is what the Follower knows of one transcript file.
type followed struct {
	live    bool      // read as live
	size    int       // bytes read last time (up to the last newline, when live)
	line    int       // the last line a diagnostic was reported for
	changed time.Time // the latest change not read yet (zero: none)
}

// NewFollower returns a Follower that appends to store. It returns an
// error wrapping ErrInvalidOptions when cfg.Validate fails.
func NewFollower(store Store, cfg FollowConfig) (*Follower, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	hist, err := NewConverter(cfg.Options)
	if err != nil {
		return nil, err
	}
	lo := hist.opts
	lo.Live = true
	return &Follower{
		store: store, cfg: cfg, hist: hist,
		live:  &Converter{opts: lo, links: hist.links},
		files: map[string]*followed{},
		ids:   map[string]map[string]struct{}{},
	}, nil
}

// Run follows the transcripts that paths name (files or directories, as
// Expand reads them) until ctx is done. It first reads every transcript
// already there (parents before their subagents; see FollowConfig.Recent
// for which are live), then watches: a directory's new subdirectories and
// new *.jsonl files at any depth, a file argument's appended lines and its
// subagents. Each change is read once the file has been quiet for
// FollowConfig.Settle, as a live transcript (Options.Live): only complete
// lines are read (a last line without its newline waits for the rest), and
// only what later lines cannot change is converted, so that a turn at the
// end of a file still being written stays in flight. The events a read
// adds are appended to the store, in order, each once.
//
// Run returns nil once ctx is done (the watch stops cleanly), an error
// wrapping the fs error when a path cannot be read or watched at the
// start, or the watcher's error if it fails. A read or store error while
// following does not stop Run: it is reported (FollowRead.Err) and the
// file is read again after FollowConfig.Retry.
func (f *Follower) Run(ctx context.Context, paths []string) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("follow transcripts: %w", err)
	}
	defer w.Close()
	roots := make([]root, 0, len(paths))
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("follow transcripts: %w", err)
		}
		r := root{path: filepath.Clean(p), dir: fi.IsDir()}
		roots = append(roots, r)
		if err := r.watch(w); err != nil {
			return fmt.Errorf("follow transcripts: %w", err)
		}
	}
	files, err := Expand(paths)
	if err != nil {
		return fmt.Errorf("follow transcripts: %w", err)
	}
	started := time.Now()
	for _, file := range files {
		if ctx.Err() != nil {
			return nil
		}
		live := true
		if fi, err := os.Stat(file); err == nil && (f.cfg.Recent < 0 || started.Sub(fi.ModTime()) > f.cfg.Recent) {
			live = false
		}
		f.read(ctx, file, live)
	}

	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			if !errors.Is(err, fsnotify.ErrEventOverflow) {
				return fmt.Errorf("follow transcripts: watch: %w", err)
			}
			f.rescan(roots) // events were lost: read everything that changed
			timer.Reset(f.cfg.Settle)
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			f.event(w, roots, ev)
			timer.Reset(f.cfg.Settle)
		case <-timer.C:
			if next := f.readSettled(ctx); next > 0 {
				timer.Reset(next)
			}
		}
	}
}

// root is one path given to Run.
type root struct {
	path string
	dir  bool
}

// watch adds root's directories to w: every directory under a directory
// root; a file root's directory, and its session's subagents directory
// when there is one.
func (r root) watch(w *fsnotify.Watcher) error {
	if !r.dir {
		if err := w.Add(filepath.Dir(r.path)); err != nil {
			return err
		}
		return r.watchSession(w)
	}
	return filepath.WalkDir(r.path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return w.Add(p)
		}
		return nil
	})
}

// watchSession watches a file root's <session> and <session>/subagents
// directories when they exist.
func (r root) watchSession(w *fsnotify.Watcher) error {
	dir := strings.TrimSuffix(r.path, ".jsonl")
	for _, d := range []string{dir, filepath.Join(dir, "subagents")} {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			if err := w.Add(d); err != nil {
				return err
			}
		}
	}
	return nil
}

// wants reports whether root follows the file p: any *.jsonl under a
// directory root; a file root itself and its subagents' transcripts.
func (r root) wants(p string) bool {
	if !strings.HasSuffix(p, ".jsonl") {
		return false
	}
	if r.dir {
		rel, err := filepath.Rel(r.path, p)
		return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
	}
	return p == r.path || filepath.Dir(p) == filepath.Join(strings.TrimSuffix(r.path, ".jsonl"), "subagents")
}

// event notes a change the watcher reported: a new directory that a root
// covers is watched (and the transcripts already in it are read: they may
// have been written before the watch began), a transcript created or
// written is read once it settles, one removed or renamed is forgotten.
func (f *Follower) event(w *fsnotify.Watcher, roots []root, ev fsnotify.Event) {
	p := filepath.Clean(ev.Name)
	if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
		delete(f.files, p)
		return
	}
	if !ev.Has(fsnotify.Create) && !ev.Has(fsnotify.Write) {
		return
	}
	if fi, err := os.Stat(p); err == nil && fi.IsDir() {
		for _, r := range roots {
			if r.covers(p) {
				f.watchNew(w, roots, p)
				return
			}
		}
		return
	}
	for _, r := range roots {
		if r.wants(p) {
			f.changed(p)
			return
		}
	}
}

// covers reports whether root watches directory d: any directory under a
// directory root; a file root's <session> and <session>/subagents.
func (r root) covers(d string) bool {
	if r.dir {
		return r.wants(filepath.Join(d, "x.jsonl"))
	}
	session := strings.TrimSuffix(r.path, ".jsonl")
	return d == session || d == filepath.Join(session, "subagents")
}

// watchNew watches the new directory d and the directories under it that
// a root covers, and marks the transcripts in them changed.
func (f *Follower) watchNew(w *fsnotify.Watcher, roots []root, d string) {
	_ = filepath.WalkDir(d, func(q string, e fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if e.IsDir() {
			for _, r := range roots {
				if r.covers(q) {
					_ = w.Add(q)
					return nil
				}
			}
			return fs.SkipDir
		}
		for _, r := range roots {
			if r.wants(q) {
				f.changed(q)
				break
			}
		}
		return nil
	})
}

// rescan marks every transcript the roots name changed: after the watcher
// lost events (its queue overflowed).
func (f *Follower) rescan(roots []root) {
	paths := make([]string, len(roots))
	for i, r := range roots {
		paths[i] = r.path
	}
	files, _ := Expand(paths)
	for _, p := range files {
		f.changed(p)
	}
}

// changed marks a transcript to read, as live, once it settles.
func (f *Follower) changed(p string) {
	st := f.files[p]
	if st == nil {
		st = &followed{}
		f.files[p] = st
	}
	st.changed = time.Now()
}

// readSettled reads the changed transcripts that have been quiet for
// Settle, parents before subagents, and returns how long until the next
// one settles (0: none waits).
func (f *Follower) readSettled(ctx context.Context) time.Duration {
	now := time.Now()
	var due []string
	next := time.Duration(0)
	for p, st := range f.files {
		if st.changed.IsZero() {
			continue
		}
		if wait := st.changed.Add(f.cfg.Settle).Sub(now); wait > 0 {
			if next == 0 || wait < next {
				next = wait
			}
			continue
		}
		due = append(due, p)
	}
	sort.Slice(due, func(i, j int) bool {
		if a, b := isSidechainPath(due[i]), isSidechainPath(due[j]); a != b {
			return b
		}
		return due[i] < due[j]
	})
	for _, p := range due {
		if ctx.Err() != nil {
			return 0
		}
		if st := f.files[p]; st != nil {
			st.changed = time.Time{}
			if !f.read(ctx, p, true) {
				st.changed = time.Now().Add(f.cfg.Retry - f.cfg.Settle)
				if next == 0 || f.cfg.Retry < next {
					next = f.cfg.Retry
				}
			}
		}
	}
	return next
}

// read reads transcript p (as live, or as history) and appends what it
// adds, and reports it. It returns false when reading or appending failed.
func (f *Follower) read(ctx context.Context, p string, live bool) bool {
	st := f.files[p]
	if st == nil {
		st = &followed{}
		f.files[p] = st
	}
	rd := FollowRead{File: p, Live: live}
	defer func() {
		if f.cfg.OnRead != nil {
			f.cfg.OnRead(rd)
		}
	}()
	data, err := os.ReadFile(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			delete(f.files, p)
			return true
		}
		rd.Err = fmt.Errorf("read %s: %w", p, err)
		return false
	}
	if live {
		data = data[:bytes.LastIndexByte(data, '\n')+1] // a line without its newline waits
	}
	if len(data) == st.size && live == st.live && st.size > 0 {
		return true // nothing new
	}
	conv := f.hist
	if live {
		conv = f.live
	}
	res, err := conv.convert(bytes.NewReader(data), p, readAgentMeta(p))
	if err != nil {
		rd.Err = err
		return false
	}
	st.size, st.live = len(data), live
	for _, d := range res.Diagnostics {
		if d.Line > st.line {
			rd.Diagnostics = append(rd.Diagnostics, d)
		}
	}
	for _, d := range rd.Diagnostics {
		st.line = max(st.line, d.Line)
	}
	rd.Sessions, rd.Events = len(res.Sessions), res.EventCount()
	for i := range res.Sessions {
		n, err := f.appendNew(ctx, &res.Sessions[i])
		rd.Appended += n
		if err != nil {
			st.size = 0 // read it whole again
			rd.Err = fmt.Errorf("follow %s: %w", p, err)
			return false
		}
	}
	return true
}

// appendNew appends the events of s the store does not hold, in order, in
// chunks of ImportChunk, and returns how many it appended. It reads the
// session's stored ids once, then keeps them.
func (f *Follower) appendNew(ctx context.Context, s *Session) (int, error) {
	key := s.Tenant + "/" + s.Session
	have := f.ids[key]
	if have == nil {
		ids, err := f.store.EventIDs(ctx, s.Tenant, s.Session)
		if err != nil {
			return 0, fmt.Errorf("read stored ids of %s: %w", key, err)
		}
		have = ids
		f.ids[key] = have
	}
	var missing []events.Event
	for _, ev := range s.Events {
		if _, ok := have[ev.ID]; !ok {
			missing = append(missing, ev)
		}
	}
	appended := 0
	for len(missing) > 0 {
		n := min(ImportChunk, len(missing))
		if err := f.store.Append(ctx, missing[:n]); err != nil {
			delete(f.ids, key) // a failed call may have stored a prefix: read the ids again
			return appended, fmt.Errorf("append events of %s: %w", key, err)
		}
		for _, ev := range missing[:n] {
			have[ev.ID] = struct{}{}
		}
		appended += n
		missing = missing[n:]
	}
	return appended, nil
}
