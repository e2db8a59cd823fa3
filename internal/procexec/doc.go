// Package procexec is the node-local process executor (docs/security.md,
// starting a provider): it runs one verified provider per Process, speaks the
// iteron-implementation protocol with it, and guarantees that after any fault,
// Stop or Close the provider's whole process group is gone.
//
// A Process is built only from a verifier.LaunchPlan, which only the
// verifier (and tests) can mint. Executor.Launch copies the executable into
// a sealed memfd, hashes what the memfd holds, refuses it unless the digest
// is the plan's, and execs the memfd itself (/proc/self/fd/3): the bytes
// verified are the bytes that run. The file is hashed again after the
// start; a change is tampering. A #! script runs only under an allowlisted
// interpreter. The child gets no shell, an empty environment, its own
// process group, the provider uid/gid with no supplementary groups and no
// capabilities (the spawner thread's bounding set is empty), NoNewPrivs,
// the artifact root as cwd, and exactly fds 0-3.
//
// Every provider is forked from one goroutine locked to its OS thread for
// the life of the process, so Pdeathsig (SIGKILL) fires when the manager
// dies and not when some thread exits. The manager is a child subreaper; it
// reaps only members of recorded provider groups and kills descendants that
// left their group, found by scanning /proc (never wait4(-1)). Each group is
// recorded durably (pid, pgid, start time) until it is gone, and
// Executor.Sweep kills what a dead manager left behind, never a reused pid.
//
// Requests are validated before they are written and responses correlated
// before they are believed; observations are checked against the active run
// and delivered raw, never decoded and re-encoded; the host computes every
// state digest itself. Per-run output and per-process lifetime, stdin and
// state operations are bounded, and what remains is exposed as a Budget so
// that the coordinator renews a process before it reaches a bound. Every fault
// is a *Fault of one FaultKind, mapped to a reason code
// (docs/reference/reasons.md); every kind but KindRefused and
// KindInvalidRequest kills the group — the leader is never reaped before the
// group is killed, so its pgid cannot be reused under the kill — and the call
// that reports it returns after the group is gone.
//
// The permanent goroutines are the spawner loops and reaperLoop (one each per
// process, started by the first NewExecutor).
package procexec
