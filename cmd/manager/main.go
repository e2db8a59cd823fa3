// Command manager is the iteron-operator manager: one per node, it reconciles
// the ImplementationActivations and Generations whose spec.nodeName is its
// --node-name and owns that node's provider processes. With --role=fleet it
// is the fleet controller instead (ActivationSets; see fleet.go).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"iteron.dev/operator/cmd/manager/app"
	"iteron.dev/operator/internal/hotswap"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// buildNote is set at link time (-ldflags "-X main.buildNote=…") to tell
// builds of the same source apart in the log (the upgrade tests build a
// second manager this way); empty in a release.
var buildNote string

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, stderr io.Writer) int {
	role, args, err := splitRole(args)
	if err != nil {
		fmt.Fprintln(stderr, "manager:", err)
		return exitUsage
	}
	if role == roleFleet {
		return runFleet(args, stderr)
	}
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
	flush, err := startTracing("iteron-manager", stderr)
	if err != nil {
		fmt.Fprintln(stderr, "manager:", err)
		return exitUsage
	}
	defer flush()

	lock, err := lockStateDir(opts.stateDir)
	if err != nil {
		fmt.Fprintln(stderr, "manager:", err)
		return exitFailure
	}
	defer lock.Release()

	var sv *app.SurvivorOptions
	if opts.survivorSocket != "" {
		sv = &app.SurvivorOptions{Socket: opts.survivorSocket, Lock: lock.f}
	}
	cfg, err := restConfig(opts.kubeconfig)
	if err != nil {
		fmt.Fprintln(stderr, "manager: kubeconfig:", err)
		return exitFailure
	}
	m, err := app.New(cfg, app.Options{
		NodeName: opts.nodeName, StateDir: opts.stateDir, AllowedRoots: opts.allowedRoots, Interpreters: opts.interpreters,
		ProviderUID: opts.providerUID, ProviderGID: opts.providerGID, CapabilityCeiling: opts.capabilityCeiling,
		Graph:              opts.graph,
		MetricsBindAddress: opts.metricsBindAddress, HealthProbeBindAddress: opts.healthProbeBindAddress,
		Gateway:    &app.GatewayOptions{Socket: opts.gatewaySocket, Group: opts.gatewayGroup, Allow: opts.gatewayAllow},
		Artifacts:  &opts.artifacts,
		AfterPhase: faultInjection(os.Getenv(faultKillAfterEnv)),
		Survivor:   sv,
		Log:        ctrl.Log,
		KubeAPIQPS: float32(opts.kubeAPIQPS), KubeAPIBurst: opts.kubeAPIBurst,
		MaxParallelActivations: opts.maxParallel,
		Sandbox:                opts.sandbox,
	})
	if err != nil {
		fmt.Fprintln(stderr, "manager:", err)
		return exitFailure
	}
	if len(m.Swept.Killed) > 0 || m.Swept.Stale > 0 {
		log.Info("swept provider groups left by an earlier manager", "killed", len(m.Swept.Killed), "stale", m.Swept.Stale)
	}
	if a := m.Attachment; a != nil {
		log.Info("attached to the survivor: its providers are re-attached as each activation is recovered", "instance", a.Instance, "session", a.Session, "processes", len(a.Processes), "outcomes", len(a.Outcomes))
	}
	if buildNote != "" {
		log.Info("build", "note", buildNote)
	}
	log.Info("starting", "node", opts.nodeName, "stateDir", opts.stateDir, "allowedRoots", opts.allowedRoots, "artifactStore", opts.artifacts.Store, "capabilityCeiling", opts.capabilityCeiling)
	if err := m.Run(ctrl.SetupSignalHandler()); err != nil {
		fmt.Fprintln(stderr, "manager:", err)
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

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return ctrl.GetConfig()
}
