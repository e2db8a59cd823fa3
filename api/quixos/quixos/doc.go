// Package quixospb is the generated Go code of quixos/refs.proto: the export
// reference and injected dependency of a package-runtime call.
package quixospb
