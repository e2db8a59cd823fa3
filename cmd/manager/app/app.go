// Package app builds the iteron-operator manager: the process executor, the
// verifier, the node-local coordinator, the gateway, both controllers and
// the start-up recovery, wired into one controller-runtime manager whose
// cache is scoped to one node. cmd/manager runs it from flags; the test
// suites run the very same construction in-process, so tests run what users
// run.
package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/controllers"
	"iteron.dev/operator/internal/artifacts"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/internal/fleet/probe"
	"iteron.dev/operator/internal/gateway"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/pkgruntime"
	"iteron.dev/operator/internal/procexec"
	"iteron.dev/operator/internal/providers"
	"iteron.dev/operator/internal/sandbox"
	"iteron.dev/operator/internal/sandbox/cgroups"
	"iteron.dev/operator/internal/statedir"
	"iteron.dev/operator/internal/survivor"
	"iteron.dev/operator/internal/verifier"
)

// Options configure a manager. cmd/manager fills them from its flags.
type Options struct {
	// NodeName is the node whose activations this manager runs.
	NodeName string
	// StateDir holds ledgers, snapshots and process records; the caller
	// holds its lock.
	StateDir string
	// AllowedRoots are the directories catalogs and artifact roots must lie
	// under.
	AllowedRoots []string
	// Interpreters a '#!' provider may name.
	Interpreters []string
	// ProviderUID and ProviderGID run the providers.
	ProviderUID, ProviderGID uint32
	// CapabilityCeiling is what this node admits at most.
	CapabilityCeiling []string
	// Graph is the node's custom seam graph (--graph); nil: the built-in
	// graph.
	Graph *catalog.SeamGraph
	// MetricsBindAddress and HealthProbeBindAddress ("0" disables them).
	MetricsBindAddress, HealthProbeBindAddress string
	// Gateway, when set, serves the node-local gateway.
	Gateway *GatewayOptions
	// Artifacts configure OCI sources; nil takes the defaults.
	Artifacts *ArtifactOptions
	// AfterPhase is the coordinator's test hook (fault injection).
	AfterPhase func(key hotswap.ActivationKey, module, phase string)
	// Survivor, when set, leaves the provider processes to the node's
	// survivor (docs/survivor.md): they outlive this manager, which
	// re-attaches to them at start, and the gateway serves the listening
	// socket the survivor holds. Without it the manager owns its providers.
	Survivor *SurvivorOptions
	// Log is the manager's logger.
	Log logr.Logger
	// KubeAPIQPS and KubeAPIBurst bound the manager's API client
	// (DefaultKubeAPIQPS and DefaultKubeAPIBurst when 0).
	KubeAPIQPS   float32
	KubeAPIBurst int
	// MaxParallelActivations bounds how many provider processes of one
	// activation start (or stop) together (hotswap.Config; 0: the CPU
	// count).
	MaxParallelActivations int
	// Sandbox, when set, starts every provider this manager launches (its
	// own, and its package runtimes) in a sandbox (docs/security.md); nil
	// starts them with the launch guarantees only (tests that are not
	// about the sandbox).
	Sandbox *SandboxOptions
}

// SandboxOptions configure the providers' sandbox (--sandbox and the
// --sandbox-* flags).
type SandboxOptions struct {
	// Policy is the node's policy.
	Policy sandbox.Policy
	// Launcher is the iteron-sandbox executable.
	Launcher string
	// Cgroups, when set, is where the providers' cgroups go (tests put
	// them below a cgroup of their own); nil: this process's own.
	Cgroups *cgroups.Layout
}

// The manager's API client limits. client-go's defaults (5 QPS, burst 10;
// controller-runtime raises them to 20 and 30) throttled a node's manager:
// one 28-module activation costs about a hundred requests (a Generation
// created and its status written per module, the activation's own status),
// so at 20 per second it took seconds that were spent waiting in the
// client, with the CPU idle. These let a whole activation through at once
// and keep a busy node (hundreds of providers) well under what one
// kube-apiserver serves; the API server's priority and fairness still
// protects it.
const (
	DefaultKubeAPIQPS   = 100
	DefaultKubeAPIBurst = 200
)

// GatewayOptions configure the gateway.
type GatewayOptions struct {
	// Socket is the unix socket path.
	Socket string
	// Group owns the socket (mode 0660).
	Group int
	// Allow maps callers to namespaces.
	Allow gateway.Allow
}

// SurvivorOptions say where the node's survivor is.
type SurvivorOptions struct {
	// Socket is its control socket (<state-dir>/survivor.sock).
	Socket string
	// Lock is this manager's state-dir lock, held (the fence proof).
	Lock *os.File
	// AttachTimeout bounds waiting for the survivor at start (default 2
	// minutes: on a fresh node both start together).
	AttachTimeout time.Duration
}

