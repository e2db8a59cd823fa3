// Package fleetanalysis runs ActivationSet rollouts that judge themselves,
// against real parts: the local control plane, three node managers (each its
// own process, state directory, gateway socket and metrics endpoint), one
// fleet controller process, a real Prometheus (bin/prometheus) scraping the
// managers every second with each target labelled by its node, webhook
// servers on loopback, and the example providers. Callers drive traffic
// through each node's gateway.
package fleetanalysis

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/fleet"
	"iteron.dev/operator/internal/gateway"
	"iteron.dev/operator/test/fleettest"
	"iteron.dev/operator/test/kubeapi"
	"iteron.dev/operator/test/prometheustest"
)

const (
	ns   = "default"
	pool = "iteron.dev/pool"
	zone = "topology.kubernetes.io/zone"
	// nodes run a manager each: fa-1 in zone a, fa-2 in b, fa-3 in c.
	nodes = 3
)

var (
	env          *kubeapi.Environment
	base         string
	providersDir string
	managerBin   string
	pluginBin    string
	adminConfig  string
	prom         *prometheustest.Prometheus
	procs        []*fleettest.Proc
	// metricsAddr are the managers' metrics endpoints by node.
	metricsAddr = map[string]string{}
)

func nodeName(i int) string { return fmt.Sprintf("fa-%d", i) }
func zoneOf(i int) string   { return string(rune('a' + i - 1)) }
func socket(i int) string   { return filepath.Join(base, fmt.Sprintf("g%d.sock", i)) }

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) (code int) {
	ctrllog.SetLogger(logr.Discard())
	var err error
	if base, err = os.MkdirTemp("", "fa"); err != nil {
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
	os.Setenv("TMPDIR", providersDir)
	if env, err = kubeapi.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "start the local control plane:", err)
		return 1
	}
	defer env.Stop()
	fmt.Printf("fleetanalysis tests run against kube-apiserver %s\n", env.ServerVersion)
	if err := fleettest.InstallRBAC(env); err != nil {
		fmt.Fprintln(os.Stderr, "install RBAC:", err)
		return 1
	}
	if adminConfig, err = env.Kubeconfig(base); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	managerCfg, err := fleettest.KubeconfigAs(adminConfig, fleettest.ManagerUser, "kubeconfig-manager")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fleetCfg, err := fleettest.KubeconfigAs(adminConfig, fleettest.FleetUser, "kubeconfig-fleet")
	if err != nil {
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
	// The managers sandbox their providers with the launcher beside them.
	if err := kubeapi.BuildSandboxLauncher(env.RepoRoot, base); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		for _, p := range procs {
			p.Stop()
		}
		if prom != nil {
			prom.Stop()
		}
		if code != 0 {
			for _, p := range procs {
				fmt.Fprintf(os.Stderr, "--- %s (pid %d), last 3000 bytes:\n%s\n", p.Name, p.Pid(), p.Output(3000))
			}
		}
	}()
	var targets []prometheustest.Target
	for i := 1; i <= nodes; i++ {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName(i), Labels: map[string]string{pool: "analysis", zone: zoneOf(i)}}}
		if err := env.Client.Create(context.Background(), node); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		addr, err := freeAddr()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		metricsAddr[nodeName(i)] = addr
		state := filepath.Join(base, fmt.Sprintf("s%d", i))
		if err := os.MkdirAll(state, 0o700); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		p, err := fleettest.Start(nodeName(i)+" manager", managerBin, "--kubeconfig="+managerCfg, "--node-name="+nodeName(i), "--state-dir="+state,
			"--allowed-roots="+providersDir, "--gateway-socket="+socket(i), fmt.Sprintf("--gateway-allow=uid:%d=*", os.Getuid()),
			"--metrics-bind-address="+addr, "--health-probe-bind-address=0")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		procs = append(procs, p)
		targets = append(targets, prometheustest.Target{Address: addr, Labels: map[string]string{"node": nodeName(i)}})
	}
	fleet, err := fleettest.Start("fleet controller", managerBin, "--role=fleet", "--kubeconfig="+fleetCfg, "--leader-election-namespace=iteron-system",
		"--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=3s", "--leader-elect-retry-period=500ms",
		"--metrics-bind-address=0", "--health-probe-bind-address=0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	procs = append(procs, fleet)
	ctx := context.Background()
	if prom, err = prometheustest.Start(ctx, prometheustest.Options{Dir: filepath.Join(base, "prometheus"), Targets: targets}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The managers' metrics endpoints are up once Prometheus scrapes all.
	deadline := time.Now().Add(60 * time.Second)
	for {
		if up, _ := prom.TargetsUp(ctx); up == nodes {
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintln(os.Stderr, "Prometheus does not reach the three managers' metrics endpoints")
			return 1
		}
		time.Sleep(500 * time.Millisecond)
	}
	fmt.Printf("Prometheus %s scrapes the managers of %d nodes every second\n", prom.URL, nodes)
	if err := env.Client.Create(ctx, &iteronv1.AnalysisProvider{ObjectMeta: metav1.ObjectMeta{Name: "prometheus"},
		Spec: iteronv1.AnalysisProviderSpec{Prometheus: &iteronv1.PrometheusProvider{Address: prom.URL}, TimeoutSeconds: ptr.To[int32](5)}}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// source lays an example provider out as module prompt_system (with the
// capabilities given: a probe needs read_only).
func source(t *testing.T, example, id string, caps []string, argv ...string) iteronv1.ActivationSource {
	t.Helper()
	impl := providertest.Implement(t, artifacts.Spec{Binary: example, Module: "prompt_system", ImplementationID: id, Argv: argv, Capabilities: caps})
	s := providertest.Catalog(t, impl)[0]
	return iteronv1.ActivationSource{Module: "prompt_system", ImplementationID: id, CatalogPath: s.CatalogPath, ArtifactRoot: s.ArtifactRoot,
		ManifestSHA256: s.ManifestSHA256, ArtifactSHA256: s.ArtifactSHA256}
}

func template(src iteronv1.ActivationSource) iteronv1.ActivationTemplate {
	return fleettest.Template(providertest.CandidateSHA256, src)
}

// traffic calls the set's module on every node through the node's gateway,
// every interval, until the test ends; it counts the outcomes by node.
type traffic struct {
	mu       sync.Mutex
	ok, fail map[string]int
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

func startTraffic(t *testing.T, key client.ObjectKey, interval time.Duration) *traffic {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tr := &traffic{ok: map[string]int{}, fail: map[string]int{}, cancel: cancel}
	for i := 1; i <= nodes; i++ {
		c, err := gateway.Dial(socket(i))
		if err != nil {
			t.Fatal(err)
		}
		node, act := nodeName(i), fleet.ActivationName(key.Name, nodeName(i))
		tr.wg.Add(1)
		go func() {
			defer tr.wg.Done()
			defer c.Close()
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
				_, err := c.Invoke(cctx, &gatewayv1.InvokeRequest{Namespace: ns, Activation: act, Module: "prompt_system",
					InputJson: `{"key":"traffic","add":1}`, DeadlineMs: 2000})
				ccancel()
				tr.mu.Lock()
				if err == nil {
					tr.ok[node]++
				} else {
					tr.fail[node]++
				}
				tr.mu.Unlock()
			}
		}()
	}
	t.Cleanup(tr.stop)
	return tr
}

func (tr *traffic) stop() { tr.cancel(); tr.wg.Wait() }

func (tr *traffic) String() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var parts []string
	for i := 1; i <= nodes; i++ {
		n := nodeName(i)
		parts = append(parts, fmt.Sprintf("%s %d ok / %d failed", n, tr.ok[n], tr.fail[n]))
	}
	return strings.Join(parts, ", ")
}

// waveLog watches a set and its activations (informers: every change, in
// the order the API server made it for each object) and records each
// node's move to another revision (with its wave), each phase the set went
// through and each analysis run's progress: the rollout as it happened.
type waveLog struct {
	key    client.ObjectKey
	cancel context.CancelFunc
	start  time.Time
	mu     sync.Mutex
	lines  []string
	moves  []string // node@wave in the order they moved to another revision
	revs   map[string]string
	phase  string
	runs   map[string]string
}

func watchWaves(t *testing.T, key client.ObjectKey) *waveLog {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &waveLog{key: key, cancel: cancel, start: time.Now(), revs: map[string]string{}, runs: map[string]string{}}
	// What is there before the watch starts is not a move.
	acts, err := fleettest.Stamped(env.Client, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range acts {
		w.revs[a.Name] = a.Labels[iteronv1.LabelRevision]
	}
	c, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}},
		ByObject: map[client.Object]cache.ByObject{&iteronv1.ImplementationActivation{}: {Label: labels.SelectorFromSet(labels.Set{iteronv1.LabelActivationSet: key.Name})}}})
	if err != nil {
		t.Fatal(err)
	}
	ai, err := c.GetInformer(ctx, &iteronv1.ImplementationActivation{})
	if err != nil {
		t.Fatal(err)
	}
	si, err := c.GetInformer(ctx, &iteronv1.ActivationSet{})
	if err != nil {
		t.Fatal(err)
	}
	onAct := func(obj any) {
		a, ok := obj.(*iteronv1.ImplementationActivation)
		if !ok {
			return
		}
		rev := a.Labels[iteronv1.LabelRevision]
		w.mu.Lock()
		old, seen := w.revs[a.Name]
		w.revs[a.Name] = rev
		w.mu.Unlock()
		if seen && old == rev {
			return
		}
		what := "wave " + a.Annotations[iteronv1.AnnotationWave]
		if from := a.Annotations[iteronv1.AnnotationRevertedFrom]; from != "" {
			what = "reverted from " + from
		}
		w.add(fmt.Sprintf("node %s (zone %s) → revision %s, %s", a.Spec.NodeName, zoneOf(int(a.Spec.NodeName[3]-'0')), rev, what))
		w.mu.Lock()
		w.moves = append(w.moves, a.Spec.NodeName+"@"+a.Annotations[iteronv1.AnnotationWave])
		w.mu.Unlock()
	}
	onSet := func(obj any) {
		set, ok := obj.(*iteronv1.ActivationSet)
		if !ok || set.Name != key.Name {
			return
		}
		w.mu.Lock()
		newPhase := string(set.Status.Phase) != w.phase
		w.phase = string(set.Status.Phase)
		var runs []string
		for _, r := range set.Status.AnalysisRuns {
			k := fmt.Sprintf("%s/%s/%d", r.Metric, r.Revision, r.Wave)
			if w.runs[k] != string(r.Phase)+r.Message {
				w.runs[k] = string(r.Phase) + r.Message
				if r.Phase != iteronv1.AnalysisRunning || len(r.Measurements) > 0 {
					runs = append(runs, fmt.Sprintf("analysis %s wave %d: %s: %s", r.Metric, r.Wave, r.Phase, r.Message))
				}
			}
		}
		w.mu.Unlock()
		if newPhase {
			msg := ""
			if c := fleettest.Condition(set, iteronv1.ConditionReady); c != nil {
				msg = c.Message
			}
			w.add(fmt.Sprintf("set phase %s (step %d): %s", set.Status.Phase, set.Status.Step, msg))
		}
		for _, r := range runs {
			w.add(r)
		}
	}
	for inf, on := range map[cache.Informer]func(any){ai: onAct, si: onSet} {
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: on, UpdateFunc: func(_, n any) { on(n) }}); err != nil {
			t.Fatal(err)
		}
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("the wave log's cache did not sync")
	}
	t.Cleanup(w.stop)
	return w
}

func (w *waveLog) add(line string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lines = append(w.lines, fmt.Sprintf("%6.1fs %s", time.Since(w.start).Seconds(), line))
}

func (w *waveLog) stop() { w.cancel() }

func (w *waveLog) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.lines, "\n")
}

func (w *waveLog) movesInOrder() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.moves...)
}

// statusJSON is a part of a set's status as JSON, for logs.
func statusJSON(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}

// sets are the suite's ActivationSets, over the nodes of its pool.
func sets() fleettest.Sets {
	return fleettest.Sets{Client: env.Client, Namespace: ns, Pool: map[string]string{pool: "analysis"}, Timeout: 4 * time.Minute}
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
