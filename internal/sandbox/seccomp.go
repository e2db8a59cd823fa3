package sandbox

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"

	seccompbpf "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	mobyseccomp "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The seccomp profile. Its source is containerd's and Docker's default
// profile (github.com/moby/profiles/seccomp), the allowlist the runtimes
// platform teams already trust, read for this architecture and for a
// process without capabilities (rules that only a capability unlocks are
// left out, rules that apply without one are kept), minus removedSyscalls.
// It is compiled to classic BPF by github.com/elastic/go-seccomp-bpf: pure
// Go, so the manager, the survivor and the launcher stay cgo-free and
// static (runc links libseccomp statically instead, which needs cgo and a C
// toolchain at build time); the manager compiles once and hands the
// launcher the raw program, so the launcher carries no compiler. The
// digest of the program is the evidence of what a provider ran under.

// removedSyscalls are allowed by the default profile but never needed by a
// provider: debugging and reading other processes, mounting and namespace
// changes, kernel keyrings, BPF and perf, userfaultfd (a common exploit
// primitive), io_uring (a large attack surface that bypasses these
// filters), module and kexec loading, and handle-based file access.
var removedSyscalls = []string{
	"acct", "add_key", "bpf", "chroot", "delete_module", "fanotify_init", "finit_module",
	"fsconfig", "fsmount", "fsopen", "fspick", "init_module", "io_uring_enter",
	"io_uring_register", "io_uring_setup", "kcmp", "kexec_file_load", "kexec_load", "keyctl",
	"lookup_dcookie", "mount", "mount_setattr", "move_mount", "name_to_handle_at",
	"open_by_handle_at", "open_tree", "open_tree_attr", "perf_event_open", "pidfd_getfd", "pivot_root",
	"process_vm_readv", "process_vm_writev", "ptrace", "quotactl", "quotactl_fd", "reboot",
	"request_key", "setdomainname", "sethostname", "setns", "swapoff", "swapon", "syslog",
	"umount", "umount2", "unshare", "userfaultfd", "vhangup",
}

// hotSyscalls are the syscalls a provider (and the Go runtime under it)
// makes most, on every call: read and write on its pipes, the scheduler's
// futexes and polling, signals, memory, time.
var hotSyscalls = []string{
	"read", "write", "futex", "epoll_pwait", "epoll_pwait2", "epoll_wait", "epoll_ctl",
	"nanosleep", "clock_nanosleep", "sched_yield", "getpid", "gettid", "tgkill", "rt_sigreturn",
	"rt_sigprocmask", "madvise", "mmap", "munmap", "mprotect", "close", "fcntl", "openat",
	"newfstatat", "fstat", "lseek", "pread64", "pwrite64", "readv", "writev", "recvfrom",
	"sendto", "recvmsg", "sendmsg", "getrandom", "accept4", "brk", "clock_gettime", "ppoll",
	"pselect6", "poll", "wait4", "waitid", "sigaltstack", "getdents64",
}

// removedSyscallsSample names the removals the documentation lists.
var removedSyscallsSample = []string{"ptrace", "mount", "unshare", "setns", "bpf", "keyctl", "add_key", "perf_event_open", "userfaultfd", "io_uring_*", "kexec_*", "init_module"}

// RemovedSyscalls lists what the provider profile removes from the default
// profile.
func RemovedSyscalls() []string { return slices.Clone(removedSyscalls) }

// mobyArch is this architecture's name in the default profile.
func mobyArch() string {
	switch runtime.GOARCH {
	case "amd64":
		return "amd64"
	case "arm64":
		return "arm64"
	}
	return runtime.GOARCH
}

// filterKind is one variant of the filter.
type filterKind struct {
	// audit sends what the enforced profile would refuse to the
	// launcher's listener instead of failing it.
	audit bool
	// network and exec say what the provider was admitted, for audit:
	// without them, internet sockets and execve are reported too.
	network, exec bool
}

// compiled is one compiled filter.
type compiled struct {
	raw    []byte // struct sock_filter, little-endian (amd64, arm64)
	digest string
	names  map[int]string // syscall number → name, of what audit reports
}

