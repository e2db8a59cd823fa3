package launcher

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// Main is the launcher: cmd/iteron-sandbox runs it and nothing else. Its
// only argument is Protocol. Descriptor 3 is its control socket (a
// SOCK_SEQPACKET socket pair), 4 its own sealed memfd; 0-2 are /dev/null.
//
// It is started before its launch is known. Its first message, a Prepare,
// has it do, while it waits, everything that does not depend on the
// launch: join the cgroup it will share with the provider, make the
// network namespace, build the unchanging part of the private root. Its
// second, the Config with the provider's descriptors (SCM_RIGHTS, which
// become the provider's 0..n-1, 3 its sealed executable), has it finish
// the root, apply Landlock, the empty bounding set and seccomp to the
// thread that then starts the provider. It answers with Status messages on
// the same socket, and exits when the socket is closed before a launch. It
// never returns.
func Main() {
	if len(os.Args) != 2 || os.Args[1] != Protocol {
		fmt.Fprintln(os.Stderr, "iteron-sandbox: this is the sandbox launcher of iteron-operator's process executor; it is started by the manager, the survivor or `kubectl iteron conformance`, never by hand")
		os.Exit(2)
	}
	unix.Close(4) // our own image: the kernel holds it now
	const ctl = 3
	unix.CloseOnExec(ctl)
	report := func(s Status) {
		b, _ := json.Marshal(s)
		unix.Sendmsg(ctl, b, nil, nil, 0)
	}
	fail := func(format string, args ...any) {
		report(Status{Error: fmt.Sprintf(format, args...)})
		os.Exit(ExitSetupFailed)
	}
	// Signals are set up before the provider runs: a provider that uses up
	// its tasks must not leave the launcher needing a thread for them.
	// Two channels: a burst of SIGCHLD must never crowd out a SIGTERM
	// (signal.Notify drops what a full channel cannot take).
	sigs, children := make(chan os.Signal, 8), make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2)
	signal.Notify(children, unix.SIGCHLD)
	// A provider running as another uid may not read this process's memory
	// or attach to it, whatever its own rules.
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	warmDecoder()

	buf, oob := make([]byte, MaxConfigBytes+1), make([]byte, unix.CmsgSpace(64*4))
	recv := func(what string) (int, []int) {
		n, oobn, _, _, err := unix.Recvmsg(ctl, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err != nil {
			fail("reading the %s: %v", what, err)
		}
		if n == 0 && oobn == 0 {
			os.Exit(0) // closed without a launch
		}
		if n > MaxConfigBytes {
			fail("the %s is larger than %d bytes", what, MaxConfigBytes)
		}
		fds, err := rights(oob[:oobn])
		if err != nil {
			fail("%v", err)
		}
		return n, fds
	}
	n, _ := recv("preparation")
	prep, err := ParsePrepare(buf[:n])
	if err != nil {
		fail("%v", err)
	}
	for _, procs := range prep.Cgroups {
		if err := os.WriteFile(procs, []byte("0"), 0); err != nil {
			fail("joining the provider's cgroup %s: %v", procs, err)
		}
	}
	var providerCgroups []*os.File
	for _, tasks := range prep.ThreadCgroups {
		f, err := os.OpenFile(tasks, os.O_WRONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			fail("opening the provider's cgroup %s: %v", tasks, err)
		}
		providerCgroups = append(providerCgroups, f)
	}
	if prep.CgroupNamespace {
		if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
			fail("unshare(CLONE_NEWCGROUP): %v", err)
		}
	}
	var root *rootBuilder
	if prep.ReadOnly != nil {
		if root, err = prepareRoot(prep.ReadOnly); err != nil {
			fail("building the private root: %v", err)
		}
	}
	// The thread that will start the provider is chosen now, and takes its
	// cgroups and its network namespace while the launcher waits.
	thread := &starter{launch: make(chan launchOrder), done: make(chan started, 1)}
	ready := make(chan error, 1)
	go thread.run(prep, providerCgroups, ready, report)
	if err := <-ready; err != nil {
		fail("%v", err)
	}
	report(Status{Prepared: true})

	n, fds := recv("launch")
	t0 := time.Now()
	steps := map[string]int64{}
	last := t0
	step := func(name string) {
		now := time.Now()
		steps[name] = int64(now.Sub(last))
		last = now
	}
	cfg, err := Parse(buf[:n])
	if err != nil {
		fail("%v", err)
	}
	if len(fds) < 4 {
		fail("the launch carries %d descriptors; the provider's are at least 0-3", len(fds))
	}
	step("launcher: read config")
	var st Status
	if cfg.Root != nil {
		if root == nil {
			fail("the launch has a private root the preparation did not start")
		}
		if err := root.finish(cfg.Root); err != nil {
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
	step("launcher: /proc/sys/vm/memfd_noexec, chdir")
	// The starting thread reports the start itself, as soon as the
	// provider runs: a hand-off to this goroutine would wait for a CPU
	// that the provider's own start is using.
	announce := func(s started) {
		for _, sub := range s.steps {
			steps[sub[0].(string)] = sub[1].(int64)
		}
		st.Started, st.Landlock = true, s.landlock
		st.StartedAtNs, st.Steps = t0.UnixNano(), steps
		report(st)
	}
	thread.launch <- launchOrder{cfg: cfg, fds: fds, announce: announce}
	s := <-thread.done
	if s.err != nil {
		fail("%v", s.err)
	}
	// The kernel's OOM killer picks the provider, not the launcher, when
	// their shared memory bound is reached: the launcher then reports how
	// the provider ended. (Set after the report: the launcher's few
	// megabytes make the provider the likelier pick meanwhile anyway.)
	os.WriteFile("/proc/"+strconv.Itoa(s.pid)+"/oom_score_adj", []byte("1000"), 0)
	if err := keepOnlyKill(); err != nil {
		// The provider already runs: it cannot be told apart from a
		// failed setup any more, so it is killed with its namespace.
		report(Status{Error: "dropping the launcher's capabilities: " + err.Error()})
		os.Exit(ExitSetupFailed)
	}
	status := waitFor(s.pid, sigs, children)
	// A violation is reported after its answer let the syscall proceed, so
	// the provider can end between the two: its last violation is reported
	// before the launcher exits (bounded: a reader that stopped reading
	// must not hold the exit).
	reported := make(chan struct{})
	go func() { answering.Lock(); close(reported) }()
	select {
	case <-reported:
	case <-time.After(time.Second):
	}
	os.Exit(status)
}

// answering is held by supervise from a notification's receipt until its
// violation is reported, and taken by the launcher before it exits.
var answering sync.Mutex

// starter is the thread that starts the provider. Everything the provider
// inherits is set on this thread only, and the thread is never given back
// to the runtime (its goroutine returns while locked, which ends it): the
// launcher's other threads stay free to wait, forward signals and answer
// the audit listener.
type starter struct {
	launch chan launchOrder
	done   chan started
}

type launchOrder struct {
	cfg *Config
	fds []int
	// announce reports a started provider (not a failed start).
	announce func(started)
}

type started struct {
	pid, landlock, listener int
	steps                   [][2]any // name, ns
	err                     error
}

func (s *starter) run(prep *Prepare, cgroups []*os.File, ready chan<- error, report func(Status)) {
	runtime.LockOSThread()
	tid := strconv.Itoa(unix.Gettid())
	for _, f := range cgroups {
		if _, err := f.WriteString(tid); err != nil {
			ready <- fmt.Errorf("moving the provider's thread into %s: %w", f.Name(), err)
			return
		}
		f.Close()
	}
	// The network namespace of a provider without the node's network is
	// made now; a launch that has the node's goes back to this one.
	host := -1
	if prep.PrivateNetwork {
		var err error
		if host, err = unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			ready <- fmt.Errorf("the node's network namespace: %w", err)
			return
		}
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ready <- fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
			return
		}
	}
	ready <- nil
	o := <-s.launch
	if host >= 0 {
		if !o.cfg.PrivateNetwork {
			if err := unix.Setns(host, unix.CLONE_NEWNET); err != nil {
				s.done <- started{err: fmt.Errorf("joining the node's network namespace: %w", err)}
				return
			}
		}
		unix.Close(host)
	} else if o.cfg.PrivateNetwork {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			s.done <- started{err: fmt.Errorf("unshare(CLONE_NEWNET): %w", err)}
			return
		}
	}
	var steps [][2]any
	pid, abi, listener, err := restrictAndStart(o.cfg, o.fds, report, func(name string, d time.Duration) {
		steps = append(steps, [2]any{name, int64(d)})
	})
	res := started{pid, abi, listener, steps, err}
	if err == nil {
		o.announce(res)
	}
	s.done <- res
}

