package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"iteron.dev/operator/internal/sandbox/cgroups"
	"iteron.dev/operator/internal/sandbox/launcher"
	"iteron.dev/operator/internal/spawn"
)

// A launcher is started before it is needed: exec'ing the launcher and
// starting its Go runtime is most of what a sandbox costs, and none of it
// depends on the launch. A Sandbox keeps poolSize launchers ready, each
// already cloned into its own mount, PID, IPC and UTS namespaces (its own
// user namespace when rootless) and waiting on its control socket; a
// launch takes one, hands it its configuration and the provider's
// descriptors in one message, and starts a new one in the background. When
// none is ready (launches in a burst) one is started for the launch.
//
// A ready launcher is a process group of its own, forked from spawn's
// launcher thread (Pdeathsig: it dies with this process) and registered
// with the reaper; closing its control socket ends it.

// poolSize is how many launchers a Sandbox keeps ready.
const poolSize = 2

// refillDelay is how long after a launch the launcher that replaces the
// one it took is started.
const refillDelay = 50 * time.Millisecond

// idleLauncher is a started launcher waiting for its launch.
type idleLauncher struct {
	g     spawn.Group
	pidfd int
	ctl   int            // our end of the control socket
	group *cgroups.Group // the cgroup it joined (nil without bounds)
}

// kill ends the launcher (and whatever it started), reaps it and forgets
// its group.
func (l *idleLauncher) kill() {
	unix.Kill(-l.g.PGID, unix.SIGKILL)
	spawn.WaitPidfd(l.pidfd, unix.WEXITED)
	unix.Close(l.pidfd)
	spawn.Unregister(l.g)
	if l.ctl >= 0 {
		unix.Close(l.ctl)
	}
	if l.group != nil {
		l.group.Remove()
	}
}

// start starts a launcher for providers of uid.
func (s *Sandbox) start(uid int) (*idleLauncher, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("sandbox: socketpair: %w", err)
	}
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		unix.Close(pair[0])
		unix.Close(pair[1])
		return nil, err
	}
	defer devNull.Close()
	// Descriptors: 0-2 /dev/null, 3 the control socket, 4 the launcher's
	// own sealed memfd (it closes it at once).
	attr := &syscall.ProcAttr{
		Dir: "/", Env: []string{},
		Files: []uintptr{devNull.Fd(), devNull.Fd(), devNull.Fd(), uintptr(pair[1]), s.launcher.File().Fd()},
		Sys:   &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL},
	}
	if s.policy.Mode == ModeEnforce {
		attr.Sys.Cloneflags = unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS
		if s.rootless {
			attr.Sys.Cloneflags |= unix.CLONE_NEWUSER
			attr.Sys.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}}
			attr.Sys.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}}
			attr.Sys.GidMappingsEnableSetgroups = false
		}
	}
	argv := []string{"/proc/self/fd/4", "iteron-sandbox", launcherProtocol}
	g, pidfd, err := spawn.SpawnLauncher(argv, attr, uid)
	unix.Close(pair[1])
	if err != nil {
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
		unix.Close(pair[0])
		return nil, fmt.Errorf("sandbox: starting the launcher: %w", err)
	}
	l := &idleLauncher{g: g, pidfd: pidfd, ctl: pair[0]}
	// What does not depend on the launch is done while the launcher waits:
	// its cgroup (with the node's default bounds, which most launches use:
	// a launch that asks others rewrites them), its network namespace, the
	// node's part of its private root.
	enforce := s.policy.Mode == ModeEnforce
	prep := launcher.Prepare{Version: launcher.ConfigVersion, CgroupNamespace: enforce, PrivateNetwork: enforce && !s.rootless}
	if enforce {
		prep.ReadOnly = s.policy.ReadOnlyPaths
	}
	if s.tree != nil {
		if l.group, err = s.tree.NewGroup("p-"+strconv.FormatUint(s.seq.Add(1), 10), s.policy.Defaults.cgroupLimits()); err != nil {
			l.kill()
			return nil, fmt.Errorf("sandbox: %w", err)
		}
		prep.Cgroups, prep.ThreadCgroups = l.group.Procs(), l.group.ProviderTasks()
	}
	raw, err := json.Marshal(prep)
	if err == nil {
		err = unix.Sendmsg(l.ctl, raw, nil, nil, 0)
	}
	if err != nil {
		l.kill()
		return nil, fmt.Errorf("sandbox: preparing the launcher: %w", err)
	}
	return l, nil
}

