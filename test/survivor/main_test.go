package survivor

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

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/gateway"
	"iteron.dev/operator/test/childproc"
	"iteron.dev/operator/test/kubeapi"
)

const (
	nodeName = "survivor-node"
	ns       = "default"
	module   = "prompt_system"
)

var (
	env          *kubeapi.Environment
	kubeconfig   string
	managerBin   string
	upgradedBin  string
	survivorBin  string
	pluginBin    string
	providersDir string
	base         string
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	var err error
	// A short base: sockets live here (≤ 107 bytes).
	if base, err = os.MkdirTemp("", "sv"); err != nil {
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
	fmt.Printf("survivor tests run against kube-apiserver %s\n", env.ServerVersion)
	if kubeconfig, err = env.Kubeconfig(base); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	managerBin, upgradedBin = filepath.Join(base, "manager"), filepath.Join(base, "manager-upgraded")
	survivorBin, pluginBin = filepath.Join(base, "iteron-survivor"), filepath.Join(base, "kubectl-iteron")
	builds := []struct{ out, pkg, ldflags string }{
		{managerBin, "cmd/manager", ""},
		// Another build of the manager: other bytes, as a new release's.
		{upgradedBin, "cmd/manager", "-X main.buildNote=upgraded"},
		{survivorBin, "cmd/survivor", ""},
		{pluginBin, "cmd/kubectl-iteron", ""},
	}
	for _, b := range builds {
		args := []string{"build", "-o", b.out}
		if b.ldflags != "" {
			args = append(args, "-ldflags", b.ldflags)
		}
		if out, err := exec.Command("go", append(args, filepath.Join(env.RepoRoot, b.pkg))...).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", b.pkg, err, out)
			return 1
		}
	}
	if err := kubeapi.BuildSandboxLauncher(env.RepoRoot, base); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	printSummary()
	printRestartTable()
	return code
}

// nodeState is one node: a state dir and a gateway socket that outlive
// every manager and survivor process.
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

// proc is one run of a binary (a manager or a survivor).
type proc struct {
	name string
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

func start(t *testing.T, name, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(bin, args...), out: &syncBuffer{}, done: make(chan error, 1)}
	p.cmd.Env = os.Environ()
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := childproc.Start(p.cmd, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("%s %d output (last 4000 bytes):\n%s", p.name, p.cmd.Process.Pid, tail(p.out.String(), 4000))
		}
	})
	return p
}

// startSurvivor runs iteron-survivor for n.
func (n *nodeState) startSurvivor(t *testing.T) *proc {
	t.Helper()
	p := start(t, "survivor", survivorBin, "--state-dir="+n.stateDir, "--gateway-socket="+n.socket,
		fmt.Sprintf("--gateway-group=%d", os.Getgid()), "--checkpoint-timeout=20s")
	waitFile(t, filepath.Join(n.stateDir, "survivor.sock"), p)
	return p
}

// startManager runs a manager for n with the survivor (bin: which build).
func (n *nodeState) startManager(t *testing.T, bin string) *proc {
	t.Helper()
	return start(t, "manager", bin, "--kubeconfig="+kubeconfig, "--node-name="+nodeName, "--state-dir="+n.stateDir,
		"--allowed-roots="+providersDir, "--gateway-socket="+n.socket, fmt.Sprintf("--gateway-allow=uid:%d=*", os.Getuid()),
		"--survivor-socket="+filepath.Join(n.stateDir, "survivor.sock"),
		"--metrics-bind-address=0", "--health-probe-bind-address=0")
}

func waitFile(t *testing.T, path string, p *proc) {
	t.Helper()
	for start := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return
		}
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("%s exited (%v) before %s appeared:\n%s", p.name, err, path, p.out.String())
		default:
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("%s did not appear within 30 s:\n%s", path, p.out.String())
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// stop sends SIGTERM and waits (bounded) for the exit; idempotent.
func (p *proc) stop(t *testing.T) error {
	select {
	case err := <-p.done:
		p.done <- err
		return err
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
		return err
	case <-time.After(70 * time.Second):
		_ = p.cmd.Process.Kill()
		err := <-p.done
		p.done <- err
		t.Errorf("%s did not stop within 70 s of SIGTERM", p.name)
		return err
	}
}

// kill sends SIGKILL and waits for the exit.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Kill()
	err := <-p.done
	p.done <- err
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("%s ended with %v; want killed by SIGKILL", p.name, err)
	}
}

