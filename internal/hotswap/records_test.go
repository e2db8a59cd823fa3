package hotswap

import (
	"errors"
	"slices"
	"testing"
	"time"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
)

// TestAPlanStartsNothingUntilItsGenerationObjectsAreRecorded shows the gate
// of ModuleTarget.Unrecorded: a hot swap to a target whose Generation object
// does not exist yet waits (busy, the old generation serving, no ledger
// record), halts without being busy while the object is refused, and runs
// once the object is reported created.
func TestAPlanStartsNothingUntilItsGenerationObjectsAreRecorded(t *testing.T) {
	h := newHarness(t)
	v1 := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV1}))
	h.apply(SwapPolicy{}, v1)
	h.settle()
	h.count("prompt_system", "a", 2)
	before := h.ledgerPhases()

	v2 := h.target(providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2}))
	v2.Unrecorded = true
	h.apply(SwapPolicy{QuiesceTimeout: time.Second}, v2)
	// unchanged checks that nothing of v2 started and v1 still serves.
	unchanged := func(when string) ActivationStatus {
		t.Helper()
		st, _ := h.c.Status(h.key.UID)
		if _, ok := st.Generations[v2.GenerationName]; ok {
			t.Fatalf("%s: the coordinator started %s before its object was recorded: %+v", when, v2.GenerationName, st.Generations[v2.GenerationName])
		}
		if got := h.ledgerPhases(); !slices.Equal(got, before) {
			t.Fatalf("%s: the ledger grew to %v", when, got)
		}
		if out := h.count("prompt_system", "a", 1); out["_served_by"] != v1.GenerationName {
			t.Fatalf("%s: a call was served by %v, want %s", when, out["_served_by"], v1.GenerationName)
		}
		return st
	}
	time.Sleep(300 * time.Millisecond)
	if st := unchanged("before any report"); !st.Busy {
		t.Fatalf("a plan waiting for its Generation object is not busy: %+v", st)
	}

	h.c.Recorded(h.key.UID, v2.GenerationName, errors.New("admission webhook denied the request"))
	st := h.settle()
	if st.Modules["prompt_system"].Active != v1.GenerationName {
		t.Fatalf("after the refusal the module is %+v; want %s active", st.Modules["prompt_system"], v1.GenerationName)
	}
	unchanged("after the refusal")

	h.c.Recorded(h.key.UID, v2.GenerationName, nil)
	deadline := time.Now().Add(30 * time.Second)
	for {
		st = h.settle()
		if st.Modules["prompt_system"].Active == v2.GenerationName || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if ms := st.Modules["prompt_system"]; ms.Active != v2.GenerationName || ms.Phase != iteronv1.PhaseActive {
		t.Fatalf("after the object was recorded the module is %+v; want %s Active", ms, v2.GenerationName)
	}
	if out := h.count("prompt_system", "a", 1); out["count"] != float64(5) || out["_served_by"] != v2.GenerationName {
		t.Fatalf("after the swap: %v; want a=5 from %s (state migrated)", out, v2.GenerationName)
	}
}
