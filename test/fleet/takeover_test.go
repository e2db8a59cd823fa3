package fleet

import (
	"fmt"
	"strings"
	"testing"
	"time"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/test/fleettest"
)

// TestTheOtherFleetControllerTakesOverFromAKilledLeader: the leader is
// SIGKILLed as soon as the second wave starts; the other replica takes the
// Lease and finishes; every node moved exactly once, none was skipped, and
// no node manager restarted.
func TestTheOtherFleetControllerTakesOverFromAKilledLeader(t *testing.T) {
	v1 := source(t, artifacts.CounterV1Down, "counter-v1")
	v2 := source(t, artifacts.CounterV2, "counter-v2")
	key := newSet(t, "takeover", template(v1), canary(2, iteronv1.FailurePolicyHalt))
	b := deployAndCount(t, key)
	mpids := managersRan(t)
	w := watchRollout(t, key)
	stableHash := b.nodes[1].activation.Labels[iteronv1.LabelRevision]
	old := leader(t)
	editSet(t, key, func(s *iteronv1.ActivationSet) { s.Spec.Template = template(v2) })
	first := w.waitMove(t, "the second wave's first move", 3*time.Minute, func(m move) bool { return m.wave == "2" && m.to != stableHash })
	at := getSet(t, key)
	old.Kill()
	t.Logf("SIGKILLed the leader %s (pid %d) at %s, after %s moved in wave 2; the set then: phase %s, %d/%d updated, wave %d; activations:\n%s",
		old.Name, old.Pid(), time.Now().Format("15:04:05.000"), first.node, at.Status.Phase, at.Status.UpdatedNodes, at.Status.DesiredNodes, at.Status.Wave,
		fleettest.DescribeActivations(env.Client, key))
	next := leader(t)
	if next == old {
		t.Fatal("the killed process still holds the Lease")
	}
	t.Logf("%s (pid %d) holds the Lease now", next.Name, next.Pid())
	// A new replica, so the package's world keeps two.
	if _, err := startFleet(); err != nil {
		t.Fatal(err)
	}
	done := waitSet(t, key, "Completed on v2 under the new leader", fleettest.Completed)
	w.stop()
	t.Logf("moves:\n%s", w.describe())
	update := strings.TrimPrefix(done.Status.UpdateRevision, key.Name+"-")
	var v2s []string
	for _, i := range pool5 {
		n := nodeOf(t, key, i)
		moves := w.movesOf(n.name)
		if len(moves) != 1 || moves[0].to != update || n.activation.Generation != 2 {
			t.Errorf("%s: %d moves %+v, activation generation %d; want exactly one move, to %s", n.name, len(moves), moves, n.activation.Generation, update)
		}
		obs := count(t, i, n.activation.Name, "n", 0)
		if n.impl != "counter-v2" || obs.Count != b.counts[i] || n.pid == b.nodes[i].pid {
			t.Errorf("%s: %s pid %d → %d, count %d; want counter v2 in a new process with count %d", n.name, n.impl, b.nodes[i].pid, n.pid, obs.Count, b.counts[i])
		}
		t.Logf("%s: wave %s, pid %d → %d, state n=%d → %d (version %s)", n.name, moves[0].wave, b.nodes[i].pid, n.pid, b.counts[i], obs.Count, obs.Version)
		v2s = append(v2s, n.name)
	}
	if w.maxNotReady > 2 {
		t.Errorf("%d nodes were not Ready at once (%s); maxUnavailable is 2", w.maxNotReady, w.maxNotReadyAt)
	}
	after := managersRan(t)
	if after != mpids {
		t.Errorf("manager pids %s → %s", mpids, after)
	}
	record(row{"leader SIGKILLed at wave 2", statusOf(done) + "; each node moved once", "none", names(v2s),
		fmt.Sprintf("managers yes (%s)", after)})
}
