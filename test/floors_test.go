package test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestBinariesLinkOnlyTheirFloors keeps the small binaries small (issue
// 19): the worker and the reference runtime link neither the NATS server
// nor the engine's packages, and the public packages (the contract and
// the read model a runtime or an embedder imports) link no engine either.
// It reads `go list -deps`, so an import that drags a floor up fails here
// before it ships.
func TestBinariesLinkOnlyTheirFloors(t *testing.T) {
	if testing.Short() {
		t.Skip("go list of the module: not in -short")
	}
	parallel(t)
	const mod = "github.com/turnstone-dev/turnstone/"
	engineSide := []string{
		"github.com/nats-io/nats-server/",
		mod + "internal/engine",
		mod + "internal/reconciler",
		mod + "internal/ingestserver",
		mod + "internal/presence",
		mod + "internal/embedded",
		mod + "internal/web",
		mod + "internal/forensics",
		mod + "internal/correlate",
		mod + "internal/auth",
	}
	for _, c := range []struct {
		pkg    string
		forbid []string
	}{
		{"../cmd/worker", engineSide},
		{"../cmd/refruntime", append(engineSide, mod+"internal/worker")},
		{"../events", append(engineSide, mod+"internal/worker", mod+"projections", mod+"recovery")},
		{"../recovery", append(engineSide, mod+"internal/worker", mod+"projections", mod+"internal/pgroup")},
		{"../ingest", append(engineSide, mod+"internal/worker", mod+"projections")},
		{"../projections", append(engineSide, mod+"internal/worker")},
		{"../refruntime", append(engineSide, mod+"internal/worker")},
	} {
		out, err := exec.Command("go", "list", "-deps", c.pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", c.pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, f := range c.forbid {
				if dep == f || strings.HasPrefix(dep, f) && (strings.HasSuffix(f, "/") || strings.HasPrefix(dep, f+"/")) {
					t.Errorf("%s links %s", c.pkg, dep)
				}
			}
		}
	}
}

// TestPublicSurfaceIsTheContract keeps the public packages to the ones a
// runtime or an embedder imports (issue 19; docs/design.md, "Layout"):
// every other package of the module is a main, the end-to-end tests, or
// under internal/, where no other module can import it.
func TestPublicSurfaceIsTheContract(t *testing.T) {
	if testing.Short() {
		t.Skip("go list of the module: not in -short")
	}
	parallel(t)
	const mod = "github.com/turnstone-dev/turnstone"
	public := map[string]bool{
		mod + "/events": true, mod + "/events/sessionlogtest": true, mod + "/ingest": true,
		mod + "/recovery": true, mod + "/projections": true, mod + "/refruntime": true,
	}
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{.Name}}", "../...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, name, _ := strings.Cut(line, " ")
		switch {
		case public[path]:
			seen++
		case name == "main", path == mod+"/test", strings.HasPrefix(path, mod+"/internal/"):
		default:
			t.Errorf("%s is public (importable by other modules) but is not part of the contract: move it under internal/", path)
		}
	}
	if seen != len(public) {
		t.Errorf("%d of the %d public packages found: %s", seen, len(public), out)
	}
	for path := range public {
		for _, use := range internalInAPI(t, filepath.Join("..", strings.TrimPrefix(path, mod+"/"))) {
			t.Errorf("%s: its exported API names %s, which another module cannot import: give it a type of the public package", path, use)
		}
	}
}

// internalInAPI parses the non-test files of the package in dir and
// returns each use of a type of an internal/ package in its exported API
// (an exported function's or method's signature, an exported type, or an
// exported field or method of one), as "file:line: Name uses pkg.Type".
func internalInAPI(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var uses []string
	fset := token.NewFileSet()
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		internal := map[string]string{} // the file's name of each internal import
		for _, imp := range f.Imports {
			ipath, _ := strconv.Unquote(imp.Path.Value)
			if !strings.Contains(ipath, "/internal/") {
				continue
			}
			name := ipath[strings.LastIndex(ipath, "/")+1:]
			if imp.Name != nil {
				name = imp.Name.Name
			}
			internal[name] = ipath
		}
		if len(internal) == 0 {
			continue
		}
		check := func(what string, n ast.Node) {
			if n == nil {
				return
			}
			ast.Inspect(n, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok {
					if id, ok := sel.X.(*ast.Ident); ok && internal[id.Name] != "" {
						uses = append(uses, fset.Position(sel.Pos()).String()+": "+what+" uses "+id.Name+"."+sel.Sel.Name)
					}
				}
				return true
			})
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() || d.Recv != nil && !exportedRecv(d.Recv) {
					continue
				}
				check(d.Name.Name, d.Type)
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					ts, ok := spec.(*ast.TypeSpec)
					if !ok || !ts.Name.IsExported() {
						continue
					}
					switch typ := ts.Type.(type) {
					case *ast.StructType:
						for _, fld := range typ.Fields.List {
							for _, n := range fld.Names {
								if n.IsExported() {
									check(ts.Name.Name+"."+n.Name, fld.Type)
								}
							}
							if len(fld.Names) == 0 { // embedded
								check(ts.Name.Name, fld.Type)
							}
						}
					case *ast.InterfaceType:
						for _, m := range typ.Methods.List {
							if len(m.Names) == 0 || m.Names[0].IsExported() {
								check(ts.Name.Name, m.Type)
							}
						}
					default:
						check(ts.Name.Name, ts.Type)
					}
				}
			}
		}
	}
	return uses
}

// exportedRecv reports whether a method's receiver type is exported.
func exportedRecv(recv *ast.FieldList) bool {
	typ := recv.List[0].Type
	if star, ok := typ.(*ast.StarExpr); ok {
		typ = star.X
	}
	switch x := typ.(type) {
	case *ast.IndexExpr:
		typ = x.X
	case *ast.IndexListExpr:
		typ = x.X
	}
	id, ok := typ.(*ast.Ident)
	return ok && id.IsExported()
}
