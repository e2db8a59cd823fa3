package cgroups

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// hybrid is what these CI machines show: v1 hierarchies for the
// controllers, an empty cgroup2 mount at /sys/fs/cgroup/unified.
const hybridCgroup = `9:name=systemd:/
8:pids:/
4:memory:/process_api/abc
2:cpuacct:/
1:cpu:/
0::/
`

const hybridMountinfo = `30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
32 30 0:29 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
38 30 0:35 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
39 30 0:36 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`

// unified is a systemd machine on cgroup v2 only, and a pod's container
// with a cgroup namespace (its mount's root is its own cgroup).
const unifiedCgroup = "0::/system.slice/iteron.service\n"
const unifiedMountinfo = `25 1 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`
const podCgroup = "0::/\n"

// A v1 pod whose container has the node's hierarchies bound over the
// runtime's read-only ones (config/manager/survivor.yaml): the bound ones,
// mounted last, are in sight.
const podV1Cgroup = `4:memory:/kubepods/besteffort/pod1/c1
8:pids:/kubepods/besteffort/pod1/c1
1:cpu:/kubepods/besteffort/pod1/c1
`
const podV1Mountinfo = `900 800 0:50 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro
901 900 0:31 /kubepods/besteffort/pod1/c1 /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory
902 900 0:35 /kubepods/besteffort/pod1/c1 /sys/fs/cgroup/pids ro,nosuid - cgroup cgroup rw,pids
903 900 0:28 /kubepods/besteffort/pod1/c1 /sys/fs/cgroup/cpu ro,nosuid - cgroup cgroup rw,cpu
950 800 0:27 / /sys/fs/cgroup rw - tmpfs tmpfs rw
951 950 0:31 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
952 950 0:35 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
953 950 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
`
const podMountinfo = `1200 1190 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup rw
`

// A v2 pod with a cgroup namespace of its own and the node's
// /sys/fs/cgroup bound over the runtime's mount (the DaemonSets): the
// kernel shows the bound mount's root relative to the namespace's root.
const podV2BoundMountinfo = `1200 1190 0:22 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw
1300 1190 0:22 /../../../.. /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
`

// A process that moved into the leaf of its own cgroup.
const leafCgroup = "0::/system.slice/iteron.service/" + LeafName + "\n"

