package fleet

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/tracing"
	"iteron.dev/operator/test/otlptest"
)

// reconcile is one reconcile as the controller makes it: Compute, the
// trace's view of it, the stamps' traceparents, and the writes (the
// world's apply); the clock then moves a second on.
func (w *world) reconcile(t *testing.T, traces *RolloutTraces, update string) Plan {
	t.Helper()
	in := w.input(update)
	p := Compute(in)
	traces.Observe(&in, &p)
	traces.Stamp(w.set, p.Actions, w.now)
	w.apply(t, p)
	w.now = w.now.Add(time.Second)
	return p
}

func attr(s sdktrace.ReadOnlySpan, key attribute.Key) string {
	for _, a := range s.Attributes() {
		if a.Key == key {
			return a.Value.Emit()
		}
	}
	return ""
}

// spanTree checks the ended spans of one rollout trace: a root "rollout"
// of revision rev, and under it waves (wave number → its nodes, in any
// order) whose node spans are the ones the stamps named (stamps: node →
// traceparent). It returns the root.
func spanTree(t *testing.T, spans []sdktrace.ReadOnlySpan, rev string, waves map[string][]string, stamps map[string]string) sdktrace.ReadOnlySpan {
	t.Helper()
	var root sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == "rollout" && attr(s, tracing.RevisionKey) == rev {
			if root != nil {
				t.Fatalf("two rollout spans of revision %s", rev)
			}
			root = s
		}
	}
	if root == nil {
		t.Fatalf("no rollout span of revision %s among %d spans", rev, len(spans))
	}
	if root.Parent().IsValid() || attr(root, tracing.KindKey) != tracing.KindRollout || attr(root, tracing.ActivationSetKey) != "default/web" {
		t.Errorf("rollout span: parent %v, attributes %v", root.Parent(), root.Attributes())
	}
	tid := root.SpanContext().TraceID()
	got := map[string][]string{}
	waveOf := map[trace.SpanID]string{}
	for _, s := range spans {
		if s.SpanContext().TraceID() == tid && strings.HasPrefix(s.Name(), "wave ") {
			if s.Parent().SpanID() != root.SpanContext().SpanID() {
				t.Errorf("%s is not a child of the rollout span", s.Name())
			}
			if _, dup := got[s.Name()]; dup {
				t.Errorf("two spans %q", s.Name())
			}
			got[s.Name()] = []string{}
			waveOf[s.SpanContext().SpanID()] = s.Name()
		}
	}
	for _, s := range spans {
		if s.SpanContext().TraceID() != tid || !strings.HasPrefix(s.Name(), "node ") {
			continue
		}
		node := strings.TrimPrefix(s.Name(), "node ")
		wave, ok := waveOf[s.Parent().SpanID()]
		if !ok {
			t.Errorf("%s is not below a wave", s.Name())
			continue
		}
		if attr(s, tracing.NodeKey) != node || "wave "+attr(s, tracing.WaveKey) != wave {
			t.Errorf("%s: attributes %v under %s", s.Name(), s.Attributes(), wave)
		}
		if want := traceparent(s.SpanContext()); stamps[node] != want {
			t.Errorf("%s's stamp carried traceparent %q; want its span's %q", node, stamps[node], want)
		}
		got[wave] = append(got[wave], node)
	}
	for w := range got {
		slices.Sort(got[w])
	}
	if fmt.Sprint(got) != fmt.Sprint(waves) {
		t.Errorf("waves %v; want %v", got, waves)
	}
	return root
}

func stampsOf(p Plan, into map[string]string) {
	for _, a := range p.Actions {
		if a.Traceparent != "" {
			into[a.Node] = a.Traceparent
		}
	}
}