// compileProfile builds the provider profile's BPF program.
func compileProfile(k filterKind) (*compiled, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	kernel, err := kernelVersion()
	if err != nil {
		return nil, err
	}
	allow := map[string]bool{}
	conditional := map[string][]seccompbpf.ArgumentConditions{}
	errnos := map[uint][]string{}
	for _, rule := range mobyseccomp.DefaultProfile().Syscalls {
		if !ruleApplies(rule, kernel) {
			continue
		}
		names := slices.Clone(rule.Names)
		if rule.Name != "" {
			names = append(names, rule.Name)
		}
		for _, name := range names {
			if _, known := info.SyscallNames[name]; !known || slices.Contains(removedSyscalls, name) {
				continue
			}
			switch rule.Action {
			case specs.ActAllow:
				if len(rule.Args) == 0 {
					allow[name] = true
					continue
				}
				conds, err := conditionsOf(rule.Args)
				if err != nil {
					return nil, fmt.Errorf("seccomp: %s: %w", name, err)
				}
				conditional[name] = append(conditional[name], conds)
			case specs.ActErrno:
				errno := uint(unix.EPERM)
				if rule.ErrnoRet != nil {
					errno = *rule.ErrnoRet
				}
				errnos[errno] = append(errnos[errno], name)
			}
		}
	}
	for name := range allow {
		delete(conditional, name) // an unconditional rule wins
	}
	if k.audit {
		if !k.exec {
			delete(allow, "execve")
			delete(allow, "execveat")
		}
		if !k.network {
			conditional["socket"] = withoutInternet(conditional["socket"])
		}
	}
	// The filter compares a syscall with each allowed number in turn: the
	// syscalls a provider makes on every call come first, so that a call
	// costs a few comparisons per syscall rather than hundreds.
	group := seccompbpf.SyscallGroup{Action: seccompbpf.ActionAllow}
	for _, name := range hotSyscalls {
		if allow[name] {
			group.Names = append(group.Names, name)
		}
	}
	for _, name := range sortedKeys(allow) {
		if !slices.Contains(hotSyscalls, name) {
			group.Names = append(group.Names, name)
		}
	}
	for _, name := range sortedKeys(conditional) {
		for _, c := range conditional[name] {
			group.NamesWithCondtions = append(group.NamesWithCondtions, seccompbpf.NameWithConditions{Name: name, Conditions: c})
		}
	}
	policy := seccompbpf.Policy{DefaultAction: seccompbpf.ActionErrno, Syscalls: []seccompbpf.SyscallGroup{group}}
	for _, errno := range sortedKeys(errnos) {
		policy.Syscalls = append(policy.Syscalls, seccompbpf.SyscallGroup{Action: seccompbpf.ActionErrno | seccompbpf.Action(errno), Names: dedupe(errnos[errno])})
	}
	if k.audit {
		// go-seccomp-bpf validates a policy's default action against the
		// actions it names, which lack SECCOMP_RET_USER_NOTIF: assemble
		// with kill_thread, which nothing else returns, and turn those
		// returns into notifications.
		policy.DefaultAction = seccompbpf.ActionKillThread
	}
	insts, err := policy.Assemble()
	if err != nil {
		return nil, fmt.Errorf("seccomp: assembling the provider profile: %w", err)
	}
	if k.audit {
		for i, in := range insts {
			if r, ok := in.(bpf.RetConstant); ok && r.Val == uint32(seccompbpf.ActionKillThread) {
				insts[i] = bpf.RetConstant{Val: uint32(seccompbpf.ActionUserNotify)}
			}
		}
	}
	rawInsts, err := bpf.Assemble(insts)
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	if len(rawInsts) > 4096 {
		return nil, fmt.Errorf("seccomp: the profile is %d instructions, more than the kernel's 4096", len(rawInsts))
	}
	raw := make([]byte, 0, 8*len(rawInsts))
	for _, in := range rawInsts {
		raw = binary.LittleEndian.AppendUint16(raw, in.Op)
		raw = append(raw, in.Jt, in.Jf)
		raw = binary.LittleEndian.AppendUint32(raw, in.K)
	}
	sum := sha256.Sum256(raw)
	c := &compiled{raw: raw, digest: "sha256:" + hex.EncodeToString(sum[:])}
	if k.audit {
		c.names = map[int]string{}
		for name, nr := range info.SyscallNames {
			if !allow[name] {
				c.names[nr] = name
			}
		}
	}
	return c, nil
}

