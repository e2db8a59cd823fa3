package gitops_test

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// TestKstatusReadsRealActivationsAsTheDesignSays computes kstatus (what Flux's
// health checks and cli-utils' status poller use) on activations whose status
// the API server stored.
func TestKstatusReadsRealActivationsAsTheDesignSays(t *testing.T) {
	cases := []struct {
		name        string
		state       activationState
		want        kstatus.Status
		wantMessage string
	}{
		{"a Ready activation (Reconciling and Stalled False, observedGeneration current) is Current",
			activationState{conditions: []metav1.Condition{readyTrue, reconcilingFalse, stalledFalse, degradedFalse, verifiedTrue}},
			kstatus.CurrentStatus, "Resource is Ready"},
		{"an activation in the middle of a hot swap (Reconciling=True) is InProgress",
			activationState{conditions: []metav1.Condition{readyTrue, reconcilingTrue, stalledFalse, degradedFalse, verifiedTrue}},
			kstatus.InProgressStatus, msgSwap},
		{"a Stalled activation is Failed with the Stalled message",
			activationState{conditions: []metav1.Condition{readyFalseStalled, reconcilingFalse, stalledTrue, degradedFalse}},
			kstatus.FailedStatus, msgStalled},
		{"a Stalled activation that also reports Reconciling, Stalled listed first, is Failed",
			activationState{conditions: []metav1.Condition{stalledTrue, reconcilingTrue, readyFalseStalled}},
			kstatus.FailedStatus, msgStalled},
		{"a Ready activation whose new spec the manager has not observed is InProgress",
			activationState{conditions: []metav1.Condition{readyTrue, reconcilingFalse, stalledFalse}, specChangedAfterStatus: true},
			kstatus.InProgressStatus, "ImplementationActivation generation is 2, but latest observed generation is 1"},
		{"a new activation the manager has not observed yet is InProgress (status.observedGeneration defaults to 0)",
			activationState{noStatus: true},
			kstatus.InProgressStatus, "ImplementationActivation generation is 1, but latest observed generation is 0"},
		{"an activation whose Ready is Unknown is InProgress",
			activationState{conditions: []metav1.Condition{readyUnknown}},
			kstatus.InProgressStatus, msgUnknown},
		{"an activation held by its finalizer while its modules retire is Terminating",
			activationState{conditions: []metav1.Condition{readyTrue, reconcilingFalse, stalledFalse}, deleting: true},
			kstatus.TerminatingStatus, "Resource scheduled for deletion"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			expectKstatus(t, realizeActivation(t, tc.state), tc.want, tc.wantMessage)
		})
	}
}

// TestKstatusReadsTheseActivationsDifferentlyFromArgoCD pins what kstatus
// v0.37.2 computes where its reading departs from the Argo CD health check and
// from what the design expects. These rows assert kstatus's actual behaviour so
// that an upgrade that changes it is noticed; each says what the controllers
// must do about it.
func TestKstatusReadsTheseActivationsDifferentlyFromArgoCD(t *testing.T) {
	cases := []struct {
		name        string
		state       activationState
		want        kstatus.Status
		wantMessage string
		argo        string
		consequence string
	}{
		{"a Stalled activation whose Reconciling=True is listed before Stalled is InProgress",
			activationState{conditions: []metav1.Condition{reconcilingTrue, stalledTrue, readyFalseStalled}},
			kstatus.InProgressStatus, msgSwap, "Degraded",
			"kstatus takes the first of Reconciling=True and Stalled=True in list order. The manager must set Reconciling=False whenever it sets Stalled=True (never both True)."},
		{"an activation that is not Ready and neither Stalled nor Reconciling is InProgress",
			activationState{conditions: []metav1.Condition{readyFalse, reconcilingFalse, stalledFalse}},
			kstatus.InProgressStatus, msgNotReady, "Degraded",
			"kstatus reads Ready=False as still trying. The manager must set Stalled=True whenever it will not progress without a change."},
		{"a Degraded activation that is neither Stalled nor Reconciling is InProgress",
			activationState{conditions: []metav1.Condition{readyFalse, reconcilingFalse, stalledFalse, degradedTrue}},
			kstatus.InProgressStatus, msgNotReady, "Degraded",
			"kstatus does not read Degraded. A plan halted at its first failure waits for a change, so it must also be Stalled=True to read Failed."},
		{"a paused activation with a spec change the manager has not observed is InProgress",
			activationState{paused: true, conditions: []metav1.Condition{readyTrue, reconcilingFalse, stalledFalse}, specChangedAfterStatus: true},
			kstatus.InProgressStatus, "ImplementationActivation generation is 2, but latest observed generation is 1", "Suspended",
			"kstatus knows nothing of spec.paused. A paused manager must still record observedGeneration (with Ready's reason Paused), or kstatus waits forever."},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u := realizeActivation(t, tc.state)
			expectKstatus(t, u, tc.want, tc.wantMessage)
			argo, err := runArgoHealthScript(readRepoFile(t, "config/argocd/health.lua"), u.Object)
			if err != nil {
				t.Fatal(err)
			}
			if argo.Status != tc.argo {
				t.Fatalf("Argo CD health = %s; this row documents a difference from %s", argo.Status, tc.argo)
			}
			t.Logf("kstatus %s, Argo CD %s: %s", tc.want, tc.argo, tc.consequence)
		})
	}
}

