package fleet

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/test/fleettest"
)

// TestANodeLabelledMidRolloutJoinsAtTheStableRevisionAndADeletedNodeLosesItsActivation:
// fleet-6 gets the pool label while the canary moves: it is stamped on the
// stable revision (v1), then moved to v2 by the rollout like the others.
// Then its Node is deleted: its activation goes, and with it its Generation
// objects and its provider process.
func TestANodeLabelledMidRolloutJoinsAtTheStableRevisionAndADeletedNodeLosesItsActivation(t *testing.T) {
	const six = 6
	v1 := source(t, artifacts.CounterV1Down, "counter-v1")
	v2 := source(t, artifacts.CounterV2, "counter-v2")
	key := newSet(t, "join", template(v1), canary(2, iteronv1.FailurePolicyHalt))
	b := deployAndCount(t, key)
	w := watchRollout(t, key)
	stableHash := b.nodes[1].activation.Labels[iteronv1.LabelRevision]
	t.Cleanup(func() { restoreNode(t, nodeName(six)) })
	editSet(t, key, func(s *iteronv1.ActivationSet) { s.Spec.Template = template(v2) })
	canaryMove := w.waitMove(t, "the canary's move", 3*time.Minute, func(m move) bool { return m.wave == "1" && m.to != stableHash })
	fleettest.LabelNode(t, env.Client, nodeName(six), pool, "fleet")
	t.Logf("labelled %s %s=fleet at %s, after the canary %s moved", nodeName(six), pool, time.Now().Format("15:04:05.000"), canaryMove.node)
	done := waitSet(t, key, "Completed on v2 with six nodes", func(s *iteronv1.ActivationSet) bool {
		return fleettest.Completed(s) && s.Status.DesiredNodes == 6
	})
	w.stop()
	t.Logf("moves:\n%s", w.describe())
	update := strings.TrimPrefix(done.Status.UpdateRevision, key.Name+"-")
	if got := w.firstRevision(nodeName(six)); got != stableHash {
		t.Errorf("%s was stamped on revision %q; want the stable revision %s (the rollout was under way)", nodeName(six), got, stableHash)
	}
	moves := w.movesOf(nodeName(six))
	if len(moves) != 1 || moves[0].to != update {
		t.Errorf("%s moved %+v; want once, to %s", nodeName(six), moves, update)
	}
	n6 := nodeOf(t, key, six)
	obs := count(t, six, n6.activation.Name, "n", 6)
	if n6.impl != "counter-v2" || obs.Count != 6 || !processAlive(n6.pid) {
		t.Fatalf("%s: %s pid %d count %d; want counter v2 serving", n6.name, n6.impl, n6.pid, obs.Count)
	}
	wave := "?"
	if len(moves) > 0 {
		wave = moves[0].wave
	}
	t.Logf("%s joined on revision %s, moved to %s in wave %s; serves counter v2 as pid %d", n6.name, stableHash, update, wave, n6.pid)
	var v2s []string
	for _, i := range append(pool5, six) {
		if n := nodeOf(t, key, i); n.impl == "counter-v2" {
			v2s = append(v2s, n.name)
		}
	}
	record(row{"fleet-6 labelled while the canary moved", statusOf(done) + fmt.Sprintf("; fleet-6 stamped on the stable revision, moved in wave %s", wave), "none", names(v2s), "n/a (a rollout)"})

	// Delete the Node: its activation, Generations and provider go.
	gens := generationsOf(t, n6.activation.Name)
	rest := before{nodes: snapshot(t, key)}
	if err := env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName(six)}}); err != nil {
		t.Fatal(err)
	}
	after := waitSet(t, key, "Completed with five nodes", func(s *iteronv1.ActivationSet) bool {
		return fleettest.Completed(s) && s.Status.DesiredNodes == 5
	})
	waitGone(t, key, n6, gens)
	t.Logf("Node %s deleted: activation %s and Generations %v gone, provider pid %d exited; the set: %s", n6.name, n6.activation.Name, gens, n6.pid, statusOf(after))
	var left []string
	for _, i := range pool5 {
		if n := nodeOf(t, key, i); n.impl == "counter-v2" {
			left = append(left, n.name)
		}
	}
	record(row{"Node fleet-6 deleted", statusOf(after) + "; fleet-6's activation, Generations and provider gone", "none", names(left),
		untouched(t, key, rest, pool5...)})
	managersRan(t)
}
