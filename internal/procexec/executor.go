package procexec

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/sandbox"
	"iteron.dev/operator/internal/spawn"
	"iteron.dev/operator/internal/verifier"
	"iteron.dev/operator/pkg/protocol"
)

// DefaultProviderID is the uid and gid providers run as unless configured
// (nobody/nogroup).
const DefaultProviderID = 65534

// Config configures an Executor.
type Config struct {
	// ProviderUID and ProviderGID are the credentials every provider runs
	// as, with no supplementary groups (the manager's --provider-uid and
	// --provider-gid).
	ProviderUID, ProviderGID uint32
	// Interpreters are the absolute paths a #! script may name (the
	// manager's --interpreters).
	Interpreters []string
	// RecordDir holds the durable records of live provider groups (the
	// manager passes <state-dir>/procs). It is created if missing.
	RecordDir string
	// WaitDelay bounds how long a dead provider's stdout and stderr are
	// drained after its group is reaped (a descendant that left the group
	// may hold them); then they are closed. Default 500ms.
	WaitDelay time.Duration
	// KillTimeout bounds waiting for a killed group to disappear (a process
	// in uninterruptible sleep). Default 5s.
	KillTimeout time.Duration
	// ExecutableCacheBytes bounds the sealed copies of executables kept for
	// later launches of the same digest (renewals, relaunches); 0 keeps
	// none, and every launch copies and hashes the file.
	ExecutableCacheBytes int64
	// Sandbox, when set, builds every provider's sandbox (internal/sandbox);
	// nil starts providers with the launch guarantees only.
	Sandbox *sandbox.Sandbox
	// Trace, when set, sees every frame exchanged with every provider, in
	// the order of the exchange: a request (toProvider) just before it is
	// written, a provider's line as soon as it is read, before it is
	// judged. frame excludes the newline and is valid only during the call.
	// `kubectl iteron conformance --trace` prints them; the manager sets
	// none (frames carry run inputs and state).
	Trace func(toProvider bool, frame []byte)
}

// DefaultExecutableCacheBytes is DefaultConfig's executable cache bound.
const DefaultExecutableCacheBytes = 256 << 20

// DefaultConfig is uid/gid 65534, interpreter /bin/sh, records in recordDir.
func DefaultConfig(recordDir string) Config {
	return Config{
		ProviderUID: DefaultProviderID, ProviderGID: DefaultProviderID,
		Interpreters: []string{"/bin/sh"}, RecordDir: recordDir,
		ExecutableCacheBytes: DefaultExecutableCacheBytes,
	}
}

// Executor starts provider processes from launch plans. There is one per
// manager: it owns (with every other Executor of the process, since they are
// process-wide by nature) the permanent spawner thread and the subreaper, and
// the durable records of the provider groups it started.
type Executor struct {
	cfg   Config
	cache *spawn.SealCache

	mu   sync.Mutex
	live map[int]*Process // by leader pid
}

// NewExecutor checks cfg, creates the record directory, and starts the
// spawner and reaper goroutines if this process has none yet.
func NewExecutor(cfg Config) (*Executor, error) {
	if cfg.RecordDir == "" || !filepath.IsAbs(cfg.RecordDir) {
		return nil, fmt.Errorf("procexec: record directory %q must be an absolute path", cfg.RecordDir)
	}
	for _, in := range cfg.Interpreters {
		if !filepath.IsAbs(in) || filepath.Clean(in) != in {
			return nil, fmt.Errorf("procexec: interpreter %q must be an absolute, clean path", in)
		}
	}
	if cfg.WaitDelay <= 0 {
		cfg.WaitDelay = 500 * time.Millisecond
	}
	if cfg.KillTimeout <= 0 {
		cfg.KillTimeout = 5 * time.Second
	}
	cfg.Interpreters = slices.Clone(cfg.Interpreters)
	if err := os.MkdirAll(cfg.RecordDir, 0o700); err != nil {
		return nil, fmt.Errorf("procexec: record directory: %w", err)
	}
	if err := spawn.Start(); err != nil {
		return nil, err
	}
	return &Executor{cfg: cfg, cache: spawn.NewSealCache(cfg.ExecutableCacheBytes), live: map[int]*Process{}}, nil
}

