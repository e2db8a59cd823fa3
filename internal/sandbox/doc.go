// Package sandbox makes the kernel enforce what a provider was admitted
// for. The capabilities a provider was admitted (internal/catalog) become
// kernel rules by one table (Table, rendered in docs/security.md), on top of
// a baseline every provider gets; the node's policy (Policy: --sandbox and
// the --sandbox-* bounds) and the source's request (Request: a required
// level and memory, CPU, task and /tmp bounds) decide the rest. Every
// launch records what it applied (Evidence): the ledger's shadow_load note,
// Generation status and `kubectl iteron doctor` show it.
//
// # The launch step
//
// Go's ForkExec has no hook between fork and exec, and most of a sandbox
// can only be built from inside the new process: mounts in its own mount
// namespace, Landlock and seccomp on its own thread, its own cgroup v1
// membership. So a provider is started by a launcher, cmd/iteron-sandbox
// (package launcher), and the sequence is:
//
//  1. the manager (or the survivor, or `kubectl iteron conformance`)
//     creates the provider's cgroup and writes its bounds (package
//     cgroups), writes the launcher's configuration into a pipe, and forks
//     the launcher from spawn's launcher thread (locked for the life of
//     the process: Pdeathsig; no_new_privs) into new PID, mount, IPC, UTS
//     and, without irreversible_external, network namespaces — on cgroup
//     v2 straight into the provider's cgroup (CLONE_INTO_CGROUP) — exec'ing
//     the launcher's own sealed memfd, with the provider's descriptors
//     (fd 3 its sealed memfd) first, an empty environment and a process
//     group of its own;
//  2. the launcher joins the provider's cgroups on v1 (before anything
//     else, so nothing it or the provider forks starts outside them),
//     builds the private root (a read-only tmpfs with the node's system
//     directories, the artifact root read-only, a private /tmp, /dev and
//     /proc) and pivots into it, sets vm.memfd_noexec=2 in the new PID
//     namespace, and on one locked thread applies Landlock, empties the
//     capability bounding set, installs the seccomp filter and forks the
//     provider as uid 65534 executing /proc/self/fd/3 — the sealed memfd,
//     the verified bytes;
//  3. it reports on a status pipe that the provider runs (or why it could
//     not start it: then nothing of the provider ran, and the host kills
//     and reaps the group and removes the cgroup), keeps only CAP_KILL,
//     and stays as the namespace's init: it forwards SIGTERM and the other
//     termination signals to the provider (which, not being PID 1, keeps
//     their default effect), reaps whatever the provider leaves, and exits
//     with the provider's status (128+n for signal n) — and when it exits
//     the kernel kills every process left in the namespace.
//
// Every launch guarantee holds: the verified bytes only (the provider is
// exec'd from its sealed memfd, never a path), an empty environment, its
// own process group (the launcher leads it, the provider is in it), and
// reaped on every fault (the host kills the group and reaps its leader;
// the PID namespace takes down what the group missed).
//
// # Why a separate launcher binary
//
// The launcher is a small static binary of its own (about 3.5 MB, built
// without cgo), not a re-exec mode of the manager. A re-exec of the
// manager would run the package initialisers of client-go,
// controller-runtime, gRPC, protobuf and Prometheus (those that sort
// before this module's packages run first, whatever the launcher does) on
// every launch, and its sealed copy would hold the manager's ~80 MB in
// memory for as long as it runs; the launcher starts in about a
// millisecond and its sealed copy costs 3.5 MB. The price is one more file
// to ship: the manager's and the survivor's images carry it next to their
// binaries (--sandbox-launcher finds it there by default), tests build it
// once per test binary (providertest.SandboxLauncher), and `kubectl
// iteron conformance` looks for it next to itself and on PATH. Its digest
// is part of every launch's evidence.
//
// # What the tests rely on
//
// The package's tests run real launchers and real providers as uid 65534
// in real namespaces, below a cgroup each test makes with memory and task
// bounds of its own (so a bug in the bounds under test cannot take the
// machine down), and remove every cgroup they make.
package sandbox
