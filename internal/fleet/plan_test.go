package fleet

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func template(id string) *iteronv1.ActivationTemplate {
	return &iteronv1.ActivationTemplate{
		CandidateSHA256: "sha256:" + strings.Repeat("a", 64),
		Sources: []iteronv1.ActivationSource{{Module: "prompt_system", ImplementationID: id, CatalogPath: "/p/" + id + "/catalog.json",
			ArtifactRoot: "/p/" + id, ManifestSHA256: "sha256:" + strings.Repeat("b", 64), ArtifactSHA256: "sha256:" + strings.Repeat("c", 64)}},
		Swap: iteronv1.SwapPolicy{Strategy: iteronv1.SwapStrategyHot, StateDisposition: iteronv1.StateDispositionMigrate},
	}
}

// world is a set, its revisions and its nodes' activations, from which a
// test builds Compute's input.
type world struct {
	set   *iteronv1.ActivationSet
	revs  map[string]Revision // by short name: v1, v2, …
	nodes []string
	acts  map[string]*Activation // by node
	now   time.Time
	// labels are the nodes' labels (cohort steps).
	labels map[string]map[string]string
	// measured are the measurements the next input carries.
	measured []Measured
}

func newWorld(nodes int, strategy iteronv1.RolloutStrategy) *world {
	w := &world{
		set: &iteronv1.ActivationSet{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "set-uid", Annotations: map[string]string{}},
			Spec: iteronv1.ActivationSetSpec{Strategy: strategy}},
		revs: map[string]Revision{}, acts: map[string]*Activation{}, now: t0,
	}
	for i, v := range []string{"v1", "v2", "v3"} {
		hash := fmt.Sprintf("hash%s", v)
		w.revs[v] = Revision{Name: RevisionName("web", hash), Hash: hash, Number: int64(i + 1), Template: template("counter-" + v)}
	}
	for i := 1; i <= nodes; i++ {
		w.nodes = append(w.nodes, fmt.Sprintf("node-%d", i))
	}
	return w
}

// on puts node on revision v (Ready unless told otherwise).
func (w *world) on(node, v string, edit ...func(*Activation)) *world {
	r := w.revs[v]
	spec := StampSpec(r.Template, node, false)
	a := &Activation{Name: ActivationName("web", node), Node: node, Owned: true, Revision: r.Hash, Spec: &spec, Ready: true}
	for _, e := range edit {
		e(a)
	}
	w.acts[node] = a
	return w
}

func (w *world) allOn(v string) *world {
	for _, n := range w.nodes {
		w.on(n, v)
	}
	return w
}

func notReady(a *Activation) { a.Ready = false }

func stalled(reason string) func(*Activation) {
	return func(a *Activation) {
		a.Ready = false
		a.Stalled = &metav1.Condition{Type: iteronv1.ConditionStalled, Status: metav1.ConditionTrue, Reason: reason, Message: "swap of prompt_system failed at migrate"}
	}
}

func wave(n int32) func(*Activation) { return func(a *Activation) { a.Wave = n } }

func (w *world) input(update string) Input {
	w.set.Spec.Template = *w.revs[update].Template
	revs := map[string]Revision{}
	for _, r := range w.revs {
		revs[r.Name] = r
	}
	var acts []Activation
	for _, a := range w.acts {
		acts = append(acts, *a)
	}
	sort.Slice(acts, func(i, j int) bool { return acts[i].Name < acts[j].Name })
	return Input{Set: w.set, Nodes: w.nodes, NodeLabels: w.labels, Activations: acts, Update: w.revs[update], Revisions: revs, Now: w.now, Measured: w.measured}
}

// apply carries a plan's actions out on the world, as the reconciler and
// the API server would, and keeps the status.
func (w *world) apply(t *testing.T, p Plan) {
	t.Helper()
	for _, a := range p.Actions {
		switch a.Kind {
		case Create, Move, Restore:
			spec := StampSpec(a.Revision.Template, a.Node, a.Discard)
			w.acts[a.Node] = &Activation{Name: a.Activation, Node: a.Node, Owned: true, Revision: a.Revision.Hash, Spec: &spec, Wave: a.Wave, RevertedFrom: a.RevertedFrom}
		case Retry:
			w.acts[a.Node].Retry, w.acts[a.Node].Stalled = a.Retry, nil
		case Delete:
			delete(w.acts, a.Node)
		}
	}
	w.set.Status = p.Status
}

// ready makes nodes Ready (their managers finished).
func (w *world) ready(nodes ...string) {
	for _, n := range nodes {
		w.acts[n].Ready, w.acts[n].Stalled = true, nil
	}
}

