package sandbox

import (
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/sandbox/cgroups"
	"iteron.dev/operator/internal/sandbox/launcher"
	"iteron.dev/operator/internal/spawn"
	"iteron.dev/operator/internal/verifier"
)

// Config configures a node's Sandbox.
type Config struct {
	// Policy is the node's policy.
	Policy Policy
	// Launcher is the path of the iteron-sandbox executable; it is sealed
	// into a memfd once, and every launch runs those bytes. Required unless
	// the mode is off.
	Launcher string
	// ScratchDir holds the scratch directories of providers admitted
	// reversible_local (the manager's <state-dir>/scratch); "" gives none.
	ScratchDir string
	// Cgroups is where the providers' cgroups go; nil detects this
	// process's own cgroups (tests pass a layout below a cgroup they made).
	Cgroups *cgroups.Layout
	// Log, when set, is told of violations in audit mode and of cgroups
	// left behind by a dead process and removed.
	Log func(msg string, keysAndValues ...any)
}

// TreePrefix starts the name of the cgroup subtree a Sandbox makes below
// its process's cgroup (the pid follows).
const TreePrefix = "iteron-sandbox-"

// instances numbers the Sandboxes of this process.
var instances atomic.Int64

// Sandbox builds every provider's sandbox on one node (in one manager or
// survivor process).
type Sandbox struct {
	policy      Policy
	scratch     string
	log         func(string, ...any)
	launcher    *spawn.Sealed
	digest      string
	layout      *cgroups.Layout
	tree        *cgroups.Tree
	cgroupsWhy  string // why the bounds cannot be applied ("" when they can)
	landlockABI int
	rootless    bool

	mu      sync.Mutex
	filters map[filterKind]*compiled
	seq     atomic.Uint64
	ready   []*idleLauncher
	filling int
	// preparing are the launchers the pool started that have not said
	// they are prepared yet.
	preparing map[*idleLauncher]bool
	closed    bool
}

// New seals the launcher, detects what this node can apply (cgroups,
// Landlock, namespaces) and makes this process's cgroup subtree (after
// removing those of dead processes).
func New(cfg Config) (*Sandbox, error) {
	p := cfg.Policy.withDefaults()
	if err := p.Check(); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	s := &Sandbox{policy: p, scratch: cfg.ScratchDir, log: cfg.Log, filters: map[filterKind]*compiled{}, preparing: map[*idleLauncher]bool{}, rootless: os.Geteuid() != 0}
	if s.log == nil {
		s.log = func(string, ...any) {}
	}
	if p.Mode == ModeOff {
		return s, nil
	}
	if cfg.Launcher == "" || !filepath.IsAbs(cfg.Launcher) {
		return nil, fmt.Errorf("sandbox: the launcher path %q must be absolute (--sandbox-launcher)", cfg.Launcher)
	}
	digest, err := fileDigest(cfg.Launcher)
	if err != nil {
		return nil, fmt.Errorf("sandbox: the launcher: %w", err)
	}
	if s.launcher, err = spawn.SealExecutable(cfg.Launcher, digest); err != nil {
		return nil, fmt.Errorf("sandbox: sealing the launcher %s: %w", cfg.Launcher, err)
	}
	s.digest = digest
	if abi, err := ll.LandlockGetABIVersion(); err == nil && abi > 0 {
		s.landlockABI = min(abi, 7)
	}
	s.layout = cfg.Cgroups
	if s.layout == nil {
		if s.layout, err = cgroups.Attach(); err != nil {
			s.cgroupsWhy = "reading this process's cgroups: " + err.Error()
		}
	}
	if s.layout != nil {
		if missing := s.layout.Missing(); len(missing) > 0 {
			s.cgroupsWhy = "no cgroup hierarchy of this process holds " + strings.Join(missing, ", ")
			if s.layout.Note != "" {
				s.cgroupsWhy += " (" + s.layout.Note + ")"
			}
		} else {
			if removed, err := s.layout.SweepTrees(TreePrefix, alive); len(removed) > 0 || err != nil {
				s.log("removed the cgroups of a process that is gone", "trees", removed, "error", err)
			}
			// One tree per Sandbox: a process may hold several (tests build
			// many managers in one process), and each removes its own.
			name := TreePrefix + strconv.Itoa(os.Getpid())
			if n := instances.Add(1); n > 1 {
				name += "." + strconv.FormatInt(n, 10)
			}
			if s.tree, err = s.layout.NewTree(name); err != nil {
				s.cgroupsWhy = err.Error()
			}
		}
	}
	// Compile the default filter now: a profile that does not compile is
	// the manager's failure to start, not a provider's.
	if _, err := s.filter(filterKind{audit: p.Mode == ModeAudit}); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func alive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || err == unix.EPERM
}

func fileDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(f, spawn.MaxExecutableBytes+1)); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// Close removes this process's cgroup subtree (groups still holding
// processes stay) and closes the sealed launcher.
func (s *Sandbox) Close() error {
	if s == nil {
		return nil
	}
	s.drain()
	var err error
	if s.tree != nil {
		err = s.tree.Remove()
	}
	if s.launcher != nil {
		s.launcher.Close()
	}
	return err
}

// Mode is the node's mode.
func (s *Sandbox) Mode() Mode { return s.policy.Mode }

// Policy is the node's policy, defaults filled in.
func (s *Sandbox) Policy() Policy { return s.policy }

// Capacity is what a node can apply, and why not more.
type Capacity struct {
	// Mode is the node's mode.
	Mode Mode
	// Level is the highest level a launch gets.
	Level Level
	// Cgroups is the layout the bounds go on, or "unavailable".
	Cgroups string
	// CgroupsWhy says why the bounds cannot be applied ("" when they can).
	CgroupsWhy string
	// Landlock is the ABI applied, 0 when unavailable.
	Landlock int
	// Rootless reports a launcher run without root (a user namespace).
	Rootless bool
	// Launcher is the launcher's digest.
	Launcher string
	// Tree is this process's cgroup subtree (one directory per hierarchy).
	Tree []string
	// Ready are the cgroups (directory names in Tree) of the launchers
	// started ahead of their launch, ready or still preparing.
	Ready []string
}

// Capacity reports what this node applies.
func (s *Sandbox) Capacity() Capacity {
	c := Capacity{Mode: s.policy.Mode, Landlock: s.landlockABI, Rootless: s.rootless, Launcher: s.digest, Cgroups: "unavailable", CgroupsWhy: s.cgroupsWhy}
	if s.tree != nil {
		c.Cgroups = s.layout.Version()
		c.Tree = s.tree.Dirs()
		c.Ready = s.readyGroups()
	}
	switch {
	case s.policy.Mode == ModeOff:
		c.Level = LevelNone
		c.CgroupsWhy = "the sandbox is off (--sandbox=off)"
	case s.tree == nil:
		c.Level = LevelNone
	case s.policy.Mode == ModeEnforce && s.landlockABI > 0:
		c.Level = LevelIsolated
	default:
		c.Level = LevelLimits
	}
	return c
}

// why says why a node gives less than want.
func (s *Sandbox) why(c Capacity, want Level) string {
	switch {
	case s.policy.Mode == ModeOff:
		return "the sandbox is off on this node (--sandbox=off)"
	case c.Level < LevelLimits:
		return "the cgroup bounds cannot be applied: " + c.CgroupsWhy
	case want == LevelIsolated && s.policy.Mode == ModeAudit:
		return "the node runs the sandbox in audit mode (--sandbox=audit), which refuses nothing"
	case want == LevelIsolated && s.landlockABI == 0:
		return "the kernel has no Landlock, so exec cannot be confined"
	}
	return "the node applies " + c.Level.String()
}

func (s *Sandbox) filter(k filterKind) (*compiled, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.filters[k]; ok {
		return c, nil
	}
	c, err := compileProfile(k)
	if err != nil {
		return nil, err
	}
	s.filters[k] = c
	return c, nil
}

// Start is one provider's launch, as its launcher (procexec, pkgruntime)
// describes it.
type Start struct {
	// Name names its cgroup (module or implementation; a sequence number
	// is added).
	Name string
	// Capabilities are the capabilities it was admitted.
	Capabilities []string
	// Request is what its source asks of the sandbox.
	Request Request
	// ArtifactRoot is its artifact root (bound read-only; its cwd).
	ArtifactRoot string
	// Exe is its sealed executable (read to find the ELF interpreter a
	// dynamically linked binary needs).
	Exe *os.File
	// Interpreter is its #! interpreter, "" for a binary.
	Interpreter string
	// Scratch names its scratch directory below the node's ScratchDir
	// (activation and generation); used only if it was admitted
	// reversible_local.
	Scratch string
	// Argv is its argv (argv[0] included); the executable is always fd 3.
	Argv []string
}

