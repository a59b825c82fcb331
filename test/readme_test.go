package test

// The README is a test: TestREADME runs every shell block of README.md,
// in order, as a reader would paste them, and fails on a non-zero exit or
// on a documented output that does not appear.
//
// # The convention (for whoever adds a section to the README)
//
// A shell block is a fenced block whose info string is sh, bash or shell.
// Each runs as `bash -e` (the first failing command fails it) in one
// scratch directory that holds a copy of this checkout and, beside it,
// ../shared (the real transcripts), so a block runs exactly as written
// from a clone. Blocks share files, not shell variables: write what a
// later block needs to a file (`echo $s > demo.session`), not to a
// variable. Plain commands, no prompt characters; `bin/engine`,
// `bin/worker` and `bin/refruntime` are what the README's build block
// makes.
//
// An HTML comment right above a block (invisible on GitHub) changes how
// the block is run; options are separated by ";":
//
//	<!-- readme-test: skip: needs Docker -->
//	    The block is not run; the text after "skip:" says why (Docker,
//	    a browser, a tool the test machine lacks). Every skip is logged.
//	<!-- readme-test: background; ready: http://127.0.0.1:9465/ui/ -->
//	    The block runs in the background (a server, a worker) until the
//	    test ends, when it gets SIGINT (then SIGKILL). "ready:" makes the
//	    next block wait until it is ready: an http:// URL answers with a
//	    status below 500, a "quoted text" appears in the block's output,
//	    or any other text is a shell command that exits 0. A background
//	    block that exits before it is ready fails the test.
//	<!-- readme-test: timeout: 3m -->
//	    How long the block may run (default 60s; for a background
//	    block, how long it may take to be ready).
//	<!-- readme-test: output -->
//	    Goes above a fenced block (of any language, usually text) that
//	    shows what the shell block before it prints. Each non-empty line
//	    must appear in that block's output (stdout and stderr), in this
//	    order; "..." stands for any text, and a run of spaces matches any
//	    run of white space (table columns vary in width).
//
// The README's own comment near its top lists the ports its blocks use:
//
//	<!-- readme-test: ports 4222 9464 9465 -->
//
// The test maps each to a free port, in every block and every output, and
// sets TURNSTONE_LISTEN and TURNSTONE_TELEMETRY_LISTEN to the ports of
// 4222 and 9464 (the defaults `engine serve` and the clients take), so
// the README runs beside an engine of your own. A new block that listens
// on a new port adds it to that list.
//
// Keep it fast: a block that waits on the engine polls for what it waits
// for (`until bin/engine ...; do sleep 1; done`) rather than sleeping a
// fixed time, and demos that wait for a deadline give it a short one
// (refruntime --turn-deadline).

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// readmeBlock is one fenced block of README.md that the test runs.
type readmeBlock struct {
	line       int // the line of its opening fence
	script     string
	skip       string // why it is skipped ("" when it runs)
	background bool
	ready      string
	timeout    time.Duration
	// output is the documented output that follows it, if any, and the
	// line of that block.
	output     []string
	outputLine int
}

var (
	readmeDirective = regexp.MustCompile(`^<!--\s*readme-test:\s*(.*?)\s*-->\s*$`)
	readmeFence     = regexp.MustCompile("^```\\s*([A-Za-z0-9_-]*)")
)