func summary(p Plan) string {
	var parts []string
	for _, a := range p.Actions {
		s := fmt.Sprintf("%s %s", a.Kind, a.Node)
		if a.Revision != nil {
			s += "→" + strings.TrimPrefix(a.Revision.Hash, "hash")
		}
		if a.Kind == Move && a.Wave > 0 {
			s += fmt.Sprintf("@%d", a.Wave)
		}
		if a.Discard {
			s += "(discard)"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

func expect(t *testing.T, p Plan, phase iteronv1.RolloutPhase, actions string) {
	t.Helper()
	if got := summary(p); p.Status.Phase != phase || got != actions {
		t.Fatalf("phase %s, actions [%s]; want phase %s, actions [%s]\nmessage: %s", p.Status.Phase, got, phase, actions, p.Message)
	}
}

func canary(nodes, soak int32) iteronv1.RolloutStrategy {
	return iteronv1.RolloutStrategy{Canary: &iteronv1.CanaryStrategy{Nodes: nodes, SoakSeconds: ptr.To(soak)}, MaxUnavailable: ptr.To(intstr.FromInt32(2))}
}

func TestAFirstDeploymentStampsEveryNodeAtOnceOnTheTemplate(t *testing.T) {
	w := newWorld(3, canary(1, 30))
	p := Compute(w.input("v1"))
	expect(t, p, iteronv1.RolloutProgressing, "Create node-1→v1, Create node-2→v1, Create node-3→v1")
	if p.Status.CurrentRevision != w.revs["v1"].Name || p.Status.UpdatedNodes != 3 || p.Status.DesiredNodes != 3 || p.Status.ReadyNodes != 0 {
		t.Fatalf("status = %+v", p.Status)
	}
	w.apply(t, p)
	w.ready(w.nodes...)
	p = Compute(w.input("v1"))
	expect(t, p, iteronv1.RolloutCompleted, "")
	if !AtRest(p.Status.Phase) || p.Status.ReadyNodes != 3 {
		t.Fatalf("status = %+v", p.Status)
	}
}

// TestARolloutGoesCanarySoakThenWavesOfMaxUnavailable walks a rollout of 5
// nodes, canary 1 (soak 30 s), maxUnavailable 2, reconcile by reconcile.
func TestARolloutGoesCanarySoakThenWavesOfMaxUnavailable(t *testing.T) {
	w := newWorld(5, canary(1, 30)).allOn("v1")
	w.set.Status.CurrentRevision = w.revs["v1"].Name

	p := Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutProgressing, "Move node-1→v2@1")
	if p.Status.Wave != 1 || !reflect.DeepEqual(p.Status.WaveNodes, []string{"node-1"}) || p.Status.UpdatedNodes != 1 || p.Status.ReadyNodes != 4 {
		t.Fatalf("status = %+v", p.Status)
	}
	w.apply(t, p)

	// The canary is not Ready yet: nothing moves.
	expect(t, Compute(w.input("v2")), iteronv1.RolloutProgressing, "")

	w.ready("node-1")
	p = Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutSoaking, "")
	if p.RequeueAfter != 30*time.Second || p.Status.SoakStartedAt == nil || !p.Status.SoakStartedAt.Time.Equal(t0) {
		t.Fatalf("soak: requeue %s, started %v", p.RequeueAfter, p.Status.SoakStartedAt)
	}
	w.apply(t, p)

	w.now = t0.Add(29 * time.Second)
	p = Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutSoaking, "")
	if p.RequeueAfter != time.Second {
		t.Fatalf("requeue %s; want 1s", p.RequeueAfter)
	}

	w.now = t0.Add(30 * time.Second)
	p = Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutProgressing, "Move node-2→v2@2, Move node-3→v2@2")
	if p.Status.SoakedRevision != w.revs["v2"].Name || p.Status.Wave != 2 || !reflect.DeepEqual(p.Status.WaveNodes, []string{"node-2", "node-3"}) {
		t.Fatalf("status = %+v", p.Status)
	}
	w.apply(t, p)

	// Half the wave is Ready: the next wave waits for the rest.
	w.ready("node-2")
	expect(t, Compute(w.input("v2")), iteronv1.RolloutProgressing, "")
	w.ready("node-3")
	p = Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutProgressing, "Move node-4→v2@3, Move node-5→v2@3")
	w.apply(t, p)
	w.ready("node-4", "node-5")
	p = Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutCompleted, "")
	if p.Status.CurrentRevision != w.revs["v2"].Name || p.Status.Wave != 3 || p.Status.UpdatedNodes != 5 || p.Status.ReadyNodes != 5 {
		t.Fatalf("status = %+v", p.Status)
	}
}

