// Command refruntime runs Turnstone's reference agent runtime
// (package refruntime) as a process: it records sessions of turns into the
// event log of a NATS server, with a fault injected into the last turn of
// each session, prints the session ids on stdout, one per line, and with
// --serve keeps answering control requests until SIGINT or SIGTERM.
//
//	refruntime --nats-url nats://127.0.0.1:4222 --tenant acme --sessions 3 --turns 2 --fault provider:529 --serve
//
// --fault takes crash-mid-tool, stage-throws:<stage>, provider:<status>[:<retry after>]
// or hang. With --fault crash-mid-tool, --exit-on-crash exits the process
// with status 3 right after the tool_use is stored: a real crash, for
// tests across processes. --adopt (with --serve) answers for sessions
// another process ran, read back from the log.
//
// Exit status: 0 done, 1 error, 2 bad flags, 3 crashed on purpose.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// ExitCrash is the exit status of a process that crashed on purpose
// (--exit-on-crash).
const ExitCrash = 3

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs the command with args (without the program name) and returns
// the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	m := NewMain(stdout, stderr)
	cmd := m.command()
	if args == nil {
		args = []string{} // not nil: cobra would read os.Args
	}
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	if cerr := m.Close(); err == nil {
		err = cerr
	}
	var usage usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &usage):
		fmt.Fprintln(stderr, "refruntime:", err)
		return 2
	default:
		fmt.Fprintln(stderr, "refruntime:", err)
		return 1
	}
}
