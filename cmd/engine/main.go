// Command engine runs Turnstone: `engine serve` starts the engine (on an
// embedded NATS server unless --nats-url names one), and the other
// subcommands import transcripts and list, inspect and replay sessions
// from the log. Run `engine --help` for the list.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/turnstone-dev/turnstone/internal/console"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCommand(os.Stdout, os.Stderr).ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "engine:", console.EscapeKeepLayout(err.Error()))
		os.Exit(1)
	}
}
