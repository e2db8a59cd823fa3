// Command registry is the CNCF distribution registry (cmd/registry of
// github.com/distribution/distribution/v3) with only what the tests and the
// demo use: filesystem and in-memory storage and htpasswd auth. Built from
// the Go module proxy by hack/build-registry.sh (make registry); no cloud
// storage drivers, so it builds quickly and pulls nothing else in.
package main

import (
	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/auth/htpasswd"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
)

func main() {
	// The registry's own commands exit non-zero on failure.
	_ = registry.RootCmd.Execute()
}
