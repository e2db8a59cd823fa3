// Package pkgruntime is the host side of package runtimes: programs that
// serve the quixos.runtime.PackageRuntime gRPC service
// (docs/reference/package-runtimes.md). It is a peer of internal/procexec,
// which runs providers that speak the line protocol: it maps a caller's JSON
// to and from camino.Value, checks a runtime's handshake field by field, fills
// every call's invocation context, and bounds what a runtime can make the
// manager hold (messages, invocations, watches, deadlines).
package pkgruntime