// Config returns the executor's configuration, defaults filled in.
func (e *Executor) Config() Config {
	c := e.cfg
	c.Interpreters = slices.Clone(c.Interpreters)
	return c
}

// Sweep kills the provider groups an earlier manager recorded and left
// behind (it died without stopping them), and removes their records. Call it
// once at manager start, before Launch. A record whose pid now names another
// process (a different start time) is removed without killing anything.
func (e *Executor) Sweep() (SweepReport, error) {
	return spawn.SweepRecords(e.cfg.RecordDir, func(pid int) bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		_, ok := e.live[pid]
		return ok
	})
}

// Live returns the processes started by e that are not yet torn down.
func (e *Executor) Live() []*Process {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]*Process, 0, len(e.live))
	for _, p := range e.live {
		out = append(out, p)
	}
	return out
}

// Launch starts the provider of plan: it copies the executable into a sealed
// memfd and hashes it, refuses it (KindRefused, nothing spawned) unless the
// digest is the plan's (a sealed copy of that digest kept from an earlier
// launch is used as it is), checks a #! interpreter against the allowlist,
// and execs the memfd from the spawner thread: no shell, an empty
// environment, its own process group, the configured uid/gid with no
// supplementary groups and no capabilities, NoNewPrivs, cwd the artifact
// root, fds 0-2 the pipes and fd 3 the memfd, and nothing else. The file is
// hashed again after the start (a mismatch kills the group, KindTampered).
// The returned Process is not loaded yet: call Load.
func (e *Executor) Launch(plan verifier.LaunchPlan) (*Process, error) {
	return e.LaunchIn(plan, "")
}

// LaunchIn is Launch with the name of the provider's scratch directory
// (its activation and generation, "<activation-uid>/<generation>"), which a
// sandboxed provider admitted reversible_local keeps across the processes
// of its generation.
func (e *Executor) LaunchIn(plan verifier.LaunchPlan, scratch string) (*Process, error) {
	if err := checkPlan(plan); err != nil {
		return nil, err
	}
	exe, err := e.cache.SealRunnable(plan.Executable(), plan.ArtifactSHA256(), e.cfg.Interpreters)
	if err != nil {
		return nil, sealFault(err)
	}
	return e.launch(plan, exe.File(), exe.Head(), scratch)
}

