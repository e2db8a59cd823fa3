package fleet

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/test/fleettest"
)

// faultyV2 is counter v2 whose migrate crashes when the state it carries
// holds the key "poison": the same bytes swap on one node and fail on
// another.
func faultyV2(t *testing.T) iteronv1.ActivationSource {
	return source(t, artifacts.Faulty, "counter-v2", "--fault", "crash", "--at", "migrate", "--if-request-contains", "poison")
}

// poisonedRollout deploys counter v1 (with its down-migration) on the pool,
// counts on every node, puts the key "poison" into fleet-3's state, and
// rolls the faulty v2 out with a canary of 1 and maxUnavailable 2: the
// canary (fleet-1) and fleet-2 swap, fleet-3 (the second wave) fails at
// migrate and its old generation keeps serving.
func poisonedRollout(t *testing.T, name string, strategy iteronv1.RolloutStrategy) (client.ObjectKey, before, *rolloutWatch) {
	t.Helper()
	return poisonedRolloutFrom(t, artifacts.CounterV1Down, name, strategy)
}

// poisonedRolloutFrom is poisonedRollout from another v1 (counter v1.0.0
// has no down-migration).
func poisonedRolloutFrom(t *testing.T, v1example, name string, strategy iteronv1.RolloutStrategy) (client.ObjectKey, before, *rolloutWatch) {
	t.Helper()
	v1 := source(t, v1example, "counter-v1")
	key := newSet(t, name, template(v1), strategy)
	b := deployAndCount(t, key)
	if obs := count(t, 3, b.nodes[3].activation.Name, "poison", 1); obs.Count != 1 {
		t.Fatalf("fleet-3 counted poison=%d", obs.Count)
	}
	w := watchRollout(t, key)
	editSet(t, key, func(s *iteronv1.ActivationSet) { s.Spec.Template = template(faultyV2(t)) })
	return key, b, w
}

// TestAFailedNodeInTheSecondWaveHaltsTheRollout: fleet-3 fails; the set
// halts naming it and why, Argo CD and kstatus read Degraded, the nodes not
// reached (fleet-4, fleet-5) keep their v1 processes, fleet-3 keeps serving
// v1 with the same process, and kubectl iteron rollout status shows where.
func TestAFailedNodeInTheSecondWaveHaltsTheRollout(t *testing.T) {
	key, b, w := poisonedRollout(t, "halt", canary(2, iteronv1.FailurePolicyHalt))
	halted := waitSet(t, key, "Halted", fleettest.Phase(iteronv1.RolloutHalted))
	w.stop()
	t.Logf("moves: \n%s", w.describe())
	h := halted.Status.Halt
	if h == nil || h.Action != iteronv1.FailurePolicyHalt || !slices.Equal(h.Nodes, []string{"fleet-3"}) {
		t.Fatalf("status.halt %+v; want a Halt naming fleet-3", h)
	}
	if len(halted.Status.Failed) != 1 || halted.Status.Failed[0].Node != "fleet-3" || halted.Status.Failed[0].Reason == "" {
		t.Fatalf("status.failed %+v; want fleet-3 with a reason", halted.Status.Failed)
	}
	t.Logf("status.halt: %s on %v: %s", h.Action, h.Nodes, h.Message)
	t.Logf("status.failed[0]: node %s, reason %s: %s", halted.Status.Failed[0].Node, halted.Status.Failed[0].Reason, halted.Status.Failed[0].Message)
	for _, i := range []int{4, 5} {
		if moves := w.movesOf(nodeName(i)); len(moves) != 0 {
			t.Errorf("%s was moved (%+v); the halt came before its wave", nodeName(i), moves)
		}
	}
	// fleet-2 swapped (it was in the wave with fleet-3); fleet-1 before.
	for _, i := range []int{1, 2} {
		// A halt does not stop the swaps under way: fleet-2's may still run.
		waitActivation(t, key, i, "Ready on v2", func(n node) bool { return n.impl == "counter-v2" && readyNode(n) })
		n := nodeOf(t, key, i)
		obs := count(t, i, n.activation.Name, "n", 0)
		if n.impl != "counter-v2" || obs.Count != b.counts[i] || obs.Version != "2.0.0" {
			t.Errorf("%s: %s count %d version %s; want the faulty v2 (a counter v2 when nothing fires) with count %d", n.name, n.impl, obs.Count, obs.Version, b.counts[i])
		}
	}
	n3 := nodeOf(t, key, 3)
	if obs := count(t, 3, n3.activation.Name, "poison", 0); obs.Count != 1 || obs.Version != "1.1.0" {
		t.Errorf("fleet-3 after its failed swap: poison=%d version %s; want 1 on v1.1.0 (the old generation serves)", obs.Count, obs.Version)
	}
	health, err := fleettest.SetHealth(env.RepoRoot, halted)
	if err != nil || health.Argo != "Degraded" || health.KStatus != "Failed" {
		t.Errorf("a halted set reads as %s (%v); want Argo CD Degraded, kstatus Failed", health, err)
	}
	t.Logf("read by GitOps tools: %s (%s)", health, health.ArgoMessage)
	out, code := plugin(t, "rollout", "status", key.Name, "--watch=false")
	t.Logf("kubectl iteron rollout status %s (exit %d):\n%s", key.Name, code, out)
	if code == 0 || !strings.Contains(out, "Halted") || !strings.Contains(out, "fleet-3") {
		t.Errorf("kubectl iteron rollout status of a halted set: exit %d, want non-zero, Halted and fleet-3", code)
	}
	v1, v2 := serving(t, key, pool5)
	record(row{"faulty v2 on fleet-3 (wave 2), onFailure Halt", statusOf(halted), names(v1), names(v2), untouched(t, key, b, 3, 4, 5)})
	if !slices.Equal(v1, []string{"fleet-3", "fleet-4", "fleet-5"}) {
		t.Errorf("serving v1: %v; want fleet-3, fleet-4, fleet-5", v1)
	}
	managersRan(t)
}

