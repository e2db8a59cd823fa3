package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/test/fleettest"
	"iteron.dev/operator/test/kubeapi"
)

const (
	ns   = "default"
	pool = "iteron.dev/pool"
	// nodes run a manager each; the first five carry the pool label, the
	// sixth joins in a test.
	nodes = 6
)

// The world every test shares: the local control plane, one manager
// process per node (its own state dir and gateway socket, acting as the
// managers' service account), and two fleet-controller processes (acting
// as the fleet's service account, one leader on a Lease).
var (
	env          *kubeapi.Environment
	base         string
	providersDir string
	managerBin   string
	pluginBin    string
	adminConfig  string
	managerCfg   string
	fleetCfg     string
	managers     []*fleettest.Proc
	fleets       struct {
		sync.Mutex
		procs []*fleettest.Proc
	}
)

func nodeName(i int) string { return fmt.Sprintf("fleet-%d", i) }

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) (code int) {
	// The test's own watches log through controller-runtime: to stderr when
	// verbose, else nowhere.
	if fleettest.Verbose() {
		ctrllog.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	} else {
		ctrllog.SetLogger(logr.Discard())
	}
	var err error
	// A short base: gateway sockets live here (≤ 107 bytes).
	if base, err = os.MkdirTemp("", "fleet"); err != nil {
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
	// Providers built for the tests land under the managers' allowed root.
	os.Setenv("TMPDIR", providersDir)
	if env, err = kubeapi.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "start the local control plane:", err)
		return 1
	}
	defer env.Stop()
	fmt.Printf("fleet tests run against kube-apiserver %s\n", env.ServerVersion)
	if err := fleettest.InstallRBAC(env); err != nil {
		fmt.Fprintln(os.Stderr, "install RBAC:", err)
		return 1
	}
	if adminConfig, err = env.Kubeconfig(base); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if managerCfg, err = fleettest.KubeconfigAs(adminConfig, fleettest.ManagerUser, "kubeconfig-manager"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if fleetCfg, err = fleettest.KubeconfigAs(adminConfig, fleettest.FleetUser, "kubeconfig-fleet"); err != nil {
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
	for i := 1; i <= nodes; i++ {
		labels := map[string]string{}
		if i <= 5 {
			labels[pool] = "fleet"
		}
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName(i), Labels: labels}}
		if err := env.Client.Create(context.Background(), node); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	defer func() {
		// Every activation is gone before the managers stop (each test
		// deletes its set); then the processes this package started.
		for _, p := range append(fleetProcs(), managers...) {
			p.Stop()
		}
		if code != 0 {
			for _, p := range append(fleetProcs(), managers...) {
				fmt.Fprintf(os.Stderr, "--- %s (pid %d), last 4000 bytes:\n%s\n", p.Name, p.Pid(), p.Output(4000))
			}
		}
	}()
	for i := 1; i <= nodes; i++ {
		p, err := startManager(i)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		managers = append(managers, p)
	}
	for range 2 {
		if _, err := startFleet(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	code = m.Run()
	printTable()
	return code
}

func stateDir(i int) string { return filepath.Join(base, fmt.Sprintf("s%d", i)) }
func socket(i int) string   { return filepath.Join(base, fmt.Sprintf("g%d.sock", i)) }

func startManager(i int) (*fleettest.Proc, error) {
	if err := os.MkdirAll(stateDir(i), 0o700); err != nil {
		return nil, err
	}
	// --sandbox=audit: the providers keep their bounds, but a fault that
	// fires once across processes (the faulty provider's --once-marker, a
	// file outside its artifact root) needs the host's file system, which
	// enforce hides from them by design (test/sandbox tests enforce).
	return fleettest.Start(nodeName(i)+" manager", managerBin, "--kubeconfig="+managerCfg, "--node-name="+nodeName(i), "--state-dir="+stateDir(i),
		"--allowed-roots="+providersDir, "--gateway-socket="+socket(i), fmt.Sprintf("--gateway-allow=uid:%d=*", os.Getuid()),
		"--metrics-bind-address=0", "--health-probe-bind-address=0", "--sandbox=audit")
}

// startFleet starts one more fleet-controller replica.
func startFleet() (*fleettest.Proc, error) {
	fleets.Lock()
	defer fleets.Unlock()
	p, err := fleettest.Start(fmt.Sprintf("fleet controller %d", len(fleets.procs)+1), managerBin, "--role=fleet", "--kubeconfig="+fleetCfg,
		"--leader-election-namespace=iteron-system", "--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=3s",
		"--leader-elect-retry-period=500ms", "--metrics-bind-address=0", "--health-probe-bind-address=0")
	if err == nil {
		fleets.procs = append(fleets.procs, p)
	}
	return p, err
}

func fleetProcs() []*fleettest.Proc {
	fleets.Lock()
	defer fleets.Unlock()
	return append([]*fleettest.Proc(nil), fleets.procs...)
}

// leader is the fleet-controller process holding the Lease (its pid is in
// the holder identity: <host>_<pid>_<random>).
func leader(t *testing.T) *fleettest.Proc {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var lease coordinationv1.Lease
		err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: "iteron-system", Name: "iteron-fleet"}, &lease)
		if err == nil && lease.Spec.HolderIdentity != nil {
			parts := strings.Split(*lease.Spec.HolderIdentity, "_")
			if len(parts) >= 3 {
				pid, _ := strconv.Atoi(parts[len(parts)-2])
				for _, p := range fleetProcs() {
					if p.Pid() == pid && p.Alive() {
						return p
					}
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no live fleet controller holds the Lease (%v, %+v)", err, lease.Spec)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// source lays an example provider out as module prompt_system.
func source(t *testing.T, example, id string, argv ...string) iteronv1.ActivationSource {
	t.Helper()
	s := providertest.Example(t, example, "prompt_system", id, argv...)
	return iteronv1.ActivationSource{Module: "prompt_system", ImplementationID: id, CatalogPath: s.CatalogPath, ArtifactRoot: s.ArtifactRoot,
		ManifestSHA256: s.ManifestSHA256, ArtifactSHA256: s.ArtifactSHA256}
}

func template(src iteronv1.ActivationSource) iteronv1.ActivationTemplate {
	return fleettest.Template(providertest.CandidateSHA256, src)
}

// node is what a node runs for a set: its activation and the provider
// serving prompt_system there.
type node struct {
	name       string
	activation *iteronv1.ImplementationActivation
	generation string // the active Generation object
	pid        int
	impl       string
}

// nodeOf reads node i's activation for the set and the active Generation of
// prompt_system (nil activation when there is none).
func nodeOf(t *testing.T, key client.ObjectKey, i int) node {
	t.Helper()
	acts, err := fleettest.Stamped(env.Client, key)
	if err != nil {
		t.Fatal(err)
	}
	n := node{name: nodeName(i)}
	for k := range acts {
		if acts[k].Spec.NodeName == n.name {
			n.activation = &acts[k]
		}
	}
	if n.activation == nil {
		return n
	}
	for _, m := range n.activation.Status.Modules {
		if m.Module == "prompt_system" {
			n.generation, n.impl = m.GenerationName, m.ImplementationID
		}
	}
	if n.generation != "" {
		var g iteronv1.Generation
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: n.generation}, &g); err == nil {
			n.pid = int(g.Status.Pid)
		}
	}
	return n
}

// observation is a counter's answer.
type observation struct {
	Count   int64  `json:"count"`
	Version string `json:"implementation_version"`
}

// count calls the counter on node i through its gateway (the CLI): add to
// key. A call the node cannot serve yet (a manager still opening its
// socket, an activation not known yet) is retried; anything else fails.
func count(t *testing.T, i int, activation, key string, add int) observation {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		out, err := exec.CommandContext(ctx, pluginBin, "invoke", "--socket", socket(i), "--namespace", ns, "--activation", activation,
			"--module", "prompt_system", "--input", fmt.Sprintf(`{"key":%q,"add":%d}`, key, add), "--timeout", "15s").CombinedOutput()
		cancel()
		if err == nil {
			var obs observation
			if err := json.Unmarshal(bytes.TrimSpace(out), &obs); err != nil {
				t.Fatalf("invoke on %s printed %q: %v", nodeName(i), out, err)
			}
			return obs
		}
		msg := string(out)
		retryable := strings.Contains(msg, "dial unix") || strings.Contains(msg, "NotFound") || strings.Contains(msg, "no active generation") || strings.Contains(msg, "recovering")
		if !retryable || time.Now().After(deadline) {
			t.Fatalf("invoke on %s (activation %s): %v\n%s", nodeName(i), activation, err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// processAlive reports whether pid runs (not gone, not a zombie).
func processAlive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(data)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

// sets are the suite's ActivationSets, over the nodes of its pool.
func sets() fleettest.Sets {
	return fleettest.Sets{Client: env.Client, Namespace: ns, Pool: map[string]string{pool: "fleet"}, Timeout: 3 * time.Minute}
}

func newSet(t *testing.T, name string, tpl iteronv1.ActivationTemplate, strategy iteronv1.RolloutStrategy) client.ObjectKey {
	t.Helper()
	return sets().New(t, name, tpl, strategy)
}

func editSet(t *testing.T, key client.ObjectKey, edit func(*iteronv1.ActivationSet)) {
	t.Helper()
	sets().Edit(t, key, edit)
}

func waitSet(t *testing.T, key client.ObjectKey, what string, cond func(*iteronv1.ActivationSet) bool) *iteronv1.ActivationSet {
	t.Helper()
	return sets().Wait(t, key, what, cond)
}

// plugin runs kubectl-iteron as the administrator: its output and exit code.
func plugin(t *testing.T, args ...string) (string, int) {
	t.Helper()
	return fleettest.Plugin(t, pluginBin, adminConfig, ns, args...)
}

func getSet(t *testing.T, key client.ObjectKey) *iteronv1.ActivationSet {
	t.Helper()
	return sets().Get(t, key)
}