func TestACanaryThatIsNotReadyDuringTheSoakRestartsIt(t *testing.T) {
	w := newWorld(3, canary(1, 30)).allOn("v1").on("node-1", "v2", wave(1))
	w.set.Status = iteronv1.ActivationSetStatus{CurrentRevision: w.revs["v1"].Name, UpdateRevision: w.revs["v2"].Name, SoakStartedAt: &metav1.Time{Time: t0}}
	w.now = t0.Add(20 * time.Second)
	w.acts["node-1"].Ready = false
	p := Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutProgressing, "")
	if p.Status.SoakStartedAt != nil {
		t.Fatalf("the soak was not restarted: %v", p.Status.SoakStartedAt)
	}
	w.apply(t, p)
	w.ready("node-1")
	w.now = t0.Add(40 * time.Second)
	p = Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutSoaking, "")
	if p.RequeueAfter != 30*time.Second {
		t.Fatalf("the soak did not start over: requeue %s", p.RequeueAfter)
	}
}

func TestAWaveNeverTakesMoreThanMaxUnavailableNodesOutOfReady(t *testing.T) {
	cases := []struct {
		name    string
		nodes   int
		mu      intstr.IntOrString
		setup   func(w *world)
		actions string
	}{
		{"two nodes for maxUnavailable 2", 5, intstr.FromInt32(2), func(w *world) {}, "Move node-1→v2@1, Move node-2→v2@1"},
		{"one node not Ready elsewhere leaves room for one, and it goes first (it costs nothing)", 5, intstr.FromInt32(2),
			func(w *world) { w.on("node-4", "v1", notReady) }, "Move node-4→v2@1, Move node-1→v2@1"},
		{"two nodes not Ready elsewhere leave room for none but themselves", 5, intstr.FromInt32(2),
			func(w *world) { w.on("node-4", "v1", notReady).on("node-5", "v1", notReady) }, "Move node-4→v2@1, Move node-5→v2@1"},
		{"25% of 10 nodes is 2", 10, intstr.FromString("25%"), func(w *world) {}, "Move node-1→v2@1, Move node-10→v2@1"},
		{"10% of 5 nodes rounds down to 0 and is at least 1", 5, intstr.FromString("10%"), func(w *world) {}, "Move node-1→v2@1"},
		{"a node whose activation is being deleted is not Ready", 5, intstr.FromInt32(2),
			func(w *world) { w.acts["node-5"].Deleting = true }, "Move node-1→v2@1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(tc.nodes, iteronv1.RolloutStrategy{MaxUnavailable: &tc.mu}).allOn("v1")
			w.set.Status.CurrentRevision = w.revs["v1"].Name
			tc.setup(w)
			expect(t, Compute(w.input("v2")), iteronv1.RolloutProgressing, tc.actions)
		})
	}
}

// TestANewLeaderNeitherMovesANodeTwiceNorSkipsOne reads a rollout back from
// the activations alone, as a controller that just took over does (its
// status write lost): the wave in flight is waited for, and the next wave
// takes exactly the nodes not moved yet.
func TestANewLeaderNeitherMovesANodeTwiceNorSkipsOne(t *testing.T) {
	w := newWorld(5, canary(1, 30)).allOn("v1").on("node-1", "v2", wave(1)).on("node-2", "v2", wave(2), notReady).on("node-3", "v2", wave(2))
	w.set.Status = iteronv1.ActivationSetStatus{CurrentRevision: w.revs["v1"].Name, UpdateRevision: w.revs["v2"].Name, SoakedRevision: w.revs["v2"].Name}
	p := Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutProgressing, "")
	if p.Status.Wave != 2 || !reflect.DeepEqual(p.Status.WaveNodes, []string{"node-2", "node-3"}) {
		t.Fatalf("wave %d %v; want wave 2 [node-2 node-3]", p.Status.Wave, p.Status.WaveNodes)
	}
	w.ready("node-2")
	expect(t, Compute(w.input("v2")), iteronv1.RolloutProgressing, "Move node-4→v2@3, Move node-5→v2@3")

	// A status lost entirely: the stable revision is the one most nodes
	// are on besides the update.
	w.set.Status = iteronv1.ActivationSetStatus{}
	p = Compute(w.input("v2"))
	if p.Status.CurrentRevision != w.revs["v1"].Name {
		t.Fatalf("stable revision %q; want %s", p.Status.CurrentRevision, w.revs["v1"].Name)
	}
}

