package launcher

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"
	"unsafe"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// Main is the launcher: cmd/iteron-sandbox runs it and nothing else. Its
// only argument is the number n of the provider's descriptors; descriptor
// n is the launcher's own sealed memfd, n+1 the config pipe and n+2 the
// status pipe. It never returns.
func Main() {
	t0 := time.Now()
	steps := map[string]int64{}
	last := t0
	step := func(name string) {
		now := time.Now()
		steps[name] = int64(now.Sub(last))
		last = now
	}
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "iteron-sandbox: this is the sandbox launcher of iteron-operator's process executor; it is started by the manager, the survivor or `kubectl iteron conformance`, never by hand")
		os.Exit(2)
	}
	n, err := strconv.Atoi(os.Args[1])
	if err != nil || n < 3 || n > 64 {
		fmt.Fprintf(os.Stderr, "iteron-sandbox: %q is not a descriptor count\n", os.Args[1])
		os.Exit(2)
	}
	unix.Close(n) // our own image: the kernel holds it now
	status := os.NewFile(uintptr(n+2), "status")
	report := func(s Status) {
		b, _ := json.Marshal(s)
		status.Write(append(b, '\n'))
	}
	fail := func(format string, args ...any) {
		report(Status{Error: fmt.Sprintf(format, args...)})
		os.Exit(ExitSetupFailed)
	}
	unix.CloseOnExec(n + 1)
	unix.CloseOnExec(n + 2)
	cfgFile := os.NewFile(uintptr(n+1), "config")
	raw, err := io.ReadAll(io.LimitReader(cfgFile, MaxConfigBytes+1))
	cfgFile.Close()
	if err != nil {
		fail("reading the config pipe: %v", err)
	}
	if len(raw) > MaxConfigBytes {
		fail("the config is larger than %d bytes", MaxConfigBytes)
	}
	cfg, err := Parse(raw)
	if err != nil {
		fail("%v", err)
	}
	step("launcher: read config")
	// A provider running as another uid may not read this process's memory
	// or attach to it, whatever its own rules.
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	for _, procs := range cfg.Cgroups {
		if err := os.WriteFile(procs, []byte("0"), 0); err != nil {
			fail("joining the provider's cgroup %s: %v", procs, err)
		}
	}
	// The provider's own cgroups are opened now: once the private root is
	// built they are out of sight.
	var providerCgroups []*os.File
	for _, tasks := range cfg.ThreadCgroups {
		f, err := os.OpenFile(tasks, os.O_WRONLY, 0)
		if err != nil {
			fail("opening the provider's cgroup %s: %v", tasks, err)
		}
		providerCgroups = append(providerCgroups, f)
	}
	if cfg.CgroupNamespace {
		if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
			fail("unshare(CLONE_NEWCGROUP): %v", err)
		}
	}
	step("launcher: join cgroups")
	var st Status
	if cfg.Root != nil {
		if err := buildRoot(cfg.Root); err != nil {
			fail("building the private root: %v", err)
		}
	}
	step("launcher: private root")
	if cfg.MemfdNoexec {
		// Per PID namespace (Linux 6.3+), and it can only be raised: nothing
		// the provider starts can lower it.
		if err := os.WriteFile("/proc/sys/vm/memfd_noexec", []byte("2"), 0); err != nil {
			fail("setting vm.memfd_noexec=2 in the provider's PID namespace: %v", err)
		}
		st.MemfdNoexec = true
	}
	if err := os.Chdir(cfg.Dir); err != nil {
		fail("chdir %s: %v", cfg.Dir, err)
	}
	// Signals are set up before the provider runs: a provider that uses up
	// its tasks must not leave the launcher needing a thread for them.
	// Two channels: a burst of SIGCHLD must never crowd out a SIGTERM
	// (signal.Notify drops what a full channel cannot take).
	sigs, children := make(chan os.Signal, 8), make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2)
	signal.Notify(children, unix.SIGCHLD)
	type started struct {
		pid      int
		landlock int
		listener int
		err      error
	}
	done := make(chan started, 1)
	go func() {
		// Everything the provider inherits is set on this thread only, and
		// the thread is never given back to the runtime (returning while
		// locked ends it): the launcher's other threads stay free to wait,
		// forward signals and answer the audit listener.
		runtime.LockOSThread()
		pid, abi, listener, err := restrictAndStart(cfg, report, providerCgroups)
		done <- started{pid, abi, listener, err}
	}()
	s := <-done
	if s.err != nil {
		fail("%v", s.err)
	}
	step("launcher: landlock, seccomp, fork+exec the provider")
	st.Started, st.Landlock = true, s.landlock
	st.StartedAtNs, st.Steps = t0.UnixNano(), steps
	// The kernel's OOM killer picks the provider, not the launcher, when
	// their shared memory bound is reached: the launcher then reports how
	// the provider ended.
	os.WriteFile("/proc/"+strconv.Itoa(s.pid)+"/oom_score_adj", []byte("1000"), 0)
	report(st)
	if err := keepOnlyKill(); err != nil {
		// The provider already runs: it cannot be told apart from a
		// failed setup any more, so it is killed with its namespace.
		report(Status{Error: "dropping the launcher's capabilities: " + err.Error()})
		os.Exit(ExitSetupFailed)
	}
	os.Exit(waitFor(s.pid, sigs, children))
}

