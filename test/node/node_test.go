package node

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	gatewayv1 "iteron.dev/operator/api/gateway/v1"
	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/gateway"
	"iteron.dev/operator/test/kubeapi"
	"iteron.dev/operator/test/localnode"
)

const ns = "default"

func init() {
	// controller-runtime's client logs nothing this test needs.
	ctrllog.SetLogger(logr.Discard())
}

func TestTheManagerRunsAsADaemonSetPodOnARealNode(t *testing.T) {
	repo, err := kubeapi.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	work, err := os.MkdirTemp("", "iteron-node-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	c := &cluster{repo: repo, work: work}
	if os.Getenv("KUBECONFIG") != "" {
		setupExisting(t, c)
	} else {
		if err := localnode.Available(); err != nil {
			if os.Getenv("ITERON_REQUIRE_NODE") == "1" {
				t.Fatalf("the local node cannot run here, and ITERON_REQUIRE_NODE=1 (.ci/run) requires it: %v", err)
			}
			t.Skipf("SKIP: the local node cannot run here: %v", err)
		}
		// Read while no other local node runs (the sysctls are the host's).
		sysctlsBefore, err := localnode.ReadSysctlsAlone(testLog{t}, 5*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.teardownLocal(t, sysctlsBefore) })
		setupLocal(t, c)
		var changed []string
		for k, v := range localnode.ReadSysctls() {
			if sysctlsBefore[k] != v {
				changed = append(changed, fmt.Sprintf("%s %s→%s", k, sysctlsBefore[k], v))
			}
		}
		sort.Strings(changed)
		t.Logf("sysctls the running node changed (the kubelet, CNI), restored at teardown: %v", changed)
	}
	setupCommon(t, c)
	c.state(t, "the node, before anything is applied")

	// 1. config/default, as users apply it; the DaemonSet's pod Ready under
	// its service account.
	overlay := c.overlay(t)
	t.Logf("kubectl apply -k (config/default, host paths under %s, gateway open to uid %d gid %d):\n%s",
		c.hostRoot, os.Getuid(), os.Getgid(), c.kubectlRun(t, "apply", "--server-side", "-k", overlay))
	sv := c.waitSurvivorReady(t)
	t.Logf("DaemonSet %s/%s Ready: pod %s, image %s (%s), no service-account token: %v", managerNS, survivorDS,
		sv.Name, sv.Status.ContainerStatuses[0].Image, sv.Status.ContainerStatuses[0].ImageID, sv.Spec.AutomountServiceAccountToken != nil && !*sv.Spec.AutomountServiceAccountToken)
	pod := c.waitDaemonSetReady(t, "")
	if pod.Spec.ServiceAccountName != "iteron-manager" {
		t.Fatalf("the manager pod runs as service account %q, want iteron-manager", pod.Spec.ServiceAccountName)
	}
	t.Logf("DaemonSet %s/%s Ready: pod %s on %s, IP %s, service account %s, image %s (%s)", managerNS, managerDS,
		pod.Name, pod.Spec.NodeName, pod.Status.PodIP, pod.Spec.ServiceAccountName, pod.Status.ContainerStatuses[0].Image, pod.Status.ContainerStatuses[0].ImageID)
	c.state(t, "1. config/default applied: the DaemonSet is Ready")

	// 2. An activation with providers from the hostPath root → Active.
	v1 := c.impl(t, "prompt_system", "counter-v1")
	v2 := c.impl(t, "prompt_system", "counter-v2")
	ctxImpl := c.impl(t, "context_assembly", "counter-v1")
	const name = "node"
	c.kubectlRun(t, "apply", "--server-side", "-f", c.activationYAML(t, name, v1, ctxImpl))
	a := c.waitActivation(t, name, "Ready with counter v1", readyWith("prompt_system", v1), nil)
	if a.Status.Ledger != nil {
		t.Logf("activation %s Active: %d modules, ledger %d records, head %s", name, a.Status.ActiveCount, a.Status.Ledger.Records, a.Status.Ledger.HeadSHA256)
	}
	c.state(t, "2. the activation is Active")

	// The manager wrote those Generations as its service account; the
	// shipped admission policy refuses the same write to an administrator.
	c.generationWritesAreRefusedToOthers(t, name)

	// 2b. The sandbox under the DaemonSets: a hostile provider, admitted
	// read_only, launched by the survivor (test/sandbox's named subset).
	c.hostileProviderIsRefusedWhatItWasNotAdmitted(t)

	// 3. Calls through the hostPath gateway socket, from this machine.
	c.expectCount(t, name, `{"key":"a","add":2}`, 2, "1.0.0")
	c.expectCount(t, name, `{"key":"a","add":3}`, 5, "1.0.0")

	// 4. A stateful hot swap v1 → v2.
	c.kubectlRun(t, "apply", "--server-side", "-f", c.activationYAML(t, name, v2, ctxImpl))
	a = c.waitActivation(t, name, "Ready with counter v2", readyWith("prompt_system", v2), nil)
	c.expectCount(t, name, `{"key":"a","add":1}`, 6, "2.0.0")
	c.state(t, "4. hot swap v1 → v2 done; the count went on from 5 to 6")
	c.verifyLedger(t, a)

	// 5. Probes and metrics answer from the pod.
	c.probesAndMetricsAnswer(t)

	// 6. kubectl delete pod under a caller calling in a loop: the DaemonSet
	// recreates the manager, which re-attaches to the survivor's providers:
	// no call fails, the count goes on, the provider pids stay.
	last := c.restartManager(t, name, a, "kubectl delete pod", func(pod string) {
		t.Logf("kubectl delete pod: %s", c.kubectlRun(t, "-n", managerNS, "delete", "pod", pod, "--wait=false"))
	}, 6)

	// 7. kubectl rollout restart (a manager upgrade is this rollout): the
	// same.
	last = c.restartManager(t, name, a, "kubectl rollout restart", func(string) {
		t.Logf("kubectl rollout restart: %s", c.kubectlRun(t, "-n", managerNS, "rollout", "restart", "ds/"+managerDS))
		t.Logf("kubectl rollout status: %s", c.kubectlRun(t, "-n", managerNS, "rollout", "status", "ds/"+managerDS, "--timeout=3m"))
	}, last)

	// 7b. An upgrade of the manager: a new image (another build) rolled out
	// by the DaemonSet (RollingUpdate). The same: nothing fails, nothing
	// restarts but the manager.
	if c.local != nil {
		c.restartManager(t, name, a, "kubectl set image (manager upgrade)", func(string) {
			t.Logf("kubectl set image: %s", c.kubectlRun(t, "-n", managerNS, "set", "image", "ds/"+managerDS, "manager="+upgradedImage))
			t.Logf("kubectl rollout status: %s", c.kubectlRun(t, "-n", managerNS, "rollout", "status", "ds/"+managerDS, "--timeout=3m"))
		}, last)
		pod, err := c.managerPod(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("the manager now runs image %s (%s)", pod.Status.ContainerStatuses[0].Image, pod.Status.ContainerStatuses[0].ImageID)
		if !strings.Contains(pod.Status.ContainerStatuses[0].Image, upgradedImage) {
			t.Fatalf("the manager pod runs %s after the upgrade; want %s", pod.Status.ContainerStatuses[0].Image, upgradedImage)
		}
	}
	c.probesAndMetricsAnswer(t)

	// 7c. The restart table: a caller retrying each failed call under its
	// invocation ID across a hot swap, a manager pod deleted, the manager
	// SIGKILLed, a provider SIGKILLed and a relaunch refused; only true
	// reasons, each retried call answered once.
	c.restartTable(t, name, ctxImpl)
	c.state(t, "7c. the restart table ran")

	// 8. Deleting the activation reaps every provider.
	c.deleteActivationReapsProviders(t, name)
	c.state(t, "8. the activation is deleted: no provider left")
}

func (c *cluster) impl(t *testing.T, module, example string) string {
	t.Helper()
	for _, s := range c.sources {
		if s.Module == module && (s.ImplementationID == example || strings.HasPrefix(s.ImplementationID, example+".")) {
			return s.ImplementationID
		}
	}
	t.Fatalf("hack/catalog laid out no %s in %s", example, module)
	return ""
}

// activationYAML writes an activation for this node using the given
// prompt_system and context_assembly implementations.
func (c *cluster) activationYAML(t *testing.T, name, system, context string) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: iteron.dev/v1alpha1\nkind: ImplementationActivation\nmetadata:\n  name: %s\n  namespace: %s\nspec:\n  nodeName: %s\n  candidateSHA256: sha256:%064x\n  sources:\n", name, ns, c.node, 7)
	for _, key := range []string{"prompt_system/" + system, "context_assembly/" + context} {
		s := c.sources[key]
		fmt.Fprintf(&b, "  - module: %s\n    implementationID: %s\n    catalogPath: %s\n    artifactRoot: %s\n    manifestSHA256: %s\n    artifactSHA256: %s\n",
			s.Module, s.ImplementationID, s.CatalogPath, s.ArtifactRoot, s.ManifestSHA256, s.ArtifactSHA256)
	}
	path := filepath.Join(c.work, name+"-"+system+".yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func readyWith(module, impl string) func(*iteronv1.ImplementationActivation) error {
	return func(a *iteronv1.ImplementationActivation) error {
		r := meta.FindStatusCondition(a.Status.Conditions, iteronv1.ConditionReady)
		if a.Status.ObservedGeneration != a.Generation || r == nil || r.Status != metav1.ConditionTrue {
			return fmt.Errorf("observedGeneration %d of %d, Ready %v", a.Status.ObservedGeneration, a.Generation, r)
		}
		for _, m := range a.Status.Modules {
			if m.Module == module {
				if m.ImplementationID == impl && m.Phase == iteronv1.PhaseActive {
					return nil
				}
				return fmt.Errorf("%s is %s %s", module, m.ImplementationID, m.Phase)
			}
		}
		return fmt.Errorf("no %s in status", module)
	}
}

// waitActivation waits until cond accepts the activation (and extra, when
// given, returns nil).
func (c *cluster) waitActivation(t *testing.T, name, what string, cond func(*iteronv1.ImplementationActivation) error, extra func() error) *iteronv1.ImplementationActivation {
	t.Helper()
	var a iteronv1.ImplementationActivation
	c.waitFor(t, "activation "+name+" "+what, 3*time.Minute, func() error {
		if err := c.client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &a); err != nil {
			return err
		}
		if err := cond(&a); err != nil {
			return err
		}
		if extra != nil {
			return extra()
		}
		return nil
	})
	return &a
}

