package crash

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
)

// TestAPausedActivationKeepsServingAcrossAManagerRestart pauses an
// activation (spec changes wait; running providers keep serving), restarts
// the manager and checks that what served before serves again — the
// ledger's last committed generation relaunched with its state — and that
// the status says so, not a stale "Active" while nothing runs.
func TestAPausedActivationKeepsServingAcrossAManagerRestart(t *testing.T) {
	n := newNode(t)
	m := n.start(t, "")
	a := newActivation(t, "paused-restart", nil, source(t, artifacts.CounterV2, "prompt_system", "counter-v2"))
	waitFor(t, a, "Ready with v2", readyWith("prompt_system", "counter-v2"))
	if c := n.mustCount(t, a, "a", 4); c != 4 {
		t.Fatalf("first call: a=%v", c)
	}
	patch := client.MergeFrom(a.DeepCopy())
	a.Spec.Paused = true
	if err := env.Client.Patch(context.Background(), a, patch); err != nil {
		t.Fatal(err)
	}
	waitFor(t, a, "paused, observed", func(got *iteronv1.ImplementationActivation) bool {
		r := meta.FindStatusCondition(got.Status.Conditions, iteronv1.ConditionReconciling)
		return got.Status.ObservedGeneration == got.Generation && r != nil && r.Reason == iteronv1.ReasonPaused
	})
	before := n.providerPids(t)
	// A clean stop checkpoints a=4; the next manager starts with nothing
	// running.
	if err := m.stop(t); err != nil {
		t.Fatalf("the manager's exit after SIGTERM: %v", err)
	}
	n.start(t, "")
	got := waitFor(t, a, "the module served again while paused", func(got *iteronv1.ImplementationActivation) bool {
		r := meta.FindStatusCondition(got.Status.Conditions, iteronv1.ConditionReady)
		return got.Spec.Paused && len(got.Status.Modules) == 1 && got.Status.Modules[0].Phase == iteronv1.PhaseActive &&
			r != nil && r.Status == metav1.ConditionTrue
	})
	if c := n.mustCount(t, got, "a", 1); c != 5 {
		t.Fatalf("after the restart, paused: a=%v; want 5 (the generation relaunched with its state)", c)
	}
	after := n.providerPids(t)
	if len(after) != 1 || len(before) != 1 || after[0] == before[0] {
		t.Fatalf("provider groups before %v, after %v: want one relaunched process", before, after)
	}
	t.Logf("paused across a restart: provider %v → %v, a=5, module %s %s", before, after, got.Status.Modules[0].GenerationName, got.Status.Modules[0].Phase)
	deleteActivation(t, got)
}
