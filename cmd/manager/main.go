// Command manager is the iteron-operator manager: one per node, it reconciles
// the ImplementationActivations and Generations whose spec.nodeName is its
// --node-name and owns that node's provider processes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/controllers"
	"iteron.dev/operator/internal/activation"
	"iteron.dev/operator/internal/gateway"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/procexec"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, stderr io.Writer) int {
	opts, err := parseOptions(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "manager:", err)
		return exitUsage
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(stderr)))
	log := ctrl.Log.WithName("setup")

	lock, err := lockStateDir(opts.stateDir)
	if err != nil {
		fmt.Fprintln(stderr, "manager:", err)
		return exitFailure
	}
	defer lock.Release()

	cfg, err := restConfig(opts.kubeconfig)
	if err != nil {
		fmt.Fprintln(stderr, "manager: kubeconfig:", err)
		return exitFailure
	}
	exec, err := procexec.NewExecutor(procexec.Config{
		ProviderUID: opts.providerUID, ProviderGID: opts.providerGID,
		Interpreters: opts.interpreters, RecordDir: filepath.Join(opts.stateDir, "procs"),
	})
	if err != nil {
		fmt.Fprintln(stderr, "manager: process executor:", err)
		return exitFailure
	}
	// Provider groups an earlier manager left behind (it died without
	// stopping them) are killed before anything starts.
	sweep, err := exec.Sweep()
	if err != nil {
		fmt.Fprintln(stderr, "manager: sweep leftover providers:", err)
		return exitFailure
	}
	if len(sweep.Killed) > 0 || sweep.Stale > 0 {
		log.Info("swept provider groups left by an earlier manager", "killed", len(sweep.Killed), "stale", sweep.Stale)
	}
	verifier, err := activation.NewVerifier(activation.Config{AllowedRoots: opts.allowedRoots, Ceiling: opts.capabilityCeiling})
	if err != nil {
		fmt.Fprintln(stderr, "manager: verifier:", err)
		return exitFailure
	}
	notifier := controllers.NewNotifier()
	coord, err := hotswap.New(hotswap.Config{
		StateDir: opts.stateDir, Launch: hotswap.NewExecutorLauncher(exec),
		Notify: notifier.Notify, Log: ctrl.Log.WithName("coordinator"),
		AfterPhase: faultInjection(os.Getenv(faultKillAfterEnv)),
	})
	if err != nil {
		fmt.Fprintln(stderr, "manager: coordinator:", err)
		return exitFailure
	}
	// The gateway listens once the manager starts it, with the state-dir
	// lock held (a stale socket may only be replaced then).
	gw, err := gateway.New(gateway.Config{
		NodeName: opts.nodeName, Coordinator: coord, Allow: opts.gatewayAllow,
		Socket: opts.gatewaySocket, SocketGroup: opts.gatewayGroup, Log: ctrl.Log.WithName("gateway"),
	})
	if err != nil {
		fmt.Fprintln(stderr, "manager: gateway:", err)
		return exitFailure
	}
	mgr, err := newManager(cfg, opts, wiring{verifier: verifier, coordinator: coord, notifier: notifier, gateway: gw})
	if err != nil {
		fmt.Fprintln(stderr, "manager:", err)
		return exitFailure
	}
	log.Info("starting", "node", opts.nodeName, "stateDir", opts.stateDir, "allowedRoots", opts.allowedRoots, "capabilityCeiling", opts.capabilityCeiling)
	runErr := mgr.Start(ctrl.SetupSignalHandler())
	// Stop every provider before exiting (the termination grace period
	// bounds this; see config/manager).
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := coord.Shutdown(shutdownCtx); err != nil {
		log.Error(err, "stopping providers")
	}
	if runErr != nil {
		fmt.Fprintln(stderr, "manager:", runErr)
		return exitFailure
	}
	return exitOK
}

// faultKillAfterEnv names the fault-injection point of the crash tests:
// "<module>:<phase>[:<n>]" makes the manager SIGKILL itself right after the
// n-th (default first) durable ledger record of that phase for that module,
// as a node crash would. Unset in production; the manager logs loudly when
// it is set.
const faultKillAfterEnv = "ITERON_FAULT_KILL_AFTER"

