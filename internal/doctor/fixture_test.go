package doctor

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// The fixtures build objects exactly as the controllers write them (names,
// owner references, status fields); the real-object suite in test/doctor
// checks the same findings on objects the real controllers wrote.

var now = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

const node = "worker-1"

// activation is a Ready activation of the given modules, each Active at
// generation 1 with implementation "<module>-impl".
func activation(modules ...string) *iteronv1.ImplementationActivation {
	a := &iteronv1.ImplementationActivation{
		ObjectMeta: metav1.ObjectMeta{Name: "stack", Namespace: "team", UID: types.UID("0a1b2c3d-0000-4000-8000-000000000001"), Generation: 1,
			Finalizers: []string{iteronv1.FinalizerActivation}},
		Spec: iteronv1.ImplementationActivationSpec{NodeName: node},
	}
	for _, m := range modules {
		a.Spec.Sources = append(a.Spec.Sources, iteronv1.ActivationSource{Module: m, ImplementationID: m + "-impl"})
		a.Status.Modules = append(a.Status.Modules, iteronv1.ModuleStatus{
			Module: m, ImplementationID: m + "-impl", Phase: iteronv1.PhaseActive, Generation: 1, GenerationName: genName(m, 1, 1),
		})
	}
	a.Status.ObservedGeneration = 1
	a.Status.Conditions = readyConditions(1)
	a.Status.Ledger = &iteronv1.LedgerStatus{File: "/var/lib/iteron/state/ledgers/" + string(a.UID), HeadSHA256: "sha256:" + strings.Repeat("a", 64), Records: int64(4 * len(modules)), Verified: true}
	return a
}

func genName(module string, lineage int64, attempt int32) string {
	return fmt.Sprintf("stack-%s-g%d-%d", strings.ReplaceAll(module, "_", "-"), lineage, attempt)
}

func readyConditions(gen int64) []metav1.Condition {
	c := func(t string, s metav1.ConditionStatus, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen, LastTransitionTime: metav1.NewTime(now)}
	}
	return []metav1.Condition{
		c(iteronv1.ConditionVerified, metav1.ConditionTrue, iteronv1.ReasonSucceeded, "all sources verified"),
		c(iteronv1.ConditionStalled, metav1.ConditionFalse, iteronv1.ReasonSucceeded, "not stalled"),
		c(iteronv1.ConditionReconciling, metav1.ConditionFalse, iteronv1.ReasonSucceeded, "the desired state holds"),
		c(iteronv1.ConditionDegraded, metav1.ConditionFalse, iteronv1.ReasonSucceeded, "every module serves"),
		c(iteronv1.ConditionReady, metav1.ConditionTrue, iteronv1.ReasonSucceeded, "all modules Active"),
	}
}

func setCondition(a *iteronv1.ImplementationActivation, t string, s metav1.ConditionStatus, reason, msg string) {
	for i := range a.Status.Conditions {
		if a.Status.Conditions[i].Type == t {
			a.Status.Conditions[i].Status, a.Status.Conditions[i].Reason, a.Status.Conditions[i].Message = s, reason, msg
			return
		}
	}
	a.Status.Conditions = append(a.Status.Conditions, metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: a.Generation})
}

func module(a *iteronv1.ImplementationActivation, m string) *iteronv1.ModuleStatus {
	for i := range a.Status.Modules {
		if a.Status.Modules[i].Module == m {
			return &a.Status.Modules[i]
		}
	}
	panic("no module " + m)
}

// generation is a Generation the activation controls, with status.
func generation(a *iteronv1.ImplementationActivation, m string, lineage int64, attempt int32, impl string, phase iteronv1.ModulePhase, step iteronv1.GenerationStep) iteronv1.Generation {
	return iteronv1.Generation{
		ObjectMeta: metav1.ObjectMeta{Name: genName(m, lineage, attempt), Namespace: a.Namespace, OwnerReferences: []metav1.OwnerReference{{
			APIVersion: iteronv1.GroupVersion.String(), Kind: "ImplementationActivation", Name: a.Name, UID: a.UID, Controller: ptr.To(true),
		}}},
		Spec: iteronv1.GenerationSpec{ActivationName: a.Name, NodeName: a.Spec.NodeName, Module: m, Generation: lineage, Attempt: attempt,
			Implementation: iteronv1.Implementation{ID: impl, Version: "2.0.0"}},
		Status: iteronv1.GenerationStatus{Phase: phase, Step: step},
	}
}

func input(a *iteronv1.ImplementationActivation, gens ...iteronv1.Generation) *Input {
	return &Input{Activation: a, Generations: gens, Node: NodeLookup{Exists: true, OtherNodes: true}}
}

// codes lists a report's findings as "severity code module".
func codes(r *Report) []string {
	var out []string
	for _, f := range r.Findings {
		s := string(f.Severity) + " " + f.Code
		if f.Module != "" {
			s += " " + f.Module
		}
		out = append(out, s)
	}
	return out
}

func finding(t *testing.T, r *Report, code, module string) Finding {
	t.Helper()
	for _, f := range r.Findings {
		if f.Code == code && f.Module == module {
			return f
		}
	}
	t.Fatalf("no finding %s for %q; findings: %v", code, module, codes(r))
	return Finding{}
}
