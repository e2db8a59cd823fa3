package controllers_test

import (
	"context"
	"slices"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/controllers"
	"iteron.dev/operator/examples/providers/artifacts"
)

// staleRead sets up what a reconcile sees when the cache lags: an
// activation read (stale) and then given a status by another writer
// (the reconcile before, whose patch the cache has not delivered yet).
// The activation is on a node no manager serves, so only the test writes.
func staleRead(t *testing.T) (stale *iteronv1.ImplementationActivation) {
	t.Helper()
	ctx := context.Background()
	act := newActivation(t, "stale", func(s *iteronv1.ImplementationActivationSpec) { s.NodeName = "nobody-serves-this-node" },
		source(t, artifacts.CounterV1, "prompt_system", "counter"))
	stale = &iteronv1.ImplementationActivation{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(act), stale); err != nil {
		t.Fatal(err)
	}
	fresh := stale.DeepCopy()
	fresh.Status.ObservedGeneration = fresh.Generation
	fresh.Status.Plan = &iteronv1.PlanStatus{Reloaded: []string{"prompt_system"}}
	if err := env.Client.Status().Patch(ctx, fresh, client.MergeFrom(stale)); err != nil {
		t.Fatal(err)
	}
	return stale
}

func planOnServer(t *testing.T, act *iteronv1.ImplementationActivation) *iteronv1.PlanStatus {
	t.Helper()
	var got iteronv1.ImplementationActivation
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(act), &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Plan == nil {
		t.Fatal("the server has no plan")
	}
	return got.Status.Plan
}

func TestAStatusPatchFromAStaleReadIsRefusedAndChangesNothing(t *testing.T) {
	stale := staleRead(t)
	late := stale.DeepCopy()
	late.Status.ObservedGeneration = late.Generation
	late.Status.Plan = &iteronv1.PlanStatus{Unchanged: []string{"prompt_system"}}

	conflict, err := controllers.PatchStatusFrom(context.Background(), env.Client, late, stale)
	if err != nil || !conflict {
		t.Fatalf("patch from a stale read: conflict=%v err=%v; want a conflict and no error", conflict, err)
	}
	if p := planOnServer(t, stale); !slices.Equal(p.Reloaded, []string{"prompt_system"}) || len(p.Unchanged) != 0 {
		t.Fatalf("plan on the server after the refused patch: %+v; want the other writer's plan untouched", p)
	}
}

func TestAPlainMergePatchFromAStaleReadWouldMergeTwoPlans(t *testing.T) {
	// Why the guard exists: without it the API server merges the stale
	// reconcile's plan into the fresh one field by field.
	stale := staleRead(t)
	late := stale.DeepCopy()
	late.Status.Plan = &iteronv1.PlanStatus{Unchanged: []string{"prompt_system"}}
	if err := env.Client.Status().Patch(context.Background(), late, client.MergeFrom(stale)); err != nil {
		t.Fatal(err)
	}
	if p := planOnServer(t, stale); !slices.Equal(p.Reloaded, p.Unchanged) {
		t.Fatalf("plan on the server: %+v; expected the merged (wrong) plan this guard prevents", p)
	}
}

func TestAStatusPatchFromAFreshReadIsWritten(t *testing.T) {
	stale := staleRead(t)
	var fresh iteronv1.ImplementationActivation
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(stale), &fresh); err != nil {
		t.Fatal(err)
	}
	next := fresh.DeepCopy()
	next.Status.Plan = &iteronv1.PlanStatus{Unchanged: []string{"prompt_system"}}
	conflict, err := controllers.PatchStatusFrom(context.Background(), env.Client, next, &fresh)
	if err != nil || conflict {
		t.Fatalf("patch from a fresh read: conflict=%v err=%v", conflict, err)
	}
	if p := planOnServer(t, stale); len(p.Reloaded) != 0 || !slices.Equal(p.Unchanged, []string{"prompt_system"}) {
		t.Fatalf("plan on the server: %+v; want unchanged=[prompt_system] only", p)
	}
}

func TestOneRetryValueStartsOneAttemptEvenWhenItsStatusEchoIsLost(t *testing.T) {
	act := newActivation(t, "retry-once", nil, source(t, artifacts.CounterV1, "prompt_system", "counter"))
	waitFor(t, act, "Ready", ready)
	bad := source(t, artifacts.Faulty, "prompt_system", "faulty", "--fault", "crash", "--at", "migrate")
	updateSpec(t, act, func(a *iteronv1.ImplementationActivation) { a.Spec.Sources[0] = bad })
	waitFor(t, act, "Stalled", stalled)

	const retry = "2026-11-29T18:00:00Z"
	updateSpec(t, act, func(a *iteronv1.ImplementationActivation) {
		if a.Annotations == nil {
			a.Annotations = map[string]string{}
		}
		a.Annotations[iteronv1.AnnotationRetry] = retry
	})
	got := waitFor(t, act, "the retry handled and Stalled again", func(a *iteronv1.ImplementationActivation) bool {
		return a.Status.LastHandledRetryAt == retry && stalled(a)
	})
	second := act.Name + "-prompt-system-g2-2"
	g := waitGeneration(t, act.Namespace, second, "Failed", func(g *iteronv1.Generation) bool { return g.Status.Phase == iteronv1.PhaseFailed })
	if g.Annotations[iteronv1.AnnotationRetryOf] != retry {
		t.Fatalf("attempt 2 annotations %v; want %s=%s", g.Annotations, iteronv1.AnnotationRetryOf, retry)
	}

	// The echo is lost (as when the status patch that carried it lost to a
	// concurrent write): the manager sees the request as new again.
	lost := got.DeepCopy()
	lost.Status.LastHandledRetryAt = ""
	if err := env.Client.Status().Patch(context.Background(), lost, client.MergeFrom(got)); err != nil {
		t.Fatal(err)
	}
	// A status write alone does not reconcile the activation (its watch
	// passes spec, label and annotation changes): its next reconcile is
	// whatever comes next, here an annotation it does not read, as a
	// periodic resync or a notification from the coordinator makes one.
	// (Without it the next one came with the provider's lifetime renewal,
	// a minute later.)
	updateSpec(t, act, func(a *iteronv1.ImplementationActivation) { a.Annotations["test.iteron.dev/resync"] = "1" })
	waitFor(t, act, "the echo written again", func(a *iteronv1.ImplementationActivation) bool {
		return a.Status.LastHandledRetryAt == retry && stalled(a)
	})
	var attempts []string
	for name, g := range generations(t, got) {
		if g.Spec.Generation == 2 {
			attempts = append(attempts, name)
		}
	}
	slices.Sort(attempts)
	if want := []string{act.Name + "-prompt-system-g2-1", second}; !slices.Equal(attempts, want) {
		t.Fatalf("attempts at generation 2: %v; want %v (one per retry value)", attempts, want)
	}
}
