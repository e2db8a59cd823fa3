// Command counter v2.0.0 is the example stateful provider (protocol 2) with
// the v2 state layout; it migrates v1 state. See
// examples/providers/internal/counter.
package main

import (
	"os"

	"iteron.dev/operator/examples/providers/internal/counter"
)

func main() { os.Exit(counter.Main(2, "2.0.0")) }
