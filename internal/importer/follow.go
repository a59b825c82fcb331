package importer

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
)

// Defaults of FollowConfig.
const (
	// DefaultRecent is FollowConfig.Recent's default: the reconciler's
	// default live horizon (docs/policy.md), so that a session whose file
	// was written that recently is followed as live from the start.
	DefaultRecent = 30 * time.Minute
	// DefaultSettle is FollowConfig.Settle's default: far below any turn
	// deadline, so that what a runtime wrote is in the log long before the
	// engine could judge its turn silent.
	DefaultSettle = 100 * time.Millisecond
	// DefaultRetry is FollowConfig.Retry's default.
	DefaultRetry = time.Second
)

// FollowConfig sets how a Follower follows transcripts. The zero value is
// ready to use.
type FollowConfig struct {
	// Options are the conversion options (tenant, source, line limit).
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
// by an earlier read of the file; Unknown the records of unknown types
// not reported by an earlier read, by type; Err a read or store error (the
// file is read again after FollowConfig.Retry).
type FollowRead struct {
	File        string
	Live        bool
	Sessions    int
	Events      int
	Appended    int
	Diagnostics []Diagnostic
	Unknown     map[string]int
	Err         error
}

// Follower records the transcripts of one format as a runtime writes them:
// it watches the files and directories it is given with fsnotify
// (github.com/fsnotify/fsnotify: inotify, kqueue, ReadDirectoryChangesW),
// picks up new directories (Codex's YYYY/MM/DD), new files and appended
// lines, and appends what they add to a Store. A Follower is used by one
// Run at a time.
type Follower struct {
	store  Store
	format Format
	cfg    FollowConfig
	conv   Converter
	files  map[string]*followed
	ids    *storedIDs
}

// followed is what the Follower knows of one transcript file.
type followed struct {
	live    bool           // read as live
	size    int            // bytes read last time (up to the last newline, when live)
	line    int            // the last line a diagnostic was reported for
	unknown map[string]int // unknown record types reported so far
	changed time.Time      // the latest change not read yet (zero: none)
}

// NewFollower returns a Follower of format's transcripts that appends to
// store. It returns an error wrapping ErrInvalidOptions when cfg.Validate
// fails.
func NewFollower(store Store, format Format, cfg FollowConfig) (*Follower, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	conv, err := format.NewConverter(cfg.Options)
	if err != nil {
		return nil, err
	}
	return &Follower{store: store, format: format, cfg: cfg, conv: conv,
		files: map[string]*followed{}, ids: newStoredIDs(store)}, nil
}

// Run follows the transcripts that paths name (files or directories, as
// Format.Expand reads them) until ctx is done. It first reads every
// transcript already there (in Expand's order; see FollowConfig.Recent for
// which are live), then watches: a directory's new subdirectories at any
// depth and the transcripts in them, a file argument's appended lines and
// its companions (Format.Companions). Each change is read once the file
// has been quiet for FollowConfig.Settle, as a live transcript: only
// complete lines are read (a last line without its newline waits for the
// rest); a model response or tool result is recorded as far as it is
// written; what the next lines decide waits for them. The events a read
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
		r := root{path: filepath.Clean(p), dir: fi.IsDir(), format: f.format}
		roots = append(roots, r)
		if err := r.watch(w); err != nil {
			return fmt.Errorf("follow transcripts: %w", err)
		}
	}
	files, err := f.format.Expand(paths)
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
	path   string
	dir    bool
	format Format
}

// watch adds root's directories to w: every directory under a directory
// root; a file root's directory, and its companions and the directories
// between (those that exist).
func (r root) watch(w *fsnotify.Watcher) error {
	if !r.dir {
		if err := w.Add(filepath.Dir(r.path)); err != nil {
			return err
		}
		for _, d := range r.companionChain() {
			if fi, err := os.Stat(d); err == nil && fi.IsDir() {
				if err := w.Add(d); err != nil {
					return err
				}
			}
		}
		return nil
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

// companionChain lists a file root's companion directories and the
// directories between them and the file's own directory: watched so that
// a companion is noticed when it is created.
func (r root) companionChain() []string {
	base := filepath.Dir(r.path)
	var out []string
	seen := map[string]bool{}
	for _, c := range r.format.Companions(r.path) {
		c = filepath.Clean(c)
		var chain []string
		for d := c; d != base && d != filepath.Dir(d) && strings.HasPrefix(d, base); d = filepath.Dir(d) {
			chain = append(chain, d)
		}
		for i := len(chain) - 1; i >= 0; i-- {
			if !seen[chain[i]] {
				seen[chain[i]] = true
				out = append(out, chain[i])
			}
		}
	}
	return out
}

// wants reports whether root follows the file p: a transcript under a
// directory root; a file root itself and the transcripts in its
// companions.
func (r root) wants(p string) bool {
	if r.dir {
		rel, err := filepath.Rel(r.path, p)
		return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && r.format.Transcript(p)
	}
	if p == r.path {
		return true
	}
	for _, c := range r.format.Companions(r.path) {
		if filepath.Dir(p) == filepath.Clean(c) && r.format.Transcript(p) {
			return true
		}
	}
	return false
}

// covers reports whether root watches directory d: any directory under a
// directory root; a file root's companions and the directories between.
func (r root) covers(d string) bool {
	if r.dir {
		rel, err := filepath.Rel(r.path, d)
		return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
	}
	for _, c := range r.companionChain() {
		if d == c {
			return true
		}
	}
	return false
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
	files, _ := f.format.Expand(paths)
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
// Settle, sidechains after the others, and returns how long until the
// next one settles (0: none waits).
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
		if a, b := f.format.Sidechain(due[i]), f.format.Sidechain(due[j]); a != b {
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
	res, err := convertFileData(f.conv, data, p, Input{Live: live, Stored: f.ids.lookup(ctx)})
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
	for k, n := range res.Unknown {
		if n > st.unknown[k] {
			if rd.Unknown == nil {
				rd.Unknown = map[string]int{}
			}
			rd.Unknown[k] = n - st.unknown[k]
		}
	}
	st.unknown = res.Unknown
	rd.Sessions, rd.Events = len(res.Sessions), res.EventCount()
	for i := range res.Sessions {
		n, err := f.ids.appendNew(ctx, &res.Sessions[i], nil)
		rd.Appended += n
		if err != nil {
			st.size = 0 // read it whole again
			rd.Err = fmt.Errorf("follow %s: %w", p, err)
			return false
		}
	}
	return true
}

// convertFileData converts data, the content of the file at path, with
// conv; a failure of in.Stored is an error of the read.
func convertFileData(conv Converter, data []byte, path string, in Input) (*Result, error) {
	var serr error
	if stored := in.Stored; stored != nil {
		in.Stored = func(tenant, session string) (map[string]struct{}, error) {
			ids, err := stored(tenant, session)
			if err != nil && serr == nil {
				serr = err
			}
			return ids, err
		}
	}
	res, err := conv.Convert(bytes.NewReader(data), path, in)
	if serr != nil {
		return nil, fmt.Errorf("follow %s: read stored ids: %w", path, serr)
	}
	return res, err
}