// warmDecoder decodes a configuration once, so that the decoder's caches
// are built while the launcher waits rather than during its launch.
func warmDecoder() {
	var c Config
	json.Unmarshal([]byte(`{"version":1,"argv":["x"],"dir":"/x","root":{"read_only":["/x"],"artifact_root":"/x","tmp_bytes":1},"landlock":{"writable":["/x"],"devices":["/x"]},"seccomp":"AAAAAAAAAAA=","audit_names":{"1":"x"}}`), &c)
	var p Prepare
	json.Unmarshal([]byte(`{"version":1,"cgroups":["/x"],"read_only":["/x"]}`), &p)
	json.Marshal(Status{Started: true, Steps: map[string]int64{"x": 1}})
}

// restrictAndStart applies Landlock, the empty bounding set and the seccomp
// filter to the calling (locked) thread and starts the provider from it.
func restrictAndStart(cfg *Config, fds []int, report func(Status), took func(string, time.Duration)) (pid, abi, listener int, err error) {
	listener = -1
	t := time.Now()
	step := func(name string) {
		now := time.Now()
		took(name, now.Sub(t))
		t = now
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return 0, 0, -1, fmt.Errorf("prctl(PR_SET_NO_NEW_PRIVS): %w", err)
	}
	if cfg.Landlock != nil {
		if abi, err = applyLandlock(cfg.Landlock); err != nil {
			return 0, 0, -1, err
		}
	}
	step("launcher: landlock")
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
	step("launcher: bounding set, seccomp")
	attr := &syscall.ProcAttr{Dir: cfg.Dir, Env: []string{}, Sys: &syscall.SysProcAttr{}}
	for _, fd := range fds {
		attr.Files = append(attr.Files, uintptr(fd))
	}
	if cfg.SetIDs {
		attr.Sys.Credential = &syscall.Credential{Uid: cfg.UID, Gid: cfg.GID, Groups: []uint32{}}
	}
	pid, err = syscall.ForkExec("/proc/self/fd/3", cfg.Argv, attr)
	if err != nil {
		return 0, 0, -1, fmt.Errorf("executing the provider: %w", err)
	}
	step("launcher: fork+exec the provider")
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
		// WAIT_KILLABLE_RECV (Linux 5.19): once the launcher has received
		// a notification, only a fatal signal interrupts the syscall's
		// wait. Without it a signal landing as the answer is sent (a Go
		// provider's threads get SIGURG all the time) makes the kernel
		// restart the syscall after the answer, and it is notified, and
		// counted, twice (seen: 301-303 of 300 sockets, 3 runs in 20).
		flags = unix.SECCOMP_FILTER_FLAG_NEW_LISTENER | unix.SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV
	}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&prog)))
	if errno == unix.EINVAL && audit {
		// An older kernel: a count may then be one too high now and then.
		flags = unix.SECCOMP_FILTER_FLAG_NEW_LISTENER
		r, _, errno = unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&prog)))
	}
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

