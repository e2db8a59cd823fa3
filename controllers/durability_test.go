package controllers_test

import (
	"context"
	"os"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/examples/providers/artifacts"
)

func TestADeletedActiveGenerationIsRecreatedAndItsProcessKeepsRunning(t *testing.T) {
	act := newActivation(t, "recreate", nil, source(t, artifacts.CounterV2, "prompt_system", "counter"))
	got := waitFor(t, act, "Ready", ready)
	name := moduleStatus(got, "prompt_system").GenerationName
	gen := waitGeneration(t, got.Namespace, name, "Active with a pid", func(g *iteronv1.Generation) bool { return g.Status.Pid > 0 })
	pid, uid := gen.Status.Pid, gen.UID
	if err := env.Client.Delete(context.Background(), gen); err != nil {
		t.Fatal(err)
	}
	again := waitGeneration(t, got.Namespace, name, "re-created with the same pid", func(g *iteronv1.Generation) bool {
		return g.UID != uid && g.Status.Pid == pid && g.Status.Phase == iteronv1.PhaseActive
	})
	if again.Spec.Module != "prompt_system" || again.Spec.Generation != 1 || again.Spec.Implementation.ID != "counter" {
		t.Fatalf("re-created spec %+v", again.Spec)
	}
	if runtimeOf(t, got).Modules["prompt_system"].Pid != int(pid) {
		t.Fatal("the process changed")
	}
}

func TestTheHistoryLimitKeepsAtMostThatManyOldGenerations(t *testing.T) {
	act := newActivation(t, "history", func(s *iteronv1.ImplementationActivationSpec) {
		s.GenerationHistoryLimit = ptr.To[int32](1)
	}, source(t, artifacts.CounterV2, "prompt_system", "v-0"))
	waitFor(t, act, "Ready", ready)
	for i, id := range []string{"v-1", "v-2", "v-3"} {
		src := source(t, artifacts.CounterV2, "prompt_system", id)
		updateSpec(t, act, func(a *iteronv1.ImplementationActivation) { a.Spec.Sources[0] = src })
		lineage := int64(i + 2)
		waitFor(t, act, "swapped", func(a *iteronv1.ImplementationActivation) bool {
			return ready(a) && moduleStatus(a, "prompt_system").Generation == lineage
		})
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		gens := generations(t, act)
		inactive := 0
		for _, g := range gens {
			if g.Status.Phase == iteronv1.PhaseInactive {
				inactive++
			}
		}
		if len(gens) == 2 && inactive == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d Generations (%d Inactive) after 4 generations with generationHistoryLimit 1; want the Active one and 1 Inactive", len(gens), inactive)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestARecreatedActivationOfTheSameNameStartsANewLedger(t *testing.T) {
	src := source(t, artifacts.CounterV2, "prompt_system", "counter")
	first := newActivation(t, "samename", nil, src)
	got := waitFor(t, first, "Ready", ready)
	firstLedger := ledgerDir(t, got)
	count(t, got, "prompt_system", "a", 5)
	deleteAndWait(t, got)
	if _, err := os.Stat(firstLedger); !os.IsNotExist(err) {
		t.Fatalf("the first ledger %s was not archived: %v", firstLedger, err)
	}

	second := &iteronv1.ImplementationActivation{}
	second.Name, second.Namespace = first.Name, first.Namespace
	second.Spec = first.Spec
	second.ResourceVersion = ""
	if err := env.Client.Create(context.Background(), second); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteAndWait(t, second) })
	got2 := waitFor(t, second, "Ready", ready)
	if got2.UID == got.UID {
		t.Fatal("the same UID")
	}
	if dir := ledgerDir(t, got2); dir == firstLedger {
		t.Fatal("the re-created activation reuses the old ledger")
	}
	if recs := verifyLedger(t, got2); len(recs) != 4 {
		t.Fatalf("the new ledger has %d records; want only the new first activation", len(recs))
	}
	if out, _ := count(t, got2, "prompt_system", "a", 1); out["count"] != float64(1) {
		t.Fatalf("the re-created activation started with state %v; want a fresh counter", out)
	}
	var g iteronv1.Generation
	err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: got2.Namespace, Name: moduleStatus(got2, "prompt_system").GenerationName}, &g)
	if err != nil || g.OwnerReferences[0].UID != got2.UID {
		t.Fatalf("the new Generation: %v %+v", err, g.OwnerReferences)
	}
	if apierrors.IsNotFound(err) {
		t.Fatal("no Generation")
	}
}