func TestAStalledNodeOnTheUpdateHaltsTheRollout(t *testing.T) {
	w := newWorld(5, canary(1, 30)).allOn("v1").on("node-1", "v2", wave(1)).on("node-2", "v2", wave(2)).on("node-3", "v2", wave(2), stalled("ActivationFailed"))
	w.set.Status = iteronv1.ActivationSetStatus{CurrentRevision: w.revs["v1"].Name, UpdateRevision: w.revs["v2"].Name, SoakedRevision: w.revs["v2"].Name}
	p := Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutHalted, "")
	h := p.Status.Halt
	if h == nil || h.Action != iteronv1.FailurePolicyHalt || h.Revision != w.revs["v2"].Name || !reflect.DeepEqual(h.Nodes, []string{"node-3"}) ||
		!strings.Contains(h.Message, "node node-3 is Stalled (ActivationFailed: swap of prompt_system failed at migrate)") || h.StateDisposition != "" {
		t.Fatalf("halt = %+v", h)
	}
	if p.Status.FailedNodes != 1 || p.Status.Failed[0] != (iteronv1.FailedNode{Node: "node-3", Activation: ActivationName("web", "node-3"),
		Revision: w.revs["v2"].Name, Reason: "ActivationFailed", Message: "swap of prompt_system failed at migrate"}) {
		t.Fatalf("failed = %d %+v", p.Status.FailedNodes, p.Status.Failed)
	}
	w.apply(t, p)

	// The halt stays when the node recovers by itself: a person resumes.
	w.ready("node-3")
	expect(t, Compute(w.input("v2")), iteronv1.RolloutHalted, "")

	// Resuming retries the Stalled node and goes on once it is Ready.
	w.acts["node-3"].Ready, w.acts["node-3"].Stalled = false, &metav1.Condition{Reason: "ActivationFailed", Message: "again"}
	w.set.Annotations[iteronv1.AnnotationResume] = "2026-12-01T12:05:00Z"
	p = Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutProgressing, "Retry node-3")
	if p.Status.Halt != nil || p.Status.LastHandledResumeAt != "2026-12-01T12:05:00Z" || p.Actions[0].Retry != "2026-12-01T12:05:00Z" {
		t.Fatalf("status after resume = %+v", p.Status)
	}
	w.apply(t, p)
	w.ready("node-3")
	expect(t, Compute(w.input("v2")), iteronv1.RolloutProgressing, "Move node-4→v2@3, Move node-5→v2@3")
}

func TestANewTemplateLiftsAHalt(t *testing.T) {
	w := newWorld(3, iteronv1.RolloutStrategy{MaxUnavailable: ptr.To(intstr.FromInt32(1))}).allOn("v1").on("node-1", "v2", wave(1), stalled("ActivationFailed"))
	w.set.Status = iteronv1.ActivationSetStatus{CurrentRevision: w.revs["v1"].Name, UpdateRevision: w.revs["v2"].Name,
		Halt: &iteronv1.RolloutHalt{Revision: w.revs["v2"].Name, Action: iteronv1.FailurePolicyHalt}}
	p := Compute(w.input("v3"))
	// The Stalled node is not Ready: it goes first and costs nothing, but
	// it already takes all of maxUnavailable 1.
	expect(t, p, iteronv1.RolloutProgressing, "Move node-1→v3@1")
	if p.Status.Halt != nil {
		t.Fatalf("halt kept: %+v", p.Status.Halt)
	}
}

func TestAStalledNodeTheRolloutDidNotMoveDoesNotHaltIt(t *testing.T) {
	w := newWorld(3, iteronv1.RolloutStrategy{MaxUnavailable: ptr.To(intstr.FromInt32(1))}).allOn("v1").on("node-3", "v1", stalled("LedgerCorrupt"))
	w.set.Status.CurrentRevision = w.revs["v1"].Name
	p := Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutProgressing, "Move node-3→v2@1")
	if p.Status.Halt != nil || p.Status.FailedNodes != 1 {
		t.Fatalf("status = %+v", p.Status)
	}
}

