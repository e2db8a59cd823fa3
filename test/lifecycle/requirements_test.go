package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
	"iteron.dev/operator/examples/providers/providertest"
	"iteron.dev/operator/internal/catalog"
	"iteron.dev/operator/test/operatortest"
)

// source lays out counter v2 as implementation id of module at version v.
func source(t *testing.T, module, id string, v catalog.Version) iteronv1.ActivationSource {
	t.Helper()
	impl := providertest.Implement(t, artifacts.Spec{Binary: artifacts.CounterV2, Module: module, ImplementationID: id, Version: v})
	s := providertest.Catalog(t, impl)[0]
	return iteronv1.ActivationSource{Module: module, ImplementationID: id, CatalogPath: s.CatalogPath, ArtifactRoot: s.ArtifactRoot,
		ManifestSHA256: s.ManifestSHA256, ArtifactSHA256: s.ArtifactSHA256}
}

var nameSeq atomic.Int64

// newActivation creates an activation on the suite's node; the test's end
// deletes it and waits for its finalizer.
func newActivation(t *testing.T, prefix string, sources ...iteronv1.ActivationSource) *iteronv1.ImplementationActivation {
	t.Helper()
	return newActivationNamed(t, fmt.Sprintf("%s-%d", prefix, nameSeq.Add(1)), sources...)
}

// newActivationNamed is newActivation with the name given.
func newActivationNamed(t *testing.T, name string, sources ...iteronv1.ActivationSource) *iteronv1.ImplementationActivation {
	t.Helper()
	act := &iteronv1.ImplementationActivation{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: iteronv1.ImplementationActivationSpec{NodeName: testNode, CandidateSHA256: providertest.CandidateSHA256, Sources: sources,
			Swap: iteronv1.SwapPolicy{DeadlineSeconds: 30}},
	}
	if err := env.Client.Create(context.Background(), act); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { operatortest.DeleteAndWait(t, env.Client, act) })
	return act
}

