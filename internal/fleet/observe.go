package fleet

import (
	"strconv"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// Activation is what the plan needs of one ImplementationActivation.
type Activation struct {
	// Name and Node (spec.nodeName).
	Name, Node string
	// Owned: the set is its controller owner (the set stamped it).
	Owned bool
	// Deleting: it has a deletionTimestamp (its finalizer retires it).
	Deleting bool
	// Revision is its iteron.dev/revision label (a revision hash).
	Revision string
	// Wave is its iteron.dev/wave annotation.
	Wave int32
	// RevertedFrom is its iteron.dev/reverted-from annotation.
	RevertedFrom string
	// Spec is its spec (not copied; never written through).
	Spec *iteronv1.ImplementationActivationSpec
	// Ready: Ready=True and Reconciling=False for its current spec.
	Ready bool
	// Stalled, when set, is its Stalled=True condition for its current spec
	// (and a retry it was asked for was handled).
	Stalled *metav1.Condition
	// RetryPending: its iteron.dev/retry annotation is not handled yet.
	RetryPending bool
	// Retry is its iteron.dev/retry annotation.
	Retry string
}

// Observe reads an activation as the set with UID setUID sees it.
func Observe(act *iteronv1.ImplementationActivation, setUID types.UID) Activation {
	a := Activation{
		Name: act.Name, Node: act.Spec.NodeName, Spec: &act.Spec,
		Owned:        metav1.IsControlledBy(act, &metav1.ObjectMeta{UID: setUID}),
		Deleting:     !act.DeletionTimestamp.IsZero(),
		Revision:     act.Labels[iteronv1.LabelRevision],
		RevertedFrom: act.Annotations[iteronv1.AnnotationRevertedFrom],
		Retry:        act.Annotations[iteronv1.AnnotationRetry],
	}
	if w, err := strconv.ParseInt(act.Annotations[iteronv1.AnnotationWave], 10, 32); err == nil && w >= 0 {
		a.Wave = int32(w)
	}
	a.RetryPending = a.Retry != "" && a.Retry != act.Status.LastHandledRetryAt
	gen := act.Generation
	current := func(t string) *metav1.Condition {
		c := meta.FindStatusCondition(act.Status.Conditions, t)
		if c == nil || c.ObservedGeneration != gen || act.Status.ObservedGeneration != gen {
			return nil
		}
		return c
	}
	if r, rec := current(iteronv1.ConditionReady), current(iteronv1.ConditionReconciling); r != nil && r.Status == metav1.ConditionTrue &&
		rec != nil && rec.Status == metav1.ConditionFalse {
		a.Ready = true
	}
	if s := current(iteronv1.ConditionStalled); s != nil && s.Status == metav1.ConditionTrue && !a.RetryPending {
		a.Stalled = s
	}
	return a
}