// parseREADME reads the blocks of a README and the ports its top comment
// lists. Errors: a directive it does not know, an output with no shell
// block before it, an unclosed fence.
func parseREADME(text string) ([]readmeBlock, []int, error) {
	var (
		blocks  []readmeBlock
		ports   []int
		pending []string // directives waiting for their block
		lines   = strings.Split(text, "\n")
	)
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if m := readmeDirective.FindStringSubmatch(l); m != nil {
			if rest, ok := strings.CutPrefix(m[1], "ports "); ok {
				for _, f := range strings.Fields(rest) {
					p, err := strconv.Atoi(f)
					if err != nil {
						return nil, nil, fmt.Errorf("README.md:%d: port %q is not a number", i+1, f)
					}
					ports = append(ports, p)
				}
				continue
			}
			pending = append(pending, m[1])
			continue
		}
		m := readmeFence.FindStringSubmatch(l)
		if m == nil {
			if l != "" {
				pending = nil // a directive binds to the block right below it
			}
			continue
		}
		start := i
		var body []string
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			body = append(body, lines[i])
		}
		if i == len(lines) {
			return nil, nil, fmt.Errorf("README.md:%d: the block is not closed", start+1)
		}
		shell := m[1] == "sh" || m[1] == "bash" || m[1] == "shell"
		b := readmeBlock{line: start + 1, script: strings.Join(body, "\n") + "\n", timeout: time.Minute}
		isOutput := false
		for _, d := range pending {
			for _, opt := range strings.Split(d, ";") {
				opt = strings.TrimSpace(opt)
				key, val, _ := strings.Cut(opt, ":")
				key, val = strings.TrimSpace(key), strings.TrimSpace(val)
				switch key {
				case "skip":
					if val == "" {
						return nil, nil, fmt.Errorf("README.md:%d: skip: say why (skip: needs Docker)", start+1)
					}
					b.skip = val
				case "background":
					b.background = true
				case "ready":
					b.ready = val
				case "timeout":
					d, err := time.ParseDuration(val)
					if err != nil {
						return nil, nil, fmt.Errorf("README.md:%d: timeout %q: %v", start+1, val, err)
					}
					b.timeout = d
				case "output":
					isOutput = true
				default:
					return nil, nil, fmt.Errorf("README.md:%d: unknown readme-test option %q (test/readme_test.go lists them)", start+1, opt)
				}
			}
		}
		pending = nil
		switch {
		case isOutput:
			if len(blocks) == 0 {
				return nil, nil, fmt.Errorf("README.md:%d: an output with no shell block before it", start+1)
			}
			prev := &blocks[len(blocks)-1]
			for _, o := range body {
				if strings.TrimSpace(o) != "" {
					prev.output = append(prev.output, o)
				}
			}
			prev.outputLine = start + 1
		case shell:
			blocks = append(blocks, b)
		}
	}
	return blocks, ports, nil
}

// outputPattern is the regexp of one documented output line: "..." is any
// text, a run of spaces any run of white space.
func outputPattern(line string) *regexp.Regexp {
	var b strings.Builder
	for i, part := range strings.Split(strings.TrimSpace(line), "...") {
		if i > 0 {
			b.WriteString(".*")
		}
		for j, word := range strings.Fields(part) {
			if j > 0 {
				b.WriteString(`\s+`)
			}
			b.WriteString(regexp.QuoteMeta(word))
		}
	}
	return regexp.MustCompile(b.String())
}

// matchOutput reports the first documented line that does not appear in
// out after the lines matched before it ("" when all do).
func matchOutput(want []string, out string) string {
	lines := strings.Split(out, "\n")
	at := 0
	for _, w := range want {
		re := outputPattern(w)
		found := false
		for ; at < len(lines); at++ {
			if re.MatchString(lines[at]) {
				found = true
				at++
				break
			}
		}
		if !found {
			return w
		}
	}
	return ""
}

func TestREADMEConvention(t *testing.T) {
	parallel(t)
	blocks, ports, err := parseREADME("intro\n<!-- readme-test: ports 4222 9465 -->\n\n" +
		"<!-- readme-test: background; ready: \"engine ready\"; timeout: 2m -->\n```sh\nbin/engine serve\n```\n" +
		"```sh\nbin/engine sessions\n```\n<!-- readme-test: output -->\n```text\nTENANT  SESSION ...\ndemo    rt-...   idle\n```\n" +
		"<!-- readme-test: skip: needs Docker -->\n```sh\ndocker compose up\n```\n```yaml\ntenants: [a]\n```\n")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ports, []int{4222, 9465}) || len(blocks) != 3 {
		t.Fatalf("ports %v, %d blocks", ports, len(blocks))
	}
	if b := blocks[0]; !b.background || b.ready != `"engine ready"` || b.timeout != 2*time.Minute || b.script != "bin/engine serve\n" {
		t.Errorf("background block: %+v", b)
	}
	if b := blocks[1]; len(b.output) != 2 || b.skip != "" || b.background {
		t.Errorf("block with output: %+v", b)
	}
	if b := blocks[2]; b.skip != "needs Docker" {
		t.Errorf("skipped block: %+v", b)
	}
	out := "TENANT  SESSION                TURNS  STATUS\ndemo    rt-01JGZ   1      idle\n"
	if miss := matchOutput(blocks[1].output, out); miss != "" {
		t.Errorf("the output does not match at %q", miss)
	}
	if miss := matchOutput([]string{"demo rt-... idle", "TENANT"}, out); miss != "TENANT" {
		t.Errorf("out of order lines matched (%q)", miss)
	}
	for _, bad := range []string{"<!-- readme-test: skip -->\n```sh\nx\n```\n", "<!-- readme-test: sometimes -->\n```sh\nx\n```\n", "<!-- readme-test: output -->\n```text\nx\n```\n"} {
		if _, _, err := parseREADME(bad); err == nil {
			t.Errorf("parseREADME accepted %q", bad)
		}
	}
}

