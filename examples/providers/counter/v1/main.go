// Command counter v1.0.0 is the example stateful provider (protocol 2) with
// the v1 state layout. See examples/providers/internal/counter.
package main

import (
	"os"

	"iteron.dev/operator/examples/providers/internal/counter"
)

func main() { os.Exit(counter.Main(1, "1.0.0")) }