// invoke calls prompt_system through the gateway socket on the hostPath,
// from this machine, with kubectl-iteron.
func (c *cluster) invoke(name, input string) (map[string]any, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, c.plugin, "invoke", "--socket", c.socket(), "--namespace", ns, "--activation", name,
		"--module", "prompt_system", "--input", input).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("kubectl iteron invoke: %v\n%s", err, out)
	}
	line := strings.TrimSpace(string(out))
	if i := strings.LastIndex(line, "\n"); i >= 0 {
		line = line[i+1:]
	}
	var obs map[string]any
	if err := json.Unmarshal([]byte(line), &obs); err != nil {
		return nil, fmt.Errorf("invoke printed %q: %v", out, err)
	}
	return obs, nil
}

// expectCount makes one call and checks the count and version it answers.
func (c *cluster) expectCount(t *testing.T, name, input string, count float64, version string) {
	t.Helper()
	obs, err := c.invoke(name, input)
	if err != nil {
		t.Fatalf("%v%s", err, c.diagnostics())
	}
	if obs["count"] != count || obs["implementation_version"] != version {
		t.Fatalf("call %s answered %v; want count %v from %s", input, obs, count, version)
	}
	t.Logf("call through %s (from this machine, uid %d): %s → count %v from %v", c.socket(), os.Getuid(), input, obs["count"], obs["implementation_version"])
}