func TestRevertMovesTheNodesThatLeftTheStableRevisionBack(t *testing.T) {
	for _, disposition := range []iteronv1.StateDisposition{iteronv1.StateDispositionMigrate, iteronv1.StateDispositionDiscard} {
		t.Run(string(disposition), func(t *testing.T) {
			st := canary(1, 30)
			st.OnFailure, st.RevertStateDisposition = iteronv1.FailurePolicyRevert, disposition
			w := newWorld(5, st).allOn("v1").on("node-1", "v2", wave(1)).on("node-2", "v2", wave(2)).on("node-3", "v2", wave(2), stalled("ActivationFailed"))
			w.set.Status = iteronv1.ActivationSetStatus{CurrentRevision: w.revs["v1"].Name, UpdateRevision: w.revs["v2"].Name, SoakedRevision: w.revs["v2"].Name}
			d := ""
			if disposition == iteronv1.StateDispositionDiscard {
				d = "(discard)"
			}
			// The Stalled node goes back at no cost; one more fits in
			// maxUnavailable 2.
			p := Compute(w.input("v2"))
			expect(t, p, iteronv1.RolloutReverting, "Move node-3→v1"+d+", Move node-1→v1"+d)
			h := p.Status.Halt
			if h == nil || h.Action != iteronv1.FailurePolicyRevert || h.ToRevision != w.revs["v1"].Name || h.StateDisposition != disposition || p.Status.SoakedRevision != "" {
				t.Fatalf("halt = %+v, soaked %q", h, p.Status.SoakedRevision)
			}
			if p.Actions[0].RevertedFrom != "hashv2" || p.Actions[1].RevertedFrom != "hashv2" {
				t.Fatalf("actions = %+v", p.Actions)
			}
			w.apply(t, p)
			expect(t, Compute(w.input("v2")), iteronv1.RolloutReverting, "")
			w.ready("node-3", "node-1")
			p = Compute(w.input("v2"))
			expect(t, p, iteronv1.RolloutReverting, "Move node-2→v1"+d)
			w.apply(t, p)
			w.ready("node-2")
			p = Compute(w.input("v2"))
			expect(t, p, iteronv1.RolloutReverted, "")
			if !strings.Contains(p.Message, "3 nodes went back to revision "+w.revs["v1"].Name) || !strings.Contains(p.Message, string(disposition)) {
				t.Fatalf("message = %s", p.Message)
			}
			// A reverted activation keeps its stamped disposition: no
			// hand edit is seen, nothing is set back.
			expect(t, Compute(w.input("v2")), iteronv1.RolloutReverted, "")
		})
	}
}

func TestARevertThatFailsSaysSoAndDiscardFinishesIt(t *testing.T) {
	st := iteronv1.RolloutStrategy{MaxUnavailable: ptr.To(intstr.FromInt32(2)), OnFailure: iteronv1.FailurePolicyRevert, RevertStateDisposition: iteronv1.StateDispositionMigrate}
	w := newWorld(3, st).allOn("v1").on("node-1", "v1", stalled("ActivationFailed"), func(a *Activation) { a.RevertedFrom = "hashv2" })
	w.set.Status = iteronv1.ActivationSetStatus{CurrentRevision: w.revs["v1"].Name, UpdateRevision: w.revs["v2"].Name,
		Halt: &iteronv1.RolloutHalt{Revision: w.revs["v2"].Name, ToRevision: w.revs["v1"].Name, Action: iteronv1.FailurePolicyRevert, StateDisposition: iteronv1.StateDispositionMigrate, Message: "node node-2 is Stalled"}}
	p := Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutRevertFailed, "")
	if !strings.Contains(p.Message, "the revert to revision web-hashv1 failed on node node-1 (ActivationFailed") || !strings.Contains(p.Message, "revertStateDisposition: Discard") {
		t.Fatalf("message = %s", p.Message)
	}
	// The person switches to Discard: the reverted activation is stamped
	// again with it.
	w.set.Spec.Strategy.RevertStateDisposition = iteronv1.StateDispositionDiscard
	p = Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutReverting, "Restore node-1→v1(discard)")
	if p.Status.Halt.StateDisposition != iteronv1.StateDispositionDiscard {
		t.Fatalf("halt = %+v", p.Status.Halt)
	}
}

func TestAHandEditedActivationIsSetBackToItsRevision(t *testing.T) {
	w := newWorld(2, iteronv1.RolloutStrategy{}).allOn("v1")
	w.set.Status.CurrentRevision = w.revs["v1"].Name
	w.acts["node-2"].Spec.Sources[0].ImplementationID = "edited-by-hand"
	w.acts["node-2"].Spec.Paused = true
	p := Compute(w.input("v1"))
	expect(t, p, iteronv1.RolloutProgressing, "Restore node-2→v1")
	w.apply(t, p)
	if w.acts["node-2"].Spec.Sources[0].ImplementationID != "counter-v1" || w.acts["node-2"].Spec.Paused {
		t.Fatalf("spec after restore = %+v", w.acts["node-2"].Spec)
	}
}

func TestNodesJoinAtTheStableRevisionAndLeaveWithTheirActivation(t *testing.T) {
	w := newWorld(3, canary(1, 30)).allOn("v1").on("node-1", "v2", wave(1), notReady)
	w.set.Status = iteronv1.ActivationSetStatus{CurrentRevision: w.revs["v1"].Name, UpdateRevision: w.revs["v2"].Name}
	w.nodes = append(w.nodes, "node-4")
	w.nodes = w.nodes[1:] // node-1 no longer selected
	// With node-1 gone nobody is on v2 any more: the canary starts again,
	// within what the new node (not Ready yet) leaves of maxUnavailable 2.
	p := Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutProgressing, "Delete node-1, Create node-4→v1, Move node-2→v2@1")

	// Once the rollout is complete, new nodes get the update.
	w = newWorld(2, canary(1, 30)).allOn("v2")
	w.set.Status = iteronv1.ActivationSetStatus{CurrentRevision: w.revs["v2"].Name, UpdateRevision: w.revs["v2"].Name}
	w.nodes = append(w.nodes, "node-9")
	expect(t, Compute(w.input("v2")), iteronv1.RolloutProgressing, "Create node-9→v2")
}

