package fleet

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iteronv1 "iteron.dev/operator/api/v1alpha1"
	"iteron.dev/operator/internal/fleet"
	"iteron.dev/operator/test/fleettest"
)

// rolloutWatch follows a set's activations through watch events (every
// change, in the order the API server made them per object) and the set's
// status: which node moved to which revision in which wave and when, when
// each became Ready, the most nodes not Ready at any moment, and the GitOps
// health of the set at each of its phases.
type rolloutWatch struct {
	key    client.ObjectKey
	cancel context.CancelFunc

	mu      sync.Mutex
	state   map[string]actState // by activation name
	moves   []move
	readyAt map[string][]time.Time // node → times it became Ready
	first   map[string]string      // node → the revision it was first seen on
	// maxNotReady is the most activations not Ready at once, and when.
	maxNotReady   int
	maxNotReadyAt string
	health        map[iteronv1.RolloutPhase]map[string]bool // phase → "Argo CD X, kstatus Y" seen
	healthErr     error
	// changed is closed (and replaced) at every event: waits block on it.
	changed chan struct{}
}

type actState struct {
	node, revision, wave string
	ready                bool
	generation           int64
}

type move struct {
	at                 time.Time
	node, from, to     string
	wave               string
	generation         int64
	notReadyBefore     []string // nodes of the set not Ready just before the move
	revertedFrom, when string
}

func watchRollout(t *testing.T, key client.ObjectKey) *rolloutWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &rolloutWatch{key: key, cancel: cancel, state: map[string]actState{}, readyAt: map[string][]time.Time{}, first: map[string]string{},
		health: map[iteronv1.RolloutPhase]map[string]bool{}, changed: make(chan struct{})}
	sel := labels.SelectorFromSet(labels.Set{iteronv1.LabelActivationSet: key.Name})
	c, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}},
		ByObject: map[client.Object]cache.ByObject{&iteronv1.ImplementationActivation{}: {Label: sel}}})
	if err != nil {
		t.Fatal(err)
	}
	acts, err := c.GetInformer(ctx, &iteronv1.ImplementationActivation{})
	if err != nil {
		t.Fatal(err)
	}
	sets, err := c.GetInformer(ctx, &iteronv1.ActivationSet{})
	if err != nil {
		t.Fatal(err)
	}
	onAct := func(obj any) {
		if a, ok := obj.(*iteronv1.ImplementationActivation); ok {
			w.activation(a)
		}
	}
	onSet := func(obj any) {
		if s, ok := obj.(*iteronv1.ActivationSet); ok && s.Name == key.Name {
			w.set(s)
		}
	}
	onGone := func(obj any) {
		if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if a, ok := obj.(*iteronv1.ImplementationActivation); ok {
			w.gone(a)
		}
	}
	if _, err := acts.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: onAct, UpdateFunc: func(_, n any) { onAct(n) }, DeleteFunc: onGone}); err != nil {
		t.Fatal(err)
	}
	if _, err := sets.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: onSet, UpdateFunc: func(_, n any) { onSet(n) }}); err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("the watch's cache did not sync")
	}
	t.Cleanup(cancel)
	return w
}

func (w *rolloutWatch) stop() { w.cancel() }

func (w *rolloutWatch) activation(a *iteronv1.ImplementationActivation) {
	o := fleet.Observe(a, "")
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	defer w.notify()
	prev, seen := w.state[a.Name]
	cur := actState{node: a.Spec.NodeName, revision: a.Labels[iteronv1.LabelRevision], wave: a.Annotations[iteronv1.AnnotationWave],
		ready: o.Ready && a.DeletionTimestamp.IsZero(), generation: a.Generation}
	if seen && prev.revision != cur.revision {
		var notReady []string
		for _, s := range w.state {
			if !s.ready {
				notReady = append(notReady, s.node)
			}
		}
		sort.Strings(notReady)
		w.moves = append(w.moves, move{at: now, node: cur.node, from: prev.revision, to: cur.revision, wave: cur.wave, generation: cur.generation,
			notReadyBefore: notReady, revertedFrom: a.Annotations[iteronv1.AnnotationRevertedFrom]})
	}
	if _, ok := w.first[cur.node]; !ok {
		w.first[cur.node] = cur.revision
	}
	if cur.ready && (!seen || !prev.ready) {
		w.readyAt[cur.node] = append(w.readyAt[cur.node], now)
	}
	w.state[a.Name] = cur
	n := 0
	var which []string
	for _, s := range w.state {
		if !s.ready {
			n++
			which = append(which, s.node)
		}
	}
	if n > w.maxNotReady {
		sort.Strings(which)
		w.maxNotReady, w.maxNotReadyAt = n, strings.Join(which, ", ")
	}
}

