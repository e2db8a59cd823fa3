package doctor_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/controllers"
	"iteron.dev/operator/internal/activation"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/test/kubeapi"
)

// The suite runs the real controllers in-process against a real
// kube-apiserver, as the manager's service account with the generated RBAC
// and the Generation admission policy, with real providers, and diagnoses
// the objects they write: with the doctor package directly, and with the
// kubectl-iteron binary built from this tree.
const (
	testNode    = "test-node"
	managerUser = "system:serviceaccount:iteron-system:iteron-manager"
)

var (
	env          *kubeapi.Environment
	stateDir     string
	providersDir string
	cliBin       string
	kubeconfig   string
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	base, err := os.MkdirTemp("", "iteron-doctor-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(base)
	// Provider artifacts (t.TempDir, the providers built for the tests) go
	// under the allowed root; the state dir lies outside it, as the
	// manager's flags require.
	providersDir, stateDir = filepath.Join(base, "providers"), filepath.Join(base, "state")
	for _, d := range []string{providersDir, stateDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	os.Setenv("TMPDIR", providersDir)

	if env, err = kubeapi.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "start the local control plane:", err)
		return 1
	}
	defer env.Stop()
	fmt.Printf("doctor tests run against kube-apiserver %s\n", env.ServerVersion)

	if kubeconfig, err = env.Kubeconfig(base); err != nil {
		fmt.Fprintln(os.Stderr, "write a kubeconfig:", err)
		return 1
	}
	cliBin = filepath.Join(base, "kubectl-iteron")
	if out, err := exec.Command("go", "build", "-o", cliBin, "../../cmd/kubectl-iteron").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build kubectl-iteron: %v\n%s", err, out)
		return 1
	}
	for _, f := range []string{"config/rbac/role.yaml", "config/rbac/role_binding.yaml", "config/admission/generation_writers.yaml"} {
		if err := applyFile(filepath.Join(env.RepoRoot, f)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop, err := startManager(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "start the manager:", err)
		return 1
	}
	code := m.Run()
	cancel()
	stop()
	return code
}

// startManager runs the controllers as the manager's service account, with
// the executor's process records under <stateDir>/procs as cmd/manager
// lays them out.
func startManager(ctx context.Context) (func(), error) {
	level := zapcore.ErrorLevel
	if os.Getenv("ITERON_TEST_VERBOSE") != "" {
		level = zapcore.DebugLevel
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(level)))
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: managerUser, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:iteron-system", "system:authenticated"}}
	ex, err := procexec.NewExecutor(procexec.DefaultConfig(filepath.Join(stateDir, "procs")))
	if err != nil {
		return nil, err
	}
	verifier, err := activation.NewVerifier(activation.Config{AllowedRoots: []string{providersDir}, Ceiling: []string{"read_only", "reversible_local"}})
	if err != nil {
		return nil, err
	}
	notifier := controllers.NewNotifier()
	coordinator, err := hotswap.New(hotswap.Config{StateDir: stateDir, Launch: hotswap.NewExecutorLauncher(ex), Notify: notifier.Notify, Log: ctrl.Log.WithName("coordinator")})
	if err != nil {
		return nil, err
	}
	onNode := cache.ByObject{Field: fields.OneTermEqualSelector("spec.nodeName", testNode)}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{&iteronv1.ImplementationActivation{}: onNode, &iteronv1.Generation{}: onNode}},
	})
	if err != nil {
		return nil, err
	}
	if err := mgr.Add(notifier); err != nil {
		return nil, err
	}
	act := &controllers.ActivationReconciler{
		Client: mgr.GetClient(), NodeName: testNode, Coordinator: coordinator, Resolve: controllers.NewResolver(verifier),
		Recorder: mgr.GetEventRecorder("iteron-manager"), Notifications: notifier.Activations(),
		Cleanup: func(_ context.Context, uid string) error {
			return hotswap.RemoveActivationState(stateDir, uid, time.Now())
		},
	}
	if err := act.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	gen := &controllers.GenerationReconciler{Client: mgr.GetClient(), Coordinator: coordinator, Notifications: notifier.Generations()}
	if err := gen.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	return func() {
		<-done
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = coordinator.Shutdown(sctx)
	}, nil
}

func applyFile(path string) error {
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
		if err := env.Client.Create(context.Background(), &u); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s: create %s %s: %w", path, u.GetKind(), u.GetName(), err)
		}
	}
}
