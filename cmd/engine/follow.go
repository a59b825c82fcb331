package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/turnstone-dev/turnstone/internal/console"
	"github.com/turnstone-dev/turnstone/internal/importer"
)

// followTranscripts runs `engine import --follow`: it records the
// transcripts of format under paths as they are written, one line per
// read that stored something (or failed, or met record types the format
// does not know), until ctx is done (Ctrl-C).
func followTranscripts(ctx context.Context, g *globals, store importer.Store, format importer.Format, paths []string, tenant string) error {
	f, err := importer.NewFollower(store, format, importer.FollowConfig{
		Options: importer.Options{Tenant: tenant},
		OnRead: func(rd importer.FollowRead) {
			for _, d := range rd.Diagnostics {
				fmt.Fprintf(g.stderr, "skipped: %s\n", console.Escape(d.Error()))
			}
			if rd.Err != nil {
				fmt.Fprintf(g.stderr, "follow: %s (trying again)\n", console.Escape(rd.Err.Error()))
				return
			}
			if len(rd.Unknown) > 0 {
				var parts []string
				for _, k := range slices.Sorted(maps.Keys(rd.Unknown)) {
					parts = append(parts, fmt.Sprintf("%s %d", console.Escape(k), rd.Unknown[k]))
				}
				fmt.Fprintf(g.stdout, "%s: unknown record types (counted, not imported): %s\n", console.Escape(rd.File), strings.Join(parts, ", "))
			}
			if rd.Appended > 0 {
				mode := "history"
				if rd.Live {
					mode = "live"
				}
				fmt.Fprintf(g.stdout, "%s: %d events appended (%s)\n", console.Escape(rd.File), rd.Appended, mode)
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
