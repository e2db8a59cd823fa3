package controllers_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/internal/hotswap"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/pkg/strictjson"
)

func TestThreeModulesWithDependenciesBecomeActiveInTopologicalOrder(t *testing.T) {
	// Listed consumers first: the order must come from the seam graph.
	act := newActivation(t, "topo", nil,
		source(t, artifacts.CounterV2, "provider_routing", "route"),
		source(t, artifacts.CounterV2, "context_assembly", "ctx"),
		source(t, artifacts.CounterV2, "prompt_system", "sys"),
	)
	got := waitFor(t, act, "Ready", ready)
	for _, m := range []string{"prompt_system", "context_assembly", "provider_routing"} {
		ms := moduleStatus(got, m)
		if ms.Phase != iteronv1.PhaseActive || ms.Generation != 1 || ms.GenerationName == "" || ms.Epoch == "" {
			t.Fatalf("%s: %+v", m, ms)
		}
	}
	if want := []string{"prompt_system", "context_assembly", "provider_routing"}; !slices.Equal(got.Status.Plan.ActivateOrder, want) {
		t.Fatalf("activateOrder %v, want %v", got.Status.Plan.ActivateOrder, want)
	}
	var committed []string
	for _, r := range verifyLedger(t, got) {
		if strings.HasSuffix(r, ":committed:committed") {
			committed = append(committed, strings.Split(r, ":")[0])
		}
	}
	if want := []string{"prompt_system", "context_assembly", "provider_routing"}; !slices.Equal(committed, want) {
		t.Fatalf("ledger commit order %v, want %v", committed, want)
	}
	if got.Status.ActiveCount != 3 || got.Status.ModuleCount != 3 || got.Status.Ledger == nil || got.Status.Ledger.Records != 12 || !got.Status.Ledger.Verified {
		t.Fatalf("counts/ledger: active=%d modules=%d ledger=%+v", got.Status.ActiveCount, got.Status.ModuleCount, got.Status.Ledger)
	}
	for name, g := range generations(t, got) {
		waitGeneration(t, g.Namespace, name, "Active with a pid", func(g *iteronv1.Generation) bool {
			return g.Status.Phase == iteronv1.PhaseActive && g.Status.Pid > 0 && g.Status.Step == iteronv1.StepCommitted
		})
	}
}

