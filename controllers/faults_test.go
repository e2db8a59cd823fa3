package controllers_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/internal/reasons"
)

// TestTheFaultMatrixThroughTheAPI makes the new provider of a swap fail at
// each phase in each way, through the API server: the activation is
// Stalled with the reason, the old generation still Active and answering
// with its state, the new Generation Failed, its process gone, and the
// ledger (verified with the CLI) ends blocked + rolled_back.
func TestTheFaultMatrixThroughTheAPI(t *testing.T) {
	phases := []struct{ op, phase string }{{"load", "shadow_load"}, {"migrate", "migrate"}, {"restore", "restore"}, {"readiness", "readiness"}}
	faults := []string{"crash", "hang", "malformed", "oversized", "miscorrelate"}
	var mu sync.Mutex
	var table []string
	t.Cleanup(func() {
		slices.Sort(table)
		t.Logf("fault matrix through the API (phase × fault → old serving, new Failed reason, new process, ledger):\n%s", strings.Join(table, "\n"))
	})
	for _, ph := range phases {
		for _, fault := range faults {
			t.Run(fault+" at "+ph.op, func(t *testing.T) {
				t.Parallel()
				deadline := int32(30)
				if fault == "hang" {
					deadline = 5
				}
				act := newActivation(t, "fm", func(s *iteronv1.ImplementationActivationSpec) {
					s.Swap.DeadlineSeconds = deadline
				}, source(t, artifacts.CounterV1, "prompt_system", "counter"))
				got := waitFor(t, act, "Ready", ready)
				oldName := moduleStatus(got, "prompt_system").GenerationName
				count(t, got, "prompt_system", "a", 4)

				bad := source(t, artifacts.Faulty, "prompt_system", "faulty", "--fault", fault, "--at", ph.op)
				updateSpec(t, act, func(a *iteronv1.ImplementationActivation) { a.Spec.Sources[0] = bad })
				got = waitFor(t, act, "Stalled", stalled)

				want := reasons.ProviderFailed
				switch {
				case fault == "hang":
					want = reasons.DeadlineExceeded
				case ph.op == "load":
					want = reasons.ActivationFailed
				}
				if s := condition(got, iteronv1.ConditionStalled); s.Reason != reasons.ConditionReason(want) {
					t.Fatalf("Stalled reason %s; want %s", s.Reason, reasons.ConditionReason(want))
				}
				if r := condition(got, iteronv1.ConditionReconciling); r.Status != metav1.ConditionFalse {
					t.Fatal("Reconciling is True while Stalled")
				}
				ms := moduleStatus(got, "prompt_system")
				if ms.GenerationName != oldName || ms.Phase != iteronv1.PhaseActive {
					t.Fatalf("module after the failed swap: %+v; want %s Active", ms, oldName)
				}
				if out, by := count(t, got, "prompt_system", "a", 1); out["count"] != float64(5) || by != oldName {
					t.Fatalf("the old generation answered %v from %s; want a=5 from %s", out, by, oldName)
				}
				var failed *iteronv1.Generation
				for name, g := range generations(t, got) {
					if g.Spec.Generation == 2 {
						failed = waitGeneration(t, g.Namespace, name, "Failed", func(g *iteronv1.Generation) bool {
							return g.Status.Phase == iteronv1.PhaseFailed && g.Status.Reason == want
						})
					}
				}
				if failed == nil {
					t.Fatal("no Generation for the failed attempt")
				}
				st := runtimeOf(t, got)
				gs := st.Generations[failed.Name]
				if gs.LastPid == 0 || !processGone(gs.LastPid) {
					t.Fatalf("the new provider's process %d is still there", gs.LastPid)
				}
				tx := transactionsOf(verifyLedger(t, got), "prompt_system")
				last := tx[len(tx)-1]
				if !slices.Equal(last[len(last)-2:], []string{ph.phase + ":blocked", "rolled_back:rolled_back"}) {
					t.Fatalf("the failed swap in the ledger: %v", last)
				}
				mu.Lock()
				table = append(table, fmt.Sprintf("%-10s %-13s → old serving yes (a=5), new Failed %-18s, process %d gone, ledger %d records ending %s:blocked + rolled_back",
					ph.phase, fault, want, gs.LastPid, len(last), ph.phase))
				mu.Unlock()
			})
		}
	}
}
