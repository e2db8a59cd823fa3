package crash

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/test/childproc"
	"iteron.dev/operator/test/kubeapi"
)

const (
	node = "crash-node"
	ns   = "default"
)

var (
	env          *kubeapi.Environment
	kubeconfig   string
	managerBin   string
	pluginBin    string
	providersDir string
	base         string
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	var err error
	// A short base: gateway sockets live here (≤ 107 bytes).
	if base, err = os.MkdirTemp("", "crash"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(base)
	_ = os.Chmod(base, 0o755)
	providersDir = filepath.Join(base, "p")
	if err := os.MkdirAll(providersDir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Artifacts built for the tests land under the manager's allowed root.
	os.Setenv("TMPDIR", providersDir)
	if env, err = kubeapi.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "start the local control plane:", err)
		return 1
	}
	defer env.Stop()
	fmt.Printf("crash tests run against kube-apiserver %s\n", env.ServerVersion)
	if kubeconfig, err = env.Kubeconfig(base); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	managerBin, pluginBin = filepath.Join(base, "manager"), filepath.Join(base, "kubectl-iteron")
	for bin, pkg := range map[string]string{managerBin: "cmd/manager", pluginBin: "cmd/kubectl-iteron"} {
		if out, err := exec.Command("go", "build", "-o", bin, filepath.Join(env.RepoRoot, pkg)).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", pkg, err, out)
			return 1
		}
	}
	if err := kubeapi.BuildSandboxLauncher(env.RepoRoot, base); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// node is one node's state: a state dir and a gateway socket that outlive
// manager processes.
type nodeState struct {
	stateDir, socket string
}

var nodeSeq int

