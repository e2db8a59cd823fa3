// Package layering holds one test: it enforces who may import whom in this
// module (docs/reference/layering.md). It has no code of its own and imports
// nothing of the module; the test reads the import graph with `go list` and
// the source files' import clauses.
package layering