// supervise answers the audit filter's notifications: each is allowed to
// proceed and reported as a violation. The provider's own launch (the first
// execve) is not a violation. A notification whose syscall a signal
// interrupted before the answer (a Go provider's threads get SIGURG to be
// preempted) cannot be answered (ENOENT), and the kernel restarts the
// syscall, which notifies again: it is counted once, when an answer lets
// it proceed.
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
		answering.Lock()
		resp := seccompNotifResp{ID: n.ID, Flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE}
		errno := unix.EINTR
		for errno == unix.EINTR {
			// EINTR: the answer was not taken (the syscall still waits).
			_, _, errno = unix.Syscall(unix.SYS_IOCTL, uintptr(listener), unix.SECCOMP_IOCTL_NOTIF_SEND, uintptr(unsafe.Pointer(&resp)))
		}
		if errno != 0 {
			answering.Unlock()
			continue
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
		answering.Unlock()
	}
}

// rights returns the descriptors a control message carries.
func rights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("the launch's descriptors: %w", err)
	}
	var fds []int
	for _, m := range msgs {
		r, err := unix.ParseUnixRights(&m)
		if err != nil {
			return nil, fmt.Errorf("the launch's descriptors: %w", err)
		}
		fds = append(fds, r...)
	}
	return fds, nil
}
