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
// with its state, the new Generation Failed, its whole process group (the
// provider and two grandchildren it started) gone,
// and the ledger (verified with the CLI) ends blocked + rolled_back with the
// same reason and its block kind.
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

				// Two grandchildren in the provider's group (ignoring
				// SIGTERM, holding its stdout and stderr) are started at
				// load, before the fault: disposing of the failed
				// generation must end the whole group.
				bad := source(t, artifacts.Faulty, "prompt_system", "faulty", "--fault", "fork-grandchild", "--at", "load", "--children", "2", "--fault", fault, "--at", ph.op)
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
				// The provider led its own process group: the whole group
				// is gone, whatever it started.
				if n := strings.Count(failed.Status.StderrTail, "faulty: grandchild "); n != 2 {
					t.Fatalf("the failed provider's stderr names %d grandchildren; want 2 (it forks them at load):\n%s", n, failed.Status.StderrTail)
				}
				if serving := st.Modules["prompt_system"].Pid; len(processGroup(t, serving)) == 0 {
					t.Fatalf("the scan of /proc finds no process in the group of the serving provider %d: it cannot tell a group from none", serving)
				}
				if left := processGroup(t, gs.LastPid); len(left) > 0 {
					t.Fatalf("the failed provider's process group %d still has processes: %v", gs.LastPid, left)
				}
				tx := transactionsOf(verifyLedger(t, got), "prompt_system")
				last := tx[len(tx)-1]
				if !slices.Equal(last[len(last)-2:], []string{ph.phase + ":blocked", "rolled_back:rolled_back"}) {
					t.Fatalf("the failed swap in the ledger: %v", last)
				}
				// The blocked record, and the rolled_back that repeats it,
				// carry the reason the Generation shows, with its kind.
				var mine []ledgerRecord
				for _, r := range ledgerRecords(t, got) {
					if r.Module == "prompt_system" {
						mine = append(mine, r)
					}
				}
				wantKind, _ := reasons.BlockKindOf(reasons.Code(want))
				for _, r := range mine[len(mine)-2:] {
					if r.Reason == nil || !strings.HasPrefix(*r.Reason, want+": ") || r.BlockKind == nil || *r.BlockKind != wantKind {
						t.Fatalf("ledger record %s:%s has block kind %v and reason %v; want kind %s and reason %s: <message>", r.Phase, r.Outcome, deref(r.BlockKind), deref(r.Reason), wantKind, want)
					}
				}
				mu.Lock()
				table = append(table, fmt.Sprintf("%-10s %-13s → old serving yes (a=5), new Failed %-18s, group %d (provider + 2 grandchildren) gone, ledger %d records ending %s:blocked(%s, %s) + rolled_back",
					ph.phase, fault, want, gs.LastPid, len(last), ph.phase, wantKind, truncateReason(*mine[len(mine)-2].Reason, 60)))
				mu.Unlock()
			})
		}
	}
}

func deref(p *string) string {
	if p == nil {
		return "<none>"
	}
	return *p
}

func truncateReason(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