// faultInjection returns the coordinator's AfterPhase hook for spec, or nil.
func faultInjection(spec string) func(hotswap.ActivationKey, string, string) {
	if spec == "" {
		return nil
	}
	point, nth := spec, 1
	if i := strings.LastIndex(spec, ":"); i > 0 && strings.Count(spec, ":") == 2 {
		if n, err := strconv.Atoi(spec[i+1:]); err == nil && n > 0 {
			point, nth = spec[:i], n
		}
	}
	ctrl.Log.WithName("setup").Info("FAULT INJECTION ENABLED: the manager kills itself after a phase", "env", faultKillAfterEnv, "point", point, "occurrence", nth)
	var mu sync.Mutex
	seen := 0
	return func(_ hotswap.ActivationKey, module, phase string) {
		if module+":"+phase != point {
			return
		}
		mu.Lock()
		seen++
		fire := seen == nth
		mu.Unlock()
		if fire {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // never return: the record after this one must not be written
		}
	}
}

// shutdownTimeout bounds stopping every provider after SIGTERM; it stays
// under the DaemonSet's terminationGracePeriodSeconds (60).
const shutdownTimeout = 45 * time.Second

// wiring is what the controllers are built from.
type wiring struct {
	verifier    *activation.Verifier
	coordinator *hotswap.Coordinator
	notifier    *controllers.Notifier
	// gateway, when set, is run as a Runnable (stopped before the
	// coordinator shuts down).
	gateway *gateway.Server
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return ctrl.GetConfig()
}

// newScheme knows the built-in types and this repository's API.
func newScheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := iteronv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return scheme, nil
}

// newManager builds the controller-runtime manager with its cache scoped to
// this node: both kinds are watched through the spec.nodeName selectable
// field, so a manager never sees another node's objects. There is no leader
// election across nodes; the state-dir flock fences managers on one node.
func newManager(cfg *rest.Config, opts *options, w wiring) (ctrl.Manager, error) {
	scheme, err := newScheme()
	if err != nil {
		return nil, err
	}
	onThisNode := cache.ByObject{Field: fields.OneTermEqualSelector("spec.nodeName", opts.nodeName)}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: opts.metricsBindAddress},
		HealthProbeBindAddress: opts.healthProbeBindAddress,
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&iteronv1.ImplementationActivation{}: onThisNode,
			&iteronv1.Generation{}:               onThisNode,
		}},
	})
	if err != nil {
		return nil, fmt.Errorf("create manager: %w", err)
	}
	if err := mgr.Add(w.notifier); err != nil {
		return nil, err
	}
	for _, c := range append(hotswap.Collectors(), gateway.Collectors()...) {
		if err := metrics.Registry.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	stateDir := opts.stateDir
	if err := mgr.Add(&controllers.LedgerJanitor{Client: mgr.GetClient(), Cache: mgr.GetCache(), StateDir: stateDir, Log: ctrl.Log.WithName("ledger-janitor")}); err != nil {
		return nil, err
	}
	activations := &controllers.ActivationReconciler{
		Client: mgr.GetClient(), NodeName: opts.nodeName, Coordinator: w.coordinator,
		Resolve:       controllers.NewResolver(w.verifier),
		Recorder:      mgr.GetEventRecorder("iteron-manager"),
		Notifications: w.notifier.Activations(),
		Cleanup: func(_ context.Context, uid string) error {
			return hotswap.RemoveActivationState(stateDir, uid, time.Now())
		},
	}
	if err := activations.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up the activation controller: %w", err)
	}
	generations := &controllers.GenerationReconciler{Client: mgr.GetClient(), Coordinator: w.coordinator, Notifications: w.notifier.Generations()}
	if err := generations.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up the generation controller: %w", err)
	}
	if w.gateway != nil {
		if err := mgr.Add(w.gateway); err != nil {
			return nil, fmt.Errorf("add the gateway: %w", err)
		}
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return nil, err
	}
	return mgr, nil
}