// TestAFailedNodeWithRevertMovesTheMovedNodesBackWithTheirState: as above
// with onFailure Revert: fleet-1 and fleet-2 go back to v1 (v1.1.0, whose
// down-migration reads v2's state), their counts migrated back; the status
// says the revert migrated state; fleet-4 and fleet-5 were never touched.
func TestAFailedNodeWithRevertMovesTheMovedNodesBackWithTheirState(t *testing.T) {
	key, b, w := poisonedRollout(t, "revert", canary(2, iteronv1.FailurePolicyRevert))
	reverted := waitSet(t, key, "Reverted", fleettest.Phase(iteronv1.RolloutReverted))
	w.stop()
	t.Logf("moves:\n%s", w.describe())
	h := reverted.Status.Halt
	if h == nil || h.Action != iteronv1.FailurePolicyRevert || h.StateDisposition != iteronv1.StateDispositionMigrate || !slices.Equal(h.Nodes, []string{"fleet-3"}) {
		t.Fatalf("status.halt %+v; want a Revert with Migrate naming fleet-3", h)
	}
	t.Logf("status: phase %s, halt %s (stateDisposition %s) on %v → back to %s; message: %s", reverted.Status.Phase, h.Action, h.StateDisposition, h.Nodes, h.ToRevision,
		fleettest.Condition(reverted, iteronv1.ConditionReady).Message)
	stable := strings.TrimPrefix(h.ToRevision, key.Name+"-")
	for _, i := range []int{1, 2} {
		n := nodeOf(t, key, i)
		obs := count(t, i, n.activation.Name, "n", 0)
		t.Logf("%s: pid %d (%s) → %d (%s), state n=%d → %d (version %s), reverted-from %s", n.name, b.nodes[i].pid, b.nodes[i].impl, n.pid, n.impl,
			b.counts[i], obs.Count, obs.Version, n.activation.Annotations[iteronv1.AnnotationRevertedFrom])
		if n.impl != "counter-v1" || obs.Version != "1.1.0" || obs.Count != b.counts[i] {
			t.Errorf("%s after the revert: %s version %s count %d; want counter v1.1.0 with count %d (state migrated back)", n.name, n.impl, obs.Version, obs.Count, b.counts[i])
		}
		switch moved := servedV2(t, n.activation.Name); {
		case !moved && i == 1:
			t.Errorf("the canary %s never served v2", n.name)
		case !moved:
			// fleet-2 moved in the same wave as fleet-3: on a slow manager
			// its swap may not have begun when the revert came.
			t.Logf("%s's swap to v2 had not begun when the revert came: it never left v1", n.name)
			if n.pid != b.nodes[i].pid {
				t.Errorf("%s never served v2 but its provider pid changed %d → %d", n.name, b.nodes[i].pid, n.pid)
			}
		case n.pid == b.nodes[i].pid || !processAlive(n.pid):
			t.Errorf("%s: provider pid %d → %d; want a new v1 process (a swap there and back)", n.name, b.nodes[i].pid, n.pid)
		}
		if back := w.movesOf(n.name); len(back) != 2 || back[1].to != stable {
			t.Errorf("%s moved %d times (%+v); want once to v2 and once back to %s", n.name, len(back), back, stable)
		}
	}
	n3 := nodeOf(t, key, 3)
	if obs := count(t, 3, n3.activation.Name, "poison", 0); obs.Count != 1 || obs.Version != "1.1.0" {
		t.Errorf("fleet-3 after the revert: poison=%d version %s; want 1 on v1.1.0", obs.Count, obs.Version)
	}
	t.Logf("fleet-3 (failed, its old generation served throughout): pid %d → %d", b.nodes[3].pid, n3.pid)
	for _, i := range []int{4, 5} {
		if moves := w.movesOf(nodeName(i)); len(moves) != 0 {
			t.Errorf("%s was moved (%+v); the revert came before its wave", nodeName(i), moves)
		}
	}
	health, err := fleettest.SetHealth(env.RepoRoot, reverted)
	t.Logf("read by GitOps tools: %s (%v)", health, err)
	if err != nil || health.Argo != "Degraded" {
		t.Errorf("a reverted set reads as %s (%v); want Argo CD Degraded (a person must look)", health, err)
	}
	v1, v2 := serving(t, key, pool5)
	if len(v2) != 0 {
		t.Errorf("nodes still serving v2 after the revert: %v", v2)
	}
	record(row{"faulty v2 on fleet-3 (wave 2), onFailure Revert", statusOf(reverted) + "; fleet-1,2 state migrated back (n=1,2)", names(v1), names(v2), untouched(t, key, b, 3, 4, 5)})
	managersRan(t)
}

