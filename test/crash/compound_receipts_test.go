package crash

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
	"iteron.dev/operator/internal/effects"
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

// TestReceiptsSurviveARestartAndACutTailIsReportedIncomplete: the receipts
// of a generation's irreversible runs are in its activation's receipts file;
// `kubectl iteron receipts` prints the same receipts before and after a
// clean restart of the manager (SIGTERM), and the Generation's status keeps
// counting them as complete evidence at every write. Then the manager is
// killed and the file cut back to its last durable length, as a machine
// stop would leave it: the next manager reports the evidence incomplete, in
// the Generation's status and in `kubectl iteron receipts`, never as clean.
func TestReceiptsSurviveARestartAndACutTailIsReportedIncomplete(t *testing.T) {
	n := newNode(t)
	start := time.Now()
	step := func(what string) { t.Logf("%6.1fs %s", time.Since(start).Seconds(), what) }
	// Checkpoints every second: each makes the receipts recorded so far
	// durable, and makes the Generation controller mirror the counts.
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
	waitCheckpointed(t, a, 3) // the receipts of the 3 calls are durable with it
	printedBefore := n.cfReceipts(t, a)
	step("receipts counted and durable")
	t.Logf("kubectl iteron receipts %s, before the restart:\n%s", a.Name, printedBefore)

	// A clean restart: every status write from here on must count the 3
	// receipts as complete evidence.
	seen := cfWatchReceipts(t, name)
	if err := first.stop(t); err != nil {
		t.Fatal(err)
	}
	step("manager stopped (SIGTERM)")
	second := n.start(t, "", cfIrreversibleCeiling)
	// The new manager relaunched the generation (a new pid) and counts the
	// receipts the old one recorded.
	after := waitGeneration(t, name, "relaunched, counting its 3 receipts", func(g *iteronv1.Generation) bool {
		return g.Status.Phase == iteronv1.PhaseActive && g.Status.Pid > 0 && g.Status.Pid != before.Status.Pid &&
			g.Status.Receipts != nil && g.Status.Receipts.Total == 3
	})
	got = waitFor(t, a, "Ready after the restart", readyWith("prompt_system", "counter-irr"))
	if r := after.Status.Receipts; r.Truncated || r.IncompleteReason != "" || r.Irreversible != 3 {
		t.Fatalf("after a clean restart the receipts survive as complete evidence; status says %+v", *r)
	}
	printedAfter := n.cfReceipts(t, a)
	step("restarted, Ready")
	t.Logf("kubectl iteron receipts %s, after the restart:\n%s", a.Name, printedAfter)
	if cfReceiptRows(printedAfter) != cfReceiptRows(printedBefore) || strings.Count(printedAfter, " irreversible ") != 3 {
		t.Fatalf("the receipts printed after the restart differ from those before:\n%s\nbefore:\n%s", printedAfter, printedBefore)
	}
	for _, w := range seen() {
		if w.Receipts == nil || w.Receipts.Truncated || w.Receipts.Total < 3 {
			t.Fatalf("a status write of %s after the clean restart reports receipts %s", name, w)
		}
	}

	// One more call, durable with a checkpoint; a last one, then the
	// manager is killed and the file cut back to its last durable length.
	if r := n.cfCall(t, got, "a", 1, 10*time.Second); !r.ok {
		t.Fatalf("call 4: %v", r)
	}
	waitCheckpointed(t, a, 4)
	if r := n.cfCall(t, got, "a", 1, 10*time.Second); !r.ok {
		t.Fatalf("call 5: %v", r)
	}
	second.kill(t)
	path := filepath.Join(n.stateDir, "receipts", string(got.UID)+".jsonl")
	loaded, err := effects.ReadReceiptsFile(path)
	if err != nil {
		t.Fatal(err)
	}
	full, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, loaded.DurableBytes); err != nil {
		t.Fatal(err)
	}
	cut, err := effects.ReadReceiptsFile(path)
	if err != nil {
		t.Fatal(err)
	}
	step(fmt.Sprintf("manager killed; receipts file cut from %d to its durable %d bytes (durable at %s): %d receipts before the cut, %d after",
		full.Size(), loaded.DurableBytes, loaded.LastDurableAt.Format(time.RFC3339Nano), loaded.Summaries[name].Total, cut.Summaries[name].Total))
	if kept := cut.Summaries[name].Total; kept < 4 {
		t.Fatalf("the cut lost a receipt that a checkpoint made durable: %d left", kept)
	}
	n.start(t, "", cfIrreversibleCeiling)
	incomplete := waitGeneration(t, name, "relaunched, reporting incomplete evidence", func(g *iteronv1.Generation) bool {
		return g.Status.Phase == iteronv1.PhaseActive && g.Status.Pid > 0 && g.Status.Pid != after.Status.Pid &&
			g.Status.Receipts != nil && g.Status.Receipts.Truncated
	})
	waitFor(t, a, "Ready after the machine stop", readyWith("prompt_system", "counter-irr"))
	if r := incomplete.Status.Receipts; !strings.Contains(r.IncompleteReason, "stopped without closing the receipts file") || r.Total < 4 {
		t.Fatalf("after the cut the status says %+v; want the unclean stop named and the durable receipts kept", *r)
	}
	printedCut := n.cfReceipts(t, a)
	step("restarted after the cut")
	t.Logf("kubectl iteron receipts %s, after the file was cut to its last durable length:\n%s", a.Name, printedCut)
	if !strings.Contains(printedCut, "INCOMPLETE") || !strings.Contains(printedCut, "evidence incomplete: ") {
		t.Fatalf("kubectl iteron receipts does not say the evidence is incomplete:\n%s", printedCut)
	}
	t.Logf("generation %s: before %+v; after the clean restart %+v; after the cut %+v", name, *before.Status.Receipts, *after.Status.Receipts, *incomplete.Status.Receipts)
	deleteActivation(t, get(t, a))
}

// cfReceipts runs `kubectl iteron receipts` on a against n's state dir.
func (n *nodeState) cfReceipts(t *testing.T, a *iteronv1.ImplementationActivation) string {
	t.Helper()
	out, err := exec.Command(pluginBin, "receipts", a.Name, "--kubeconfig", kubeconfig, "-n", a.Namespace, "--state-dir", n.stateDir).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl iteron receipts: %v\n%s", err, out)
	}
	return string(out)
}

// cfReceiptRows are the receipt rows of `kubectl iteron receipts` output.
func cfReceiptRows(out string) string {
	_, rows, _ := strings.Cut(out, "\nRECEIPT ")
	return rows
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
