// Command counter v1.1.0 is counter v1's state layout with a down-migration:
// it also migrates counter v2's state to its layout, so a revert from v2
// (an ActivationSet's onFailure: Revert, or a GitOps revert) keeps the
// counts. See examples/providers/internal/counter.
package main

import (
	"os"

	"iteron.dev/operator/examples/providers/internal/counter"
)

func main() { os.Exit(counter.MainWithDownMigration("1.1.0")) }