// Launch is one sandboxed launch.
type Launch struct {
	s          *Sandbox
	module     string
	evidence   Evidence
	group      *cgroups.Group
	status     *os.File
	statusDone chan struct{}

	mu         sync.Mutex
	violations map[string]int64
	finished   bool
	settle     *time.Timer // moves the group to its steady CPU period
	oomKills   int64
	steps      []Step
}

// Step is one step of a launch and how long it took.
type Step struct {
	Name     string
	Duration time.Duration
}

// Steps are the launch's steps in order, the host's and the launcher's:
// the launch-cost breakdown.
func (l *Launch) Steps() []Step { return slices.Clone(l.steps) }

// Evidence is what the launch applied.
func (l *Launch) Evidence() Evidence { return l.evidence }

// Violations are the syscalls an audited provider made that the enforced
// sandbox refuses, counted by name.
func (l *Launch) Violations() map[string]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]int64, len(l.violations))
	for k, v := range l.violations {
		out[k] = v
	}
	return out
}

// Group is the launch's cgroup (nil without bounds): for tests and
// statistics.
func (l *Launch) Group() *cgroups.Group { return l.group }

// startTimeout bounds building a sandbox and executing the provider.
const startTimeout = 30 * time.Second

// statusDrain bounds how long Finish waits for the launcher's last
// messages (its violations) once its group is gone.
const statusDrain = 5 * time.Second

// Spawn starts a provider in its sandbox. attr is what the caller would
// have used without one (fds 0..n-1 the provider's, fd 3 its sealed
// executable, its Dir, Credential, Setpgid and Pdeathsig); uid is the
// provider's uid for the reaper. It returns the group (whose leader is the
// launcher), a pidfd of the leader (-1 when none) and the Launch. On any
// error nothing is left running and the error says what could not be
// applied: a *Error when the node cannot give what the source requires
// (nothing was started).
//
// With the mode off it starts the provider as before the sandbox
// (spawn.SpawnGroup) and the launch's evidence says so.
func (s *Sandbox) Spawn(st Start, attr *syscall.ProcAttr, uid int) (spawn.Group, int, *Launch, error) {
	c := s.Capacity()
	if st.Request.Require > c.Level {
		return spawn.Group{}, -1, nil, &Error{Field: "sandbox.require", Detail: fmt.Sprintf("the source requires the %s level; this node cannot apply it: %s", st.Request.Require, s.why(c, st.Request.Require))}
	}
	lim, err := s.policy.limitsFor(st.Request.Limits)
	if err != nil {
		return spawn.Group{}, -1, nil, err
	}
	if s.policy.Mode == ModeOff {
		g, pidfd, err := spawn.SpawnGroup(append([]string{"/proc/self/fd/3"}, st.Argv...), attr, uid)
		return g, pidfd, &Launch{s: s, evidence: Off()}, err
	}
	t0 := time.Now()
	var steps []Step
	mark := func(name string) {
		now := time.Now()
		steps = append(steps, Step{name, now.Sub(t0)})
		t0 = now
	}
	rules := Derive(st.Capabilities)
	enforce := s.policy.Mode == ModeEnforce
	ev := Evidence{Mode: s.policy.Mode, Level: c.Level, Network: NetworkNode, Exec: true, Cgroups: c.Cgroups, Seccomp: "off", Launcher: s.digest}
	if enforce {
		ev.Network, ev.Exec = rules.Network, rules.Exec
	}

	idle, fresh, err := s.take(uid)
	if err != nil {
		return spawn.Group{}, -1, nil, err
	}
	if fresh {
		mark("host: start a launcher (none was ready)")
	} else {
		mark("host: take a ready launcher")
	}
	group := idle.group
	if group != nil {
		if cl := lim.cgroupLimits(); group.Limits() != cl {
			if err := group.SetLimits(cl); err != nil {
				idle.kill()
				return spawn.Group{}, -1, nil, fmt.Errorf("sandbox: %w", err)
			}
		}
		ev.Limits = Limits{MemoryBytes: lim.MemoryBytes, CPUMillis: lim.CPUMillis, Tasks: lim.Tasks}
	}
	mark("host: write the bounds")
	cfg, err := s.launcherConfig(st, rules, lim, enforce, attr.Sys.Credential, &ev)
	if err != nil {
		idle.kill()
		return spawn.Group{}, -1, nil, err
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		idle.kill()
		return spawn.Group{}, -1, nil, err
	}
	if len(raw) > launcher.MaxConfigBytes {
		idle.kill()
		return spawn.Group{}, -1, nil, fmt.Errorf("sandbox: the launcher's config is %d bytes", len(raw))
	}
	mark("host: configure (filter, root)")
	// The configuration and the provider's descriptors, in one message:
	// the launcher maps the descriptors to the provider's 0..n-1.
	fds := make([]int, len(attr.Files))
	for i, f := range attr.Files {
		fds[i] = int(f)
	}
	if err := unix.Sendmsg(idle.ctl, raw, unix.UnixRights(fds...), nil, 0); err != nil {
		idle.kill()
		return spawn.Group{}, -1, nil, fmt.Errorf("sandbox: handing the launch to the launcher: %w", err)
	}
	// Pollable, so that the wait for the launcher is bounded.
	unix.SetNonblock(idle.ctl, true)
	statR := os.NewFile(uintptr(idle.ctl), "launcher-control")
	idle.ctl = -1 // statR owns it now
	g, pidfd := idle.g, idle.pidfd
	l := &Launch{s: s, module: st.Name, evidence: ev, group: group, status: statR, statusDone: make(chan struct{}), violations: map[string]int64{}}
	started, serr := l.awaitStart()
	if serr != nil {
		idle.group = nil // Finish removes it
		idle.kill()
		l.Finish(spawn.Exit{})
		return spawn.Group{}, -1, nil, serr
	}
	if enforce {
		l.evidence.Landlock = started.Landlock
		if started.Landlock == 0 && l.evidence.Level == LevelIsolated {
			l.evidence.Level = LevelLimits
		}
	}
	if started.StartedAtNs > 0 {
		for _, name := range []string{"launcher: read config", "launcher: private root", "launcher: /proc/sys/vm/memfd_noexec, chdir",
			"launcher: landlock", "launcher: bounding set, seccomp", "launcher: fork+exec the provider"} {
			steps = append(steps, Step{name, time.Duration(started.Steps[name])})
		}
	}
	l.steps = steps
	if group != nil {
		l.settle = time.AfterFunc(cgroups.StartPeriod, l.settleGroup)
	}
	return g, pidfd, l, nil
}

