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
// namespace, Landlock and seccomp on its own thread, its own cgroup
// membership. So a provider is started by a launcher, cmd/iteron-sandbox
// (package launcher), and the sequence is:
//
//  1. ahead of any launch (pool.go), the manager (or the survivor, or
//     `kubectl iteron conformance`) forks a launcher from spawn's launcher
//     thread (locked for the life of the process: Pdeathsig; no_new_privs)
//     into new mount, PID, IPC and UTS namespaces, exec'ing the launcher's
//     own sealed memfd with an empty environment and a process group of
//     its own, and tells it on its control socket what does not depend on
//     the launch: it joins a fresh cgroup of the tree (before anything
//     else, so that nothing it or the provider forks starts outside; cgroup
//     v1 has no CLONE_INTO_CGROUP, and on v2 the launcher exists before
//     its launch is known), moves the thread that will start the provider
//     into the provider's own child of it, makes that thread's network
//     namespace, and builds the node's part of the private root (a tmpfs
//     with the node's system directories read-only, a private /dev and a
//     /proc of its PID namespace);
//  2. at the launch, the host writes the provider's bounds into that
//     cgroup (the pool wrote the node's defaults already, so most
//     launches write nothing; the CPU bound starts over a 100 ms period
//     and settles to 10 ms after it, cgroups.StartPeriod) and hands the
//     launcher, in one message, its configuration and
//     the provider's descriptors (SCM_RIGHTS; fd 3 the provider's sealed
//     memfd): the launcher finishes the root (its artifact root read-only,
//     a private size-bounded /tmp, its scratch directory) and pivots into
//     it, sets vm.memfd_noexec=2 in its PID namespace, and on the starting
//     thread goes back to the node's network if the provider may use it,
//     applies Landlock, empties the capability bounding set, installs the
//     seccomp filter and forks the provider as uid 65534 executing
//     /proc/self/fd/3 — the sealed memfd, the verified bytes;
//  3. it reports that the provider runs (or why it could not start it:
//     then nothing of the provider ran, and the host kills and reaps the
//     group and removes the cgroup), keeps only CAP_KILL, and stays as the
//     namespace's init: it forwards SIGTERM and the other termination
//     signals to the provider (which, not being PID 1, keeps their default
//     effect), reaps whatever the provider leaves, and exits with the
//     provider's status (128+n for signal n) — and when it exits the
//     kernel kills every process left in the namespace.
//
// Two launchers are kept ready and a new one is started 50 ms after each
// launch (not at once: it would compete with the provider's own start). A
// launcher counts as ready once it says it has prepared (its runtime
// started, its cgroups joined, its namespaces and root made): a launch
// beside a launcher still starting waited for the CPU.
// A launch in a burst, after the ready ones are used, starts its own. The
// launch-cost breakdown (Launch.Steps, BenchmarkSandboxedLaunch in
// internal/procexec) shows why: exec'ing the launcher and starting its Go
// runtime is most of what a sandbox costs, and none of it depends on the
// launch.
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
// every launch — measured on these machines, the manager binary takes a
// median 58 ms from exec to exit doing nothing (--help), the launcher 6.5
// ms, an empty Go program 4.4 ms — and its sealed copy would hold the
// manager's 70 MB in memory for as long as the manager runs; the
// launcher's costs 3.5 MB. The price is one more file
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