// verifyLedger runs `kubectl iteron ledger verify` on the hostPath state
// from this machine, and inside the pod with the image's own CLI.
func (c *cluster) verifyLedger(t *testing.T, a *iteronv1.ImplementationActivation) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	host := filepath.Join(c.hostRoot, "state", "ledgers", string(a.UID))
	out := run(t, exec.CommandContext(ctx, c.plugin, "ledger", "verify", host))
	t.Logf("ledger verify (this machine, %s): %s", host, strings.TrimSpace(out))
	pod, err := c.managerPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out = c.kubectlRun(t, "-n", managerNS, "exec", pod.Name, "--", "kubectl-iteron", "ledger", "verify", filepath.Join(podState, "ledgers", string(a.UID)))
	t.Logf("ledger verify (kubectl exec %s, the image's CLI): %s", pod.Name, strings.TrimSpace(out))
}

// waitSurvivorReady waits until the survivor DaemonSet has its Ready pod.
func (c *cluster) waitSurvivorReady(t *testing.T) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	c.waitFor(t, "the survivor DaemonSet to be Ready", 4*time.Minute, func() error {
		ctx := context.Background()
		ds, err := c.clientset.AppsV1().DaemonSets(managerNS).Get(ctx, survivorDS, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if err := dsReady(ds); err != nil {
			return err
		}
		pod, err = c.survivorPod(ctx)
		return err
	})
	return pod
}