// doctorOutput runs `kubectl iteron doctor` until its output holds want
// (status is written a moment after the coordinator acts), and returns it.
func doctorOutput(t *testing.T, act *iteronv1.ImplementationActivation, want string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		cmd := exec.Command(cliBin, "doctor", act.Name, "-n", act.Namespace, "--kubeconfig", kubeconfig)
		out, err := cmd.Output()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		if strings.Contains(string(out), want) || time.Now().After(deadline) {
			return string(out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

var (
	v100 = catalog.Version{1, 0, 0}
	v120 = catalog.Version{1, 2, 0}
)

// TestTypedRequirementsAsAUserSeesThem runs each requirement case of the
// suite's seam graph as an activation on the real manager and reads what
// status and the doctor say.
func TestTypedRequirementsAsAUserSeesThem(t *testing.T) {
	tests := []struct {
		name    string
		sources func(t *testing.T) []iteronv1.ActivationSource
		module  string
		phase   iteronv1.ModulePhase
		reason  string
		message string // in status.modules[].message (Inactive) or diagnostics[0] (Active)
		doctor  string // in `kubectl iteron doctor` output, when set
	}{
		{name: "a required dependency inside its range activates the consumer after it",
			sources: func(t *testing.T) []iteronv1.ActivationSource {
				return []iteronv1.ActivationSource{source(t, "store", "store-142", catalog.Version{1, 4, 2}), source(t, "memo", "memo-100", v100), source(t, "planner", "planner-1", v100)}
			},
			module: "planner", phase: iteronv1.PhaseActive},
		{name: "a required dependency below its range keeps the consumer Inactive",
			sources: func(t *testing.T) []iteronv1.ActivationSource {
				return []iteronv1.ActivationSource{source(t, "store", "store-119", catalog.Version{1, 1, 9}), source(t, "planner", "planner-1", v100)}
			},
			module: "planner", phase: iteronv1.PhaseInactive, reason: "dependency_unsatisfied",
			message: "planner needs store [1.2.0, 2.0.0), but store has store-119 at 1.1.9",
			doctor:  "[problem] dependency_blocked planner: module planner is Inactive: dependency_unsatisfied: planner needs store [1.2.0, 2.0.0), but store has store-119 at 1.1.9"},
		{name: "a required dependency at its exclusive maximum keeps the consumer Inactive",
			sources: func(t *testing.T) []iteronv1.ActivationSource {
				return []iteronv1.ActivationSource{source(t, "store", "store-200", catalog.Version{2, 0, 0}), source(t, "planner", "planner-1", v100)}
			},
			module: "planner", phase: iteronv1.PhaseInactive, reason: "dependency_unsatisfied",
			message: "planner needs store [1.2.0, 2.0.0), but store has store-200 at 2.0.0"},
		{name: "a required dependency without a source keeps the consumer Inactive",
			sources: func(t *testing.T) []iteronv1.ActivationSource {
				return []iteronv1.ActivationSource{source(t, "memo", "memo-100", v100), source(t, "planner", "planner-1", v100)}
			},
			module: "planner", phase: iteronv1.PhaseInactive, reason: "dependency_unsatisfied",
			message: "planner needs store [1.2.0, 2.0.0), which has no source in the activation"},
		{name: "a missing optional dependency activates the consumer with a diagnostic",
			sources: func(t *testing.T) []iteronv1.ActivationSource {
				return []iteronv1.ActivationSource{source(t, "store", "store-120", v120), source(t, "planner", "planner-1", v100)}
			},
			module: "planner", phase: iteronv1.PhaseActive,
			message: "optional dependency memo ≥ 1.0.0, which has no source in the activation; activated without it",
			doctor:  "[info] optional_dependency_missing planner: module planner is Active without an optional dependency: optional dependency memo ≥ 1.0.0, which has no source in the activation; activated without it"},
		{name: "an optional dependency outside its range activates the consumer without it",
			sources: func(t *testing.T) []iteronv1.ActivationSource {
				return []iteronv1.ActivationSource{source(t, "store", "store-120", v120), source(t, "memo", "memo-090", catalog.Version{0, 9, 0}), source(t, "planner", "planner-1", v100)}
			},
			module: "planner", phase: iteronv1.PhaseActive,
			message: "optional dependency memo ≥ 1.0.0, but memo has memo-090 at 0.9.0; activated without it"},
		{name: "two sources providing one contract without a selection are a conflict",
			sources: func(t *testing.T) []iteronv1.ActivationSource {
				return []iteronv1.ActivationSource{source(t, "search_fast", "fast-1", v100), source(t, "search_exact", "exact-1", v100), source(t, "ranker", "ranker-1", v100)}
			},
			module: "ranker", phase: iteronv1.PhaseInactive, reason: "dependency_conflict",
			message: "ranker requires contract acme/search@v1, which 2 sources provide: search_fast (fast-1) and search_exact (exact-1); the seam graph selects none",
			doctor:  "[problem] dependency_blocked ranker: module ranker is Inactive: dependency_conflict: ranker requires contract acme/search@v1"},
		{name: "one source providing the contract binds it",
			sources: func(t *testing.T) []iteronv1.ActivationSource {
				return []iteronv1.ActivationSource{source(t, "search_fast", "fast-1", v100), source(t, "ranker", "ranker-1", v100)}
			},
			module: "ranker", phase: iteronv1.PhaseActive},
		{name: "a selection binds the selected provider among two",
			sources: func(t *testing.T) []iteronv1.ActivationSource {
				return []iteronv1.ActivationSource{source(t, "search_fast", "fast-1", v100), source(t, "search_exact", "exact-1", v100), source(t, "picker", "picker-1", v100)}
			},
			module: "picker", phase: iteronv1.PhaseActive},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			act := newActivation(t, "req", tc.sources(t)...)
			got := operatortest.WaitFor(t, env.Client, act, fmt.Sprintf("%s %s %s", tc.module, tc.phase, tc.reason), func(a *iteronv1.ImplementationActivation) bool {
				ms := operatortest.ModuleStatus(a, tc.module)
				if tc.phase == iteronv1.PhaseActive {
					// Every other admitted source is Active too: the
					// consumer was not activated before a dependency.
					for _, o := range a.Status.Modules {
						if o.Reason == "" && o.Phase != iteronv1.PhaseActive {
							return false
						}
					}
				}
				return ms.Phase == tc.phase && ms.Reason == tc.reason
			})
			ms := operatortest.ModuleStatus(got, tc.module)
			detail := ms.Message
			switch {
			case tc.phase == iteronv1.PhaseActive && tc.message == "":
				if len(ms.Diagnostics) != 0 || ms.Message != "" {
					t.Errorf("%s is Active with diagnostics %q and message %q", tc.module, ms.Diagnostics, ms.Message)
				}
				detail = "activate order " + strings.Join(got.Status.Plan.ActivateOrder, " → ")
			case tc.phase == iteronv1.PhaseActive:
				if len(ms.Diagnostics) != 1 || ms.Diagnostics[0] != tc.message {
					t.Errorf("diagnostics %q, want [%q]", ms.Diagnostics, tc.message)
				}
				if len(ms.Diagnostics) > 0 {
					detail = "diagnostic: " + ms.Diagnostics[0]
				}
			default:
				if !strings.Contains(ms.Message, tc.message) {
					t.Errorf("message %q does not say %q", ms.Message, tc.message)
				}
				if ms.GenerationName != "" {
					t.Errorf("%s has generation %s, yet nothing may run for it", tc.module, ms.GenerationName)
				}
			}
			if tc.phase == iteronv1.PhaseActive {
				// The plan activated the consumer after what it binds.
				order := got.Status.Plan.ActivateOrder
				if len(order) == 0 || order[len(order)-1] != tc.module {
					t.Errorf("activate order %v does not end with %s", order, tc.module)
				}
			}
			if tc.doctor != "" {
				out := doctorOutput(t, got, tc.doctor)
				if !strings.Contains(out, tc.doctor) {
					t.Errorf("kubectl iteron doctor does not say %q:\n%s", tc.doctor, out)
				} else {
					t.Logf("kubectl iteron doctor %s -n default:\n%s", got.Name, out)
					detail += " — doctor: " + doctorLine(out, tc.doctor)
				}
			}
			if !t.Failed() {
				addRow(tc.name, string(ms.Phase), ms.Reason, detail)
			}
		})
	}
}

// doctorLine is the line of the doctor's output that holds s.
func doctorLine(out, s string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, s) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}
