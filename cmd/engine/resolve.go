package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/turnstone-dev/turnstone/events"
)

// resolveSession is events.Log.ResolveSession with the CLI's hint: a
// session not found points at `engine sessions`.
func resolveSession(ctx context.Context, log *events.Log, arg, tenant string) (events.SessionRef, error) {
	ref, err := log.ResolveSession(ctx, arg, tenant)
	if errors.Is(err, events.ErrSessionNotFound) {
		return ref, fmt.Errorf("%w (engine sessions lists them)", err)
	}
	return ref, err
}
