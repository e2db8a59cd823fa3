package hotswap

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/dispatch"
	"iteron.dev/operator/internal/reasons"
	"iteron.dev/operator/internal/verifier"
)

// applyWith applies targets with a checkpoint interval.
func (h *harness) applyWith(swap SwapPolicy, checkpoint time.Duration, targets ...ModuleTarget) {
	h.t.Helper()
	if swap.Deadline == 0 {
		swap.Deadline = 20 * time.Second
	}
	d := Desired{Key: h.key, SpecGeneration: 1, CandidateSHA256: providertest.CandidateSHA256, Swap: swap, CheckpointInterval: checkpoint}
	for _, t := range targets {
		d.Modules = append(d.Modules, t)
		d.ActivateOrder = append(d.ActivateOrder, t.Module)
	}
	if err := h.c.Apply(d); err != nil {
		h.t.Fatal(err)
	}
}

// waitStatus polls the coordinator until cond holds.
func (h *harness) waitStatus(what string, cond func(ActivationStatus) bool) ActivationStatus {
	h.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, ok := h.c.Status(h.key.UID)
		if ok && cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("never %s: %+v", what, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func killGroup(t *testing.T, pid int) {
	t.Helper()
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -%d: %v", pid, err)
	}
}

func TestCheckpointsMakeActiveStateDurableBetweenRuns(t *testing.T) {
	h := newHarness(t)
	v2 := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2}))
	h.applyWith(SwapPolicy{}, 200*time.Millisecond, v2)
	h.settle()
	h.count("prompt_system", "a", 4)
	st := h.waitStatus("checkpointed after the call", func(st ActivationStatus) bool {
		cp := st.Generations[v2.GenerationName].LastCheckpoint
		return cp != nil && strings.Contains(h.snapshotState(cp.StateSHA256), `"count":4`)
	})
	cp := st.Generations[v2.GenerationName].LastCheckpoint
	if st.Generations[v2.GenerationName].StateSHA256 != cp.StateSHA256 {
		t.Fatalf("stateSHA256 %s, checkpoint %s", st.Generations[v2.GenerationName].StateSHA256, cp.StateSHA256)
	}
	// Checkpoints keep coming and are pruned to the newest few.
	for i := range 5 {
		h.count("prompt_system", "b", i+1)
		time.Sleep(250 * time.Millisecond)
	}
	all, err := h.c.snapshots.List(h.key.UID, "prompt_system")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range all {
		if s.Kind == SnapshotCheckpoint {
			n++
		}
	}
	if n == 0 || n > CheckpointsKept {
		t.Fatalf("%d checkpoints kept, want 1..%d", n, CheckpointsKept)
	}
	// Checkpoints are not transactions: the ledger holds only the activation.
	if got := len(h.ledgerPhases()); got != 4 {
		t.Fatalf("ledger has %d records; checkpoints must not be recorded as transactions", got)
	}
}

// snapshotState returns the stored state with digest (any kind), or "".
func (h *harness) snapshotState(digest string) string {
	all, _ := h.c.snapshots.List(h.key.UID, "prompt_system")
	for _, s := range all {
		if s.StateSHA256 == digest {
			return string(s.State)
		}
	}
	return ""
}

func TestAProviderKilledFromOutsideIsRelaunchedAndRestored(t *testing.T) {
	h := newHarness(t)
	v2 := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2}))
	h.applyWith(SwapPolicy{}, 100*time.Millisecond, v2)
	st := h.settle()
	h.count("prompt_system", "a", 6)
	h.waitStatus("checkpointed", func(st ActivationStatus) bool {
		cp := st.Generations[v2.GenerationName].LastCheckpoint
		return cp != nil && strings.Contains(h.snapshotState(cp.StateSHA256), `"count":6`)
	})
	pid := st.Modules["prompt_system"].Pid
	killGroup(t, pid)
	st = h.waitStatus("relaunched", func(st ActivationStatus) bool {
		ms := st.Modules["prompt_system"]
		return ms.Phase == iteronv1.PhaseActive && ms.Pid != 0 && ms.Pid != pid
	})
	if out := h.count("prompt_system", "a", 1); out["count"] != float64(7) {
		t.Fatalf("after the relaunch a=%v, want 7 (restored from the checkpoint)", out["count"])
	}
	if !processGone(pid) {
		t.Fatalf("the killed process %d is still there", pid)
	}
	tx := lastTransaction(h.ledgerPhases())
	want := []string{"prompt_system:verify:applied", "prompt_system:shadow_load:applied", "prompt_system:restore:applied", "prompt_system:readiness:applied", "prompt_system:atomic_switch:applied", "prompt_system:committed:committed"}
	if strings.Join(tx, " ") != strings.Join(want, " ") {
		t.Fatalf("relaunch in the ledger: %v; want %v", tx, want)
	}
	if gs := st.Generations[v2.GenerationName]; !strings.HasSuffix(gs.TransactionID, "/r1") || gs.Lineage != 1 {
		t.Fatalf("relaunch transaction %q lineage %d; want /r1 on the same lineage", gs.TransactionID, gs.Lineage)
	}
}

