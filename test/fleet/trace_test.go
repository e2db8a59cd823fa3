package fleet

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/labels"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/cmd/manager/app"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/internal/tracing"
	"iteron.dev/operator/test/fleettest"
	"iteron.dev/operator/test/otlptest"
)

// TestATracedRolloutIsATraceOfItsWavesAndEachStampNamesItsNodesSpan runs
// the fleet controller in this process with tracing on (the OTEL_*
// variables, exporting over OTLP/gRPC to a receiver), deploys counter v1
// on the five pool nodes and rolls v2 out (a canary, then waves of two),
// and reads what the receiver got: per revision one "rollout" root, a
// "wave N" below it per wave, a "node X" below its wave per node stamped;
// every stamped activation's iteron.dev/traceparent names its node's span,
// and it came in the stamp's own request: the controller wrote each
// activation once per stamp (one create, one update for the move), and no
// version of an activation changed the traceparent without the revision.
//
// The node managers are the suite's processes, started without the OTEL_*
// variables: their transactions are not traced here, so the link from a
// transaction to its node span is left to the coordinator (hotswap's
// startTxnTrace links every transaction root to Desired.RolloutSpan, which
// the activation controller reads from this annotation).
func TestATracedRolloutIsATraceOfItsWavesAndEachStampNamesItsNodesSpan(t *testing.T) {
	v1 := source(t, artifacts.CounterV1Down, "counter-v1")
	v2 := source(t, artifacts.CounterV2, "counter-v2")

	// The suite's fleet-controller processes make way for this one (they
	// do not trace to this receiver); two new ones are started when the
	// test ends, after the OTEL_* variables are restored (cleanups run
	// last first).
	t.Cleanup(func() {
		for range 2 {
			if _, err := startFleet(); err != nil {
				t.Errorf("restart a fleet controller: %v", err)
			}
		}
	})
	for _, p := range fleetProcs() {
		p.Stop()
	}
	rcv := otlptest.TraceTo(t, "iteron-fleet")
	writes := runTracedFleet(t)
	key := client.ObjectKey{Namespace: ns, Name: "traced"}
	h := watchStamps(t, key)

	key = newSet(t, key.Name, template(v1), canary(1, iteronv1.FailurePolicyHalt))
	first := waitSet(t, key, "Completed (first deployment)", fleettest.Completed)
	created := writes.take()
	w := watchRollout(t, key)
	editSet(t, key, func(s *iteronv1.ActivationSet) { s.Spec.Template = template(v2) })
	done := waitSet(t, key, "Completed on v2", fleettest.Completed)
	w.stop()
	moved := writes.take()
	update := strings.TrimPrefix(done.Status.UpdateRevision, key.Name+"-")
	order, byWave := waves(w.movesTo(update))
	t.Logf("the controller's writes to activations: first deployment %v, rollout %v; waves of the rollout %v", created, moved, order)

	// The writes: one create per node, then one update per node moved.
	if want := map[string]int{"POST": 5}; fmt.Sprint(created) != fmt.Sprint(want) {
		t.Errorf("the first deployment wrote activations %v; want %v", created, want)
	}
	if want := map[string]int{"PUT": 5}; fmt.Sprint(moved) != fmt.Sprint(want) {
		t.Errorf("the rollout wrote activations %v; want %v (one update per node moved)", moved, want)
	}
	if extra := h.traceparentAlone(); len(extra) > 0 {
		t.Errorf("versions that changed the traceparent and not the revision: %v", extra)
	}

	// The traces.
	acts, err := fleettest.Stamped(env.Client, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(acts) != 5 {
		t.Fatalf("%d stamped activations; want 5", len(acts))
	}
	stamps := map[string]string{} // node → traceparent
	for _, a := range acts {
		stamps[a.Spec.NodeName] = a.Annotations[iteronv1.AnnotationTraceparent]
		if a.Generation != 2 {
			t.Errorf("%s is at generation %d; want 2 (stamped once, moved once)", a.Name, a.Generation)
		}
	}
	rolloutOf := func(rev string) func([]otlptest.Span) bool {
		return func(spans []otlptest.Span) bool {
			for _, s := range spans {
				if s.Name == "rollout" && s.Attr(string(tracing.RevisionKey)) == rev {
					return true
				}
			}
			return false
		}
	}
	spans := rcv.WaitFor(t, "the rollout of "+done.Status.UpdateRevision, rolloutOf(done.Status.UpdateRevision))
	spans = rcv.WaitFor(t, "the first deployment's", rolloutOf(first.Status.UpdateRevision))
	wantWaves := map[string][]string{}
	for _, wave := range order {
		wantWaves["wave "+wave] = nodesOf(byWave[wave])
	}
	if fmt.Sprint(wantWaves) != fmt.Sprint(map[string][]string{"wave 1": {"fleet-1"}, "wave 2": {"fleet-2", "fleet-3"}, "wave 3": {"fleet-4", "fleet-5"}}) {
		t.Errorf("the rollout moved %v; want the canary fleet-1, then fleet-2 and 3, then fleet-4 and 5", wantWaves)
	}
	rollout := checkRolloutTrace(t, spans, key, done.Status.UpdateRevision, wantWaves, stamps)
	// The first deployment created every node on v1 at once: wave 0. Its
	// stamps' traceparents were replaced by the moves'.
	pool := map[string][]string{"wave 0": {"fleet-1", "fleet-2", "fleet-3", "fleet-4", "fleet-5"}}
	deployment := checkRolloutTrace(t, spans, key, first.Status.UpdateRevision, pool, h.firstTraceparents())
	t.Logf("trace %s: the first deployment (revision %s); trace %s: the rollout of revision %s; every activation's iteron.dev/traceparent names its node's span",
		deployment.TraceID(), first.Status.UpdateRevision, rollout.TraceID(), done.Status.UpdateRevision)
}

// activationWrites counts the fleet controller's requests that change an
// ImplementationActivation (not its status), by method.
type activationWrites struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *activationWrites) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		if req.Method != http.MethodGet && strings.Contains(req.URL.Path, "/implementationactivations") && !strings.HasSuffix(req.URL.Path, "/status") {
			c.mu.Lock()
			c.n[req.Method]++
			c.mu.Unlock()
		}
		return rt.RoundTrip(req)
	})
}