// waitDaemonSetReady waits until the DaemonSet has one up-to-date Ready pod
// other than notPod, and returns it.
func (c *cluster) waitDaemonSetReady(t *testing.T, notPod string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	c.waitFor(t, "the manager DaemonSet to be Ready", 4*time.Minute, func() error {
		ctx := context.Background()
		ds, err := c.clientset.AppsV1().DaemonSets(managerNS).Get(ctx, managerDS, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if err := dsReady(ds); err != nil {
			return err
		}
		p, err := c.managerPod(ctx)
		if err != nil {
			return err
		}
		if string(p.UID) == notPod {
			return fmt.Errorf("pod %s is still the old one", p.Name)
		}
		pod = p
		return nil
	})
	return pod
}

func dsReady(ds *appsv1.DaemonSet) error {
	s := ds.Status
	if s.ObservedGeneration < ds.Generation || s.DesiredNumberScheduled < 1 || s.NumberReady != s.DesiredNumberScheduled ||
		s.UpdatedNumberScheduled != s.DesiredNumberScheduled || s.NumberUnavailable != 0 {
		return fmt.Errorf("DaemonSet status: observed %d of %d, desired %d, ready %d, updated %d, unavailable %d",
			s.ObservedGeneration, ds.Generation, s.DesiredNumberScheduled, s.NumberReady, s.UpdatedNumberScheduled, s.NumberUnavailable)
	}
	return nil
}

// generationWritesAreRefusedToOthers: the manager (its service account)
// wrote the activation's Generations; the admission policy of
// config/admission refuses an administrator a copy of one, and a change to
// one.
func (c *cluster) generationWritesAreRefusedToOthers(t *testing.T, activation string) {
	t.Helper()
	ctx := context.Background()
	var list iteronv1.GenerationList
	if err := c.client.List(ctx, &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var mine *iteronv1.Generation
	for i := range list.Items {
		if list.Items[i].Spec.ActivationName == activation {
			mine = &list.Items[i]
		}
	}
	if mine == nil {
		t.Fatalf("the manager wrote no Generation for %s%s", activation, c.diagnostics())
	}
	managed := map[string]bool{}
	for _, f := range mine.ManagedFields {
		managed[f.Manager] = true
	}
	t.Logf("Generation %s was written by %v (the manager, as system:serviceaccount:iteron-system:iteron-manager: the admission policy lets only it)", mine.Name, keys(managed))
	const policy = "Generations are written only by system:serviceaccount:iteron-system:iteron-manager"
	cp := &iteronv1.Generation{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: mine.Name + "-copy"}, Spec: mine.Spec}
	err := c.client.Create(ctx, cp)
	if err == nil {
		_ = c.client.Delete(ctx, cp)
		t.Fatal("an administrator created a Generation: the admission policy of config/admission is not in force")
	}
	if !strings.Contains(err.Error(), policy) {
		t.Fatalf("creating a Generation as an administrator failed, but not by the admission policy: %v", err)
	}
	changed := mine.DeepCopy()
	if changed.Labels == nil {
		changed.Labels = map[string]string{}
	}
	changed.Labels["iteron.dev/test"] = "changed-by-an-administrator"
	if err := c.client.Update(ctx, changed); err == nil || !strings.Contains(err.Error(), policy) {
		t.Fatalf("an administrator's change to Generation %s: %v; want the admission policy's refusal", mine.Name, err)
	}
	t.Logf("admission policy in force: an administrator's create and update are refused: %v", err)
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// probesAndMetricsAnswer: the pod is Ready (the readiness probe passes) and
// never restarted (the liveness probe passes), and /healthz, /readyz and
// /metrics answer from the pod's ports.
func (c *cluster) probesAndMetricsAnswer(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pod, err := c.managerPod(ctx)
	if err != nil {
		t.Fatalf("%v%s", err, c.diagnostics())
	}
	cs := pod.Status.ContainerStatuses[0]
	if !cs.Ready || cs.RestartCount != 0 {
		t.Fatalf("manager container ready=%v restarts=%d (a failing liveness probe restarts it)%s", cs.Ready, cs.RestartCount, c.diagnostics())
	}
	for _, p := range []struct{ port, path, want string }{{"8081", "/healthz", "ok"}, {"8081", "/readyz", "ok"}, {"8080", "/metrics", "iteron_gateway_calls_total"}} {
		body, err := c.clientset.CoreV1().Pods(managerNS).ProxyGet("http", pod.Name, p.port, p.path, nil).DoRaw(ctx)
		if err != nil {
			t.Fatalf("GET %s:%s%s through the API server's pod proxy: %v%s", pod.Status.PodIP, p.port, p.path, err, c.diagnostics())
		}
		if !strings.Contains(string(body), p.want) {
			t.Fatalf("GET %s:%s%s answered without %q:\n%.2000s", pod.Status.PodIP, p.port, p.path, p.want, body)
		}
		line := strings.TrimSpace(string(body))
		for _, l := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(l, p.want) {
				line = l
				break
			}
		}
		t.Logf("GET http://%s:%s%s (pod %s, through the API server): %.200s", pod.Status.PodIP, p.port, p.path, pod.Name, line)
		if c.podHTTP != nil {
			resp, err := c.podHTTP.Get("http://" + net.JoinHostPort(pod.Status.PodIP, p.port) + p.path)
			if err != nil {
				t.Fatalf("GET %s:%s%s from the node's namespace: %v", pod.Status.PodIP, p.port, p.path, err)
			}
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(data), p.want) {
				t.Fatalf("GET %s:%s%s from the node's namespace: %s\n%.500s", pod.Status.PodIP, p.port, p.path, resp.Status, data)
			}
		}
	}
	t.Logf("probes pass (pod %s ready, %d restarts) and /healthz, /readyz, /metrics answer from it", pod.Name, cs.RestartCount)
}

