package pkgruntime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/sandbox"
	"iteron.dev/operator/internal/spawn"
)

// LaunchConfig is how a Launcher starts runtimes.
type LaunchConfig struct {
	// ProviderUID and ProviderGID are the credentials runtimes run as.
	ProviderUID, ProviderGID uint32
	// RecordDir holds the durable records of live runtime groups (swept at
	// the next start after a crash, as the executor's are).
	RecordDir string
	// SocketDir holds one private directory per runtime with its listening
	// socket; it must be the manager's alone (0700).
	SocketDir string
	// Interpreters is the #! allowlist, as for line-protocol providers.
	Interpreters []string
	// KillTimeout bounds the wait for a killed group to be gone.
	KillTimeout time.Duration
	// StderrBytes bounds the stderr kept per runtime.
	StderrBytes int64
	// SealCacheBytes bounds the sealed executables kept for relaunches.
	SealCacheBytes int64
	// Sandbox, when set, builds every runtime's sandbox
	// (internal/sandbox): a runtime needs its inherited socket and nothing
	// more, so it gets the network its capabilities say like any provider.
	Sandbox *sandbox.Sandbox
}

// Launcher starts package runtimes with the guarantees every provider gets:
// the verified bytes in a sealed memfd (and the file hashed again after the
// start), an empty environment, a process group of its own forked from the
// spawner thread (Pdeathsig, NoNewPrivs, no capabilities), the provider's
// uid, cwd the artifact root, and descriptors 0-5 only: /dev/null, /dev/null,
// stderr (kept in a bounded ring), the executable, the listening socket and
// the launch key's pipe.
type Launcher struct {
	cfg   LaunchConfig
	seals *spawn.SealCache
	// seen remembers the instance IDs answered, per revision: an instance
	// ID is new per process.
	mu   sync.Mutex
	seen map[string]bool
}

// NewLauncher checks cfg, creates its directories and starts the spawner
// and reaper (once per manager, shared with the executor).
func NewLauncher(cfg LaunchConfig) (*Launcher, error) {
	if cfg.RecordDir == "" || cfg.SocketDir == "" {
		return nil, errors.New("pkgruntime: LaunchConfig.RecordDir and SocketDir are required")
	}
	if cfg.KillTimeout <= 0 {
		cfg.KillTimeout = 5 * time.Second
	}
	if cfg.StderrBytes <= 0 {
		cfg.StderrBytes = 64 << 10
	}
	for _, d := range []string{cfg.RecordDir, cfg.SocketDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("pkgruntime: %w", err)
		}
	}
	if err := spawn.Start(); err != nil {
		return nil, err
	}
	return &Launcher{cfg: cfg, seals: spawn.NewSealCache(cfg.SealCacheBytes), seen: map[string]bool{}}, nil
}

// Sweep kills the runtime groups an earlier manager recorded and left
// behind, and removes their records and socket directories.
func (l *Launcher) Sweep() (spawn.SweepReport, error) {
	rep, err := spawn.SweepRecords(l.cfg.RecordDir, func(int) bool { return false })
	if entries, rerr := os.ReadDir(l.cfg.SocketDir); rerr == nil {
		for _, e := range entries {
			os.RemoveAll(filepath.Join(l.cfg.SocketDir, e.Name()))
		}
	}
	return rep, err
}

// Runtime is one launched, handshaken runtime process.
type Runtime struct {
	l       *Launcher
	group   spawn.Group
	sandbox *sandbox.Launch // nil without a sandbox
	pidfd   *os.File
	conn    *Conn
	dir     string // the private socket directory
	record  string
	errs    *spawn.Ring
	// startedAt is when the process was started.
	startedAt time.Time

	exited     chan struct{} // closed when the leader has exited (not yet reaped)
	stderrDone chan struct{}
	stopOnce   sync.Once
	mu         sync.Mutex
	report     Teardown
}

// Teardown is what stopping a runtime found.
type Teardown struct {
	// Exit is how the leader ended.
	Exit spawn.Exit
	// Unreaped lists pids still in the group at the kill deadline.
	Unreaped []int
	// Reaped is how long the teardown took.
	Reaped time.Duration
	// Cause is reasons.MemoryExceeded when the kernel killed the runtime
	// for its memory bound (its sandbox), "" otherwise.
	Cause string
}