// TestARevertWithoutADownMigrationFailsUntilTheSetSaysDiscard: v1 is
// counter v1.0.0, which cannot read v2's state. The revert with Migrate
// fails on the moved nodes (RevertFailed: they keep serving v2 with their
// state, the old generation serving as after any failed swap); once the set
// says revertStateDisposition: Discard they go back to v1 with empty state,
// and the status says Discard.
func TestARevertWithoutADownMigrationFailsUntilTheSetSaysDiscard(t *testing.T) {
	key, b, w := poisonedRolloutFrom(t, artifacts.CounterV1, "discard", canary(2, iteronv1.FailurePolicyRevert))
	failed := waitSet(t, key, "RevertFailed", fleettest.Phase(iteronv1.RolloutRevertFailed))
	t.Logf("status: phase %s: %s", failed.Status.Phase, fleettest.Condition(failed, iteronv1.ConditionReady).Message)
	movedToV2 := map[int]bool{}
	for _, i := range []int{1, 2} {
		n := nodeOf(t, key, i)
		obs := count(t, i, n.activation.Name, "n", 0)
		movedToV2[i] = servedV2(t, n.activation.Name)
		t.Logf("%s after the failed revert: %s pid %d, state n=%d (version %s), served v2: %v", n.name, n.impl, n.pid, obs.Count, obs.Version, movedToV2[i])
		switch {
		case !movedToV2[i] && i == 1:
			t.Errorf("the canary %s never served v2", n.name)
		case !movedToV2[i]:
			// Its swap to v2 had not begun when the revert came: it never
			// left v1 and has nothing to revert.
			if n.impl != "counter-v1" || obs.Count != b.counts[i] || n.pid != b.nodes[i].pid {
				t.Errorf("%s never served v2: %s pid %d → %d count %d; want v1 untouched with count %d", n.name, n.impl, b.nodes[i].pid, n.pid, obs.Count, b.counts[i])
			}
		case n.impl != "counter-v2" || obs.Count != b.counts[i]:
			t.Errorf("%s after a failed revert: %s count %d; want v2 still serving with count %d", n.name, n.impl, obs.Count, b.counts[i])
		}
	}
	v1, v2 := serving(t, key, pool5)
	record(row{"faulty v2 on fleet-3, Revert with Migrate to v1.0.0 (no down-migration)", statusOf(failed) + "; " + movedNote(movedToV2, "keep v2 and their state"), names(v1), names(v2), untouched(t, key, b, 3, 4, 5)})

	editSet(t, key, func(s *iteronv1.ActivationSet) {
		s.Spec.Strategy.RevertStateDisposition = iteronv1.StateDispositionDiscard
	})
	reverted := waitSet(t, key, "Reverted with Discard", fleettest.Phase(iteronv1.RolloutReverted))
	w.stop()
	t.Logf("moves:\n%s", w.describe())
	h := reverted.Status.Halt
	if h == nil || h.StateDisposition != iteronv1.StateDispositionDiscard {
		t.Fatalf("status.halt %+v; want a revert that says Discard", h)
	}
	t.Logf("status: phase %s, halt %s (stateDisposition %s): %s", reverted.Status.Phase, h.Action, h.StateDisposition, fleettest.Condition(reverted, iteronv1.ConditionReady).Message)
	for _, i := range []int{1, 2} {
		n := nodeOf(t, key, i)
		obs := count(t, i, n.activation.Name, "n", 0)
		t.Logf("%s: pid %d → %d (%s), state n=%d → %d (version %s), stateDisposition %s", n.name, b.nodes[i].pid, n.pid, n.impl, b.counts[i], obs.Count, obs.Version, n.activation.Spec.Swap.StateDisposition)
		want := int64(0)
		if !movedToV2[i] {
			want = b.counts[i] // it never left v1: nothing was discarded
		}
		if n.impl != "counter-v1" || obs.Version != "1.0.0" || obs.Count != want {
			t.Errorf("%s after the revert with Discard: %s version %s count %d; want counter v1.0.0 with count %d (served v2: %v)", n.name, n.impl, obs.Version, obs.Count, want, movedToV2[i])
		}
	}
	if obs := count(t, 3, nodeOf(t, key, 3).activation.Name, "poison", 0); obs.Count != 1 {
		t.Errorf("fleet-3 (never left v1) lost its state: poison=%d", obs.Count)
	}
	v1, v2 = serving(t, key, pool5)
	record(row{"… then revertStateDisposition: Discard", statusOf(reverted) + "; " + movedNote(movedToV2, "back on v1.0.0, state discarded (n=0)"), names(v1), names(v2), untouched(t, key, b, 4, 5)})
	managersRan(t)
}

