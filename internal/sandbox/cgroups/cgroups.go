// Package cgroups gives each provider a cgroup of its own with memory, CPU
// and task bounds, below the cgroup of the process that launches it (the
// manager or the survivor), on the cgroup v1 hierarchies and on the v2
// unified hierarchy alike, and removes it once the provider is gone.
//
// The layout is read from /proc/self/cgroup and /proc/self/mountinfo: for
// each controller it needs (memory, cpu, pids) it finds the hierarchy that
// holds it, v1 or v2; a machine may mix them (a hybrid layout keeps the
// controllers on v1 and an empty v2 mount). Nothing is ever created at a
// hierarchy's root on the launcher's behalf: a Tree is a directory below
// this process's own cgroup (its name carries the pid, so two managers of
// one cgroup never share one), and each provider's Group is a directory
// below the Tree.
//
// Two rules of cgroup v2 shape what Attach and NewTree do on a v2 node. A
// cgroup that holds processes cannot delegate controllers to its children:
// this process moves into a leaf child of its own cgroup (LeafName) and
// makes its trees beside it. And a container with a cgroup namespace of
// its own (a pod's, on v2) that has the node's /sys/fs/cgroup bound in
// sees the mount's root outside its namespace, where its own cgroup
// cannot be found by path: Attach mounts the namespace's own view of the
// hierarchy over it.
//
// Joining happens before the provider's first instruction: the launcher
// writes itself into every hierarchy's cgroup.procs (Group.Procs) before it
// builds anything else, so that no process it or the provider forks starts
// outside. (CLONE_INTO_CGROUP, v2 only, cannot serve: the launcher is
// started before its launch is known, so that it is ready when it is.)
package cgroups

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Controllers are the controllers a Group's limits need.
var Controllers = []string{"memory", "cpu", "pids"}

// Hierarchy is one mounted cgroup hierarchy and this process's place in it.
type Hierarchy struct {
	// Version is 1 or 2.
	Version int
	// Dir is the directory of the cgroup below which Trees are made (this
	// process's own cgroup, or one a test made for the purpose).
	Dir string
	// Controllers are the needed controllers this hierarchy holds (for v2:
	// those available in Dir).
	Controllers []string
	// Own reports that Dir is this process's own cgroup (Detect). On v2 a
	// cgroup that holds processes cannot delegate controllers to its
	// children (the "no internal process" rule), so the first Tree made
	// there moves this process into a leaf child of its own (LeafName).
	Own bool
}

// LeafName is the child of this process's own v2 cgroup that the process
// moves into so that its own cgroup can delegate controllers to its trees
// (what a container's init does for the containers it nests). Detect
// reads a process found in it as being in its parent.
const LeafName = "iteron-leaf"

// Layout is where the needed controllers are. A controller no hierarchy
// holds is missing: its limit cannot be applied.
type Layout struct {
	Hierarchies []Hierarchy
	// Outside lists the mount points of cgroup hierarchies whose root lies
	// outside this process's cgroup namespace (the node's /sys/fs/cgroup
	// bound into a container that has a cgroup namespace of its own, as
	// on a cgroup v2 node): /proc/self/cgroup names this process's cgroup
	// relative to its namespace, which such a mount cannot resolve, so
	// they are not used. Attach mounts the namespace's own view of a v2
	// one over it.
	Outside []string
	// Note says why a hierarchy this process sees is not used ("" when
	// every one is).
	Note string
}

// Missing lists the needed controllers the layout lacks.
func (l *Layout) Missing() []string {
	var out []string
	for _, c := range Controllers {
		if !l.has(c) {
			out = append(out, c)
		}
	}
	return out
}

func (l *Layout) has(c string) bool {
	for _, h := range l.Hierarchies {
		if slices.Contains(h.Controllers, c) {
			return true
		}
	}
	return false
}

// Version describes the layout: "v1", "v2", "v1+v2", or "" when it holds no
// needed controller.
func (l *Layout) Version() string {
	var v1, v2 bool
	for _, h := range l.Hierarchies {
		if len(h.Controllers) == 0 {
			continue
		}
		if h.Version == 1 {
			v1 = true
		} else {
			v2 = true
		}
	}
	switch {
	case v1 && v2:
		return "v1+v2"
	case v1:
		return "v1"
	case v2:
		return "v2"
	}
	return ""
}

