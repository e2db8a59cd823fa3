package fleet

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

const (
	tpOld = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	tpNew = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
)

// TestApplyWritesTheTraceparentItIsGivenAndLeavesOneItIsNotGiven: the
// traceparent rides in the stamp's own update; a controller that does not
// trace (no traceparent) neither writes nor removes one.
func TestApplyWritesTheTraceparentItIsGivenAndLeavesOneItIsNotGiven(t *testing.T) {
	w := newWorld(1, canary(1, 0))
	set := w.set
	rev := w.revs["v2"]
	for _, c := range []struct {
		name     string
		existing map[string]string
		action   Action
		want     string // "" : no annotation
	}{
		{"a move given a traceparent writes it", nil,
			Action{Kind: Move, Node: "node-1", Activation: "a", Revision: &rev, Wave: 1, Traceparent: tpNew}, tpNew},
		{"a move given a traceparent replaces the one of an earlier rollout", map[string]string{iteronv1.AnnotationTraceparent: tpOld},
			Action{Kind: Move, Node: "node-1", Activation: "a", Revision: &rev, Wave: 2, Traceparent: tpNew}, tpNew},
		{"a move given none leaves the one there", map[string]string{iteronv1.AnnotationTraceparent: tpOld},
			Action{Kind: Move, Node: "node-1", Activation: "a", Revision: &rev, Wave: 2}, tpOld},
		{"a move given none writes none", nil,
			Action{Kind: Move, Node: "node-1", Activation: "a", Revision: &rev, Wave: 2}, ""},
		{"a restore given a traceparent writes it", map[string]string{iteronv1.AnnotationTraceparent: tpOld},
			Action{Kind: Restore, Node: "node-1", Activation: "a", Revision: &rev, Traceparent: tpNew}, tpNew},
		{"a restore given none leaves the one there", map[string]string{iteronv1.AnnotationTraceparent: tpOld},
			Action{Kind: Restore, Node: "node-1", Activation: "a", Revision: &rev}, tpOld},
		{"a retry leaves the one there", map[string]string{iteronv1.AnnotationTraceparent: tpOld},
			Action{Kind: Retry, Node: "node-1", Activation: "a", Retry: "2026-12-01T12:00:00Z"}, tpOld},
	} {
		t.Run(c.name, func(t *testing.T) {
			act := &iteronv1.ImplementationActivation{ObjectMeta: metav1.ObjectMeta{Name: "a", Annotations: c.existing}}
			Apply(act, set, c.action)
			got, ok := act.Annotations[iteronv1.AnnotationTraceparent]
			if got != c.want || ok != (c.want != "") {
				t.Errorf("iteron.dev/traceparent = %q (present %v); want %q", got, ok, c.want)
			}
		})
	}
	t.Run("a create given a traceparent stamps it with the rest", func(t *testing.T) {
		act := NewActivation(set, Action{Kind: Create, Node: "node-1", Activation: "a", Revision: &rev, Traceparent: tpNew})
		if got := act.Annotations[iteronv1.AnnotationTraceparent]; got != tpNew || act.Labels[iteronv1.LabelRevision] != rev.Hash {
			t.Errorf("annotations %v labels %v; want the traceparent %s with revision %s", act.Annotations, act.Labels, tpNew, rev.Hash)
		}
	})
}
