package doctor

import (
	"bytes"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/reasons"
)

// TestTheHeadlineSaysWhatServesNow: the doctor's first line and its module
// lines describe what serves now — a module whose phase is not Active
// serves nothing, whatever implementation status names for its generation —
// and a module whose old generation serves after a failed swap is served.
func TestTheHeadlineSaysWhatServesNow(t *testing.T) {
	// failedSwap: the swap of prompt_system to counter-v1 failed at migrate
	// and its old generation (prompt_system-impl) serves.
	failedSwap := func() (*iteronv1.ImplementationActivation, []iteronv1.Generation) {
		a := activation("prompt_system")
		a.Generation, a.Status.ObservedGeneration = 2, 2
		a.Status.Conditions = readyConditions(2)
		a.Spec.Sources[0].ImplementationID = "counter-v1"
		ms := module(a, "prompt_system")
		ms.Reason, ms.Message = reasons.ProviderFailed, "stack-prompt-system-g2-1 failed at migrate: unsupported_layout"
		setCondition(a, iteronv1.ConditionStalled, metav1.ConditionTrue, iteronv1.ReasonProviderFailed, "module prompt_system: …")
		setCondition(a, iteronv1.ConditionReady, metav1.ConditionFalse, iteronv1.ReasonProviderFailed, "module prompt_system: …")
		old := generation(a, "prompt_system", 1, 1, "prompt_system-impl", iteronv1.PhaseActive, iteronv1.StepCommitted)
		bad := generation(a, "prompt_system", 2, 1, "counter-v1", iteronv1.PhaseFailed, iteronv1.StepRolledBack)
		bad.Status.Reason = reasons.ProviderFailed
		return a, []iteronv1.Generation{old, bad}
	}
	// notServing makes module m's active generation stop serving as the
	// coordinator reports it: status keeps its name and implementation,
	// with phase and reason.
	notServing := func(a *iteronv1.ImplementationActivation, m string, phase iteronv1.ModulePhase, reason string) {
		ms := module(a, m)
		ms.Phase, ms.Reason, ms.Message = phase, reason, "…"
		setCondition(a, iteronv1.ConditionReady, metav1.ConditionFalse, reasons.ConditionReason(reason), "module "+m+" serves nothing: …")
		setCondition(a, iteronv1.ConditionStalled, metav1.ConditionTrue, reasons.ConditionReason(reason), "module "+m+" serves nothing: …")
	}
	tests := []struct {
		name  string
		build func() *Input
		// headline is the first line after "… on node worker-1: ".
		headline string
		serving  int
		// lines must each appear in the text.
		lines []string
		check func(t *testing.T, r *Report)
	}{
		{
			name:     "a healthy activation is healthy",
			build:    func() *Input { return input(activation("prompt_system", "context_assembly")) },
			headline: "healthy",
			serving:  2,
			lines:    []string{"modules: 2 of 2 serve now, 2 of 2 their desired implementation"},
		},
		{
			name: "a failed swap whose old generation serves says every module serves, not at its desired implementation",
			build: func() *Input {
				a, gens := failedSwap()
				return input(a, gens...)
			},
			headline: "NOT HEALTHY, 1 problem; every module serves, 0 of 1 its desired implementation",
			serving:  1,
			lines:    []string{"prompt_system: Active, serving prompt_system-impl, desired counter-v1", "modules: 1 of 1 serve now, 0 of 1 their desired implementation"},
		},
		{
			name: "a relaunch refused after a failed swap says nothing serves, with the refusal's reason, not the swap's",
			build: func() *Input {
				a, gens := failedSwap()
				notServing(a, "prompt_system", iteronv1.PhaseFailed, reasons.VerificationFailed)
				module(a, "prompt_system").Message = "relaunch of stack-prompt-system-g1-1 refused at shadow_load: artifact digest mismatch"
				gens[0].Status.Phase, gens[0].Status.Step, gens[0].Status.Reason = iteronv1.PhaseFailed, iteronv1.StepShadowLoad, reasons.VerificationFailed
				return input(a, gens...)
			},
			headline: "NOT HEALTHY, 1 problem; nothing serves prompt_system (verification_failed)",
			lines: []string{
				"prompt_system: Failed, serving nothing (its generation stack-prompt-system-g1-1, prompt_system-impl, is Failed), desired counter-v1",
				"modules: 0 of 1 serve now, 0 of 1 their desired implementation",
			},
			check: func(t *testing.T, r *Report) {
				md := r.Modules[0]
				if md.ImplementationID != "" || md.Active == nil || md.Active.ImplementationID != "prompt_system-impl" {
					t.Fatalf("module diagnosis claims an implementation serves: %+v", md)
				}
				f := finding(t, r, FindingModuleNotActive, "prompt_system")
				if !strings.Contains(f.Hint, "The relaunch of stack-prompt-system-g1-1 (prompt_system-impl), which served the module, was refused") ||
					len(f.Commands) != 1 || !strings.Contains(f.Commands[0], iteronv1.AnnotationRetry+"=") {
					t.Fatalf("a refused relaunch gets its own advice and the retry command: %+v", f)
				}
			},
		},
		{
			name: "a corrupt ledger says nothing serves, ledger_corrupt",
			build: func() *Input {
				a := activation("prompt_system")
				ms := module(a, "prompt_system")
				ms.Phase, ms.GenerationName, ms.Generation, ms.ImplementationID = iteronv1.PhaseInactive, "", 0, ""
				notServing(a, "prompt_system", iteronv1.PhaseInactive, reasons.LedgerCorrupt)
				a.Status.Ledger.Verified = false
				return input(a)
			},
			headline: "NOT HEALTHY, 2 problems; nothing serves prompt_system (ledger_corrupt)",
			lines:    []string{"prompt_system: Inactive, serving nothing, desired prompt_system-impl"},
		},
		{
			name: "a generation waiting for its relaunch after a crash serves nothing meanwhile",
			build: func() *Input {
				a := activation("prompt_system", "context_assembly")
				notServing(a, "context_assembly", iteronv1.PhasePreparing, reasons.ProviderFailed)
				setCondition(a, iteronv1.ConditionStalled, metav1.ConditionFalse, iteronv1.ReasonProviderFailed, "")
				g := generation(a, "context_assembly", 1, 1, "context_assembly-impl", iteronv1.PhasePreparing, iteronv1.StepVerify)
				return input(a, g)
			},
			headline: "NOT HEALTHY, 1 problem; nothing serves context_assembly (provider_failed)",
			serving:  1,
			lines:    []string{"context_assembly: Preparing, serving nothing (its generation stack-context-assembly-g1-1, context_assembly-impl, is Preparing), desired context_assembly-impl"},
		},
		{
			name: "a module the manager never acted on serves nothing and says it is not in status",
			build: func() *Input {
				a := activation("prompt_system")
				a.Spec.Sources = append(a.Spec.Sources, iteronv1.ActivationSource{Module: "context_assembly", ImplementationID: "ctx"})
				a.Generation = 2
				return input(a)
			},
			headline: "NOT HEALTHY, 2 problems; nothing serves context_assembly (not in status)",
			serving:  1,
		},
		{
			name: "the headline names at most four modules that serve nothing",
			build: func() *Input {
				mods := []string{"prompt_system", "context_assembly", "provider_routing", "tool_policy", "memory_retrieval", "output_formatting"}
				a := activation(mods...)
				for _, m := range mods {
					ms := module(a, m)
					ms.Phase, ms.Reason = iteronv1.PhaseInactive, reasons.LedgerCorrupt
				}
				setCondition(a, iteronv1.ConditionReady, metav1.ConditionFalse, iteronv1.ReasonLedgerCorrupt, "…")
				return input(a)
			},
			headline: "NOT HEALTHY, 6 problems; nothing serves prompt_system (ledger_corrupt), context_assembly (ledger_corrupt), provider_routing (ledger_corrupt), tool_policy (ledger_corrupt) and 2 more",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Diagnose(tt.build(), nil, Options{Now: now})
			var text bytes.Buffer
			if err := WriteText(&text, r); err != nil {
				t.Fatal(err)
			}
			out := text.String()
			first, _, _ := strings.Cut(out, "\n")
			if want := "ImplementationActivation team/stack on node worker-1: " + tt.headline; first != want {
				t.Fatalf("headline\n got %q\nwant %q\n%s", first, want, out)
			}
			if Headline(r) != tt.headline {
				t.Fatalf("Headline(r) = %q", Headline(r))
			}
			if r.ServingCount != tt.serving {
				t.Fatalf("servingCount %d, want %d", r.ServingCount, tt.serving)
			}
			for _, l := range tt.lines {
				if !strings.Contains(out, l) {
					t.Fatalf("the text does not say %q:\n%s", l, out)
				}
			}
			if strings.Contains(tt.headline, "nothing serves") {
				for _, m := range r.Modules {
					if m.ImplementationID != "" && m.Phase != string(iteronv1.PhaseActive) {
						t.Fatalf("module %s is %s yet its diagnosis names %s as serving", m.Module, m.Phase, m.ImplementationID)
					}
				}
			}
			if tt.check != nil {
				tt.check(t, r)
			}
		})
	}
}