// take returns the counts so far and starts again.
func (c *activationWrites) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.n
	c.n = map[string]int{}
	return out
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// runTracedFleet runs the fleet controller in this process, as its service
// account, until the test ends; it counts its writes to activations.
func runTracedFleet(t *testing.T) *activationWrites {
	t.Helper()
	writes := &activationWrites{n: map[string]int{}}
	cfg := fleettest.As(env.Config, fleettest.FleetUser)
	cfg.WrapTransport = writes.wrap
	f, err := app.NewFleet(cfg, app.FleetOptions{MetricsBindAddress: "0", HealthProbeBindAddress: "0",
		Log: ctrllog.Log.WithName("traced-fleet"), SkipControllerNameValidation: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		if err := f.Run(ctx); err != nil {
			t.Errorf("the fleet controller: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-stopped })
	return writes
}

// stampHistory is every version of a set's activations a watch saw: what
// a version changed of the revision label and the traceparent.
type stampHistory struct {
	mu sync.Mutex
	// last is each activation's last version seen, by name.
	last map[string]stampVersion
	// alone are the versions that changed the traceparent and kept the
	// revision.
	alone []string
	// first is each node's traceparent at its creation.
	first map[string]string
}

type stampVersion struct{ revision, traceparent string }

func watchStamps(t *testing.T, key client.ObjectKey) *stampHistory {
	t.Helper()
	h := &stampHistory{last: map[string]stampVersion{}, first: map[string]string{}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	sel := labels.SelectorFromSet(labels.Set{iteronv1.LabelActivationSet: key.Name})
	c, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}},
		ByObject: map[client.Object]cache.ByObject{&iteronv1.ImplementationActivation{}: {Label: sel}}})
	if err != nil {
		t.Fatal(err)
	}
	inf, err := c.GetInformer(ctx, &iteronv1.ImplementationActivation{})
	if err != nil {
		t.Fatal(err)
	}
	on := func(obj any) {
		a, ok := obj.(*iteronv1.ImplementationActivation)
		if !ok {
			return
		}
		v := stampVersion{revision: a.Labels[iteronv1.LabelRevision], traceparent: a.Annotations[iteronv1.AnnotationTraceparent]}
		h.mu.Lock()
		defer h.mu.Unlock()
		prev, seen := h.last[a.Name]
		switch {
		case !seen:
			h.first[a.Spec.NodeName] = v.traceparent
		case prev.traceparent != v.traceparent && prev.revision == v.revision:
			h.alone = append(h.alone, fmt.Sprintf("%s@%s (%s → %s)", a.Name, a.ResourceVersion, prev.traceparent, v.traceparent))
		}
		h.last[a.Name] = v
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: on, UpdateFunc: func(_, n any) { on(n) }}); err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("the watch's cache did not sync")
	}
	return h
}

