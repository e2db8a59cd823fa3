package spawn

import (
	"fmt"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The reaper makes the manager a child subreaper (PR_SET_CHILD_SUBREAPER):
// descendants of a provider whose parent dies are re-parented to the manager
// rather than to init, so the manager can kill and reap them. It never calls
// wait4(-1), which would reap children that are none of its business (a
// test's etcd): it scans /proc for processes whose PPid is the manager and
// reaps only
//   - zombies in a recorded provider group (pid + pgid + start time), and
//   - processes running as a provider uid that is not the manager's own, which
//     can only descend from a provider that left its group (setsid): those are
//     killed, then reaped.
//
// Group leaders are never reaped here: each Process reaps its own leader
// through its pidfd, after the group is gone.

// Group is a provider's process group as the reaper knows it: its leader,
// the group's id, the leader's start time (with the pid, one process for the
// life of the machine) and the uid the provider runs as.
type Group struct {
	// PID is the group's leader, the provider process.
	PID int
	// PGID is the group's id (the leader's pid while the leader is unreaped).
	PGID int
	// StartTime is the leader's start time in clock ticks since boot.
	StartTime uint64
	// UID is the uid the provider runs as.
	UID int
}

var reaper struct {
	once sync.Once
	err  error
	self int

	// mu is held while reaping anything but a leader, so that a pid read
	// from /proc is not reaped (and reused) by another goroutine between the
	// read and the wait.
	mu     sync.Mutex
	groups map[int]Group // by pgid
	// providerUIDs are the uids, other than the manager's, that providers
	// have run as during this manager's life: an escaped descendant keeps
	// its uid long after its group is gone.
	providerUIDs map[int]bool
	// escaped are the escaped descendants killed, for ReapOrphans.
	escaped []int
	kick    chan struct{}
}

func startReaper() error {
	reaper.once.Do(func() {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			reaper.err = fmt.Errorf("spawn: prctl(PR_SET_CHILD_SUBREAPER): %w", err)
			return
		}
		reaper.self = os.Getpid()
		reaper.groups = map[int]Group{}
		reaper.providerUIDs = map[int]bool{}
		reaper.kick = make(chan struct{}, 1)
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGCHLD)
		go reaperLoop(sig, reaper.kick)
	})
	return reaper.err
}

// reaperLoop is the permanent reaper goroutine: it scans on SIGCHLD, when
// kicked, and every few seconds as a backstop (signals coalesce).
func reaperLoop(sig <-chan os.Signal, kick <-chan struct{}) {
	tick := time.NewTicker(5 * time.Second)
	for {
		select {
		case <-sig:
			childChanged()
		case <-kick:
		case <-tick.C:
		}
		reapOrphans()
	}
}

// childEvents is closed (and replaced) whenever SIGCHLD arrives: a group
// sweep waits on it instead of polling blindly.
var childEvents = struct {
	sync.Mutex
	ch chan struct{}
}{ch: make(chan struct{})}

func childChanged() {
	childEvents.Lock()
	close(childEvents.ch)
	childEvents.ch = make(chan struct{})
	childEvents.Unlock()
}

func nextChildEvent() <-chan struct{} {
	childEvents.Lock()
	defer childEvents.Unlock()
	return childEvents.ch
}

// Kick has the reaper scan /proc now: after a group is torn down, its
// descendants that left it are re-parented to the manager.
func Kick() {
	select {
	case reaper.kick <- struct{}{}:
	default:
	}
}

// registerGroup is called with reaper.mu held (SpawnGroup holds it across
// the fork).
func registerGroup(g Group) {
	reaper.groups[g.PGID] = g
	if g.UID != os.Geteuid() {
		reaper.providerUIDs[g.UID] = true
	}
}

// Unregister forgets a group once it is gone (every member killed and
// reaped): its pgid may be reused from then on.
func Unregister(g Group) {
	reaper.mu.Lock()
	defer reaper.mu.Unlock()
	delete(reaper.groups, g.PGID)
}

