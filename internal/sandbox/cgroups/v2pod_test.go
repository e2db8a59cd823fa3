package cgroups

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The pod test runs this test binary again as a process laid out as the
// manager is in a pod on a cgroup v2 node: in a cgroup of its own (the
// container's), with a cgroup namespace rooted there, in a mount namespace
// of its own where the node's cgroup2 hierarchy is mounted as the node
// mounts it (the DaemonSets bind the node's /sys/fs/cgroup: its root lies
// outside the namespace). This machine's controllers are on v1 but for
// hugetlb, which is on its v2 hierarchy; hugetlb is a domain controller,
// so v2's rules for delegating it (no internal process) are those for
// memory, and the child asks for it in place of memory, cpu and pids. The
// limits' own files are checked by TestLimitsAreWrittenInEachVersionsOwnFiles.
const podChildEnv = "ITERON_CGROUPS_POD_CHILD"

// podExpectEnv tells the child that its NewTree is to fail, and to report
// why.
const podExpectEnv = "ITERON_CGROUPS_POD_REFUSED"

// podReport is what the child found.
type podReport struct {
	// First is the layout Detect saw, Attached the one Attach returned.
	First, Attached *Layout
	// Trees are the directories of the two trees the child made (a second
	// Sandbox in the same process makes a second tree).
	Trees [][]string
	// Cgroup is the child's /proc/self/cgroup after the trees were made.
	Cgroup string
}

func TestOnAV2NodeInAPodTheTreesAreMadeBelowTheContainersOwnCgroup(t *testing.T) {
	mnt := hugetlbOnV2(t)
	container, child := podV2Cgroup(t, mnt, "iteron-test-pod-")
	rep, out, err := child(nil)
	if err != nil {
		t.Fatalf("the child: %v\n%s", err, out)
	}
	t.Logf("the child saw %+v, attached %+v, made %v, ended in %q", *rep.First, *rep.Attached, rep.Trees, rep.Cgroup)
	// Before Attach: the node's hierarchy, seen from inside the
	// namespace, is not taken for the container's cgroup.
	if len(rep.First.Hierarchies) != 0 || len(rep.First.Outside) == 0 {
		t.Errorf("Detect in the pod: %+v; want no hierarchy (the node's mount cannot resolve the container's cgroup) and the mount listed as outside", *rep.First)
	}
	// After: the namespace's own view, at the container's cgroup.
	if h := rep.Attached.Hierarchies; len(h) != 1 || h[0].Version != 2 || !h[0].Own || len(h[0].Controllers) != 1 || h[0].Controllers[0] != "hugetlb" {
		t.Errorf("Attach in the pod: %+v; want the v2 hierarchy holding hugetlb at the container's own cgroup", *rep.Attached)
	}
	// The child moved into the leaf, so the container's cgroup delegates
	// hugetlb; the trees are the container's children, the node's root
	// holds none.
	if rep.Cgroup != "0::/"+LeafName {
		t.Errorf("the child ended in %q; want 0::/%s (its namespace's root is the container's cgroup)", rep.Cgroup, LeafName)
	}
	if b, _ := os.ReadFile(filepath.Join(container, "cgroup.subtree_control")); strings.TrimSpace(string(b)) != "hugetlb" {
		t.Errorf("the container's cgroup delegates %q; want hugetlb", b)
	}
	if b, _ := os.ReadFile(filepath.Join(container, LeafName, "cgroup.procs")); len(b) != 0 {
		t.Errorf("the leaf still holds %q after the child exited", b)
	}
	for i, name := range []string{"iteron-sandbox-a", "iteron-sandbox-b"} {
		tree := filepath.Join(container, name)
		if b, err := os.ReadFile(filepath.Join(tree, "cgroup.subtree_control")); err != nil || strings.TrimSpace(string(b)) != "hugetlb" {
			t.Errorf("tree %d: %s delegates %q (%v); want hugetlb", i, tree, b, err)
		}
		if _, err := os.Stat(filepath.Join(mnt, name)); !os.IsNotExist(err) {
			t.Errorf("a tree was made at the node's root: %s (%v)", filepath.Join(mnt, name), err)
		}
	}
}

func TestAContainersCgroupHoldingAnotherProcessCannotDelegateAndSaysWhich(t *testing.T) {
	mnt := hugetlbOnV2(t)
	container, child := podV2Cgroup(t, mnt, "iteron-test-pod-busy-")
	// Another process of the container (an exec'd shell, say) stays in
	// its cgroup: only this process moves itself.
	cg, err := os.Open(container)
	if err != nil {
		t.Fatal(err)
	}
	other := exec.Command("/bin/sleep", "60")
	other.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd()), Pdeathsig: syscall.SIGKILL}
	err = other.Start()
	cg.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Process.Kill(); other.Wait() })
	_, out, err := child([]string{podExpectEnv + "=1"})
	if err != nil {
		t.Fatalf("the child: %v\n%s", err, out)
	}
	msg, _, _ := strings.Cut(string(out[strings.Index(string(out), "POD-REFUSED ")+len("POD-REFUSED "):]), "\n")
	if !strings.Contains(msg, "holds processes other than this one ("+strconv.Itoa(other.Process.Pid)) {
		t.Errorf("the child's NewTree failed with %q; want it to name the other process %d", msg, other.Process.Pid)
	}
	t.Logf("refused: %s", msg)
	entries, _ := os.ReadDir(container)
	for _, e := range entries {
		if e.IsDir() && e.Name() != LeafName {
			t.Errorf("left in the container's cgroup: %s", e.Name())
		}
	}
}

