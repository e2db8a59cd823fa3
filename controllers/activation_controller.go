package controllers

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// +kubebuilder:rbac:groups=iteron.dev,resources=implementationactivations,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=iteron.dev,resources=implementationactivations/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=iteron.dev,resources=implementationactivations/finalizers,verbs=update
// +kubebuilder:rbac:groups=iteron.dev,resources=generations,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=iteron.dev,resources=generations/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch

// ActivationReconciler reconciles ImplementationActivations of this node.
type ActivationReconciler struct {
	// Client reads and writes objects (through the node-scoped cache).
	Client client.Client
}

// Reconcile sets Ready=Unknown with reason NotImplemented until the
// verification and coordinator layers land (issue 6).
func (r *ActivationReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var act iteronv1.ImplementationActivation
	if err := r.Client.Get(ctx, req.NamespacedName, &act); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	base := act.DeepCopy()
	act.Status.ObservedGeneration = act.Generation
	act.Status.ModuleCount = int32(len(act.Spec.Sources))
	meta.SetStatusCondition(&act.Status.Conditions, metav1.Condition{
		Type:               iteronv1.ConditionReady,
		Status:             metav1.ConditionUnknown,
		Reason:             iteronv1.ReasonNotImplemented,
		Message:            "the activation reconciler does not act yet",
		ObservedGeneration: act.Generation,
	})
	err := r.Client.Status().Patch(ctx, &act, client.MergeFrom(base))
	if apierrors.IsNotFound(err) {
		return ctrl.Result{}, nil
	}
	return ctrl.Result{}, err
}

// SetupWithManager registers the reconciler.
func (r *ActivationReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&iteronv1.ImplementationActivation{}).
		Named("implementationactivation").
		Complete(r)
}
