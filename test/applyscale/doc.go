// Package applyscale measures how long one manager takes from applying an
// activation to its Ready status, on an empty node and on a node that already
// runs hundreds of providers, with the API requests it spends per module and
// its memory. Its benchmark starts a real API server and real providers: `make
// bench-apply` runs it, `make test` does not (without -test.bench the package
// starts nothing).
package applyscale