func source(t *testing.T, example, id string) iteronv1.ActivationSource {
	t.Helper()
	s := providertest.Example(t, example, module, id)
	return iteronv1.ActivationSource{Module: module, ImplementationID: id, CatalogPath: s.CatalogPath, ArtifactRoot: s.ArtifactRoot, ManifestSHA256: s.ManifestSHA256, ArtifactSHA256: s.ArtifactSHA256}
}

func newActivation(t *testing.T, name string, checkpointSeconds int32, sources ...iteronv1.ActivationSource) *iteronv1.ImplementationActivation {
	t.Helper()
	a := &iteronv1.ImplementationActivation{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: iteronv1.ImplementationActivationSpec{NodeName: nodeName, CandidateSHA256: providertest.CandidateSHA256, Sources: sources}}
	a.Spec.Checkpoint.IntervalSeconds = &checkpointSeconds
	if err := env.Client.Create(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { forceDelete(t, a) })
	return a
}

// forceDelete removes a, finalizers included, and its Generations, when it
// still exists (no garbage collector runs here).
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
				_ = env.Client.Delete(ctx, &gens.Items[i])
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
	_ = env.Client.Delete(ctx, &cur)
}

func get(t *testing.T, a *iteronv1.ImplementationActivation) *iteronv1.ImplementationActivation {
	t.Helper()
	var got iteronv1.ImplementationActivation
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(a), &got); err != nil {
		t.Fatal(err)
	}
	return &got
}

// waitFor waits (90 s) until cond holds, printing the status when it never does.
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
		time.Sleep(100 * time.Millisecond)
	}
}

func ready(impl string) func(*iteronv1.ImplementationActivation) bool {
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

// generation returns the Generation that serves the module now.
func generation(t *testing.T, a *iteronv1.ImplementationActivation) *iteronv1.Generation {
	t.Helper()
	for start := time.Now(); time.Since(start) < 30*time.Second; time.Sleep(100 * time.Millisecond) {
		if g := generationNow(t, a); g != nil {
			return g
		}
	}
	t.Fatalf("no Generation serves %s in the status of %s within 30 s: %+v", module, a.Name, get(t, a).Status.Modules)
	return nil
}

// generationNow is the Generation the status names now, or nil when it
// names none (it may be between two).
func generationNow(t *testing.T, a *iteronv1.ImplementationActivation) *iteronv1.Generation {
	t.Helper()
	cur := get(t, a)
	for _, m := range cur.Status.Modules {
		if m.Module == module && m.GenerationName != "" {
			var g iteronv1.Generation
			if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: m.GenerationName}, &g); err != nil {
				t.Fatal(err)
			}
			return &g
		}
	}
	return nil
}

// relaunchedGeneration waits (60 s) until the Generation serving the
// module says it was relaunched after since, and returns it.
func relaunchedGeneration(t *testing.T, a *iteronv1.ImplementationActivation, since time.Time) *iteronv1.Generation {
	t.Helper()
	var g *iteronv1.Generation
	for start := time.Now(); time.Since(start) < 60*time.Second; time.Sleep(100 * time.Millisecond) {
		if g = generationNow(t, a); g == nil || !strings.HasPrefix(g.Status.Message, "relaunched at ") {
			continue
		}
		at, err := time.Parse(time.RFC3339, strings.Fields(g.Status.Message)[2])
		if err == nil && !at.Before(since.Truncate(time.Second)) {
			return g
		}
	}
	t.Fatalf("the Generation of %s never said it was relaunched after %v: %+v", a.Name, since, g)
	return nil
}

// providerIdentity is a process as /proc names it: pid and start time.
type providerIdentity struct {
	pid       int
	startTime uint64
}

func (p providerIdentity) String() string {
	return fmt.Sprintf("pid %d (start time %d)", p.pid, p.startTime)
}

// provider is the module's provider process as the Generation reports it,
// checked against /proc (the survivor is this test's child: same PID
// namespace).
func provider(t *testing.T, a *iteronv1.ImplementationActivation) providerIdentity {
	t.Helper()
	var g *iteronv1.Generation
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		g = generation(t, a)
		if g.Status.Pid != 0 && g.Status.Phase == iteronv1.PhaseActive {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("Generation %s reports no pid: %+v", g.Name, g.Status)
		}
	}
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		st, err := startTime(int(g.Status.Pid))
		if err == nil {
			return providerIdentity{int(g.Status.Pid), st}
		}
		// A process that just died (with its survivor) is reported
		// until the relaunch is.
		if time.Since(start) > 30*time.Second {
			t.Fatalf("the provider pid %d of %s: %v", g.Status.Pid, g.Name, err)
		}
		g = generation(t, a)
	}
}