// Manager is a built manager.
type Manager struct {
	// Coordinator is the node-local coordinator.
	Coordinator *hotswap.Coordinator
	// Manager is the controller-runtime manager.
	Manager ctrl.Manager
	// Swept reports the provider groups an earlier manager left behind and
	// that were killed before anything started.
	Swept procexec.SweepReport
	// Attachment is what the survivor held when this manager attached
	// (nil without a survivor).
	Attachment *survivor.Attachment
	// Gateway is the gateway (nil without one).
	Gateway  *gateway.Server
	sandbox  *sandbox.Sandbox
	log      logr.Logger
	client   *survivor.Client
	arts     *lazyArtifacts
	gcClient client.Reader
}

// CollectArtifacts runs one artifact collection now (tests; the manager runs
// one every --artifact-gc-interval).
func (m *Manager) CollectArtifacts(ctx context.Context) (artifacts.GCReport, error) {
	return (&artifactGC{a: m.arts, c: m.gcClient, log: m.log}).collect(ctx)
}

// ArtifactKeepSet is what a collection keeps now; recent adds the sources
// resolved within the grace period (tests collect without it to see the
// rule alone).
func (m *Manager) ArtifactKeepSet(ctx context.Context, recent bool) (map[string]bool, error) {
	return (&artifactGC{a: m.arts, c: m.gcClient, log: m.log}).keepSet(ctx, recent)
}

// ArtifactStore is the artifact store, once something was pulled (nil before).
func (m *Manager) ArtifactStore() *artifacts.Store {
	if r := m.arts.opened(); r != nil {
		return r.Store()
	}
	return nil
}

// ShutdownTimeout bounds stopping every provider after the manager stops;
// it stays under the DaemonSet's terminationGracePeriodSeconds (60).
const ShutdownTimeout = 45 * time.Second