func TestAProviderThatCrashesOnEveryRunFailsAfterTheCrashBudget(t *testing.T) {
	h := newHarness(t)
	bad := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.Faulty, ImplementationID: "faulty", Argv: []string{"--fault", "crash", "--at", "start", "--always"}}))
	h.applyWith(SwapPolicy{}, 0, bad)
	h.settle()
	deadline := time.Now().Add(90 * time.Second)
	crashes := 0
	for {
		st, _ := h.c.Status(h.key.UID)
		gs := st.Generations[bad.GenerationName]
		if gs.Phase == iteronv1.PhaseFailed {
			if gs.Reason != "provider_failed" || !strings.Contains(gs.Message, fmt.Sprintf("crashed %d times", CrashBudget)) {
				t.Fatalf("Failed generation: %+v", gs)
			}
			if len(st.Failures) != 1 {
				t.Fatalf("failures %+v; want the generation (the activation is Stalled)", st.Failures)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never Failed after %d crashes: %+v", crashes, gs)
		}
		if gs.Phase == iteronv1.PhaseActive && gs.Pid != 0 {
			if _, err := h.invoke("prompt_system", `{"key":"a","add":1}`); err != nil {
				crashes++
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if crashes < CrashBudget {
		t.Fatalf("Failed after %d crashing calls, want %d; ledger:\n%s", crashes, CrashBudget, strings.Join(h.ledgerPhases(), "\n"))
	}
	relaunches := h.transactionsOf("prompt_system")
	if relaunches != CrashBudget {
		// Every transaction — the activation and each relaunch — ended in a
		// crash (a relaunch that fails counts as one).
		t.Fatalf("%d transactions (1 activation + relaunches), want %d; ledger:\n%s", relaunches, CrashBudget, strings.Join(h.ledgerPhases(), "\n"))
	}
}

func TestANewTargetReplacesAGenerationThatSpentItsCrashBudget(t *testing.T) {
	h := newHarness(t)
	bad := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.Faulty, ImplementationID: "faulty", Argv: []string{"--fault", "crash", "--at", "start", "--always"}}))
	h.applyWith(SwapPolicy{}, 0, bad)
	h.settle()
	for deadline := time.Now().Add(90 * time.Second); ; {
		st, _ := h.c.Status(h.key.UID)
		if st.Generations[bad.GenerationName].Phase == iteronv1.PhaseFailed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never Failed: %+v", st.Generations[bad.GenerationName])
		}
		if gs := st.Generations[bad.GenerationName]; gs.Phase == iteronv1.PhaseActive && gs.Pid != 0 {
			_, _ = h.invoke("prompt_system", `{"key":"a","add":1}`)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var ce *dispatch.CallError
	if _, err := h.invoke("prompt_system", `{"key":"a","add":1}`); !errors.As(err, &ce) || ce.Code != reasons.ProviderFailed {
		t.Fatalf("a call to the module whose crash budget is spent: %v; want provider_failed at once", err)
	}
	// A new spec (the revert a fleet makes): the hot swap policy cannot
	// move state out of a process that is gone, so the target replaces
	// the generation cold, and the module serves again.
	good := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV1, ImplementationID: "counter"}))
	h.applyWith(SwapPolicy{}, 0, good)
	st := h.waitStatus("the new target active", func(st ActivationStatus) bool {
		return st.Modules["prompt_system"].Active == good.GenerationName && !st.Busy
	})
	if gs := st.Generations[bad.GenerationName]; gs.Phase != iteronv1.PhaseInactive && gs.Phase != iteronv1.PhaseFailed {
		t.Fatalf("the given-up generation after its replacement: %+v; want it ended", gs)
	}
	if out := h.count("prompt_system", "a", 1); out["count"] != float64(1) || out["_served_by"] != good.GenerationName {
		t.Fatalf("after the replacement: %v; want a fresh count of 1 served by %s", out, good.GenerationName)
	}
	tx := lastTransaction(h.ledgerPhases())
	want := []string{"prompt_system:verify:applied", "prompt_system:shadow_load:applied", "prompt_system:quiesce:applied", "prompt_system:atomic_switch:applied", "prompt_system:drain:applied", "prompt_system:committed:committed"}
	if strings.Join(tx, " ") != strings.Join(want, " ") {
		t.Fatalf("the replacement in the ledger: %v; want a cold replace %v", tx, want)
	}
}