func newNode(t *testing.T) *nodeState {
	t.Helper()
	nodeSeq++
	n := &nodeState{stateDir: filepath.Join(base, fmt.Sprintf("s%d", nodeSeq)), socket: filepath.Join(base, fmt.Sprintf("g%d.sock", nodeSeq))}
	if err := os.MkdirAll(n.stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	return n
}

// manager is one run of the manager binary.
type manager struct {
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
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// start runs a manager on n; fault, when set, is ITERON_FAULT_KILL_AFTER.
func (n *nodeState) start(t *testing.T, fault string, extra ...string) *manager {
	t.Helper()
	args := append([]string{"--kubeconfig=" + kubeconfig, "--node-name=" + node, "--state-dir=" + n.stateDir,
		"--allowed-roots=" + providersDir, "--gateway-socket=" + n.socket, fmt.Sprintf("--gateway-allow=uid:%d=*", os.Getuid()),
		"--metrics-bind-address=0", "--health-probe-bind-address=0"}, extra...)
	m := &manager{cmd: exec.Command(managerBin, args...), out: &syncBuffer{}, done: make(chan error, 1)}
	m.cmd.Env = os.Environ()
	if fault != "" {
		m.cmd.Env = append(m.cmd.Env, "ITERON_FAULT_KILL_AFTER="+fault)
	}
	m.cmd.Stdout, m.cmd.Stderr = m.out, m.out
	if err := childproc.Start(m.cmd, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	go func() { m.done <- m.cmd.Wait() }()
	t.Cleanup(func() {
		m.stop(t)
		if t.Failed() {
			t.Logf("manager %d output (last 3000 bytes):\n%s", m.cmd.Process.Pid, tail(m.out.String(), 3000))
		}
	})
	return m
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// stop sends SIGTERM and waits (bounded) for the exit; idempotent.
func (m *manager) stop(t *testing.T) error {
	select {
	case err := <-m.done:
		m.done <- err
		return err
	default:
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-m.done:
		m.done <- err
		return err
	case <-time.After(60 * time.Second):
		_ = m.cmd.Process.Kill()
		err := <-m.done
		m.done <- err
		t.Errorf("the manager did not stop within 60 s of SIGTERM")
		return err
	}
}

// waitKilled waits for a manager that is to kill itself.
func (m *manager) waitKilled(t *testing.T) {
	t.Helper()
	select {
	case err := <-m.done:
		m.done <- err
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("the manager ended with %v; want killed by SIGKILL at the fault point", err)
		}
	case <-time.After(90 * time.Second):
		t.Fatalf("the manager never reached its fault point; output:\n%s", tail(m.out.String(), 3000))
	}
}

func source(t *testing.T, example, module, id string) iteronv1.ActivationSource {
	t.Helper()
	s := providertest.Example(t, example, module, id)
	return iteronv1.ActivationSource{Module: module, ImplementationID: id, CatalogPath: s.CatalogPath, ArtifactRoot: s.ArtifactRoot, ManifestSHA256: s.ManifestSHA256, ArtifactSHA256: s.ArtifactSHA256}
}

func newActivation(t *testing.T, name string, edit func(*iteronv1.ImplementationActivationSpec), sources ...iteronv1.ActivationSource) *iteronv1.ImplementationActivation {
	t.Helper()
	a := &iteronv1.ImplementationActivation{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: iteronv1.ImplementationActivationSpec{NodeName: node, CandidateSHA256: providertest.CandidateSHA256, Sources: sources}}
	if edit != nil {
		edit(&a.Spec)
	}
	if err := env.Client.Create(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	// An activation a failed test left behind would be started by the next
	// test's manager (every manager here runs for the same node): remove it,
	// finalizer and all, once no manager of this test runs any more.
	t.Cleanup(func() { forceDelete(t, a) })
	return a
}

// forceDelete removes a, finalizers included, and its Generation objects
// (no garbage collector runs here) when it still exists.
func forceDelete(t *testing.T, a *iteronv1.ImplementationActivation) {
	ctx := context.Background()
	var cur iteronv1.ImplementationActivation
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(a), &cur); err != nil {
		return
	}
	var gens iteronv1.GenerationList
	if err := env.Client.List(ctx, &gens, client.InNamespace(a.Namespace)); err == nil {
		for i := range gens.Items {
			if metav1.IsControlledBy(&gens.Items[i], &cur) {
				if err := env.Client.Delete(ctx, &gens.Items[i]); err != nil && !apierrors.IsNotFound(err) {
					t.Logf("delete Generation %s: %v", gens.Items[i].Name, err)
				}
			}
		}
	}
	if len(cur.Finalizers) > 0 {
		patch := client.MergeFrom(cur.DeepCopy())
		cur.Finalizers = nil
		if err := env.Client.Patch(ctx, &cur, patch); err != nil && !apierrors.IsNotFound(err) {
			t.Logf("remove the finalizers of %s: %v", a.Name, err)
		}
	}
	if err := env.Client.Delete(ctx, &cur); err != nil && !apierrors.IsNotFound(err) {
		t.Logf("delete %s: %v", a.Name, err)
	}
}

func get(t *testing.T, a *iteronv1.ImplementationActivation) *iteronv1.ImplementationActivation {
	t.Helper()
	var got iteronv1.ImplementationActivation
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(a), &got); err != nil {
		t.Fatal(err)
	}
	return &got
}

func waitFor(t *testing.T, a *iteronv1.ImplementationActivation, what string, cond func(*iteronv1.ImplementationActivation) bool) *iteronv1.ImplementationActivation {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		got := get(t, a)
		if cond(got) {
			return got
		}
		if time.Now().After(deadline) {
			b, _ := json.MarshalIndent(got.Status, "", "  ")
			t.Fatalf("%s never became %s:\n%s", a.Name, what, b)
		}
		time.Sleep(150 * time.Millisecond)
	}
}

func readyWith(module, impl string) func(*iteronv1.ImplementationActivation) bool {
	return func(a *iteronv1.ImplementationActivation) bool {
		r := meta.FindStatusCondition(a.Status.Conditions, iteronv1.ConditionReady)
		if a.Status.ObservedGeneration != a.Generation || r == nil || r.Status != metav1.ConditionTrue {
			return false
		}
		for _, m := range a.Status.Modules {
			if m.Module == module {
				return m.ImplementationID == impl && m.Phase == iteronv1.PhaseActive
			}
		}
		return false
	}
}

func stalledWith(code string) func(*iteronv1.ImplementationActivation) bool {
	return func(a *iteronv1.ImplementationActivation) bool {
		s := meta.FindStatusCondition(a.Status.Conditions, iteronv1.ConditionStalled)
		return s != nil && s.Status == metav1.ConditionTrue && s.Reason == reasons.ConditionReason(code)
	}
}

// count calls the counter through the gateway with the CLI: add to key.
func (n *nodeState) count(t *testing.T, a *iteronv1.ImplementationActivation, key string, add int) (float64, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, pluginBin, "invoke", "--socket", n.socket, "--namespace", ns, "--activation", a.Name,
		"--module", "prompt_system", "--input", fmt.Sprintf(`{"key":%q,"add":%d}`, key, add), "--timeout", "15s").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("invoke: %v: %s", err, out)
	}
	var obs struct{ Count float64 }
	if err := json.Unmarshal(bytes.TrimSpace(out), &obs); err != nil {
		return 0, fmt.Errorf("invoke printed %q: %v", out, err)
	}
	return obs.Count, nil
}

