package controllers

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/hotswap"
)

func TestBeyondHistoryLimit(t *testing.T) {
	gen := func(name, module string, lineage int64, attempt int32, phase iteronv1.ModulePhase) iteronv1.Generation {
		return iteronv1.Generation{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:   iteronv1.GenerationSpec{Module: module, Generation: lineage, Attempt: attempt},
			Status: iteronv1.GenerationStatus{Phase: phase}}
	}
	history := []iteronv1.Generation{
		gen("m-1-1", "m", 1, 1, iteronv1.PhaseInactive),
		gen("m-2-1", "m", 2, 1, iteronv1.PhaseFailed),
		gen("m-2-2", "m", 2, 2, iteronv1.PhaseInactive),
		gen("m-3-1", "m", 3, 1, iteronv1.PhaseActive),
		gen("n-1-1", "n", 1, 1, iteronv1.PhaseInactive),
	}
	serving := hotswap.ActivationStatus{Modules: map[string]hotswap.ModuleStatus{"m": {Active: "m-3-1"}}}
	for _, tc := range []struct {
		name  string
		gens  []iteronv1.Generation
		st    hotswap.ActivationStatus
		limit int
		want  []string
	}{
		{name: "the newest ended generations of each module are kept up to the limit", gens: history, st: serving, limit: 1, want: []string{"m-2-1", "m-1-1"}},
		{name: "a limit of zero deletes every ended generation no one keeps", gens: history, st: serving, limit: 0, want: []string{"m-2-2", "m-2-1", "m-1-1", "n-1-1"}},
		{name: "a limit above the history deletes nothing", gens: history, st: serving, limit: 10, want: nil},
		{name: "the applied plan's target is kept though it failed",
			gens: history, limit: 0, want: []string{"m-2-2", "m-1-1", "n-1-1"},
			st: hotswap.ActivationStatus{Modules: serving.Modules, Targets: map[string]string{"m": "m-2-1"}}},
		{name: "the ledger's last committed generation is kept for its relaunch",
			gens: history, limit: 0, want: []string{"m-2-2", "m-2-1", "m-1-1"},
			st: hotswap.ActivationStatus{Modules: map[string]hotswap.ModuleStatus{"m": {Active: "m-3-1"}, "n": {Committed: &hotswap.CommittedGeneration{Name: "n-1-1"}}}}},
		{name: "the coordinator's phase counts before the object's status shows it",
			gens: []iteronv1.Generation{gen("m-1-1", "m", 1, 1, iteronv1.PhaseActive), gen("m-2-1", "m", 2, 1, iteronv1.PhaseActive)}, limit: 0, want: []string{"m-1-1"},
			st: hotswap.ActivationStatus{Modules: map[string]hotswap.ModuleStatus{"m": {Active: "m-2-1"}},
				Generations: map[string]hotswap.GenerationStatus{"m-1-1": {Phase: iteronv1.PhaseInactive}}}},
		{name: "a generation still in flight is never deleted",
			gens: []iteronv1.Generation{gen("m-1-1", "m", 1, 1, iteronv1.PhaseDraining), gen("m-2-1", "m", 2, 1, iteronv1.PhasePreparing)}, limit: 0, want: nil, st: hotswap.ActivationStatus{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, g := range beyondHistoryLimit(tc.gens, tc.st, tc.limit) {
				got = append(got, g.Name)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("deleted %v; want %v", got, tc.want)
			}
		})
	}
}
