// Command manager is the iteron-operator manager: one per node, it reconciles
// the ImplementationActivations and Generations whose spec.nodeName is its
// --node-name and owns that node's provider processes.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

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
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/controllers"
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
	mgr, err := newManager(cfg, opts)
	if err != nil {
		fmt.Fprintln(stderr, "manager:", err)
		return exitFailure
	}
	log.Info("starting", "node", opts.nodeName, "stateDir", opts.stateDir, "allowedRoots", opts.allowedRoots, "capabilityCeiling", opts.capabilityCeiling)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		fmt.Fprintln(stderr, "manager:", err)
		return exitFailure
	}
	return exitOK
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
func newManager(cfg *rest.Config, opts *options) (ctrl.Manager, error) {
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
	if err := (&controllers.ActivationReconciler{Client: mgr.GetClient()}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up the activation controller: %w", err)
	}
	if err := (&controllers.GenerationReconciler{Client: mgr.GetClient()}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up the generation controller: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return nil, err
	}
	return mgr, nil
}