// mustCount calls the counter once it is reachable: a restarted manager
// needs a moment to open its socket and relaunch the module (until then the
// gateway refuses the call, and nothing runs).
func (n *nodeState) mustCount(t *testing.T, a *iteronv1.ImplementationActivation, key string, add int) float64 {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := n.count(t, a, key, add)
		if err == nil {
			return c
		}
		// Retry only what certainly did not run: no socket yet, no such
		// activation or module yet, no active generation yet, a manager
		// still recovering.
		msg := err.Error()
		retryable := strings.Contains(msg, "dial unix") || strings.Contains(msg, "NotFound") || strings.Contains(msg, "no active generation") ||
			strings.Contains(msg, reasons.Recovering+":")
		if !retryable || time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// verifyLedger runs kubectl iteron ledger verify on the activation's ledger.
func (n *nodeState) verifyLedger(t *testing.T, a *iteronv1.ImplementationActivation) string {
	t.Helper()
	dir := filepath.Join(n.stateDir, "ledgers", string(a.UID))
	for try := 1; ; try++ {
		out, err := exec.Command(pluginBin, "ledger", "verify", dir).CombinedOutput()
		// A live ledger may grow while it is read (a renewal, a relaunch):
		// that is no fault of the ledger; read it again.
		if err != nil && strings.Contains(string(out), "size_changed") && try < 5 {
			continue
		}
		if err != nil {
			t.Fatalf("kubectl iteron ledger verify: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
}

// activeGenerations counts the Active Generation objects of a module.
func activeGenerations(t *testing.T, a *iteronv1.ImplementationActivation, module string) []string {
	t.Helper()
	var list iteronv1.GenerationList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, g := range list.Items {
		if metav1.IsControlledBy(&g, a) && g.Spec.Module == module && g.Status.Phase == iteronv1.PhaseActive {
			out = append(out, g.Name)
		}
	}
	return out
}

// providerPids are the pids of the live provider groups recorded in the
// state dir (the executor's durable records).
func (n *nodeState) providerPids(t *testing.T) []int {
	t.Helper()
	entries, _ := os.ReadDir(filepath.Join(n.stateDir, "procs"))
	var pids []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d-", &pid); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// processGone reports whether pid is dead: absent, or a zombie waiting for
// init (pid 1 of this sandbox) to reap it — the manager that was its parent
// is gone, and a zombie runs nothing.
func processGone(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(data)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] == 'Z'
	}
	return false
}

// groupMembers lists the live processes of process group pgid, from
// /proc/*/stat: a whole group, not only its leader (a zombie runs nothing
// and is not listed).
func groupMembers(pgid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(data)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:]) // state ppid pgrp …
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if g, err := strconv.Atoi(f[2]); err == nil && g == pgid {
			out = append(out, pid)
		}
	}
	return out
}

// deleteActivation deletes a and waits until its finalizer let it go.
func deleteActivation(t *testing.T, a *iteronv1.ImplementationActivation) {
	t.Helper()
	if err := env.Client.Delete(context.Background(), a); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(a), &iteronv1.ImplementationActivation{})
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s was not released: %v", a.Name, err)
		}
		time.Sleep(150 * time.Millisecond)
	}
}

func keyOf(namespace, name string) client.ObjectKey {
	return client.ObjectKey{Namespace: namespace, Name: name}
}

// waitGeneration waits (bounded) until the Generation called name satisfies
// cond, and prints its status when it never does.
func waitGeneration(t *testing.T, name, what string, cond func(*iteronv1.Generation) bool) *iteronv1.Generation {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		var g iteronv1.Generation
		err := env.Client.Get(context.Background(), keyOf(ns, name), &g)
		if err == nil && cond(&g) {
			return &g
		}
		if time.Now().After(deadline) {
			b, _ := json.MarshalIndent(g.Status, "", "  ")
			t.Fatalf("Generation %s never became %s (%v):\n%s", name, what, err, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// kill sends SIGKILL and waits for the exit: the manager stops without
// closing anything, as a machine stop would leave it.
func (m *manager) kill(t *testing.T) {
	t.Helper()
	select {
	case err := <-m.done:
		m.done <- err
		return
	default:
	}
	if err := m.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	err := <-m.done
	m.done <- err
}
