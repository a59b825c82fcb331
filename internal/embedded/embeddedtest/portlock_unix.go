//go:build unix

package embeddedtest

import (
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// portLocks is the file whose bytes FreePort locks, byte p for port p,
// with POSIX record locks (fcntl F_SETLK): a lock is the process's until
// it exits, however it exits, and no other process can take it. So two
// test binaries that go test runs at once (test/ beside events/, each
// starting servers) never hand out the same port, though each checks a
// port is free before it gives it and a server binds it only later.
var portLocks struct {
	once sync.Once
	f    *os.File // never closed: closing any descriptor of the file drops every lock the process holds on it
}

// claimPort locks port p for this process; false when another process
// holds it. Without the lock file (it cannot be opened), every port is
// claimed: the pool within the process still holds.
func claimPort(p int) bool {
	portLocks.once.Do(func() {
		f, err := os.OpenFile(filepath.Join(os.TempDir(), "turnstone-test-ports.lock"), os.O_CREATE|os.O_RDWR, 0o666)
		if err == nil {
			portLocks.f = f
		}
	})
	if portLocks.f == nil {
		return true
	}
	lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: io.SeekStart, Start: int64(p), Len: 1}
	return syscall.FcntlFlock(portLocks.f.Fd(), syscall.F_SETLK, &lk) == nil
}
