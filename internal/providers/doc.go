// Package providers adapts each kind of provider to what the transaction
// engine drives (Provider, and StateHolder for those whose state the host
// moves) and composes their launches: a provider process this manager owns
// (NewExecutorLauncher, over internal/procexec), one the node's survivor
// holds across manager restarts (SurvivorOwner, over internal/survivor), and
// a package runtime (WithPackageRuntimes, over internal/pkgruntime).
//
// The engine (internal/hotswap) decides when to launch, load, move state,
// switch and stop; this package only knows how, for each kind. It keeps the
// dispatch bookkeeping they share (a run's allowance of the process's
// remaining budget) in one place.
package providers