// TestKstatusReadsRealGenerations computes kstatus on Generations: Active is
// Current, a generation being prepared or drained is InProgress, a Failed one
// is Failed.
func TestKstatusReadsRealGenerations(t *testing.T) {
	cases := []struct {
		name        string
		phase       iteronv1.ModulePhase
		step        iteronv1.GenerationStep
		conditions  []metav1.Condition
		want        kstatus.Status
		wantMessage string
	}{
		{"an Active generation (Ready, committed) is Current",
			iteronv1.PhaseActive, iteronv1.StepCommitted,
			[]metav1.Condition{readyTrue, reconcilingFalse, stalledFalse},
			kstatus.CurrentStatus, "Resource is Ready"},
		{"a generation being shadow-loaded (Reconciling=True) is InProgress",
			iteronv1.PhasePreparing, iteronv1.StepShadowLoad,
			[]metav1.Condition{cond(iteronv1.ConditionReady, metav1.ConditionFalse, iteronv1.ReasonProgressing, "shadow_load"), cond(iteronv1.ConditionReconciling, metav1.ConditionTrue, iteronv1.ReasonProgressing, "shadow_load"), stalledFalse},
			kstatus.InProgressStatus, "shadow_load"},
		{"a generation being drained (Reconciling=True) is InProgress",
			iteronv1.PhaseDraining, iteronv1.StepDrain,
			[]metav1.Condition{cond(iteronv1.ConditionReady, metav1.ConditionFalse, iteronv1.ReasonProgressing, "drain"), cond(iteronv1.ConditionReconciling, metav1.ConditionTrue, iteronv1.ReasonProgressing, "drain"), stalledFalse},
			kstatus.InProgressStatus, "drain"},
		{"a Failed generation (Stalled=True) is Failed with the Stalled message",
			iteronv1.PhaseFailed, iteronv1.StepRolledBack,
			[]metav1.Condition{cond(iteronv1.ConditionReady, metav1.ConditionFalse, iteronv1.ReasonProviderFailed, "failed"), reconcilingFalse, cond(iteronv1.ConditionStalled, metav1.ConditionTrue, iteronv1.ReasonProviderFailed, "provider exited with status 3 during readiness")},
			kstatus.FailedStatus, "provider exited with status 3 during readiness"},
		// kstatus cannot tell a retired generation from one not ready yet: an
		// Inactive generation kept as history, with Ready=False, reads
		// InProgress. No GitOps tool waits on it (Generations are written by
		// the manager, never applied), so this row only pins the reading.
		{"an Inactive generation kept as history (Ready=False) is InProgress",
			iteronv1.PhaseInactive, iteronv1.StepCommitted,
			[]metav1.Condition{cond(iteronv1.ConditionReady, metav1.ConditionFalse, "Retired", "replaced by generation 2"), reconcilingFalse, stalledFalse},
			kstatus.InProgressStatus, "replaced by generation 2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			gen := newGeneration(uniqueName("gen"))
			if err := env.Client.Create(ctx, gen); err != nil {
				t.Fatalf("create generation: %v", err)
			}
			deleteAfterTest(t, gen)
			gen.Status.ObservedGeneration = gen.Generation
			gen.Status.Phase = tc.phase
			gen.Status.Step = tc.step
			for _, c := range tc.conditions {
				c.ObservedGeneration = gen.Generation
				gen.Status.Conditions = append(gen.Status.Conditions, c)
			}
			if err := env.Client.Status().Update(ctx, gen); err != nil {
				t.Fatalf("write status: %v", err)
			}
			u := readBack(t, gen, "Generation")
			if phase, _, _ := unstructured.NestedString(u.Object, "status", "phase"); phase != string(tc.phase) {
				t.Fatalf("the API server holds phase %q; wrote %q", phase, tc.phase)
			}
			expectKstatus(t, u, tc.want, tc.wantMessage)
		})
	}
}

func expectKstatus(t *testing.T, u *unstructured.Unstructured, want kstatus.Status, wantMessage string) {
	t.Helper()
	res, err := kstatus.Compute(u)
	if err != nil {
		t.Fatalf("kstatus.Compute: %v", err)
	}
	if res.Status != want || res.Message != wantMessage {
		t.Fatalf("kstatus = %s (%q)\n    want %s (%q)", res.Status, res.Message, want, wantMessage)
	}
}