func TestHotSwapV1ToV2MigratesStateAndReapsTheOldGeneration(t *testing.T) {
	act := newActivation(t, "swap", nil, source(t, artifacts.CounterV1, "prompt_system", "counter"))
	got := waitFor(t, act, "Ready", ready)
	old := moduleStatus(got, "prompt_system")
	oldPid := runtimeOf(t, got).Modules["prompt_system"].Pid
	count(t, got, "prompt_system", "a", 2)
	count(t, got, "prompt_system", "b", 5)

	v2 := source(t, artifacts.CounterV2, "prompt_system", "counter-v2")
	updateSpec(t, act, func(a *iteronv1.ImplementationActivation) { a.Spec.Sources[0] = v2 })
	got = waitFor(t, act, "Ready at generation 2", func(a *iteronv1.ImplementationActivation) bool {
		return ready(a) && moduleStatus(a, "prompt_system").Generation == 2
	})
	cur := moduleStatus(got, "prompt_system")
	if cur.ImplementationID != "counter-v2" || cur.GenerationName == old.GenerationName {
		t.Fatalf("after the swap: %+v", cur)
	}
	out, servedBy := count(t, got, "prompt_system", "a", 1)
	if out["count"] != float64(3) || out["total"] != float64(8) || out["implementation_version"] != "2.0.0" || servedBy != cur.GenerationName {
		t.Fatalf("v2 answered %v (served by %s): the migrated state is not there", out, servedBy)
	}
	if !processGone(oldPid) {
		t.Fatalf("the old provider %d was not reaped", oldPid)
	}
	newGen := waitGeneration(t, got.Namespace, cur.GenerationName, "Active", func(g *iteronv1.Generation) bool {
		return g.Status.Phase == iteronv1.PhaseActive && g.Status.StateSHA256 != ""
	})
	if newGen.Spec.Previous != old.GenerationName || newGen.Spec.Generation != 2 || newGen.Spec.Attempt != 1 {
		t.Fatalf("new Generation spec: previous=%q generation=%d attempt=%d", newGen.Spec.Previous, newGen.Spec.Generation, newGen.Spec.Attempt)
	}
	// The digest in status is the digest of the durable restored state,
	// recomputed here from the stored bytes.
	snaps, err := hotswap.NewSnapshotStore(stateDir).List(string(got.UID), "prompt_system")
	if err != nil {
		t.Fatal(err)
	}
	var restored *hotswap.StoredSnapshot
	for i := range snaps {
		if snaps[i].Kind == hotswap.SnapshotRestored && snaps[i].Lineage == 2 {
			restored = &snaps[i]
		}
	}
	if restored == nil {
		t.Fatal("no durable restored snapshot of lineage 2")
	}
	if d, err := strictjson.DigestOfValue(restored.State); err != nil || d != newGen.Status.StateSHA256 {
		t.Fatalf("restored state hashes to %s (%v); Generation status says %s", d, err, newGen.Status.StateSHA256)
	}
	waitGeneration(t, got.Namespace, old.GenerationName, "Inactive", func(g *iteronv1.Generation) bool {
		return g.Status.Phase == iteronv1.PhaseInactive && g.Status.DrainedAt != nil
	})
	txs := transactionsOf(verifyLedger(t, got), "prompt_system")
	want := []string{"verify:applied", "shadow_load:applied", "quiesce:applied", "snapshot:applied", "migrate:applied", "restore:applied", "readiness:applied", "atomic_switch:applied", "drain:applied", "committed:committed"}
	if len(txs) != 2 || !slices.Equal(txs[1], want) {
		t.Fatalf("ledger transactions %v; want a first activation then %v", txs, want)
	}
	waitEvent(t, got, "ModuleActive", cur.GenerationName)
	if p := got.Status.Plan; !slices.Equal(p.Reloaded, []string{"prompt_system"}) || len(p.Unchanged) != 0 {
		t.Fatalf("plan of the v2 spec: %+v; want prompt_system Reloaded", p)
	}
}

func TestAFailedSwapIsNotRetriedUntilTheRetryAnnotationChanges(t *testing.T) {
	act := newActivation(t, "retry", nil, source(t, artifacts.CounterV1, "prompt_system", "counter"))
	got := waitFor(t, act, "Ready", ready)
	oldName := moduleStatus(got, "prompt_system").GenerationName
	oldPid := runtimeOf(t, got).Modules["prompt_system"].Pid
	count(t, got, "prompt_system", "a", 7)

	// faulty crashes at migrate once: the marker it leaves makes the retry
	// behave like counter v2.
	markerDir := filepath.Join(providersDir, "markers", act.Name)
	if err := os.MkdirAll(markerDir, 0o777); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(markerDir, 0o777)
	bad := source(t, artifacts.Faulty, "prompt_system", "faulty", "--fault", "crash", "--at", "migrate", "--once-marker", filepath.Join(markerDir, "fired"))
	updateSpec(t, act, func(a *iteronv1.ImplementationActivation) { a.Spec.Sources[0] = bad })
	got = waitFor(t, act, "Stalled", stalled)
	ms := moduleStatus(got, "prompt_system")
	if ms.GenerationName != oldName || ms.Phase != iteronv1.PhaseActive || ms.Reason != reasons.ProviderFailed {
		t.Fatalf("module after the failed swap: %+v; want the old generation Active with reason provider_failed", ms)
	}
	if r := condition(got, iteronv1.ConditionReconciling); r.Status != metav1.ConditionFalse {
		t.Fatalf("Reconciling = %s while Stalled (kstatus needs it False)", r.Status)
	}
	if d := condition(got, iteronv1.ConditionDegraded); d.Status != metav1.ConditionTrue {
		t.Fatalf("Degraded = %s after a failed swap", d.Status)
	}
	failedName := ""
	for name, g := range generations(t, got) {
		if g.Spec.Generation == 2 {
			failedName = name
		}
	}
	failed := waitGeneration(t, got.Namespace, failedName, "Failed", func(g *iteronv1.Generation) bool {
		return g.Status.Phase == iteronv1.PhaseFailed && g.Status.Reason == reasons.ProviderFailed
	})
	if failed.Spec.Attempt != 1 {
		t.Fatalf("failed attempt %d", failed.Spec.Attempt)
	}
	if out, by := count(t, got, "prompt_system", "a", 1); out["count"] != float64(8) || by != oldName {
		t.Fatalf("old generation after the failed swap answered %v from %s", out, by)
	}
	if runtimeOf(t, got).Modules["prompt_system"].Pid != oldPid {
		t.Fatal("the old process changed")
	}
	tx := transactionsOf(verifyLedger(t, got), "prompt_system")
	if last := tx[len(tx)-1]; !slices.Equal(last[len(last)-2:], []string{"migrate:blocked", "rolled_back:rolled_back"}) {
		t.Fatalf("failed swap in the ledger: %v", last)
	}

	// Nothing is retried while nothing changes.
	time.Sleep(2 * time.Second)
	if n := len(generations(t, got)); n != 2 {
		t.Fatalf("%d Generations after waiting; a failed swap was retried without a request", n)
	}

	updateSpec(t, act, func(a *iteronv1.ImplementationActivation) {
		if a.Annotations == nil {
			a.Annotations = map[string]string{}
		}
		a.Annotations[iteronv1.AnnotationRetry] = "2026-11-29T12:00:00Z"
	})
	got = waitFor(t, act, "Ready after the retry", func(a *iteronv1.ImplementationActivation) bool {
		return ready(a) && moduleStatus(a, "prompt_system").Generation == 2
	})
	cur := moduleStatus(got, "prompt_system")
	if !strings.HasSuffix(cur.GenerationName, "-g2-2") || got.Status.LastHandledRetryAt != "2026-11-29T12:00:00Z" {
		t.Fatalf("after the retry: module %+v, lastHandledRetryAt %q; want attempt 2 of generation 2", cur, got.Status.LastHandledRetryAt)
	}
	if out, _ := count(t, got, "prompt_system", "a", 1); out["count"] != float64(9) {
		t.Fatalf("after the retried swap a=%v, want 9 (state migrated)", out["count"])
	}
}