// Launch starts the runtime that pin's verified manifest describes, from
// artifactRoot, and runs its handshake. On any failure nothing is left: the
// group is killed and reaped, its record and socket directory removed.
func (l *Launcher) Launch(ctx context.Context, pin Pin, artifactRoot string) (*Runtime, error) {
	m := pin.Manifest
	path := filepath.Join(artifactRoot, m.Executable)
	exe, err := l.seals.SealRunnable(path, "sha256:"+m.ArtifactSHA256, l.cfg.Interpreters)
	if err != nil {
		var se *spawn.SealError
		if errors.As(err, &se) && (se.Refused || se.Verification) {
			return nil, &Error{Code: reasons.VerificationFailed, Field: "executable", Detail: se.Detail, Err: err}
		}
		return nil, &Error{Code: reasons.ActivationFailed, Field: "executable", Detail: err.Error(), Err: err}
	}
	defer exe.Close()
	key, err := NewLaunchKey()
	if err != nil {
		return nil, err
	}
	r, err := l.start(pin, artifactRoot, exe, key)
	if err != nil {
		var se *sandbox.Error
		if errors.As(err, &se) {
			return nil, &Error{Code: reasons.SandboxUnavailable, Field: se.Field, Detail: se.Detail, Err: err}
		}
		return nil, &Error{Code: reasons.ActivationFailed, Field: "spawn", Detail: err.Error(), Err: err}
	}
	if err := spawn.Rehash(path, "sha256:"+m.ArtifactSHA256); err != nil {
		r.Kill()
		return nil, &Error{Code: reasons.VerificationFailed, Field: "executable", Detail: "changed after the start: " + err.Error(), Err: err}
	}
	conn, err := Dial(ctx, filepath.Join(r.dir, "runtime.sock"), key, pin, l.seenBefore(m.PackageRevisionID))
	if err != nil {
		r.Kill()
		return nil, err
	}
	r.conn = conn
	// An exit nobody asked for (a crash) is torn down at once, as the
	// executor does for its providers: the group killed, the leader reaped,
	// its record and socket directory removed — not left as a zombie until
	// its owner gets to Kill (a generation failed by its crash budget may
	// never). Kill is idempotent: a Stop or Kill of the owner's gets the
	// same report.
	go func() {
		<-r.exited
		r.Kill()
	}()
	return r, nil
}

// seenBefore returns the handshake's check that an instance ID is new, and
// remembers it.
func (l *Launcher) seenBefore(revision string) func(string) bool {
	return func(id string) bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		k := revision + "\x00" + id
		if l.seen[k] {
			return true
		}
		l.seen[k] = true
		return false
	}
}

func (l *Launcher) start(pin Pin, artifactRoot string, exe *spawn.Sealed, key []byte) (*Runtime, error) {
	dir, err := os.MkdirTemp(l.cfg.SocketDir, "rt-")
	if err != nil {
		return nil, err
	}
	r := &Runtime{l: l, dir: dir, errs: spawn.NewRing(l.cfg.StderrBytes), exited: make(chan struct{}), stderrDone: make(chan struct{})}
	fail := func(err error) (*Runtime, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "runtime.sock"), Net: "unix"})
	if err != nil {
		return fail(err)
	}
	lis.SetUnlinkOnClose(false)
	lisFile, err := lis.File()
	lis.Close()
	if err != nil {
		return fail(err)
	}
	defer lisFile.Close()
	keyR, keyW, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	defer keyR.Close()
	defer keyW.Close()
	errR, errW, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		errR.Close()
		errW.Close()
		return fail(err)
	}
	defer devNull.Close()
	cred := &syscall.Credential{Uid: l.cfg.ProviderUID, Gid: l.cfg.ProviderGID, Groups: []uint32{}}
	if os.Geteuid() != 0 {
		cred.NoSetGroups = true
	}
	attr := &syscall.ProcAttr{
		Dir:   artifactRoot,
		Env:   []string{},
		Files: []uintptr{devNull.Fd(), devNull.Fd(), errW.Fd(), exe.File().Fd(), lisFile.Fd(), keyR.Fd()},
		Sys:   &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: cred},
	}
	argv := []string{"/proc/self/fd/3", pin.Manifest.Executable}
	var g spawn.Group
	var pidfd int
	if l.cfg.Sandbox != nil {
		var req sandbox.Request
		if req, err = sandbox.RequestOf(pin.Sandbox); err == nil {
			interp, _ := spawn.CheckInterpreter(exe.Head(), l.cfg.Interpreters)
			g, pidfd, r.sandbox, err = l.cfg.Sandbox.Spawn(sandbox.Start{
				Name: pin.Manifest.Module, Capabilities: pin.Admitted, Request: req, ArtifactRoot: artifactRoot,
				Exe: exe.File(), Interpreter: interp, Scratch: pin.Scratch, Argv: argv[1:],
			}, attr, int(l.cfg.ProviderUID))
		}
	} else {
		g, pidfd, err = spawn.SpawnGroup(argv, attr, int(l.cfg.ProviderUID))
	}
	errW.Close()
	if err != nil {
		errR.Close()
		if pidfd >= 0 {
			syscall.Close(pidfd)
		}
		var se *sandbox.Error
		if errors.As(err, &se) {
			return fail(err)
		}
		return fail(fmt.Errorf("exec %s as %d:%d in %s: %w", pin.Manifest.Executable, l.cfg.ProviderUID, l.cfg.ProviderGID, artifactRoot, err))
	}
	// A pollable pidfd is what lets watchExit wait for the exit without
	// blocking a thread (and without reaping): os.NewFile only registers a
	// non-blocking descriptor with the poller.
	if err := unix.SetNonblock(pidfd, true); err != nil {
		syscall.Kill(-g.PGID, syscall.SIGKILL)
		spawn.WaitPidfd(pidfd, unix.WEXITED)
		syscall.Close(pidfd)
		spawn.Unregister(g)
		r.sandbox.Finish(spawn.Exit{})
		errR.Close()
		return fail(fmt.Errorf("pidfd: %w", err))
	}
	r.group, r.pidfd, r.startedAt = g, os.NewFile(uintptr(pidfd), "pidfd"), time.Now()
	go func() {
		defer close(r.stderrDone)
		io.CopyBuffer(r.errs, errR, make([]byte, 32<<10))
		errR.Close()
	}()
	go r.watchExit()
	// The key crosses once, then end of file.
	if _, err := keyW.Write(key); err != nil {
		r.Kill()
		return nil, fmt.Errorf("writing the launch key: %w", err)
	}
	keyW.Close()
	rec := spawn.Record{PID: g.PID, PGID: g.PGID, StartTime: g.StartTime, BootID: spawn.BootID(), UID: g.UID,
		Module: pin.Manifest.Module, ImplementationID: pin.Manifest.PackageRevisionID, ArtifactSHA256: "sha256:" + pin.Manifest.ArtifactSHA256}
	if r.record, err = spawn.WriteRecord(l.cfg.RecordDir, rec); err != nil {
		r.Kill()
		return nil, fmt.Errorf("writing the group record: %w", err)
	}
	return r, nil
}