// restartManager replaces the manager pod (how says how) while a caller
// calls prompt_system through the gateway socket in a loop (one call at a
// time, each under its own invocation ID, never retried). The new pod
// re-attaches to the survivor's providers: no call fails, each answers the
// previous count plus one (from last, the last answered count), the
// provider pids stay, the ledger verifies. It returns the last count.
func (c *cluster) restartManager(t *testing.T, name string, a *iteronv1.ImplementationActivation, how string, do func(pod string), last float64) float64 {
	t.Helper()
	ctx := context.Background()
	old, err := c.managerPod(ctx)
	if err != nil {
		t.Fatalf("%v%s", err, c.diagnostics())
	}
	before := c.providerPids(t, a)
	hostBefore := c.hostProviderProcesses(t)
	idPrefix := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, how)
	gw, err := gateway.Dial(c.socket())
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	type answer struct {
		count float64
		err   error
		took  time.Duration
	}
	var (
		mu      sync.Mutex
		answers []answer
		stop    = make(chan struct{})
		done    = make(chan struct{})
	)
	made := func() int { mu.Lock(); defer mu.Unlock(); return len(answers) }
	go func() {
		defer close(done)
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			begin := time.Now()
			resp, err := gw.Invoke(cctx, &gatewayv1.InvokeRequest{Namespace: ns, Activation: name, Module: "prompt_system",
				InvocationId: fmt.Sprintf("%s-%d-%d", idPrefix, time.Now().UnixNano(), i), InputJson: `{"key":"a","add":1}`, DeadlineMs: 55000})
			cancel()
			r := answer{err: err, took: time.Since(begin)}
			if err == nil {
				var obs struct{ Count float64 }
				if r.err = json.Unmarshal([]byte(resp.ObservationJson), &obs); r.err == nil {
					r.count = obs.Count
				}
			}
			mu.Lock()
			answers = append(answers, r)
			mu.Unlock()
			// About 100 calls a second: a steady caller, and few enough
			// that no process reaches its stdin budget (8 MiB) and is
			// renewed (a fresh process, by design) during the test.
			time.Sleep(10 * time.Millisecond)
		}
	}()
	waitCalls := func(more int) {
		want := made() + more
		c.waitFor(t, fmt.Sprintf("the caller to make %d calls", want), 2*time.Minute, func() error {
			if n := made(); n < want {
				return fmt.Errorf("%d calls made", n)
			}
			return nil
		})
	}
	waitCalls(20)
	t.Logf("%s: before, pod %s, provider pids %v, a caller calling in a loop (%d calls so far)", how, old.Name, before, made())
	do(old.Name)
	pod := c.waitDaemonSetReady(t, string(old.UID))
	t.Logf("%s: the DaemonSet recreated the manager as %s (IP %s)", how, pod.Name, pod.Status.PodIP)
	c.waitActivation(t, name, "Active again after "+how, readyWith("prompt_system", c.impl(t, "prompt_system", "counter-v2")), nil)
	waitCalls(20)
	close(stop)
	<-done
	after := c.providerPids(t, a)
	hostAfter := c.hostProviderProcesses(t)
	var failed []string
	var gaps []string
	var slowest time.Duration
	prev := last
	for i, r := range answers {
		slowest = max(slowest, r.took)
		if r.err != nil {
			failed = append(failed, fmt.Sprintf("call %d after %v: %v", i+1, r.took.Round(time.Millisecond), r.err))
			continue
		}
		if r.count != prev+1 {
			gaps = append(gaps, fmt.Sprintf("call %d answered %v after %v", i+1, r.count, prev))
		}
		prev = r.count
	}
	t.Logf("%s: calls made %d, failed %d; counts %v..%v continuous: %v; slowest call %v; provider pids before %v, after %v (unchanged: %v); new pod %s",
		how, len(answers), len(failed), last+1, prev, len(gaps) == 0, slowest.Round(time.Millisecond), before, after, fmt.Sprint(before) == fmt.Sprint(after), pod.Name)
	if len(failed) > 0 {
		t.Errorf("%s: %d calls failed: %v", how, len(failed), failed[:min(len(failed), 5)])
	}
	if len(gaps) > 0 {
		t.Errorf("%s: the count is not continuous: %v", how, gaps[:min(len(gaps), 5)])
	}
	if fmt.Sprint(before) != fmt.Sprint(after) || len(before) == 0 {
		t.Errorf("%s: the provider pids changed from %v to %v: the manager's restart relaunched them", how, before, after)
	}
	// The same seen from the host (the node's pod cgroups, host pids): not
	// what the manager reports, what runs.
	if c.local != nil {
		t.Logf("%s: provider processes seen from the host before %v, after %v", how, hostBefore, hostAfter)
		if fmt.Sprint(hostBefore) != fmt.Sprint(hostAfter) || len(hostBefore) == 0 {
			t.Errorf("%s: the provider processes seen from the host changed from %v to %v", how, hostBefore, hostAfter)
		}
	}
	if t.Failed() {
		t.Fatalf("%s failed%s", how, c.diagnostics())
	}
	c.state(t, how+": the new manager pod serves the module")
	c.verifyLedger(t, a)
	return prev
}

// providerPids are the pids (in the survivor's PID namespace) and process
// start times that the activation's Generations report.
func (c *cluster) providerPids(t *testing.T, a *iteronv1.ImplementationActivation) map[string]string {
	t.Helper()
	var list iteronv1.GenerationList
	if err := c.client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	pids := map[string]string{}
	for _, g := range list.Items {
		if g.Spec.ActivationName == a.Name && g.Status.Pid > 0 {
			started := ""
			if g.Status.ProcessStartedAt != nil {
				started = g.Status.ProcessStartedAt.UTC().Format(time.RFC3339)
			}
			pids[g.Name] = fmt.Sprintf("pid %d started %s (renewals %d)", g.Status.Pid, started, g.Status.Renewals)
		}
	}
	return pids
}

