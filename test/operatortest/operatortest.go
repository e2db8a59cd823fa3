// Package operatortest runs the real controllers in-process against the
// real API server (test/kubeapi) with real providers, as the manager's
// service account with the generated RBAC and the Generation admission
// policy installed, and holds the helpers the suites share to drive and
// watch activations. Test packages only.
package operatortest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/cmd/manager/app"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/test/kubeapi"
)

// ManagerUser is the manager's service account, as the API server names it.
const ManagerUser = "system:serviceaccount:iteron-system:iteron-manager"

// Options configure an in-process manager.
type Options struct {
	// Node is the manager's --node-name.
	Node string
	// StateDir is its --state-dir (the executor's records go to procs/).
	StateDir string
	// AllowedRoots are its --allowed-roots.
	AllowedRoots []string
	// Gateway, when set, serves the gateway.
	Gateway *app.GatewayOptions
	// Artifacts, when set, configure OCI sources (the artifact store).
	Artifacts *app.ArtifactOptions
	// Graph, when set, is the manager's custom seam graph (--graph).
	Graph *catalog.SeamGraph
	// AfterPhase, when set, is the coordinator's test hook: it runs after
	// each phase record of a transaction, the transaction waiting for it.
	AfterPhase func(key hotswap.ActivationKey, module, phase string)
	// WrapTransport, when set, wraps the manager's API transport (to count
	// its requests).
	WrapTransport func(http.RoundTripper) http.RoundTripper
	// MaxParallelActivations, KubeAPIQPS and KubeAPIBurst are the flags of
	// the same names (0: the manager's defaults).
	MaxParallelActivations int
	KubeAPIQPS             float32
	KubeAPIBurst           int
	// Sandbox, when set, sandboxes the providers (--sandbox and the
	// --sandbox-* flags); nil starts them unsandboxed, for suites that are
	// not about the sandbox.
	Sandbox *app.SandboxOptions
	// CapabilityCeiling is --capability-ceiling (default read_only and
	// reversible_local).
	CapabilityCeiling []string
}

// Manager is the controllers running in-process.
type Manager struct {
	// Coordinator is the node-local coordinator the controllers drive.
	Coordinator *hotswap.Coordinator
	// App is the manager as cmd/manager/app built it.
	App  *app.Manager
	done chan struct{}
}

