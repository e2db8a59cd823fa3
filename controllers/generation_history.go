package controllers

import (
	"context"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/hotswap"
)

// GenerationHistoryReconciler keeps at most spec.generationHistoryLimit
// Inactive or Failed Generations per module of each activation on this
// node, newest lineage and attempt first. The applied plan's targets, the
// active generations, the ledger's last committed ones and anything still
// in flight are never deleted. It runs when a Generation ends (its status
// shows Inactive or Failed) and when an activation's spec changes, apart
// from the activation reconciler: pruning history is not part of acting on
// a spec.
type GenerationHistoryReconciler struct {
	// Client reads and deletes objects (through the node-scoped cache).
	Client client.Client
	// NodeName is this manager's node.
	NodeName string
	// Coordinator says which generations are over before their objects'
	// status does, and which ones the applied plan asks for.
	Coordinator GenerationStatusSource
	// Recorder emits a GenerationPruned event on the activation per
	// Generation deleted.
	Recorder events.EventRecorder
}

// Reconcile prunes one activation's Generation history.
func (r *GenerationHistoryReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var act iteronv1.ImplementationActivation
	if err := r.Client.Get(ctx, req.NamespacedName, &act); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	// A paused activation changes nothing; one being deleted has its
	// Generations deleted by the activation reconciler.
	if act.Spec.NodeName != r.NodeName || act.Spec.Paused || !act.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	st, ok := r.Coordinator.Status(string(act.UID))
	if !ok || st.AppliedSpecGeneration == 0 {
		// Nothing applied yet (a restarted manager that has not replayed
		// the ledger): what the plan keeps is not known.
		return ctrl.Result{}, nil
	}
	gens, err := ownedGenerations(ctx, r.Client, &act)
	if err != nil {
		return ctrl.Result{}, apiRefusal("list Generations", err)
	}
	limit := int(ptr.Deref(act.Spec.GenerationHistoryLimit, 10))
	for _, g := range beyondHistoryLimit(gens, st, limit) {
		if err := r.Client.Delete(ctx, &g); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, apiRefusal("delete Generation "+g.Name+" beyond the history limit", err)
		}
		r.Recorder.Eventf(&act, &g, corev1.EventTypeNormal, "GenerationPruned", "Prune", "module %s: %s (%s) is beyond generationHistoryLimit %d", g.Spec.Module, g.Name, g.Status.Phase, limit)
	}
	return ctrl.Result{}, nil
}

// beyondHistoryLimit are the Generations to delete: per module, the ended
// ones (Inactive or Failed, by the coordinator when it knows them) that no
// one keeps, past the newest limit of them.
func beyondHistoryLimit(gens []iteronv1.Generation, st hotswap.ActivationStatus, limit int) []iteronv1.Generation {
	keep := map[string]bool{}
	for _, name := range st.Targets {
		keep[name] = true
	}
	for _, ms := range st.Modules {
		keep[ms.Active] = true
		if ms.Committed != nil {
			keep[ms.Committed.Name] = true
		}
	}
	byModule := map[string][]iteronv1.Generation{}
	for _, g := range gens {
		// The coordinator knows a generation is over before its object's
		// status says so (the mirror is asynchronous).
		phase := g.Status.Phase
		if gs, ok := st.Generations[g.Name]; ok {
			phase = gs.Phase
		}
		done := phase == iteronv1.PhaseInactive || phase == iteronv1.PhaseFailed
		if done && !keep[g.Name] {
			byModule[g.Spec.Module] = append(byModule[g.Spec.Module], g)
		}
	}
	var out []iteronv1.Generation
	for _, module := range slices.Sorted(maps.Keys(byModule)) {
		old := byModule[module]
		slices.SortFunc(old, func(a, b iteronv1.Generation) int {
			if a.Spec.Generation != b.Spec.Generation {
				return int(b.Spec.Generation - a.Spec.Generation)
			}
			return int(b.Spec.Attempt - a.Spec.Attempt)
		})
		out = append(out, old[min(limit, len(old)):]...)
	}
	return out
}

// SetupWithManager registers the reconciler: an activation's spec change
// (its limit) and a Generation that ended requeue the activation.
func (r *GenerationHistoryReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.Client, r.Recorder = countWrites(r.Client), countEvents(r.Recorder)
	ended := func(g *iteronv1.Generation) bool {
		return g.Status.Phase == iteronv1.PhaseInactive || g.Status.Phase == iteronv1.PhaseFailed
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&iteronv1.ImplementationActivation{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&iteronv1.Generation{},
			handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), &iteronv1.ImplementationActivation{}, handler.OnlyControllerOwner()),
			builder.WithPredicates(predicate.Funcs{
				CreateFunc: func(event.CreateEvent) bool { return false },
				UpdateFunc: func(e event.UpdateEvent) bool {
					o, okOld := e.ObjectOld.(*iteronv1.Generation)
					n, okNew := e.ObjectNew.(*iteronv1.Generation)
					return okOld && okNew && !ended(o) && ended(n)
				},
				DeleteFunc:  func(event.DeleteEvent) bool { return false },
				GenericFunc: func(event.GenericEvent) bool { return false },
			})).
		Named("generationhistory").
		Complete(r)
}