// podProcesses lists the survivor pod's processes (the providers run
// there) as `ps` in the pod sees them (uid and command), without the ps
// itself.
func (c *cluster) podProcesses(t *testing.T) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pod, err := c.survivorPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := c.kubectlRun(t, "-n", managerNS, "exec", pod.Name, "--", "ps", "-o", "pid,user,args")
	var procs []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		if f := strings.Fields(l); len(f) >= 3 && f[2] != "ps" {
			procs = append(procs, strings.Join(f, " "))
		}
	}
	return procs
}

// providerProcesses are the pod's processes that run as the provider uid.
func providerProcesses(procs []string) []string {
	var out []string
	for _, p := range procs {
		if f := strings.Fields(p); len(f) >= 2 && (f[1] == "65534" || f[1] == "nobody") {
			out = append(out, p)
		}
	}
	return out
}

func (c *cluster) deleteActivationReapsProviders(t *testing.T, name string) {
	t.Helper()
	procs := c.podProcesses(t)
	providers := providerProcesses(procs)
	t.Logf("before deleting the activation, the survivor pod runs:\n  %s", strings.Join(procs, "\n  "))
	if len(providers) < 2 {
		t.Fatalf("expected at least two provider processes (uid 65534) in the pod, saw %v", procs)
	}
	hostBefore := c.hostProviderProcesses(t)
	var a iteronv1.ImplementationActivation
	if err := c.client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &a); err != nil {
		t.Fatal(err)
	}
	c.kubectlRun(t, "delete", "implementationactivation", name, "-n", ns, "--wait=true", "--timeout=3m")
	c.waitFor(t, "the activation to be gone", 3*time.Minute, func() error {
		err := c.client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &iteronv1.ImplementationActivation{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there: %v", err)
	})
	procs = c.podProcesses(t)
	if left := providerProcesses(procs); len(left) > 0 {
		t.Fatalf("providers survived the activation's deletion: %v", left)
	}
	if left := c.hostProviderProcesses(t); len(left) > 0 {
		t.Fatalf("providers survived the activation's deletion (seen from the host's cgroups): %v", left)
	}
	var gens iteronv1.GenerationList
	if err := c.client.List(context.Background(), &gens, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, g := range gens.Items {
		if g.Spec.ActivationName == name {
			t.Fatalf("Generation %s is left after the deletion", g.Name)
		}
	}
	t.Logf("deleting the activation reaped every provider: %d in the pod (%d seen from the host) before, none after; the pod runs:\n  %s",
		len(providers), len(hostBefore), strings.Join(procs, "\n  "))
}

// hostProviderProcesses lists, on a local node, the processes of uid 65534
// in the node's pod cgroups, as this machine sees them (host pids).
func (c *cluster) hostProviderProcesses(t *testing.T) []string {
	t.Helper()
	if c.local == nil {
		return nil
	}
	procs, err := c.local.PodProcesses()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range procs {
		if p.UID == 65534 {
			out = append(out, fmt.Sprintf("%d %s", p.Pid, p.Cmdline))
		}
	}
	sort.Strings(out)
	return out
}

// teardownLocal stops the local node after reading its packet counters, and
// checks that nothing it started is left.
func (c *cluster) teardownLocal(t *testing.T, sysctlsBefore map[string]string) {
	if c.local == nil {
		return
	}
	n := c.local
	// A positive control: one loopback connection of this process, which
	// the "test-to-loopback" rule must count (so the rules see this
	// process's sockets at all).
	if lis, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
		if conn, err := net.Dial("tcp", lis.Addr().String()); err == nil {
			_, _ = conn.Write([]byte("probe"))
			conn.Close()
		}
		lis.Close()
	}
	counters, text, cerr := n.PacketCounters()
	if t.Failed() {
		t.Logf("the test failed: the node's state before teardown:%s", c.diagnostics())
	}
	if err := n.Stop(); err != nil {
		t.Errorf("teardown of the local node: %v", err)
	}
	if cerr != nil {
		t.Errorf("packet counters: %v", cerr)
	} else {
		t.Logf("nft counters in the root network namespace (this test's sockets, and any packet to or from the node's ranges):\n%s", text)
		if counters["test-to-loopback"] == 0 {
			t.Errorf("the loopback probe was not counted: the counting rules do not see this test's sockets")
		}
		for _, k := range []string{"test-to-elsewhere", "test-to-elsewhere6", "any-to-node-ranges", "forwarded-from-node-ranges", "forwarded-to-node-ranges"} {
			if counters[k] != 0 {
				t.Errorf("%d packets counted by %q in the root network namespace: this test sent traffic outside loopback", counters[k], k)
			}
		}
	}
	left, err := n.Leftovers()
	if err != nil {
		t.Errorf("check for leftovers: %v", err)
	}
	for _, l := range left {
		t.Errorf("left after teardown: %s", l)
	}
	after, err := localnode.ReadSysctlsAlone(testLog{t}, 5*time.Minute)
	if err != nil {
		t.Errorf("read the sysctls after teardown: %v", err)
	}
	var names []string
	for k := range sysctlsBefore {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, k := range names {
		fmt.Fprintf(&b, "  %-50s before %-10s after %s\n", k, sysctlsBefore[k], after[k])
		if after[k] != sysctlsBefore[k] {
			t.Errorf("sysctl %s is %s after the test, was %s", k, after[k], sysctlsBefore[k])
		}
	}
	t.Logf("after teardown: no process, mount, cgroup, network namespace, nft table or host file of the node is left; sysctls:\n%s", b.String())
}

// hostileProviderIsRefusedWhatItWasNotAdmitted activates test/sandbox's
// hostile provider, admitted read_only, on the node and has it try the
// named subset of the hostile table through the gateway: every row refused,
// the Generation showing the sandbox the survivor applied, nothing left.
func (c *cluster) hostileProviderIsRefusedWhatItWasNotAdmitted(t *testing.T) {
	t.Helper()
	hostProviders := filepath.Join(c.hostRoot, "providers")
	bin := filepath.Join(c.work, "hostile")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := artifacts.Build(ctx, c.repo, "iteron.dev/operator/test/sandbox/hostile", bin, ""); err != nil {
		t.Fatal(err)
	}
	impl, err := artifacts.Layout(filepath.Join(hostProviders, "hostile"), artifacts.Spec{Binary: bin, ImplementationID: "hostile",
		Version: catalog.Version{1, 0, 0}, Protocol: 1, Module: "prompt_system", Capabilities: []string{catalog.CapabilityReadOnly}})
	if err != nil {
		t.Fatal(err)
	}
	srcs, err := artifacts.WriteCatalog(filepath.Join(hostProviders, "hostile", "catalog.json"), impl)
	if err != nil {
		t.Fatal(err)
	}
	src := srcs[0]
	const name = "hostile"
	yaml := fmt.Sprintf("apiVersion: iteron.dev/v1alpha1\nkind: ImplementationActivation\nmetadata:\n  name: %s\n  namespace: %s\nspec:\n  nodeName: %s\n  candidateSHA256: sha256:%064x\n  sources:\n"+
		"  - module: prompt_system\n    implementationID: hostile\n    catalogPath: %s\n    artifactRoot: %s\n    manifestSHA256: %s\n    artifactSHA256: %s\n    sandbox:\n      require: Isolated\n",
		name, ns, c.node, 9, podProviders+strings.TrimPrefix(src.CatalogPath, hostProviders), podProviders+strings.TrimPrefix(src.ArtifactRoot, hostProviders),
		src.ManifestSHA256, src.ArtifactSHA256)
	path := filepath.Join(c.work, "hostile.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	c.kubectlRun(t, "apply", "--server-side", "-f", path)
	a := c.waitActivation(t, name, "Ready with the hostile provider", readyWith("prompt_system", "hostile"), nil)
	var gen iteronv1.Generation
	for _, m := range a.Status.Modules {
		if m.Module == "prompt_system" {
			if err := c.client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: m.GenerationName}, &gen); err != nil {
				t.Fatal(err)
			}
		}
	}
	sb := gen.Status.Sandbox
	if sb == nil || sb.Mode != "enforce" || sb.Level != "isolated" || sb.Network != "none" || sb.Landlock == 0 || sb.Cgroups == "unavailable" {
		t.Fatalf("the survivor's sandbox of the hostile provider: %+v%s", sb, c.diagnostics())
	}
	t.Logf("sandbox applied by the survivor on the node: %+v", *sb)
	api := strings.TrimPrefix(strings.TrimPrefix(c.config.Host, "https://"), "http://")
	var table []string
	for _, r := range []struct{ name, act, arg, errHas string }{
		{"see only its own processes", "procs", "", ""},
		{"connect to the API server", "connect", api, "connect"},
		{"read a service-account token", "read", "/var/run/secrets/kubernetes.io/serviceaccount/token", "no such file"},
		{"read the state directory", "list", podState, "no such file"},
		{"exec /bin/sh", "exec", "/bin/sh", "permission denied"},
		{"unshare", "unshare", "", "operation not permitted"},
	} {
		in, _ := json.Marshal(map[string]string{"act": r.act, "arg": r.arg})
		obs, err := c.invoke(name, string(in))
		if err != nil {
			t.Fatalf("%s: %v%s", r.name, err, c.diagnostics())
		}
		ok, _ := obs["ok"].(bool)
		msg, _ := obs["error"].(string)
		switch {
		case r.act == "procs":
			if !ok || obs["detail"] != "2" {
				t.Errorf("%s: %v; want its launcher and itself alone", r.name, obs)
			}
		case ok || !strings.Contains(msg, r.errHas):
			t.Errorf("%s: %v; want it refused with %q", r.name, obs, r.errHas)
		}
		table = append(table, fmt.Sprintf("| %s | %v |", r.name, obs))
	}
	t.Logf("the hostile provider on the node, admitted read_only:\n| row | what happened |\n|---|---|\n%s", strings.Join(table, "\n"))
	// Seen from the host: the provider, its launcher (the group's leader,
	// its parent) and its cgroup, which the survivor made below its own.
	var left []hostThing
	if c.local != nil {
		left = c.hostileOnTheHost(t, gen.Status.Pid)
		t.Logf("the hostile provider seen from the host: %v", left)
	}
	c.kubectlRun(t, "delete", "implementationactivation", name, "-n", ns, "--wait=true", "--timeout=3m")
	if c.local != nil {
		c.waitFor(t, "nothing of the hostile provider left on the host", time.Minute, func() error {
			var still []string
			for _, th := range left {
				if th.there() {
					still = append(still, th.String())
				}
			}
			if len(still) > 0 {
				return fmt.Errorf("left: %s", strings.Join(still, "; "))
			}
			return nil
		})
		t.Logf("deleting the hostile activation left nothing of it on the host: its provider, its launcher and its %d cgroup directories are gone", len(left)-2)
	}
}