// New builds a manager. Provider groups an earlier manager of this state
// dir left behind are killed first.
func New(cfg *rest.Config, o Options) (*Manager, error) {
	log := o.Log
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = DefaultKubeAPIQPS, DefaultKubeAPIBurst
	if o.KubeAPIQPS > 0 {
		cfg.QPS = o.KubeAPIQPS
	}
	if o.KubeAPIBurst > 0 {
		cfg.Burst = o.KubeAPIBurst
	}
	var (
		sweep procexec.SweepReport
		hcfg  = hotswap.Config{StateDir: o.StateDir, Log: log.WithName("coordinator"), AfterPhase: o.AfterPhase, RecoverAtStart: true,
			MaxParallelActivations: o.MaxParallelActivations}
		sv     *attached
		result = &Manager{log: log}
	)
	var sb *sandbox.Sandbox
	if o.Sandbox != nil {
		var err error
		if sb, err = NewSandbox(*o.Sandbox, o.StateDir, log.WithName("sandbox")); err != nil {
			return nil, err
		}
		result.sandbox = sb
	}
	if o.Survivor != nil {
		var err error
		if sv, err = attachSurvivor(o, log.WithName("survivor")); err != nil {
			sb.Close()
			return nil, err
		}
		hcfg.Owner = sv.owner
		result.Attachment, result.client = sv.att, sv.client
	} else {
		// The sealed copies of executables are kept (as the survivor keeps
		// them): without the cache every launch copied and hashed its
		// executable again, the largest cost of activating many modules.
		exec, err := procexec.NewExecutor(procexec.Config{
			ProviderUID: o.ProviderUID, ProviderGID: o.ProviderGID,
			Interpreters: o.Interpreters, RecordDir: statedir.Dir(o.StateDir).ProcessRecords(),
			ExecutableCacheBytes: procexec.DefaultExecutableCacheBytes, Sandbox: sb,
		})
		if err != nil {
			return nil, fmt.Errorf("process executor: %w", err)
		}
		if sweep, err = exec.Sweep(); err != nil {
			return nil, fmt.Errorf("sweep leftover providers: %w", err)
		}
		hcfg.Launch = providers.NewExecutorLauncher(exec)
	}
	// Package runtimes are launched and owned by this manager in both
	// modes (a survivor does not hold them yet): their groups die with it
	// and the next manager sweeps what is left and relaunches them.
	runtimes, err := pkgruntime.NewLauncher(pkgruntime.LaunchConfig{
		ProviderUID: o.ProviderUID, ProviderGID: o.ProviderGID, Interpreters: o.Interpreters,
		RecordDir: statedir.Dir(o.StateDir).RuntimeRecords(), SocketDir: statedir.Dir(o.StateDir).RuntimeSockets(),
		SealCacheBytes: procexec.DefaultExecutableCacheBytes, Sandbox: sb,
	})
	if err != nil {
		return nil, fmt.Errorf("package-runtime launcher: %w", err)
	}
	runtimeSweep, err := runtimes.Sweep()
	if err != nil {
		return nil, fmt.Errorf("sweep leftover package runtimes: %w", err)
	}
	sweep.Killed = append(sweep.Killed, runtimeSweep.Killed...)
	line := hcfg.Launch
	if line == nil {
		line = sv.owner.Launch
	}
	hcfg.Launch = providers.WithPackageRuntimes(line, runtimes)
	ao := ArtifactOptions{Store: artifacts.DefaultStore}
	if o.Artifacts != nil {
		ao = *o.Artifacts
	}
	arts := &lazyArtifacts{o: ao, log: log.WithName("artifacts")}
	hcfg.Pulled = arts.pulled
	verify, err := verifier.NewVerifier(verifier.Config{AllowedRoots: o.AllowedRoots, Ceiling: o.CapabilityCeiling, Graph: o.Graph, Artifacts: arts})
	if err != nil {
		return nil, fmt.Errorf("verifier: %w", err)
	}
	notifier := controllers.NewNotifier()
	hcfg.Notify = notifier.Notify
	coord, err := hotswap.New(hcfg)
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	if sv != nil {
		sv.coord.Store(coord)
	}
	scheme, err := newScheme()
	if err != nil {
		return nil, err
	}
	onThisNode := cache.ByObject{Field: fields.OneTermEqualSelector("spec.nodeName", o.NodeName)}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Logger:                 log,
		Metrics:                metricsserver.Options{BindAddress: o.MetricsBindAddress},
		HealthProbeBindAddress: o.HealthProbeBindAddress,
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&iteronv1.ImplementationActivation{}: onThisNode,
			&iteronv1.Generation{}:               onThisNode,
		}},
	})
	if err != nil {
		return nil, fmt.Errorf("create manager: %w", err)
	}
	if err := mgr.Add(notifier); err != nil {
		return nil, err
	}
	if err := registerMetrics(); err != nil {
		return nil, err
	}
	if err := mgr.Add(&controllers.StartupRecovery{Client: mgr.GetClient(), Cache: mgr.GetCache(), Coordinator: coord, Log: log.WithName("startup")}); err != nil {
		return nil, err
	}
	// The activation controller plans Generations; the generation
	// controller creates them.
	records := controllers.NewGenerationRecords()
	activations := &controllers.ActivationReconciler{
		Client: mgr.GetClient(), NodeName: o.NodeName, Coordinator: coord, Records: records,
		Resolve:       controllers.NewResolver(verify),
		Recorder:      mgr.GetEventRecorder("iteron-manager"),
		Notifications: notifier.Activations(),
		APIReader:     mgr.GetAPIReader(),
		// Probes call the modules through this node's own dispatchers.
		Probe: func(namespace, name string) probe.Invoke { return probe.Dispatch(coord.Lookup, namespace, name) },
	}
	if err := activations.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up the activation controller: %w", err)
	}
	if err := mgr.Add(&artifactGC{a: arts, c: mgr.GetClient(), interval: ao.GCInterval, log: log.WithName("artifact-gc")}); err != nil {
		return nil, err
	}
	generations := &controllers.GenerationReconciler{
		Client: mgr.GetClient(), Coordinator: coord, Notifications: notifier.Generations(), Mirrored: notifier.Mirrored,
		Records: records, Recorded: coord.Recorded, Recorder: mgr.GetEventRecorder("iteron-manager"),
	}
	if err := generations.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up the generation controller: %w", err)
	}
	history := &controllers.GenerationHistoryReconciler{Client: mgr.GetClient(), NodeName: o.NodeName, Coordinator: coord, Recorder: mgr.GetEventRecorder("iteron-manager")}
	if err := history.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up the generation history controller: %w", err)
	}
	if g := o.Gateway; g != nil {
		// The gateway listens once the manager starts it, with the
		// state-dir lock held (a stale socket may only be replaced then).
		gcfg := gateway.Config{
			NodeName: o.NodeName, Coordinator: coord, Allow: g.Allow,
			Socket: g.Socket, SocketGroup: g.Group, Log: log.WithName("gateway"),
		}
		if sv != nil {
			// The survivor holds the socket; each manager serves a copy.
			gcfg.Handover, gcfg.InstanceID = sv.listeners, sv.client.Instance
		}
		gw, err := gateway.New(gcfg)
		if err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
		if sv != nil {
			ended, running := sv.outcomes.Start(gw, sv.att.Outcomes)
			log.Info("invocations kept by the survivor", "ended", ended, "running", running, "instanceID", sv.att.Instance)
		}
		if err := mgr.Add(gw); err != nil {
			return nil, fmt.Errorf("add the gateway: %w", err)
		}
		result.Gateway = gw
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return nil, err
	}
	result.Coordinator, result.Manager, result.Swept = coord, mgr, sweep
	result.arts, result.gcClient = arts, mgr.GetClient()
	return result, nil
}