// ReapOrphans scans /proc at once, as the reaper does on SIGCHLD: it reaps
// zombie members of recorded provider groups re-parented to the manager and
// kills (and reaps) descendants that left their provider's group. It returns
// the pids of the escaped descendants killed since the last call (by this
// scan or the reaper's own), which the conformance check reports as
// processes left behind.
func ReapOrphans() []int {
	if startReaper() != nil {
		return nil
	}
	reapOrphans()
	reaper.mu.Lock()
	defer reaper.mu.Unlock()
	out := reaper.escaped
	reaper.escaped = nil
	return out
}

func reapOrphans() {
	pids, err := listPIDs()
	if err != nil {
		return
	}
	reaper.mu.Lock()
	defer reaper.mu.Unlock()
	for _, pid := range pids {
		st, err := ReadStat(pid)
		if err != nil || st.PPID != reaper.self {
			continue
		}
		if g, ok := reaper.groups[st.PGID]; ok {
			if pid != g.PID && st.State == 'Z' {
				reapPID(pid)
			}
			continue
		}
		if len(reaper.providerUIDs) == 0 {
			continue
		}
		uid, err := readUID(pid)
		if err != nil || !reaper.providerUIDs[uid] {
			continue
		}
		// A provider's descendant that left its group: kill it, and reap it
		// once it is a zombie (now or at the next scan).
		if st.State != 'Z' && len(reaper.escaped) < 1024 && !slices.Contains(reaper.escaped, pid) {
			reaper.escaped = append(reaper.escaped, pid)
		}
		syscall.Kill(pid, syscall.SIGKILL)
		if st.State == 'Z' {
			reapPID(pid)
		} else {
			kickLater()
		}
	}
}

var kickPending sync.Mutex

// kickLater rescans shortly, to reap what was just killed.
func kickLater() {
	if !kickPending.TryLock() {
		return
	}
	time.AfterFunc(20*time.Millisecond, func() {
		kickPending.Unlock()
		Kick()
	})
}

// reapPID reaps one child that /proc shows as a zombie (caller holds
// reaper.mu) and reports whether it did. A zombie leader whose other
// threads are still exiting shows 'Z' but cannot be reaped yet.
func reapPID(pid int) bool {
	var info siginfo
	err := waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOHANG)
	return err == nil && info.Pid == int32(pid) || err == syscall.ECHILD
}

// siginfo is the part of siginfo_t that waitid fills for a child.
type siginfo struct {
	Signo  int32
	Errno  int32
	Code   int32
	_      int32
	Pid    int32
	UID    uint32
	Status int32
	_      [100]byte
}

// si_code values of a SIGCHLD siginfo.
const cldExited = 1

// Exit describes how a child ended.
type Exit struct {
	// Exited is true for a normal exit with Code; false for death by Signal.
	Exited bool
	// Code is the exit status of a normal exit.
	Code int
	// Signal is the signal that killed it.
	Signal syscall.Signal
}

