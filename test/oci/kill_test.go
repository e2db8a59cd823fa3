package oci_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	exartifacts "iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/test/childproc"
	"iteron.dev/operator/test/kubeapi"
	"iteron.dev/operator/test/operatortest"
)

const killNode = "oci-kill-node"

// managerKubeconfig writes an administrator kubeconfig that impersonates
// the manager's service account (the admission policy lets only it write
// Generations), as operatortest does for the manager in-process.
func managerKubeconfig() (string, error) {
	path, err := env.Kubeconfig(base)
	if err != nil {
		return "", err
	}
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return "", err
	}
	for _, ai := range cfg.AuthInfos {
		ai.Impersonate = operatortest.ManagerUser
		ai.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:iteron-system", "system:authenticated"}
	}
	return path, clientcmd.WriteToFile(*cfg, path)
}

// managerProc is one run of the manager binary (cmd/manager) on killNode.
type managerProc struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s2 := s.b.String()
	if len(s2) > 4000 {
		s2 = s2[len(s2)-4000:]
	}
	return s2
}

func startManagerProc(t *testing.T, bin string, args []string) *managerProc {
	t.Helper()
	m := &managerProc{cmd: exec.Command(bin, args...), out: &syncBuffer{}, done: make(chan error, 1)}
	m.cmd.Stdout, m.cmd.Stderr = m.out, m.out
	if err := childproc.Start(m.cmd, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	go func() { m.done <- m.cmd.Wait() }()
	t.Cleanup(func() {
		m.stop(t)
		if t.Failed() {
			t.Logf("manager %d output (tail):\n%s", m.cmd.Process.Pid, m.out.String())
		}
	})
	return m
}

// stop sends SIGTERM and waits, bounded; idempotent.
func (m *managerProc) stop(t *testing.T) {
	select {
	case err := <-m.done:
		m.done <- err
		return
	default:
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-m.done:
		m.done <- err
	case <-time.After(60 * time.Second):
		_ = m.cmd.Process.Kill()
		m.done <- <-m.done
		t.Errorf("the manager did not stop within 60 s of SIGTERM")
	}
}

// kill sends SIGKILL and waits for the exit.
func (m *managerProc) kill(t *testing.T) {
	t.Helper()
	if err := m.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := <-m.done
	m.done <- err
}

// TestAManagerKilledMidPullLeavesNoPartialBlobThatIsEverUsed runs the
// manager binary (as users run it) on a node of its own, swaps an activation
// to an artifact whose executable stalls half-way, SIGKILLs the manager with
// the partial download in its store's tmp/, and restarts it: the partial
// file is gone before anything reads the store, the blob is not there, the
// old generation is relaunched and serves while the registry is unavailable,
// and once it answers the new digest is pulled whole and runs.
func TestAManagerKilledMidPullLeavesNoPartialBlobThatIsEverUsed(t *testing.T) {
	bin := filepath.Join(base, "manager")
	if out, err := exec.Command("go", "build", "-o", bin, filepath.Join(env.RepoRoot, "cmd", "manager")).CombinedOutput(); err != nil {
		t.Fatalf("build the manager: %v\n%s", err, out)
	}
	if err := kubeapi.BuildSandboxLauncher(env.RepoRoot, base); err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := managerKubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(base, "kill-artifacts")
	state := filepath.Join(base, "kill-state")
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	args := []string{"--kubeconfig=" + kubeconfig, "--node-name=" + killNode, "--state-dir=" + state,
		"--allowed-roots=" + filepath.Join(base, "providers"), "--gateway-socket=" + filepath.Join(base, "kill-gw.sock"),
		"--metrics-bind-address=0", "--health-probe-bind-address=0",
		"--artifact-store=" + store, "--registry-ca=" + filepath.Join(base, "ca-bundle.pem"), "--artifact-pull-timeout=60s"}

	b := baseline(t)
	next := push(t, pub, "providers/killed", impl{example: "counter-v2", id: "counter-v2.killed", unique: true})
	exe := next.exe("counter-v2.killed")
	// The proxy's modes for the executable: stall half-way (the first
	// manager), 503 (the registry unavailable for the second), pass.
	const (
		stall = iota
		unavailable
		pass
	)
	var mode atomic.Int32
	midway, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	p := startProxy(t, pub, func(w http.ResponseWriter, req *http.Request) bool {
		if req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, "/blobs/"+exe) {
			return false
		}
		switch mode.Load() {
		case pass:
			return false
		case unavailable:
			http.Error(w, `{"errors":[{"code":"UNAVAILABLE","message":"test: the registry is unavailable"}]}`, http.StatusServiceUnavailable)
			return true
		}
		body, err := upstream(pub, req.URL.Path)
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		w.Write(body[:len(body)/2])
		w.(http.Flusher).Flush()
		once.Do(func() { close(midway) })
		<-release
		panic(http.ErrAbortHandler)
	})
	defer close(release)

	m1 := startManagerProc(t, bin, args)
	act := &iteronv1.ImplementationActivation{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("oci-kill-%d", seq.Add(1)), Namespace: namespace},
		Spec:       iteronv1.ImplementationActivationSpec{NodeName: killNode, CandidateSHA256: candidate, Sources: []iteronv1.ActivationSource{source(b, b.Ref, baselineID)}},
	}
	if err := env.Client.Create(context.Background(), act); err != nil {
		t.Fatal(err)
	}
	var m2 *managerProc
	defer func() {
		// Deleted while a manager runs (its finalizer), before the
		// managers' own cleanup stops them.
		if m2 != nil {
			operatortest.DeleteAndWait(t, env.Client, act)
		}
	}()
	got := operatortest.WaitFor(t, env.Client, act, "Ready on the baseline", operatortest.Ready)
	oldGen := operatortest.ModuleStatus(got, "prompt_system")
	t.Logf("manager %d: Active on %s (generation %d)", m1.cmd.Process.Pid, oldGen.ImplementationID, oldGen.Generation)

	operatortest.UpdateSpec(t, env.Client, act, func(a *iteronv1.ImplementationActivation) {
		a.Spec.Sources[0] = source(next, via(p, pub, next.Ref), "counter-v2.killed")
	})
	select {
	case <-midway:
	case <-time.After(90 * time.Second):
		t.Fatalf("the manager never started the executable's download; its output:\n%s", m1.out.String())
	}
	var partial []string
	waitUntil(t, "the partial download in the store's tmp/", func() bool {
		partial, _ = filepath.Glob(filepath.Join(store, "tmp", "blob-*"))
		for _, f := range partial {
			if info, err := os.Stat(f); err == nil && info.Size() > 0 {
				return true
			}
		}
		return false
	})
	m1.kill(t)
	var sizes []string
	for _, f := range partial {
		if info, err := os.Stat(f); err == nil {
			sizes = append(sizes, fmt.Sprintf("%s (%d bytes)", filepath.Base(f), info.Size()))
		}
	}
	t.Logf("SIGKILLed manager %d mid-pull; tmp/ holds %v", m1.cmd.Process.Pid, sizes)
	if _, err := os.Stat(filepath.Join(store, "blobs", "sha256", strings.TrimPrefix(exe, "sha256:"))); err == nil {
		t.Fatal("the half-downloaded executable is under blobs/ after the kill")
	}
	afterKill := storeContents(store, next)

	mode.Store(unavailable)
	m2 = startManagerProc(t, bin, args)
	var ms iteronv1.ModuleStatus
	operatortest.WaitFor(t, env.Client, act, "the old generation relaunched and artifact_unavailable", func(a *iteronv1.ImplementationActivation) bool {
		ms = operatortest.ModuleStatus(a, "prompt_system")
		return seen(a) && ms.Reason == reasons.ArtifactUnavailable && strings.Contains(ms.Message, "503") &&
			ms.Phase == iteronv1.PhaseActive && ms.ImplementationID == baselineID
	})
	t.Logf("manager %d restarted: %s generation %d %s; %s", m2.cmd.Process.Pid, ms.ImplementationID, ms.Generation, ms.Phase, reasonOf(ms))
	// The restarted manager retries the pull (each attempt stages the
	// manifest and catalog under tmp/ until the executable's 503 discards
	// them), so tmp/ is looked at for the killed manager's own files, and
	// for emptiness between two attempts.
	for _, f := range partial {
		if _, err := os.Lstat(f); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s, left by the killed manager, is still there after the restart (lstat: %v)", f, err)
		}
	}
	noTmpBetweenAttempts(t, store)
	if _, err := os.Stat(filepath.Join(store, "blobs", "sha256", strings.TrimPrefix(exe, "sha256:"))); err == nil {
		t.Error("the executable is under blobs/ although no download of it completed")
	}
	afterRestart := storeContents(store, next)

	mode.Store(pass)
	got = operatortest.WaitFor(t, env.Client, act, "Ready on the new digest", func(a *iteronv1.ImplementationActivation) bool {
		return operatortest.Ready(a) && operatortest.ModuleStatus(a, "prompt_system").ImplementationID == "counter-v2.killed"
	})
	var path string
	for _, g := range generations(t, act) {
		if g.Spec.Implementation.ID == "counter-v2.killed" {
			path = g.Spec.Implementation.Executable
		}
	}
	sum, err := exartifacts.FileSHA256(path)
	if err != nil || "sha256:"+sum != exe || !strings.HasPrefix(path, store+"/") {
		t.Fatalf("the executable that runs (%q) hashes to sha256:%s (%v); want %s under %s", path, sum, err, exe, store)
	}
	t.Logf("registry answers: Ready on counter-v2.killed, its executable %s hashes to %s", path, exe)
	record(t, row{"manager SIGKILLed mid-pull (the manager binary; restarted while the registry answers 503)",
		reasonOf(ms) + " (after the restart)",
		fmt.Sprintf("yes after the restart (%s generation %d relaunched, Active)", ms.ImplementationID, ms.Generation),
		fmt.Sprintf("at the kill: %s; after the restart: %s; then Ready on the new digest, the executable verified whole", afterKill, afterRestart)})
}