// TestREADME runs README.md's shell blocks as written (see the convention
// above), in a scratch copy of this checkout.
func TestREADME(t *testing.T) {
	if testing.Short() {
		t.Skip("the README's walkthrough (about a minute): not in -short")
	}
	parallelLong(t)
	started := time.Now()
	text, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks, ports, err := parseREADME(string(text))
	if err != nil {
		t.Fatal(err)
	}
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	shared, err := filepath.Abs(filepath.Join(repo, "..", "shared"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(shared, "data")); err != nil {
		t.Fatalf("the README reads ../shared/data beside the checkout: %v", err)
	}
	work := readmeScratch(t, repo, shared)
	// Distinct free ports (freePort never hands out one twice).
	mapped := map[int]int{}
	for _, p := range ports {
		mapped[p] = freePort(t)
	}
	remap := func(s string) string {
		for from, to := range mapped {
			s = regexp.MustCompile(`\b`+strconv.Itoa(from)+`\b`).ReplaceAllString(s, strconv.Itoa(to))
		}
		return s
	}
	env := readmeEnv(t, filepath.Dir(work), mapped)
	logs := filepath.Join(filepath.Dir(work), "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("running README.md in %s (ports %v)", work, mapped)

	// Every block's process group is ended at the end: the servers the
	// background blocks run, and jobs a block left running.
	var procs []*readmeProc
	t.Cleanup(func() {
		for i := len(procs) - 1; i >= 0; i-- {
			procs[i].stop()
		}
	})
	for n, b := range blocks {
		where := fmt.Sprintf("README.md:%d", b.line)
		if b.skip != "" {
			t.Logf("%s: skipped: %s", where, b.skip)
			continue
		}
		script := remap(b.script)
		logFile := filepath.Join(logs, fmt.Sprintf("block-%02d-line-%d.log", n+1, b.line))
		p, err := startReadmeBlock(work, env, script, logFile)
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		procs = append(procs, p)
		blockStart := time.Now()
		if b.background {
			if b.ready != "" {
				if err := p.waitReady(remap(b.ready), work, env, b.timeout); err != nil {
					t.Fatalf("%s: the background block is not ready: %v\n--- script ---\n%s--- output ---\n%s", where, err, script, p.output())
				}
			}
			t.Logf("%s: running in the background (ready in %s)", where, time.Since(blockStart).Round(10*time.Millisecond))
			continue
		}
		code, err := p.wait(b.timeout)
		out := p.output()
		if err != nil {
			t.Fatalf("%s: %v\n--- script ---\n%s--- output ---\n%s", where, err, script, out)
		}
		if code != 0 {
			t.Fatalf("%s: exit status %d after %s\n--- script ---\n%s--- output ---\n%s", where, code, time.Since(blockStart).Round(time.Millisecond), script, out)
		}
		if len(b.output) > 0 {
			var want []string
			for _, w := range b.output {
				want = append(want, remap(w))
			}
			if miss := matchOutput(want, out); miss != "" {
				t.Fatalf("%s: the output documented at README.md:%d does not appear: %q\n--- script ---\n%s--- output ---\n%s",
					where, b.outputLine, miss, script, out)
			}
		}
		t.Logf("%s: ok in %s", where, time.Since(blockStart).Round(10*time.Millisecond))
	}
	t.Logf("README.md: %d blocks in %s", len(blocks), time.Since(started).Round(100*time.Millisecond))
}

// readmeScratch prepares the scratch directory: a copy of the checkout at
// DIR/work (without .git and what builds and runs leave) and DIR/shared,
// a link to the real transcripts. DIR is the same for one checkout from
// run to run, so the go build of the README's blocks finds its packages
// in Go's build cache after the first run; a lock keeps two runs apart.
func readmeScratch(t *testing.T, repo, shared string) string {
	t.Helper()
	sum := sha256.Sum256([]byte(repo))
	dir := filepath.Join(os.TempDir(), "turnstone-readme-"+hex.EncodeToString(sum[:6]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Close() })
	for _, d := range []string{"work", "home", "logs"} {
		if err := os.RemoveAll(filepath.Join(dir, d)); err != nil {
			t.Fatal(err)
		}
	}
	work := filepath.Join(dir, "work")
	skip := map[string]bool{".git": true, "bin": true, "turnstone-data": true, "test-artifacts": true}
	err = filepath.WalkDir(repo, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(repo, path)
		if d.IsDir() && skip[rel] {
			return filepath.SkipDir
		}
		dst := filepath.Join(work, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(dst, 0o755)
		case d.Type().IsRegular():
			return copyFile(path, dst)
		}
		return nil // links, sockets: not part of a clone
	})
	if err != nil {
		t.Fatalf("copy the checkout: %v", err)
	}
	link := filepath.Join(dir, "shared")
	_ = os.Remove(link)
	if err := os.Symlink(shared, link); err != nil {
		t.Fatal(err)
	}
	return work
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// readmeEnv is the environment of the README's blocks: this one without
// TURNSTONE_*, a home of their own (so contexts saved by the README stay
// in the scratch directory) with Go's caches and settings where they were
// (GOCACHE, GOMODCACHE, GOPATH, GOENV), colours off,
// and the engine's default ports mapped (TURNSTONE_LISTEN,
// TURNSTONE_TELEMETRY_LISTEN).
func readmeEnv(t *testing.T, dir string, mapped map[int]int) []string {
	t.Helper()
	goEnv, err := exec.Command("go", "env", "-json", "GOCACHE", "GOMODCACHE", "GOPATH", "GOENV").Output()
	if err != nil {
		t.Fatal(err)
	}
	var g map[string]string
	if err := json.Unmarshal(goEnv, &g); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(dir, "home")
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "TURNSTONE_") || k == "HOME" || k == "XDG_CONFIG_HOME" || k == "NATS_URL" {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, ".config"), "NO_COLOR=1",
		"GOCACHE="+g["GOCACHE"], "GOMODCACHE="+g["GOMODCACHE"], "GOPATH="+g["GOPATH"], "GOENV="+g["GOENV"])
	if p, ok := mapped[4222]; ok {
		env = append(env, fmt.Sprintf("TURNSTONE_LISTEN=127.0.0.1:%d", p))
	}
	if p, ok := mapped[9464]; ok {
		env = append(env, fmt.Sprintf("TURNSTONE_TELEMETRY_LISTEN=127.0.0.1:%d", p))
	}
	return env
}