func TestAPausedSetMovesNoNodeButStampsNewOnes(t *testing.T) {
	w := newWorld(3, canary(1, 30)).allOn("v1")
	w.set.Status.CurrentRevision = w.revs["v1"].Name
	w.set.Spec.Paused = true
	w.nodes = append(w.nodes, "node-4")
	p := Compute(w.input("v2"))
	expect(t, p, iteronv1.RolloutPaused, "Create node-4→v1")
	if !AtRest(p.Status.Phase) {
		t.Fatal("paused is a resting phase")
	}
}

func TestAnActivationTheSetDidNotStampIsAConflictAndIsLeftAlone(t *testing.T) {
	w := newWorld(2, iteronv1.RolloutStrategy{}).allOn("v1")
	w.set.Status.CurrentRevision = w.revs["v1"].Name
	w.acts["node-2"].Owned = false
	p := Compute(w.input("v1"))
	expect(t, p, iteronv1.RolloutCompleted, "")
	if len(p.Status.Conflicts) != 1 || p.Status.Conflicts[0].Node != "node-2" || p.Status.Conflicts[0].Reason != iteronv1.ConflictNotOwned ||
		p.Status.DesiredNodes != 2 || p.Status.UpdatedNodes != 1 {
		t.Fatalf("status = %+v", p.Status)
	}
	conds := Conditions(p.Status.Phase, p.Message, p.Status.Conflicts, 3)
	if conds[0].Status != metav1.ConditionFalse || conds[2].Status != metav1.ConditionTrue || conds[2].Reason != iteronv1.ReasonNodeConflict {
		t.Fatalf("conditions = %+v", conds)
	}
}

func TestNodesWhoseNamesCollideNeverShareAnActivation(t *testing.T) {
	w := newWorld(3, iteronv1.RolloutStrategy{})
	in := w.input("v1")
	in.Name = func(set, node string) string {
		if node == "node-3" {
			return "same-name"
		}
		if node == "node-2" {
			return "same-name"
		}
		return ActivationName(set, node)
	}
	p := Compute(in)
	expect(t, p, iteronv1.RolloutProgressing, "Create node-1→v1, Create node-2→v1")
	if len(p.Status.Conflicts) != 1 || p.Status.Conflicts[0].Node != "node-3" || p.Status.Conflicts[0].Reason != iteronv1.ConflictNameCollision ||
		!strings.Contains(p.Status.Conflicts[0].Message, "node-2") {
		t.Fatalf("conflicts = %+v", p.Status.Conflicts)
	}
}

func TestStampedNamesAreShortReadableAndDistinct(t *testing.T) {
	long := strings.Repeat("very-long-node-name.", 12) + "example.com"
	cases := []struct{ set, node, prefix string }{
		{"web", "worker-1", "web-worker-1-"},
		{"web", "Worker_1.Example.COM", "web-worker-1-example-c"},
		{"a-very-long-set-name-indeed", long, "a-very-long-very-long-node-nam-"},
		{"x", "-.-", "x-x-"},
	}
	seen := map[string]string{}
	for _, tc := range cases {
		n := ActivationName(tc.set, tc.node)
		if len(n) > MaxActivationName || !strings.HasPrefix(n, tc.prefix) || strings.Contains(n, "--") && tc.node != "-.-" {
			t.Errorf("ActivationName(%q, %q) = %q (%d characters); want ≤ %d starting %q", tc.set, tc.node, n, len(n), MaxActivationName, tc.prefix)
		}
		if n != ActivationName(tc.set, tc.node) {
			t.Errorf("ActivationName(%q, %q) is not deterministic", tc.set, tc.node)
		}
		if prior, ok := seen[n]; ok {
			t.Errorf("%q and %q share %q", prior, tc.node, n)
		}
		seen[n] = tc.node
	}
	if ActivationName("web", long+"a") == ActivationName("web", long+"b") {
		t.Error("two node names with the same prefix share a stamped name")
	}
}

