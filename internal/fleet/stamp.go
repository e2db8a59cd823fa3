package fleet

import (
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// NewActivation is the activation a Create action stamps: the revision's
// template with the node's name, the set's labels, the wave, and the set as
// its controller owner.
func NewActivation(set *iteronv1.ActivationSet, a Action) *iteronv1.ImplementationActivation {
	act := &iteronv1.ImplementationActivation{
		ObjectMeta: metav1.ObjectMeta{
			Name:      a.Activation,
			Namespace: set.Namespace,
			OwnerReferences: []metav1.OwnerReference{
				*metav1.NewControllerRef(set, iteronv1.GroupVersion.WithKind("ActivationSet")),
			},
		},
	}
	Apply(act, set, a)
	return act
}

// Apply changes act as a Create, Move, Restore or Retry action says (the
// update the reconciler then writes, in one request). A stamp given a
// traceparent writes it in the same request (a trace costs no write of
// its own); one given none leaves the annotation as it is, so that a
// controller that does not trace neither writes nor removes it.
func Apply(act *iteronv1.ImplementationActivation, set *iteronv1.ActivationSet, a Action) {
	if act.Annotations == nil {
		act.Annotations = map[string]string{}
	}
	if a.Kind == Retry {
		act.Annotations[iteronv1.AnnotationRetry] = a.Retry
		return
	}
	if act.Labels == nil {
		act.Labels = map[string]string{}
	}
	act.Labels[iteronv1.LabelActivationSet] = set.Name
	if len(validation.IsValidLabelValue(a.Node)) == 0 {
		act.Labels[iteronv1.LabelNode] = a.Node
	}
	act.Labels[iteronv1.LabelRevision] = a.Revision.Hash
	act.Annotations[iteronv1.AnnotationWave] = strconv.Itoa(int(a.Wave))
	if a.Traceparent != "" {
		act.Annotations[iteronv1.AnnotationTraceparent] = a.Traceparent
	}
	if a.RevertedFrom != "" {
		act.Annotations[iteronv1.AnnotationRevertedFrom] = a.RevertedFrom
	} else {
		delete(act.Annotations, iteronv1.AnnotationRevertedFrom)
	}
	act.Spec = StampSpec(a.Revision.Template, a.Node, a.Discard)
}