// hostThing is a process (pid and start time) or a cgroup directory seen
// from this machine.
type hostThing struct {
	what  string
	pid   int
	start string
	dir   string
}

func (h hostThing) String() string {
	if h.dir != "" {
		return h.what + " " + h.dir
	}
	return fmt.Sprintf("%s pid %d", h.what, h.pid)
}

// there reports whether it still exists (a pid reused by another process
// does not count).
func (h hostThing) there() bool {
	if h.dir != "" {
		_, err := os.Stat(h.dir)
		return err == nil
	}
	start, err := startTime(h.pid)
	return err == nil && start == h.start
}

// startTime is field 22 of /proc/<pid>/stat (comm may hold spaces and
// parentheses: the fields are counted after its last ')').
func startTime(pid int) (string, error) {
	f, err := statFields(pid)
	if err != nil {
		return "", err
	}
	return f[19], nil
}

func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 20 {
		return nil, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	return f, nil
}

// providerOnTheHost finds, from this machine (the node's pod cgroups, host
// pids), the provider whose process group's leader has the pid leader in
// the survivor's PID namespace (a Generation's status.pid). Sandboxed, the
// leader is the sandbox launcher, PID 1 of a PID namespace of its own
// (NSpid: the host's pid, the survivor's, 1), and the provider is its child
// of uid 65534; unsandboxed, the leader is the provider. It returns the
// provider's host pid and the leader's.
func (c *cluster) providerOnTheHost(t *testing.T, leader int64) (provider, leaderPid int) {
	t.Helper()
	procs, err := c.local.PodProcesses()
	if err != nil {
		t.Fatal(err)
	}
	uid := map[int]int{}
	for _, p := range procs {
		uid[p.Pid] = p.UID
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 3 && f[0] == "NSpid:" && f[2] == strconv.FormatInt(leader, 10) {
				leaderPid = p.Pid
			}
		}
	}
	if leaderPid == 0 {
		t.Fatalf("no host process of the provider's group leader (pid %d in the survivor's PID namespace)%s", leader, c.diagnostics())
	}
	if uid[leaderPid] == 65534 {
		return leaderPid, leaderPid
	}
	for _, p := range procs {
		if f, err := statFields(p.Pid); err == nil && f[1] == strconv.Itoa(leaderPid) && p.UID == 65534 {
			return p.Pid, leaderPid
		}
	}
	t.Fatalf("no provider process (uid 65534) below its launcher, host pid %d%s", leaderPid, c.diagnostics())
	return 0, 0
}

