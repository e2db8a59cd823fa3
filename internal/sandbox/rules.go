package sandbox

import (
	"slices"
	"strings"

	"iteron.dev/operator/internal/catalog"
)

// Network is the network a provider is given.
type Network string

const (
	// NetworkNone is a new, empty network namespace: not even loopback is
	// up; nothing can be reached and nothing can reach it.
	NetworkNone Network = "none"
	// NetworkNode is the node's network namespace (egress).
	NetworkNode Network = "node"
)

// Rules are the kernel rules a provider runs under, derived from the
// capabilities it was admitted (Derive). What every provider gets whatever
// its capabilities is in Baseline.
type Rules struct {
	// Network is the network namespace it runs in.
	Network Network
	// Exec lets it execve programs (the node's, and files and memfds it
	// wrote); without it the only exec is the launch's own.
	Exec bool
	// Scratch gives it a private directory per generation, read-write, at
	// ScratchTarget.
	Scratch bool
}

// ScratchTarget is where a provider admitted reversible_local finds its
// scratch directory.
const ScratchTarget = "/scratch"

// Grant is one row of the capability table: what admitting Capability adds
// to the baseline, as kernel rules (Apply) and as the documentation says it
// (Kernel, Why).
type Grant struct {
	Capability string
	// Apply widens r for this capability.
	Apply func(r *Rules)
	// Kernel says what the kernel is told, for the documentation.
	Kernel string
	// Why says why, for the documentation.
	Why string
}

// Table is the capability → kernel rule table, one row per capability, in
// the wire's order. docs/security.md renders it ("Capabilities become
// kernel rules"); TestTheSecurityDocShowsTheRuleTable keeps the two equal.
var Table = []Grant{
	{
		Capability: catalog.CapabilityCodeExecuting,
		Apply:      func(r *Rules) { r.Exec = true },
		Kernel:     "execve/execveat allowed on anything it can read (Landlock `execute` on the whole view); its /tmp and scratch directory are mounted exec; `vm.memfd_noexec` is left at the node's value",
		Why:        "it may run programs; without it the only exec is the launch's own, Landlock grants `execute` on nothing but the #! and ELF interpreters the launch needs, every writable mount is `noexec` and `vm.memfd_noexec=2` holds in its PID namespace, so a memfd or file it writes can never be executed",
	},
	{
		Capability: catalog.CapabilityIrreversibleExternal,
		Apply:      func(r *Rules) { r.Network = NetworkNode },
		Kernel:     "the node's network namespace; Landlock does not restrict TCP bind and connect",
		Why:        "it may act on the world outside the node; nothing else is widened",
	},
	{
		Capability: catalog.CapabilityReadOnly,
		Apply:      func(*Rules) {},
		Kernel:     "the baseline: a new, empty network namespace (no interface up); writes only into its private, size-bounded /tmp",
		Why:        "it may read what it was given; it can reach no network and change nothing that outlives it",
	},
	{
		Capability: catalog.CapabilityReversibleLocal,
		Apply:      func(r *Rules) { r.Scratch = true },
		Kernel:     "the baseline and a private scratch directory per generation, bound read-write (`noexec`) at `" + ScratchTarget + "`",
		Why:        "it may keep local state that survives its process (renewals, relaunches) and that the node can discard with its generation",
	},
	{
		Capability: catalog.CapabilityTrustMutating,
		Apply:      func(*Rules) {},
		Kernel:     "the baseline: nothing is widened (never admitted by the default ceiling)",
		Why:        "what it mutates is the host's trust decisions, which no kernel rule expresses; a node that admits it says so in its ceiling, and the provider still runs under the same rules",
	},
}

// Baseline lists what every provider gets whatever its capabilities, for
// the documentation (docs/security.md).
var Baseline = []string{
	"its own PID, mount, IPC, UTS and cgroup namespaces: it sees and can signal only its own processes, and the launcher, as the namespace's init, forwards SIGTERM to it and takes every process it leaves down with it",
	"a private root: a read-only tmpfs with the node's system directories (" + strings.Join(DefaultReadOnlyPaths, ", ") + ") bound read-only, its artifact root read-only at its own path, a private /dev (null, zero, full, random, urandom), a /proc of its PID namespace and a private /tmp (tmpfs, size-bounded, `nosuid,nodev,noexec`); the state directory, ledgers, other providers' files and service-account tokens are not in its view at all",
	"uid and gid 65534 (the executor's), no supplementary groups, no capabilities (an empty bounding set), `no_new_privs`",
	"a seccomp allowlist: containerd's and Docker's default profile (github.com/moby/profiles/seccomp) without what a provider never needs (" + strings.Join(removedSyscallsSample, ", ") + ", …); anything else fails with EPERM",
	"Landlock (ABI 7 where the kernel has it): the whole view readable, writes only beneath its /tmp and scratch directory, device files limited to the private /dev, `execute` only as the table says, and signals and abstract unix sockets scoped to its own domain",
	"cgroup bounds on memory (no swap), CPU time and tasks (processes and threads), joined before its first instruction",
}

// Derive returns the rules for a provider admitted caps (the table applied
// to the baseline).
func Derive(caps []string) Rules {
	r := Rules{Network: NetworkNone}
	for _, g := range Table {
		if slices.Contains(caps, g.Capability) {
			g.Apply(&r)
		}
	}
	return r
}

// DefaultReadOnlyPaths are the node's directories a provider sees
// read-only (those the node has; a symlink such as /bin → usr/bin is kept
// as a symlink).
var DefaultReadOnlyPaths = []string{"/bin", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/sbin", "/usr"}
