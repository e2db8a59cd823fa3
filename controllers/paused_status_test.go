package controllers

import (
	"context"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/hotswap"
)

// A whole reconcile of a paused activation, against a fake client and a
// fake coordinator (no API server): pausing stops acting on the spec, not
// mirroring what runs.

// fakeCoordinator reports a fixed status and records what it is handed.
type fakeCoordinator struct {
	status  hotswap.ActivationStatus
	applied []hotswap.Desired
}

func (f *fakeCoordinator) Prepare(hotswap.ActivationKey, *hotswap.Anchor) error { return nil }
func (f *fakeCoordinator) Apply(d hotswap.Desired) error {
	f.applied = append(f.applied, d)
	return nil
}
func (f *fakeCoordinator) Remove(hotswap.ActivationKey) (bool, error)     { return true, nil }
func (f *fakeCoordinator) Forget(string) error                            { return nil }
func (f *fakeCoordinator) Status(string) (hotswap.ActivationStatus, bool) { return f.status, true }

// pausedMidSwap is an activation paused (spec generation 3) while the swap
// of prompt_system from g1 to g2 (spec generation 2) ran: its status was
// last written mid-swap, g1 still serving. The coordinator has since
// finished the swap; the Generations' mirrored status still lags.
func pausedMidSwap(t *testing.T) (client.Client, *fakeCoordinator, *iteronv1.ImplementationActivation) {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := iteronv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	w := readyWorld()
	act := &iteronv1.ImplementationActivation{
		ObjectMeta: metav1.ObjectMeta{Name: "stack", Namespace: "default", UID: "uid-stack", Generation: 3, Finalizers: []string{iteronv1.FinalizerActivation}},
		Spec: iteronv1.ImplementationActivationSpec{NodeName: "worker-1", Paused: true, Sources: []iteronv1.ActivationSource{
			{Module: "prompt_system", ImplementationID: "counter-v2"}, {Module: "context_assembly", ImplementationID: "counter-v1-ctx"},
		}},
		Status: iteronv1.ImplementationActivationStatus{
			ObservedGeneration: 2,
			Modules: []iteronv1.ModuleStatus{
				{Module: "prompt_system", ImplementationID: "counter-v1", Phase: iteronv1.PhaseActive, Generation: 1, GenerationName: sysG1, Epoch: "sha256:epoch-sys-1"},
				{Module: "context_assembly", ImplementationID: "counter-v1", Phase: iteronv1.PhaseActive, Generation: 1, GenerationName: ctxG1, Epoch: "sha256:epoch-ctx-1"},
			},
		},
	}
	objs := []client.Object{act}
	for _, g := range w.gens {
		g := g
		g.OwnerReferences = []metav1.OwnerReference{{APIVersion: iteronv1.GroupVersion.String(), Kind: "ImplementationActivation", Name: act.Name, UID: act.UID, Controller: ptr.To(true)}}
		switch g.Name {
		case sysG1:
			g.Status.Phase, g.Status.Step = iteronv1.PhaseActive, iteronv1.StepCommitted // not yet mirrored Inactive
		case sysG2:
			g.Status.Phase, g.Status.Step = iteronv1.PhasePreparing, iteronv1.StepMigrate // not yet mirrored Active
		}
		objs = append(objs, &g)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithStatusSubresource(&iteronv1.ImplementationActivation{}, &iteronv1.Generation{}).Build()
	return c, &fakeCoordinator{status: w.status}, act
}

func reconcileOnce(t *testing.T, c client.Client, co *fakeCoordinator, act *iteronv1.ImplementationActivation) *iteronv1.ImplementationActivation {
	t.Helper()
	r := &ActivationReconciler{Client: c, NodeName: "worker-1", Coordinator: co, Recorder: events.NewFakeRecorder(100),
		Resolve: func(context.Context, *iteronv1.ImplementationActivationSpec) Resolution {
			t.Fatal("a paused activation's spec was resolved")
			return Resolution{}
		}}
	if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(act)}); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	var got iteronv1.ImplementationActivation
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(act), &got); err != nil {
		t.Fatal(err)
	}
	return &got
}

func TestAPausedActivationStillMirrorsWhatRunsAndReadyWaitsForItsGenerations(t *testing.T) {
	c, co, act := pausedMidSwap(t)

	got := reconcileOnce(t, c, co, act)
	if len(co.applied) != 0 {
		t.Fatalf("a paused activation handed %d plans to the coordinator", len(co.applied))
	}
	for _, want := range []struct {
		module, generation string
		lineage            int64
	}{{"prompt_system", sysG2, 2}, {"context_assembly", ctxG1, 1}} {
		var ms *iteronv1.ModuleStatus
		for i := range got.Status.Modules {
			if got.Status.Modules[i].Module == want.module {
				ms = &got.Status.Modules[i]
			}
		}
		if ms == nil || ms.GenerationName != want.generation || ms.Generation != want.lineage || ms.Phase != iteronv1.PhaseActive {
			t.Errorf("status.modules[%s] = %+v; want %s (lineage %d) Active: what serves now, paused or not", want.module, ms, want.generation, want.lineage)
		}
	}
	r := meta.FindStatusCondition(got.Status.Conditions, iteronv1.ConditionReady)
	if r == nil || r.Status != metav1.ConditionFalse || !strings.Contains(r.Message, "Generation ") {
		t.Errorf("Ready = %+v; want False until the Generations show the swap (%s still shows Active, %s Preparing)", r, sysG1, sysG2)
	}
	if rec := meta.FindStatusCondition(got.Status.Conditions, iteronv1.ConditionReconciling); rec == nil || rec.Reason != iteronv1.ReasonPaused {
		t.Errorf("Reconciling = %+v; want reason Paused", rec)
	}
	if got.Status.ObservedGeneration != 3 {
		t.Errorf("observedGeneration %d; want 3 (paused is a resting state)", got.Status.ObservedGeneration)
	}

	// The Generation controller catches up: Ready follows.
	for name, phase := range map[string]iteronv1.ModulePhase{sysG1: iteronv1.PhaseInactive, sysG2: iteronv1.PhaseActive} {
		var g iteronv1.Generation
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: name}, &g); err != nil {
			t.Fatal(err)
		}
		g.Status.Phase, g.Status.Step = phase, co.status.Generations[name].Step
		if err := c.Status().Update(context.Background(), &g); err != nil {
			t.Fatal(err)
		}
	}
	got = reconcileOnce(t, c, co, act)
	if r := meta.FindStatusCondition(got.Status.Conditions, iteronv1.ConditionReady); r == nil || r.Status != metav1.ConditionTrue {
		t.Fatalf("Ready = %+v once the Generations agree; want True", r)
	}
}
