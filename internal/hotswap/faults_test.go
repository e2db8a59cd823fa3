package hotswap

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/verifier"
	"iteron.dev/operator/pkg/strictjson"
)

// swapFixture activates counter v1 with some state and returns the harness
// and the pid of the old process.
func swapFixture(t *testing.T) (*harness, ModuleTarget, int) {
	t.Helper()
	h := newHarness(t)
	v1 := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV1}))
	h.apply(SwapPolicy{}, v1)
	st := h.settle()
	h.count("prompt_system", "a", 5)
	return h, v1, st.Modules["prompt_system"].Pid
}

// lastTransaction is the ledger's records of the last transaction.
func lastTransaction(phases []string) []string {
	for i := len(phases) - 1; i > 0; i-- {
		if strings.HasSuffix(phases[i-1], ":committed:committed") || strings.HasSuffix(phases[i-1], ":rolled_back:rolled_back") || strings.HasSuffix(phases[i-1], ":rolled_back:rollback_failed") {
			return phases[i:]
		}
	}
	return phases
}

// TestFaultMatrixLeavesTheOldGenerationServing makes the new provider fail
// at each phase of a hot swap in each way, and checks that the old one still
// serves with its state, the new one is Failed with its reason and reaped,
// and the ledger holds blocked + rolled_back.
func TestFaultMatrixLeavesTheOldGenerationServing(t *testing.T) {
	phases := []struct{ op, phase string }{{"load", "shadow_load"}, {"migrate", "migrate"}, {"restore", "restore"}, {"readiness", "readiness"}}
	faults := []struct {
		kind    string
		reasons []string // by op: load gets activation_failed
	}{
		{"crash", nil}, {"hang", nil}, {"malformed", nil}, {"oversized", nil}, {"miscorrelate", nil},
	}
	for _, ph := range phases {
		for _, f := range faults {
			t.Run(fmt.Sprintf("%s at %s", f.kind, ph.op), func(t *testing.T) {
				h, v1, oldPid := swapFixture(t)
				bad := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.Faulty, ImplementationID: "faulty", Argv: []string{"--fault", f.kind, "--at", ph.op}}))
				// A hang ends at the swap deadline; every other fault is
				// given a deadline no loaded machine reaches.
				deadline := 30 * time.Second
				if f.kind == "hang" {
					deadline = 6 * time.Second
				}
				h.apply(SwapPolicy{Deadline: deadline, QuiesceTimeout: time.Second}, bad)
				st := h.settle()

				wantReason := "provider_failed"
				switch {
				case f.kind == "hang":
					wantReason = "deadline_exceeded"
				case ph.op == "load":
					wantReason = "activation_failed"
				}
				gs := st.Generations[bad.GenerationName]
				if gs.Phase != iteronv1.PhaseFailed || gs.Reason != wantReason {
					t.Fatalf("new generation: phase %s reason %q (%s); want Failed/%s", gs.Phase, gs.Reason, gs.Message, wantReason)
				}
				if gs.LastPid == 0 || !processGone(gs.LastPid) {
					t.Fatalf("the new provider's process %d is still there", gs.LastPid)
				}
				ms := st.Modules["prompt_system"]
				if ms.Active != v1.GenerationName || ms.Pid != oldPid || ms.Phase != iteronv1.PhaseActive {
					t.Fatalf("module after the failed swap: %+v; want the old generation (pid %d) Active", ms, oldPid)
				}
				if out := h.count("prompt_system", "a", 1); out["count"] != float64(6) || out["_served_by"] != v1.GenerationName {
					t.Fatalf("old generation after the failed swap answered %v; want a=6 from %s", out, v1.GenerationName)
				}
				tx := lastTransaction(h.ledgerPhases())
				wantTail := []string{"prompt_system:" + ph.phase + ":blocked", "prompt_system:rolled_back:rolled_back"}
				if len(tx) < 2 || !slices.Equal(tx[len(tx)-2:], wantTail) {
					t.Fatalf("last transaction %v; want it to end %v", tx, wantTail)
				}
				t.Logf("%s at %s → old serving yes, new Failed %s, new pid %d gone, ledger %d records ending blocked(%s)+rolled_back",
					f.kind, ph.op, gs.Reason, gs.LastPid, len(tx), ph.phase)
			})
		}
	}
}

// failAfterSwitch runs a hot swap to faulty (crash at its first run) and,
// right after the given phase is durable, calls the module so the new
// process crashes between the switch and the commit.
func failAfterSwitch(t *testing.T, h *harness, afterPhase string, alsoDo func()) ModuleTarget {
	t.Helper()
	bad := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.Faulty, ImplementationID: "faulty", Argv: []string{"--fault", "crash", "--at", "start"}}))
	fired := false
	h.hook = func(module, phase string) {
		if phase != afterPhase || fired {
			return
		}
		fired = true
		if alsoDo != nil {
			alsoDo()
		}
		if _, err := h.invoke(module, `{"key":"a","add":1}`); err == nil {
			t.Error("the call to the crashing provider succeeded")
		}
		st, _ := h.c.Status(h.key.UID)
		pid := st.Generations[bad.GenerationName].Pid
		for start := time.Now(); pid != 0 && !processGone(pid) && time.Since(start) < 5*time.Second; {
			time.Sleep(5 * time.Millisecond)
		}
	}
	h.apply(SwapPolicy{Deadline: 10 * time.Second, QuiesceTimeout: time.Second}, bad)
	h.settle()
	h.hook = nil
	return bad
}