// Detect reads this process's cgroups and the mounted hierarchies and
// returns the hierarchies holding the needed controllers, each at this
// process's own cgroup.
func Detect() (*Layout, error) {
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	return detect(own, mi, func(dir string) ([]string, error) {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
		return strings.Fields(string(b)), err
	})
}

// Attach is Detect, except that a cgroup2 hierarchy that lies outside
// this process's cgroup namespace (Layout.Outside: the node's
// /sys/fs/cgroup bound into a container with a cgroup namespace of its
// own, as the DaemonSets do on a cgroup v2 node) is mounted again over the
// same point, from inside the namespace: that mount's root is the
// namespace's root, which /proc/self/cgroup names this process's cgroup
// relative to, and it is writable. The mount is made only in a layout
// that lacks a needed controller, and only in this process's mount
// namespace (a container's own); a process in the node's cgroup namespace
// never has an Outside mount. If the mount fails, Layout.Note says why.
func Attach() (*Layout, error) {
	l, err := Detect()
	if err != nil || len(l.Missing()) == 0 || len(l.Outside) == 0 {
		return l, err
	}
	var mounted bool
	for _, point := range l.Outside {
		if !isCgroup2(point) {
			continue
		}
		if err := mountCgroup2Over(point); err != nil {
			l.Note = fmt.Sprintf("the cgroup2 hierarchy at %s lies outside this process's cgroup namespace, and mounting it again from inside failed: %v", point, err)
			return l, nil
		}
		mounted = true
	}
	if !mounted {
		l.Note = "the cgroup hierarchies at " + strings.Join(l.Outside, ", ") + " lie outside this process's cgroup namespace (cgroup v1 in a cgroup namespace: run the manager and the survivor in the node's cgroup namespace)"
		return l, nil
	}
	return Detect()
}

// mountCgroup2Over mounts cgroup2, as this process's cgroup namespace
// sees it, over point. mount(2) refuses a file system on a point where the
// same one is mounted (EBUSY), whatever its root: the mount is made
// detached (fsopen, fsmount) and moved there (move_mount), which does not.
func mountCgroup2Over(point string) error {
	fs, err := unix.Fsopen("cgroup2", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen: %w", err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigCreate(fs); err != nil {
		return fmt.Errorf("fsconfig: %w", err)
	}
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return fmt.Errorf("fsmount: %w", err)
	}
	defer unix.Close(m)
	if err := unix.MoveMount(m, "", unix.AT_FDCWD, point, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount: %w", err)
	}
	return nil
}