// readmeProc is one block running as `bash -e`, in its own process group,
// its output in a file (so that a job it leaves in the background does
// not hold the test's pipe open).
type readmeProc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	code int
}

func startReadmeBlock(dir string, env []string, script, log string) (*readmeProc, error) {
	f, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("bash", "-e", "-c", script)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	p := &readmeProc{cmd: cmd, log: log, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		f.Close()
		p.code = cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	return p, nil
}

func (p *readmeProc) output() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// wait waits up to d for the block and returns its exit status; past d it
// kills the block's process group and returns an error.
func (p *readmeProc) wait(d time.Duration) (int, error) {
	select {
	case <-p.done:
		return p.code, nil
	case <-time.After(d):
		p.stop()
		return 0, fmt.Errorf("still running after %s (readme-test: timeout: sets another bound)", d)
	}
}

// waitReady waits until ready holds (see the convention) or d passes.
func (p *readmeProc) waitReady(ready, dir string, env []string, d time.Duration) error {
	deadline := time.Now().Add(d)
	client := http.Client{Timeout: 2 * time.Second}
	for {
		select {
		case <-p.done:
			return fmt.Errorf("it exited (status %d) before it was ready", p.code)
		default:
		}
		ok := false
		switch {
		case strings.HasPrefix(ready, "http://"), strings.HasPrefix(ready, "https://"):
			if resp, err := client.Get(ready); err == nil {
				resp.Body.Close()
				ok = resp.StatusCode < 500
			}
		case strings.HasPrefix(ready, `"`) && strings.HasSuffix(ready, `"`) && len(ready) > 1:
			ok = strings.Contains(p.output(), ready[1:len(ready)-1])
		default:
			c := exec.Command("bash", "-c", ready)
			c.Dir, c.Env = dir, env
			ok = c.Run() == nil
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not ready after %s", ready, d)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// stop ends the block's process group: SIGINT (a server shuts down
// cleanly), then SIGKILL after 10 s.
func (p *readmeProc) stop() {
	select {
	case <-p.done:
		// The block is done; jobs it left behind may not be.
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGINT)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}