// launcherConfig is the launcher's configuration for st and the clone
// flags of its namespaces.
func (s *Sandbox) launcherConfig(st Start, rules Rules, lim Limits, enforce bool, cred *syscall.Credential, ev *Evidence) (*launcher.Config, error) {
	cfg := &launcher.Config{Version: launcher.ConfigVersion, Argv: st.Argv, Dir: st.ArtifactRoot}
	if cred != nil && !s.rootless {
		cfg.SetIDs, cfg.UID, cfg.GID = true, cred.Uid, cred.Gid
	}
	if s.rootless && enforce {
		ev.Namespaces = append(ev.Namespaces, "user")
	}
	filter, err := s.filter(filterKind{audit: !enforce, network: rules.Network == NetworkNode, exec: rules.Exec})
	if err != nil {
		return nil, err
	}
	cfg.Seccomp = filter.raw
	ev.Seccomp = filter.digest
	if !enforce {
		cfg.Audit, cfg.AuditNames = true, filter.names
		return cfg, nil
	}
	// The launcher was cloned into new mount, PID, IPC and UTS namespaces
	// (pool.go); the network and cgroup namespaces it makes itself, as the
	// launch says.
	ev.Namespaces = append(ev.Namespaces, "cgroup", "ipc", "mnt", "pid", "uts")
	if rules.Network == NetworkNone {
		cfg.PrivateNetwork = true
		ev.Namespaces = append(ev.Namespaces, "net")
	}
	slices.Sort(ev.Namespaces)
	exec := execNeeds(st.Exe, st.Interpreter)
	var more []string
	for _, f := range exec {
		if !underAny(f, s.policy.ReadOnlyPaths) {
			more = append(more, f)
		}
	}
	cfg.Root = &launcher.Root{ReadOnly: more, ArtifactRoot: st.ArtifactRoot, TmpBytes: lim.TmpBytes, Exec: rules.Exec}
	ev.Limits.TmpBytes = lim.TmpBytes
	writable := []string{"/tmp"}
	if rules.Scratch && s.scratch != "" && st.Scratch != "" {
		dir, err := s.scratchDir(st.Scratch, cfg)
		if err != nil {
			return nil, err
		}
		cfg.Root.Scratch, cfg.Root.ScratchTarget = dir, ScratchTarget
		writable = append(writable, ScratchTarget)
	}
	// vm.memfd_noexec is written as the node's root only: a rootless
	// launcher (a user namespace) cannot, and says so (Capacity.Rootless).
	cfg.MemfdNoexec = !rules.Exec && !s.rootless
	cfg.Landlock = &launcher.Landlock{Writable: writable, Devices: launcher.DeviceFiles(), Execute: exec, ExecuteAll: rules.Exec, Network: rules.Network == NetworkNone}
	return cfg, nil
}