func (h *stampHistory) traceparentAlone() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.alone)
}

func (h *stampHistory) firstTraceparents() map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]string{}
	for k, v := range h.first {
		out[k] = v
	}
	return out
}

// checkRolloutTrace checks the trace of a rollout of revision rev: one
// root "rollout" (the set's, always sampled), below it a span per wave
// (wave name → its nodes), below each wave a span per node whose span ID
// is the one its stamp's traceparent (stamps: node → traceparent) names.
// It returns the root.
func checkRolloutTrace(t *testing.T, spans []otlptest.Span, key client.ObjectKey, rev string, waves map[string][]string, stamps map[string]string) otlptest.Span {
	t.Helper()
	var roots []otlptest.Span
	for _, s := range spans {
		if s.Name == "rollout" && s.Attr(string(tracing.RevisionKey)) == rev {
			roots = append(roots, s)
		}
	}
	if len(roots) != 1 {
		t.Fatalf("%d rollout spans of revision %s; want one", len(roots), rev)
	}
	root := roots[0]
	if root.ParentID() != "" || root.Attr(string(tracing.KindKey)) != tracing.KindRollout || root.Attr(string(tracing.ActivationSetKey)) != key.String() ||
		root.Attr(string(tracing.OutcomeKey)) != string(iteronv1.RolloutCompleted) {
		t.Errorf("the rollout span of %s: parent %q, kind %q, set %q, outcome %q", rev, root.ParentID(), root.Attr(string(tracing.KindKey)),
			root.Attr(string(tracing.ActivationSetKey)), root.Attr(string(tracing.OutcomeKey)))
	}
	got := map[string][]string{}
	waveOf := map[string]string{} // span ID → wave name
	for _, s := range spans {
		if s.TraceID() == root.TraceID() && strings.HasPrefix(s.Name, "wave ") {
			if _, dup := got[s.Name]; dup || s.ParentID() != root.SpanID() {
				t.Errorf("%s of revision %s: parent %s, seen before %v; want one, below the rollout span %s", s.Name, rev, s.ParentID(), dup, root.SpanID())
			}
			got[s.Name] = []string{}
			waveOf[s.SpanID()] = s.Name
		}
	}
	for _, s := range spans {
		if s.TraceID() != root.TraceID() || !strings.HasPrefix(s.Name, "node ") {
			continue
		}
		node := strings.TrimPrefix(s.Name, "node ")
		wave, ok := waveOf[s.ParentID()]
		if !ok {
			t.Errorf("%s of revision %s is not below a wave", s.Name, rev)
			continue
		}
		got[wave] = append(got[wave], node)
		if tp := strings.Split(stamps[node], "-"); len(tp) != 4 || tp[1] != s.TraceID() || tp[2] != s.SpanID() {
			t.Errorf("%s's stamp at revision %s carried traceparent %q; want trace %s span %s (its node span)", node, rev, stamps[node], s.TraceID(), s.SpanID())
		}
		if s.Attr(string(tracing.NodeKey)) != node || s.Attr(string(tracing.OutcomeKey)) != "Ready" {
			t.Errorf("%s of revision %s: node %q, outcome %q; want Ready", s.Name, rev, s.Attr(string(tracing.NodeKey)), s.Attr(string(tracing.OutcomeKey)))
		}
	}
	for w := range got {
		sort.Strings(got[w])
	}
	if fmt.Sprint(got) != fmt.Sprint(waves) {
		t.Errorf("the trace of revision %s has waves %v; want %v", rev, got, waves)
	}
	return root
}
