package otel

import (
	"errors"
	"testing"
	"time"
)

func TestConfigFromEnv(t *testing.T) {
	for name, c := range map[string]struct {
		env       map[string]string
		enabled   bool
		protocol  string
		tracesURL string
		bad       bool
	}{
		"nothing set": {env: nil, protocol: ProtocolHTTP},
		"base endpoint": {env: map[string]string{EnvEndpoint: "http://localhost:4318/"}, enabled: true, protocol: ProtocolHTTP,
			tracesURL: "http://localhost:4318/v1/traces"},
		"traces endpoint as given": {env: map[string]string{EnvEndpoint: "http://a:4318", EnvTracesEndpoint: "https://cloud.langfuse.com/api/public/otel/v1/traces"},
			enabled: true, protocol: ProtocolHTTP, tracesURL: "https://cloud.langfuse.com/api/public/otel/v1/traces"},
		"grpc": {env: map[string]string{EnvEndpoint: "http://localhost:4317", EnvProtocol: "grpc"}, enabled: true, protocol: ProtocolGRPC,
			tracesURL: "http://localhost:4317"},
		"traces protocol wins": {env: map[string]string{EnvEndpoint: "http://x:4317", EnvProtocol: "http/protobuf", EnvTracesProtocol: "grpc"},
			enabled: true, protocol: ProtocolGRPC, tracesURL: "http://x:4317"},
		"sdk disabled":    {env: map[string]string{EnvEndpoint: "http://x:4318", EnvSDKDisabled: "true"}, protocol: ProtocolHTTP, tracesURL: "http://x:4318/v1/traces"},
		"exporter none":   {env: map[string]string{EnvEndpoint: "http://x:4318", EnvTracesExporter: "none"}, protocol: ProtocolHTTP, tracesURL: "http://x:4318/v1/traces"},
		"http/json":       {env: map[string]string{EnvEndpoint: "http://x:4318", EnvProtocol: "http/json"}, bad: true},
		"zipkin exporter": {env: map[string]string{EnvEndpoint: "http://x:4318", EnvTracesExporter: "zipkin"}, bad: true},
		"not a url":       {env: map[string]string{EnvEndpoint: "localhost:4318"}, bad: true},
		"bad batch":       {env: map[string]string{EnvEndpoint: "http://x:4318", EnvMaxExportBatch: "-3"}, bad: true},
	} {
		t.Run(name, func(t *testing.T) {
			cfg, err := ConfigFromEnv(func(k string) string { return c.env[k] })
			if c.bad {
				if !errors.Is(err, ErrInvalidConfig) {
					t.Fatalf("want ErrInvalidConfig, got %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Enabled != c.enabled || cfg.Protocol != c.protocol || cfg.TracesURL != c.tracesURL {
				t.Fatalf("got enabled %v protocol %q url %q", cfg.Enabled, cfg.Protocol, cfg.TracesURL)
			}
		})
	}
	cfg, err := ConfigFromEnv(func(k string) string {
		return map[string]string{EnvScheduleDelay: "250", EnvExportTimeout: "1000", EnvMaxQueueSize: "100", EnvMaxExportBatch: "500",
			EnvCaptureContent: "TRUE"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	want := Batch{ScheduleDelay: 250 * time.Millisecond, ExportTimeout: time.Second, MaxQueueSize: 100, MaxExportBatchSize: 100}
	if cfg.Batch != want || !cfg.Map.CaptureContent {
		t.Fatalf("batch %+v (want %+v), capture %v", cfg.Batch, want, cfg.Map.CaptureContent)
	}
}

// TestConsumerNameMatchesTheGrants: the auth role table names the export's
// consumers without importing this package.
func TestConsumerNameMatchesTheGrants(t *testing.T) {
	if got := ConsumerName("", 0); got != "turnstone-otel-p0" {
		t.Fatalf("ConsumerName = %q: change internal/auth/roles.go's otelP with it", got)
	}
}