// isCgroup2 reports whether the file system mounted at point is cgroup2.
func isCgroup2(point string) bool {
	var st unix.Statfs_t
	return unix.Statfs(point, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// detect is Detect over the contents of /proc/self/cgroup and
// /proc/self/mountinfo; v2Controllers reads the controllers available in a
// v2 cgroup.
func detect(procCgroup, mountinfo []byte, v2Controllers func(dir string) ([]string, error)) (*Layout, error) {
	// /proc/self/cgroup: "<id>:<controllers>:<path>", id 0 and empty
	// controllers for v2.
	ownV1 := map[string]string{} // controller → path
	ownV2, hasV2 := "", false
	for line := range strings.Lines(string(procCgroup)) {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			ownV2, hasV2 = parts[2], true
			if filepath.Base(ownV2) == LeafName {
				// This process moved into the leaf of its own cgroup
				// (NewTree): its trees are made beside the leaf.
				ownV2 = filepath.Dir(ownV2)
			}
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			ownV1[c] = parts[2]
		}
	}
	// A mount point may be mounted over (a pod with the node's cgroups
	// bound over the runtime's read-only ones): the last mount of a point
	// is the one in sight.
	type mount struct{ root, fstype, opts string }
	var points []string
	mounts := map[string]mount{}
	sc := bufio.NewScanner(bytes.NewReader(mountinfo))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// "<id> <parent> <maj:min> <root> <mount point> <options> [optional…] - <fstype> <source> <super options>"
		left, right, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		lf, rf := strings.Fields(left), strings.Fields(right)
		if len(lf) < 5 || len(rf) < 3 {
			continue
		}
		point := unescape(lf[4])
		if _, ok := mounts[point]; !ok {
			points = append(points, point)
		}
		mounts[point] = mount{root: unescape(lf[3]), fstype: rf[0], opts: rf[2]}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	l := &Layout{}
	for _, point := range points {
		m := mounts[point]
		switch m.fstype {
		case "cgroup":
			var held []string
			path := ""
			for _, opt := range strings.Split(m.opts, ",") {
				if slices.Contains(Controllers, opt) {
					held = append(held, opt)
					path = ownV1[opt]
				}
			}
			if len(held) == 0 || l.has(held[0]) {
				// (a hierarchy mounted twice is taken once)
				continue
			}
			if outside(m.root) {
				l.Outside = append(l.Outside, point)
				continue
			}
			dir, ok := below(point, m.root, path)
			if !ok {
				continue
			}
			l.Hierarchies = append(l.Hierarchies, Hierarchy{Version: 1, Dir: dir, Controllers: held, Own: true})
		case "cgroup2":
			if !hasV2 || slices.ContainsFunc(l.Hierarchies, func(h Hierarchy) bool { return h.Version == 2 }) {
				// (there is one v2 hierarchy, taken once)
				continue
			}
			if outside(m.root) {
				l.Outside = append(l.Outside, point)
				continue
			}
			dir, ok := below(point, m.root, ownV2)
			if !ok {
				continue
			}
			avail, err := v2Controllers(dir)
			if err != nil {
				continue
			}
			var held []string
			for _, c := range Controllers {
				// A controller bound to a v1 hierarchy is never available
				// on v2 as well.
				if slices.Contains(avail, c) && ownV1[c] == "" {
					held = append(held, c)
				}
			}
			if len(held) > 0 {
				l.Hierarchies = append(l.Hierarchies, Hierarchy{Version: 2, Dir: dir, Controllers: held, Own: true})
			}
		}
	}
	return l, nil
}

// outside reports a mount root that lies outside this process's cgroup
// namespace: the kernel shows it relative to the namespace's root, as
// "/.." segments. Joining it to the mount point would name the root of the
// node's hierarchy, never this process's cgroup.
func outside(root string) bool {
	return root == "/.." || strings.HasPrefix(root, "/../")
}

// below maps a cgroup path to its directory under a mount of the
// hierarchy whose root is root (a mount inside a cgroup namespace, or a
// bind of a subtree, shows only part of the hierarchy).
func below(point, root, path string) (string, bool) {
	if path == "" {
		return "", false
	}
	rel, err := filepath.Rel(root, path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", false
	}
	return filepath.Join(point, rel), true
}

// unescape undoes mountinfo's octal escapes (\040 for a space, …).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Limits bound one group. A zero field is not bounded.
type Limits struct {
	// MemoryBytes bounds memory (anonymous, page cache, tmpfs pages the
	// group wrote, kernel memory); no swap.
	MemoryBytes int64
	// CPUMillis bounds CPU time in thousandths of a CPU (1000 = one CPU):
	// per 100 ms period while the provider starts, per 10 ms once the
	// group is settled (Group.Settle).
	CPUMillis int64
	// Tasks bounds processes and threads together.
	Tasks int64
}

// cpuPeriodUs is the CFS period: 10 ms rather than the kernel's 100 ms, so
// that a provider spinning on every CPU it can is throttled after a few
// milliseconds of each period instead of taking the node's CPUs for tens
// of milliseconds at a time (what its neighbours' latency would show).
const cpuPeriodUs = 10000

// cpuStartPeriodUs is the CFS period while a provider starts: the same
// share, over the kernel's default period. A runtime's start is a burst on
// every thread it has (a Go provider's takes several milliseconds of CPU
// on each of two): cut into 10 ms periods it is throttled for most of each,
// and a launch with the default half CPU took about twice as long as one
// without bounds (BenchmarkSandboxedLaunch in internal/procexec). The
// launch settles the group to cpuPeriodUs after one start period.
const cpuStartPeriodUs = 100000

// StartPeriod is how long a launch keeps the start period before it
// settles its group: one period.
const StartPeriod = cpuStartPeriodUs * time.Microsecond

// Tree is this process's subtree in every hierarchy of a layout.
type Tree struct {
	layout *Layout
	name   string
	dirs   []string // one per hierarchy
}

// NewTree makes the subtree name (conventionally "iteron-sandbox-<pid>")
// below the layout's cgroup in every hierarchy, enabling the needed v2
// controllers for its children.
func (l *Layout) NewTree(name string) (*Tree, error) {
	if name == "" || strings.Contains(name, "/") || name == "." || name == ".." {
		return nil, fmt.Errorf("cgroups: tree name %q", name)
	}
	t := &Tree{layout: l, name: name}
	for _, h := range l.Hierarchies {
		dir := filepath.Join(h.Dir, name)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			t.Remove()
			return nil, fmt.Errorf("cgroups: creating %s: %w", dir, err)
		}
		t.dirs = append(t.dirs, dir)
		if h.Version == 2 {
			if err := enableV2(h, dir); err != nil {
				t.Remove()
				return nil, err
			}
		}
	}
	return t, nil
}