// ruleApplies reports whether a default-profile rule holds for a process of
// this architecture without capabilities on a kernel of version kernel.
func ruleApplies(rule *mobyseccomp.Syscall, kernel [2]uint64) bool {
	if in := rule.Includes; in != nil {
		if len(in.Caps) > 0 {
			return false // only a capability unlocks it; providers have none
		}
		if len(in.Arches) > 0 && !slices.Contains(in.Arches, mobyArch()) {
			return false
		}
		if mk := in.MinKernel; mk != nil && (kernel[0] < mk.Kernel || kernel[0] == mk.Kernel && kernel[1] < mk.Major) {
			return false
		}
	}
	if ex := rule.Excludes; ex != nil {
		if len(ex.Arches) > 0 && slices.Contains(ex.Arches, mobyArch()) {
			return false
		}
		// A rule excluded for a capability holds for a process without it.
	}
	return true
}

// conditionsOf converts a rule's argument comparisons (all of which must
// hold).
func conditionsOf(args []specs.LinuxSeccompArg) (seccompbpf.ArgumentConditions, error) {
	var out seccompbpf.ArgumentConditions
	for _, a := range args {
		c := seccompbpf.Condition{Argument: uint32(a.Index), Value: a.Value}
		switch a.Op {
		case specs.OpEqualTo:
			c.Operation = seccompbpf.Equal
		case specs.OpNotEqual:
			c.Operation = seccompbpf.NotEqual
		case specs.OpLessThan:
			c.Operation = seccompbpf.LessThan
		case specs.OpLessEqual:
			c.Operation = seccompbpf.LessOrEqual
		case specs.OpGreaterThan:
			c.Operation = seccompbpf.GreaterThan
		case specs.OpGreaterEqual:
			c.Operation = seccompbpf.GreaterOrEqual
		case specs.OpMaskedEqual:
			if a.ValueTwo != 0 {
				return nil, fmt.Errorf("masked comparison (arg & %#x) == %#x is not supported", a.Value, a.ValueTwo)
			}
			c.Operation = seccompbpf.BitsNotSet
		default:
			return nil, fmt.Errorf("comparison %q is not supported", a.Op)
		}
		out = append(out, c)
	}
	return out, nil
}

// withoutInternet rewrites the socket rules to allow the same domains as
// equalities, AF_INET and AF_INET6 left out (they reach the default
// action: the audit listener).
func withoutInternet(rules []seccompbpf.ArgumentConditions) []seccompbpf.ArgumentConditions {
	domains := map[uint64]bool{}
	for _, r := range rules {
		if len(r) != 1 || r[0].Argument != 0 {
			continue
		}
		switch r[0].Operation {
		case seccompbpf.Equal:
			domains[r[0].Value] = true
		case seccompbpf.LessThan:
			for d := uint64(1); d < r[0].Value; d++ {
				domains[d] = true
			}
		}
	}
	delete(domains, unix.AF_INET)
	delete(domains, unix.AF_INET6)
	var out []seccompbpf.ArgumentConditions
	for _, d := range sortedKeys(domains) {
		out = append(out, seccompbpf.ArgumentConditions{{Argument: 0, Operation: seccompbpf.Equal, Value: d}})
	}
	return out
}

// kernelVersion is the running kernel's major and minor version.
func kernelVersion() ([2]uint64, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return [2]uint64{}, err
	}
	release := unix.ByteSliceToString(u.Release[:])
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return [2]uint64{}, fmt.Errorf("seccomp: kernel release %q", release)
	}
	digits := func(s string) string {
		if i := strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
			return s[:i]
		}
		return s
	}
	major, err1 := strconv.ParseUint(digits(parts[0]), 10, 64)
	minor, err2 := strconv.ParseUint(digits(parts[1]), 10, 64)
	if err1 != nil || err2 != nil {
		return [2]uint64{}, fmt.Errorf("seccomp: kernel release %q", release)
	}
	return [2]uint64{major, minor}, nil
}

func sortedKeys[K interface{ ~string | ~uint | ~uint64 }, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func dedupe(s []string) []string {
	slices.Sort(s)
	return slices.Compact(s)
}