func TestADependencyChangeReloadsExactlyTheAffectedModules(t *testing.T) {
	act := newActivation(t, "deps", nil,
		source(t, artifacts.CounterV2, "prompt_system", "sys"),
		source(t, artifacts.CounterV2, "prompt_tool_description", "tools"),
		source(t, artifacts.CounterV2, "context_assembly", "ctx"),
		source(t, artifacts.CounterV2, "provider_routing", "route"),
		source(t, artifacts.CounterV2, "provider_retry", "retry"),
	)
	got := waitFor(t, act, "Ready", ready)
	before := pids(t, got)
	count(t, got, "provider_routing", "r", 3)

	// context_assembly gets a new implementation: it and its direct consumer
	// provider_routing reload; provider_retry (a consumer of provider_routing)
	// and the rest keep their processes.
	next := source(t, artifacts.CounterV2, "context_assembly", "ctx-b")
	updateSpec(t, act, func(a *iteronv1.ImplementationActivation) {
		for i := range a.Spec.Sources {
			if a.Spec.Sources[i].Module == "context_assembly" {
				a.Spec.Sources[i] = next
			}
		}
	})
	got = waitFor(t, act, "Ready after the reload", func(a *iteronv1.ImplementationActivation) bool {
		return ready(a) && moduleStatus(a, "context_assembly").ImplementationID == "ctx-b" && moduleStatus(a, "provider_routing").Generation == 2
	})
	after := pids(t, got)
	t.Logf("pids before %v after %v", before, after)
	for _, m := range []string{"prompt_system", "prompt_tool_description", "provider_retry"} {
		if before[m] != after[m] || moduleStatus(got, m).Generation != 1 {
			t.Fatalf("%s changed: pid %d → %d, generation %d", m, before[m], after[m], moduleStatus(got, m).Generation)
		}
	}
	for _, m := range []string{"context_assembly", "provider_routing"} {
		if before[m] == after[m] || moduleStatus(got, m).Generation != 2 {
			t.Fatalf("%s was not reloaded: pid %d → %d", m, before[m], after[m])
		}
	}
	if out, _ := count(t, got, "provider_routing", "r", 1); out["count"] != float64(4) {
		t.Fatalf("provider_routing lost its state across the reload: %v", out)
	}
	p := got.Status.Plan
	if !slices.Equal(p.Unchanged, []string{"prompt_system", "prompt_tool_description", "context_assembly", "provider_routing", "provider_retry"}) {
		t.Logf("plan after settling: %+v", p)
	}
}