// launcherProtocol is the launcher's argument: the version of the control
// socket's messages it speaks.
const launcherProtocol = launcher.Protocol

// awaitPrepared waits up to timeout for the launcher's word that its
// preparation is done.
func (l *idleLauncher) awaitPrepared(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 64<<10)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("sandbox: the launcher did not prepare within %v", timeout)
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(l.ctl), Events: unix.POLLIN}}, int(left/time.Millisecond)+1)
		if err == unix.EINTR || n == 0 {
			continue
		}
		if err != nil {
			return fmt.Errorf("sandbox: waiting for the launcher: %w", err)
		}
		if n, err = unix.Read(l.ctl, buf); err != nil || n == 0 {
			return errors.New("sandbox: the launcher ended while preparing")
		}
		var st launcher.Status
		if json.Unmarshal(buf[:n], &st) != nil {
			continue
		}
		switch {
		case st.Error != "":
			return errors.New("sandbox: preparing the launcher: " + st.Error)
		case st.Prepared:
			return nil
		}
	}
}

// take returns a ready launcher for providers of uid (fresh is false) or,
// when none is ready, one started now; either way another is started in
// the background.
func (s *Sandbox) take(uid int) (l *idleLauncher, fresh bool, err error) {
	defer s.refill(uid)
	for {
		s.mu.Lock()
		if len(s.ready) == 0 {
			s.mu.Unlock()
			l, err := s.start(uid)
			return l, true, err
		}
		l := s.ready[0]
		s.ready = s.ready[1:]
		s.mu.Unlock()
		if l.g.UID == uid && alive(l.g.PID) {
			return l, false, nil
		}
		go l.kill()
	}
}

// refill starts launchers in the background until the pool holds
// poolSize, ready or being started. (It started one per launch: a launch
// that found none ready left the pool one short for good, and a second
// launch in a row always started its own.)
func (s *Sandbox) refill(uid int) {
	for {
		s.mu.Lock()
		if s.closed || s.filling+len(s.ready) >= poolSize {
			s.mu.Unlock()
			return
		}
		s.filling++
		s.mu.Unlock()
		go s.fillOne(uid)
	}
}

// fillOne starts one launcher for the pool, and puts it there once it says
// it is prepared: a launcher still starting its Go runtime and building its
// root takes about as much CPU as a provider's own start, and a launch
// beside it waited for the CPU (a launch right after the pool looked full
// took 20 ms, one 300 ms later 14, against 11.5 without the sandbox).
func (s *Sandbox) fillOne(uid int) {
	// Not at once: the launch that took a launcher is starting its
	// provider, and the next launcher's start would compete with it for
	// the CPU.
	time.Sleep(refillDelay)
	l, err := s.start(uid)
	if err == nil {
		s.mu.Lock()
		s.preparing[l] = true
		s.mu.Unlock()
		err = l.awaitPrepared(startTimeout)
		s.mu.Lock()
		delete(s.preparing, l)
		s.mu.Unlock()
		if err != nil {
			l.kill()
		}
	}
	s.mu.Lock()
	s.filling--
	if err != nil {
		s.mu.Unlock()
		s.log("a launcher could not be started ahead of a launch", "error", err.Error())
		return
	}
	if s.closed || len(s.ready) >= poolSize {
		s.mu.Unlock()
		l.kill()
		return
	}
	s.ready = append(s.ready, l)
	s.mu.Unlock()
}

// drain ends the ready launchers (and those being started).
func (s *Sandbox) drain() {
	s.mu.Lock()
	s.closed = true
	ready := s.ready
	s.ready = nil
	s.mu.Unlock()
	for _, l := range ready {
		l.kill()
	}
	for {
		s.mu.Lock()
		filling := s.filling
		s.mu.Unlock()
		if filling == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// readyGroups are the cgroups of the launchers started ahead, ready or
// still preparing (directory names).
func (s *Sandbox) readyGroups() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, l := range s.ready {
		if l.group != nil {
			out = append(out, l.group.Name())
		}
	}
	for l := range s.preparing {
		if l.group != nil {
			out = append(out, l.group.Name())
		}
	}
	slices.Sort(out)
	return out
}

// AwaitReady waits up to timeout until poolSize launchers are ready and
// reports whether they are: a benchmark measures a launch in the steady
// state of a node (launches apart), and a burst separately.
func (s *Sandbox) AwaitReady(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		s.mu.Lock()
		n := len(s.ready)
		s.mu.Unlock()
		if n >= poolSize {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
}