// enableV2 makes the controllers available to the tree's children: enabled
// in the parent's subtree_control (the tree sees them) and in the tree's
// own (its children do). A parent that is this process's own cgroup and
// holds processes cannot delegate them (v2's "no internal process" rule:
// EBUSY): this process then moves into a leaf child of it (LeafName) and
// tries again, as runc and systemd expect of a process that nests
// cgroups below its own.
func enableV2(h Hierarchy, tree string) error {
	var b strings.Builder
	for _, c := range h.Controllers {
		b.WriteString("+" + c + " ")
	}
	for _, dir := range []string{h.Dir, tree} {
		f := filepath.Join(dir, "cgroup.subtree_control")
		have, _ := os.ReadFile(f)
		if allEnabled(string(have), h.Controllers) {
			continue
		}
		err := os.WriteFile(f, []byte(strings.TrimSpace(b.String())), 0)
		if err != nil && dir == h.Dir && h.Own && errors.Is(err, unix.EBUSY) {
			if err := leaveForLeaf(h.Dir); err != nil {
				return err
			}
			// The kernel may refuse for a moment after the move (crun
			// retries too).
			for deadline := time.Now().Add(time.Second); ; time.Sleep(10 * time.Millisecond) {
				err = os.WriteFile(f, []byte(strings.TrimSpace(b.String())), 0)
				if err == nil || !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
					break
				}
			}
		}
		if err != nil {
			if dir == h.Dir && errors.Is(err, unix.EBUSY) {
				procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
				which := "processes"
				if h.Own {
					which = "processes other than this one"
				}
				return fmt.Errorf("cgroups: cannot enable %s in %s: it holds %s (%s), and cgroup v2 lets only a cgroup without processes delegate controllers", strings.Join(h.Controllers, ", "), dir, which, strings.Join(strings.Fields(string(procs)), ", "))
			}
			return fmt.Errorf("cgroups: enabling %s in %s: %w", strings.Join(h.Controllers, ", "), f, err)
		}
	}
	return nil
}

// leaveForLeaf moves this process (every thread of it: v2 places a
// process whole) from its own cgroup dir into dir's leaf child.
func leaveForLeaf(dir string) error {
	leaf := filepath.Join(dir, LeafName)
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("cgroups: creating %s to move this process out of %s: %w", leaf, dir, err)
	}
	if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte("0"), 0); err != nil {
		return fmt.Errorf("cgroups: moving this process into %s: %w", leaf, err)
	}
	return nil
}

func allEnabled(have string, want []string) bool {
	f := strings.Fields(have)
	for _, c := range want {
		if !slices.Contains(f, c) {
			return false
		}
	}
	return true
}

// Dirs are the tree's directories, one per hierarchy.
func (t *Tree) Dirs() []string { return slices.Clone(t.dirs) }