// restrictAndStart applies Landlock, the empty bounding set and the seccomp
// filter to the calling (locked) thread and starts the provider from it.
func restrictAndStart(cfg *Config, report func(Status), threadCgroups []*os.File) (pid, abi, listener int, err error) {
	listener = -1
	tid := strconv.Itoa(unix.Gettid())
	for _, f := range threadCgroups {
		if _, err := f.WriteString(tid); err != nil {
			return 0, 0, -1, fmt.Errorf("moving the provider's thread into %s: %w", f.Name(), err)
		}
		f.Close()
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return 0, 0, -1, fmt.Errorf("prctl(PR_SET_NO_NEW_PRIVS): %w", err)
	}
	if cfg.Landlock != nil {
		if abi, err = applyLandlock(cfg.Landlock); err != nil {
			return 0, 0, -1, err
		}
	}
	if err := dropBoundingSet(); err != nil {
		return 0, 0, -1, fmt.Errorf("emptying the capability bounding set: %w", err)
	}
	if len(cfg.Seccomp) > 0 {
		if listener, err = loadSeccomp(cfg.Seccomp, cfg.Audit); err != nil {
			return 0, 0, -1, err
		}
		if listener >= 0 {
			// The provider's own exec is notified already: the supervisor
			// must answer before the start below can return.
			go supervise(listener, cfg.AuditNames, report)
		}
	}
	attr := &syscall.ProcAttr{
		Dir:   cfg.Dir,
		Env:   []string{},
		Files: []uintptr{0, 1, 2, 3},
		Sys:   &syscall.SysProcAttr{},
	}
	for fd := 4; ; fd++ {
		// Descriptors 4… the host gave the provider (a package runtime's
		// socket and key pipe) are passed on as they are; the launcher's own
		// start after them and are close-on-exec.
		if n, _ := strconv.Atoi(os.Args[1]); fd >= n {
			break
		}
		attr.Files = append(attr.Files, uintptr(fd))
	}
	if cfg.SetIDs {
		attr.Sys.Credential = &syscall.Credential{Uid: cfg.UID, Gid: cfg.GID, Groups: []uint32{}}
	}
	pid, err = syscall.ForkExec("/proc/self/fd/3", cfg.Argv, attr)
	if err != nil {
		return 0, 0, -1, fmt.Errorf("executing the provider: %w", err)
	}
	return pid, abi, listener, nil
}

// applyLandlock restricts the calling thread: the whole view readable, the
// writable directories writable, the device files usable, nothing
// executable but the listed files (or everything, for code_executing), no
// signal or abstract unix socket reaching outside the provider's own
// domain, and no TCP bind or connect when Network is set. It returns the
// ABI applied, 0 when the kernel has no Landlock.
func applyLandlock(l *Landlock) (int, error) {
	abi, err := ll.LandlockGetABIVersion()
	if err != nil || abi < 1 {
		return 0, nil
	}
	cfg := landlock.V7.BestEffort()
	if !l.Network {
		cfg.HandledAccessNet = 0
	}
	read := landlock.AccessFSSet(ll.AccessFSReadFile | ll.AccessFSReadDir)
	write := landlock.AccessFSSet(ll.AccessFSWriteFile | ll.AccessFSRemoveDir | ll.AccessFSRemoveFile |
		ll.AccessFSMakeDir | ll.AccessFSMakeReg | ll.AccessFSMakeSock | ll.AccessFSMakeFifo | ll.AccessFSMakeSym |
		ll.AccessFSRefer | ll.AccessFSTruncate)
	exec := landlock.AccessFSSet(0)
	if l.ExecuteAll {
		exec = landlock.AccessFSSet(ll.AccessFSExecute)
	}
	rules := []landlock.Rule{landlock.PathAccess(read|exec, "/")}
	if len(l.Writable) > 0 {
		rules = append(rules, landlock.PathAccess(read|write|exec, l.Writable...))
	}
	if len(l.Devices) > 0 {
		rules = append(rules, landlock.PathAccess(landlock.AccessFSSet(ll.AccessFSReadFile|ll.AccessFSWriteFile|ll.AccessFSIoctlDev), l.Devices...).IgnoreIfMissing())
	}
	if len(l.Execute) > 0 {
		rules = append(rules, landlock.PathAccess(landlock.AccessFSSet(ll.AccessFSExecute|ll.AccessFSReadFile), l.Execute...))
	}
	fd, flags, err := cfg.NewRulesetFD(rules...)
	if err != nil {
		return 0, fmt.Errorf("landlock ruleset: %w", err)
	}
	if fd < 0 {
		return 0, nil
	}
	defer unix.Close(fd)
	if err := ll.LandlockRestrictSelf(fd, flags); err != nil {
		return 0, fmt.Errorf("landlock_restrict_self: %w", err)
	}
	return min(abi, 7), nil
}

