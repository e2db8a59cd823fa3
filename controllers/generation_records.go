package controllers

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// GenerationRecords are the Generation objects the activation controller's
// plans name and the generation controller has not created yet. The
// activation controller decides each one (module, lineage, attempt) and
// hands it to the coordinator as an unrecorded target; the generation
// controller creates the object and reports it to the coordinator, which
// starts nothing of the plan before (hotswap.ModuleTarget.Unrecorded). A
// creation the API refuses is kept here with its error, which the
// activation's conditions show, and retried by the generation controller
// until it succeeds or a new plan no longer names it.
type GenerationRecords struct {
	mu      sync.Mutex
	pending map[types.NamespacedName]*generationRecord
	// madeHere are the Generations the generation controller created
	// whose creation event it has not seen yet: the coordinator's
	// notifications report what happens to them, and a mirror on the
	// creation event would only write a transaction's first steps again.
	madeHere map[types.NamespacedName]bool
	// requests carry each newly planned Generation to the generation
	// controller.
	requests chan event.GenericEvent
}

// generationRecord is one Generation to create.
type generationRecord struct {
	// object is the Generation to create.
	object *iteronv1.Generation
	// owner is its activation (name, namespace and UID only: a copy, since
	// the reconcile's own object changes after it), which the creation's
	// event is about.
	owner *iteronv1.ImplementationActivation
	// note is the creation event's message.
	note string
	// refusal is the last creation's error (nil: none failed yet).
	refusal error
	// requested is set once the generation controller was asked for it.
	requested bool
}

// ownerOf is the owner of a record planned for act: a copy of what
// identifies it.
func ownerOf(act *iteronv1.ImplementationActivation) *iteronv1.ImplementationActivation {
	owner := &iteronv1.ImplementationActivation{}
	owner.Name, owner.Namespace, owner.UID = act.Name, act.Namespace, act.UID
	return owner
}

// NewGenerationRecords returns an empty set.
func NewGenerationRecords() *GenerationRecords {
	return &GenerationRecords{pending: map[types.NamespacedName]*generationRecord{}, madeHere: map[types.NamespacedName]bool{}, requests: make(chan event.GenericEvent, 256)}
}

// Requests is the generation controller's channel source of Generations
// to create.
func (g *GenerationRecords) Requests() <-chan event.GenericEvent { return g.requests }

// plan makes records the Generations owner's plan waits for, replacing
// what an earlier plan of it named. It returns the names the generation
// controller has not been asked for yet (to request once the coordinator
// has the plan) and the refusal of one it was, if any: the plan waits on
// it.
func (g *GenerationRecords) plan(owner *iteronv1.ImplementationActivation, records []*generationRecord) (unrequested []string, refusal error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	named := map[types.NamespacedName]bool{}
	for _, rec := range records {
		key := types.NamespacedName{Namespace: rec.object.Namespace, Name: rec.object.Name}
		named[key] = true
		old, ok := g.pending[key]
		if !ok {
			g.pending[key], old = rec, rec
		}
		if refusal == nil {
			refusal = old.refusal
		}
		if !old.requested {
			unrequested = append(unrequested, rec.object.Name)
		}
	}
	g.forgetLocked(owner.UID, named)
	return unrequested, refusal
}

// request asks the generation controller to create the named Generations
// of namespace.
func (g *GenerationRecords) request(ctx context.Context, namespace string, names []string) error {
	for _, name := range names {
		e := event.GenericEvent{Object: &iteronv1.Generation{}}
		e.Object.SetNamespace(namespace)
		e.Object.SetName(name)
		if err := send(ctx, g.requests, e); err != nil {
			return err
		}
		g.mu.Lock()
		if rec, ok := g.pending[types.NamespacedName{Namespace: namespace, Name: name}]; ok {
			rec.requested = true
		}
		g.mu.Unlock()
	}
	return nil
}

// forget drops what the activation of uid waits for (it is being
// deleted).
func (g *GenerationRecords) forget(uid types.UID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.forgetLocked(uid, nil)
}

func (g *GenerationRecords) forgetLocked(uid types.UID, keep map[types.NamespacedName]bool) {
	for key, rec := range g.pending {
		if rec.owner.UID == uid && !keep[key] {
			delete(g.pending, key)
		}
	}
}

// get returns the Generation key names, if a plan waits for it.
func (g *GenerationRecords) get(key types.NamespacedName) (generationRecord, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	rec, ok := g.pending[key]
	if !ok {
		return generationRecord{}, false
	}
	return *rec, true
}

// creating notes that the Generation key is about to be created here
// (done false: its creation failed after all).
func (g *GenerationRecords) creating(key types.NamespacedName, done bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if done {
		g.madeHere[key] = true
	} else {
		delete(g.madeHere, key)
	}
}

// madeHereSeen reports whether the creation event of Generation key is
// one of a creation made here (and forgets it).
func (g *GenerationRecords) madeHereSeen(key types.NamespacedName) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	made := g.madeHere[key]
	delete(g.madeHere, key)
	return made
}

// madeHereUnseen reports whether Generation key was created here and its
// creation event was not seen yet.
func (g *GenerationRecords) madeHereUnseen(key types.NamespacedName) bool {
	if g == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.madeHere[key]
}

// created records that the Generation key exists now.
func (g *GenerationRecords) created(key types.NamespacedName) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.pending, key)
}

// refused records why the Generation key could not be created.
func (g *GenerationRecords) refused(key types.NamespacedName, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if rec, ok := g.pending[key]; ok {
		rec.refusal = err
	}
}