func TestAFaultOfTheNewProcessAfterTheSwitchRollsBackToTheRunningOld(t *testing.T) {
	h, v1, oldPid := swapFixture(t)
	bad := failAfterSwitch(t, h, "atomic_switch", nil)
	st := h.settle()
	if ms := st.Modules["prompt_system"]; ms.Active != v1.GenerationName || ms.Pid != oldPid {
		t.Fatalf("after rollback: %+v; want the old generation, same pid %d", ms, oldPid)
	}
	if gs := st.Generations[bad.GenerationName]; gs.Phase != iteronv1.PhaseFailed || gs.Reason != "provider_failed" {
		t.Fatalf("new generation: %+v", gs)
	}
	if out := h.count("prompt_system", "a", 1); out["count"] != float64(6) {
		t.Fatalf("after rollback the count is %v, want 6 (state kept)", out["count"])
	}
	tx := lastTransaction(h.ledgerPhases())
	if want := []string{"prompt_system:drain:blocked", "prompt_system:rolled_back:rolled_back"}; !slices.Equal(tx[len(tx)-2:], want) {
		t.Fatalf("last transaction %v", tx)
	}
}

func TestAFaultAfterTheDrainRelaunchesTheOldWithItsSnapshot(t *testing.T) {
	h, v1, oldPid := swapFixture(t)
	failAfterSwitch(t, h, OldStopped, nil)
	st := h.settle()
	ms := st.Modules["prompt_system"]
	if ms.Active != v1.GenerationName || ms.Pid == oldPid || ms.Pid == 0 {
		t.Fatalf("after rollback: %+v; want the old generation in a fresh process", ms)
	}
	if !processGone(oldPid) {
		t.Fatalf("the drained old process %d is still there", oldPid)
	}
	if out := h.count("prompt_system", "a", 1); out["count"] != float64(6) {
		t.Fatalf("after rollback the count is %v, want 6 (restored from the rollback snapshot)", out["count"])
	}
	tx := lastTransaction(h.ledgerPhases())
	if want := []string{"prompt_system:drain:blocked", "prompt_system:rolled_back:rolled_back"}; !slices.Equal(tx[len(tx)-2:], want) {
		t.Fatalf("last transaction %v", tx)
	}
}

