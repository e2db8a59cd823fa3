package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"iteron.dev/operator/internal/tracing"
)

// startTracing turns tracing on as the OTEL_* variables say (off when none
// does; docs/tracing.md) and returns the function that flushes what is
// left at exit. A value the manager cannot use stops it at start, named.
func startTracing(service string, stderr io.Writer) (flush func(), err error) {
	shutdown, err := tracing.FromEnvironment(context.Background(), service)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdown(ctx); err != nil {
			fmt.Fprintln(stderr, "manager: flushing traces:", err)
		}
	}, nil
}