// TestARolloutIsATraceOfItsWavesWithASpanPerNodeStamped walks a rollout of
// five nodes (a canary soaked 30 s, then waves of two) and reads its
// trace: a root span, a span per wave, a span per node under its wave
// whose context is the traceparent its stamp carried; a wave ends (at its
// last node's end, not at the soak's) once the next one starts, the rest
// when the rollout completed.
func TestARolloutIsATraceOfItsWavesWithASpanPerNodeStamped(t *testing.T) {
	sr := otlptest.Record(t, sdktrace.ParentBased(sdktrace.NeverSample()))
	w := newWorld(5, canary(1, 30)).allOn("v1")
	w.set.Status.CurrentRevision = w.revs["v1"].Name
	traces := &RolloutTraces{}
	stamps := map[string]string{}
	nodeEnd := map[string]time.Time{}
	endedWaves := func() []string {
		var out []string
		for _, s := range sr.Ended() {
			if strings.HasPrefix(s.Name(), "wave ") {
				out = append(out, s.Name())
			}
		}
		slices.Sort(out)
		return out
	}
	for range 20 {
		p := w.reconcile(t, traces, "v2")
		stampsOf(p, stamps)
		if p.Status.Phase == iteronv1.RolloutCompleted {
			break
		}
		w.now = w.now.Add(p.RequeueAfter) // the soak passes
		if len(p.Actions) > 0 && p.Actions[0].Wave == 3 {
			if got := endedWaves(); !slices.Equal(got, []string{"wave 1", "wave 2"}) {
				t.Errorf("as wave 3 starts the waves ended are %v; want waves 1 and 2", got)
			}
		}
		for _, a := range p.Actions {
			w.ready(a.Node)
			nodeEnd[a.Node] = w.now // the next reconcile sees it Ready
		}
	}
	if len(sr.Started()) != len(sr.Ended()) {
		t.Fatalf("%d spans started, %d ended", len(sr.Started()), len(sr.Ended()))
	}
	root := spanTree(t, sr.Ended(), w.revs["v2"].Name, map[string][]string{
		"wave 1": {"node-1"}, "wave 2": {"node-2", "node-3"}, "wave 3": {"node-4", "node-5"},
	}, stamps)
	if attr(root, tracing.OutcomeKey) != string(iteronv1.RolloutCompleted) || root.Status().Code == codes.Error {
		t.Errorf("rollout span: outcome %q status %v", attr(root, tracing.OutcomeKey), root.Status())
	}
	for _, s := range sr.Ended() {
		switch {
		case strings.HasPrefix(s.Name(), "node "):
			if node := strings.TrimPrefix(s.Name(), "node "); !s.EndTime().Equal(nodeEnd[node]) || attr(s, tracing.OutcomeKey) != "Ready" {
				t.Errorf("%s ended at %s (%s); want when the reconcile saw it Ready, %s", s.Name(), s.EndTime(), attr(s, tracing.OutcomeKey), nodeEnd[node])
			}
		case strings.HasPrefix(s.Name(), "wave "):
			var last time.Time
			for _, c := range sr.Ended() {
				if c.Parent().SpanID() == s.SpanContext().SpanID() && c.EndTime().After(last) {
					last = c.EndTime()
				}
			}
			if !s.EndTime().Equal(last) {
				t.Errorf("%s ended at %s; want with its last node, %s", s.Name(), s.EndTime(), last)
			}
		}
	}
	if len(traces.sets) != 0 {
		t.Errorf("the registry keeps %d sets after the rollout completed", len(traces.sets))
	}
}

// TestAWaveMovedInBatchesIsOneSpan: a wave of two nodes with
// maxUnavailable 1 moves one node, then the other once the first is Ready;
// both are below one span "wave 1", which ends with the second.
func TestAWaveMovedInBatchesIsOneSpan(t *testing.T) {
	sr := otlptest.Record(t, sdktrace.ParentBased(sdktrace.NeverSample()))
	w := newWorld(3, iteronv1.RolloutStrategy{MaxUnavailable: ptr.To(intstr.FromInt32(1)),
		Steps: []iteronv1.RolloutStep{waveStep(func(s *iteronv1.WaveStep) { s.Nodes = ptr.To[int32](2) })}}).allOn("v1")
	w.set.Status.CurrentRevision = w.revs["v1"].Name
	traces := &RolloutTraces{}
	stamps := map[string]string{}
	for range 20 {
		p := w.reconcile(t, traces, "v2")
		stampsOf(p, stamps)
		if p.Status.Phase == iteronv1.RolloutCompleted {
			break
		}
		for _, a := range p.Actions {
			w.ready(a.Node)
		}
	}
	spanTree(t, sr.Ended(), w.revs["v2"].Name, map[string][]string{"wave 1": {"node-1", "node-2"}, "wave 2": {"node-3"}}, stamps)
}

// TestANodeThatStallsFailsItsSpanAndTheHaltFailsTheRollout: the canary
// goes Stalled; its span fails with the condition's reason and the
// rollout's with the halt's cause.
func TestANodeThatStallsFailsItsSpanAndTheHaltFailsTheRollout(t *testing.T) {
	sr := otlptest.Record(t, sdktrace.ParentBased(sdktrace.NeverSample()))
	w := newWorld(3, canary(1, 0)).allOn("v1")
	w.set.Status.CurrentRevision = w.revs["v1"].Name
	traces := &RolloutTraces{}
	expect(t, w.reconcile(t, traces, "v2"), iteronv1.RolloutProgressing, "Move node-1→v2@1")
	stalled(iteronv1.ReasonProbeFailed)(w.acts["node-1"])
	expect(t, w.reconcile(t, traces, "v2"), iteronv1.RolloutHalted, "")
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range sr.Ended() {
		byName[s.Name()] = s
	}
	node, root := byName["node node-1"], byName["rollout"]
	if node == nil || root == nil || byName["wave 1"] == nil || len(sr.Ended()) != 3 {
		t.Fatalf("ended spans %v; want the rollout, wave 1 and node node-1", byName)
	}
	if node.Status().Code != codes.Error || attr(node, tracing.ReasonKey) != iteronv1.ReasonProbeFailed || attr(node, tracing.OutcomeKey) != "Stalled" {
		t.Errorf("node span: status %v, attributes %v", node.Status(), node.Attributes())
	}
	if root.Status().Code != codes.Error || attr(root, tracing.ReasonKey) != string(iteronv1.HaltProbeFailed) || attr(root, tracing.OutcomeKey) != string(iteronv1.RolloutHalted) {
		t.Errorf("rollout span: status %v, attributes %v", root.Status(), root.Attributes())
	}
}