func TestAnOldGenerationThatCannotBeRelaunchedEndsRollbackFailed(t *testing.T) {
	h, v1, _ := swapFixture(t)
	exe := v1.Plan.Executable()
	bad := failAfterSwitch(t, h, OldStopped, func() {
		// The old artifact changes on disk: its relaunch must refuse it.
		if err := os.WriteFile(exe, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	})
	st := h.settle()
	ms := st.Modules["prompt_system"]
	if ms.Active != "" || ms.Pid != 0 {
		t.Fatalf("after a failed rollback: %+v; want nothing claimed active", ms)
	}
	if f := failureFor(st, bad.GenerationName); f == nil || f.Code != "rollback_failed" {
		t.Fatalf("failures %+v; want rollback_failed for %s", st.Failures, bad.GenerationName)
	}
	tx := lastTransaction(h.ledgerPhases())
	if want := []string{"prompt_system:drain:blocked", "prompt_system:rolled_back:rollback_failed"}; !slices.Equal(tx[len(tx)-2:], want) {
		t.Fatalf("last transaction %v", tx)
	}
	if _, err := h.invoke("prompt_system", `{"key":"a","add":1}`); err == nil {
		t.Fatal("a call succeeded with no generation serving")
	}
}

func failureFor(st ActivationStatus, gen string) *Failure {
	for _, f := range st.Failures {
		if f.GenerationName == gen {
			return &f
		}
	}
	return nil
}

func narrowTo(caps ...string) func(*verifier.LaunchPlanFields) {
	return func(f *verifier.LaunchPlanFields) {
		f.AdmittedCapabilities = caps
		d, err := strictjson.DigestOf(caps)
		if err != nil {
			panic(err)
		}
		f.AuthoritySHA256 = d
	}
}

func TestAnAuthorityChangeIsRefusedHotAndDoneCold(t *testing.T) {
	h := newHarness(t)
	spec := artifacts.Spec{Binary: artifacts.CounterV1, Capabilities: []string{"read_only", "reversible_local"}}
	v1 := h.target(providertest.Implement(t, spec))
	h.apply(SwapPolicy{}, v1)
	h.settle()
	h.count("prompt_system", "a", 2)

	spec.Binary = artifacts.CounterV2
	narrowed := providertest.Implement(t, spec)
	hot := h.target(narrowed, narrowTo("read_only"))
	h.apply(SwapPolicy{QuiesceTimeout: time.Second}, hot)
	st := h.settle()
	if gs := st.Generations[hot.GenerationName]; gs.Reason != "authority_changed" || gs.Phase != iteronv1.PhaseFailed {
		t.Fatalf("hot swap with narrowed capabilities: %+v; want Failed authority_changed", gs)
	}
	if st.Modules["prompt_system"].Active != v1.GenerationName {
		t.Fatal("the old generation does not serve after the refused swap")
	}
	tx := lastTransaction(h.ledgerPhases())
	if want := []string{"prompt_system:verify:blocked", "prompt_system:rolled_back:rolled_back"}; !slices.Equal(tx, want) {
		t.Fatalf("refused transaction %v; want %v", tx, want)
	}

	cold := h.targetAt(narrowed, 2, 2, narrowTo("read_only"))
	h.apply(SwapPolicy{Cold: true, QuiesceTimeout: time.Second}, cold)
	st = h.settle()
	ms := st.Modules["prompt_system"]
	if ms.Active != cold.GenerationName || !slices.Equal(ms.AdmittedCapabilities, []string{"read_only"}) {
		t.Fatalf("cold replace: %+v", ms)
	}
	if out := h.count("prompt_system", "a", 1); out["count"] != float64(1) {
		t.Fatalf("after a cold replace the count is %v; want 1 (no state moves)", out["count"])
	}
	tx = lastTransaction(h.ledgerPhases())
	want := []string{"prompt_system:verify:applied", "prompt_system:shadow_load:applied", "prompt_system:quiesce:applied", "prompt_system:atomic_switch:applied", "prompt_system:drain:applied", "prompt_system:committed:committed"}
	if !slices.Equal(tx, want) {
		t.Fatalf("cold replace ledger %v; want %v", tx, want)
	}
}

func TestRemovingAModuleRetiresItAndReapsItsProcess(t *testing.T) {
	h := newHarness(t)
	sys := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2}))
	ctx := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2, Module: "context_assembly", ImplementationID: "counter-ctx"}))
	h.apply(SwapPolicy{}, sys, ctx)
	st := h.settle()
	ctxPid := st.Modules["context_assembly"].Pid
	h.count("context_assembly", "k", 9)

	h.apply(SwapPolicy{QuiesceTimeout: time.Second}, sys)
	st = h.settle()
	if _, ok := st.Modules["context_assembly"]; ok {
		t.Fatalf("context_assembly still known: %+v", st.Modules["context_assembly"])
	}
	if !processGone(ctxPid) {
		t.Fatalf("the retired provider %d is still there", ctxPid)
	}
	if _, ok := h.c.Dispatcher("default", "stack", "context_assembly"); ok {
		t.Fatal("the retired module still has a dispatcher")
	}
	tx := lastTransaction(h.ledgerPhases())
	want := []string{"context_assembly:verify:applied", "context_assembly:quiesce:applied", "context_assembly:snapshot:applied", "context_assembly:drain:applied", "context_assembly:committed:committed"}
	if !slices.Equal(tx, want) {
		t.Fatalf("retirement ledger %v; want %v", tx, want)
	}
	if snap, ok, err := h.c.snapshots.Latest(h.key.UID, "context_assembly"); err != nil || !ok || snap.Kind != SnapshotRetirement {
		t.Fatalf("retirement snapshot: %+v %v %v", snap, ok, err)
	}
	if st.Modules["prompt_system"].Phase != iteronv1.PhaseActive {
		t.Fatal("the remaining module stopped serving")
	}
}

func TestRemoveRetiresEverythingInDrainOrder(t *testing.T) {
	h := newHarness(t)
	sys := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV1}))
	ctx := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV1, Module: "context_assembly", ImplementationID: "counter-ctx"}))
	ctx.DependsOn = []string{"prompt_system"}
	h.apply(SwapPolicy{}, sys, ctx)
	st := h.settle()
	pids := []int{st.Modules["prompt_system"].Pid, st.Modules["context_assembly"].Pid}
	if _, err := h.c.Remove(h.key); err != nil {
		t.Fatal(err)
	}
	st = h.settle()
	if !st.Removed || len(st.Modules) != 0 {
		t.Fatalf("after Remove: removed=%v modules=%v", st.Removed, st.Modules)
	}
	for _, pid := range pids {
		if !processGone(pid) {
			t.Fatalf("process %d survived Remove", pid)
		}
	}
	var retired []string
	for _, p := range h.ledgerPhases() {
		if strings.HasSuffix(p, ":drain:applied") {
			retired = append(retired, strings.Split(p, ":")[0])
		}
	}
	if want := []string{"context_assembly", "prompt_system"}; !slices.Equal(retired, want) {
		t.Fatalf("drain order %v, want %v", retired, want)
	}
	if err := h.c.Forget(h.key.UID); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.c.Status(h.key.UID); ok {
		t.Fatal("a forgotten activation is still known")
	}
}
