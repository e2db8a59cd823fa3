package crash

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
)

// cfIrreversibleCeiling is a node ceiling that admits irreversible_external:
// the runs of a provider admitted it leave receipts.
const cfIrreversibleCeiling = "--capability-ceiling=read_only,reversible_local,irreversible_external"

// cfIrreversibleSource lays out the counter as implementation id requesting
// irreversible_external, in its own root and catalog.
func cfIrreversibleSource(t *testing.T, id string) iteronv1.ActivationSource {
	t.Helper()
	impl := providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2, Module: "prompt_system", ImplementationID: id,
		Capabilities: []string{"irreversible_external"}})
	s := providertest.Catalog(t, impl)[0]
	return iteronv1.ActivationSource{Module: "prompt_system", ImplementationID: id, CatalogPath: s.CatalogPath, ArtifactRoot: s.ArtifactRoot,
		ManifestSHA256: s.ManifestSHA256, ArtifactSHA256: s.ArtifactSHA256}
}

// TestReceiptsLostWithARestartAreReportedIncompleteNeverAsACleanZero: a
// generation whose runs left receipts is relaunched by a restarted manager;
// its Generation status says the evidence is incomplete (truncated, with the
// restart named) at every write after the restart, never a clean count of
// zero; a generation that starts after the restart reports complete
// evidence.
func TestReceiptsLostWithARestartAreReportedIncompleteNeverAsACleanZero(t *testing.T) {
	n := newNode(t)
	start := time.Now()
	step := func(what string) { t.Logf("%6.1fs %s", time.Since(start).Seconds(), what) }
	// Checkpoints every second: a checkpoint is what makes the Generation
	// controller mirror the receipt counts (recording a receipt does not
	// requeue it), so with the default 60 s each count would wait a minute.
	a := newActivation(t, "cf-receipts", func(s *iteronv1.ImplementationActivationSpec) {
		s.Checkpoint.IntervalSeconds = ptr.To[int32](1)
	}, cfIrreversibleSource(t, "counter-irr"))
	first := n.start(t, "", cfIrreversibleCeiling)
	n.cfDump(t, a)
	got := waitFor(t, a, "Ready", readyWith("prompt_system", "counter-irr"))
	if caps := got.Status.Modules[0].AdmittedCapabilities; !slices.Contains(caps, iteronv1.Capability("irreversible_external")) {
		t.Fatalf("admitted capabilities %v: irreversible_external was not admitted", caps)
	}
	name := got.Status.Modules[0].GenerationName
	for i := 1; i <= 3; i++ {
		if r := n.cfCall(t, got, "a", 1, 10*time.Second); !r.ok || r.count != float64(i) {
			t.Fatalf("call %d: %v", i, r)
		}
	}
	before := waitGeneration(t, name, "showing 3 irreversible receipts", func(g *iteronv1.Generation) bool {
		r := g.Status.Receipts
		return r != nil && r.Total == 3 && r.Irreversible == 3
	})
	if r := before.Status.Receipts; r.Truncated || r.IncompleteReason != "" {
		t.Fatalf("before any restart the evidence is complete; status says %+v", *r)
	}
	oldPid := before.Status.Pid
	step("receipts counted")

	// Every write of the Generation's status from here on is watched: each
	// must show the 3 receipts or say the evidence is incomplete.
	seen := cfWatchReceipts(t, name)
	if err := first.stop(t); err != nil {
		t.Fatal(err)
	}
	restartedAt := time.Now()
	step("manager stopped")
	n.start(t, "", cfIrreversibleCeiling)
	after := waitGeneration(t, name, "relaunched with incomplete evidence", func(g *iteronv1.Generation) bool {
		return g.Status.Phase == iteronv1.PhaseActive && g.Status.Pid > 0 && g.Status.Pid != oldPid && g.Status.Receipts != nil && g.Status.Receipts.Truncated
	})
	if r := after.Status.Receipts; !strings.Contains(r.IncompleteReason, "the manager restarted at") {
		t.Fatalf("incompleteReason %q does not name the restart", r.IncompleteReason)
	}
	got = waitFor(t, a, "Ready after the restart", readyWith("prompt_system", "counter-irr"))
	step("relaunched, Ready")
	if r := n.cfCall(t, got, "a", 1, 10*time.Second); !r.ok {
		t.Fatalf("call after the restart: %v", r)
	}
	relaunched := waitGeneration(t, name, "counting the receipt of the call after the restart", func(g *iteronv1.Generation) bool {
		return g.Status.Receipts != nil && g.Status.Receipts.Total == 1
	})
	if r := relaunched.Status.Receipts; !r.Truncated || r.Irreversible != 1 || r.IncompleteReason != after.Status.Receipts.IncompleteReason {
		t.Fatalf("after a receipt recorded since the restart the evidence must still say it is incomplete: %+v", *r)
	}

	// A generation that starts after the restart has complete evidence.
	cur := get(t, a)
	cur.Spec.Sources[0] = cfIrreversibleSource(t, "counter-irr-b")
	if err := env.Client.Update(t.Context(), cur); err != nil {
		t.Fatal(err)
	}
	got = waitFor(t, a, "Ready with counter-irr-b", readyWith("prompt_system", "counter-irr-b"))
	step("swapped")
	if r := n.cfCall(t, got, "a", 1, 10*time.Second); !r.ok {
		t.Fatalf("call on the new generation: %v", r)
	}
	fresh := waitGeneration(t, got.Status.Modules[0].GenerationName, "counting its receipt", func(g *iteronv1.Generation) bool {
		return g.Status.Receipts != nil && g.Status.Receipts.Total == 1
	})
	if r := fresh.Status.Receipts; r.Truncated || r.IncompleteReason != "" || r.Irreversible != 1 {
		t.Fatalf("a generation started after the restart reports %+v; want complete evidence", *r)
	}

	writes := seen()
	step("fresh generation counted")
	for _, w := range writes {
		if w.Receipts == nil || (!w.Receipts.Truncated && w.Receipts.Total < 3) {
			t.Fatalf("a status write of %s after the restart reports receipts %s as complete: %s", name, w, cfWritesText(writes))
		}
	}
	excerpt := func(g *iteronv1.Generation) string {
		b, _ := json.Marshal(map[string]any{"name": g.Name, "pid": g.Status.Pid, "receipts": g.Status.Receipts})
		return string(b)
	}
	t.Logf("restarted at %s; before: %s; after the restart: %s; after one more call: %s; new generation: %s; %d watched writes: %s",
		restartedAt.UTC().Format(time.RFC3339), excerpt(before), excerpt(after), excerpt(relaunched), excerpt(fresh), len(writes), cfWritesText(writes))
	deleteActivation(t, got)
}