// watchExit waits, without reaping, for the leader to exit.
func (r *Runtime) watchExit() {
	defer close(r.exited)
	spawn.AwaitExit(r.pidfd)
}

// Conn is the host's connection to the runtime.
func (r *Runtime) Conn() *Conn { return r.conn }

// Pid is the runtime's pid (its group's leader).
func (r *Runtime) Pid() int { return r.group.PID }

// StartedAt is when the runtime's process was started.
func (r *Runtime) StartedAt() time.Time { return r.startedAt }

// Exited is closed when the runtime's process has exited.
func (r *Runtime) Exited() <-chan struct{} { return r.exited }

// StderrTail is the newest stderr the runtime wrote (bounded).
func (r *Runtime) StderrTail() []byte { return r.errs.Tail() }

// Stop asks the runtime to end (SIGTERM), waits up to grace for it, then
// kills what is left of its group (see Kill).
func (r *Runtime) Stop(grace time.Duration) Teardown {
	syscall.Kill(r.group.PID, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-r.exited:
	case <-t.C:
	}
	return r.Kill()
}

// Kill kills the runtime's group, waits for every member to be gone and the
// leader reaped, and removes its record and socket directory. Safe to call
// more than once; later calls return the first report.
func (r *Runtime) Kill() Teardown {
	r.stopOnce.Do(func() {
		t0 := time.Now()
		if r.conn != nil {
			r.conn.Close()
		}
		var rep Teardown
		rep.Exit, rep.Unreaped = spawn.KillGroup(r.group, r.pidfd, r.exited, r.l.cfg.KillTimeout)
		r.pidfd.Close()
		if r.sandbox != nil && len(rep.Unreaped) == 0 {
			rep.Exit, rep.Cause = r.sandbox.Finish(rep.Exit)
		}
		if len(rep.Unreaped) == 0 && r.record != "" {
			os.Remove(r.record)
		}
		select {
		case <-r.stderrDone:
		case <-time.After(time.Second): // an escaped descendant may hold stderr
		}
		os.RemoveAll(r.dir)
		rep.Reaped = time.Since(t0)
		r.mu.Lock()
		r.report = rep
		r.mu.Unlock()
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.report
}

// Sandbox is what the runtime's sandbox applied, false without one.
func (r *Runtime) Sandbox() (sandbox.Evidence, bool) {
	if r.sandbox == nil {
		return sandbox.Evidence{}, false
	}
	return r.sandbox.Evidence(), true
}

// SandboxViolations are the syscalls the runtime made, under
// --sandbox=audit, that the enforced sandbox refuses, by name.
func (r *Runtime) SandboxViolations() map[string]int64 {
	if r.sandbox == nil {
		return nil
	}
	return r.sandbox.Violations()
}
