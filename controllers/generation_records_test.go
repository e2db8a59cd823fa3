package controllers

import (
	"context"
	"errors"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

func recordOf(owner *iteronv1.ImplementationActivation, name string) *generationRecord {
	return &generationRecord{owner: ownerOf(owner), object: &iteronv1.Generation{ObjectMeta: metav1.ObjectMeta{Namespace: owner.Namespace, Name: name}}}
}

func TestGenerationRecordsKeepWhatThePlanNamesAndItsRefusal(t *testing.T) {
	stack := &iteronv1.ImplementationActivation{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "stack", UID: "uid-stack"}}
	other := &iteronv1.ImplementationActivation{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "other", UID: "uid-other"}}
	key := func(name string) types.NamespacedName { return types.NamespacedName{Namespace: "team", Name: name} }
	g := NewGenerationRecords()

	fresh, refusal := g.plan(stack, []*generationRecord{recordOf(stack, "stack-a-g1-1"), recordOf(stack, "stack-b-g1-1")})
	if !slices.Equal(fresh, []string{"stack-a-g1-1", "stack-b-g1-1"}) || refusal != nil {
		t.Fatalf("a first plan: fresh %v, refusal %v; want both names, none", fresh, refusal)
	}
	fresh, _ = g.plan(stack, []*generationRecord{recordOf(stack, "stack-a-g1-1"), recordOf(stack, "stack-b-g1-1")})
	if !slices.Equal(fresh, []string{"stack-a-g1-1", "stack-b-g1-1"}) {
		t.Fatalf("the same plan before its requests were sent (the coordinator refused it): %v; want both names again", fresh)
	}
	if err := g.request(context.Background(), "team", fresh); err != nil {
		t.Fatal(err)
	}
	for range fresh {
		<-g.Requests()
	}
	g.plan(other, []*generationRecord{recordOf(other, "other-a-g1-1")})

	denied := errors.New("denied")
	g.refused(key("stack-a-g1-1"), denied)
	fresh, refusal = g.plan(stack, []*generationRecord{recordOf(stack, "stack-a-g1-1"), recordOf(stack, "stack-b-g1-1")})
	if len(fresh) != 0 || !errors.Is(refusal, denied) {
		t.Fatalf("the same plan again: fresh %v, refusal %v; want nothing new to request and the refusal", fresh, refusal)
	}

	fresh, refusal = g.plan(stack, []*generationRecord{recordOf(stack, "stack-a-g1-2")})
	if !slices.Equal(fresh, []string{"stack-a-g1-2"}) || refusal != nil {
		t.Fatalf("a new plan: fresh %v, refusal %v; want its one new name and no refusal of the old plan", fresh, refusal)
	}
	for _, name := range []string{"stack-a-g1-1", "stack-b-g1-1"} {
		if _, ok := g.get(key(name)); ok {
			t.Errorf("%s is still pending after a plan that no longer names it", name)
		}
	}
	if _, ok := g.get(key("other-a-g1-1")); !ok {
		t.Errorf("another activation's record was dropped by this one's plan")
	}

	g.created(key("stack-a-g1-2"))
	if _, ok := g.get(key("stack-a-g1-2")); ok {
		t.Errorf("a created Generation is still pending")
	}
	g.forget(other.UID)
	if _, ok := g.get(key("other-a-g1-1")); ok {
		t.Errorf("a deleted activation's record is still pending")
	}
}

func TestACreationMadeHereIsSeenOnceAndAFailedOneNever(t *testing.T) {
	g := NewGenerationRecords()
	made, failed := types.NamespacedName{Namespace: "team", Name: "made"}, types.NamespacedName{Namespace: "team", Name: "failed"}
	g.creating(made, true)
	g.creating(failed, true)
	g.creating(failed, false)
	if !g.madeHereSeen(made) {
		t.Errorf("the creation event of a Generation made here is not recognised")
	}
	if g.madeHereSeen(made) {
		t.Errorf("a second creation event of the same name (deleted and made by someone else) is taken for this one")
	}
	if g.madeHereSeen(failed) {
		t.Errorf("the creation event of a Generation whose creation here failed is taken for one made here")
	}
}

func TestARecordKeepsItsOwnerAfterTheReconcilesObjectChanges(t *testing.T) {
	act := &iteronv1.ImplementationActivation{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "stack", UID: "uid-stack"}}
	g := NewGenerationRecords()
	g.plan(act, []*generationRecord{{owner: ownerOf(act), object: &iteronv1.Generation{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "stack-a-g1-1"}}}})
	// The reconcile's object is reused for the next read (a status patch's
	// answer, a conflict's re-read): what the record says must not change.
	*act = iteronv1.ImplementationActivation{}
	rec, ok := g.get(types.NamespacedName{Namespace: "team", Name: "stack-a-g1-1"})
	if !ok || rec.owner.UID != "uid-stack" || rec.owner.Name != "stack" {
		t.Fatalf("record after the reconcile's object changed: %+v (pending %v); want its owner stack, uid-stack", rec.owner, ok)
	}
}
