package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/controllers/fleet"
)

// FleetOptions configure the fleet controller (cmd/manager --role=fleet):
// the ActivationSet controller alone, with leader election, and none of
// the node machinery.
type FleetOptions struct {
	// LeaderElection elects one leader among the replicas on a Lease.
	LeaderElection bool
	// LeaderElectionNamespace and LeaderElectionID name the Lease.
	LeaderElectionNamespace, LeaderElectionID string
	// Identity is this replica's name in the Lease (holderIdentity).
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod tune the election.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// MetricsBindAddress and HealthProbeBindAddress ("0" disables them).
	MetricsBindAddress, HealthProbeBindAddress string
	// Log is the controller's logger.
	Log logr.Logger
	// WrapReconciler, when set, wraps the ActivationSet reconciler (a test
	// hook: the scale test times each reconcile).
	WrapReconciler func(reconcile.Reconciler) reconcile.Reconciler
	// SkipControllerNameValidation lets a process build a fleet controller
	// more than once (a test hook: the scale test measures two rollouts,
	// each with a controller of its own).
	SkipControllerNameValidation bool
}

// FleetIdentity is the default holder identity of a replica: the pod's name
// (POD_NAME, from the downward API) or the host's, the pid, and a random
// suffix (a restarted process never reuses a live holder's identity).
func FleetIdentity() string {
	who := os.Getenv("POD_NAME")
	if who == "" {
		who, _ = os.Hostname()
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s_%d_%s", who, os.Getpid(), hex.EncodeToString(b[:]))
}

// Fleet is a built fleet controller.
type Fleet struct {
	// Manager is the controller-runtime manager.
	Manager ctrl.Manager
	// Identity is the replica's holder identity.
	Identity string
	log      logr.Logger
}

// NewFleet builds the fleet controller: a cache of ActivationSets,
// ImplementationActivations, the sets' ControllerRevisions and Nodes'
// metadata, the ActivationSet reconciler, and leader election on a Lease.
func NewFleet(cfg *rest.Config, o FleetOptions) (*Fleet, error) {
	scheme, err := newScheme()
	if err != nil {
		return nil, err
	}
	if o.Identity == "" {
		o.Identity = FleetIdentity()
	}
	ours, err := labels.NewRequirement(iteronv1.LabelActivationSet, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	opts := ctrl.Options{
		Scheme:                        scheme,
		Logger:                        o.Log,
		Metrics:                       metricsserver.Options{BindAddress: o.MetricsBindAddress},
		HealthProbeBindAddress:        o.HealthProbeBindAddress,
		LeaderElection:                o.LeaderElection,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &o.LeaseDuration,
		RenewDeadline:                 &o.RenewDeadline,
		RetryPeriod:                   &o.RetryPeriod,
		Controller:                    config.Controller{SkipNameValidation: ptr.To(o.SkipControllerNameValidation)},
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			// Only the sets' own revisions: a cluster's DaemonSets and
			// StatefulSets have many.
			&appsv1.ControllerRevision{}: {Label: labels.NewSelector().Add(*ours)},
		}},
	}
	if o.LeaderElection {
		cs, err := kubernetes.NewForConfig(rest.CopyConfig(cfg))
		if err != nil {
			return nil, err
		}
		lock, err := resourcelock.New(resourcelock.LeasesResourceLock, o.LeaderElectionNamespace, o.LeaderElectionID,
			cs.CoreV1(), cs.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: o.Identity})
		if err != nil {
			return nil, fmt.Errorf("leader election lock: %w", err)
		}
		opts.LeaderElectionResourceLockInterface = lock
	}
	mgr, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("create manager: %w", err)
	}
	r := &fleet.Reconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("iteron-fleet"), Wrap: o.WrapReconciler}
	if err := r.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up the ActivationSet controller: %w", err)
	}
	if err := mgr.Add(&leading{identity: o.Identity, log: o.Log.WithName("leader")}); err != nil {
		return nil, err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return nil, err
	}
	return &Fleet{Manager: mgr, Identity: o.Identity, log: o.Log}, nil
}

// Run runs the fleet controller until ctx ends (or, with leader election,
// until the lease is lost: the process then exits, which a fleet
// controller may; a node manager never runs this).
func (f *Fleet) Run(ctx context.Context) error {
	return f.Manager.Start(ctx)
}

// leading logs when this replica starts leading (it runs only on the
// leader).
type leading struct {
	identity string
	log      logr.Logger
}

func (l *leading) Start(ctx context.Context) error {
	l.log.Info("leading: this replica reconciles ActivationSets", "identity", l.identity, "pid", os.Getpid())
	<-ctx.Done()
	return nil
}

func (l *leading) NeedLeaderElection() bool { return true }