// gone forgets a deleted activation (its node no longer counts as not
// Ready).
func (w *rolloutWatch) gone(a *iteronv1.ImplementationActivation) {
	w.mu.Lock()
	defer w.mu.Unlock()
	defer w.notify()
	delete(w.state, a.Name)
}

func (w *rolloutWatch) set(s *iteronv1.ActivationSet) {
	h, err := fleettest.SetHealth(env.RepoRoot, s)
	w.mu.Lock()
	defer w.mu.Unlock()
	defer w.notify()
	if err != nil {
		w.healthErr = err
		return
	}
	phase := s.Status.Phase
	if r := fleettest.Condition(s, iteronv1.ConditionReady); r == nil || r.ObservedGeneration != s.Generation {
		phase = "(conditions of an older spec)"
	}
	if w.health[phase] == nil {
		w.health[phase] = map[string]bool{}
	}
	w.health[phase][h.String()] = true
}

// notify wakes the waits; w.mu is held.
func (w *rolloutWatch) notify() {
	close(w.changed)
	w.changed = make(chan struct{})
}

// waitMove waits (at most timeout) for a move that pred accepts, seen by
// the watch, and returns it; on a timeout it fails the test with every move
// seen and the set's activations.
func (w *rolloutWatch) waitMove(t *testing.T, what string, timeout time.Duration, pred func(move) bool) move {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		for _, m := range w.moves {
			if pred(m) {
				w.mu.Unlock()
				return m
			}
		}
		changed := w.changed
		w.mu.Unlock()
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("the watch of %s never saw %s within %s; moves seen:\n%s\nactivations:\n%s", w.key, what, timeout, w.describe(), fleettest.DescribeActivations(env.Client, w.key))
		}
	}
}

// movesOf are the moves of a node, in the order made.
func (w *rolloutWatch) movesOf(node string) []move {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []move
	for _, m := range w.moves {
		if m.node == node {
			out = append(out, m)
		}
	}
	return out
}

// firstRevision is the revision a node's activation had when the watch
// first saw it ("" if never seen).
func (w *rolloutWatch) firstRevision(node string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.first[node]
}

// movesTo are the moves to a revision, in the order made.
func (w *rolloutWatch) movesTo(hash string) []move {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []move
	for _, m := range w.moves {
		if m.to == hash {
			out = append(out, m)
		}
	}
	return out
}

// healthSeen is every GitOps reading seen in a phase.
func (w *rolloutWatch) healthSeen(phase iteronv1.RolloutPhase) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for h := range w.health[phase] {
		out = append(out, h)
	}
	sort.Strings(out)
	return out
}

// waves groups the moves to a revision by wave.
func waves(moves []move) ([]string, map[string][]move) {
	byWave := map[string][]move{}
	var order []string
	for _, m := range moves {
		if _, ok := byWave[m.wave]; !ok {
			order = append(order, m.wave)
		}
		byWave[m.wave] = append(byWave[m.wave], m)
	}
	return order, byWave
}

func nodesOf(ms []move) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.node)
	}
	sort.Strings(out)
	return out
}

func (w *rolloutWatch) describe() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var lines []string
	for _, m := range w.moves {
		lines = append(lines, fmt.Sprintf("  %s %s %s → %s wave %s (not Ready before: %v)", m.at.Format("15:04:05.000"), m.node, m.from, m.to, m.wave, m.notReadyBefore))
	}
	return strings.Join(lines, "\n")
}