// Remove removes the tree's empty groups and the tree itself (best effort:
// a group still holding processes stays).
func (t *Tree) Remove() error {
	var errs []error
	for _, dir := range t.dirs {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if e.IsDir() {
				g := filepath.Join(dir, e.Name())
				if err := rmdir(filepath.Join(g, providerLeaf)); err != nil {
					errs = append(errs, err)
				}
				if err := rmdir(g); err != nil {
					errs = append(errs, err)
				}
			}
		}
		if err := rmdir(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Group is one provider's cgroup in every hierarchy of its tree. The
// launcher and the provider share its memory and CPU bounds, and its task
// bound is LauncherTasks above the one asked: the launcher's share. On v1
// the provider is in a child of its own, "provider", whose task bound is
// the one asked (v1 places threads one by one, so the launcher's thread
// that forks the provider moves there first): a provider that exhausts its
// tasks (a fork bomb) never leaves the launcher, its namespace's init,
// without one. v2 cannot place one thread apart from its process, and
// cloning the provider into a cgroup of its own (clone3) is a call the
// provider's seccomp profile refuses; there the provider and the launcher
// share the group's bound.
type Group struct {
	tree   *Tree
	name   string
	dirs   []string
	limits Limits
}

// LauncherTasks is the launcher's share of a group's task bound.
const LauncherTasks = 32

// providerLeaf is the provider's child of a group (v1).
const providerLeaf = "provider"

// NewGroup makes the group name below the tree and writes its limits. On
// any error nothing of it is left.
func (t *Tree) NewGroup(name string, lim Limits) (*Group, error) {
	if name == "" || strings.Contains(name, "/") || name == "." || name == ".." {
		return nil, fmt.Errorf("cgroups: group name %q", name)
	}
	g := &Group{tree: t, name: name, limits: lim}
	fail := func(err error) (*Group, error) {
		g.Remove()
		return nil, err
	}
	for i, h := range t.layout.Hierarchies {
		dir := filepath.Join(t.dirs[i], name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			return fail(fmt.Errorf("cgroups: creating %s: %w", dir, err))
		}
		g.dirs = append(g.dirs, dir)
		if h.Version == 1 && slices.Contains(h.Controllers, "pids") {
			ld := filepath.Join(dir, providerLeaf)
			if err := os.Mkdir(ld, 0o755); err != nil {
				return fail(fmt.Errorf("cgroups: creating %s: %w", ld, err))
			}
		}
	}
	if err := g.SetLimits(lim); err != nil {
		return fail(err)
	}
	return g, nil
}

// cpuFilesV1 set the CPU bound over periodUs in a v1 hierarchy. The kernel
// checks each write against the parent's bound, so they are written in the
// order that never raises the share in between: the period first when it
// grows (a new group's is the kernel's 100 ms already), the quota first
// when it shrinks (Settle).
func cpuFilesV1(lim Limits, periodUs int) []limitFile {
	period := limitFile{"cpu.cfs_period_us", strconv.Itoa(periodUs), false}
	quota := limitFile{"cpu.cfs_quota_us", strconv.FormatInt(lim.CPUMillis*int64(periodUs)/1000, 10), false}
	if periodUs < cpuStartPeriodUs {
		return []limitFile{quota, period}
	}
	return []limitFile{period, quota}
}

// cpuFileV2 sets the CPU bound over periodUs in the v2 hierarchy.
func cpuFileV2(lim Limits, periodUs int) limitFile {
	return limitFile{"cpu.max", strconv.FormatInt(lim.CPUMillis*int64(periodUs)/1000, 10) + " " + strconv.Itoa(periodUs), false}
}

type limitFile struct {
	file, value string
	optional    bool // absent on some kernels (swap accounting off)
}

// limitFiles are the files and values that set lim in hierarchy h, the CPU
// bound over a CFS period of periodUs.
func limitFiles(h Hierarchy, lim Limits, periodUs int) []limitFile {
	var out []limitFile
	has := func(c string) bool { return slices.Contains(h.Controllers, c) }
	if h.Version == 1 {
		if has("memory") && lim.MemoryBytes > 0 {
			v := strconv.FormatInt(lim.MemoryBytes, 10)
			out = append(out, limitFile{"memory.limit_in_bytes", v, false}, limitFile{"memory.memsw.limit_in_bytes", v, true}, limitFile{"memory.swappiness", "0", true})
		}
		if has("cpu") && lim.CPUMillis > 0 {
			out = append(out, cpuFilesV1(lim, periodUs)...)
		}
		if has("pids") && lim.Tasks > 0 {
			out = append(out, limitFile{"pids.max", strconv.FormatInt(lim.Tasks, 10), false})
		}
		return out
	}
	if has("memory") && lim.MemoryBytes > 0 {
		out = append(out, limitFile{"memory.max", strconv.FormatInt(lim.MemoryBytes, 10), false}, limitFile{"memory.swap.max", "0", true})
	}
	if has("cpu") && lim.CPUMillis > 0 {
		out = append(out, cpuFileV2(lim, periodUs))
	}
	if has("pids") && lim.Tasks > 0 {
		out = append(out, limitFile{"pids.max", strconv.FormatInt(lim.Tasks, 10), false})
	}
	return out
}

// writeLimit writes one limit file (a test writes into a directory that
// only looks like a cgroup).
var writeLimit = writeIfPresent

func writeIfPresent(dir, file, value string, optional bool) error {
	p := filepath.Join(dir, file)
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		if optional && errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("cgroups: %s: %w", p, err)
	}
	defer f.Close()
	if _, err := f.WriteString(value); err != nil {
		if optional {
			return nil
		}
		return fmt.Errorf("cgroups: writing %q to %s: %w", value, p, err)
	}
	return nil
}

// SetLimits writes the group's bounds (a group may be made before its
// bounds are known: a launcher joins it while it waits for its launch).
// The group's task bound is LauncherTasks above lim's; the provider's
// child (v1) has lim's.
func (g *Group) SetLimits(lim Limits) error {
	g.limits = lim
	for i, h := range g.tree.layout.Hierarchies {
		groupLim := lim
		if groupLim.Tasks > 0 {
			groupLim.Tasks += LauncherTasks
		}
		for _, w := range limitFiles(h, groupLim, cpuStartPeriodUs) {
			if err := writeLimit(g.dirs[i], w.file, w.value, w.optional); err != nil {
				return err
			}
		}
		if h.Version == 1 && lim.Tasks > 0 && slices.Contains(h.Controllers, "pids") {
			if err := writeLimit(filepath.Join(g.dirs[i], providerLeaf), "pids.max", strconv.FormatInt(lim.Tasks, 10), false); err != nil {
				return err
			}
		}
	}
	return nil
}

// Settle moves the CPU bound written by SetLimits from its start period to
// the steady one (the same share, throttled after a few milliseconds of
// each 10 ms instead of tens of each 100 ms: what a spinning provider's
// neighbours feel). It writes nothing without a CPU bound.
func (g *Group) Settle() error {
	if g.limits.CPUMillis <= 0 {
		return nil
	}
	for i, h := range g.tree.layout.Hierarchies {
		if !slices.Contains(h.Controllers, "cpu") {
			continue
		}
		files := []limitFile{cpuFileV2(g.limits, cpuPeriodUs)}
		if h.Version == 1 {
			files = cpuFilesV1(g.limits, cpuPeriodUs)
		}
		for _, w := range files {
			if err := writeLimit(g.dirs[i], w.file, w.value, w.optional); err != nil {
				return err
			}
		}
	}
	return nil
}

// Name is the group's directory name.
func (g *Group) Name() string { return g.name }

// Limits are the limits last written.
func (g *Group) Limits() Limits { return g.limits }

// Procs are the cgroup.procs files of the group, one per hierarchy, which
// the launcher writes itself into before anything else.
func (g *Group) Procs() []string {
	var out []string
	for _, dir := range g.dirs {
		out = append(out, filepath.Join(dir, "cgroup.procs"))
	}
	return out
}

// ProviderTasks are the tasks files of the provider's child in the v1
// hierarchies that have one: the launcher moves the one thread that forks
// the provider there (v1 places threads one by one), so the provider
// starts in it.
func (g *Group) ProviderTasks() []string {
	var out []string
	for i, h := range g.tree.layout.Hierarchies {
		if h.Version == 1 && slices.Contains(h.Controllers, "pids") {
			out = append(out, filepath.Join(g.dirs[i], providerLeaf, "tasks"))
		}
	}
	return out
}

// Dir is the group in the v2 hierarchy ("" without one).
func (g *Group) Dir() string {
	for i, h := range g.tree.layout.Hierarchies {
		if h.Version == 2 {
			return g.dirs[i]
		}
	}
	return ""
}

// Dirs are the group's directories, one per hierarchy.
func (g *Group) Dirs() []string { return slices.Clone(g.dirs) }

// OOMKills is how many processes of the group the kernel killed for
// exceeding its memory bound (v1 memory.oom_control, v2 memory.events).
func (g *Group) OOMKills() int64 {
	var n int64
	for i, h := range g.tree.layout.Hierarchies {
		if !slices.Contains(h.Controllers, "memory") {
			continue
		}
		file := "memory.oom_control"
		if h.Version == 2 {
			file = "memory.events"
		}
		n += keyedValue(filepath.Join(g.dirs[i], file), "oom_kill")
	}
	return n
}

// Throttled is how many CFS periods the group was throttled in.
func (g *Group) Throttled() int64 {
	var n int64
	for i, h := range g.tree.layout.Hierarchies {
		if slices.Contains(h.Controllers, "cpu") {
			n += keyedValue(filepath.Join(g.dirs[i], "cpu.stat"), "nr_throttled")
		}
	}
	return n
}

// TasksRefused is how many forks the pids bound refused (pids.events max).
func (g *Group) TasksRefused() int64 {
	var n int64
	for i, h := range g.tree.layout.Hierarchies {
		if slices.Contains(h.Controllers, "pids") {
			n += keyedValue(filepath.Join(g.dirs[i], "pids.events"), "max")
			if h.Version == 1 {
				n += keyedValue(filepath.Join(g.dirs[i], providerLeaf, "pids.events"), "max")
			}
		}
	}
	return n
}

// Populated reports whether any process is left in the group.
func (g *Group) Populated() bool {
	for _, dir := range g.dirs {
		for _, d := range []string{dir, filepath.Join(dir, providerLeaf)} {
			b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			if err == nil && len(bytes.TrimSpace(b)) > 0 {
				return true
			}
		}
	}
	return false
}

// keyedValue reads "<key> <n>" from a flat-keyed cgroup file (0 when absent).
func keyedValue(file, key string) int64 {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == key {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}

// Remove removes the group's directories. It is called once every process
// of the group is gone; a memory cgroup whose last task just exited may
// refuse for a moment (EBUSY), so it retries briefly.
func (g *Group) Remove() error {
	var errs []error
	for _, dir := range g.dirs {
		if err := rmdir(filepath.Join(dir, providerLeaf)); err != nil {
			errs = append(errs, err)
		}
		if err := rmdir(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func rmdir(dir string) error {
	deadline := time.Now().Add(2 * time.Second)
	for {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("cgroups: removing %s: %w", dir, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// SweepTrees removes the trees named prefix+<pid> (or prefix+<pid>.<n>) that a process no longer
// alive left behind (a manager that was killed): every process still in
// them is killed first — only the launcher puts processes there — and the
// directories removed. It returns the trees removed.
func (l *Layout) SweepTrees(prefix string, alive func(pid int) bool) ([]string, error) {
	var removed []string
	var errs []error
	for _, h := range l.Hierarchies {
		entries, err := os.ReadDir(h.Dir)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range entries {
			// <prefix><pid>, or <prefix><pid>.<n> for a process's n-th tree.
			num, _, _ := strings.Cut(strings.TrimPrefix(e.Name(), prefix), ".")
			pid, err := strconv.Atoi(num)
			if !e.IsDir() || !strings.HasPrefix(e.Name(), prefix) || err != nil || pid <= 0 || alive(pid) {
				continue
			}
			tree := filepath.Join(h.Dir, e.Name())
			if err := killAll(tree); err != nil {
				errs = append(errs, err)
				continue
			}
			t := &Tree{layout: l, dirs: []string{tree}}
			if err := t.Remove(); err != nil {
				errs = append(errs, err)
				continue
			}
			removed = append(removed, tree)
		}
	}
	return removed, errors.Join(errs...)
}

// killAll kills every process in the groups of a tree and waits (briefly)
// for them to leave.
func killAll(tree string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := 0
		filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
					unix.Kill(pid, unix.SIGKILL)
					left++
				}
			}
			return nil
		})
		if left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroups: %d processes left in %s after SIGKILL", left, tree)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Below makes a cgroup of this process's own (the tree name, the group
// sub) with bounds lim and returns the layout rooted there: the trees made
// on it are bounded by lim whatever their own bounds say. Tests put the
// sandbox under one, so that a bug in the bounds under test cannot take the
// machine down. remove removes it once it is empty.
func (l *Layout) Below(tree, sub string, lim Limits) (below *Layout, remove func() error, err error) {
	t, err := l.NewTree(tree)
	if err != nil {
		return nil, nil, err
	}
	g, err := t.NewGroup(sub, lim)
	if err != nil {
		t.Remove()
		return nil, nil, err
	}
	below = &Layout{}
	for i, h := range l.Hierarchies {
		below.Hierarchies = append(below.Hierarchies, Hierarchy{Version: h.Version, Dir: g.dirs[i], Controllers: h.Controllers})
	}
	return below, func() error {
		err := g.Remove()
		for _, dir := range t.dirs {
			unix.Rmdir(dir) // another Below of this tree may still hold a group
		}
		return err
	}, nil
}
