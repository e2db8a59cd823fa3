package controllers

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/hotswap"
)

// +kubebuilder:rbac:groups=iteron.dev,resources=implementationactivations,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=iteron.dev,resources=implementationactivations/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=iteron.dev,resources=implementationactivations/finalizers,verbs=update
// +kubebuilder:rbac:groups=iteron.dev,resources=generations,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=iteron.dev,resources=generations/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch

// Coordinator is what the activation controller needs of the node-local
// coordinator (internal/hotswap.Coordinator).
type Coordinator interface {
	Prepare(hotswap.ActivationKey, *hotswap.Anchor) error
	Apply(hotswap.Desired) error
	Remove(hotswap.ActivationKey) (bool, error)
	Forget(uid string) error
	Status(uid string) (hotswap.ActivationStatus, bool)
}

// ActivationReconciler reconciles the ImplementationActivations of this
// node: verify → graph → plan → desired Generations → Apply, and mirrors the
// coordinator's state into status.
type ActivationReconciler struct {
	// Client reads and writes objects (through the node-scoped cache).
	Client client.Client
	// NodeName is this manager's node.
	NodeName string
	// Coordinator runs the transactions.
	Coordinator Coordinator
	// Resolve verifies a spec and orders its modules.
	Resolve func(ctx context.Context, spec *iteronv1.ImplementationActivationSpec) Resolution
	// Recorder emits events.
	Recorder events.EventRecorder
	// Notifications requeues activations when the coordinator reports
	// progress.
	Notifications <-chan event.GenericEvent
	// Now is the clock (time.Now if nil).
	Now func() time.Time
	// Probe makes the Invoke of an activation's probes (nil: this manager
	// runs none, and an activation with probes is never Ready).
	Probe ProbeInvoker
	// APIReader reads a Generation past the cache when the cache shows it
	// behind the coordinator (nil: the cache is all there is).
	APIReader client.Reader
	// Records take the Generations a plan names to the generation
	// controller, which creates them.
	Records *GenerationRecords

	// verified keeps each activation's last resolution while its spec and
	// the files it read are unchanged (verification_cache.go).
	verified verificationCache
}

// Reconcile runs the activation's phases and patches its status once.
func (r *ActivationReconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	activationReconciles.Inc()
	var act iteronv1.ImplementationActivation
	if err := r.Client.Get(ctx, req.NamespacedName, &act); err != nil {
		if apierrors.IsNotFound(err) {
			r.verified.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if act.Spec.NodeName != r.NodeName {
		r.verified.forget(req.NamespacedName)
		// The cache is scoped to this node; an object that moved (nodeName
		// is immutable, but the API server is not the only way in) is not
		// ours to act on.
		return ctrl.Result{}, nil
	}
	s := &activationScope{act: &act, base: act.DeepCopy(), key: keyOf(&act)}
	defer func() {
		// One status write per reconcile, summarizing whatever happened —
		// a phase error included (CAPI's deferred patch, Flux's
		// summarize.WithReconcileError).
		if !s.deleted {
			r.summarize(s, retErr)
		}
		conflict, err := r.patchStatus(ctx, s)
		switch {
		case err != nil && retErr == nil:
			retErr = err
		case conflict && retErr == nil && (res.RequeueAfter == 0 || res.RequeueAfter > conflictRequeue):
			res = ctrl.Result{RequeueAfter: conflictRequeue}
		case retErr == nil && s.requeueAfter > 0 && (res.RequeueAfter == 0 || res.RequeueAfter > s.requeueAfter):
			res = ctrl.Result{RequeueAfter: s.requeueAfter}
		}
	}()

	if !act.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, s)
	}
	if !controllerutil.ContainsFinalizer(&act, iteronv1.FinalizerActivation) {
		patch := client.MergeFrom(act.DeepCopy())
		controllerutil.AddFinalizer(&act, iteronv1.FinalizerActivation)
		if err := r.Client.Patch(ctx, &act, patch); err != nil {
			return ctrl.Result{}, apiRefusal("add the finalizer", err)
		}
		s.base.Finalizers = act.Finalizers
		s.base.ResourceVersion = act.ResourceVersion
	}
	for _, phase := range []func(context.Context, *activationScope) error{
		r.reconcileResolve,
		r.reconcilePaused,
		r.reconcileGenerations,
		r.reconcileApply,
		r.reconcileMirror,
		r.reconcileProbes,
	} {
		if err := phase(ctx, s); err != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{}, nil
}

// reconcileDelete retires every module in drain order, reaps every process,
// deletes the Generation objects (a cluster without a garbage collector
// keeps them otherwise) and then removes the finalizer.
func (r *ActivationReconciler) reconcileDelete(ctx context.Context, s *activationScope) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(s.act, iteronv1.FinalizerActivation) {
		return ctrl.Result{}, nil
	}
	r.Records.forget(s.act.UID)
	unknown, err := r.Coordinator.Remove(s.key)
	if err != nil {
		return ctrl.Result{}, err
	}
	st, _ := r.Coordinator.Status(s.key.UID)
	s.status, s.haveStatus = st, true
	if !unknown && !st.Removed {
		s.requeueAfter = 5 * time.Second
		return ctrl.Result{}, nil
	}
	gens, err := r.ownedGenerations(ctx, s.act)
	if err != nil {
		return ctrl.Result{}, err
	}
	for i := range gens {
		if err := r.Client.Delete(ctx, &gens[i]); err != nil && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, apiRefusal("delete Generation "+gens[i].Name, err)
		}
	}
	// The coordinator archives the ledger and removes the snapshots: only
	// it changes the state dir.
	if err := r.Coordinator.Forget(s.key.UID); err != nil {
		return ctrl.Result{}, fmt.Errorf("forget activation %s: %w", s.key.UID, err)
	}
	patch := client.MergeFrom(s.act.DeepCopy())
	controllerutil.RemoveFinalizer(s.act, iteronv1.FinalizerActivation)
	s.deleted = true
	r.verified.forget(client.ObjectKeyFromObject(s.act))
	r.Recorder.Eventf(s.act, nil, corev1.EventTypeNormal, "Retired", "Retire", "every module retired, every process reaped, %d Generation objects deleted", len(gens))
	return ctrl.Result{}, client.IgnoreNotFound(r.Client.Patch(ctx, s.act, patch))
}

