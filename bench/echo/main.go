// Command echo is the executor's side of the comparison benchmark: a
// protocol-1 provider, written with pkg/provider, whose run's terminal
// observation is its input (validated, never decoded and re-encoded).
package main

import (
	"context"
	"fmt"
	"os"

	"iteron.dev/operator/pkg/provider"
)

type echo struct{}

func (echo) Load(context.Context, *provider.Load) error { return nil }

func (echo) Start(_ context.Context, run *provider.Run) error { return run.Emit(run.Input, true) }

func (echo) Cancel(context.Context, string, string) error { return nil }

func main() {
	if err := provider.Serve(context.Background(), os.Stdin, os.Stdout, echo{}); err != nil {
		fmt.Fprintln(os.Stderr, "echo:", err)
		os.Exit(1)
	}
}
