package fleet

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
)

// expectationTTL bounds how long a reconcile waits for the cache to show a
// write of this process (a watch that lost an event relists well before).
const expectationTTL = 30 * time.Second

// expectations are this process's own writes to activations that the
// cache has not shown yet (the ReplicaSet controller's expectations,
// keyed by object): a reconcile that read an older copy would decide from a
// world without its last moves, and could move a node twice or count a
// moved node as Ready. Generation is monotonic, so "the cache caught up"
// is a comparison.
type expectations struct {
	mu sync.Mutex
	// bySet maps a set's namespace/name to its pending expectations by
	// activation name.
	bySet map[string]map[string]expectation
	// status is the last status this process wrote for each set: a cached
	// set showing another status is older than that write (only the
	// leader writes status), and a plan made from it would not know the
	// halt or the stable revision just written.
	status map[string]statusExpectation
}

type statusExpectation struct {
	status *iteronv1.ActivationSetStatus
	at     time.Time
}

type expectation struct {
	// generation: the cache must show at least this metadata.generation
	// (an update); created: the object must exist; deleted: it must be
	// gone or have a deletionTimestamp.
	generation int64
	created    bool
	deleted    bool
	// retry: the cache must show this iteron.dev/retry annotation (an
	// annotation does not change metadata.generation, so a copy from
	// before the write would pass the generation check, and its Stalled
	// condition would halt the rollout that was just resumed).
	retry string
	at    time.Time
}

func newExpectations() *expectations {
	return &expectations{bySet: map[string]map[string]expectation{}, status: map[string]statusExpectation{}}
}

func (e *expectations) expect(set, name string, x expectation) {
	e.mu.Lock()
	defer e.mu.Unlock()
	m := e.bySet[set]
	if m == nil {
		m = map[string]expectation{}
		e.bySet[set] = m
	}
	m[name] = x
}

func (e *expectations) forget(set string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.bySet, set)
	delete(e.status, set)
}

// wroteStatus records the status just written for a set.
func (e *expectations) wroteStatus(set string, st *iteronv1.ActivationSetStatus, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.status[set] = statusExpectation{status: st.DeepCopy(), at: now}
}

// staleStatus reports whether the cached set does not show the status this
// process wrote last (yet).
func (e *expectations) staleStatus(set string, cached *iteronv1.ActivationSetStatus, now time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	x, ok := e.status[set]
	if !ok {
		return false
	}
	if equality.Semantic.DeepEqual(x.status, cached) || now.Sub(x.at) > expectationTTL {
		delete(e.status, set)
		return false
	}
	return true
}

// unmet returns an activation whose cached copy does not show this
// process's last write to it yet ("" when every write shows), dropping the
// expectations that are met or too old.
func (e *expectations) unmet(set string, cached map[string]*iteronv1.ImplementationActivation, now time.Time) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	waiting := ""
	for name, x := range e.bySet[set] {
		a := cached[name]
		met := false
		switch {
		case x.deleted:
			met = a == nil || !a.DeletionTimestamp.IsZero()
		case x.created:
			met = a != nil
		case x.retry != "":
			met = a == nil || a.Annotations[iteronv1.AnnotationRetry] == x.retry
		default:
			met = a == nil || a.Generation >= x.generation
		}
		if met || now.Sub(x.at) > expectationTTL {
			delete(e.bySet[set], name)
			continue
		}
		if waiting == "" || name < waiting {
			waiting = name
		}
	}
	return waiting
}
