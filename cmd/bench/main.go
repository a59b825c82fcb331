// Command bench measures Turnstone against raw JetStream on one machine, in
// one run, against embedded servers with the same settings (file storage in
// a temporary directory, loopback TCP), and prints each figure, its ratio
// to the baseline and its target, then a markdown table for BENCHMARKS.md
// on stdout.
//
//	go run ./cmd/bench [--quick] [--only NAME,...] [--json FILE]
//
// Ratios are what count: the machine is shared and noisy, so absolute
// numbers vary from run to run.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if IsChild() {
		if err := RunChild(); err != nil {
			fmt.Fprintln(os.Stderr, "bench child server:", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	cmd := NewMain().command()
	cmd.SetArgs(os.Args[1:])
	err := cmd.ExecuteContext(ctx)
	stop()
	removeEngineBinary()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