// hostileOnTheHost finds, from this machine, the hostile provider
// (providerOnTheHost), its launcher and the provider's cgroup directories.
func (c *cluster) hostileOnTheHost(t *testing.T, nsPid int64) []hostThing {
	t.Helper()
	host, launcher := c.providerOnTheHost(t, nsPid)
	f, err := statFields(host)
	if err != nil {
		t.Fatal(err)
	}
	lf, err := statFields(launcher)
	if err != nil {
		t.Fatal(err)
	}
	out := []hostThing{{what: "provider", pid: host, start: f[19]}, {what: "launcher", pid: launcher, start: lf[19]}}
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", host))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(cg), "\n") {
		// "<id>:<controllers>:<path>": the provider is in the group the
		// survivor made, or in its "provider" child (v1 pids).
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && (parts[1] == "pids" || parts[1] == "memory") && strings.Contains(parts[2], "/iteron-sandbox-") {
			group := parts[2]
			if filepath.Base(group) == "provider" {
				group = filepath.Dir(group)
			}
			out = append(out, hostThing{what: parts[1] + " cgroup", dir: filepath.Join("/sys/fs/cgroup", parts[1], group)})
		}
	}
	if len(out) < 4 {
		t.Errorf("the hostile provider's cgroups, from the host: %s; want its pids and memory groups below the survivor's tree", cg)
	}
	return out
}