func TestDetectFindsEachControllersHierarchyBelowTheProcesssOwnCgroup(t *testing.T) {
	all := func(string) ([]string, error) { return []string{"cpuset", "cpu", "io", "memory", "pids"}, nil }
	none := func(string) ([]string, error) { return nil, nil }
	for _, c := range []struct {
		name           string
		cgroup, mounts string
		v2             func(string) ([]string, error)
		want           []Hierarchy
		version        string
		missing        []string
		outside        []string
	}{
		{"a hybrid machine keeps the controllers on v1 and ignores the empty v2 mount", hybridCgroup, hybridMountinfo, none, []Hierarchy{
			{1, "/sys/fs/cgroup/cpu", []string{"cpu"}, true},
			{1, "/sys/fs/cgroup/memory/process_api/abc", []string{"memory"}, true},
			{1, "/sys/fs/cgroup/pids", []string{"pids"}, true},
		}, "v1", nil, nil},
		{"a unified machine puts every controller on v2, below the service's cgroup", unifiedCgroup, unifiedMountinfo, all, []Hierarchy{
			{2, "/sys/fs/cgroup/system.slice/iteron.service", []string{"memory", "cpu", "pids"}, true},
		}, "v2", nil, nil},
		{"a pod with a cgroup namespace sees its own cgroup at the mount's root", podCgroup, podMountinfo, all, []Hierarchy{
			{2, "/sys/fs/cgroup", []string{"memory", "cpu", "pids"}, true},
		}, "v2", nil, nil},
		{"a v1 pod with the node's hierarchies bound over the runtime's finds its own cgroup in them, never their root", podV1Cgroup, podV1Mountinfo, none, []Hierarchy{
			{1, "/sys/fs/cgroup/memory/kubepods/besteffort/pod1/c1", []string{"memory"}, true},
			{1, "/sys/fs/cgroup/pids/kubepods/besteffort/pod1/c1", []string{"pids"}, true},
			{1, "/sys/fs/cgroup/cpu/kubepods/besteffort/pod1/c1", []string{"cpu"}, true},
		}, "v1", nil, nil},
		{"a v2 hierarchy without the controllers gives no bounds", unifiedCgroup, unifiedMountinfo, none, nil, "", []string{"memory", "cpu", "pids"}, nil},
		{"a process moved into its leaf makes its trees beside the leaf", leafCgroup, unifiedMountinfo, all, []Hierarchy{
			{2, "/sys/fs/cgroup/system.slice/iteron.service", []string{"memory", "cpu", "pids"}, true},
		}, "v2", nil, nil},
		{"a v2 pod with the node's hierarchy bound over the runtime's never takes the node's root for its own cgroup", podCgroup, podV2BoundMountinfo, all, nil, "", []string{"memory", "cpu", "pids"}, []string{"/sys/fs/cgroup"}},
		{"a hierarchy mounted twice is taken once", unifiedCgroup, unifiedMountinfo + "26 1 0:22 / /mnt/again rw - cgroup2 cgroup2 rw\n", all, []Hierarchy{
			{2, "/sys/fs/cgroup/system.slice/iteron.service", []string{"memory", "cpu", "pids"}, true},
		}, "v2", nil, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, err := detect([]byte(c.cgroup), []byte(c.mounts), c.v2)
			if err != nil {
				t.Fatal(err)
			}
			if len(l.Hierarchies) != len(c.want) {
				t.Fatalf("hierarchies %+v, want %+v", l.Hierarchies, c.want)
			}
			for i, h := range l.Hierarchies {
				if h.Version != c.want[i].Version || h.Dir != c.want[i].Dir || !slices.Equal(h.Controllers, c.want[i].Controllers) || h.Own != c.want[i].Own {
					t.Errorf("hierarchy %d is %+v, want %+v", i, h, c.want[i])
				}
			}
			if l.Version() != c.version || !slices.Equal(l.Missing(), c.missing) || !slices.Equal(l.Outside, c.outside) {
				t.Errorf("version %q missing %v outside %v, want %q, %v and %v", l.Version(), l.Missing(), l.Outside, c.version, c.missing, c.outside)
			}
		})
	}
}

// fakeLimits lets a test write limits into a plain directory.
func fakeLimits(t *testing.T) {
	old := writeLimit
	writeLimit = func(dir, file, value string, optional bool) error {
		return os.WriteFile(filepath.Join(dir, file), []byte(value), 0o644)
	}
	t.Cleanup(func() { writeLimit = old })
}

