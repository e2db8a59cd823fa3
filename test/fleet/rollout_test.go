package fleet

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/test/fleettest"
)

// pool5 are the five nodes the pool label selects.
var pool5 = []int{1, 2, 3, 4, 5}

func canary(soak int32, onFailure iteronv1.FailurePolicy) iteronv1.RolloutStrategy {
	return iteronv1.RolloutStrategy{
		Canary:         &iteronv1.CanaryStrategy{Nodes: 1, SoakSeconds: ptr.To(soak)},
		MaxUnavailable: ptr.To(intstr.FromInt32(2)),
		OnFailure:      onFailure,
	}
}

// before is what each node ran and counted before a rollout.
type before struct {
	nodes  map[int]node
	counts map[int]int64
}

// deployAndCount waits for the set's first deployment, then counts on every
// node (key "n": node i adds i) and records what runs where.
func deployAndCount(t *testing.T, key client.ObjectKey) before {
	t.Helper()
	waitSet(t, key, "Completed (first deployment)", fleettest.Completed)
	b := before{nodes: map[int]node{}, counts: map[int]int64{}}
	for _, i := range pool5 {
		n := nodeOf(t, key, i)
		obs := count(t, i, n.activation.Name, "n", i)
		if obs.Count != int64(i) {
			t.Fatalf("%s counted %d; want %d", n.name, obs.Count, i)
		}
		b.nodes[i], b.counts[i] = nodeOf(t, key, i), obs.Count
	}
	return b
}

// TestARolloutMovesTheNodesWaveByWaveWithTheirState rolls counter v1 → v2
// over five nodes (five manager processes) with a canary of 1 and
// maxUnavailable 2, and logs each wave: its nodes, the provider pids before
// and after, and each node's count after the migration.
func TestARolloutMovesTheNodesWaveByWaveWithTheirState(t *testing.T) {
	v1 := source(t, artifacts.CounterV1Down, "counter-v1")
	v2 := source(t, artifacts.CounterV2, "counter-v2")
	key := newSet(t, "roll", template(v1), canary(2, iteronv1.FailurePolicyHalt))
	b := deployAndCount(t, key)
	w := watchRollout(t, key)

	editSet(t, key, func(s *iteronv1.ActivationSet) { s.Spec.Template = template(v2) })
	done := waitSet(t, key, "Completed on v2", fleettest.Completed)
	w.stop()
	update := strings.TrimPrefix(done.Status.UpdateRevision, key.Name+"-")
	order, byWave := waves(w.movesTo(update))
	t.Logf("rollout of %s: stable revision before %s, after %s; at most %d nodes not Ready at once (%s)",
		key, b.nodes[1].activation.Labels[iteronv1.LabelRevision], update, w.maxNotReady, w.maxNotReadyAt)

	// The waves: the canary alone, then two nodes at a time, in node-name
	// order; each wave after every node of the ones before was Ready.
	want := [][]string{{"fleet-1"}, {"fleet-2", "fleet-3"}, {"fleet-4", "fleet-5"}}
	if len(order) != len(want) {
		t.Fatalf("waves %v; want 3\n%s", order, w.describe())
	}
	var moved []move
	for k, wave := range order {
		ms := byWave[wave]
		if got := nodesOf(ms); !slices.Equal(got, want[k]) || wave != fmt.Sprint(k+1) {
			t.Errorf("wave %s moved %v; want wave %d moving %v\n%s", wave, got, k+1, want[k], w.describe())
		}
		for _, m := range ms {
			for _, p := range moved {
				if !readyBetween(w.readyAt[p.node], p.at, m.at) {
					t.Errorf("%s moved in wave %s before %s (wave %s) was Ready\n%s", m.node, m.wave, p.node, p.wave, w.describe())
				}
			}
		}
		moved = append(moved, ms...)
		label := "wave " + wave
		if k == 0 {
			label += " (canary, then a 2 s soak)"
		}
		var lines []string
		for _, m := range ms {
			i := int(m.node[len(m.node)-1] - '0')
			after := nodeOf(t, key, i)
			obs := count(t, i, after.activation.Name, "n", 0)
			lines = append(lines, fmt.Sprintf("%s: pid %d (%s) → %d (%s), state n=%d → %d (version %s)",
				m.node, b.nodes[i].pid, b.nodes[i].impl, after.pid, after.impl, b.counts[i], obs.Count, obs.Version))
			if after.pid == b.nodes[i].pid || !processAlive(after.pid) || processAlive(b.nodes[i].pid) {
				t.Errorf("%s: provider pid %d → %d (alive %v, old alive %v); want a new live process and the old one gone",
					m.node, b.nodes[i].pid, after.pid, processAlive(after.pid), processAlive(b.nodes[i].pid))
			}
			if obs.Count != b.counts[i] || obs.Version != "2.0.0" || after.impl != "counter-v2" {
				t.Errorf("%s after the rollout: count %d version %s (%s); want count %d (migrated) on counter v2", m.node, obs.Count, obs.Version, after.impl, b.counts[i])
			}
			if after.activation.Generation != 2 {
				t.Errorf("%s's activation is at generation %d; want 2 (stamped once, moved once)", m.node, after.activation.Generation)
			}
		}
		t.Logf("%s at %s, nodes not Ready just before it: %v: %s", label, ms[0].at.Format("15:04:05.000"), ms[0].notReadyBefore, strings.Join(lines, "; "))
	}
	if w.maxNotReady > 2 {
		t.Errorf("%d nodes were not Ready at once (%s); maxUnavailable is 2", w.maxNotReady, w.maxNotReadyAt)
	}
	if done.Status.UpdatedNodes != 5 || done.Status.ReadyNodes != 5 || done.Status.Wave != 3 || done.Status.CurrentRevision != done.Status.UpdateRevision {
		t.Errorf("status at the end: %+v", done.Status)
	}
	// GitOps tools read the rollout as it went.
	for phase, want := range map[iteronv1.RolloutPhase]string{
		iteronv1.RolloutProgressing: "Argo CD Progressing, kstatus InProgress",
		iteronv1.RolloutSoaking:     "Argo CD Progressing, kstatus InProgress",
		iteronv1.RolloutCompleted:   "Argo CD Healthy, kstatus Current",
	} {
		if got := w.healthSeen(phase); !slices.Equal(got, []string{want}) {
			t.Errorf("in phase %s the set read as %v; want only %q", phase, got, want)
		}
	}
	if w.healthErr != nil {
		t.Error(w.healthErr)
	}
	out, code := plugin(t, "rollout", "status", key.Name, "--watch=false")
	if code != 0 || !strings.Contains(out, "Completed") || !strings.Contains(out, "5 desired, 5 updated, 5 ready, 0 failed; wave 3") {
		t.Errorf("kubectl iteron rollout status: exit %d\n%s", code, out)
	}
	t.Logf("kubectl iteron rollout status %s:\n%s", key.Name, out)
	on1, on2 := serving(t, key, pool5)
	record(row{"rollout v1 → v2, canary 1, maxUnavailable 2", statusOf(done) + fmt.Sprintf("; waves %v, at most %d not Ready", order, w.maxNotReady), names(on1), names(on2),
		fmt.Sprintf("n/a (every node moves); managers yes (%s)", managersRan(t))})
}

// readyBetween reports whether a node became Ready after from and no later
// than to.
func readyBetween(times []time.Time, from, to time.Time) bool {
	for _, at := range times {
		if at.After(from) && !at.After(to) {
			return true
		}
	}
	return false
}