// hugetlbOnV2 mounts the v2 hierarchy for the test and makes hugetlb
// reach its first level: enabled at the root for the test (one test at a
// time on the machine: the lock), and disabled again if the test enabled
// it. It skips where the v2 hierarchy holds no hugetlb.
func hugetlbOnV2(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare(1)")
	}
	mnt := t.TempDir()
	if err := unix.Mount("none", mnt, "cgroup2", 0, ""); err != nil {
		t.Skipf("this kernel does not let the test mount cgroup2: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	ctrl, err := os.ReadFile(filepath.Join(mnt, "cgroup.controllers"))
	if err != nil || !strings.Contains(string(ctrl), "hugetlb") {
		t.Skipf("the v2 hierarchy holds no hugetlb controller here (%q)", ctrl)
	}
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "iteron-cgroup2-hugetlb.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Close() })
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	rootCtl := filepath.Join(mnt, "cgroup.subtree_control")
	if have, _ := os.ReadFile(rootCtl); !strings.Contains(string(have), "hugetlb") {
		if err := os.WriteFile(rootCtl, []byte("+hugetlb"), 0); err != nil {
			t.Skipf("cannot enable hugetlb at the v2 root: %v", err)
		}
		t.Cleanup(func() {
			if err := os.WriteFile(rootCtl, []byte("-hugetlb"), 0); err != nil && !errors.Is(err, unix.EBUSY) {
				t.Errorf("disabling hugetlb at the v2 root again: %v", err)
			}
		})
	}
	return mnt
}

// podV2Cgroup makes the container's cgroup below mnt's root (removed with
// what is left in it after the test) and returns it and a function that
// runs the child in it: unshare(1) makes the namespaces from inside the
// container's cgroup (a cgroup namespace is rooted where its creator is)
// and execs this test binary's TestPodChild.
func podV2Cgroup(t *testing.T, mnt, prefix string) (string, func(env []string) (podReport, []byte, error)) {
	t.Helper()
	container := filepath.Join(mnt, prefix+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(container, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		entries, _ := os.ReadDir(container)
		for _, e := range entries {
			if e.IsDir() {
				if err := rmdir(filepath.Join(container, e.Name())); err != nil {
					t.Error(err)
				}
			}
		}
		if err := rmdir(container); err != nil {
			t.Error(err)
		}
	})
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return container, func(env []string) (podReport, []byte, error) {
		var rep podReport
		cg, err := os.Open(container)
		if err != nil {
			return rep, nil, err
		}
		defer cg.Close()
		cmd := exec.Command("unshare", "--cgroup", "--mount", "--propagation", "private", self, "-test.run=^TestPodChild$", "-test.count=1", "-test.v")
		cmd.Env = append([]string{podChildEnv + "=1", "PATH=/usr/bin:/bin"}, env...)
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd()), Pdeathsig: syscall.SIGKILL}
		out, err := cmd.CombinedOutput()
		if err != nil {
			return rep, out, err
		}
		i := strings.Index(string(out), "POD-REPORT ")
		if i < 0 {
			if strings.Contains(string(out), "POD-REFUSED ") {
				return rep, out, nil
			}
			return rep, out, errors.New("no report")
		}
		line, _, _ := strings.Cut(string(out[i+len("POD-REPORT "):]), "\n")
		return rep, out, json.Unmarshal([]byte(line), &rep)
	}
}

// TestPodChild is the child of the test above; it does nothing unless that
// test started it.
func TestPodChild(t *testing.T) {
	if os.Getenv(podChildEnv) == "" {
		t.Skip("run by TestOnAV2NodeInAPodTheTreesAreMadeBelowTheContainersOwnCgroup")
	}
	Controllers = []string{"hugetlb"}
	var rep podReport
	var err error
	if rep.First, err = Detect(); err != nil {
		t.Fatal(err)
	}
	if rep.Attached, err = Attach(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"iteron-sandbox-a", "iteron-sandbox-b"} {
		// Each tree from a fresh Attach, as each Sandbox does: the second
		// finds the child in the leaf, and makes its tree beside it.
		l, err := Attach()
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Missing()) > 0 {
			t.Fatalf("Attach: %+v: missing %v", *l, l.Missing())
		}
		tree, err := l.NewTree(name)
		if os.Getenv(podExpectEnv) != "" {
			if err == nil {
				t.Fatalf("NewTree succeeded in %v", tree.Dirs())
			}
			os.Stdout.WriteString("POD-REFUSED " + err.Error() + "\n")
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		rep.Trees = append(rep.Trees, tree.Dirs())
	}
	b, _ := os.ReadFile("/proc/self/cgroup")
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, "0::") {
			rep.Cgroup = strings.TrimSpace(line)
		}
	}
	out, _ := json.Marshal(rep)
	os.Stdout.Write(append(append([]byte("POD-REPORT "), out...), '\n'))
}
