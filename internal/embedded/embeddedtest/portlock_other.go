//go:build !unix

package embeddedtest

// claimPort claims every port where POSIX record locks are not available:
// the pool within the process still holds (see portlock_unix.go).
func claimPort(int) bool { return true }