// cfReceiptsWrite is one watched state of a Generation's status.
type cfReceiptsWrite struct {
	Phase    iteronv1.ModulePhase
	Pid      int64
	Receipts *iteronv1.ReceiptSummary
}

func (w cfReceiptsWrite) String() string {
	if w.Receipts == nil {
		return string(w.Phase) + " receipts=nil"
	}
	b, _ := json.Marshal(w.Receipts)
	return string(w.Phase) + " " + strings.ReplaceAll(string(b), `"`, "")
}

func cfWritesText(ws []cfReceiptsWrite) string {
	var parts []string
	for _, w := range ws {
		parts = append(parts, w.String())
	}
	return strings.Join(parts, " → ")
}

// cfWatchReceipts watches the Generation called name from now on; the
// returned function stops the watch and returns every state seen.
func cfWatchReceipts(t *testing.T, name string) func() []cfReceiptsWrite {
	t.Helper()
	dc, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := dc.Resource(iteronv1.GroupVersion.WithResource("generations")).Namespace(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	var mu sync.Mutex
	var out []cfReceiptsWrite
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok || ev.Type == watch.Error || ev.Type == watch.Deleted {
				continue
			}
			var g iteronv1.Generation
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &g); err != nil {
				t.Errorf("watch %s: %v", name, err)
				continue
			}
			mu.Lock()
			out = append(out, cfReceiptsWrite{Phase: g.Status.Phase, Pid: g.Status.Pid, Receipts: g.Status.Receipts})
			mu.Unlock()
		}
	}()
	stop := func() []cfReceiptsWrite {
		w.Stop()
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return out
	}
	t.Cleanup(func() { stop() })
	return stop
}
