package crash

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/test/faultfs"
)

// TestARestartBeforeTheLedgerHealsClosesTheInterruptedSwapTruthfully is
// what an operator does on a full disk: stop the manager while the ledger
// cannot be written, free space, start it again. The manager that failed
// the append could not write how the swap really ended into the ledger; it
// kept that durably beside it (the pending close), and the next manager
// closes the swap that way rather than by the ledger's recovery rule — at
// drain, where the atomic_switch record is durable and the rule would close
// the swap forward, reviving the generation the rollback disposed. The swap
// must be closed as it ended — rolled back — and nothing a call did while
// the disk was full may be lost. Only with ITERON_FAULTS=all (make faults).
func TestARestartBeforeTheLedgerHealsClosesTheInterruptedSwapTruthfully(t *testing.T) {
	if os.Getenv("ITERON_FAULTS") != "all" {
		t.Skip("ITERON_FAULTS=all (make faults) runs it")
	}
	faultfs.SkipUnlessSupported(t)
	for _, phase := range []ledger.Phase{ledger.PhaseSnapshot, ledger.PhaseDrain} {
		t.Run(string(phase), func(t *testing.T) {
			n := newNode(t)
			fsys := lfMountLedgers(t, n)
			name := "lf-restart-" + map[ledger.Phase]string{ledger.PhaseSnapshot: "snapshot", ledger.PhaseDrain: "drain"}[phase]
			a := newActivation(t, name, func(s *iteronv1.ImplementationActivationSpec) { s.Checkpoint.IntervalSeconds = ptr.To[int32](0) },
				source(t, artifacts.CounterV1, lfModule, "counter-v1"))
			m := n.start(t, "")
			waitFor(t, a, "Ready with v1", readyWith(lfModule, "counter-v1"))
			if ans := n.lfCall(t, a, "a", 5); ans.err != "" || ans.count != 5 {
				t.Fatalf("first call: %s", ans)
			}
			fault := fsys.FailWrites(faultfs.Rule{Path: "ledger-*.jsonl", Contains: lfRecordBytes(phase), Errno: syscall.ENOSPC, Persist: faultfs.Everything})
			lfUpdate(t, a, func(s *iteronv1.ImplementationActivationSpec) {
				s.Sources[0] = source(t, artifacts.CounterV2, lfModule, "counter-v2")
			})
			if !fault.WaitFired(60 * time.Second) {
				t.Fatalf("the %s record was never appended", phase)
			}
			old := iteronv1.GenerationName(name, lfModule, 1, 1)
			waitFor(t, a, "Stalled LedgerUnwritable with v1 serving", func(a *iteronv1.ImplementationActivation) bool {
				return stalledWith(reasons.LedgerUnwritable)(a) && len(a.Status.Modules) == 1 && a.Status.Modules[0].GenerationName == old &&
					a.Status.Modules[0].Phase == iteronv1.PhaseActive
			})
			if ans := n.lfCall(t, a, "a", 1); ans.err != "" || ans.count != 6 || ans.version != "1.0.0" {
				t.Fatalf("while the disk is full: %s; want a=6 from v1", ans)
			}
			// Stop while the disk is full (the shutdown checkpoints v1 at
			// a=6 into the snapshot store), free it, start again.
			if err := m.stop(t); err != nil {
				t.Fatalf("the manager's exit after SIGTERM: %v", err)
			}
			fsys.Heal()
			n.start(t, "")
			got := waitFor(t, a, "Ready with v2", readyWith(lfModule, "counter-v2"))
			ans := n.lfCallSettled(t, got, "a", 1)
			n.verifyLedger(t, got)
			tx := lfRecords(t, n, got, lfTxn(t, got, 2, 1, 0))
			t.Logf("after the restart: %s; the interrupted swap: %v", ans, tx)
			k := len(tx)
			if k < 2 || tx[k-1].phase != ledger.PhaseRolledBack || tx[k-2].outcome != ledger.OutcomeBlocked || tx[k-2].phase != phase ||
				!strings.HasPrefix(tx[k-2].reason, reasons.LedgerUnwritable+": ") {
				t.Errorf("the swap rolled back while the disk was full; the ledger closes it %v", tx)
			}
			if retried := iteronv1.GenerationName(name, lfModule, 2, 2); got.Status.Modules[0].GenerationName != retried {
				t.Errorf("v2 serves as %s; want the retried attempt %s (attempt 1 was disposed while the disk was full)", got.Status.Modules[0].GenerationName, retried)
			}
			if ans.err != "" || ans.count != 7 {
				t.Errorf("after the restart %s; want a=7 (a=6, answered by v1 while the disk was full, then one more)", ans)
			}
			deleteActivation(t, got)
		})
	}
}