func TestAnAuthorityChangeIsRefusedHotAndDoneColdWithStrategyCold(t *testing.T) {
	src := sourceWithCapabilities(t, "prompt_system", "counter", "read_only", "reversible_local")
	act := newActivation(t, "authority", nil, src)
	got := waitFor(t, act, "Ready", ready)
	oldName := moduleStatus(got, "prompt_system").GenerationName
	if caps := moduleStatus(got, "prompt_system").AdmittedCapabilities; !slices.Equal(caps, []iteronv1.Capability{"read_only", "reversible_local"}) {
		t.Fatalf("admitted %v", caps)
	}

	updateSpec(t, act, func(a *iteronv1.ImplementationActivation) {
		a.Spec.CapabilityCeiling = []iteronv1.Capability{iteronv1.CapabilityReadOnly}
	})
	got = waitFor(t, act, "Stalled", stalled)
	if ms := moduleStatus(got, "prompt_system"); ms.Reason != reasons.AuthorityChanged || ms.GenerationName != oldName {
		t.Fatalf("module after a narrowed ceiling: %+v; want authority_changed, the old generation serving", ms)
	}
	if s := condition(got, iteronv1.ConditionStalled); s.Reason != iteronv1.ReasonAuthorityChanged {
		t.Fatalf("Stalled reason %s", s.Reason)
	}

	updateSpec(t, act, func(a *iteronv1.ImplementationActivation) { a.Spec.Swap.Strategy = iteronv1.SwapStrategyCold })
	got = waitFor(t, act, "Ready after a cold replace", func(a *iteronv1.ImplementationActivation) bool {
		return ready(a) && slices.Equal(moduleStatus(a, "prompt_system").AdmittedCapabilities, []iteronv1.Capability{"read_only"})
	})
	tx := transactionsOf(verifyLedger(t, got), "prompt_system")
	want := []string{"verify:applied", "shadow_load:applied", "quiesce:applied", "atomic_switch:applied", "drain:applied", "committed:committed"}
	if !slices.Equal(tx[len(tx)-1], want) {
		t.Fatalf("cold replace %v, want %v", tx[len(tx)-1], want)
	}
}

func TestRemovingASourceRetiresItAndDeletingTheActivationReapsEverything(t *testing.T) {
	act := newActivation(t, "retire", nil,
		source(t, artifacts.CounterV2, "prompt_system", "sys"),
		source(t, artifacts.Stateless, "context_assembly", "ctx"),
	)
	got := waitFor(t, act, "Ready", ready)
	before := pids(t, got)

	updateSpec(t, act, func(a *iteronv1.ImplementationActivation) {
		a.Spec.Sources = a.Spec.Sources[:1]
	})
	got = waitFor(t, act, "Ready with one module", func(a *iteronv1.ImplementationActivation) bool {
		return ready(a) && len(a.Status.Modules) == 1
	})
	if !processGone(before["context_assembly"]) {
		t.Fatalf("the retired module's process %d is still there", before["context_assembly"])
	}
	tx := transactionsOf(verifyLedger(t, got), "context_assembly")
	if want := []string{"verify:applied", "quiesce:applied", "drain:applied", "committed:committed"}; !slices.Equal(tx[len(tx)-1], want) {
		t.Fatalf("retirement %v, want %v (a protocol-1 provider has no snapshot)", tx[len(tx)-1], want)
	}
	dir := ledgerDir(t, got)

	deleteAndWait(t, got)
	if !processGone(before["prompt_system"]) {
		t.Fatalf("process %d survived the deletion", before["prompt_system"])
	}
	if n := len(generations(t, got)); n != 0 {
		t.Fatalf("%d Generation objects left after the deletion", n)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the ledger %s was not archived: %v", dir, err)
	}
	if _, ok := coordinator.Status(string(got.UID)); ok {
		t.Fatal("the coordinator still knows the deleted activation")
	}
	_ = context.Background
}
