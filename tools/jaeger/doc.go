// Package jaeger pins the Jaeger v2 all-in-one (github.com/jaegertracing/jaeger/cmd/jaeger)
// as a Go tool, in a module of its own so that its dependencies stay out
// of Turnstone's go.mod: `go tool jaeger` here builds it from the Go
// module proxy (about 5 minutes on 2 cores, a 120 MB binary) and runs it
// with its defaults (OTLP on 4317 and 4318, the UI on 16686). The README
// and docs/otel.md use it to show a session in Jaeger, and
// test/otel_jaeger_test.go takes the UI's screenshot.
package jaeger