func TestObserveReadsOnlyConditionsOfTheCurrentSpec(t *testing.T) {
	cond := func(t string, s metav1.ConditionStatus, gen int64) metav1.Condition {
		return metav1.Condition{Type: t, Status: s, ObservedGeneration: gen, Reason: "R"}
	}
	base := func() *iteronv1.ImplementationActivation {
		a := &iteronv1.ImplementationActivation{ObjectMeta: metav1.ObjectMeta{Name: "a", Generation: 2,
			OwnerReferences: []metav1.OwnerReference{{UID: "set-uid", Controller: ptr.To(true)}},
			Labels:          map[string]string{iteronv1.LabelRevision: "hashv2"}, Annotations: map[string]string{iteronv1.AnnotationWave: "3"}}}
		a.Status.ObservedGeneration = 2
		a.Status.Conditions = []metav1.Condition{cond("Ready", metav1.ConditionTrue, 2), cond("Reconciling", metav1.ConditionFalse, 2), cond("Stalled", metav1.ConditionFalse, 2)}
		return a
	}
	cases := []struct {
		name           string
		edit           func(*iteronv1.ImplementationActivation)
		ready, stalled bool
	}{
		{"Ready for its spec", func(*iteronv1.ImplementationActivation) {}, true, false},
		{"Ready for an older spec", func(a *iteronv1.ImplementationActivation) { a.Generation = 3 }, false, false},
		{"status of an older spec", func(a *iteronv1.ImplementationActivation) { a.Status.ObservedGeneration = 1 }, false, false},
		{"Ready but still reconciling", func(a *iteronv1.ImplementationActivation) { a.Status.Conditions[1].Status = metav1.ConditionTrue }, false, false},
		{"Stalled for its spec", func(a *iteronv1.ImplementationActivation) {
			a.Status.Conditions[0].Status, a.Status.Conditions[2].Status = metav1.ConditionFalse, metav1.ConditionTrue
		}, false, true},
		{"Stalled, with a retry the manager has not handled", func(a *iteronv1.ImplementationActivation) {
			a.Status.Conditions[0].Status, a.Status.Conditions[2].Status = metav1.ConditionFalse, metav1.ConditionTrue
			a.Annotations[iteronv1.AnnotationRetry] = "now"
		}, false, false},
		{"Stalled, with a retry the manager handled", func(a *iteronv1.ImplementationActivation) {
			a.Status.Conditions[0].Status, a.Status.Conditions[2].Status = metav1.ConditionFalse, metav1.ConditionTrue
			a.Annotations[iteronv1.AnnotationRetry], a.Status.LastHandledRetryAt = "now", "now"
		}, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := base()
			tc.edit(a)
			o := Observe(a, "set-uid")
			if o.Ready != tc.ready || (o.Stalled != nil) != tc.stalled || !o.Owned || o.Revision != "hashv2" || o.Wave != 3 {
				t.Fatalf("Observe = ready %v stalled %v owned %v revision %q wave %d; want ready %v stalled %v", o.Ready, o.Stalled != nil, o.Owned, o.Revision, o.Wave, tc.ready, tc.stalled)
			}
		})
	}
	if Observe(base(), "other-set").Owned {
		t.Fatal("an activation another set controls reads as owned")
	}
}

func TestConditionsPerPhase(t *testing.T) {
	cases := []struct {
		phase                       iteronv1.RolloutPhase
		ready, reconciling, stalled metav1.ConditionStatus
		reason                      string
	}{
		{iteronv1.RolloutProgressing, "False", "True", "False", iteronv1.ReasonProgressing},
		{iteronv1.RolloutSoaking, "False", "True", "False", iteronv1.ReasonSoaking},
		{iteronv1.RolloutReverting, "False", "True", "False", iteronv1.ReasonRolloutReverting},
		{iteronv1.RolloutCompleted, "True", "False", "False", iteronv1.ReasonSucceeded},
		{iteronv1.RolloutPaused, "False", "False", "False", iteronv1.ReasonPaused},
		{iteronv1.RolloutHalted, "False", "False", "True", iteronv1.ReasonRolloutHalted},
		{iteronv1.RolloutReverted, "False", "False", "True", iteronv1.ReasonRolloutReverted},
		{iteronv1.RolloutRevertFailed, "False", "False", "True", iteronv1.ReasonRevertFailed},
		{"", "False", "False", "True", iteronv1.ReasonInvalidSpec},
	}
	for _, tc := range cases {
		c := Conditions(tc.phase, "msg", nil, 7)
		got := []metav1.ConditionStatus{c[0].Status, c[1].Status, c[2].Status}
		if !reflect.DeepEqual(got, []metav1.ConditionStatus{tc.ready, tc.reconciling, tc.stalled}) || c[0].Reason != tc.reason || c[0].ObservedGeneration != 7 {
			t.Errorf("%q: Ready/Reconciling/Stalled = %v reason %s; want %v/%v/%v reason %s", tc.phase, got, c[0].Reason, tc.ready, tc.reconciling, tc.stalled, tc.reason)
		}
	}
}

