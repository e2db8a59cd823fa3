package crash

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
)

// TestASpecThatCannotBeVerifiedAfterARestartKeepsTheCommittedGenerationServing
// changes an activation's source while no manager runs to one whose catalog
// is missing (as an OCI source still being pulled, or a registry down, is
// unavailable at the restart): the next manager relaunches the ledger's last
// committed generation with its state and serves it, and the status names
// the new source's failure, instead of serving nothing until the spec can
// be had.
func TestASpecThatCannotBeVerifiedAfterARestartKeepsTheCommittedGenerationServing(t *testing.T) {
	n := newNode(t)
	m := n.start(t, "")
	a := newActivation(t, "unresolvable-restart", nil, source(t, artifacts.CounterV2, "prompt_system", "counter-v2"))
	waitFor(t, a, "Ready with v2", readyWith("prompt_system", "counter-v2"))
	if c := n.mustCount(t, a, "a", 4); c != 4 {
		t.Fatalf("first call: a=%v", c)
	}
	if err := m.stop(t); err != nil {
		t.Fatalf("the manager's exit after SIGTERM: %v", err)
	}
	missing := source(t, artifacts.CounterV1, "prompt_system", "counter-v1")
	missing.CatalogPath = filepath.Join(providersDir, "not-yet-there", "catalog.json")
	if _, err := os.Stat(missing.CatalogPath); err == nil {
		t.Fatalf("%s exists", missing.CatalogPath)
	}
	patch := client.MergeFrom(a.DeepCopy())
	a.Spec.Sources = []iteronv1.ActivationSource{missing}
	if err := env.Client.Patch(context.Background(), a, patch); err != nil {
		t.Fatal(err)
	}
	n.start(t, "")
	got := waitFor(t, a, "the committed generation served again, the new source's failure named", func(got *iteronv1.ImplementationActivation) bool {
		if len(got.Status.Modules) != 1 {
			return false
		}
		ms := got.Status.Modules[0]
		return ms.Phase == iteronv1.PhaseActive && ms.ImplementationID == "counter-v2" && ms.Reason != "" && strings.Contains(ms.Message, "catalogPath")
	})
	if c := n.mustCount(t, got, "a", 1); c != 5 {
		t.Fatalf("after the restart: a=%v; want 5 (the committed generation relaunched with its state)", c)
	}
	ms := got.Status.Modules[0]
	t.Logf("after the restart: %s %s on %s; %s: %s", ms.GenerationName, ms.Phase, ms.ImplementationID, ms.Reason, ms.Message)
	deleteActivation(t, got)
}