// TestAResumedRolloutRetriesTheFailedNodeAndGoesOn: fleet-3's swap fails
// once (the fault fires only in the first process that sees the poison);
// the set halts; kubectl iteron rollout resume retries fleet-3's swap,
// which now carries its state into v2, and the rollout goes on to fleet-4
// and fleet-5.
func TestAResumedRolloutRetriesTheFailedNodeAndGoesOn(t *testing.T) {
	markers := filepath.Join(base, "markers")
	if err := os.MkdirAll(markers, 0o777); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(markers, 0o777) // the providers' uid creates the marker
	v1 := source(t, artifacts.CounterV1Down, "counter-v1")
	once := source(t, artifacts.Faulty, "counter-v2", "--fault", "crash", "--at", "migrate", "--if-request-contains", "poison",
		"--once-marker", filepath.Join(markers, "resume"))
	key := newSet(t, "resume", template(v1), canary(2, iteronv1.FailurePolicyHalt))
	b := deployAndCount(t, key)
	if obs := count(t, 3, b.nodes[3].activation.Name, "poison", 1); obs.Count != 1 {
		t.Fatalf("fleet-3 counted poison=%d", obs.Count)
	}
	w := watchRollout(t, key)
	editSet(t, key, func(s *iteronv1.ActivationSet) { s.Spec.Template = template(once) })
	halted := waitSet(t, key, "Halted", fleettest.Phase(iteronv1.RolloutHalted))
	if h := halted.Status.Halt; h == nil || !slices.Equal(h.Nodes, []string{"fleet-3"}) {
		t.Fatalf("status.halt %+v; want fleet-3", h)
	}
	out, code := plugin(t, "rollout", "resume", key.Name)
	t.Logf("kubectl iteron rollout resume %s (exit %d): %s", key.Name, code, strings.TrimSpace(out))
	if code != 0 {
		t.Fatalf("kubectl iteron rollout resume: exit %d", code)
	}
	done := waitSet(t, key, "Completed after the resume", fleettest.Completed)
	w.stop()
	t.Logf("moves:\n%s", w.describe())
	if done.Status.Halt != nil || done.Status.FailedNodes != 0 {
		t.Errorf("status after the resume: halt %+v, %d failed", done.Status.Halt, done.Status.FailedNodes)
	}
	for _, i := range pool5 {
		n := nodeOf(t, key, i)
		obs := count(t, i, n.activation.Name, "n", 0)
		moves := w.movesOf(n.name)
		t.Logf("%s: %d move(s), pid %d → %d (%s), state n=%d → %d (version %s)", n.name, len(moves), b.nodes[i].pid, n.pid, n.impl, b.counts[i], obs.Count, obs.Version)
		if n.impl != "counter-v2" || obs.Count != b.counts[i] || len(moves) != 1 {
			t.Errorf("%s: %s count %d after %d moves; want v2 with count %d, moved once", n.name, n.impl, obs.Count, len(moves), b.counts[i])
		}
	}
	if obs := count(t, 3, nodeOf(t, key, 3).activation.Name, "poison", 0); obs.Count != 1 {
		t.Errorf("fleet-3's retried swap lost its state: poison=%d", obs.Count)
	}
	v1s, v2s := serving(t, key, pool5)
	record(row{"faulty-once v2 on fleet-3, Halt, then kubectl iteron rollout resume", statusOf(done) + "; fleet-3's swap retried with its state, fleet-4,5 moved after", names(v1s), names(v2s),
		fmt.Sprintf("n/a (every node moves); managers yes (%s)", managersRan(t))})
}

// servedV2 reports whether an activation ever had counter v2 Active (a
// Generation of it activated).
func servedV2(t *testing.T, activation string) bool {
	t.Helper()
	var list iteronv1.GenerationList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, g := range list.Items {
		if g.Spec.ActivationName == activation && g.Spec.Implementation.ID == "counter-v2" && g.Status.ActivatedAt != nil {
			return true
		}
	}
	return false
}

// movedNote says what happened to the nodes that served v2 (fleet-1, and
// fleet-2 unless the revert came before its swap began).
func movedNote(moved map[int]bool, what string) string {
	var ns []string
	for _, i := range []int{1, 2} {
		if moved[i] {
			ns = append(ns, nodeName(i))
		}
	}
	note := strings.Join(ns, ", ") + " " + what
	if !moved[2] {
		note += "; fleet-2 never left v1 (the revert came before its swap began)"
	}
	return note
}