// SetupWithManager registers the reconciler; coordinator notifications
// requeue activations through a channel source.
func (r *ActivationReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Now == nil {
		r.Now = time.Now
	}
	// Every write and event of the reconciler is counted
	// (iteron_activation_api_writes_total).
	r.Client, r.Recorder = countWrites(r.Client), countEvents(r.Recorder)
	b := ctrl.NewControllerManagedBy(mgr).
		// What the reconciler acts on is the spec, its annotations
		// (retry, a requested reconcile), its labels (the revision) and
		// its deletion; a write of its own status or finalizer needs no
		// reconcile. What runs is reported by the coordinator's
		// notifications.
		For(&iteronv1.ImplementationActivation{}, builder.WithPredicates(predicate.Or[client.Object](
			predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}, predicate.LabelChangedPredicate{}, deletionStarted{}))).
		// A deleted Generation requeues its activation: an Active one is
		// re-created from what runs. A Generation's mirrored status
		// requeues nothing: the notifier requeues the activation once the
		// Generations the coordinator changed were mirrored.
		Owns(&iteronv1.Generation{}, builder.WithPredicates(predicate.Funcs{
			CreateFunc:  func(event.CreateEvent) bool { return false },
			UpdateFunc:  func(event.UpdateEvent) bool { return false },
			GenericFunc: func(event.GenericEvent) bool { return false },
		})).
		Named("implementationactivation")
	if r.Notifications != nil {
		b = b.WatchesRawSource(source.Channel(r.Notifications, &handler.EnqueueRequestForObject{}))
	}
	return b.Complete(r)
}

func keyOf(act *iteronv1.ImplementationActivation) hotswap.ActivationKey {
	return hotswap.ActivationKey{Namespace: act.Namespace, Name: act.Name, UID: string(act.UID)}
}

// deletionStarted passes the update that sets an object's
// deletionTimestamp (the API server bumps metadata.generation then too;
// this does not rely on it).
type deletionStarted struct{ predicate.Funcs }

// Update reports whether the update started the object's deletion.
func (deletionStarted) Update(e event.UpdateEvent) bool {
	return e.ObjectOld != nil && e.ObjectNew != nil && e.ObjectOld.GetDeletionTimestamp().IsZero() && !e.ObjectNew.GetDeletionTimestamp().IsZero()
}
