package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/test/kubeapi"
)

var (
	env        *kubeapi.Environment
	managerBin string
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	var err error
	if env, err = kubeapi.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "start the local control plane:", err)
		return 1
	}
	defer env.Stop()
	fmt.Printf("manager tests run against kube-apiserver %s\n", env.ServerVersion)
	dir, err := os.MkdirTemp("", "iteron-manager-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	managerBin = filepath.Join(dir, "manager")
	if out, err := exec.Command("go", "build", "-o", managerBin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build the manager: %v\n%s", err, out)
		return 1
	}
	// The manager sandboxes its providers with the launcher beside it, as
	// a node's image ships them.
	repo, err := kubeapi.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := kubeapi.BuildSandboxLauncher(repo, dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// managerProcess is the real manager binary running against the test API server.
type managerProcess struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	stderr bytes.Buffer
	done   chan error
}

func (p *managerProcess) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.Write(b)
}

func (p *managerProcess) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

func startManager(t *testing.T, stateDir string, args ...string) *managerProcess {
	t.Helper()
	kubeconfig, err := env.Kubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p := &managerProcess{done: make(chan error, 1)}
	all := append([]string{"--kubeconfig=" + kubeconfig, "--state-dir=" + stateDir, "--allowed-roots=/nonexistent/providers",
		"--metrics-bind-address=0", "--health-probe-bind-address=0", "--gateway-socket=" + filepath.Join(stateDir, "gw.sock")}, args...)
	p.cmd = exec.Command(managerBin, all...)
	p.cmd.Stdout = p
	p.cmd.Stderr = p
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("manager output:\n%s", p.output())
		}
	})
	return p
}

func testActivation(name, node string) *iteronv1.ImplementationActivation {
	d := "sha256:" + strings.Repeat("a", 64)
	return &iteronv1.ImplementationActivation{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: iteronv1.ImplementationActivationSpec{
			NodeName: node, CandidateSHA256: d,
			Sources: []iteronv1.ActivationSource{{Module: "prompt_system", ImplementationID: "counter-v1",
				CatalogPath: "/nonexistent/providers/catalog.json", ArtifactRoot: "/nonexistent/providers/v1", ManifestSHA256: d, ArtifactSHA256: d}},
		},
	}
}

func TestManagerMarksOnlyItsNodesActivations(t *testing.T) {
	ctx := context.Background()
	mine := testActivation("on-node-a", "node-a")
	theirs := testActivation("on-node-b", "node-b")
	for _, a := range []*iteronv1.ImplementationActivation{mine, theirs} {
		if err := env.Client.Create(ctx, a); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(ctx, a) })
	}
	startManager(t, t.TempDir(), "--node-name=node-a")

	var got iteronv1.ImplementationActivation
	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(mine), &got); err != nil {
			t.Fatal(err)
		}
		// Its catalog does not exist on this node: verification refuses it,
		// naming the field, and the activation is Stalled (nothing moves
		// without a change).
		// Read once the status says it is at rest for this spec
		// (observedGeneration): a reconcile while the coordinator is busy
		// writes the conditions it knows and leaves observedGeneration to
		// the next (CI read Verified with observedGeneration 0).
		if c := meta.FindStatusCondition(got.Status.Conditions, iteronv1.ConditionVerified); c != nil && got.Status.ObservedGeneration == got.Generation {
			if c.Status != metav1.ConditionFalse || c.Reason != iteronv1.ReasonVerificationFailed || !strings.Contains(c.Message, "spec.sources[0].catalogPath") {
				t.Fatalf("Verified = %s/%s %q; want False/VerificationFailed naming spec.sources[0].catalogPath", c.Status, c.Reason, c.Message)
			}
			if s := meta.FindStatusCondition(got.Status.Conditions, iteronv1.ConditionStalled); s == nil || s.Status != metav1.ConditionTrue {
				t.Fatalf("Stalled = %+v; want True", s)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the manager never set Verified at rest on its node's activation (generation %d); status: %+v", got.Generation, got.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// The other node's activation was never in this manager's cache: give
	// it the time a reconcile took above, then check it is untouched.
	time.Sleep(2 * time.Second)
	var other iteronv1.ImplementationActivation
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(theirs), &other); err != nil {
		t.Fatal(err)
	}
	if len(other.Status.Conditions) != 0 || other.Status.ObservedGeneration != 0 {
		t.Fatalf("the manager of node-a touched node-b's activation: %+v", other.Status)
	}
}

func TestSecondManagerOnTheSameStateDirExitsWithAClearError(t *testing.T) {
	stateDir := t.TempDir()
	first := startManager(t, stateDir, "--node-name=node-c")
	// Wait until the first one holds the lock (it writes its pid there).
	lockFile := filepath.Join(stateDir, "lock")
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		if b, _ := os.ReadFile(lockFile); strings.TrimSpace(string(b)) == fmt.Sprint(first.cmd.Process.Pid) {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("the first manager never took the lock; output:\n%s", first.output())
		}
	}
	second := startManager(t, stateDir, "--node-name=node-c")
	select {
	case err := <-second.done:
		second.done <- err // for the cleanup
		var exit *exec.ExitError
		if err == nil || !errors.As(err, &exit) || exit.ExitCode() != exitFailure {
			t.Fatalf("second manager: %v; want exit status %d", err, exitFailure)
		}
		if out := second.output(); !strings.Contains(out, "another manager holds the state directory") || !strings.Contains(out, fmt.Sprint(first.cmd.Process.Pid)) {
			t.Fatalf("second manager output does not name the holder:\n%s", out)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the second manager did not exit")
	}
}