// dropBoundingSet empties the calling thread's capability bounding set, so
// that the provider gains nothing by exec (a rootless provider stays root of
// its user namespace).
func dropBoundingSet() error {
	for c := 0; c <= 63; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
			return err
		}
	}
	return nil
}

// loadSeccomp installs the raw filter on the calling thread; with audit it
// returns the listener of its user-space notifications.
func loadSeccomp(raw []byte, audit bool) (int, error) {
	filter := make([]unix.SockFilter, len(raw)/8)
	for i := range filter {
		b := raw[i*8:]
		filter[i] = unix.SockFilter{
			Code: uint16(b[0]) | uint16(b[1])<<8, Jt: b[2], Jf: b[3],
			K: uint32(b[4]) | uint32(b[5])<<8 | uint32(b[6])<<16 | uint32(b[7])<<24,
		}
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	flags := uintptr(0)
	if audit {
		flags = unix.SECCOMP_FILTER_FLAG_NEW_LISTENER
	}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&prog)))
	runtime.KeepAlive(filter)
	if errno != 0 {
		return -1, fmt.Errorf("seccomp(SECCOMP_SET_MODE_FILTER): %w", errno)
	}
	if !audit {
		return -1, nil
	}
	unix.CloseOnExec(int(r))
	return int(r), nil
}

// keepOnlyKill leaves the launcher with CAP_KILL alone (to forward signals
// to a provider of another uid), on every thread.
func keepOnlyKill() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := [2]unix.CapUserData{{Effective: 1 << unix.CAP_KILL, Permitted: 1 << unix.CAP_KILL}}
	_, _, errno := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0)
	if errno == syscall.ENOTSUP {
		// cgo builds cannot change every thread; the launcher is built
		// without cgo, and keeps its capabilities otherwise.
		return errors.New("the launcher was built with cgo")
	}
	if errno != 0 {
		return errno
	}
	return nil
}

// waitFor forwards termination signals to the provider, reaps every process
// of the namespace (the launcher is its init), and returns the provider's
// status as an exit status: its own, or 128+n when signal n killed it.
// When the launcher exits, the kernel kills whatever is left in its PID
// namespace.
func waitFor(pid int, sigs, children <-chan os.Signal) int {
	// One goroutine, parked on a channel rather than blocked in wait4: once
	// the provider runs, the launcher must not need another thread (a
	// provider at its task bound would leave it none).
	for {
		for {
			var ws unix.WaitStatus
			got, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if err == unix.EINTR {
				continue
			}
			if err != nil || got <= 0 {
				break
			}
			if got != pid {
				continue
			}
			if ws.Signaled() {
				return 128 + int(ws.Signal())
			}
			return ws.ExitStatus()
		}
		select {
		case s := <-sigs:
			unix.Kill(pid, s.(syscall.Signal))
		case <-children:
		}
	}
}

// seccompNotif and seccompNotifResp are struct seccomp_notif and struct
// seccomp_notif_resp.
type seccompNotif struct {
	ID    uint64
	PID   uint32
	Flags uint32
	Nr    int32
	Arch  uint32
	IP    uint64
	Args  [6]uint64
}

type seccompNotifResp struct {
	ID    uint64
	Val   int64
	Error int32
	Flags uint32
}

// supervise answers the audit filter's notifications: each is reported as a
// violation and allowed to proceed. The provider's own launch (the first
// execve) is not a violation.
func supervise(listener int, names map[int]string, report func(Status)) {
	launched := false
	for {
		var n seccompNotif
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(listener), unix.SECCOMP_IOCTL_NOTIF_RECV, uintptr(unsafe.Pointer(&n))); errno != 0 {
			if errno == unix.EINTR || errno == unix.ENOENT {
				continue
			}
			return
		}
		name := names[int(n.Nr)]
		if name == "" {
			name = "syscall " + strconv.Itoa(int(n.Nr))
		}
		if !launched && (n.Nr == unix.SYS_EXECVE || n.Nr == unix.SYS_EXECVEAT) {
			launched = true
		} else {
			report(Status{Violation: name})
		}
		resp := seccompNotifResp{ID: n.ID, Flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE}
		unix.Syscall(unix.SYS_IOCTL, uintptr(listener), unix.SECCOMP_IOCTL_NOTIF_SEND, uintptr(unsafe.Pointer(&resp)))
	}
}