// String is "exit status N" or "killed by signal N (name)".
func (e Exit) String() string {
	if e.Exited {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return fmt.Sprintf("killed by signal %d (%v)", int(e.Signal), e.Signal)
}

// Success reports a normal exit with status 0.
func (e Exit) Success() bool { return e.Exited && e.Code == 0 }

func exitOf(info *siginfo) Exit {
	switch info.Code {
	case cldExited:
		return Exit{Exited: true, Code: int(info.Status)}
	default:
		return Exit{Signal: syscall.Signal(info.Status)}
	}
}

// WaitPidfd waits on a pidfd with waitid(P_PIDFD) and the given options
// (unix.WEXITED, with WNOWAIT to look without reaping, WNOHANG not to
// block). changed is false when WNOHANG found nothing to report.
func WaitPidfd(fd int, options int) (changed bool, exit Exit, err error) {
	var info siginfo
	if err := waitid(unix.P_PIDFD, fd, &info, options); err != nil {
		return false, Exit{}, err
	}
	if info.Pid == 0 {
		return false, Exit{}, nil
	}
	return true, exitOf(&info), nil
}

func waitid(idtype, id int, info *siginfo, options int) error {
	for {
		_, _, e := syscall.Syscall6(syscall.SYS_WAITID, uintptr(idtype), uintptr(id), uintptr(unsafe.Pointer(info)), uintptr(options), 0, 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return e
		}
		return nil
	}
}

// SweepGroup waits until no process but the (already exited, unreaped)
// leader is left in group g, reaping the members re-parented to the
// manager as they die. The group has been sent SIGKILL while the leader was
// unreaped, so no process can join it any more; it is sent SIGKILL again on
// every pass anyway (the leader still pins the pgid). It returns the pids
// still present at the deadline.
func SweepGroup(g Group, deadline time.Time) []int {
	pgid, leader := g.PGID, g.PID
	for {
		// Subscribe before scanning, so that a child dying during the scan
		// wakes the wait below.
		event := nextChildEvent()
		syscall.Kill(-pgid, syscall.SIGKILL)
		members, err := GroupMembers(pgid)
		if err != nil {
			return nil
		}
		var others []Stat
		for _, m := range members {
			if m.PID != leader {
				others = append(others, m)
			}
		}
		if len(others) == 0 {
			return nil
		}
		reaped := 0
		reaper.mu.Lock()
		for _, m := range others {
			if m.PPID == reaper.self && m.State == 'Z' && reapPID(m.PID) {
				reaped++
			}
		}
		reaper.mu.Unlock()
		if reaped == len(others) {
			// Every member seen was a zombie child of ours and is reaped; no
			// new member can have appeared since the kill.
			return nil
		}
		if time.Now().After(deadline) {
			var left []int
			for _, m := range others {
				left = append(left, m.PID)
			}
			return left
		}
		// A member dies (or is re-parented dead) with a SIGCHLD to this
		// process; a member whose parent is another member dies without
		// one, so do not wait long for it.
		timer := time.NewTimer(time.Millisecond)
		select {
		case <-event:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// AwaitExit blocks until the leader behind pidfd (a non-blocking pidfd, so
// that the poller can wait on it) has exited, without reaping it, and
// returns how it ended (the zero Exit if the pidfd could not be waited on).
func AwaitExit(pidfd *os.File) Exit {
	var exit Exit
	rc, err := pidfd.SyscallConn()
	if err != nil {
		return exit
	}
	rc.Read(func(fd uintptr) bool {
		changed, e, werr := WaitPidfd(int(fd), unix.WEXITED|unix.WNOWAIT|unix.WNOHANG)
		switch {
		case werr == syscall.EAGAIN, werr == nil && !changed:
			return false
		case werr == nil:
			exit = e
		}
		return true
	})
	return exit
}

// KillGroup ends group g: it kills the group (its leader still unreaped,
// the pgid still names it), waits up to timeout for the leader to exit
// (exited is closed when it has), sweeps the other members, reaps the
// leader through its pidfd, unregisters the group once nothing is left of
// it, and has the reaper scan for descendants that left it. It returns how
// the leader ended and the pids still present at the deadline (the leader
// among them if it never exited).
func KillGroup(g Group, pidfd *os.File, exited <-chan struct{}, timeout time.Duration) (Exit, []int) {
	syscall.Kill(-g.PGID, syscall.SIGKILL)
	deadline := time.Now().Add(timeout)
	t := time.NewTimer(timeout)
	select {
	case <-exited:
	case <-t.C:
	}
	t.Stop()
	unreaped := SweepGroup(g, deadline)
	var exit Exit
	select {
	case <-exited:
		if rc, err := pidfd.SyscallConn(); err == nil {
			rc.Control(func(fd uintptr) { _, exit, _ = WaitPidfd(int(fd), unix.WEXITED) })
		}
	default:
		unreaped = append(unreaped, g.PID)
	}
	if len(unreaped) == 0 {
		Unregister(g)
	}
	Kick() // descendants that left the group are re-parented now
	return exit, unreaped
}