func TestLimitsAreWrittenInEachVersionsOwnFiles(t *testing.T) {
	// A directory laid out like a cgroup: the files a kernel would create
	// are written by the code under test and read back here. The real v1
	// files are exercised by the sandbox's tests on this machine; a real v2
	// hierarchy with controllers is not available on it (the controllers
	// are bound to v1), which is why v2's formats are checked this way.
	fakeLimits(t)
	v1, v2 := t.TempDir(), t.TempDir()
	l := &Layout{Hierarchies: []Hierarchy{
		{Version: 1, Dir: v1, Controllers: []string{"memory", "cpu", "pids"}},
		{Version: 2, Dir: v2, Controllers: []string{"memory", "cpu", "pids"}},
	}}
	tree, err := l.NewTree("iteron-sandbox-1")
	if err != nil {
		t.Fatal(err)
	}
	g, err := tree.NewGroup("prompt_system-1", Limits{MemoryBytes: 512 << 20, CPUMillis: 250, Tasks: 256})
	if err != nil {
		t.Fatal(err)
	}
	read := func(dir, file string) string {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return string(b)
	}
	for _, c := range []struct{ dir, file, want string }{
		{g.Dirs()[0], "memory.limit_in_bytes", "536870912"},
		{g.Dirs()[0], "memory.memsw.limit_in_bytes", "536870912"},
		{g.Dirs()[0], "cpu.cfs_period_us", "100000"},
		{g.Dirs()[0], "cpu.cfs_quota_us", "25000"},
		{g.Dirs()[0], "pids.max", "288"},
		{filepath.Join(g.Dirs()[0], "provider"), "pids.max", "256"},
		{g.Dirs()[1], "memory.max", "536870912"},
		{g.Dirs()[1], "memory.swap.max", "0"},
		{g.Dirs()[1], "cpu.max", "25000 100000"},
		{g.Dirs()[1], "pids.max", "288"},
		{v2, "cgroup.subtree_control", "+memory +cpu +pids"},
		{tree.Dirs()[1], "cgroup.subtree_control", "+memory +cpu +pids"},
	} {
		if got := read(c.dir, c.file); got != c.want {
			t.Errorf("%s/%s = %q, want %q", c.dir, c.file, got, c.want)
		}
	}
	if got, want := g.Procs(), []string{filepath.Join(g.Dirs()[0], "cgroup.procs"), filepath.Join(g.Dirs()[1], "cgroup.procs")}; !slices.Equal(got, want) {
		t.Errorf("Procs (the files the launcher writes itself into) = %v, want %v", got, want)
	}
	if got, want := g.ProviderTasks(), []string{filepath.Join(g.Dirs()[0], "provider", "tasks")}; !slices.Equal(got, want) {
		t.Errorf("ProviderTasks (the v1 file the thread that forks the provider moves into) = %v, want %v", got, want)
	}
	if g.Dir() != g.Dirs()[1] {
		t.Errorf("Dir (the v2 group) = %q, want %q", g.Dir(), g.Dirs()[1])
	}
	// Settled: the same share over the steady 10 ms period, the v1 quota
	// written before its period (the share never rises in between, or a
	// parent with a bound of its own refuses the write).
	var order []string
	write := writeLimit
	writeLimit = func(dir, file, value string, optional bool) error {
		order = append(order, file)
		return write(dir, file, value, optional)
	}
	if err := g.Settle(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ dir, file, want string }{
		{g.Dirs()[0], "cpu.cfs_period_us", "10000"},
		{g.Dirs()[0], "cpu.cfs_quota_us", "2500"},
		{g.Dirs()[1], "cpu.max", "2500 10000"},
		{g.Dirs()[0], "memory.limit_in_bytes", "536870912"},
	} {
		if got := read(c.dir, c.file); got != c.want {
			t.Errorf("settled: %s/%s = %q, want %q", c.dir, c.file, got, c.want)
		}
	}
	if want := []string{"cpu.cfs_quota_us", "cpu.cfs_period_us", "cpu.max"}; !slices.Equal(order, want) {
		t.Errorf("Settle wrote %v, want %v", order, want)
	}
	os.WriteFile(filepath.Join(g.Dirs()[0], "memory.oom_control"), []byte("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"), 0o644)
	os.WriteFile(filepath.Join(g.Dirs()[1], "memory.events"), []byte("low 0\nhigh 0\nmax 9\noom 1\noom_kill 1\n"), 0o644)
	if n := g.OOMKills(); n != 3 {
		t.Errorf("OOMKills = %d, want 2 (v1 oom_control) + 1 (v2 memory.events)", n)
	}
}

func TestAGroupWithAForbiddenNameIsRefused(t *testing.T) {
	l := &Layout{}
	for _, name := range []string{"", ".", "..", "a/b"} {
		if _, err := l.NewTree(name); err == nil {
			t.Errorf("NewTree(%q) succeeded", name)
		}
	}
}

