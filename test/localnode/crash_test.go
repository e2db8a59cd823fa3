package localnode

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	childEnv     = "ITERON_LOCALNODE_CRASH_CHILD"
	testSandbox  = "localhost/iteron-pause:1"
	readyMessage = "LOCALNODE-READY "
)

// TestMain runs the child of the crash test when asked: a node with one pod,
// which then waits to be killed.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(crashChild(os.Getenv(childEnv)))
	}
	os.Exit(m.Run())
}

// crashChild starts a node whose only image is the pause image, runs a pod
// of it, prints readyMessage and the record's ID, and waits to be killed.
func crashChild(pauseTar string) int {
	repo, err := repoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	n, err := Start(ctx, Config{NodeBin: filepath.Join(repo, "bin", "node"), K8sBin: filepath.Join(repo, "bin", "k8s"),
		Images: []string{pauseTar}, SandboxImage: testSandbox, Log: os.Stderr, LockWait: time.Minute})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start:", err)
		return 1
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sleeper", Namespace: "default"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "pause", Image: testSandbox, ImagePullPolicy: corev1.PullNever}}}}
	created := false
	if err := n.waitFor(ctx, "the pod to run", 3*time.Minute, func() error {
		if !created {
			// Refused until kube-controller-manager made the namespace's
			// default service account.
			if _, err := n.Clientset.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				return err
			}
			created = true
		}
		p, err := n.Clientset.CoreV1().Pods("default").Get(ctx, "sleeper", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("pod %s", p.Status.Phase)
		}
		return nil
	}, "kubelet", "containerd"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(readyMessage + n.ID)
	select {} // killed by the test
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(data), "module iteron.dev/operator\n") {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("no repository root above the working directory")
		}
		dir = filepath.Dir(dir)
	}
}

// A node whose process is SIGKILLed (as a test binary killed by its timeout
// is) leaves its namespace, cgroups, mounts, record, changed sysctls and its
// pod's shim and container behind; the next run's cleanup removes all of it.
func TestASecondRunCleansUpWhatACrashedFirstLeft(t *testing.T) {
	if err := Available(); err != nil {
		if os.Getenv("ITERON_REQUIRE_NODE") == "1" {
			t.Fatalf("the local node cannot run here, and ITERON_REQUIRE_NODE=1 (.ci/run) requires it: %v", err)
		}
		t.Skipf("SKIP: the local node cannot run here: %v", err)
	}
	repo, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(repo, "bin", "node", "kubelet")); err != nil {
		t.Fatalf("bin/node is missing: run `make node` (make test does): %v", err)
	}
	work := t.TempDir()
	pauseTar := filepath.Join(work, "pause.tar")
	build := exec.Command("go", "run", "./hack/image", "-offline", "-out", "", "-pause-out", pauseTar, "-pause-tag", testSandbox)
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("hack/image: %v\n%s", err, out)
	}
	// Sysctls are the host's: read them while no other local node runs
	// (another checkout's tests may run one), so before and after compare
	// this node's doing alone.
	before, err := ReadSysctlsAlone(testWriter{t}, 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	// The first run: a node with a pod, killed with SIGKILL.
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), childEnv+"="+pauseTar)
	var stderr bytes.Buffer
	child.Stderr = &stderr
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	ids := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if id, ok := strings.CutPrefix(sc.Text(), readyMessage); ok {
				ids <- id
			}
		}
		close(ids)
	}()
	var id string
	select {
	case id = <-ids:
	case <-time.After(8 * time.Minute):
	}
	if id == "" {
		_ = child.Process.Kill()
		_ = child.Wait()
		_ = Cleanup(testWriter{t})
		t.Fatalf("the first run never had its pod running:\n%s", stderr.String())
	}
	var r record
	data, err := os.ReadFile(filepath.Join(RecordDir, id+".json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = teardown(testWriter{t}, &r) }) // in case the test fails midway
	during := ReadSysctls()
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	// Its daemons die with it (Pdeathsig); the pod's shim and container,
	// re-parented away, do not.
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		alive := 0
		for _, p := range r.Procs {
			if sameProcess(p) {
				alive++
			}
		}
		if alive == 0 {
			break
		}
	}

	// What the crash left: the record, the namespace, the cgroups with the
	// pod's shim and container still running, mounts below the root.
	leftPids, _ := cgroupPids(filepath.Join(cgroupV1Root, "pids", r.Cgroup))
	mounts, _ := mountsBelow(r.Root)
	_, nsErr := os.Stat(filepath.Join("/run/netns", r.NetNS))
	t.Logf("the first run (node %s) was killed; it left: record %s, namespace %s (present: %v), %d processes in its cgroup (the pod's shim and containers, which outlived the node's daemons), %d mounts below %s",
		id, r.path(), r.NetNS, nsErr == nil, len(leftPids), len(mounts), r.Root)
	var changed []string
	for k, v := range during {
		if before[k] != v {
			changed = append(changed, fmt.Sprintf("%s %s→%s", k, before[k], v))
		}
	}
	t.Logf("sysctls the first run changed (kubelet, CNI): %v", changed)
	if nsErr != nil || len(leftPids) == 0 || len(mounts) == 0 {
		t.Fatalf("the crash left less than expected (namespace: %v, processes %v, mounts %v): the test proves nothing", nsErr, leftPids, mounts)
	}

	// The second run's cleanup (what Start does first, and what
	// `hack/localnode -cleanup` and .ci/run's exit trap run).
	l, err := acquireLock(testWriter{t}, 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer l.release()
	if err := cleanupStale(testWriter{t}); err != nil {
		t.Fatalf("cleanup after the crash: %v", err)
	}
	var left []string
	for _, pid := range leftPids {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			// A zombie re-parented to init has ended (init reaps it soon).
			if cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid)); strings.Contains(string(cg), r.Cgroup) && sameProcess(proc{Pid: pid, Start: mustStart(pid)}) {
				cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
				st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
				left = append(left, fmt.Sprintf("process %d (%s; %s; cgroups %s)", pid, bytes.ReplaceAll(cmd, []byte{0}, []byte{' '}), st, cg))
			}
		}
	}
	if m, _ := mountsBelow(r.Root); len(m) > 0 {
		left = append(left, fmt.Sprintf("mounts %v", m))
	}
	hs, _ := hierarchies()
	for _, h := range hs {
		if _, err := os.Stat(filepath.Join(cgroupV1Root, h, r.Cgroup)); err == nil {
			left = append(left, "cgroup "+filepath.Join(h, r.Cgroup))
		}
	}
	for _, p := range []string{filepath.Join("/run/netns", r.NetNS), r.Root, r.path(), r.sysctlPath()} {
		if _, err := os.Stat(p); err == nil {
			left = append(left, p)
		}
	}
	after := ReadSysctls()
	for k, v := range before {
		if after[k] != v {
			left = append(left, fmt.Sprintf("sysctl %s=%s (was %s)", k, after[k], v))
		}
	}
	if len(left) > 0 {
		t.Fatalf("after the cleanup, left: %v", left)
	}
	t.Logf("the cleanup removed all of it: no process, mount, cgroup, namespace, record or root left; sysctls as before")
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func mustStart(pid int) uint64 {
	st, _ := startTime(pid)
	return st
}
