package otel

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// The environment variables Turnstone reads itself. The OTLP exporters
// read the rest of the standard ones (OTEL_EXPORTER_OTLP_HEADERS,
// _TIMEOUT, _COMPRESSION, _CERTIFICATE, their _TRACES_ forms), and the
// resource reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
const (
	EnvEndpoint        = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint  = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvProtocol        = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol  = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	EnvTracesExporter  = "OTEL_TRACES_EXPORTER"
	EnvSDKDisabled     = "OTEL_SDK_DISABLED"
	EnvCaptureContent  = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
	EnvScheduleDelay   = "OTEL_BSP_SCHEDULE_DELAY"
	EnvExportTimeout   = "OTEL_BSP_EXPORT_TIMEOUT"
	EnvMaxQueueSize    = "OTEL_BSP_MAX_QUEUE_SIZE"
	EnvMaxExportBatch  = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"
	ProtocolGRPC       = "grpc"
	ProtocolHTTP       = "http/protobuf"
	protocolHTTPJSON   = "http/json"
	DefaultServiceName = "turnstone"
)

// ErrInvalidConfig is wrapped by the errors of a configuration (an
// environment variable) that cannot be used.
var ErrInvalidConfig = errors.New("invalid OpenTelemetry configuration")

// Batch is how spans are batched to the exporter. Its fields are the
// batch span processor's standard settings (the OpenTelemetry
// specification's OTEL_BSP_* variables, with their defaults), which the
// export honours with the same meanings, though it batches itself: it
// acknowledges the events a batch came from only once the batch is
// exported, so that a backend that is down delays the export and loses
// nothing.
type Batch struct {
	// ScheduleDelay is the longest a span waits for its batch to fill
	// (OTEL_BSP_SCHEDULE_DELAY, milliseconds; default 5 s).
	ScheduleDelay time.Duration
	// ExportTimeout bounds one export call (OTEL_BSP_EXPORT_TIMEOUT,
	// milliseconds; default 30 s).
	ExportTimeout time.Duration
	// MaxQueueSize is how many spans may wait for export before the
	// export stops reading the log (OTEL_BSP_MAX_QUEUE_SIZE; default
	// 2048).
	MaxQueueSize int
	// MaxExportBatchSize is the most spans one export call sends
	// (OTEL_BSP_MAX_EXPORT_BATCH_SIZE; default 512; at most
	// MaxQueueSize).
	MaxExportBatchSize int
}

func (b *Batch) setDefaults() {
	if b.ScheduleDelay <= 0 {
		b.ScheduleDelay = 5 * time.Second
	}
	if b.ExportTimeout <= 0 {
		b.ExportTimeout = 30 * time.Second
	}
	if b.MaxQueueSize <= 0 {
		b.MaxQueueSize = 2048
	}
	if b.MaxExportBatchSize <= 0 {
		b.MaxExportBatchSize = 512
	}
	if b.MaxExportBatchSize > b.MaxQueueSize {
		b.MaxExportBatchSize = b.MaxQueueSize
	}
}

// ExportConfig is the export an engine's environment asks for.
type ExportConfig struct {
	// Enabled is set when an OTLP endpoint is given
	// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
	// and neither OTEL_SDK_DISABLED=true nor OTEL_TRACES_EXPORTER=none
	// turns it off.
	Enabled bool
	// Endpoint is the endpoint given: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
	// (the traces' URL, used as it is), else OTEL_EXPORTER_OTLP_ENDPOINT
	// (a base URL, to which OTLP/HTTP adds /v1/traces).
	Endpoint string
	// TracesURL is the URL the traces go to: Endpoint with /v1/traces
	// added when it is the base URL and the protocol is OTLP/HTTP.
	TracesURL string
	// Protocol is ProtocolHTTP (the specification's default) or
	// ProtocolGRPC (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else
	// OTEL_EXPORTER_OTLP_PROTOCOL).
	Protocol string
	// Map is the mapping's settings (content capture:
	// OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true).
	Map MapConfig
	// Batch is the batching (OTEL_BSP_*).
	Batch Batch
}

