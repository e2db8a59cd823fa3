package launcher

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
)

// Protocol is the launcher's only argument: the version of the messages
// of its control socket (descriptor 3). A launcher given another refuses to
// start.
const Protocol = "control/2"

// ConfigVersion is the version of Config this launcher reads. The host and
// the launcher are built from the same tree; a launcher that reads another
// version refuses to start anything.
const ConfigVersion = 1

// MaxConfigBytes bounds the configuration the host writes on the config
// pipe.
const MaxConfigBytes = 1 << 20

// Config is what the host tells the launcher: one JSON document on the
// config pipe, written before the launcher runs and closed. Every path is
// absolute and clean; the host built it from a verified plan and the
// node's policy, and the launcher checks its shape again before acting.
type Config struct {
	// Version is ConfigVersion.
	Version int `json:"version"`
	// Argv is the provider's argv; the executable is always the sealed
	// memfd at descriptor 3 (/proc/self/fd/3).
	Argv []string `json:"argv"`
	// Dir is the provider's working directory (its artifact root).
	Dir string `json:"dir"`
	// SetIDs makes the provider run as UID:GID with no supplementary
	// groups; false keeps the launcher's own ids (a rootless sandbox, where
	// the launcher is root of a user namespace mapped to the caller).
	SetIDs bool   `json:"set_ids"`
	UID    uint32 `json:"uid"`
	GID    uint32 `json:"gid"`
	// PrivateNetwork gives the provider a new, empty network namespace
	// (made on the thread that starts it); otherwise it has the node's.
	PrivateNetwork bool `json:"private_network,omitempty"`
	// Root, when set, builds a private root: the launcher runs in a new
	// mount namespace (the host cloned it), and the provider sees only
	// what Root lists.
	Root *Root `json:"root,omitempty"`
	// MemfdNoexec sets vm.memfd_noexec=2 in the provider's PID namespace:
	// no memfd it creates can ever be executed.
	MemfdNoexec bool `json:"memfd_noexec,omitempty"`
	// Landlock, when set, restricts the provider's file access, its signals
	// and abstract unix sockets to what it lists.
	Landlock *Landlock `json:"landlock,omitempty"`
	// Seccomp is the filter (raw classic BPF, 8 bytes per instruction in
	// struct sock_filter layout) installed on the thread that forks the
	// provider; empty installs none.
	Seccomp []byte `json:"seccomp,omitempty"`
	// Audit installs the filter with a listener: syscalls the filter sends
	// to user space are counted, reported on the status pipe, and allowed.
	Audit bool `json:"audit,omitempty"`
	// AuditNames names the syscall numbers the audit filter reports.
	AuditNames map[int]string `json:"audit_names,omitempty"`
}

// Prepare is what a launcher does while it waits for its launch.
type Prepare struct {
	// Version is ConfigVersion.
	Version int `json:"version"`
	// Cgroups are cgroup.procs files the launcher writes itself into before
	// anything else: the provider and every process it forks start inside
	// the bounds the launch writes into them.
	Cgroups []string `json:"cgroups,omitempty"`
	// ThreadCgroups are v1 tasks files the thread that forks the provider
	// moves itself into, so that the provider starts in its own child of
	// the group (its task bound below the launcher's).
	ThreadCgroups []string `json:"thread_cgroups,omitempty"`
	// CgroupNamespace unshares a cgroup namespace after the join, so that
	// the provider sees its own cgroup as the root.
	CgroupNamespace bool `json:"cgroup_namespace,omitempty"`
	// PrivateNetwork makes the starting thread's network namespace now.
	PrivateNetwork bool `json:"private_network,omitempty"`
	// ReadOnly, when not nil, starts the private root (the launcher is in
	// a mount namespace of its own): the node paths bound read-only at the
	// same path (directories or symlinks to them, such as /bin on a
	// merged-/usr system; a missing one is skipped), a private /dev and
	// /proc.
	ReadOnly []string `json:"read_only,omitempty"`
}

// ParsePrepare decodes and checks a preparation.
func ParsePrepare(b []byte) (*Prepare, error) {
	var p Prepare
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("preparation: %w", err)
	}
	if p.Version != ConfigVersion {
		return nil, fmt.Errorf("preparation: version %d, this launcher reads %d", p.Version, ConfigVersion)
	}
	for _, set := range [][]string{p.Cgroups, p.ThreadCgroups, p.ReadOnly} {
		for _, path := range set {
			if !filepath.IsAbs(path) || filepath.Clean(path) != path {
				return nil, fmt.Errorf("preparation: %q is not an absolute, clean path", path)
			}
		}
	}
	return &p, nil
}

