package crash

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/ledger"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/test/faultfs"
)

// TestAProviderStopsServingOnlyWhenItsLifetimeEndsBeforeARenewalCanBeRecorded:
// the disk under the ledger fills just as a provider's renewal is due (its
// first record, verify, fails) and stays full past the provider's end of
// life. The provider serves until its lifetime ends — not a moment less —
// and then the module serves nothing: the Generation says Preparing
// ledger_unwritable and why, the activation is Stalled LedgerUnwritable,
// a call fails at once with ledger_unwritable, and no process of its group
// is left. Once the disk is freed the generation is relaunched from its
// newest checkpoint by itself and answers with the state it had.
func TestAProviderStopsServingOnlyWhenItsLifetimeEndsBeforeARenewalCanBeRecorded(t *testing.T) {
	faultfs.SkipUnlessSupported(t)
	n := newNode(t)
	fsys := lfMountLedgers(t, n)
	groups := lfWatchGroups(t, filepath.Join(n.stateDir, "procs"))

	// A 12 s lifetime and a 6 s renewal margin (swap deadline 5 s +
	// quiesce 1 s, at most half the lifetime): the renewal is due 6 s
	// after the start. Checkpoints every second keep the state durable
	// for the relaunch.
	const lifetime = 12 * time.Second
	impl := providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2, Module: lfModule, ImplementationID: "counter-brief", RuntimeDeadlineMs: uint64(lifetime.Milliseconds())})
	src := providertest.Catalog(t, impl)[0]
	const name = "lf-lifetime"
	gen := iteronv1.GenerationName(name, lfModule, 1, 1)
	m := n.start(t, "")
	a := newActivation(t, name, func(s *iteronv1.ImplementationActivationSpec) {
		s.Checkpoint.IntervalSeconds = ptr.To[int32](1)
		s.Swap.DeadlineSeconds = 5
		s.Swap.QuiesceTimeoutSeconds = ptr.To[int32](1)
	}, iteronv1.ActivationSource{Module: lfModule, ImplementationID: "counter-brief", CatalogPath: src.CatalogPath,
		ArtifactRoot: src.ArtifactRoot, ManifestSHA256: src.ManifestSHA256, ArtifactSHA256: src.ArtifactSHA256})
	waitFor(t, a, "Ready with counter-brief", readyWith(lfModule, "counter-brief"))
	if ans := n.lfCall(t, a, "a", 5); ans.err != "" || ans.count != 5 {
		t.Fatalf("the first call answered %s; want a=5", ans)
	}
	waitCheckpointed(t, a, 5)
	// The next renewal's first record fails, and every write after it.
	fault := fsys.FailWrites(faultfs.Rule{Path: "ledger-*.jsonl", Contains: lfRecordBytes(ledger.PhaseVerify), Errno: syscall.ENOSPC, Persist: faultfs.Everything})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("failed writes: %v", fsys.Failures())
			t.Logf("provider groups seen: %v", groups.all(t))
			t.Logf("ledger: %v", lfRecords(t, n, a, ""))
		}
	})
	if !fault.WaitFired(60 * time.Second) {
		t.Fatalf("no renewal began (its verify record was never appended); manager output:\n%s", tail(m.out.String(), 3000))
	}
	fired := time.Now()

	// Until its end of life the process serves: the activation is Stalled,
	// the module Active on the same process.
	g := waitGeneration(t, gen, "Active with a pid and its start time", func(g *iteronv1.Generation) bool {
		return g.Status.Phase == iteronv1.PhaseActive && g.Status.Pid > 0 && g.Status.ProcessStartedAt != nil
	})
	pid, started := int(g.Status.Pid), g.Status.ProcessStartedAt.Time
	waitFor(t, a, "Stalled with LedgerUnwritable", stalledWith(reasons.LedgerUnwritable))
	if processGone(pid) {
		t.Fatalf("the process %d is gone %s after the renewal's record failed, %s after its start; its lifetime is %s",
			pid, time.Since(fired).Round(time.Millisecond), time.Since(started).Round(time.Millisecond), lifetime)
	}
	t.Logf("the renewal's verify record failed %s after the process %d started; it still serves", fired.Sub(started).Round(100*time.Millisecond), pid)

	// Its lifetime ends: it is stopped then, not before.
	deadline := started.Add(lifetime + 20*time.Second)
	for !processGone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("the process %d outlived its lifetime (%s) by 20 s", pid, lifetime)
		}
		time.Sleep(20 * time.Millisecond)
	}
	lived := time.Since(started)
	// ProcessStartedAt has a resolution of one second.
	if lived < lifetime-time.Second {
		t.Fatalf("the process %d was stopped %s after its start, before its lifetime (%s) ended", pid, lived.Round(time.Millisecond), lifetime)
	}
	t.Logf("the process %d was stopped %s after its start (lifetime %s)", pid, lived.Round(100*time.Millisecond), lifetime)

	// The module serves nothing, and says why.
	g = waitGeneration(t, gen, "Preparing ledger_unwritable", func(g *iteronv1.Generation) bool {
		return g.Status.Phase == iteronv1.PhasePreparing && g.Status.Reason == reasons.LedgerUnwritable
	})
	// The message says the ledger is why: first that the process ended
	// while it cannot be written, then, once the relaunch has tried, that
	// the relaunch waits for it (with the write's error).
	if msg := g.Status.Message; !strings.Contains(msg, "ended while the ledger cannot be written") && !strings.Contains(msg, "waits for the ledger") {
		t.Errorf("the Generation's message does not say the ledger is why it does not serve: %q", msg)
	}
	st := waitFor(t, a, "Stalled LedgerUnwritable, Ready False, the module not Active", func(a *iteronv1.ImplementationActivation) bool {
		r := meta.FindStatusCondition(a.Status.Conditions, iteronv1.ConditionReady)
		return stalledWith(reasons.LedgerUnwritable)(a) && r != nil && r.Status == metav1.ConditionFalse &&
			len(a.Status.Modules) == 1 && a.Status.Modules[0].Phase != iteronv1.PhaseActive
	})
	t.Logf("Generation %s: %s %s (%s); activation: %s; modules %s", gen, g.Status.Phase, g.Status.Reason, g.Status.Message, lfConditionText(st), lfModules(st))
	ans := n.lfCall(t, a, "a", 1)
	if !strings.HasPrefix(ans.err, reasons.LedgerUnwritable+":") || ans.took > 3*time.Second {
		t.Fatalf("a call while the module serves nothing answered %s; want ledger_unwritable at once", ans)
	}
	t.Logf("a call: %s", ans)
	groups.waitOnly(t, "after its end of life")

	// Free the disk: the generation is relaunched from its checkpoint.
	fsys.Heal()
	healed := time.Now()
	g = waitGeneration(t, gen, "relaunched", func(g *iteronv1.Generation) bool {
		return g.Status.Phase == iteronv1.PhaseActive && g.Status.Pid > 0 && int(g.Status.Pid) != pid
	})
	final := waitFor(t, a, "Ready with counter-brief", readyWith(lfModule, "counter-brief"))
	if ans := n.lfCall(t, a, "a", 1); ans.err != "" || ans.count != 6 {
		t.Fatalf("after the disk was freed the module answered %s; want a=6 (the checkpoint's a=5, plus one)", ans)
	}
	verified := n.verifyLedger(t, final)
	records := lfRecords(t, n, final, "")
	if len(records) == 0 || records[len(records)-1].phase != ledger.PhaseCommitted {
		t.Fatalf("the ledger does not end with a committed transaction: %v", records)
	}
	for _, r := range records {
		if r.outcome == ledger.OutcomeBlocked {
			t.Fatalf("a transaction of the ledger was blocked (the renewal's first record failed: it must leave none): %v", records)
		}
	}
	t.Logf("%s after the disk was freed: relaunched as pid %d, a=6; ledger %s, last transaction %s", time.Since(healed).Round(time.Millisecond),
		g.Status.Pid, verified, lfTail(records, 4))
	deleteActivation(t, final)
}