// scratchDir makes (once) the scratch directory key below the node's
// ScratchDir, owned by the provider uid.
func (s *Sandbox) scratchDir(key string, cfg *launcher.Config) (string, error) {
	clean := filepath.Clean("/" + key)
	if clean == "/" || strings.Contains(key, "..") {
		return "", fmt.Errorf("sandbox: scratch key %q", key)
	}
	dir := filepath.Join(s.scratch, clean)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return "", fmt.Errorf("sandbox: scratch directory: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if !errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("sandbox: scratch directory: %w", err)
		}
		return dir, nil
	}
	if cfg.SetIDs {
		if err := os.Chown(dir, int(cfg.UID), int(cfg.GID)); err != nil {
			os.Remove(dir)
			return "", fmt.Errorf("sandbox: scratch directory: %w", err)
		}
	}
	return dir, nil
}

// RemoveScratch removes the scratch directories below key (a generation's,
// or an activation's).
func (s *Sandbox) RemoveScratch(key string) error {
	if s.scratch == "" {
		return nil
	}
	clean := filepath.Clean("/" + key)
	if clean == "/" {
		return fmt.Errorf("sandbox: scratch key %q", key)
	}
	return os.RemoveAll(filepath.Join(s.scratch, clean))
}

// awaitStart reads the launcher's messages until it says the provider
// runs or why it could not, then keeps reading violations.
func (l *Launch) awaitStart() (launcher.Status, error) {
	l.status.SetReadDeadline(time.Now().Add(startTimeout))
	buf := make([]byte, 64<<10)
	for {
		n, err := l.status.Read(buf)
		if err != nil || n == 0 {
			l.status.Close()
			close(l.statusDone)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return launcher.Status{}, fmt.Errorf("sandbox: the launcher did not start the provider within %v", startTimeout)
			}
			return launcher.Status{}, errors.New("sandbox: the launcher ended before starting the provider")
		}
		var st launcher.Status
		if err := json.Unmarshal(buf[:n], &st); err != nil {
			continue
		}
		switch {
		case st.Error != "":
			l.status.Close()
			close(l.statusDone)
			return st, errors.New("sandbox: " + st.Error)
		case st.Violation != "":
			l.violation(st.Violation)
		case st.Started:
			l.status.SetReadDeadline(time.Time{})
			go l.readViolations(buf)
			return st, nil
		}
	}
}

func (l *Launch) readViolations(buf []byte) {
	defer close(l.statusDone)
	defer l.status.Close()
	for {
		n, err := l.status.Read(buf)
		if err != nil || n == 0 {
			return
		}
		var st launcher.Status
		if json.Unmarshal(buf[:n], &st) == nil && st.Violation != "" {
			l.violation(st.Violation)
		}
	}
}

func (l *Launch) violation(name string) {
	violationsTotal.WithLabelValues(l.module, name).Inc()
	l.mu.Lock()
	l.violations[name]++
	n := l.violations[name]
	l.mu.Unlock()
	if n == 1 || n&(n-1) == 0 {
		l.s.log("sandbox violation (audit: allowed)", "module", l.module, "syscall", name, "count", n)
	}
}

