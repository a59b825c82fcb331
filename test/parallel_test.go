package test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The package's parallel tests are admitted by admission, not by go
// test's own -parallel semaphore, so that the longest start first.
//
// Why: go test pauses every parallel top-level test until the package's
// sequential tests have run, then releases them all at once; which of
// them takes one of -parallel's slots first is up to the Go scheduler,
// so the order is random from run to run. In this package the tests that
// take longest (TestClusterKills: 55 to 90 s under the race detector,
// beside everything else) then often started last and ran on alone: the
// package's, and scripts/test's, last 20 to 40 s, with a core idle.
// Admitting the longest first (the classic longest-processing-time-first
// order for jobs on a fixed number of slots) ends the package earlier,
// and the same way each run.
//
// TestMain sets go test's -parallel far above any count of tests here,
// so its semaphore never holds a test back, and gives admission the
// slots (-parallel as given, or defaultParallel). When fuzzing, where
// -parallel is the count of fuzz workers and the tests still run first,
// go test's semaphore keeps the slots and admission stands aside.
//
// So a test's time in go test's -v and -json output includes its wait
// for a slot (the test logs a wait of 1 s or more), and a -timeout panic
// lists the tests still waiting as running. Under -shuffle, "declaration
// order" is the shuffled order.

// parallel is t.Parallel for this package's top-level tests: it marks
// the test parallel and waits for one of the package's slots, admitting
// tests in the order they were declared (after every parallelLong one).
// Every parallel test here calls it (or parallelLong) as its first
// statement, never t.Parallel itself (TestParallelTestsGoThroughAdmission).
func parallel(t *testing.T) {
	t.Helper()
	admit(t, false)
}

// parallelLong is parallel for a test that takes 15 s or more alone
// under the race detector: it is admitted before every test that called
// parallel.
func parallelLong(t *testing.T) {
	t.Helper()
	admit(t, true)
}

// admission hands out the package's slots.
var admission = &admitter{}

// admitter admits parallel tests, at most slots at once: the long ones
// first, then each kind in declaration order (the order tests
// registered). Nothing is admitted until every registered test has
// arrived, so that the first choice is made among all of them.
type admitter struct {
	mu         sync.Mutex
	off        bool // set by TestMain when fuzzing: admit is t.Parallel
	slots      int  // set by TestMain before any test runs
	registered int  // tests that called admit (before t.Parallel)
	arrived    int  // tests past t.Parallel, waiting or admitted
	running    int
	waiting    []*waiter
}

type waiter struct {
	long  bool
	order int
	ready chan struct{}
}

func admit(t *testing.T, long bool) {
	a := admission
	if a.off || strings.Contains(t.Name(), "/") {
		// Fuzzing (go test's own -parallel holds the slots), or a
		// subtest, which registers only once its parent runs.
		t.Parallel()
		return
	}
	a.mu.Lock()
	order := a.registered
	a.registered++
	a.mu.Unlock()
	// go test runs the top-level tests one after another until each calls
	// t.Parallel, which returns only once the last has: every test is
	// registered before any arrives below.
	t.Parallel()
	w := &waiter{long: long, order: order, ready: make(chan struct{})}
	a.mu.Lock()
	a.arrived++
	a.waiting = append(a.waiting, w)
	a.dispatch()
	a.mu.Unlock()
	queued := time.Now()
	<-w.ready
	// go test's -v line counts a test's time from here only when its own
	// semaphore held it; this one's wait is in that time, so say it.
	if d := time.Since(queued); d >= time.Second {
		t.Logf("admitted after %s waiting for one of the package's %d slots", d.Round(100*time.Millisecond), a.slots)
	}
	t.Cleanup(func() {
		a.mu.Lock()
		a.running--
		a.dispatch()
		a.mu.Unlock()
	})
}

// dispatch admits the first waiters while a slot is free. Called with
// a.mu held.
func (a *admitter) dispatch() {
	if a.arrived < a.registered {
		return
	}
	for a.running < max(a.slots, 1) && len(a.waiting) > 0 {
		best := 0
		for i, w := range a.waiting {
			b := a.waiting[best]
			if w.long != b.long {
				if w.long {
					best = i
				}
			} else if w.order < b.order {
				best = i
			}
		}
		w := a.waiting[best]
		a.waiting = append(a.waiting[:best], a.waiting[best+1:]...)
		a.running++
		close(w.ready)
	}
}

// TestParallelTestsGoThroughAdmission: no test of this package calls
// t.Parallel itself (TestMain opens go test's own semaphore wide, so such
// a test would run beside every admitted one, past the slots), and each
// call of parallel or parallelLong is its test function's first
// statement after any skip (so that every test registers before any is
// admitted).
func TestParallelTestsGoThroughAdmission(t *testing.T) {
	parallel(t)
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil || fn.Name.Name == "admit" {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Parallel" && len(call.Args) == 0 {
					t.Errorf("%s: %s calls %s.Parallel; call parallel(t) or parallelLong(t)", fset.Position(call.Pos()), fn.Name.Name, receiverName(sel.X))
				}
				return true
			})
			for i, stmt := range fn.Body.List {
				if !callsAdmission(stmt) {
					continue
				}
				for _, before := range fn.Body.List[:i] {
					if !skips(before) {
						t.Errorf("%s: %s calls parallel after other statements; make it the first (after any skip)", fset.Position(stmt.Pos()), fn.Name.Name)
						break
					}
				}
			}
		}
	}
}

// receiverName names a selector's receiver for a message (t, or "a T").
func receiverName(x ast.Expr) string {
	if id, ok := x.(*ast.Ident); ok {
		return id.Name
	}
	return "a T"
}

// callsAdmission: stmt is parallel(t) or parallelLong(t).
func callsAdmission(stmt ast.Stmt) bool {
	es, ok := stmt.(*ast.ExprStmt)
	if !ok {
		return false
	}
	call, ok := es.X.(*ast.CallExpr)
	if !ok {
		return false
	}
	id, ok := call.Fun.(*ast.Ident)
	return ok && (id.Name == "parallel" || id.Name == "parallelLong")
}

// skips: stmt is skipShort(t, ...) or an if whose body skips the test.
func skips(stmt ast.Stmt) bool {
	switch s := stmt.(type) {
	case *ast.ExprStmt:
		call, ok := s.X.(*ast.CallExpr)
		if !ok {
			return false
		}
		if id, ok := call.Fun.(*ast.Ident); ok {
			return id.Name == "skipShort"
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		return ok && (sel.Sel.Name == "Skip" || sel.Sel.Name == "Skipf" || sel.Sel.Name == "SkipNow")
	case *ast.IfStmt:
		return s.Else == nil && len(s.Body.List) > 0 && skips(s.Body.List[len(s.Body.List)-1])
	}
	return false
}
