package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// NATSServerModule is the module path of the NATS server.
const NATSServerModule = "github.com/nats-io/nats-server/v2"

// NATSServerVersion is the nats-server version go.mod pins: the one the
// engine embeds and the tests run against. A binary that links the server
// (the engine) reports the version from its build information instead; a
// test keeps this constant equal to go.mod's (internal/cli), so the
// worker, which must not link the server (test/floors_test.go), reports it
// truthfully.
const NATSServerVersion = "v2.15.2"

// Set with -ldflags "-X github.com/turnstone-dev/turnstone/internal/cli.version=v1.2.3
// -X ...cli.commit=abc123" by a release build that has no module version
// or VCS stamp of its own (a container image built from a copy of the
// tree). Empty: the build information's.
var version, commit string

// BuildInfo is what --version prints: where a binary comes from.
type BuildInfo struct {
	// Binary is the command's name ("engine", "worker").
	Binary string `json:"binary"`
	// Version is the module's version: a tag when built with `go install
	// ...@vX`, "(devel)" from a checkout.
	Version string `json:"version"`
	// Commit is the VCS revision the binary was built from ("" when the
	// build had no VCS stamp: -buildvcs=false, or no .git), Modified
	// whether the tree had uncommitted changes, and CommitTime when it
	// was committed (RFC 3339, "" when unknown).
	Commit     string `json:"commit,omitempty"`
	Modified   bool   `json:"modified,omitzero"`
	CommitTime string `json:"commit_time,omitempty"`
	// Go is the Go version and platform it was built with.
	Go       string `json:"go"`
	Platform string `json:"platform"`
	// NATSServer is the nats-server version: the embedded one when the
	// binary links the server (NATSServerLinked), else the one go.mod
	// pins (NATSServerVersion). NATSClient is the nats.go version linked.
	NATSServer       string `json:"nats_server"`
	NATSServerLinked bool   `json:"nats_server_linked"`
	NATSClient       string `json:"nats_go,omitempty"`
}

// ReadBuildInfo returns the BuildInfo of the running binary, named binary,
// from runtime/debug.ReadBuildInfo (and the -ldflags overrides).
func ReadBuildInfo(binary string) BuildInfo {
	b := BuildInfo{Binary: binary, Version: "(devel)", Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH,
		NATSServer: NATSServerVersion}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			b.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Commit = s.Value
			case "vcs.modified":
				b.Modified = s.Value == "true"
			case "vcs.time":
				b.CommitTime = s.Value
			}
		}
		for _, d := range bi.Deps {
			if d.Replace != nil {
				d = d.Replace
			}
			switch d.Path {
			case NATSServerModule:
				b.NATSServer, b.NATSServerLinked = d.Version, true
			case "github.com/nats-io/nats.go":
				b.NATSClient = d.Version
			}
		}
	}
	if version != "" {
		b.Version = version
	}
	if commit != "" {
		b.Commit = commit
	}
	return b
}

// String is the BuildInfo as --version prints it, one fact a line.
func (b BuildInfo) String() string {
	var s strings.Builder
	fmt.Fprintf(&s, "%s %s\n", b.Binary, b.Version)
	switch {
	case b.Commit == "":
		s.WriteString("commit       unknown (built without a VCS stamp)\n")
	default:
		c := b.Commit
		if b.Modified {
			c += " (with uncommitted changes)"
		}
		if b.CommitTime != "" {
			c += ", " + b.CommitTime
		}
		fmt.Fprintf(&s, "commit       %s\n", c)
	}
	fmt.Fprintf(&s, "go           %s %s\n", b.Go, b.Platform)
	if b.NATSServerLinked {
		fmt.Fprintf(&s, "nats-server  %s (embedded)\n", b.NATSServer)
	} else {
		fmt.Fprintf(&s, "nats-server  %s (the version it is tested with; not linked)\n", b.NATSServer)
	}
	if b.NATSClient != "" {
		fmt.Fprintf(&s, "nats.go      %s\n", b.NATSClient)
	}
	return s.String()
}