// Finish is called once the launch's group is gone (killed and reaped): it
// turns the launcher's exit status back into the provider's (128+n is
// signal n), reads whether the kernel killed the provider for its memory,
// and removes its cgroup. It returns the provider's exit, and the reason
// of its own when memory is why it died (reasons.MemoryExceeded), "" otherwise.
// Safe to call more than once.
func (l *Launch) Finish(exit spawn.Exit) (spawn.Exit, string) {
	if l == nil {
		return exit, ""
	}
	if l.evidence.Mode != ModeOff {
		exit = ProviderExit(exit)
	}
	// The launcher's messages end with it: every violation it reported is
	// counted once its control socket is read to the end, which a reader
	// behind on a loaded machine may not have done yet (bounded: nothing
	// else should hold the socket, but nothing here waits for good).
	select {
	case <-l.statusDone:
	case <-time.After(statusDrain):
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.finished {
		l.finished = true
		if l.settle != nil {
			l.settle.Stop()
		}
		if l.group != nil {
			l.oomKills = l.group.OOMKills()
			if err := l.group.Remove(); err != nil {
				l.s.log("a provider's cgroup could not be removed", "error", err.Error())
			}
		}
	}
	if l.oomKills > 0 {
		return exit, reasons.MemoryExceeded
	}
	return exit, ""
}

// cgroupLimits are the bounds of l that its cgroup enforces (a private
// /tmp's size is its mount's).
func (l Limits) cgroupLimits() cgroups.Limits {
	return cgroups.Limits{MemoryBytes: l.MemoryBytes, CPUMillis: l.CPUMillis, Tasks: l.Tasks}
}

// settleGroup moves a running provider's group from the start period of
// its CPU bound to the steady one (cgroups.Group.Settle).
func (l *Launch) settleGroup() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.finished {
		return
	}
	if err := l.group.Settle(); err != nil {
		l.s.log("a provider's CPU bound could not be settled to its steady period", "module", l.module, "error", err.Error())
	}
}

// ProviderExit is the provider's exit from its launcher's: the launcher
// exits with the provider's status, or 128+n when signal n killed it (a
// namespace's init cannot die of a signal it sends itself).
func ProviderExit(e spawn.Exit) spawn.Exit {
	if e.Exited && e.Code > 128 && e.Code < 128+65 {
		return spawn.Exit{Signal: syscall.Signal(e.Code - 128)}
	}
	return e
}

// groupName is a cgroup directory name for a launch.
func groupName(name string, seq uint64) string {
	var b strings.Builder
	for _, r := range name {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
		if b.Len() >= 64 {
			break
		}
	}
	if b.Len() == 0 || b.String()[0] == '.' {
		return "p-" + strconv.FormatUint(seq, 10)
	}
	return b.String() + "-" + strconv.FormatUint(seq, 10)
}

func underAny(p string, dirs []string) bool {
	for _, d := range dirs {
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

// execNeeds are the files the launch itself executes besides the sealed
// memfd: a script's interpreter, and the ELF interpreter (dynamic loader)
// of the executable or of that interpreter.
func execNeeds(exe *os.File, interpreter string) []string {
	var out []string
	add := func(p string) {
		if p != "" && filepath.IsAbs(p) && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	if interpreter != "" {
		add(interpreter)
		if f, err := os.Open(interpreter); err == nil {
			add(elfInterp(f))
			f.Close()
		}
		if real, err := filepath.EvalSymlinks(interpreter); err == nil && real != interpreter {
			add(real)
		}
	} else if exe != nil {
		add(elfInterp(exe))
	}
	for _, p := range slices.Clone(out) {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			add(real)
		}
	}
	return out
}

// elfInterp is an ELF file's PT_INTERP, "" for a static binary or a
// non-ELF file.
func elfInterp(f *os.File) string {
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	ef, err := elf.NewFile(io.NewSectionReader(f, 0, st.Size()))
	if err != nil {
		return ""
	}
	defer ef.Close()
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, min(p.Filesz, 4096))
			if _, err := p.ReadAt(b, 0); err != nil {
				return ""
			}
			return strings.TrimRight(string(b), "\x00")
		}
	}
	return ""
}

// RequestOf reads a plan's sandbox request.
func RequestOf(r verifier.SandboxRequest) (Request, error) {
	lvl, err := ParseLevel(r.Require)
	if err != nil {
		return Request{}, &Error{Field: "sandbox.require", Detail: err.Error()}
	}
	return Request{Require: lvl, Limits: Limits{MemoryBytes: r.MemoryBytes, CPUMillis: r.CPUMillis, Tasks: r.Tasks, TmpBytes: r.TmpBytes}}, nil
}

// violationsTotal counts what audited providers did that the enforced
// sandbox refuses.
var violationsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "iteron_sandbox_violations_total",
	Help: "Syscalls that providers under --sandbox=audit made and that --sandbox=enforce refuses (allowed and logged), by module and syscall.",
}, []string{"module", "syscall"})

// Collectors are the sandbox's metrics.
func Collectors() []prometheus.Collector { return []prometheus.Collector{violationsTotal} }