func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 20 || f[0] == "Z" {
		return 0, fmt.Errorf("process %d is %v", pid, f[:1])
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// verifyLedger runs kubectl iteron ledger verify on the activation's ledger.
func (n *nodeState) verifyLedger(t *testing.T, a *iteronv1.ImplementationActivation) string {
	t.Helper()
	dir := filepath.Join(n.stateDir, "ledgers", string(a.UID))
	for try := 1; ; try++ {
		out, err := exec.Command(pluginBin, "ledger", "verify", dir).CombinedOutput()
		if err != nil && strings.Contains(string(out), "size_changed") && try < 5 {
			continue
		}
		if err != nil {
			t.Fatalf("kubectl iteron ledger verify: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
}

// ledgerTransactions lists the ledger's transactions in order, with their
// last phase, from kubectl iteron ledger show --wide.
func (n *nodeState) ledgerTransactions(t *testing.T, a *iteronv1.ImplementationActivation) []string {
	t.Helper()
	dir := filepath.Join(n.stateDir, "ledgers", string(a.UID))
	out, err := exec.Command(pluginBin, "ledger", "show", "--wide", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl iteron ledger show: %v\n%s", err, out)
	}
	var txns []string
	last := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] == "SEQ" || f[0] == "ok:" {
			continue
		}
		if _, err := strconv.Atoi(f[0]); err != nil {
			continue
		}
		if _, ok := last[f[1]]; !ok {
			txns = append(txns, f[1])
		}
		last[f[1]] = f[2]
	}
	for i, id := range txns {
		txns[i] = id + " " + last[id]
	}
	return txns
}

// answer is one call through the gateway.
type answer struct {
	ok       bool
	count    float64
	replayed bool
	code     codes.Code
	msg      string
	took     time.Duration
}

func (r answer) String() string {
	if r.ok {
		return fmt.Sprintf("count %v (replayed %v) in %v", r.count, r.replayed, r.took.Round(time.Millisecond))
	}
	return fmt.Sprintf("%s after %v: %s", r.code, r.took.Round(time.Millisecond), r.msg)
}

// caller is a gRPC client of the gateway socket that reuses its
// connection, as a long-lived client on the node would.
type caller struct {
	c *gateway.Client
}

func newCaller(t *testing.T, n *nodeState) *caller {
	t.Helper()
	c, err := gateway.Dial(n.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &caller{c: c}
}

// call adds add to key under invocation id (a deadline of 20 s).
func (c *caller) call(a *iteronv1.ImplementationActivation, id, key string, add int) answer {
	return c.callSlow(a, id, key, add, 0)
}

// callSlow is call with a run that sleeps sleepMs in the provider before
// it counts (so that a kill finds runs in flight).
func (c *caller) callSlow(a *iteronv1.ImplementationActivation, id, key string, add, sleepMs int) answer {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	start := time.Now()
	input := fmt.Sprintf(`{"key":%q,"add":%d}`, key, add)
	if sleepMs > 0 {
		input = fmt.Sprintf(`{"key":%q,"add":%d,"sleep_ms":%d}`, key, add, sleepMs)
	}
	resp, err := c.c.Invoke(ctx, &gatewayv1.InvokeRequest{Namespace: a.Namespace, Activation: a.Name, Module: module, InvocationId: id,
		InputJson: input, DeadlineMs: 20000})
	r := answer{took: time.Since(start)}
	if err != nil {
		st, _ := status.FromError(err)
		r.code, r.msg = st.Code(), st.Message()
		return r
	}
	var obs struct{ Count float64 }
	if err := json.Unmarshal([]byte(resp.ObservationJson), &obs); err != nil {
		r.msg = fmt.Sprintf("observation %q: %v", resp.ObservationJson, err)
		return r
	}
	r.ok, r.count, r.replayed = true, obs.Count, resp.Replayed
	return r
}

// handshake returns the gateway's instance ID.
func (c *caller) handshake(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.c.Handshake(ctx, &gatewayv1.HandshakeRequest{})
	if err != nil {
		t.Fatalf("handshake: %v", err)
	}
	return resp.InstanceId
}

// update edits the activation's spec (retrying conflicts).
func update(t *testing.T, a *iteronv1.ImplementationActivation, edit func(*iteronv1.ImplementationActivationSpec)) {
	t.Helper()
	for i := 0; ; i++ {
		cur := get(t, a)
		edit(&cur.Spec)
		err := env.Client.Update(context.Background(), cur)
		if err == nil {
			return
		}
		if i == 10 {
			t.Fatal(err)
		}
	}
}