// StartManager installs config/rbac and config/admission as shipped and
// runs the manager — built by cmd/manager/app, exactly as cmd/manager builds
// it — as the manager's service account until ctx ends; Stop then waits for
// it to have stopped every provider.
func StartManager(ctx context.Context, env *kubeapi.Environment, o Options) (*Manager, error) {
	level := zapcore.ErrorLevel
	if os.Getenv("ITERON_TEST_VERBOSE") != "" {
		level = zapcore.DebugLevel
	}
	log := zap.New(zap.WriteTo(os.Stderr), zap.Level(level))
	ctrl.SetLogger(log)
	for _, f := range []string{"config/rbac/role.yaml", "config/rbac/role_binding.yaml", "config/admission/generation_writers.yaml"} {
		if err := ApplyFile(env.Client, filepath.Join(env.RepoRoot, f)); err != nil {
			return nil, err
		}
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: ManagerUser, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:iteron-system", "system:authenticated"}}
	if o.WrapTransport != nil {
		cfg.Wrap(o.WrapTransport)
	}
	defaults := procexec.DefaultConfig(filepath.Join(o.StateDir, "procs"))
	ceiling := o.CapabilityCeiling
	if ceiling == nil {
		ceiling = []string{"read_only", "reversible_local"}
	}
	m, err := app.New(cfg, app.Options{
		NodeName: o.Node, StateDir: o.StateDir, AllowedRoots: o.AllowedRoots, Interpreters: defaults.Interpreters,
		ProviderUID: defaults.ProviderUID, ProviderGID: defaults.ProviderGID, CapabilityCeiling: ceiling, Sandbox: o.Sandbox,
		MetricsBindAddress: "0", HealthProbeBindAddress: "0", Gateway: o.Gateway, Artifacts: o.Artifacts, Log: log,
		Graph: o.Graph, AfterPhase: o.AfterPhase,
		MaxParallelActivations: o.MaxParallelActivations, KubeAPIQPS: o.KubeAPIQPS, KubeAPIBurst: o.KubeAPIBurst,
	})
	if err != nil {
		return nil, err
	}
	mgr := &Manager{Coordinator: m.Coordinator, App: m, done: make(chan struct{})}
	go func() {
		defer close(mgr.done)
		if err := m.Run(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	return mgr, nil
}

// Stop waits for the manager (its ctx must be done) to have stopped every
// provider.
func (m *Manager) Stop() {
	<-m.done
}

// ApplyFile creates every object of a multi-document YAML file (an object
// that exists is left as it is).
func ApplyFile(c client.Client, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err != nil {
			if strings.Contains(err.Error(), "EOF") {
				return nil
			}
			return fmt.Errorf("%s: %w", path, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		if err := c.Create(context.Background(), &u); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s: create %s %s: %w", path, u.GetKind(), u.GetName(), err)
		}
	}
}

// Source lays out an example provider and returns it as an activation
// source.
func Source(t testing.TB, example, module, id string, argv ...string) iteronv1.ActivationSource {
	t.Helper()
	s := providertest.Example(t, example, module, id, argv...)
	return iteronv1.ActivationSource{
		Module: module, ImplementationID: id, CatalogPath: s.CatalogPath, ArtifactRoot: s.ArtifactRoot,
		ManifestSHA256: s.ManifestSHA256, ArtifactSHA256: s.ArtifactSHA256,
	}
}

// DeleteAndWait deletes an activation and waits until its finalizer let it
// go.
func DeleteAndWait(t testing.TB, c client.Client, act *iteronv1.ImplementationActivation) {
	t.Helper()
	ctx := context.Background()
	if err := c.Delete(ctx, act); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete %s: %v", act.Name, err)
		return
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := c.Get(ctx, client.ObjectKeyFromObject(act), &iteronv1.ImplementationActivation{})
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("activation %s was not released by its finalizer: %v", act.Name, err)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// WaitFor polls an activation until cond holds.
func WaitFor(t testing.TB, c client.Client, act *iteronv1.ImplementationActivation, what string, cond func(*iteronv1.ImplementationActivation) bool) *iteronv1.ImplementationActivation {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	var got iteronv1.ImplementationActivation
	for {
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(act), &got); err != nil {
			t.Fatal(err)
		}
		if cond(&got) {
			return &got
		}
		if time.Now().After(deadline) {
			b, _ := json.MarshalIndent(got.Status, "", "  ")
			t.Fatalf("%s never became %s; status:\n%s", act.Name, what, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// WaitGeneration polls a Generation until cond holds. On a timeout it also
// prints what each explain function returns (the manager's own view).
func WaitGeneration(t testing.TB, c client.Client, ns, name, what string, cond func(*iteronv1.Generation) bool, explain ...func() string) *iteronv1.Generation {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var g iteronv1.Generation
	for {
		err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &g)
		if err == nil && cond(&g) {
			return &g
		}
		if time.Now().After(deadline) {
			var more []string
			for _, e := range explain {
				more = append(more, e())
			}
			t.Fatalf("Generation %s never became %s (%v): %+v\n%s", name, what, err, g.Status, strings.Join(more, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// UpdateSpec edits an activation, retrying on conflicts.
func UpdateSpec(t testing.TB, c client.Client, act *iteronv1.ImplementationActivation, edit func(*iteronv1.ImplementationActivation)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur iteronv1.ImplementationActivation
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(act), &cur); err != nil {
			return err
		}
		edit(&cur)
		return c.Update(context.Background(), &cur)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Condition returns a condition of an activation, or nil.
func Condition(a *iteronv1.ImplementationActivation, typ string) *metav1.Condition {
	return meta.FindStatusCondition(a.Status.Conditions, typ)
}

// Ready: Ready=True, Reconciling=False, for the current spec.
func Ready(a *iteronv1.ImplementationActivation) bool {
	r, rec := Condition(a, iteronv1.ConditionReady), Condition(a, iteronv1.ConditionReconciling)
	return a.Status.ObservedGeneration == a.Generation && r != nil && r.Status == metav1.ConditionTrue && r.ObservedGeneration == a.Generation &&
		rec != nil && rec.Status == metav1.ConditionFalse
}

// Stalled: Stalled=True for the current spec.
func Stalled(a *iteronv1.ImplementationActivation) bool {
	s := Condition(a, iteronv1.ConditionStalled)
	return a.Status.ObservedGeneration == a.Generation && s != nil && s.Status == metav1.ConditionTrue && s.ObservedGeneration == a.Generation
}

// ModuleStatus is a module's entry in status.modules (zero when absent).
func ModuleStatus(a *iteronv1.ImplementationActivation, module string) iteronv1.ModuleStatus {
	for _, m := range a.Status.Modules {
		if m.Module == module {
			return m
		}
	}
	return iteronv1.ModuleStatus{}
}

// Suite is a test package's world: the local control plane, a providers
// dir (TMPDIR, so everything the tests build lands under the manager's
// allowed root), a state dir outside it (as the manager's flags require),
// the kubectl-iteron binary, an administrator kubeconfig, and the manager
// running in-process.
type Suite struct {
	// Env is the local control plane.
	Env *kubeapi.Environment
	// Base holds everything below; removed at the end.
	Base string
	// ProvidersDir is the allowed root and TMPDIR.
	ProvidersDir string
	// StateDir is the manager's state dir.
	StateDir string
	// CLI is the built kubectl-iteron.
	CLI string
	// Kubeconfig reaches the API server as an administrator.
	Kubeconfig string
	// Manager runs the controllers.
	Manager *Manager
}

// Run sets a Suite up for a test package (name appears in the log line
// that records the API server's version), hands it to ready, runs the
// tests, tears everything down and returns the exit code for os.Exit.
func Run(m *testing.M, name, node string, ready func(*Suite)) int {
	return RunWith(m, name, node, nil, ready)
}

// RunWith is Run with the manager's options edited first (a custom seam
// graph, the coordinator's AfterPhase hook); Node, StateDir and
// AllowedRoots are set already. edit may be nil.
func RunWith(m *testing.M, name, node string, edit func(*Options), ready func(*Suite)) int {
	s := &Suite{}
	var err error
	if s.Base, err = os.MkdirTemp("", "iteron-"+name+"-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(s.Base)
	s.ProvidersDir, s.StateDir = filepath.Join(s.Base, "providers"), filepath.Join(s.Base, "state")
	for _, d := range []string{s.ProvidersDir, s.StateDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	os.Setenv("TMPDIR", s.ProvidersDir)
	if s.Env, err = kubeapi.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "start the local control plane:", err)
		return 1
	}
	defer s.Env.Stop()
	fmt.Printf("%s tests run against kube-apiserver %s\n", name, s.Env.ServerVersion)
	if s.Kubeconfig, err = s.Env.Kubeconfig(s.Base); err != nil {
		fmt.Fprintln(os.Stderr, "write a kubeconfig:", err)
		return 1
	}
	s.CLI = filepath.Join(s.Base, "kubectl-iteron")
	if out, err := exec.Command("go", "build", "-o", s.CLI, filepath.Join(s.Env.RepoRoot, "cmd", "kubectl-iteron")).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build kubectl-iteron: %v\n%s", err, out)
		return 1
	}
	// The tests run the plugin built just now: a change to its sources must
	// rerun them, not answer from go test's cache.
	if err := artifacts.RecordSources(context.Background(), s.Env.RepoRoot, "./cmd/kubectl-iteron"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opts := Options{Node: node, StateDir: s.StateDir, AllowedRoots: []string{s.ProvidersDir}}
	if edit != nil {
		edit(&opts)
	}
	if s.Manager, err = StartManager(ctx, s.Env, opts); err != nil {
		fmt.Fprintln(os.Stderr, "start the manager:", err)
		return 1
	}
	ready(s)
	code := m.Run()
	cancel()
	s.Manager.Stop()
	return code
}
