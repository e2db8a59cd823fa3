// Package runtimepb is the generated Go code of the seed's
// quixos.runtime.PackageRuntime service (Handshake, Invoke, Watch,
// GetInvocationStatus, CancelInvocation): package runtimes serve it, the
// manager is its only client.
package runtimepb
