package test

import (
	"os/exec"
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
}
