package spawn

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// The spawner is one goroutine locked to its OS thread for the life of the
// process. Every provider is forked from that thread, so:
//   - Pdeathsig (SIGKILL) fires when the manager dies, not when some thread
//     that happened to fork exits (golang/go#27505);
//   - NoNewPrivs, which SysProcAttr has no field for, is set once with prctl
//     on that thread and inherited by every child;
//   - the capability bounding set of that thread is emptied, so a provider
//     can gain no capability by exec, whatever its uid.
//
// The Go runtime never clones new threads from a locked thread (it asks its
// template thread instead), so these thread attributes do not leak into the
// rest of the manager.

type spawnRequest struct {
	argv  []string
	attr  *syscall.ProcAttr
	reply chan spawnResult
}

type spawnResult struct {
	pid, pidfd int
	err        error
}

type spawnerThread struct {
	once sync.Once
	reqs chan spawnRequest
	err  error
	// capsDropped reports whether the bounding set could be emptied (it
	// cannot without CAP_SETPCAP; a non-root manager has no capabilities to
	// pass on anyway).
	capsDropped bool
}

var spawner spawnerThread

// launcherSpawner is the second spawner thread, for the sandbox launcher
// (internal/sandbox): the same locked thread and NoNewPrivs, but its
// bounding set is kept, because the launcher needs its capabilities to
// build the sandbox (namespaces, mounts, cgroups) before it empties the
// bounding set of the thread that starts the provider.
var launcherSpawner spawnerThread

// Start makes this process a child subreaper and starts the reaper and the
// spawner thread, once; later calls return the first call's error.
func Start() error {
	if err := startReaper(); err != nil {
		return err
	}
	return startSpawner()
}

// BoundingSetEmptied reports whether the spawner thread's capability
// bounding set could be emptied (it cannot without CAP_SETPCAP; a manager
// that is not root has no capabilities to pass on anyway).
func BoundingSetEmptied() bool { return spawner.capsDropped }

// SpawnGroup forks and execs argv on the spawner thread (argv[0] is the path
// to exec, the child's argv is argv[1:]); attr must make the child the leader
// of a new group (Setpgid). The group is registered with the reaper, as run
// by uid, before the reaper can see the child: it would take an unregistered
// leader for an escaped descendant. The pidfd (-1 when none) is the caller's
// to close; the caller reaps the leader (WaitPidfd) and Unregisters the group
// once it is gone.
func SpawnGroup(argv []string, attr *syscall.ProcAttr, uid int) (g Group, pidfd int, err error) {
	if err := Start(); err != nil {
		return Group{}, -1, err
	}
	return spawnGroup(&spawner, argv, attr, uid)
}

// SpawnLauncher is SpawnGroup for the sandbox launcher: it forks from the
// launcher's spawner thread, whose capability bounding set is kept (the
// launcher empties it for the provider). argv[0] must be the launcher.
func SpawnLauncher(argv []string, attr *syscall.ProcAttr, uid int) (g Group, pidfd int, err error) {
	if err := startReaper(); err != nil {
		return Group{}, -1, err
	}
	if err := launcherSpawner.start(false); err != nil {
		return Group{}, -1, err
	}
	return spawnGroup(&launcherSpawner, argv, attr, uid)
}

func spawnGroup(t *spawnerThread, argv []string, attr *syscall.ProcAttr, uid int) (g Group, pidfd int, err error) {
	reaper.mu.Lock()
	defer reaper.mu.Unlock()
	pid, pidfd, err := t.spawn(argv, attr)
	if err != nil {
		return Group{}, pidfd, err
	}
	st, err := ReadStat(pid)
	if err != nil {
		// The child cannot be gone and reaped (nobody has waited): report,
		// and kill what there is.
		syscall.Kill(-pid, syscall.SIGKILL)
		return Group{}, pidfd, err
	}
	g = Group{PID: pid, PGID: st.PGID, StartTime: st.StartTime, UID: uid}
	registerGroup(g)
	return g, pidfd, nil
}

func startSpawner() error { return spawner.start(true) }

func (t *spawnerThread) start(dropCaps bool) error {
	t.once.Do(func() {
		t.reqs = make(chan spawnRequest)
		ready := make(chan error)
		go t.loop(dropCaps, ready)
		t.err = <-ready
	})
	return t.err
}

// loop is a permanent spawner goroutine. It never returns while the setup
// succeeded: its thread must outlive every provider it forked.
func (t *spawnerThread) loop(dropCaps bool, ready chan<- error) {
	reqs := t.reqs
	runtime.LockOSThread() // never unlocked
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		ready <- fmt.Errorf("spawn: prctl(PR_SET_NO_NEW_PRIVS) on the spawner thread: %w", err)
		return
	}
	if dropCaps {
		t.capsDropped = dropBoundingSet() == nil
	}
	ready <- nil
	for req := range reqs {
		closeOnExecAll()
		pidfd := -1
		req.attr.Sys.PidFD = &pidfd
		pid, err := syscall.ForkExec(req.argv[0], req.argv[1:len(req.argv):len(req.argv)], req.attr)
		req.reply <- spawnResult{pid: pid, pidfd: pidfd, err: err}
	}
}

// spawn forks and execs on the spawner thread. argv[0] is the path to exec;
// the child's argv is argv[1:].
func (t *spawnerThread) spawn(argv []string, attr *syscall.ProcAttr) (pid, pidfd int, err error) {
	reply := make(chan spawnResult, 1)
	t.reqs <- spawnRequest{argv: argv, attr: attr, reply: reply}
	r := <-reply
	return r.pid, r.pidfd, r.err
}

// dropBoundingSet empties the calling thread's capability bounding set.
func dropBoundingSet() error {
	last := 40
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			last = n
		}
	}
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
			return err
		}
	}
	return nil
}

// closeOnExecAll marks every descriptor of the manager above stderr
// close-on-exec. Go opens all of its own descriptors that way, but a
// manager can inherit descriptors that are not (a shell's, a job server's),
// and a fork would pass them to every provider: the provider must get
// exactly fds 0-3.
func closeOnExecAll() {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return
	}
	names, _ := d.Readdirnames(-1)
	self := int(d.Fd())
	for _, n := range names {
		fd, err := strconv.Atoi(n)
		if err != nil || fd <= 2 || fd == self {
			continue
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err == nil && flags&unix.FD_CLOEXEC == 0 {
			unix.FcntlInt(uintptr(fd), unix.F_SETFD, flags|unix.FD_CLOEXEC)
		}
	}
	d.Close()
}
