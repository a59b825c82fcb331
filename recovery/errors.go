package recovery

import "errors"

// Sentinel errors of the recovery contract. Match them with errors.Is; the
// errors returned wrap them with the operation and the details.
var (
	// ErrInvalidCommand wraps every rule a command breaks.
	ErrInvalidCommand = errors.New("invalid command")
	// ErrInvalidPolicy wraps every rule a RetryPolicy, a Strategy, a chain
	// or a BreakerConfig breaks.
	ErrInvalidPolicy = errors.New("invalid policy")
	// ErrCommandNotFound: no command with that id is stored for the
	// session.
	ErrCommandNotFound = errors.New("command not found")
	// ErrNotSetUp: the recovery stream, one of its partition consumers or
	// the status bucket does not exist. An operator creates them (`engine
	// setup`, which `engine serve` runs on the embedded server it owns);
	// no other process does.
	ErrNotSetUp = errors.New("recovery stream not set up")
)