// ConfigFromEnv reads the export's configuration from the standard
// OpenTelemetry environment variables through getenv (nil: os.Getenv).
// Errors (wrapping ErrInvalidConfig, joined): a protocol other than grpc
// and http/protobuf (http/json is not supported), a batch setting that is
// not a positive integer.
func ConfigFromEnv(getenv func(string) string) (ExportConfig, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	var c ExportConfig
	var errs []error
	c.Endpoint = strings.TrimSpace(getenv(EnvTracesEndpoint))
	base := c.Endpoint == ""
	if base {
		c.Endpoint = strings.TrimSpace(getenv(EnvEndpoint))
	}
	exporter := strings.ToLower(strings.TrimSpace(getenv(EnvTracesExporter)))
	disabled := strings.EqualFold(strings.TrimSpace(getenv(EnvSDKDisabled)), "true")
	c.Enabled = c.Endpoint != "" && !disabled && exporter != "none"
	if exporter != "" && exporter != "none" && exporter != "otlp" {
		errs = append(errs, fmt.Errorf("%w: %s=%q: only otlp (or none) is supported", ErrInvalidConfig, EnvTracesExporter, exporter))
	}
	c.Protocol = strings.TrimSpace(getenv(EnvTracesProtocol))
	if c.Protocol == "" {
		c.Protocol = strings.TrimSpace(getenv(EnvProtocol))
	}
	switch c.Protocol {
	case "":
		c.Protocol = ProtocolHTTP
	case ProtocolHTTP, ProtocolGRPC:
	case protocolHTTPJSON:
		errs = append(errs, fmt.Errorf("%w: %s=http/json is not supported: use http/protobuf or grpc", ErrInvalidConfig, EnvProtocol))
	default:
		errs = append(errs, fmt.Errorf("%w: %s=%q: want grpc or http/protobuf", ErrInvalidConfig, EnvProtocol, c.Protocol))
	}
	c.TracesURL = c.Endpoint
	if base && c.Endpoint != "" && c.Protocol == ProtocolHTTP {
		c.TracesURL = strings.TrimSuffix(c.Endpoint, "/") + "/v1/traces"
	}
	if c.Endpoint != "" {
		if u, err := url.Parse(c.Endpoint); err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			errs = append(errs, fmt.Errorf("%w: endpoint %q: want a URL such as http://localhost:4318", ErrInvalidConfig, c.Endpoint))
		}
	}
	c.Map.CaptureContent = strings.EqualFold(strings.TrimSpace(getenv(EnvCaptureContent)), "true")
	ms := func(name string) time.Duration {
		n := positive(getenv, name, &errs)
		return time.Duration(n) * time.Millisecond
	}
	c.Batch.ScheduleDelay = ms(EnvScheduleDelay)
	c.Batch.ExportTimeout = ms(EnvExportTimeout)
	c.Batch.MaxQueueSize = positive(getenv, EnvMaxQueueSize, &errs)
	c.Batch.MaxExportBatchSize = positive(getenv, EnvMaxExportBatch, &errs)
	c.Batch.setDefaults()
	c.Map.setDefaults()
	return c, errors.Join(errs...)
}

// positive reads a positive integer variable (0 when unset).
func positive(getenv func(string) string, name string, errs *[]error) int {
	v := strings.TrimSpace(getenv(name))
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		*errs = append(*errs, fmt.Errorf("%w: %s=%q: want a positive integer", ErrInvalidConfig, name, v))
		return 0
	}
	return n
}

// NewSpanExporter returns the OTLP exporter of c's protocol, sending to
// c.TracesURL, configured by the other standard variables (headers,
// timeout, compression, certificates). Its own retries are off: the caller retries a failed
// export until it succeeds (the live export) or for its RetryFor (the
// backfill), so that a span is never dropped. It connects lazily: a
// backend that is down fails the exports, not this call.
func NewSpanExporter(ctx context.Context, c ExportConfig) (sdktrace.SpanExporter, error) {
	switch c.Protocol {
	case ProtocolGRPC:
		opts := []otlptracegrpc.Option{otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{Enabled: false})}
		if c.TracesURL != "" {
			opts = append(opts, otlptracegrpc.WithEndpointURL(c.TracesURL))
		}
		exp, err := otlptracegrpc.New(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("otlp grpc exporter: %w", err)
		}
		return exp, nil
	case ProtocolHTTP, "":
		opts := []otlptracehttp.Option{otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: false})}
		if c.TracesURL != "" {
			opts = append(opts, otlptracehttp.WithEndpointURL(c.TracesURL))
		}
		exp, err := otlptracehttp.New(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("otlp http exporter: %w", err)
		}
		return exp, nil
	}
	return nil, fmt.Errorf("%w: protocol %q", ErrInvalidConfig, c.Protocol)
}

// ResourceFromEnv describes the exporting process: service.name
// "turnstone" unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES say
// otherwise, the other attributes OTEL_RESOURCE_ATTRIBUTES gives, and
// the SDK's telemetry.sdk.* attributes.
func ResourceFromEnv(ctx context.Context) (*resource.Resource, error) {
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", DefaultServiceName)),
		resource.WithFromEnv(),
	)
	if err != nil && (res == nil || !errors.Is(err, resource.ErrSchemaURLConflict)) {
		return nil, fmt.Errorf("%w: resource (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME): %v", ErrInvalidConfig, err)
	}
	return res, nil
}