// TestANewerTemplateSupersedesTheRolloutUnderWay: the template changes
// while the canary of v2 is not Ready; the canary moves to v3 in a trace of
// v3's, and v2's trace ends, its node superseded.
func TestANewerTemplateSupersedesTheRolloutUnderWay(t *testing.T) {
	sr := otlptest.Record(t, sdktrace.ParentBased(sdktrace.NeverSample()))
	w := newWorld(3, canary(1, 0)).allOn("v1")
	w.set.Status.CurrentRevision = w.revs["v1"].Name
	traces := &RolloutTraces{}
	first := w.reconcile(t, traces, "v2")
	expect(t, first, iteronv1.RolloutProgressing, "Move node-1→v2@1")
	next := w.reconcile(t, traces, "v3")
	expect(t, next, iteronv1.RolloutProgressing, "Move node-1→v3@1")
	if first.Actions[0].Traceparent == "" || next.Actions[0].Traceparent == first.Actions[0].Traceparent {
		t.Fatalf("traceparents %q then %q; want two", first.Actions[0].Traceparent, next.Actions[0].Traceparent)
	}
	var v2 []string
	for _, s := range sr.Ended() {
		v2 = append(v2, s.Name()+"="+attr(s, tracing.OutcomeKey))
	}
	slices.Sort(v2)
	if want := []string{"node node-1=Superseded", "rollout=Superseded", "wave 1="}; !slices.Equal(v2, want) {
		t.Errorf("ended %v; want %v", v2, want)
	}
	if open := len(sr.Started()) - len(sr.Ended()); open != 3 {
		t.Errorf("%d spans open; want v3's rollout, wave 1 and node node-1", open)
	}
	traces.Forget(types.NamespacedName{Namespace: "default", Name: "web"}, w.now)
	if len(sr.Started()) != len(sr.Ended()) || len(traces.sets) != 0 {
		t.Errorf("after Forget: %d spans started, %d ended, %d sets kept", len(sr.Started()), len(sr.Ended()), len(traces.sets))
	}
	for _, s := range sr.Ended()[3:] {
		if attr(s, tracing.OutcomeKey) != "Deleted" && !strings.HasPrefix(s.Name(), "wave ") {
			t.Errorf("%s ended %q; want Deleted", s.Name(), attr(s, tracing.OutcomeKey))
		}
	}
}

// TestAStampDecidedAgainKeepsItsNodesSpan: a move whose write conflicted
// is decided again from the newer copy; it carries the same traceparent
// and the node has one span.
func TestAStampDecidedAgainKeepsItsNodesSpan(t *testing.T) {
	sr := otlptest.Record(t, sdktrace.ParentBased(sdktrace.NeverSample()))
	w := newWorld(3, canary(1, 0)).allOn("v1")
	w.set.Status.CurrentRevision = w.revs["v1"].Name
	traces := &RolloutTraces{}
	var tps []string
	for range 2 {
		in := w.input("v2")
		p := Compute(in)
		traces.Observe(&in, &p)
		traces.Stamp(w.set, p.Actions, w.now)
		expect(t, p, iteronv1.RolloutProgressing, "Move node-1→v2@1")
		tps = append(tps, p.Actions[0].Traceparent)
		w.now = w.now.Add(time.Second) // the write conflicted: nothing applied
	}
	if tps[0] == "" || tps[0] != tps[1] || len(sr.Started()) != 3 {
		t.Errorf("traceparents %q, %d spans started; want one traceparent and the rollout, wave 1 and node node-1", tps, len(sr.Started()))
	}
}

// TestWithTracingOffARolloutStampsNoTraceparentAndAllocatesNothing: the
// reconcile path pays nothing for the trace while tracing is off.
func TestWithTracingOffARolloutStampsNoTraceparentAndAllocatesNothing(t *testing.T) {
	if tracing.Enabled() {
		t.Fatal("tracing is on")
	}
	w := newWorld(5, canary(1, 0)).allOn("v1")
	w.set.Status.CurrentRevision = w.revs["v1"].Name
	traces := &RolloutTraces{}
	in := w.input("v2")
	p := Compute(in)
	allocs := testing.AllocsPerRun(100, func() {
		traces.Observe(&in, &p)
		traces.Stamp(w.set, p.Actions, w.now)
	})
	if allocs != 0 || p.Actions[0].Traceparent != "" || traces.sets != nil {
		t.Errorf("%.0f allocations, traceparent %q, %d sets; want none", allocs, p.Actions[0].Traceparent, len(traces.sets))
	}
}