// TestStampedComparesEveryFieldOfTheSpec changes each leaf field of a
// stamped spec in turn (found by reflection, so a field added to the API is
// covered) and expects Stamped to see the difference.
func TestStampedComparesEveryFieldOfTheSpec(t *testing.T) {
	tpl := template("counter-v1")
	tpl.CapabilityCeiling = []iteronv1.Capability{iteronv1.CapabilityReadOnly}
	tpl.Swap.DeadlineSeconds, tpl.Swap.QuiesceTimeoutSeconds = 30, ptr.To[int32](10)
	tpl.Checkpoint.IntervalSeconds, tpl.GenerationHistoryLimit = ptr.To[int32](60), ptr.To[int32](10)
	// Paths and oci are alternatives to the API server, not to Stamped.
	tpl.Sources[0].OCI = &iteronv1.OCISource{Ref: "registry.example/iteron/counter@sha256:" + strings.Repeat("a", 64)}
	tpl.Probes = []iteronv1.ActivationProbe{{Name: "upper", Module: "prompt_system", Input: `{"text":"abc"}`, Check: `result.upper == "ABC"`, TimeoutMilliseconds: ptr.To[int32](500)}}
	tpl.Sources[0].Sandbox = &iteronv1.SourceSandbox{Require: iteronv1.SandboxLevelIsolated, Memory: ptr.To(resource.MustParse("256Mi")),
		CPU: ptr.To(resource.MustParse("500m")), Tasks: ptr.To[int32](64), Tmp: ptr.To(resource.MustParse("16Mi"))}
	base := StampSpec(tpl, "node-1", false)
	if !Stamped(&base, tpl, "node-1", false) {
		t.Fatal("a stamped spec does not read as stamped")
	}
	if Stamped(&base, tpl, "node-1", true) {
		t.Fatal("a spec stamped without discard reads as stamped with it")
	}
	if d := StampSpec(tpl, "node-1", true); !Stamped(&d, tpl, "node-1", true) {
		t.Fatal("a spec stamped with discard does not read as stamped with it")
	}
	var leaves []string
	quantity := reflect.TypeOf(resource.Quantity{})
	var walk func(v reflect.Value, path string)
	walk = func(v reflect.Value, path string) {
		switch {
		case v.Type() == quantity:
			// A quantity is one value (its fields are its encoding).
			leaves = append(leaves, path)
			return
		}
		switch v.Kind() {
		case reflect.Struct:
			for i := range v.NumField() {
				walk(v.Field(i), path+"."+v.Type().Field(i).Name)
			}
			return
		case reflect.Slice:
			if v.Len() == 0 {
				t.Fatalf("%s: give the test template an item here", path)
			}
			walk(v.Index(0), path+"[0]")
			return
		case reflect.Pointer:
			if v.IsNil() {
				t.Fatalf("%s: give the test template a value here", path)
			}
			walk(v.Elem(), path+"*")
			return
		}
		leaves = append(leaves, path)
	}
	walk(reflect.ValueOf(&base).Elem(), "spec")
	for i, path := range leaves {
		spec := *base.DeepCopy()
		var change func(v reflect.Value, n int) bool
		n := -1
		change = func(v reflect.Value, _ int) bool {
			if v.Type() == quantity {
				n++
				if n != i {
					return false
				}
				q := v.Interface().(resource.Quantity)
				q.Add(resource.MustParse("1"))
				v.Set(reflect.ValueOf(q))
				return true
			}
			switch v.Kind() {
			case reflect.Struct:
				for j := range v.NumField() {
					if change(v.Field(j), 0) {
						return true
					}
				}
				return false
			case reflect.Slice:
				return change(v.Index(0), 0)
			case reflect.Pointer:
				return change(v.Elem(), 0)
			}
			n++
			if n != i {
				return false
			}
			switch v.Kind() {
			case reflect.String:
				v.SetString(v.String() + "x")
			case reflect.Bool:
				v.SetBool(!v.Bool())
			case reflect.Int32, reflect.Int64, reflect.Int:
				v.SetInt(v.Int() + 1)
			default:
				t.Fatalf("%s: teach the test to change a %s", path, v.Kind())
			}
			return true
		}
		change(reflect.ValueOf(&spec).Elem(), 0)
		if Stamped(&spec, tpl, "node-1", false) {
			t.Errorf("a change of %s is not seen by Stamped", path)
		}
	}
	if len(leaves) < 12 {
		t.Fatalf("only %d leaves found: %v", len(leaves), leaves)
	}
}