func TestTheOldProviderFailingAtSnapshotRollsBackAndRelaunchesFromItsCheckpoint(t *testing.T) {
	h := newHarness(t)
	// The old provider crashes at a snapshot only while its marker file is
	// absent (and leaves it behind, so the relaunched process behaves): the
	// marker is there while checkpoints run, and taken away once they are
	// off, so the crash is the swap's snapshot's however many checkpoints
	// ran meanwhile.
	markers, err := os.MkdirTemp("", "iteron-hotswap-marker-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(markers) })
	if err := os.Chmod(markers, 0o777); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(markers, "fired")
	if err := os.WriteFile(marker, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	old := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.Faulty, ImplementationID: "faulty", Argv: []string{"--fault", "crash", "--at", "snapshot", "--once-marker", marker}}))
	h.applyWith(SwapPolicy{}, 100*time.Millisecond, old)
	h.settle()
	h.count("prompt_system", "a", 3)
	h.waitStatus("checkpointed", func(st ActivationStatus) bool {
		cp := st.Generations[old.GenerationName].LastCheckpoint
		return cp != nil && strings.Contains(h.snapshotState(cp.StateSHA256), `"count":3`)
	})
	// Stop checkpointing, then arm the crash: the next snapshot is the swap's.
	h.applyWith(SwapPolicy{}, 0, old)
	oldPid := h.settle().Modules["prompt_system"].Pid
	if err := os.Remove(marker); err != nil {
		t.Fatal(err)
	}

	next := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2}))
	h.applyWith(SwapPolicy{Deadline: 10 * time.Second, QuiesceTimeout: time.Second}, 0, next)
	st := h.waitStatus("the old relaunched", func(st ActivationStatus) bool {
		ms := st.Modules["prompt_system"]
		return ms.Active == old.GenerationName && ms.Phase == iteronv1.PhaseActive && ms.Pid != 0 && ms.Pid != oldPid
	})
	if gs := st.Generations[next.GenerationName]; gs.Phase != iteronv1.PhaseFailed {
		t.Fatalf("the swap target: %+v; want Failed", gs)
	}
	if out := h.count("prompt_system", "a", 1); out["count"] != float64(4) {
		t.Fatalf("after the relaunch a=%v, want 4 (restored from the last checkpoint)", out["count"])
	}
	phases := h.ledgerPhases()
	joined := strings.Join(phases, " ")
	if !strings.Contains(joined, "prompt_system:snapshot:blocked prompt_system:rolled_back:rolled_back") {
		t.Fatalf("the failed swap is not in the ledger: %v", phases)
	}
	if tx := lastTransaction(phases); tx[len(tx)-1] != "prompt_system:committed:committed" || tx[2] != "prompt_system:restore:applied" {
		t.Fatalf("the relaunch: %v", tx)
	}
}

func TestShutdownCheckpointsAndARestartRelaunchesTheCommittedGeneration(t *testing.T) {
	h := newHarness(t)
	v2 := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2}))
	h.applyWith(SwapPolicy{}, 0, v2) // no periodic checkpoint: shutdown's is the only one
	st := h.settle()
	pid := st.Modules["prompt_system"].Pid
	h.count("prompt_system", "a", 9)
	if err := h.c.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !processGone(pid) {
		t.Fatalf("process %d survived the shutdown", pid)
	}

	// A new coordinator over the same state dir (a restarted manager).
	h2 := newHarnessAt(t, h.stateDir, h.key)
	h2.applyWith(SwapPolicy{}, 0, v2)
	st = h2.settle()
	ms := st.Modules["prompt_system"]
	if ms.Active != v2.GenerationName || ms.Phase != iteronv1.PhaseActive {
		t.Fatalf("after the restart: %+v", ms)
	}
	if out := h2.count("prompt_system", "a", 1); out["count"] != float64(10) {
		t.Fatalf("after the restart a=%v, want 10 (the shutdown checkpoint restored)", out["count"])
	}
	tx := lastTransaction(h2.ledgerPhases())
	if len(tx) != 6 || tx[2] != "prompt_system:restore:applied" {
		t.Fatalf("restart relaunch: %v", tx)
	}
}

func TestARestartWithANarrowerCeilingRefusesTheRelaunch(t *testing.T) {
	h := newHarness(t)
	impl := providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2, Capabilities: []string{"read_only", "reversible_local"}})
	v2 := h.target(impl)
	h.applyWith(SwapPolicy{}, 0, v2)
	h.settle()
	if err := h.c.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	h2 := newHarnessAt(t, h.stateDir, h.key)
	narrowed := h2.targetAt(impl, v2.Lineage, v2.Attempt, func(f *verifier.LaunchPlanFields) { narrowTo("read_only")(f) })
	narrowed.Epoch = v2.Epoch
	h2.applyWith(SwapPolicy{}, 0, narrowed)
	st := h2.settle()
	ms := st.Modules["prompt_system"]
	if ms.Serving || ms.Pid != 0 || ms.Phase != iteronv1.PhaseFailed || ms.Reason != "authority_changed" {
		t.Fatalf("relaunch with a changed authority: %+v; want refused (Failed, nothing serving) with authority_changed", ms)
	}
}