// v2Mount mounts a cgroup2 hierarchy of the test's own (the kernel's one
// v2 hierarchy, at a fresh mount point) and makes a cgroup below its root
// for the test; both are removed afterwards.
func v2Mount(t *testing.T) string {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	mnt := t.TempDir()
	if err := unix.Mount("none", mnt, "cgroup2", 0, ""); err != nil {
		t.Skipf("this kernel does not let the test mount cgroup2: %v", err)
	}
	dir := filepath.Join(mnt, "iteron-test-v2-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		unix.Unmount(mnt, unix.MNT_DETACH)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Rmdir(dir); err != nil {
			t.Errorf("removing %s: %v", dir, err)
		}
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmounting %s: %v", mnt, err)
		}
	})
	return dir
}

func TestAProcessClonedIntoAV2GroupStartsInsideItAndTheGroupIsRemovedAfterIt(t *testing.T) {
	base := v2Mount(t)
	l := &Layout{Hierarchies: []Hierarchy{{Version: 2, Dir: base}}}
	tree, err := l.NewTree("iteron-sandbox-" + strconv.Itoa(os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	defer tree.Remove()
	g, err := tree.NewGroup("p-1", Limits{MemoryBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	cg, err := os.Open(g.Dir())
	if err != nil {
		t.Fatal(err)
	}
	pid, err := syscall.ForkExec("/bin/sleep", []string{"sleep", "30"}, &syscall.ProcAttr{
		Env: []string{}, Sys: &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd()), Setpgid: true},
	})
	cg.Close()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	rel := strings.TrimPrefix(g.Dir(), filepath.Dir(base))
	if !strings.Contains(string(b), "0::"+rel+"\n") {
		t.Errorf("the child's cgroups are\n%s\nwant it in 0::%s from its first instruction", b, rel)
	}
	if !g.Populated() {
		t.Errorf("the group does not list the child")
	}
	syscall.Kill(pid, syscall.SIGKILL)
	var ws syscall.WaitStatus
	syscall.Wait4(pid, &ws, 0, nil)
	deadline := time.Now().Add(5 * time.Second)
	for g.Populated() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	if err := tree.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tree.Dirs()[0]); !os.IsNotExist(err) {
		t.Errorf("the tree %s is still there: %v", tree.Dirs()[0], err)
	}
}

func TestTreesOfProcessesThatAreGoneAreSweptWithWhatTheyHeld(t *testing.T) {
	base := v2Mount(t)
	l := &Layout{Hierarchies: []Hierarchy{{Version: 2, Dir: base}}}
	// A dead manager's tree, with a process still in one of its groups.
	dead := 1 << 22 // above pid_max's default: no such process
	tree, err := l.NewTree("iteron-sandbox-" + strconv.Itoa(dead))
	if err != nil {
		t.Fatal(err)
	}
	g, err := tree.NewGroup("p-1", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cg, _ := os.Open(g.Dir())
	pid, err := syscall.ForkExec("/bin/sleep", []string{"sleep", "30"}, &syscall.ProcAttr{Env: []string{}, Sys: &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}})
	cg.Close()
	if err != nil {
		t.Fatal(err)
	}
	reaped := make(chan struct{})
	go func() {
		var ws syscall.WaitStatus
		syscall.Wait4(pid, &ws, 0, nil)
		close(reaped)
	}()
	// A live process's tree (this test's) is left alone.
	mine, err := l.NewTree("iteron-sandbox-" + strconv.Itoa(os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Remove()
	removed, err := l.SweepTrees("iteron-sandbox-", func(p int) bool { return p == os.Getpid() })
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, tree.Dirs()) {
		t.Errorf("removed %v, want %v", removed, tree.Dirs())
	}
	select {
	case <-reaped:
	case <-time.After(5 * time.Second):
		t.Errorf("the process left in the dead tree was not killed")
	}
	if _, err := os.Stat(mine.Dirs()[0]); err != nil {
		t.Errorf("the live process's tree was removed: %v", err)
	}
}
