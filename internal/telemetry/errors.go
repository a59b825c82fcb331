package telemetry

import "errors"

// Sentinel errors of the package. Match them with errors.Is; the errors
// returned wrap them with the details.
var (
	// ErrServerStarted: Start was called on a Server already started.
	ErrServerStarted = errors.New("telemetry server already started")
	// ErrServerClosed: Start was called on a Server already closed.
	ErrServerClosed = errors.New("telemetry server closed")
	// ErrFailClosed: the reconciler fails closed (see
	// Metrics.FailClosedCheck); the error wrapping it carries the reason.
	ErrFailClosed = errors.New("reconciler fails closed")
)