// launch checks the plan and the #! interpreter and starts the sealed
// executable exe (whose first bytes are head); it takes ownership of exe.
func (e *Executor) launch(plan verifier.LaunchPlan, exe *os.File, head []byte, scratch string) (*Process, error) {
	defer exe.Close()
	if err := checkPlan(plan); err != nil {
		return nil, err
	}
	version := protocol.Version(plan.ProtocolVersion())
	interpreter, serr := spawn.CheckInterpreter(head, e.cfg.Interpreters)
	if serr != nil {
		return nil, sealFault(serr)
	}

	var files [6]*os.File // stdin r/w, stdout r/w, stderr r/w
	closeAll := func() {
		for _, f := range files {
			if f != nil {
				f.Close()
			}
		}
	}
	for i := 0; i < 6; i += 2 {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll()
			return nil, &Fault{Kind: KindSpawn, Op: OpSpawn, Detail: "pipe: " + err.Error(), Err: err}
		}
		files[i], files[i+1] = r, w
	}
	stdinR, stdinW, stdoutR, stdoutW, stderrR, stderrW := files[0], files[1], files[2], files[3], files[4], files[5]
	// A frame is up to 1 MiB: with the default 64 KiB pipe, a large input or
	// observation crosses in 16 pieces, each a wake-up of the other side. A
	// pipe as large as a frame lets it cross in one (best effort: the
	// system's pipe-max-size may be lower).
	for _, f := range []*os.File{stdinR, stdoutW} {
		unix.FcntlInt(f.Fd(), unix.F_SETPIPE_SZ, protocol.MaxFrameBytes)
	}

	cred := &syscall.Credential{Uid: e.cfg.ProviderUID, Gid: e.cfg.ProviderGID, Groups: []uint32{}}
	if os.Geteuid() != 0 {
		// Without CAP_SETGID setgroups fails; an unprivileged manager can
		// only run providers as itself.
		cred.NoSetGroups = true
	}
	attr := &syscall.ProcAttr{
		Dir:   plan.ArtifactRoot(),
		Env:   []string{}, // empty, not nil: nil would pass the manager's environment
		Files: []uintptr{stdinR.Fd(), stdoutW.Fd(), stderrW.Fd(), exe.Fd()},
		Sys: &syscall.SysProcAttr{
			Setpgid:    true,
			Pdeathsig:  syscall.SIGKILL,
			Credential: cred,
		},
	}
	argv := append([]string{"/proc/self/fd/3", plan.Executable()}, plan.Argv()...)

	var (
		g     spawn.Group
		pidfd int
		sb    *sandbox.Launch
		err   error
	)
	if e.cfg.Sandbox != nil {
		g, pidfd, sb, err = e.spawnSandboxed(plan, exe, interpreter, scratch, argv[1:], attr)
	} else {
		g, pidfd, err = spawn.SpawnGroup(argv, attr, int(e.cfg.ProviderUID))
	}
	stdinR.Close()
	stdoutW.Close()
	stderrW.Close()
	if err != nil {
		stdinW.Close()
		stdoutR.Close()
		stderrR.Close()
		if pidfd >= 0 {
			syscall.Close(pidfd)
		}
		if f, ok := sandboxFault(err); ok {
			return nil, f
		}
		return nil, &Fault{Kind: KindSpawn, Op: OpSpawn, Detail: fmt.Sprintf("exec %s (interpreter %q) as %d:%d in %s: %v", plan.Executable(), interpreter, e.cfg.ProviderUID, e.cfg.ProviderGID, plan.ArtifactRoot(), err), Err: err}
	}
	if err := unix.SetNonblock(pidfd, true); err != nil {
		// Without a pollable pidfd the exit watcher cannot work: give up.
		syscall.Kill(-g.PGID, syscall.SIGKILL)
		spawn.WaitPidfd(pidfd, unix.WEXITED)
		syscall.Close(pidfd)
		spawn.Unregister(g)
		sb.Finish(spawn.Exit{})
		stdinW.Close()
		stdoutR.Close()
		stderrR.Close()
		return nil, &Fault{Kind: KindSpawn, Op: OpSpawn, Detail: "pidfd: " + err.Error(), Err: err}
	}
	p := newProcess(e, plan, version, g, os.NewFile(uintptr(pidfd), "pidfd"), stdinW, stdoutR, stderrR, interpreter)
	p.sandbox = sb
	e.mu.Lock()
	e.live[g.PID] = p
	e.mu.Unlock()
	p.start()
	return p, nil
}

// checkPlan refuses a plan the executor cannot run.
func checkPlan(plan verifier.LaunchPlan) error {
	if _, ok := plan.PackageRuntime(); ok {
		// Its runtime_deadline would be read as a process lifetime and its
		// gRPC service as a line protocol: internal/pkgruntime runs it.
		return &Fault{Kind: KindRefused, Op: OpSpawn, Reason: reasons.UnsupportedVersion, Detail: fmt.Sprintf("%s is a package runtime, which this executor does not run", plan.ImplementationID())}
	}
	if !protocol.Version(plan.ProtocolVersion()).Valid() {
		return &Fault{Kind: KindRefused, Op: OpSpawn, Reason: reasons.UnsupportedVersion, Detail: fmt.Sprintf("protocol version %d", plan.ProtocolVersion())}
	}
	if !filepath.IsAbs(plan.Executable()) || !filepath.IsAbs(plan.ArtifactRoot()) {
		return &Fault{Kind: KindRefused, Op: OpSpawn, Reason: reasons.VerificationFailed, Detail: "the plan's executable and artifact root must be absolute"}
	}
	if plan.RuntimeDeadline() <= 0 || plan.CancellationDeadline() <= 0 {
		return &Fault{Kind: KindRefused, Op: OpSpawn, Reason: reasons.VerificationFailed, Detail: "the plan has no deadlines"}
	}
	return nil
}

func (e *Executor) forget(p *Process) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.live[p.group.PID] == p {
		delete(e.live, p.group.PID)
	}
}

// errNotRecorded marks a process whose durable record could not be written.
var errNotRecorded = errors.New("procexec: the process group could not be recorded")
