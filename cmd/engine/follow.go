package main

import (
	"context"
	"fmt"

	"github.com/turnstone-dev/turnstone/internal/claudecode"
)

// followTranscripts runs `engine import --follow`: it records the
// transcripts under paths as they are written, one line per read that
// stored something (or failed), until ctx is done (Ctrl-C).
func followTranscripts(ctx context.Context, g *globals, store claudecode.Store, paths []string, tenant string) error {
	f, err := claudecode.NewFollower(store, claudecode.FollowConfig{
		Options: claudecode.Options{Tenant: tenant},
		OnRead: func(rd claudecode.FollowRead) {
			for _, d := range rd.Diagnostics {
				fmt.Fprintf(g.stderr, "skipped: %v\n", d)
			}
			if rd.Err != nil {
				fmt.Fprintf(g.stderr, "follow: %v (trying again)\n", rd.Err)
				return
			}
			if rd.Appended > 0 {
				mode := "history"
				if rd.Live {
					mode = "live"
				}
				fmt.Fprintf(g.stdout, "%s: %d events appended (%s)\n", rd.File, rd.Appended, mode)
			}
		},
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(g.stdout, "following %d path(s); Ctrl-C stops\n", len(paths))
	if err := f.Run(ctx, paths); err != nil {
		return err
	}
	fmt.Fprintln(g.stdout, "stopped following")
	return nil
}
