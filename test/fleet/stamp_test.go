package fleet

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/internal/fleet"
	"iteron.dev/operator/test/fleettest"
)

// TestTheSetOwnsOnlyWhatItStampsAndAPausedSetMovesNoNode, through the API
// server and the managers:
//   - a hand edit of a stamped activation is set back to its revision (the
//     provider keeps running: the edit and its undoing change no source);
//   - an activation the set did not stamp, holding a selected node's
//     stamped name, is reported as a conflict and never changed;
//   - kubectl iteron rollout pause: a new template moves no node (Argo CD
//     reads Suspended) until kubectl iteron rollout resume.
func TestTheSetOwnsOnlyWhatItStampsAndAPausedSetMovesNoNode(t *testing.T) {
	const six = 6
	ctx := context.Background()
	v1 := source(t, artifacts.CounterV1Down, "counter-v1")
	v2 := source(t, artifacts.CounterV2, "counter-v2")
	key := newSet(t, "owns", template(v1), canary(0, iteronv1.FailurePolicyHalt))
	b := deployAndCount(t, key)

	// A hand edit is set back.
	edited := b.nodes[1].activation.DeepCopy()
	edited.Spec.GenerationHistoryLimit = ptr.To[int32](3)
	if err := env.Client.Update(ctx, edited); err != nil {
		t.Fatal(err)
	}
	waitActivation(t, key, 1, "set back to its revision", func(n node) bool {
		return n.activation.Generation > edited.Generation && ptr.Deref(n.activation.Spec.GenerationHistoryLimit, 0) == 10
	})
	n1 := nodeOf(t, key, 1)
	waitActivation(t, key, 1, "Ready after the edit and its undoing", readyNode)
	if n := nodeOf(t, key, 1); n.pid != b.nodes[1].pid || !processAlive(n.pid) {
		t.Errorf("fleet-1's provider pid %d → %d after a hand edit of generationHistoryLimit; want the same process", b.nodes[1].pid, n.pid)
	}
	t.Logf("fleet-1's activation edited by hand (generationHistoryLimit 10 → 3, generation %d) was set back (generation %d, generationHistoryLimit %d)",
		edited.Generation, n1.activation.Generation, ptr.Deref(n1.activation.Spec.GenerationHistoryLimit, 0))

	// An activation the set did not stamp, at fleet-6's stamped name.
	name := fleet.ActivationName(key.Name, nodeName(six))
	foreign := &iteronv1.ImplementationActivation{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"made-by": "hand"}},
		Spec:       iteronv1.ImplementationActivationSpec{NodeName: nodeName(six), CandidateSHA256: template(v1).CandidateSHA256, Sources: []iteronv1.ActivationSource{v1}},
	}
	if err := env.Client.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteActivation(t, client.ObjectKeyFromObject(foreign)) })
	t.Cleanup(func() { restoreNode(t, nodeName(six)) })
	fleettest.LabelNode(t, env.Client, nodeName(six), pool, "fleet")
	conflicted := waitSet(t, key, "reporting fleet-6's conflict", func(s *iteronv1.ActivationSet) bool {
		return s.Status.DesiredNodes == 6 && len(s.Status.Conflicts) == 1 && fleettest.Phase(iteronv1.RolloutCompleted)(s)
	})
	c := conflicted.Status.Conflicts[0]
	health, err := fleettest.SetHealth(env.RepoRoot, conflicted)
	t.Logf("conflict: node %s, activation %s, %s: %s; the set reads as %s (%v)", c.Node, c.Activation, c.Reason, c.Message, health, err)
	if c.Node != nodeName(six) || c.Activation != name || c.Reason != iteronv1.ConflictNotOwned {
		t.Errorf("status.conflicts[0] = %+v; want fleet-6's %s NotOwned", c, name)
	}
	if err != nil || health.Argo != "Degraded" {
		t.Errorf("a set with a node it cannot stamp reads as %s (%v); want Argo CD Degraded", health, err)
	}
	var got iteronv1.ImplementationActivation
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(foreign), &got); err != nil {
		t.Fatal(err)
	}
	if got.Generation != 1 || len(got.OwnerReferences) != 0 || got.Labels[iteronv1.LabelActivationSet] != "" || got.Labels["made-by"] != "hand" {
		t.Errorf("the set changed an activation it did not stamp: generation %d, owners %v, labels %v", got.Generation, got.OwnerReferences, got.Labels)
	}
	fleettest.LabelNode(t, env.Client, nodeName(six), pool, "")
	waitSet(t, key, "back to five nodes, no conflict", func(s *iteronv1.ActivationSet) bool {
		return s.Status.DesiredNodes == 5 && len(s.Status.Conflicts) == 0 && fleettest.Completed(s)
	})

	// Paused: a new template moves nothing until resumed.
	w := watchRollout(t, key)
	if out, code := plugin(t, "rollout", "pause", key.Name); code != 0 {
		t.Fatalf("kubectl iteron rollout pause: exit %d\n%s", code, out)
	}
	editSet(t, key, func(s *iteronv1.ActivationSet) { s.Spec.Template = template(v2) })
	paused := waitSet(t, key, "Paused on the new template", func(s *iteronv1.ActivationSet) bool {
		return fleettest.Phase(iteronv1.RolloutPaused)(s) && s.Status.ObservedGeneration == s.Generation
	})
	health, err = fleettest.SetHealth(env.RepoRoot, paused)
	if err != nil || health.Argo != "Suspended" {
		t.Errorf("a paused set reads as %s (%v); want Argo CD Suspended", health, err)
	}
	// The controller acted on the new spec (observedGeneration); a window
	// shows it moves nothing.
	time.Sleep(3 * time.Second)
	if moves := w.movesTo(strings.TrimPrefix(paused.Status.UpdateRevision, key.Name+"-")); len(moves) != 0 {
		t.Fatalf("a paused set moved %d nodes:\n%s", len(moves), w.describe())
	}
	t.Logf("paused: %s; read as %s; no node moved in 3 s after the controller observed generation %d", fleettest.Condition(paused, iteronv1.ConditionReady).Message, health, paused.Generation)
	if out, code := plugin(t, "rollout", "resume", key.Name); code != 0 {
		t.Fatalf("kubectl iteron rollout resume: exit %d\n%s", code, out)
	}
	done := waitSet(t, key, "Completed after the resume", fleettest.Completed)
	w.stop()
	_, on2 := serving(t, key, pool5)
	if len(on2) != 5 {
		t.Errorf("after the resume, serving v2: %v", on2)
	}
	record(row{"hand edit; foreign activation at fleet-6's name; pause, new template, resume", fmt.Sprintf("edit set back; conflict %s %s (Degraded); Paused → %s", c.Node, c.Reason, statusOf(done)),
		"none", names(on2), fmt.Sprintf("the foreign activation unchanged: yes; managers yes (%s)", managersRan(t))})
}

// deleteActivation deletes an activation and waits (2 minutes at most)
// until its manager retired it.
func deleteActivation(t *testing.T, key client.ObjectKey) {
	ctx := context.Background()
	var a iteronv1.ImplementationActivation
	if err := env.Client.Get(ctx, key, &a); apierrors.IsNotFound(err) {
		return
	}
	if err := env.Client.Delete(ctx, &a); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete %s: %v", key, err)
		return
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := env.Client.Get(ctx, key, &a)
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("activation %s was not retired: %v %+v", key, err, a.Status.Conditions)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}