// attached is this manager's survivor: its client, what it held, the
// coordinator's owner and the listeners it hands over.
type attached struct {
	client    *survivor.Client
	att       *survivor.Attachment
	owner     *providers.SurvivorOwner
	listeners chan net.Listener
	coord     atomic.Pointer[hotswap.Coordinator]
	outcomes  *gateway.OutcomeRelay
}

// attachSurvivor connects to the node's survivor and waits for its
// attachment.
func attachSurvivor(o Options, log logr.Logger) (*attached, error) {
	sv := &attached{listeners: make(chan net.Listener, 8), outcomes: gateway.NewOutcomeRelay(o.Gateway != nil)}
	client, err := survivor.NewClient(survivor.ClientConfig{
		Socket: o.Survivor.Socket, Lock: o.Survivor.Lock, Log: log,
		OnListener: func(f *os.File) {
			l, err := net.FileListener(f)
			f.Close()
			if err != nil {
				log.Error(err, "the gateway listener the survivor handed over is unusable")
				return
			}
			select {
			case sv.listeners <- l:
			default:
				l.Close()
			}
		},
		OnOutcome: sv.outcomes.Deliver,
		OnCheckpoint: func(ctx context.Context) {
			if c := sv.coord.Load(); c != nil {
				c.HoldForOwnerRestart(ctx)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("survivor: %w", err)
	}
	timeout := o.Survivor.AttachTimeout
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	log.Info("attaching to the node's survivor", "socket", o.Survivor.Socket)
	att, err := client.Attached(ctx)
	if err != nil {
		client.Close()
		return nil, err
	}
	sv.client, sv.att = client, att
	sv.owner = providers.NewSurvivorOwner(client, att, o.StateDir, log)
	return sv, nil
}

// Run runs the manager until ctx ends, then stops every provider (after
// checkpointing the Active protocol-2 generations) within ShutdownTimeout.
func (m *Manager) Run(ctx context.Context) error {
	runErr := m.Manager.Start(ctx)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	if err := m.Coordinator.Shutdown(shutdownCtx); err != nil {
		m.log.Error(err, "stopping providers")
	}
	if m.client != nil {
		// Detached: the survivor keeps the providers for the next manager.
		m.client.Close()
	}
	if err := m.sandbox.Close(); err != nil {
		m.log.Error(err, "removing the providers' cgroups")
	}
	return runErr
}

// Sandbox is what this manager's sandbox can apply (nil without one).
func (m *Manager) Sandbox() *sandbox.Capacity {
	if m.sandbox == nil {
		return nil
	}
	c := m.sandbox.Capacity()
	return &c
}

// NewSandbox builds the node's sandbox from its options: the launcher
// sealed, the cgroup subtree made, scratch directories under the state
// directory. Violations under --sandbox=audit are logged.
func NewSandbox(o SandboxOptions, stateDir string, log logr.Logger) (*sandbox.Sandbox, error) {
	sb, err := sandbox.New(sandbox.Config{
		Policy: o.Policy, Launcher: o.Launcher, ScratchDir: statedir.Dir(stateDir).Scratch(), Cgroups: o.Cgroups,
		Log: func(msg string, kv ...any) { log.Info(msg, kv...) },
	})
	if err != nil {
		return nil, err
	}
	c := sb.Capacity()
	log.Info("providers are sandboxed", "mode", c.Mode, "level", c.Level.String(), "cgroups", c.Cgroups, "cgroupsWhy", c.CgroupsWhy,
		"landlock", c.Landlock, "launcher", c.Launcher)
	return sb, nil
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

var metricsOnce sync.Once

// registerMetrics adds the coordinator's, gateway's, sandbox's and
// reconcilers' collectors to controller-runtime's registry, once per process
// (tests build several managers in one process).
func registerMetrics() error {
	var err error
	metricsOnce.Do(func() {
		for _, c := range slices.Concat(hotswap.Collectors(), gateway.Collectors(), sandbox.Collectors(), controllers.Collectors()) {
			if e := metrics.Registry.Register(c); e != nil {
				var already prometheus.AlreadyRegisteredError
				if !errors.As(e, &already) {
					err = fmt.Errorf("register metrics: %w", e)
				}
			}
		}
	})
	return err
}
