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

// GenerationReconciler mirrors the coordinator's state into Generation status.
type GenerationReconciler struct {
	// Client reads and writes objects (through the node-scoped cache).
	Client client.Client
}

// Reconcile sets Ready=Unknown with reason NotImplemented until the
// coordinator lands (issue 6).
func (r *GenerationReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var gen iteronv1.Generation
	if err := r.Client.Get(ctx, req.NamespacedName, &gen); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	base := gen.DeepCopy()
	gen.Status.ObservedGeneration = gen.Generation
	meta.SetStatusCondition(&gen.Status.Conditions, metav1.Condition{
		Type:               iteronv1.ConditionReady,
		Status:             metav1.ConditionUnknown,
		Reason:             iteronv1.ReasonNotImplemented,
		Message:            "the generation reconciler does not act yet",
		ObservedGeneration: gen.Generation,
	})
	err := r.Client.Status().Patch(ctx, &gen, client.MergeFrom(base))
	if apierrors.IsNotFound(err) {
		return ctrl.Result{}, nil
	}
	return ctrl.Result{}, err
}

// SetupWithManager registers the reconciler.
func (r *GenerationReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&iteronv1.Generation{}).
		Named("generation").
		Complete(r)
}