// Root is the provider's file system view, finished at the launch.
type Root struct {
	// ReadOnly are more node paths bound read-only at the same path, for
	// this launch (the interpreters it needs outside the node's paths).
	ReadOnly []string `json:"read_only,omitempty"`
	// ArtifactRoot is bound read-only at the same path.
	ArtifactRoot string `json:"artifact_root"`
	// Scratch, when set, is a host directory bound read-write at
	// ScratchTarget.
	Scratch       string `json:"scratch,omitempty"`
	ScratchTarget string `json:"scratch_target,omitempty"`
	// TmpBytes bounds the private /tmp (a tmpfs).
	TmpBytes int64 `json:"tmp_bytes"`
	// Exec leaves the writable mounts (/tmp, the scratch directory)
	// executable; otherwise they are noexec.
	Exec bool `json:"exec,omitempty"`
}

// Landlock says what the provider may do with files once Landlock applies.
type Landlock struct {
	// Writable are directories the provider may write beneath (its /tmp,
	// its scratch directory).
	Writable []string `json:"writable"`
	// Devices are device files it may read and write (/dev/null, …).
	Devices []string `json:"devices"`
	// Execute are files it may execute besides the sealed memfd: the #!
	// interpreter and the ELF interpreter the launch itself needs.
	Execute []string `json:"execute,omitempty"`
	// ExecuteAll lets it execute anything it can read (code_executing).
	ExecuteAll bool `json:"execute_all,omitempty"`
	// Network restricts TCP bind and connect (no port is allowed); left
	// false when the provider has the node's network.
	Network bool `json:"network,omitempty"`
}

// Parse decodes and checks a configuration.
func Parse(b []byte) (*Config, error) {
	var c Config
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if c.Version != ConfigVersion {
		return nil, fmt.Errorf("config: version %d, this launcher reads %d", c.Version, ConfigVersion)
	}
	if len(c.Argv) == 0 {
		return nil, errors.New("config: argv is empty")
	}
	paths := []struct{ field, p string }{{"dir", c.Dir}}
	if r := c.Root; r != nil {
		paths = append(paths, struct{ field, p string }{"root.artifact_root", r.ArtifactRoot})
		for _, p := range r.ReadOnly {
			paths = append(paths, struct{ field, p string }{"root.read_only", p})
		}
		if r.Scratch != "" || r.ScratchTarget != "" {
			paths = append(paths, struct{ field, p string }{"root.scratch", r.Scratch}, struct{ field, p string }{"root.scratch_target", r.ScratchTarget})
		}
		if r.TmpBytes <= 0 {
			return nil, fmt.Errorf("config: root.tmp_bytes is %d, must be positive", r.TmpBytes)
		}
	}
	if l := c.Landlock; l != nil {
		for _, set := range [][]string{l.Writable, l.Devices, l.Execute} {
			for _, p := range set {
				paths = append(paths, struct{ field, p string }{"landlock", p})
			}
		}
	}
	for _, p := range paths {
		if !filepath.IsAbs(p.p) || filepath.Clean(p.p) != p.p {
			return nil, fmt.Errorf("config: %s: %q is not an absolute, clean path", p.field, p.p)
		}
	}
	if len(c.Seccomp)%8 != 0 {
		return nil, fmt.Errorf("config: seccomp is %d bytes, not whole instructions", len(c.Seccomp))
	}
	if c.Audit && len(c.Seccomp) == 0 {
		return nil, errors.New("config: audit needs a seccomp filter")
	}
	return &c, nil
}

// Status is one line the launcher writes on the status pipe (JSON).
type Status struct {
	// Prepared is sent once, when the preparation is done (the launcher's
	// cgroups joined, its network namespace and the node's part of its
	// root made): it waits for its launch and costs no CPU until then.
	Prepared bool `json:"prepared,omitempty"`
	// Started is set once the provider was executed; Landlock is the ABI
	// applied (0: none), MemfdNoexec whether vm.memfd_noexec=2 holds.
	Started     bool `json:"started,omitempty"`
	Landlock    int  `json:"landlock,omitempty"`
	MemfdNoexec bool `json:"memfd_noexec,omitempty"`
	// Error is set when the sandbox could not be built; nothing was
	// executed and the launcher exits with ExitSetupFailed.
	Error string `json:"error,omitempty"`
	// Violation names a syscall an audited provider made that the enforced
	// sandbox would refuse.
	Violation string `json:"violation,omitempty"`
	// StartedAtNs is when the launcher's main began (Unix ns), and Steps how
	// long each of its steps took (ns), for the launch-cost breakdown.
	StartedAtNs int64            `json:"started_at_ns,omitempty"`
	Steps       map[string]int64 `json:"steps,omitempty"`
}

// ExitSetupFailed is the launcher's exit status when it could not build the
// sandbox (nothing of the provider ran).
const ExitSetupFailed = 125
