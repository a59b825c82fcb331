package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// composeFile is the part of docker-compose.yml the test reads (YAML
// merge keys resolved by the parser).
type composeFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Build       string            `yaml:"build"`
		Entrypoint  []string          `yaml:"entrypoint"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		DependsOn   yaml.Node         `yaml:"depends_on"`
	} `yaml:"services"`
}

// TestDockerCompose checks docker-compose.yml, which no machine of the
// suite can run: it parses, it has the topology docs/scaling.md promises
// (3 JetStream nodes routed to each other, setup with 3 replicas, 2
// engines and 2 workers with distinct names, all on the cluster), and
// every command in it is accepted by the binary it runs (the Turnstone
// commands with --help, which rejects an unknown flag; nats-server with
// -t, which parses every flag first).
func TestDockerCompose(t *testing.T) {
	b, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f composeFile
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	arg := func(cmd []string, flag string) string {
		if i := slices.Index(cmd, flag); i >= 0 && i+1 < len(cmd) {
			return cmd[i+1]
		}
		return ""
	}
	var engines, workers, nats []string
	natsURL := ""
	for name, s := range f.Services {
		switch {
		case strings.HasPrefix(s.Image, "nats:"):
			nats = append(nats, name)
			if arg(s.Command, "--cluster_name") != "turnstone" || !slices.Contains(s.Command, "--jetstream") {
				t.Errorf("%s: not a JetStream node of cluster turnstone: %v", name, s.Command)
			}
			routes := arg(s.Command, "--routes")
			for i := 1; i <= 3; i++ {
				other := fmt.Sprintf("nats-%d", i)
				if other != name && !strings.Contains(routes, "nats://"+other+":6222") {
					t.Errorf("%s: no route to %s: %q", name, other, routes)
				}
			}
			out, _ := exec.Command(natsServerBinary(t), append(slices.Clone(s.Command), "-t")...).CombinedOutput()
			if strings.Contains(string(out), "not defined") || !strings.Contains(string(out), "must specify") {
				t.Errorf("%s: nats-server does not accept %v:\n%s", name, s.Command, out)
			}
		case s.Build != "":
			if natsURL == "" {
				natsURL = s.Environment["TURNSTONE_NATS_URL"]
			}
			if u := s.Environment["TURNSTONE_NATS_URL"]; u != natsURL || strings.Count(u, "nats://") != 3 {
				t.Errorf("%s: TURNSTONE_NATS_URL %q, want the three nodes", name, u)
			}
			bin := "engine"
			if len(s.Entrypoint) > 0 {
				bin = filepath.Base(s.Entrypoint[0])
			}
			switch {
			case bin == "worker":
				workers = append(workers, arg(s.Command, "--name"))
			case len(s.Command) > 0 && s.Command[0] == "serve":
				engines = append(engines, arg(s.Command, "--name"))
				if !slices.Contains(s.Command, "--use-existing") {
					t.Errorf("%s: an engine that may change the streams setup made: %v", name, s.Command)
				}
			case len(s.Command) > 0 && s.Command[0] == "setup":
				if arg(s.Command, "--replicas") != "3" {
					t.Errorf("%s: setup without --replicas 3: %v", name, s.Command)
				}
			}
			cmd := exec.Command(filepath.Join(binDir, bin), append(slices.Clone(s.Command), "--help")...)
			cmd.Env = withoutNATSURL()
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("%s: %s %v: %v\n%s", name, bin, s.Command, err, out)
			}
		}
	}
	slices.Sort(engines)
	slices.Sort(workers)
	if len(nats) != 3 || len(engines) != 2 || len(workers) != 2 ||
		slices.Contains(engines, "") || slices.Contains(workers, "") || engines[0] == engines[1] || workers[0] == workers[1] {
		t.Fatalf("want 3 nats nodes, 2 named engines and 2 named workers; got %v, %v, %v", nats, engines, workers)
	}
}
